"""What the framework-native fidelity scripts share (fidelity_onnxruntime.py, fidelity_torch.py).

Each script measures one framework against its own backend: it generates and runs the model's
benchmarks, profiles the whole model, analyzes the profile, and reports per model and threads
the Benanza ratio, nn-Meter's fidelity (each op's isolated benchmark against its own time in the
whole model) and Q3. Only how a framework's benchmarks and profile come about differs; the
machine record, the benchmarks' generation and run, and the row computed from the analysis and
the profile's trace are here.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from benanza.backends.inprocess import CACHE_STATES
from benanza.generator import GenOptions, generate
from benanza.layers import unique_layers
from benanza.machine_speed import MachineSpeed, one_speed
from benanza.manifest import build_manifest, write_manifest
from benanza.parsers.bundle import INDEX_NAME
from benanza.perfdb import PerfDB
from benanza.processor import load_model
from benanza.profiler import ProfileSpec, profile_model
from benanza.runner import RunOptions, run
from benanza.system import cpu_flags, cpu_isa, cpu_model
from benanza.zoo import build_all
from benanza.zoo import names as zoo_names

if TYPE_CHECKING:
    from benanza.analyzer import Analysis
    from benanza.parsers.base import FrameworkTrace
    from benanza.records import System

SYSTEM = "fidelity"
# the CPU features that decide which oneDNN and MLAS kernels exist on a machine
ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16")
WITHIN = 0.10  # nn-Meter's fidelity band: isolated within ±10 % of the op's time in the model


EXPORTED = ("encoder", "gpt")  # tests/torch_models.py, at the opset the tests export them
OPSET = 17
DEFAULT_MODELS = ["resnet50-v1", "inception-v1", *EXPORTED]


def model_choices() -> list[str]:
    return [*zoo_names(), *EXPORTED]


def zoo_models(names: list[str], out: Path) -> dict[str, Path]:
    """benanza.zoo's models by name, built into ``out`` unless all are there already."""
    have = [out / f"{n}.onnx" for n in names]
    return {p.stem: p for p in (have if all(p.exists() for p in have) else build_all(out, names=names))}


def models(names: list[str], out: Path) -> list[Path]:
    """The models by name, in order: benanza.zoo's, and the test suite's encoder and GPT block
    (``tests/torch_models.py``, exported by torch at ``OPSET``)."""
    out.mkdir(parents=True, exist_ok=True)
    zoo = zoo_models([n for n in names if n not in EXPORTED], out) if set(names) - set(EXPORTED) else {}
    if set(names) & set(EXPORTED):
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        from torch_models import export  # the test suite's exporter: the models its tests check
    return [export(n, OPSET, out) if n in EXPORTED else zoo[n] for n in names]


def profile(model: Path, framework: str, threads: int, args: argparse.Namespace, work: Path,
            trace_iterations: int) -> Path:
    """The whole model's ``benanza profile`` bundle at ``threads`` (its latency from
    ``args.iterations`` runs without the profiler; ``trace_iterations`` profiled runs), kept under
    ``work`` and taken again only with ``args.reprofile``."""
    out = work / "profiles" / f"{model.stem}-t{threads}"
    if args.reprofile or not (out / INDEX_NAME).exists():
        profile_model(ProfileSpec(str(model), framework, str(out), iterations=args.iterations,
                                  trace_iterations=trace_iterations, threads=threads))
    return out


def machine() -> dict:
    return {"cpu": cpu_model(), "isa": cpu_isa(), "isa_flags": [f for f in ISA_FLAGS if f in cpu_flags()],
            "cores": len(os.sched_getaffinity(0))}


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


@dataclass(frozen=True)
class Measured:
    """The model's benchmarks on one stack (its threads), as the database holds them."""

    system: System
    variants: int  # generated
    statuses: dict[str, int]  # the latest result's status per variant: ok, unsupported, failed
    contended: int  # ok results stored contended: measured while other processes took the CPU
    contended_share: float  # of this run's measurements, those that lost time to other processes
    run_s: float  # what this run spent (0 when everything was measured before)


