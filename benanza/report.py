"""Present analyses: rich terminal tables, the documented JSON (docs/analyze-json.md), and a
single self-contained HTML page (inline CSS and SVG; no network)."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .analysis.bounds import Bounds
from .analyzer import Analysis, PageFaultCost
from .escape import printable
from .report_modules import folded_layers, folded_parallel, icicle_svg, modules_json, print_module_tree
from .report_phases import decode_svg, phase_json

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

SCHEMA_VERSION = 1


def _r(x: float | None, digits: int = 6) -> float | None:
    return None if x is None else round(float(x), digits)


def _bounds_json(b: Bounds | None, measured: float | None) -> dict | None:
    if b is None:
        return None
    seq, par = b.ratio(measured)
    return {"sequential_ms": _r(b.sequential_ms), "parallel_ms": _r(b.parallel_ms), "partial": b.partial,
            "critical_path": list(b.critical_path), "br_sequential": _r(seq, 4), "br_parallel": _r(par, 4)}


def _speedup(br: float | None) -> float | None:
    return _r(1.0 / br, 4) if br else None


def analysis_json(a: Analysis) -> dict:
    m = a.measured_ms
    reference = set(a.reference_rows)
    out: dict = {
        "model": a.model, "model_path": a.model_path, "system": a.system, "backend": a.backend,
        "dtype": a.dtype, "batch_size": a.batch_size,
        "stack": None if a.stack is None else {"id": a.stack.stack_id, "device": a.stack.device,
                                                "components": dict(a.stack.stack)},
        "math": a.math,
        "unstable_layers": [r.index for r in a.unstable_rows],
        # every figure below rests on results measured under contention (`analyze --allow-contended`)
        "contended": bool(a.contended),
        "contended_layers": [r.index for r in a.contended_rows],
        "measured_ms": _r(m), "measured_source": a.measured_source or None,
        "bounds": _bounds_json(a.bounds, m),
        "speedup": {"sequential": _speedup(a.br_sequential), "parallel": _speedup(a.br_parallel)},
        "layers": [{"index": r.index, "name": r.name, "op": r.op, "key": r.key, "status": r.status,
                    "latency_ms": _r(r.latency_ms), "variant": r.variant or None, "algo": r.algo or None,
                    "implementation": r.implementation or None, "critical": r.critical,
                    "failed_variants": r.failed_variants,
                    "unstable": r.status == "ok" and r.variant in a.unstable, "contended": r.contended,
                    "reference": r in reference}
                   for r in a.rows],
        "edges": [list(e) for e in a.edges],
        "module_source": a.module_source or None,
        "modules": None if a.tree is None else modules_json(a.tree),
        "coverage": {
            "layers": len(a.rows), "not_covered": [r.index for r in a.not_covered],
            "identity": [r.index for r in a.identity],
            "views": [r.index for r in a.views],
            "folded": [r.index for r in a.folded],
            "missing": [r.index for r in a.missing],
            "not_covered_ops": sorted({r.op for r in a.not_covered}),
        },
        "parallel_modules": [{"fork": p.fork, "join": p.join, "branches": p.branches, "layers": len(p.nodes),
                              "sequential_ms": _r(p.sequential_ms), "parallel_ms": _r(p.parallel_ms)}
                             for p in a.modules],
        "fusion": {"patterns_found": a.fusion.matches, "layers_fused": a.fusion.layers_fused,
                   "bounds": _bounds_json(a.fusion.bounds, m),
                   "speedup_sequential": _r(a.bounds.sequential_ms / a.fusion.bounds.sequential_ms, 4)
                   if a.fusion.bounds.sequential_ms else None,
                   "applied": [_fusion_use(u) for u in a.fusion.applied],
                   "unprofitable": [_fusion_use(u) for u in a.fusion.unprofitable]},
        "tensor_cores": {"tc_kernels": a.tensor_cores.tc_kernels, "kernels": a.tensor_cores.kernels,
                         "examples": a.tensor_cores.examples,
                         "bounds": {k: _bounds_json(b, m) for k, b in a.tensor_cores.bounds.items()}},
        "joint": None if a.joint is None else {"label": a.joint_label, **(_bounds_json(a.joint, m) or {})},
        "framework": _framework_json(a),
        "libraries": [_library_json(v) for v in a.libraries],
        "between_calls": [{"name": b.name, "kind": b.kind, "count": b.count, "total_ms": _r(b.total_ms),
                           "backtrace": list(b.backtrace)} for b in a.between_calls],
        "kernel_gaps": [{"after": g.after, "before": g.before, "gap_us": _r(g.mean_us, 3)} for g in a.kernel_gaps],
        "heuristic": _heuristic_json(a),
        "speed_of_light": _speed_of_light_json(a),
        "floors": _floors_json(a),
        "across_stack": _across_stack_json(a),
        # the profile's threads against the benchmarks' (null: a count unknown, or no profile)
        "threads": None if a.threads is None else {"profile": a.threads.profile, "benchmarks": a.threads.benchmarks,
                                                   "source": a.threads.source, "differ": a.threads.differ},
        "framework_tf32": _framework_tf32_json(a),
        "page_faults": None if a.page_faults is None else {
            "per_run": _r(a.page_faults.per_run), "fault_us": _r(a.page_faults.fault_us, 4),
            "ms": _r(a.page_faults.ms), "share": _r(a.page_faults.share, 4), "notable": a.page_faults.notable},
        "machine_speed": None if a.speed is None else a.speed.to_json(),
        "phase": None if a.phase is None else phase_json(a.phase),
        # measures in full the screened estimates Q3 compares (null: it compares none)
        "screened_command": a.screened_command or None,
        "warnings": a.warnings, "notes": a.notes,
    }
    if a.threads is not None and a.threads.differ:  # each ratio and Q3 judgement says so itself
        for b in (out["bounds"], out["fusion"]["bounds"], out["joint"], *out["tensor_cores"]["bounds"].values(),
                  (out["framework"] or {}).get("bounds_same_fusions"), (out["heuristic"] or {}).get("bounds"),
                  out["framework"], *out["libraries"]):
            if b is not None:
                b["unequal_threads"] = True
    if a.contended:  # each bounds object says so itself, wherever a reader takes it from
        for b in (out["bounds"], out["fusion"]["bounds"], out["joint"], *out["tensor_cores"]["bounds"].values(),
                  (out["framework"] or {}).get("bounds_same_fusions"), (out["heuristic"] or {}).get("bounds")):
            if b is not None:
                b["contended"] = True
    for label, b in out["tensor_cores"]["bounds"].items():  # another dtype's bound rests on its own results
        if label in a.tensor_cores.contended:
            b["contended"] = True
    if out["joint"] is not None and a.joint_contended:
        out["joint"]["contended"] = True
    return out


def _framework_tf32_json(a: Analysis) -> dict | None:
    t = a.framework_tf32
    if t is None:
        return None
    return {"calls": t.calls, "of": t.of,
            "by_library": [{"library": lib, "math": math, "calls": n} for lib, math, n in t.by_library]}


def _floors_json(a: Analysis) -> dict | None:
    f = a.floors
    if f is None:
        return None
    return {"critical_path_ms": _r(f.critical_path_ms), "parallel_ms": _r(f.parallel_ms), "binds": f.binds,
            "floors": [{"name": x.name, "ms": _r(x.ms, 9), "amount": x.amount, "rate": x.rate, "layers": x.layers,
                        "detail": x.detail} for x in f.floors],
            "absent": list(f.absent)}


def _speed_of_light_json(a: Analysis) -> dict | None:
    sol = a.speed_of_light
    if sol is None:
        return None
    memory = sol.memory_bound_ms()
    return {
        "peaks": sol.peaks.to_json(),
        "sequential_ms": _r(sol.sequential_ms), "parallel_ms": _r(sol.parallel_ms),
        "critical_path": list(sol.critical_path),
        "memory_bound_ms": _r(memory),
        "memory_bound_share": _r(memory / a.bounds.sequential_ms, 4) if a.bounds.sequential_ms else None,
        "impossible": [{"variant": f.variant, "layer_key": f.layer_key, "median_ms": _r(f.median_ms),
                        "latency_ms": _r(f.latency_ms),
                        "roofline_ms": _r(f.floor_ms)} for f in sol.impossible],
        "no_compute_roof": list(sol.no_compute_roof),
        "layers": [{"index": r.index, "flops": r.roof.flops, "bytes": r.roof.bytes,
                    "roofline_ms": _r(r.sol_ms, 9), "compute_ms": _r(r.roof.compute_ms, 9),
                    "memory_ms": _r(r.roof.memory_ms, 9), "level": r.roof.level, "bound_by": r.roof.bound_by,
                    "intensity": _r(r.roof.intensity, 4), "latency_ms": _r(r.latency_ms),
                    "sol_fraction": _r(r.sol_fraction, 4), "left_ms": _r(r.left_ms),
                    "impossible": bool(r.impossible), "impossible_variants": list(r.impossible)}
                   for r in sol.layers],
    }


def _heuristic_json(a: Analysis) -> dict | None:
    h = a.heuristic
    if h is None:
        return None
    return {"heuristic_ms": _r(h.heuristic_ms), "ideal_ms": _r(h.ideal_ms),
            "speedup": _r(h.heuristic_ms / h.ideal_ms, 4) if h.ideal_ms else None,
            "suboptimal": h.suboptimal, "unknown": h.unknown, "bounds": _bounds_json(h.bounds, a.measured_ms),
            "layers": [{"index": c.node, "name": c.name, "layout": c.layout, "math": c.math,
                        "heuristic": c.heuristic or None, "heuristic_ms": _r(c.heuristic_ms),
                        "find": c.find or None, "find_ms": _r(c.find_ms), "best": c.best,
                        "best_ms": _r(c.best_ms)} for c in h.choices]}


def _fusion_use(u) -> dict:
    return {"pattern": u.pattern, "nodes": list(u.nodes), "unfused_ms": _r(u.unfused_ms),
            "fused_ms": _r(u.fused_ms), "variant": u.variant}


def _framework_json(a: Analysis) -> dict | None:
    v = a.framework
    if v is None:
        return None
    return {
        "framework": v.framework, "runs": v.match.runs, "run_ms": _r(v.match.run_ms), "op_ms": _r(v.match.op_ms),
        "kernel_share": _r(v.kernel_share, 4),
        "bounds_same_fusions": _bounds_json(v.bounds_same_fusions, a.measured_ms),
        "fused_groups": [{"name": g.name, "op": g.op, "nodes": list(g.nodes)} for g in v.match.fused],
        "fusions_applied": [_fusion_use(u) for u in v.fusions_applied],
        "eliminated": list(v.match.eliminated),
        "inserted": [{"name": g.name, "op": g.op, "time_ms": _r(g.time_ms)} for g in v.match.inserted],
        "inserted_ms": _r(v.inserted_ms),
        "layers": [{"name": o.group, "op": o.op, "nodes": list(o.nodes), "framework_ms": _r(o.framework_ms),
                    "bound_ms": _r(o.bound_ms), "overhead_ms": _r(o.overhead_ms), "covered": o.covered}
                   for o in v.overheads],
        "gaps": [{"after": x, "before": y, "gap_us": _r(g, 3)} for x, y, g in v.match.gaps],
        "explanations": v.explanations,
        "kernels": [_choice_json(c) for c in v.kernels],
        "screened": len(v.screened),
        "kernel_gain_ms": _r(v.kernel_gain_ms),
    }


def _across_stack_json(a: Analysis) -> dict | None:
    x = a.across_stack
    if x is None:
        return None
    return {"framework": x.framework, "vendor": x.vendor, "vendor_stack": x.vendor_stack,
            "measured_ms": _r(x.measured_ms), "native_bound_ms": _r(x.native_bound_ms),
            "vendor_bound_ms": _r(x.vendor_bound_ms), "framework_overhead_ms": _r(x.framework_overhead_ms),
            "kernel_headroom_ms": _r(x.kernel_headroom_ms), "partial": x.partial, "contended": len(x.contended),
            "layers": [{"index": la.index, "name": la.name, "op": la.op, "native_ms": _r(la.native_ms),
                        "vendor_ms": _r(la.vendor_ms), "framework_ms": _r(la.framework_ms),
                        "kernel_headroom_ms": _r(la.kernel_headroom_ms),
                        "framework_overhead_ms": _r(la.framework_overhead_ms)} for la in x.layers]}


def _choice_json(c) -> dict:
    return {"node": c.node, "name": c.name, "used": c.used, "layout": c.layout or None,
            "post_ops": list(c.post_ops), "fusion": c.fusion or None, "comparable": c.comparable,
            "used_ms": _r(c.used_ms), "framework_ms": _r(c.framework_ms), "best": c.best or None,
            "best_ms": _r(c.best_ms), "bound_ms": _r(c.bound_ms), "gain_ms": _r(c.gain_ms),
            "suboptimal": c.suboptimal, "above_framework": c.above_framework,
            "explanation": c.explanation or None, "used_variant": c.used_variant or None,
            "best_variant": c.best_variant or None, "screened": list(c.screened),
            "used_screened": c.used_screened, "best_screened": c.best_screened}


def _library_json(v) -> dict:
    al = v.alignment
    deviations = [{"node": m.node, "deviations": list(m.deviations)} for m in (al.passes[0] if al.passes else [])
                  if m.deviations]
    return {
        "library": v.library, "calls": v.calls, "passes": len(al.passes),
        "expected_calls": len(al.expected), "missing": al.missing, "out_of_order": al.out_of_order,
        "extra": [{"api": c.api, "index": c.index, "algo": c.algo} for c in al.extra],
        "deviations": deviations,
        "api_counts": {k: {"expected": e, "logged": g} for k, (e, g) in al.api_counts.items()},
        "framework_version": v.framework_version or None, "benchmark_version": v.benchmark_version or None,
        "framework_threads": v.framework_threads, "benchmark_threads": v.benchmark_threads,
        "algorithms": [_choice_json(c) for c in v.algorithms],
        "not_comparable": len(v.not_comparable),
        "screened": len(v.screened),
        "algorithm_gain_ms": _r(v.algorithm_gain_ms),
    }


def document(analyses: Sequence[Analysis]) -> dict:
    """The top-level --json document: every (system, batch size) analysed, in order."""
    return {"schema_version": SCHEMA_VERSION, "analyses": [analysis_json(a) for a in analyses]}


# --- terminal ----------------------------------------------------------------------------------


# How a figure racing stopped at its screening estimate is labelled wherever it is shown.
SCREENED = " (screened estimate)"


def _ms(x: float | None) -> str:
    return "—" if x is None else f"{x:.4g}"


def _row(table: Table, *cells: str) -> None:
    """Cells hold names from model files and logs: plain text, never rich markup."""
    from rich.text import Text

    table.add_row(*(Text(printable(c)) for c in cells))


LAYER_COLUMNS = ("model", "system", "backend", "dtype", "batch_size", "index", "name", "op", "key", "status",
                 "latency_ms", "variant", "algo", "implementation", "critical", "failed_variants", "contended")


def layers_csv(analyses: Sequence[Analysis]) -> str:
    """Every layer of every analysis, one CSV row each (the terminal table, uncut)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(LAYER_COLUMNS)
    for a in analyses:
        for r in a.rows:
            writer.writerow([a.model, a.system, a.backend, a.dtype, a.batch_size, r.index, r.name, r.op, r.key,
                             r.status, repr(r.latency_ms) if r.status == "ok" else "", r.variant, r.algo,
                             r.implementation, int(r.critical), r.failed_variants, int(r.contended)])
    return buf.getvalue()


