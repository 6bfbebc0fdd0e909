"""Analyses over the performance database: one model × systems × batch sizes (Figs 8–20).

A driver over the stages, not one of them: it reads the database, runs the pure analyzer and,
with ``generate_missing``, fills what the database lacks through the generator and the runner
(the library's own calls, never the command line). ``analyze`` itself stays pure.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from .analysis.across_stack import across_stack
from .analysis.phases import Phase, PhaseInputs, graph_inputs, phase_analysis, phase_shapes
from .analyzer import MATH_EXACT, Analysis, analyze, contended_figures
from .errors import BenanzaError, UsageError
from .fusion import match_fusions
from .generator import BACKEND_MODULES, GenOptions, generate, get_backend
from .layers import Model, unique_layers
from .manifest import build_manifest, write_manifest
from .model_cache import load_model_cached
from .outputs import write_text
from .parsers import ExecutionProfile
from .parsers.bundle import check_model
from .problems import layer_key
from .records import Result, System
from .shapes_by_execution import load_input_data, shape_notes, uncosted_notes

if TYPE_CHECKING:
    from .runner import RunSummary

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SweepRequest:
    model: str
    systems: tuple[str, ...]
    batch_sizes: tuple[int, ...] = (1,)
    dtype: str = "f32"
    input_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    input_values: tuple[tuple[str, tuple[float, ...]], ...] = ()  # --input-value, for shapes by execution
    input_data: str | None = None  # --input-data FILE.npz, likewise
    measured_ms: float | None = None
    generate_missing: bool = False
    backend: str | None = None  # default: the backend of the system's most recently used stack
    stack: str | None = None  # a stack id (or prefix); default: the newest of the backend
    math: str = MATH_EXACT
    phase: PhaseInputs | None = None  # the LLM phase these input shapes are (run_phases sets them)


def _profile_for(profile: ExecutionProfile | None, batch: int, single: bool) -> ExecutionProfile | None:
    """A profile counts for the configuration of its batch size (or the only configuration)."""
    if profile is None:
        return None
    if profile.batch_size in (None, batch) or single:
        return profile
    return None


def run_sweep(req: SweepRequest, db, profile: ExecutionProfile | None = None) -> list[Analysis]:
    """``db`` is a ``benanza.perfdb.PerfDB``."""
    from .perfdb import full_sampling_flags, missing_command, remeasure_flags

    if profile is not None:
        check_model(profile, req.model)
    single = len(req.systems) * len(req.batch_sizes) == 1
    out = []
    data = load_input_data(req.input_data) if req.input_data else {}
    for batch in req.batch_sizes:
        model = load_model_cached(req.model, batch_size=batch, input_shapes=dict(req.input_shapes),
                                  input_values=dict(req.input_values), input_data=data)
        # with the layers fused forms are benchmarked as where no node is (an attention through
        # repeat_kv or with Q's heads folded): without them Q5 finds no fused result to apply
        layers = [n.layer for n in model.nodes] + [m.conv for m in match_fusions(model)]
        keys = sorted({layer_key(la.problem, la.in_dtype(d))
                       for la in layers for d in ("f32", "f16", "bf16", req.dtype)})
        for name in req.systems:
            prof = _profile_for(profile, batch, single)
            system = resolve_system(db, name, req.backend or native_backend(db, name, prof), req.stack)
            measured = req.measured_ms if single else None
            results = db.results(system, keys)
            a = analyze(model, results, name, system.backend, req.dtype, prof, measured,
                        stack=system, math=req.math, peaks=db.peaks(system), one_thread=_one_thread(db, system, keys))
            dtypes = get_backend(system.backend).dtypes
            if a.missing and req.dtype not in dtypes:
                a.warnings.append(f"the {system.backend} backend benchmarks {', '.join(dtypes)}, not {req.dtype}: "
                                  f"no command can fill this bound on system {name!r}")
            elif a.missing:
                cmd = missing_command([req.model], name, system.backend, batch_size=batch, db=str(db.path),
                                      dtype=req.dtype, input_shapes=req.input_shapes, input_values=req.input_values,
                                      input_data=req.input_data)
                if req.generate_missing:
                    log.info("filling %d missing benchmarks: %s", len(a.missing), cmd)
                    measure_missing([model], "out/bench", name, system.backend, db.path,
                                    GenOptions(dtypes=(req.dtype,)), cmd)
                    # the run stores under the stack this machine has now
                    system = resolve_system(db, name, system.backend, req.stack)
                    results = db.results(system, keys)
                    a = analyze(model, results, name, system.backend, req.dtype, prof, measured,
                                stack=system, math=req.math, peaks=db.peaks(system),
                                one_thread=_one_thread(db, system, keys))
                if a.missing:
                    a.warnings.append(f"to fill the missing benchmarks run: {cmd}")
            if a.contended or contended_figures(a):
                a.remeasure_command = missing_command(
                    [req.model], name, system.backend, batch_size=batch, db=str(db.path),
                    input_shapes=req.input_shapes, input_values=req.input_values, input_data=req.input_data,
                    run_flags=remeasure_flags(system.threads))
                a.warnings.append(f"to re-measure the contended results when the machine is idle: "
                                  f"{a.remeasure_command}")
            if screened := a.screened:
                by_name = {r.variant.name: r for r in results}
                a.screened_command = missing_command(
                    [req.model], name, system.backend, batch_size=batch, db=str(db.path), dtype=req.dtype,
                    input_shapes=req.input_shapes, input_values=req.input_values, input_data=req.input_data,
                    run_flags=full_sampling_flags([by_name[n] for n in screened], system.threads))
                a.warnings.append(f"Q3 compares {len(screened)} screened estimates (results racing stopped early, "
                                  f"at a coarse precision, because they cannot be their layer's best), not full "
                                  f"measurements: the layers they decide are not judged. To measure them in full: "
                                  f"{a.screened_command}")
            others = [s for s, _, _ in db.stacks(name) if s.backend == system.backend and s != system]
            if others:
                a.notes.append(f"system {name!r} has {len(others)} other {system.backend} stack(s) "
                               f"({', '.join(s.stack_id for s in others)}); this analysis uses only stack "
                               f"{system.stack_id} (choose another with --stack)")
            _split_across_stack(a, model, db, name, keys, req)
            if req.phase is not None:
                a.phase = phase_analysis(req.phase, a, model)
            a.notes.extend(shape_notes(model))
            a.warnings.extend(uncosted_notes(model))  # missing from the bound
            out.append(a)
    return out


def phase_plan(req: SweepRequest, phases: Sequence[Phase]) -> list[PhaseInputs]:
    """Each phase's input shapes (analysis.phases) at each batch size, batch sizes outer, over
    those of ``req`` (an input it names keeps the shape given); raises, before any database is
    read, where the model cannot have the phase."""
    from .processor import read_onnx

    if len(phases) > 1 and req.measured_ms is not None:
        raise UsageError("--measured-ms applies to one phase: a measured latency is of one input shape")
    inputs = graph_inputs(read_onnx(req.model).graph)
    return [phase_shapes(req.model, inputs, phase, batch, dict(req.input_shapes))
            for batch in req.batch_sizes for phase in phases]


def run_phases(req: SweepRequest, db, plan: Sequence[PhaseInputs],
               profile: ExecutionProfile | None = None) -> list[Analysis]:
    """``run_sweep`` at each phase of ``plan`` (``phase_plan``'s order): its batch size, its shapes."""
    if len({p.phase for p in plan}) > 1 and profile is not None:
        raise UsageError("--profile applies to one phase: a profile is of one input shape")
    return [a for p in plan for a in run_sweep(replace(req, batch_sizes=(p.batch_size,), input_shapes=p.shapes,
                                                       phase=p), db, profile)]


def _split_across_stack(a: Analysis, model: Model, db, name: str, keys: list[str], req: SweepRequest) -> None:
    """For an analysis against a framework's own backend: the split against the vendor library's
    bound, when the database holds that library's results for the same system."""
    vendor_backend = get_backend(a.backend).vendor
    vendor = db.system(name, vendor_backend) if vendor_backend is not None else None
    if vendor is None or a.stack is None:
        return
    v = analyze(model, db.results(vendor, keys), name, vendor.backend, req.dtype, None, None, stack=vendor,
                math=req.math, peaks=db.peaks(vendor))
    if v.contended:
        a.warnings.append(f"across the stack: the {vendor.backend} bound rests on {len(v.contended)} results measured "
                          f"while other processes took the CPU (`benanza run --system {name} --backend "
                          f"{vendor.backend} --remeasure-contended` with its bench dir re-measures them)")
    a.across_stack = across_stack(a, v)
    ours, theirs = a.stack.threads, vendor.threads
    if ours != theirs:
        a.warnings.append(f"across the stack: the {a.backend} results ran on {ours} threads, the {vendor.backend} "
                          f"ones (stack {vendor.stack_id}) on {theirs}: the kernel headroom compares unequal threads")
    if v.missing:
        a.warnings.append(f"across the stack: {len(v.missing)} layers have no {vendor.backend} result: its bound, "
                          f"and the kernel headroom, leave them out")


def native_backend(db, name: str, profile: ExecutionProfile | None) -> str | None:
    """Against a framework's profile, the framework's own backend when the database holds its
    results under ``name``: the bound is then one its kernels can reach, and Q3 judges them."""
    trace = profile.trace if profile is not None else None
    framework = (profile.framework or trace.framework) if profile is not None and trace is not None else ""
    if framework in BACKEND_MODULES and db.system(name, framework) is not None:
        return framework
    return None


def _one_thread(db, system: System, keys: list[str]) -> list[Result] | None:
    """The results of ``system``'s stack at one thread (the work floor's single-thread times):
    those of the stack stored under the same name whose components differ in threads only."""
    want = dict(system.stack, threads="1")
    if "threads" not in dict(system.stack) or want == dict(system.stack):
        return None
    for other, _, _ in db.stacks(system.name):
        if other.backend == system.backend and other.device == system.device and dict(other.stack) == want:
            return db.results(other, keys)
    return None


def resolve_system(db, name: str, backend: str | None, stack: str | None) -> System:
    """The one system+stack an analysis reads: ``stack`` when given, else the newest stack of
    ``backend`` (else of the name's most recently used backend) stored under ``name``."""
    system = db.system(name, backend, stack)
    if system is not None:
        return system
    stored = db.stacks(name)
    if not stored:
        known = ", ".join(sorted({s.name for s in db.systems()})) or "none"
        raise BenanzaError(f"system {name!r} is not in the performance database (known: {known}); "
                           f"run `benanza run --system {name}` first")
    have = ", ".join(f"{s.stack_id} ({s.backend}, last used {last})" for s, _, last in stored)
    want = " and ".join(x for x in (f"backend {backend}" if backend else "", f"stack {stack}" if stack else "") if x)
    raise BenanzaError(f"system {name!r} has no {want} in the performance database; its stacks: {have}")


def measure_missing(models: Sequence[Model], bench_dir: str | Path, system_name: str, backend: str,
                    db_path: str | Path, options: GenOptions, command: str) -> RunSummary:
    """Generate ``models``' benchmarks into ``bench_dir`` and run what the database lacks: what
    ``command`` (the line printed for the user, stored beside each result) does."""
    from . import runner  # only a fill builds and runs: analyses need not load it

    manifest = build_manifest(list(models), unique_layers(list(models)))
    write_manifest(manifest, bench_dir)
    generate(manifest, backend, bench_dir, options, models)
    return runner.run(bench_dir, system_name, backend, db_path, runner.RunOptions(command=command))


def write_report(path: str | Path, html: str) -> Path:
    return write_text(path, html)


__all__: Sequence[str] = ("SweepRequest", "measure_missing", "resolve_system", "phase_plan", "run_phases",
                          "run_sweep",
                          "write_report")