def measure_benchmarks(model: Path, backend: str, bench: Path, db: Path, options: GenOptions,
                       run_options: RunOptions) -> Measured:
    """Generate the model's benchmarks for ``backend`` (once: kept in ``bench``) and run what the
    database lacks on the stack of ``run_options.threads``."""
    if not (bench / backend / "benchmarks.json").exists():
        loaded = [load_model(model, batch_size=1)]
        manifest = build_manifest(loaded, unique_layers(loaded))
        write_manifest(manifest, bench)
        generate(manifest, backend, bench, options, loaded)
    t0 = time.monotonic()
    summary = run(bench, SYSTEM, backend, db, run_options)
    run_s = time.monotonic() - t0 if summary.to_run else 0.0
    with PerfDB(db, readonly=True) as pdb:
        latest = pdb.results(summary.system)
        contended = len(pdb.contended(summary.system))
    return Measured(summary.system, summary.total, dict(Counter(str(r.status) for r in latest)), contended,
                    round(summary.contended, 3), round(run_s, 1))


def op_samples_ms(trace: FrameworkTrace, first_run: int) -> dict[str, list[float]]:
    """Each op's own times in the whole model's runs from ``first_run`` on (the earlier ones warm
    up), in ms, by the op's name: what the analysis averages into the op's framework time."""
    times: dict[str, list[float]] = {}
    for o in trace.ops:
        if o.run >= first_run:
            times.setdefault(o.name, []).append(o.span.dur_us / 1e3)
    return times


def low(samples: list[float]) -> float:
    """The 10th percentile: the bound's statistic of the isolated samples, taken alike in the model."""
    return float(np.percentile(samples, 10))


def profiled_ms(pdb: PerfDB, system: System) -> dict[str, float]:
    """The variants whose stored time is not their profiler's reading (ORT's replicas clock),
    each with that reading (``Result.traced_ms``): the clock a traced profile's op times hold,
    the profiler's own per-kernel cost included."""
    return {r.variant.name: r.traced_ms for r in pdb.results(system)
            if r.untraced and r.traced_ms is not None}


def readings(pdb: PerfDB, system: System) -> dict[str, MachineSpeed]:
    """Each variant's reading of the machine's speed taken before it was measured."""
    return {r.variant.name: s for r in pdb.results(system) if (s := MachineSpeed.from_metrics(r.metrics)) is not None}


def fidelity_pairs(a: Analysis, in_model: dict[str, list[float]], traced: dict[str, float] | None = None,
                   speeds: dict[str, MachineSpeed] | None = None) -> list[dict]:
    """Per framework op that ran model layers and whose variant was measured: the isolated
    benchmark's 10th percentile (Q3's ``used_ms``; ``traced``: the variants' readings on the
    profiler's clock, where the stored time is another) against the 10th percentile of the op's
    own times in the model's traced runs (unrounded: a 1 µs kernel rounded to 10 ns moves its
    ratio 1 %): the same clock on both sides. With ``speeds`` (``readings``) and the profile's own
    reading, each pair also has ``speed_ratio``: the machine's speed around the profile against
    before its benchmark, core and memory (above 1: the profile ran on a slower machine)."""
    if a.framework is None:
        return []
    traced, speeds = traced or {}, speeds or {}
    names = {i: g.name for g in a.framework.match.groups for i in g.nodes}
    out = []
    for c in a.framework.kernels:
        samples = in_model.get(names.get(c.node, ""), [])
        if c.used_ms is None or not samples or low(samples) <= 0:
            continue
        pair = {"op": names[c.node], "variant": c.used_variant,
                "isolated_ms": traced.get(c.used_variant or "", c.used_ms),
                "in_model_ms": low(samples), "runs": len(samples)}
        before = speeds.get(c.used_variant or "")
        if a.speed is not None and before is not None:
            pair["speed_ratio"] = [round(a.speed.profile.core_ms / before.core_ms, 3),
                                   round(a.speed.profile.memory_ms / before.memory_ms, 3)]
        out.append(pair)
    return out