def _phase(a: Analysis) -> str:
    return "" if a.phase is None else f", {a.phase.phase.label}"


def print_analysis(a: Analysis, console: Console, max_layers: int = 60, depth: int = 2) -> None:
    """``max_layers``: rows of the layer table (the slowest when cut); 0 shows every layer.
    ``depth``: levels of the module tree shown. Layers and parallel modules of identical repeated
    modules are shown once, with their count."""
    from rich.table import Table
    from rich.text import Text

    title = f"{a.model} on {a.system} ({a.backend}, {a.dtype}, batch {a.batch_size}{_phase(a)})"
    if a.stack is not None:
        console.print(f"{a.system}: stack {a.stack.stack_id} on {a.stack.device} ("
                      + ", ".join(f"{k} {v}" for k, v in a.stack.stack if k not in ("cpu",)) + f"); math {a.math}",
                      highlight=False, markup=False, soft_wrap=True)
    # Printed only when asked for (--allow-contended): then every column of figures says so.
    tag = " (CONTENDED)" if a.contended else ""
    if a.contended:
        title += f" — CONTENDED: {len(a.contended)} results were measured while other processes took the CPU"
    t = Table("", "sequential" + tag, "parallel" + tag, title=Text(printable(title)))
    _row(t, "lower bound (ms)" + (" [PARTIAL]" if a.bounds.partial else ""),
              _ms(a.bounds.sequential_ms), _ms(a.bounds.parallel_ms))
    measured = sum(1 for r in a.rows if r.status == "ok")
    _row(t, "unstable layers in the bound", f"{len(a.unstable_rows)} of {measured}", "")
    _row(t, "with fusion (ms)", _ms(a.fusion.bounds.sequential_ms), _ms(a.fusion.bounds.parallel_ms))
    if a.framework is not None:
        _row(t, f"with {a.framework.framework}'s fusions (ms)", _ms(a.framework.bounds_same_fusions.sequential_ms),
                  _ms(a.framework.bounds_same_fusions.parallel_ms))
    for label, b in a.tensor_cores.bounds.items():
        if label != a.dtype:
            _row(t, f"{label} (ms)" + (" CONTENDED" if label in a.tensor_cores.contended else ""),
                 _ms(b.sequential_ms), _ms(b.parallel_ms))
    if a.joint is not None:
        _row(t, a.joint_label + " (ms)" + (" CONTENDED" if a.joint_contended else ""), "", _ms(a.joint.parallel_ms))
    if a.floors is not None and a.floors.binding is not None:
        _row(t, "critical path, without the floors (ms)", "", _ms(a.floors.critical_path_ms))
    if a.speed_of_light is not None:
        _row(t, "speed of light, roofline of the same layers (ms)", _ms(a.speed_of_light.sequential_ms),
             _ms(a.speed_of_light.parallel_ms))
    if a.measured_ms is not None:
        _row(t, f"measured ({a.measured_source}) ms", _ms(a.measured_ms), "")
        unequal = f" ({a.threads.label})" if a.threads is not None and a.threads.differ else ""
        _row(t, "Benanza ratio" + unequal, _ms(a.br_sequential), _ms(a.br_parallel))
        _row(t, "potential speedup", f"{1 / a.br_sequential:.3g}×" if a.br_sequential else "—",
                  f"{1 / a.br_parallel:.3g}×" if a.br_parallel else "—")
        if a.framework is not None:
            seq, par = a.framework.bounds_same_fusions.ratio(a.measured_ms)
            _row(t, f"ratio vs bound with {a.framework.framework}'s fusions" + unequal, _ms(seq), _ms(par))
    console.print(t)
    _print_floors(a, console)
    print_module_tree(a, console, depth)

    folded = folded_layers(a, a.rows)
    cut = bool(max_layers) and len(folded) > max_layers
    rows = sorted(folded, key=lambda f: -f[0].latency_ms)[:max_layers] if cut else folded
    shown = f"the {max_layers} slowest of {len(folded)} layers" if cut else "layers"
    lt = Table("#", "layer", "module", "×", "type", "latency ms" + tag, "variant", "path", title=shown + (
        f" ({len(a.rows)} with repeats)" if len(folded) < len(a.rows) else ""))
    for r, count, module in rows:
        if r.status == "ok":
            lat = _ms(r.latency_ms) + (" contended" if r.contended else "")
        else:
            lat = r.status.replace("_", " ")
        variant = f"{r.algo}" + (f" [{r.implementation}]" if r.implementation else "")
        _row(lt, str(r.index), r.name, module, str(count) if count > 1 else "", r.op, lat, variant,
             "●" if r.critical else "")
    console.print(lt)

    if a.speed_of_light is not None:
        _print_speed_of_light(a, console)

    if a.modules:
        mt = Table("fork", "join", "×", "branches", "layers", "sequential ms" + tag, "parallel ms" + tag,
                   title="parallel modules")
        for p, count in folded_parallel(a):
            _row(mt, a.at(p.fork), a.at(p.join), str(count) if count > 1 else "", str(p.branches),
                 str(len(p.nodes)), _ms(p.sequential_ms), _ms(p.parallel_ms))
        console.print(mt)
    if a.fusion.matches:
        console.print(f"Q5 fusion: {a.fusion.matches} patterns found, {len(a.fusion.applied)} profitable fused "
                      f"benchmarks, {a.fusion.layers_fused} layers fused, {len(a.fusion.unprofitable)} unprofitable "
                      f"(fused no faster than unfused, not applied); sequential bound "
                      f"{_ms(a.bounds.sequential_ms)} → {_ms(a.fusion.bounds.sequential_ms)} ms",
                      highlight=False, markup=False)
        for u in a.fusion.unprofitable:
            console.print(f"  unprofitable: {u.pattern} at {a.at(u.nodes[0])}: fused {_ms(u.fused_ms)} ms vs "
                          f"unfused {_ms(u.unfused_ms)} ms", highlight=False, markup=False)
    if a.heuristic is not None:
        h = a.heuristic
        console.print(f"Q3 cuDNN heuristic vs ideal (database only): {len(h.choices)} convolutions, "
                      f"{h.suboptimal} where the heuristic's algorithm is not the fastest; "
                      f"{_ms(h.heuristic_ms)} vs {_ms(h.ideal_ms)} ms"
                      + (f" ({h.unknown} heuristic choices never measured OK, counted at the best)"
                         if h.unknown else ""), highlight=False, markup=False)
    for v in a.libraries:
        al = v.alignment
        console.print(f"Q4 {v.library}: {v.calls} calls logged over {len(al.passes)} passes; "
                      f"{len(al.missing)} expected layers missing, {len(al.extra)} extra calls, "
                      f"{len(al.out_of_order)} out of order", highlight=False, markup=False)
        if v.algorithms:
            console.print(_choices_table(f"Q3 {v.library} algorithms", v.algorithms))
            if v.versions_differ:
                console.print(f"Q3: not judged: the framework's {v.library} {v.framework_version} is not the "
                              f"benchmarks' {v.benchmark_version} (framework ms: its own per-call time)",
                              highlight=False, markup=False)
            else:
                unknown = sum(1 for c in v.algorithms if c.comparable and c.used_ms is None)
                console.print(f"Q3: {len(v.suboptimal)} sub-optimal layers (a measured gain beyond the noise), "
                              f"{v.algorithm_gain_ms:.4g} ms to gain"
                              + (f"; {unknown} used an implementation never benchmarked here" if unknown else "")
                              + _screened(v.screened) + _unequal(a), highlight=False, markup=False)
            if v.not_comparable:
                console.print(f"Q3: {len(v.not_comparable)} calls not comparable (no benchmark computes what the "
                              f"call fused, or none in its layout): not judged", highlight=False, markup=False)
            for c in v.above_framework:
                console.print(f"  • {c.name}: bound {_ms(c.bound_ms)} ms > the framework's {_ms(c.framework_ms)} ms "
                              f"per call: {c.explanation}", highlight=False, markup=False, soft_wrap=True)
    if a.framework is not None:
        f = a.framework
        console.print(f"Q4 {f.framework}: {f.match.run_ms:.4g} ms per run, {f.match.op_ms:.4g} ms in ops "
                      f"(kernel share {f.kernel_share or 0:.0%}), {f.inserted_ms:.4g} ms in inserted ops",
                      highlight=False, markup=False)
        for e in f.explanations:
            console.print(f"  • {e}", highlight=False, markup=False)
        if f.kernels:
            console.print(_choices_table(f"Q3 {f.framework} kernels (its own fastest variant)", f.kernels))
            judged = sum(1 for c in f.kernels if c.comparable)
            console.print(f"Q3: {len(f.suboptimal)} of {judged} {f.framework} ops ran a slower variant than its "
                          f"fastest (a measured gain beyond the noise), {f.kernel_gain_ms:.4g} ms to gain"
                          + _screened(f.screened) + _unequal(a), highlight=False, markup=False)
    _print_across_stack(a, console)
    if a.page_faults is not None:
        console.print(page_faults_line(a.page_faults), highlight=False, markup=False, soft_wrap=True)
    if a.speed is not None:
        console.print(f"machine speed: the reference kernel took {a.speed.core_ratio:.2f}× (core) and "
                      f"{a.speed.memory_ratio:.2f}× (memory) its benchmarks' time around the profiled run",
                      highlight=False, markup=False, soft_wrap=True)
    if a.tensor_cores.kernels:
        console.print(f"Q6: {a.tensor_cores.tc_kernels} of {a.tensor_cores.kernels} GPU kernels use Tensor Cores",
                      highlight=False, markup=False)
    for bc in a.between_calls:
        console.print(f"between library calls: {bc.name} ({bc.kind}) ×{bc.count}, {bc.total_ms:.4g} ms"
                      + (f" at {bc.backtrace[0]}" if bc.backtrace else ""), highlight=False, markup=False)
    for w in a.warnings:
        console.print(Text.assemble(("warning:", "yellow"), f" {printable(w)}"), soft_wrap=True)
    for n in a.notes:
        console.print(f"note: {n}", highlight=False, markup=False, soft_wrap=True)