def fidelity(pairs: list[dict], detail: Path, step_ms: float = 0.0) -> dict:
    """The share of pairs within ±10 % and their median ratio; the pairs kept in ``detail``. Also
    the share of the compared ops' time in the model that the ops within ±10 % take
    (``within_10pct_of_time``): a bound summed from the isolated readings is off by what the others
    take, so this, not the count, says how much of it is read true (a miss of a 12 µs Concat
    weighs as much in the count as one of a 6 ms convolution). With ``step_ms`` (the step of a
    clock both sides read, ORT's whole microseconds) also the share within ±10 % or one step
    apart: a 3 µs op read as 2 µs is 33 % off on that clock alone."""
    detail.write_text(json.dumps(pairs, indent=1))
    within = [_within(p) for p in pairs]
    ratios = [p["isolated_ms"] / p["in_model_ms"] for p in pairs]
    in_model = sum(p["in_model_ms"] for p in pairs)
    out = {"ops": len(ratios),
           "within_10pct": round(sum(within) / len(ratios), 3) if ratios else None,
           "within_10pct_of_time": round(sum(p["in_model_ms"] for p, w in zip(pairs, within) if w) / in_model, 3)
           if ratios else None,
           "median_ratio": round(statistics.median(ratios), 3) if ratios else None, "detail": str(detail)}
    timed = [p for p in pairs if "speed_ratio" in p]
    if timed:  # the pairs whose two sides read one machine speed, within the readings' own spread
        equal = [p for p in timed if one_speed(*p["speed_ratio"])]
        out["equal_speed"] = {"ops": len(equal),
                              "within_10pct": round(sum(map(_within, equal)) / len(equal), 3) if equal else None}
    if step_ms and pairs:
        near = sum(_within(p) or abs(p["isolated_ms"] - p["in_model_ms"]) <= step_ms * (1 + 1e-6) for p in pairs)
        out["within_10pct_or_step"] = round(near / len(pairs), 3)
    return out


def repeatability(first: list[dict], second: list[dict]) -> dict:
    """How far two independent runs of the same fidelity measurement (each its own ``--work``:
    its own benchmark processes, database and profile) agree, from their kept pairs: per side,
    the share of the ops both compared whose reading repeats within ±10 % (and the share of the
    ops' time in the model they take, as in ``fidelity``), and how many ops fall within ±10 % of
    their own isolated benchmark in one run and not in the other. Fidelity is not known more
    precisely than its two sides repeat: where a tenth of the in-model readings move by more than
    10 % between two runs, no isolated reading meets a ±10 % target on 90 % of the ops."""
    theirs = {p["op"]: p for p in second}
    both = [(p, theirs[p["op"]]) for p in first if p["op"] in theirs]
    if not both:
        return {"ops": 0}
    time_ms = sum(a["in_model_ms"] for a, _ in both)

    def repeats(key: str) -> dict:
        same = [_close(b[key], a[key]) for a, b in both]
        return {"within_10pct": round(sum(same) / len(both), 3),
                "within_10pct_of_time": round(sum(a["in_model_ms"] for (a, _), s in zip(both, same) if s) / time_ms, 3)}

    return {"ops": len(both), "isolated": repeats("isolated_ms"), "in_model": repeats("in_model_ms"),
            "verdict_changes": sum(_within(a) != _within(b) for a, b in both)}


def _within(pair: dict) -> bool:
    """Whether a pair's isolated reading is within ±10 % of its time in the model."""
    return _close(pair["isolated_ms"], pair["in_model_ms"])


def _close(value: float, reference: float) -> bool:
    """Whether ``value`` is within the fidelity band (±10 %) of ``reference``."""
    return abs(value / reference - 1) <= WITHIN