def page_faults_line(f: PageFaultCost) -> str:
    """The profiled run's page faults; where they cost a notable share of it, what removes them."""
    line = f"page faults: {f.per_run:.4g} per run"
    if f.ms is None:
        return line + " (their cost was not measured)"
    line += f" × {f.fault_us:.3g} µs each here = {f.ms:.4g} ms"
    if f.share is not None:
        line += f", {f.share:.1%} of the measured latency"
    if f.notable:
        line += (": the process mapped memory afresh in every run, memory its allocator had given back to the OS "
                 "(glibc's malloc unmaps each freed block above its mmap threshold and trims its heap), and the bound "
                 "has no such time. An allocator that keeps freed memory removes it: jemalloc or tcmalloc through "
                 "LD_PRELOAD, or glibc's own "
                 "GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296")
    return line


def _screened(choices) -> str:
    return (f"; {len(choices)} not judged: compared with a screened estimate (the warnings give the command "
            f"that measures it in full)" if choices else "")


def _unequal(a: Analysis) -> str:
    return f" [{a.threads.label}]" if a.threads is not None and a.threads.differ else ""


def _print_floors(a: Analysis, console: Console) -> None:
    f = a.floors
    if f is None:
        return
    b = f.binding
    head = (f"parallel bound {_ms(f.parallel_ms)} ms: the {b.name} floor binds ({b.detail}), above the critical path's "
            f"{_ms(f.critical_path_ms)} ms" if b is not None else
            f"parallel bound {_ms(f.parallel_ms)} ms: the critical path binds, above every resource floor")
    console.print(head, highlight=False, markup=False, soft_wrap=True)
    for x in f.floors:
        if x is not b:
            console.print(f"  {x.name} floor {_ms(x.ms)} ms: {x.detail}", highlight=False, markup=False,
                          soft_wrap=True)
    for why in f.absent:
        console.print(f"  no {why}", highlight=False, markup=False, soft_wrap=True)


def _print_across_stack(a: Analysis, console: Console, top: int = 10) -> None:
    from rich.table import Table
    from rich.text import Text

    x = a.across_stack
    if x is None:
        return
    bound = f"{x.framework} kernels' bound {x.native_bound_ms:.4g} ms"
    measured = (f"measured {x.measured_ms:.4g} ms = {bound} + framework overhead {x.framework_overhead_ms:.4g} ms; "
                if x.measured_ms is not None and x.framework_overhead_ms is not None else f"{bound}; ")
    console.print(f"across the stack: {measured}kernel headroom {x.kernel_headroom_ms:.4g} ms to the {x.vendor} "
                  f"bound {x.vendor_bound_ms:.4g} ms (stack {x.vendor_stack})"
                  + (" (partial: layers without results are left out)" if x.partial else "")
                  + (f" (CONTENDED: {len(x.contended)} {x.vendor} results were measured while other processes "
                     f"took the CPU)" if x.contended else ""),
                  highlight=False, markup=False, soft_wrap=True)
    rows = sorted((la for la in x.layers if la.kernel_headroom_ms is not None),
                  key=lambda la: -abs(la.kernel_headroom_ms or 0.0))[:top]
    if rows:
        t = Table("layer", "op", f"{x.framework} ms", f"{x.vendor} ms", "headroom ms", "framework ms", "overhead ms",
                  title=Text(f"across the stack: the {len(rows)} layers with the largest kernel headroom"))
        for la in rows:
            _row(t, la.name, la.op, _ms(la.native_ms), _ms(la.vendor_ms), _ms(la.kernel_headroom_ms),
                 _ms(la.framework_ms), _ms(la.framework_overhead_ms))
        console.print(t)