def row(a: Analysis, measured: Measured, pairs: list[dict], detail: Path, step_ms: float = 0.0) -> dict:
    """One model at one thread count: its benchmarks, the Benanza ratio, fidelity (its per-op
    pairs kept in ``detail``; ``step_ms``: see ``fidelity``) and Q3."""
    kernels = a.framework.kernels if a.framework else []
    return {
        "backend": a.backend, "stack": dict(a.stack.stack) if a.stack else {}, "variants": measured.variants,
        "ok": measured.statuses.get("ok", 0), "unsupported": measured.statuses.get("unsupported", 0),
        "failed": measured.statuses.get("failed", 0), "contended": measured.contended,
        "contended_share": measured.contended_share, "run_s": measured.run_s,
        "measured_ms": round(a.measured_ms or 0, 4), "bound_ms": round(a.bounds.sequential_ms, 4),
        "br_sequential": round(a.br_sequential or 0, 3), "partial": a.bounds.partial,
        "bound_on_contended": len(a.contended),  # of the results the bound chose from
        "fidelity": fidelity(pairs, detail, step_ms),
        # the profiled process's page faults per timed run and their estimated time (an allocator
        # that returns memory to the OS makes the model's kernels fault where the isolated ones do not)
        "page_faults": None if a.page_faults is None else {
            "per_run": round(a.page_faults.per_run, 1), "fault_us": a.page_faults.fault_us,
            "ms": None if a.page_faults.ms is None else round(a.page_faults.ms, 4)},
        # the reference kernel around the profile against its readings before the benchmarks:
        # pairs taken at two speeds of a shared host disagree by that much before any kernel does
        "machine_speed": None if a.speed is None else {
            "core_ratio": round(a.speed.core_ratio, 3), "memory_ratio": round(a.speed.memory_ratio, 3)},
        "q3": {"judged": sum(1 for c in kernels if c.comparable),
               "slower_than_fastest": len(a.framework.suboptimal) if a.framework else 0,
               "gain_ms": round(a.framework.kernel_gain_ms, 4) if a.framework else 0.0},
    }


def _ms(x: float) -> str:
    return f"{x:.1f}" if x >= 10 else f"{x:.3g}"


def _reading(f: dict) -> str:
    """A fidelity reading in one cell: the ops it compares, the share within ±10 % (and of their
    time in the model), the median."""
    return f"{f['ops']}: –" if f["within_10pct"] is None else \
        f"{f['ops']}: {100 * f['within_10pct']:.0f} % ({100 * f['within_10pct_of_time']:.0f} % of the time), " \
        f"{f['median_ratio']:.2f}"


def _speed(s: dict | None) -> str:
    return "–" if s is None else f"{s['core_ratio']:.2f}, {s['memory_ratio']:.2f}"


# the isolated readings besides the warm one
COLD_STATES = tuple(state for state in CACHE_STATES if state != "warm")


def cold_suffix(state: str) -> str:
    """A cold state's suffix of the row's keys: ``_cold``, ``_cold_weights``."""
    return "_" + state.replace("-", "_")


def markdown(rows: list[dict], bound: str, readings: tuple[tuple[str, str], ...] = ()) -> str:
    """The rows as docs/backends.md's tables: ``bound`` names the bound's column; each of
    ``readings`` (a row's key, its column's name) adds a column of another fidelity reading."""
    head = ["model", "threads", "variants ok", "measured ms", f"{bound} bound ms", "BR", "ops compared",
            "within ±10 %", "median isolated/in-model", *(name for _, name in readings),
            "machine speed profile/benchmarks (core, memory)", "Q3 slower than fastest"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        f, q = r["fidelity"], r["q3"]
        within = "–" if f["within_10pct"] is None else f"{100 * f['within_10pct']:.0f} %" + (
            f" ({100 * f['within_10pct_or_step']:.0f} % or a clock step)" if "within_10pct_or_step" in f else "") + (
            f"; {100 * f['within_10pct_of_time']:.0f} % of the time")
        gain = f" ({_ms(q['gain_ms'])} ms to gain)" if q["slower_than_fastest"] else ""
        cells = [r["model"], r["threads"], f"{r['ok']}/{r['variants']}", _ms(r["measured_ms"]),
                 _ms(r["bound_ms"]), f"{r['br_sequential']:.2f}", f["ops"], within,
                 "–" if f["median_ratio"] is None else f"{f['median_ratio']:.2f}",
                 *(_reading(r[key]) for key, _ in readings), _speed(r.get("machine_speed")),
                 f"{q['slower_than_fastest']} of {q['judged']}{gain}"]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)