def _choices_table(title: str, choices) -> Table:
    from rich.table import Table
    from rich.text import Text

    t = Table("layer", "layout", "fusion", "used", "used ms", "framework ms", "best", "best ms", "bound ms",
              "gain ms", title=Text(title))
    for c in choices:
        fusion = c.fusion or ("+".join(c.post_ops) + " (no benchmark)" if c.post_ops else "no benchmark")
        _row(t, c.name, c.layout or "?", fusion, c.used, _ms(c.used_ms) + (SCREENED if c.used_screened else ""),
             _ms(c.framework_ms), c.best or "not comparable", _ms(c.best_ms) + (SCREENED if c.best_screened else ""),
             _ms(c.bound_ms) + (" > framework" if c.above_framework else ""),
             _ms(c.gain_ms) + (SCREENED if c.screened and c.gain_ms is not None else ""))
    return t


def _print_speed_of_light(a: Analysis, console: Console, top: int = 10) -> None:
    from rich.table import Table

    sol = a.speed_of_light
    assert sol is not None
    p = sol.peaks
    compute = ", ".join(f"{x.label} {x.value / 1e9:.4g} GFLOP/s" for x in p.peaks if x.kind != "bandwidth")
    ladder = ", ".join(f"{x.level} {x.size / 2**20:.3g} MiB {x.value / 1e9:.3g} GB/s" for x in p.ladder)
    console.print(f"speed of light from the stack's peaks ({p.source} {p.measured_at}, {p.threads} threads"
                  + (f", {p.contended:.0%} of it contended" if p.contended else "") + f"): {compute}; "
                  f"bandwidth {ladder}", highlight=False, markup=False, soft_wrap=True)
    if a.bounds.sequential_ms:
        console.print(f"{sol.memory_bound_ms():.4g} ms of the {a.bounds.sequential_ms:.4g} ms bound "
                      f"({sol.memory_bound_ms() / a.bounds.sequential_ms:.0%}) is in memory-bound layers",
                      highlight=False, markup=False)
    rows = sorted(sol.layers, key=lambda r: -r.left_ms)[:top]
    t = Table("#", "layer", "type", "bound by", "FLOP/byte", "roofline ms", "best ms", "of SOL", "ms left",
              title=f"the {len(rows)} layers furthest from speed of light")
    for r in rows:
        row = a.rows[r.index]
        _row(t, str(r.index), row.name, row.op, f"{r.roof.bound_by} ({r.roof.level})" if r.roof.bound_by == "memory"
             else r.roof.bound_by, _ms(r.roof.intensity), _ms(r.sol_ms), _ms(r.latency_ms),
             f"{r.sol_fraction:.0%}" if r.sol_fraction is not None else "—", _ms(r.left_ms))
    console.print(t)


def print_sweep(analyses: Sequence[Analysis], console: Console) -> None:
    from rich.table import Table

    t = Table("model", "system", "batch", "seq ms", "par ms", "fused seq ms", "joint ms", "measured ms",
              "BR seq", "BR par", title="sweep")
    for a in analyses:
        model = a.model + _phase(a) + (" (CONTENDED)" if a.contended else "")
        _row(t, model, a.system, str(a.batch_size), _ms(a.bounds.sequential_ms), _ms(a.bounds.parallel_ms),
                  _ms(a.fusion.bounds.sequential_ms),
                  _ms(a.joint.parallel_ms if a.joint else None) + (" contended" if a.joint_contended else ""),
                  _ms(a.measured_ms), _ms(a.br_sequential), _ms(a.br_parallel))
    console.print(t)


# --- HTML ----------------------------------------------------------------------------------------

_BOX_W, _BOX_H, _GAP_X, _GAP_Y = 168, 46, 18, 34


def dag_layout(n: int, edges: Sequence[tuple[int, int]]) -> dict[int, tuple[float, float]]:
    """Layered layout: rank = longest distance from a source; order within a rank by the
    mean position of predecessors (one barycenter sweep), which keeps branches side by side."""
    preds: dict[int, list[int]] = {i: [] for i in range(n)}
    for s, d in edges:
        preds[d].append(s)
    rank: dict[int, int] = {}
    for i in range(n):  # node indices are topological
        rank[i] = 1 + max((rank[p] for p in preds[i]), default=-1)
    by_rank: dict[int, list[int]] = {}
    for i in range(n):
        by_rank.setdefault(rank[i], []).append(i)
    pos: dict[int, float] = {}
    for r in sorted(by_rank):
        nodes = by_rank[r]
        nodes.sort(key=lambda i: (sum(pos[p] for p in preds[i]) / len(preds[i])) if preds[i] else i)
        for k, i in enumerate(nodes):
            pos[i] = k - (len(nodes) - 1) / 2
    return {i: (pos[i], rank[i]) for i in range(n)}


def dag_svg(a: Analysis) -> str:
    from markupsafe import escape

    layout = dag_layout(len(a.rows), a.edges)
    if not layout:
        return "<svg xmlns='http://www.w3.org/2000/svg' width='10' height='10'></svg>"
    min_x = min(x for x, _ in layout.values())
    max_x = max(x for x, _ in layout.values())
    depth = max(y for _, y in layout.values()) + 1
    width = (max_x - min_x + 1) * (_BOX_W + _GAP_X) + _GAP_X
    height = depth * (_BOX_H + _GAP_Y) + _GAP_Y

    def xy(i: int) -> tuple[float, float]:
        x, y = layout[i]
        return (_GAP_X + (x - min_x) * (_BOX_W + _GAP_X), _GAP_Y / 2 + y * (_BOX_H + _GAP_Y))

    path = a.bounds.critical_path
    crit_edges = set(zip(path, path[1:]))
    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' class='dag' width='{width:.0f}' height='{height:.0f}' "
             f"viewBox='0 0 {width:.0f} {height:.0f}'>"]
    for s, d in a.edges:
        (x1, y1), (x2, y2) = xy(s), xy(d)
        cls = "edge critical" if (s, d) in crit_edges else "edge"
        parts.append(f"<line class='{cls}' x1='{x1 + _BOX_W / 2:.1f}' y1='{y1 + _BOX_H:.1f}' "
                     f"x2='{x2 + _BOX_W / 2:.1f}' y2='{y2:.1f}'/>")
    for r in a.rows:
        x, y = xy(r.index)
        cls = "node critical" if r.critical else "node"
        cls += f" {r.status}"
        lat = f"{r.latency_ms:.4g} ms" if r.status == "ok" else r.status.replace("_", " ")
        parts.append(
            f"<g class='{cls}' data-index='{r.index}'><title>{escape(r.key)}</title>"
            f"<rect x='{x:.1f}' y='{y:.1f}' width='{_BOX_W}' height='{_BOX_H}' rx='5'/>"
            f"<text x='{x + 6:.1f}' y='{y + 15:.1f}' class='name'>{escape(r.name[:24])}</text>"
            f"<text x='{x + 6:.1f}' y='{y + 29:.1f}'>{escape(r.op)}</text>"
            f"<text x='{x + 6:.1f}' y='{y + 42:.1f}' class='lat'>{escape(lat)}</text></g>")
    parts.append("</svg>")
    return "".join(parts)


def bar_chart(title: str, bars: Sequence[tuple[str, float | None]], unit: str = "ms") -> str:
    """A horizontal SVG bar chart; bars without a value are omitted."""
    from markupsafe import escape

    shown = [(label, v) for label, v in bars if v is not None and math.isfinite(v)]
    if not shown:
        return ""
    top = max(v for _, v in shown) or 1.0
    row, label_w, bar_w = 24, 300, 360
    h = row * len(shown) + 30
    out = [f"<svg xmlns='http://www.w3.org/2000/svg' class='chart' width='{label_w + bar_w + 90}' height='{h}'>"
           f"<text x='0' y='14' class='title'>{escape(title)}</text>"]
    for k, (label, v) in enumerate(shown):
        y = 24 + k * row
        w = max(1.0, bar_w * v / top)
        out.append(f"<text x='0' y='{y + 14}'>{escape(label)}</text>"
                   f"<rect x='{label_w}' y='{y + 2}' width='{w:.1f}' height='{row - 8}' class='bar'/>"
                   f"<text x='{label_w + w + 6:.1f}' y='{y + 14}'>{v:.4g} {escape(unit)}</text>")
    out.append("</svg>")
    return "".join(out)


def _charts(a: Analysis) -> list[str]:
    bars: list[tuple[str, float | None]] = [
        ("sequential bound", a.bounds.sequential_ms), ("parallel bound", a.bounds.parallel_ms)]
    if a.floors is not None:
        bars += [("critical path", a.floors.critical_path_ms)] + [(f"{f.name} floor", f.ms) for f in a.floors.floors]
    bars += [("sequential bound with fusion", a.fusion.bounds.sequential_ms)]
    if a.framework is not None:
        bars.append((f"bound with {a.framework.framework}'s fusions", a.framework.bounds_same_fusions.sequential_ms))
    bars += [(f"{k} sequential bound", b.sequential_ms) for k, b in a.tensor_cores.bounds.items() if k != a.dtype]
    if a.joint is not None:
        bars.append((a.joint_label, a.joint.parallel_ms))
    bars.append(("measured", a.measured_ms))
    charts = [bar_chart("latency", bars)]
    if a.measured_ms:
        charts.append(bar_chart("Benanza ratio (bound / measured)" + _unequal(a), [
            ("BR sequential", a.br_sequential), ("BR parallel", a.br_parallel)], unit=""))
        charts.append(bar_chart("potential speedup (1 / BR)", [
            ("sequential", 1 / a.br_sequential if a.br_sequential else None),
            ("parallel", 1 / a.br_parallel if a.br_parallel else None),
            ("with fusion", a.measured_ms / a.fusion.bounds.sequential_ms if a.fusion.bounds.sequential_ms else None),
            (a.joint_label or "joint",
             a.measured_ms / a.joint.parallel_ms if a.joint and a.joint.parallel_ms else None),
        ], unit="×"))
    return [c for c in charts if c]


def _log_scale(lo: float, hi: float, size: float, flip: bool = False):
    """Maps [lo, hi] (positive) logarithmically onto [0, size]."""
    span = math.log10(hi) - math.log10(lo)

    def at(v: float) -> float:
        x = (math.log10(v) - math.log10(lo)) / span * size
        return size - x if flip else x

    return at


def roofline_svg(a: Analysis) -> str:
    """The roofline plot: attained FLOP/s against FLOPs per byte, one point per layer of the
    bound (critical-path layers in red), the compute roofs (each dtype's GEMM, the cores' FMA
    peak) and the bandwidth roofs of the L1 cache and of main memory."""
    from markupsafe import escape

    sol = a.speed_of_light
    if sol is None:
        return ""
    points = [(r, r.roof.intensity, r.roof.flops / (r.latency_ms / 1e3)) for r in sol.layers
              if r.roof.flops and r.roof.intensity and r.latency_ms]
    roofs_compute = [p for p in sol.peaks.peaks if p.kind != "bandwidth"]
    ladder = sol.peaks.ladder
    if not points or not ladder:
        return ""
    roofs_bw = [ladder[0], ladder[-1]] if len(ladder) > 1 else ladder
    x_lo = 10 ** math.floor(math.log10(min(i for _, i, _ in points) / 2))
    x_hi = 10 ** math.ceil(math.log10(max(i for _, i, _ in points) * 2))
    top = max([g.value for g in roofs_compute] + [v for _, _, v in points])
    y_hi = 10 ** math.ceil(math.log10(top * 1.5))
    y_lo = 10 ** math.floor(math.log10(max(min(v for _, _, v in points) / 2, y_hi * 1e-9)))
    w, h, ml, mt, mb = 640, 400, 70, 24, 40
    fx, fy = _log_scale(x_lo, x_hi, w), _log_scale(y_lo, y_hi, h, flip=True)
    out = [f"<svg xmlns='http://www.w3.org/2000/svg' class='roofline' width='{w + ml + 160}' height='{h + mt + mb}'>"
           f"<g transform='translate({ml},{mt})'><rect class='frame' width='{w}' height='{h}'/>"]
    for e in range(int(math.log10(x_lo)), int(math.log10(x_hi)) + 1):
        x = fx(10.0 ** e)
        out.append(f"<line class='grid' x1='{x:.1f}' y1='0' x2='{x:.1f}' y2='{h}'/>"
                   f"<text x='{x:.1f}' y='{h + 16}' text-anchor='middle'>1e{e}</text>")
    for e in range(int(math.log10(y_lo)), int(math.log10(y_hi)) + 1):
        y = fy(10.0 ** e)
        out.append(f"<line class='grid' x1='0' y1='{y:.1f}' x2='{w}' y2='{y:.1f}'/>"
                   f"<text x='-6' y='{y + 4:.1f}' text-anchor='end'>1e{e}</text>")
    out.append(f"<text x='{w / 2}' y='{h + 34}' text-anchor='middle'>arithmetic intensity (FLOP per compulsory byte)"
               f"</text><text transform='rotate(-90)' x='{-h / 2}' y='-52' text-anchor='middle'>attained FLOP/s</text>")
    for g in roofs_compute:  # each compute peak (GEMM per dtype, the FMA), from where the top bandwidth roof meets it
        x0 = max(x_lo, g.value / roofs_bw[0].value)
        if x0 < x_hi:
            y = fy(g.value)
            out.append(f"<line class='roof compute' x1='{fx(x0):.1f}' y1='{y:.1f}' x2='{w}' y2='{y:.1f}'/>"
                       f"<text x='{w + 4}' y='{y + 4:.1f}'>{escape(g.label)} {g.value / 1e9:.4g} GFLOP/s</text>")
    peak = max(g.value for g in roofs_compute) if roofs_compute else y_hi
    for bw in roofs_bw:  # bandwidth roofs: FLOP/s = bytes/s × FLOP/byte, up to the highest compute roof
        x1 = min(x_hi, peak / bw.value)
        if x1 > x_lo:
            y0, y1 = max(y_lo, bw.value * x_lo), bw.value * x1
            out.append(f"<line class='roof memory' x1='{fx(y0 / bw.value):.1f}' y1='{fy(y0):.1f}' x2='{fx(x1):.1f}' "
                       f"y2='{fy(y1):.1f}'/><text x='{fx(y0 / bw.value) + 4:.1f}' y='{fy(y0) - 6:.1f}' "
                       f"class='rooflabel'>{escape(bw.level)} {bw.value / 1e9:.3g} GB/s</text>")
    on_path = set(a.bounds.critical_path)
    for r, intensity, attained in points:
        row = a.rows[r.index]
        cls = "pt critical" if r.index in on_path else "pt"
        out.append(f"<circle class='{cls}' cx='{fx(intensity):.1f}' cy='{fy(attained):.1f}' r='4'><title>"
                   f"{escape(row.name)} ({escape(row.op)}): {attained / 1e9:.4g} GFLOP/s at {intensity:.3g} FLOP/B, "
                   f"{r.sol_fraction:.0%} of speed of light</title></circle>")
    out.append("</g></svg>")
    return "".join(out)


def render_html(analyses: Sequence[Analysis]) -> str:
    from markupsafe import Markup

    from .generator import template_env

    env = template_env("report")
    env.autoescape = True
    sections = [{"a": a, "json": analysis_json(a), "dag": Markup(dag_svg(a)), "modules": Markup(icicle_svg(a)),
                 "parallel": folded_parallel(a), "roofline": Markup(roofline_svg(a)),
                 "page_faults": None if a.page_faults is None else page_faults_line(a.page_faults),
                 "charts": [Markup(c) for c in _charts(a)]} for a in analyses]
    return env.get_template("report.html.j2").render(sections=sections, schema_version=SCHEMA_VERSION,
                                                     decode_plot=Markup(decode_svg(analyses)))
