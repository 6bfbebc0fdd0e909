"""The Benanza analyzer (paper §III-D): lower bounds and Q1–Q6 for one model on one system.

``analyze`` is a pure function of the processed model, the system's database results and,
optionally, a model execution profile; the CLI and reports only present its ``Analysis``.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from .analysis.across_stack import AcrossStack
from .analysis.bounds import (
    Bounds,
    LayerRow,
    LayerStatus,
    LayerTable,
    ParallelModule,
    bounds_from_weights,
    contended_variants,
    fused_weights,
    index_results,
    parallel_modules,
)
from .analysis.floors import COMPUTE, MEMORY, Floors, resource_floors
from .analysis.matching import CallAlignment, OpGroup, TraceMatch, align_calls, match_trace
from .analysis.modules import MeasuredGroup, ModuleStats, layer_paths, module_tree
from .analysis.phases import PhaseAnalysis
from .analysis.questions import (
    AlgoChoice,
    BetweenCalls,
    HeuristicChoice,
    IdleGap,
    LayerOverhead,
    algorithm_choices,
    between_library_calls,
    heuristic_choices,
    kernel_gaps,
    layer_overheads,
    native_kernel_choices,
    tensor_core_kernels,
)
from .analysis.roofline import IMPOSSIBLE_BELOW, ImpossibleResult, SpeedOfLight, screen, speed_of_light
from .fusion import FusionMatch
from .layers import Model
from .machine_speed import MachineSpeed, RunSpeed, SpeedCompared, typical
from .ort_fusions import all_fusions, benchmarked_by
from .parsers import ExecutionProfile
from .peaks import GEMM_TYPES, Peaks
from .records import Result, System, Variant
from .scopes import OP_TYPES

log = logging.getLogger(__name__)


# Math modes a bound may assume. Exact: f32 layers use f32 FMA math (no TF32); reduced
# precisions use their own math, Tensor Cores included. tf32: f32 layers may also use TF32.
MATH_EXACT, MATH_TF32 = "exact", "tf32"
MATHS = (MATH_EXACT, MATH_TF32)


def admits_math(variant: Variant, math: str) -> bool:
    """Whether a bound under ``math`` may use the variant: TF32 rounds f32 inputs to 10 bits of
    mantissa, so an f32 bound that used it would not be an f32 bound."""
    from .backends.cudnn import TF32_MATH  # the backend names its math modes

    return not (variant.dtype == "f32" and variant.math == TF32_MATH and math != MATH_TF32)


@dataclass(frozen=True)
class FusionUse:
    pattern: str
    nodes: tuple[int, ...]
    unfused_ms: float
    fused_ms: float
    variant: str


@dataclass
class FusionAnalysis:
    """Q5: the bound with every matched pattern that pays off run as one fused call."""

    matches: int  # patterns found in the model
    applied: list[FusionUse]  # those with a fused benchmark result faster than the unfused layers
    bounds: Bounds
    # fused benchmarks no faster than their unfused layers: not applied in ``bounds``
    unprofitable: list[FusionUse] = field(default_factory=list)

    @property
    def layers_fused(self) -> int:
        return sum(len(u.nodes) for u in self.applied)


@dataclass
class FrameworkView:
    """What the framework did, from its own trace: fusions, insertions, time per layer (Q4)."""

    framework: str
    match: TraceMatch
    bounds_same_fusions: Bounds  # the bound with exactly the fusions the framework made
    fusions_applied: list[FusionUse]
    overheads: list[LayerOverhead]
    explanations: list[str]
    # Q3 against the framework's own backend (the analysis reads its results): per op, the
    # kernel it ran vs the fastest variant of the same computation
    kernels: list[AlgoChoice] = field(default_factory=list)

    @property
    def suboptimal(self) -> list[AlgoChoice]:
        return [c for c in self.kernels if c.suboptimal]

    @property
    def screened(self) -> list[AlgoChoice]:
        """Ops compared with a screening estimate: not judged until it is measured in full."""
        return [c for c in self.kernels if c.screened]

    @property
    def kernel_gain_ms(self) -> float:
        return sum(c.gain_ms or 0.0 for c in self.suboptimal)

    @property
    def inserted_ms(self) -> float:
        return sum(g.time_ms for g in self.match.inserted)

    @property
    def kernel_share(self) -> float | None:
        """Share of run time spent inside ops (the TF-eager study's kernel-time metric)."""
        return self.match.op_ms / self.match.run_ms if self.match.run_ms else None


@dataclass
class LibraryView:
    """The library calls the framework made (from cuDNN/cuBLAS/oneDNN logs) vs the expected ones."""

    library: str
    calls: int
    alignment: CallAlignment
    algorithms: list[AlgoChoice]
    framework_version: str = ""  # the library version the log names ("" when it names none)
    benchmark_version: str = ""  # the version in the analysed stack
    framework_threads: int | None = None  # the threads the log says the library used
    benchmark_threads: int | None = None  # the threads of the analysed stack

    @property
    def threads_differ(self) -> bool:
        return bool(self.framework_threads and self.benchmark_threads
                    and self.framework_threads != self.benchmark_threads)

    @property
    def not_comparable(self) -> list[AlgoChoice]:
        """Calls no benchmark computes (a fusion or layout without a benchmark): never judged."""
        return [a for a in self.algorithms if not a.comparable]

    @property
    def above_framework(self) -> list[AlgoChoice]:
        return [a for a in self.algorithms if a.above_framework]

    @property
    def versions_differ(self) -> bool:
        return bool(self.framework_version and self.benchmark_version
                    and self.framework_version != self.benchmark_version)

    @property
    def suboptimal(self) -> list[AlgoChoice]:
        return [a for a in self.algorithms if a.suboptimal]

    @property
    def screened(self) -> list[AlgoChoice]:
        """Layers compared with a screening estimate: not judged until it is measured in full."""
        return [a for a in self.algorithms if a.screened]

    @property
    def algorithm_gain_ms(self) -> float:
        return sum(a.gain_ms or 0.0 for a in self.suboptimal)


@dataclass(frozen=True)
class ThreadsCompared:
    """The framework's threads in the profile against the benchmarks' (the CPU stack's): a bound
    and a profile compare like with like only at equal threads."""

    profile: int
    benchmarks: int
    source: str  # where the profile's count comes from

    @property
    def differ(self) -> bool:
        return self.profile != self.benchmarks

    @property
    def label(self) -> str:
        return f"unequal threads: profile {self.profile}, benchmarks {self.benchmarks}"


@dataclass(frozen=True)
class FrameworkTf32:
    """The framework's f32 library calls whose logged math let the library use TF32 Tensor Cores
    (cuDNN 9's ``enable_tf32``, cuBLAS/cuBLASLt's ``…FAST_TF32`` compute types): an exact-f32
    bound does not bound a run of them."""

    calls: int  # f32 calls whose math allowed TF32
    of: int  # f32 calls in the profile's library logs
    by_library: tuple[tuple[str, str, int], ...]  # (library, math as logged, calls), sorted

    @property
    def label(self) -> str:
        return ", ".join(f"{library} {n} {math}" for library, math, n in self.by_library)


@dataclass(frozen=True)
class PageFaultCost:
    """The framework's page faults per run (its timed runs) and their estimated time: the count
    times one first-touch fault's cost, both measured in the profiled process."""

    per_run: float
    fault_us: float | None
    measured_ms: float | None  # the run's measured latency, what ``share`` is of

    @property
    def ms(self) -> float | None:
        return None if self.fault_us is None else self.per_run * self.fault_us / 1e3

    @property
    def share(self) -> float | None:
        return self.ms / self.measured_ms if self.ms is not None and self.measured_ms else None

    @property
    def notable(self) -> bool:
        """Worth advice: their estimated time is at least ``PAGE_FAULT_SHARE`` of the run."""
        return self.share is not None and self.share >= PAGE_FAULT_SHARE


# The share of a run its page faults must cost for the analysis to advise on them: below it, the
# count is shown without advice (a few faults per run are the OS's ordinary work)
PAGE_FAULT_SHARE = 0.02


@dataclass
class TensorCoreView:
    """Q6: Tensor Core kernels in the profile, and bounds per dtype/layout."""

    tc_kernels: int
    kernels: int
    examples: list[str]
    bounds: dict[str, Bounds]  # "f32", "f16", "f16/nhwc", ... → bounds (only those with results)
    # label → the contended results that bound chooses from (only labels with some)
    contended: dict[str, frozenset[str]] = field(default_factory=dict)


@dataclass
class HeuristicAnalysis:
    """Q3 from the database alone (paper Figs 10, 14): cuDNN's heuristic vs the ideal algorithm."""

    choices: list[HeuristicChoice]
    bounds: Bounds  # the bound with every conv at its heuristic's algorithm
    heuristic_ms: float  # conv layers' total at the heuristic's algorithms
    ideal_ms: float  # conv layers' total at the fastest algorithms
    unknown: int  # layers whose heuristic algorithm was never measured OK (counted at the best)

    @property
    def suboptimal(self) -> int:
        return sum(1 for c in self.choices if not c.heuristic_optimal)


@dataclass
class Analysis:
    model: str
    model_path: str
    system: str
    backend: str
    dtype: str
    batch_size: int
    rows: list[LayerRow]
    edges: list[tuple[int, int]]  # the layer DAG (node indices), for reports
    bounds: Bounds
    modules: list[ParallelModule]
    fusion: FusionAnalysis
    tensor_cores: TensorCoreView
    joint: Bounds | None  # parallel + best algorithm + fusion + best reduced-precision layout (Fig 20)
    joint_label: str
    measured_ms: float | None = None
    measured_source: str = ""
    framework: FrameworkView | None = None
    libraries: list[LibraryView] = field(default_factory=list)
    between_calls: list[BetweenCalls] = field(default_factory=list)
    kernel_gaps: list[IdleGap] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the profile says it could not capture
    # the split of the measured time against the vendor library's bound (analysis.across_stack);
    # set by the driver when the database holds both for the system
    across_stack: AcrossStack | None = None
    heuristic: HeuristicAnalysis | None = None
    # the profile's threads against the stack's, when both are known (a profile on a CPU stack)
    threads: ThreadsCompared | None = None
    # the profile's f32 library calls and those that allowed TF32 (None: the logs hold no f32 call)
    framework_tf32: FrameworkTf32 | None = None
    page_faults: PageFaultCost | None = None  # the profiled run's page faults, where it counted them
    # the machine's speed around the profiled run against the bound's benchmarks' (where both read it)
    speed: SpeedCompared | None = None
    stack: System | None = None  # the one system+stack every result comes from
    math: str = MATH_EXACT  # what the bound assumes about math modes (see admits_math)
    unstable: frozenset[str] = frozenset()  # variant names whose result stayed unstable
    # variant names timed without the framework's profiler (ORT's replicas clock: its per-op cost
    # is not in them); a framework backend's other results carry that cost
    untraced: frozenset[str] = frozenset()
    tree: ModuleStats | None = None  # the module tree (analysis/modules.py)
    module_source: str = ""  # where the tree's modules come from (benanza.scopes)
    layer_module: dict[int, str] = field(default_factory=dict)  # layer → its module's qualified name

    def at(self, index: int) -> str:
        """A layer's name for advice, with its module where the name does not carry it (the
        dynamo exporter's ``node_MatMul_3`` is ``layers.0.qkv``'s)."""
        name, module = self.rows[index].name, self.layer_module.get(index, "")
        return f"{name} in {module}" if module and module not in name.replace("/", ".") else name
    # the resource floors under the parallel bound (analysis/floors.py); ``bounds.parallel_ms`` is
    # the critical path raised to the highest of them
    floors: Floors | None = None
    # the roofline of the bound's layers from the stack's peaks (None: no peaks stored, or not trusted)
    speed_of_light: SpeedOfLight | None = None
    peaks_contended: float | None = None  # the share lost to other work of stored peaks not trusted
    # Variant names whose result stayed contended among those the bound in the analysed dtype
    # chooses from (its layers' candidates, unfused and fused): the bound and every figure
    # derived from it may rest on one (a contended variant not chosen may truly be the fastest),
    # so the CLI refuses to print them unless asked to label them (docs/measurement.md).
    contended: frozenset[str] = frozenset()
    # those the joint bound chooses from (every other dtype's, fused included): it is the lowest
    # of them, so any one may change it
    joint_contended: frozenset[str] = frozenset()
    remeasure_command: str = ""  # re-measures the contended results
    screened_command: str = ""  # measures in full the results Q3 compares that racing only screened
    phase: PhaseAnalysis | None = None  # the LLM phase (prefill/decode) whose input shapes were analysed

    @property
    def screened(self) -> list[str]:
        """The variants Q3 compares whose result racing stopped at its screening estimate."""
        choices = [c for v in self.libraries for c in v.algorithms] + (self.framework.kernels if self.framework else [])
        return sorted({n for c in choices for n in c.screened})

    @property
    def contended_rows(self) -> list[LayerRow]:
        """Layers of the bound chosen from results of which one was measured under contention."""
        return [r for r in self.rows if r.status == LayerStatus.OK and r.contended]

    @property
    def unstable_rows(self) -> list[LayerRow]:
        """Layers of the bound whose chosen result stayed unstable when measured."""
        return [r for r in self.rows if r.status == LayerStatus.OK and r.variant in self.unstable]

    @property
    def reference_rows(self) -> list[LayerRow]:
        """Layers of the bound whose best variant ran the library's reference code (oneDNN's
        ``ref:…`` implementations, alone or in a chain): no optimized kernel took them."""
        return [r for r in self.rows if r.status == LayerStatus.OK
                and any(part.strip().startswith("ref") for part in r.implementation.split(" + "))]

    @property
    def missing(self) -> list[LayerRow]:
        return [r for r in self.rows if r.status == LayerStatus.MISSING]

    @property
    def not_covered(self) -> list[LayerRow]:
        return [r for r in self.rows if r.status == LayerStatus.NOT_COVERED]

    @property
    def identity(self) -> list[LayerRow]:
        return [r for r in self.rows if r.status == LayerStatus.IDENTITY]

    @property
    def views(self) -> list[LayerRow]:
        return [r for r in self.rows if r.status == LayerStatus.VIEW]

    @property
    def folded(self) -> list[LayerRow]:
        return [r for r in self.rows if r.status == LayerStatus.FOLDED]

    @property
    def br_sequential(self) -> float | None:
        return self.bounds.ratio(self.measured_ms)[0]

    @property
    def br_parallel(self) -> float | None:
        return self.bounds.ratio(self.measured_ms)[1]


def _fusion_uses(applied: list[tuple[FusionMatch, Result]], weight: dict[int, float]) -> list[FusionUse]:
    return [FusionUse(m.pattern.name, m.nodes, sum(weight[i] for i in m.nodes), float(r.latency_ms),  # type: ignore[arg-type]
                      r.variant.name) for m, r in applied]


def analyze(model: Model, results: Iterable[Result], system: str, backend: str, dtype: str = "f32",
            profile: ExecutionProfile | None = None, measured_ms: float | None = None,
            stack: System | None = None, math: str = MATH_EXACT, peaks: Peaks | None = None,
            one_thread: Iterable[Result] | None = None) -> Analysis:
    """``one_thread``: the results of the same stack at one thread, for the work floor (a stack
    of one thread is its own)."""
    results = [r for r in results if r.variant.backend == backend and admits_math(r.variant, math)]
    impossible: list[ImpossibleResult] = []
    contended_peaks = peaks.contended if peaks is not None and not peaks.trusted else None
    if contended_peaks is not None:  # roofs too low to judge by: no speed of light rather than a wrong one
        peaks = None
    threads = stack.threads if backend in GEMM_TYPES and stack is not None else None
    single = None if one_thread is None else [r for r in one_thread
                                              if r.variant.backend == backend and admits_math(r.variant, math)]
    if peaks is not None:  # a result beyond its roofline is a defect: it never enters a bound
        results, impossible = screen(results, model, peaks)
        if single is not None:
            single, _ = screen(single, model, peaks)
    by_key = index_results(results)
    graph = model.dag()
    table = LayerTable(model, by_key, backend)
    rows = table.rows(dtype)
    weight = {r.index: r.latency_ms for r in rows}
    partial = any(r.status == LayerStatus.MISSING for r in rows)
    bounds = bounds_from_weights(graph, weight, partial)
    absent = (f"the stack's peaks were measured while other processes took {contended_peaks:.0%} of their time"
              if contended_peaks is not None else "no peaks are stored for this stack")
    floors = resource_floors(model, rows, dtype, bounds.parallel_ms, peaks, absent, threads,
                             results if threads == 1 else single)
    bounds = replace(bounds, parallel_ms=floors.parallel_ms)
    on_path = set(bounds.critical_path)
    rows = [replace(r, critical=r.index in on_path) for r in rows]

    # the library patterns' matches, and the framework's own fusions where the backend benchmarks them
    fusions = [m for m in all_fusions(model) if benchmarked_by(m.pattern.name, backend)]
    matches = _q5_fusions(fusions)
    fweight, applied, slower = profitable_fusions(rows, matches, by_key, dtype)
    fusion = FusionAnalysis(len(matches), _fusion_uses(applied, weight),
                            bounds_from_weights(graph, fweight, partial), _fusion_uses(slower, weight))

    tc_bounds: dict[str, Bounds] = {}
    tc_contended: dict[str, frozenset[str]] = {}
    joint_contended: set[str] = set()
    for dt, layouts, label in (("f32", (), "f32"), ("f16", (), "f16"), ("f16", ("nchw",), "f16/nchw"),
                               ("f16", ("nhwc",), "f16/nhwc"), ("bf16", (), "bf16")):
        r = table.rows(dt, layouts)
        if any(x.status == LayerStatus.OK for x in r):
            tc_bounds[label] = bounds_from_weights(graph, {x.index: x.latency_ms for x in r},
                                                   any(x.status == LayerStatus.MISSING for x in r))
            if contended := contended_variants(model, r, by_key, dt, layouts):
                tc_contended[label] = contended
            if dt != dtype:
                joint_contended |= contended_variants(model, r, by_key, dt, layouts, matches)
    tc, total, names = tensor_core_kernels(profile)
    joint, joint_label = _joint(table, graph, by_key, dtype, matches, tc_bounds)

    analysis = Analysis(model.name, model.path, system, backend, dtype, model.batch_size, rows,
                        list(model.edges), bounds,
                        parallel_modules(graph, weight), fusion,
                        TensorCoreView(tc, total, names, tc_bounds, tc_contended),
                        joint, joint_label, stack=stack, math=math,
                        unstable=frozenset(r.variant.name for r in results if r.unstable),
                        untraced=frozenset(r.variant.name for r in results if r.untraced),
                        contended=contended_variants(model, rows, by_key, dtype, matches=matches),
                        joint_contended=frozenset(joint_contended) if joint is not None else frozenset(),
                        floors=floors)
    if model.scope_source != OP_TYPES:  # an op-type "module" says nothing the layer's type does not
        analysis.layer_module = {i: p[-1] for i, p in layer_paths(model)[0].items() if p}
    analysis.heuristic = _heuristic(model, graph, by_key, dtype, weight, partial)
    if peaks is not None:
        sol = speed_of_light(model, rows, graph, dtype, peaks, impossible)
        # the roofline's critical path has the same shared resources under it as the bound's
        shared = [f.ms for f in floors.floors if f.name in (MEMORY, COMPUTE)]
        analysis.speed_of_light = replace(sol, parallel_ms=max([sol.parallel_ms, *shared]))
    analysis.peaks_contended = contended_peaks
    if measured_ms is not None:
        analysis.measured_ms, analysis.measured_source = measured_ms, "--measured-ms"
    elif profile is not None and profile.measured_ms is not None:
        analysis.measured_ms = profile.measured_ms
        analysis.measured_source = f"{profile.framework or 'profile'} trimmed mean"
    if profile is not None:
        _profile_views(analysis, model, profile, by_key, weight, fusions, graph)
        _compare_speed(analysis, profile, results)
    groups = None if analysis.framework is None else [MeasuredGroup(g.nodes, g.time_ms)
                                                      for g in analysis.framework.match.groups]
    analysis.tree, analysis.module_source = module_tree(model, rows, graph, groups), model.scope_source
    _warn(analysis)
    _explain_bound(analysis)
    return analysis


def _q5_fusions(fusions: list[FusionMatch]) -> list[FusionMatch]:
    """The fusions of Q5, none sharing a node: a framework's own fusions in place of the library
    matches they share nodes with (what the framework itself runs there: ORT's Gemm of a MatMul
    and its bias, not ``mm_bias_relu``)."""
    taken = {i for m in fusions if m.pattern.framework for i in m.nodes}
    return [m for m in fusions if m.pattern.framework or not taken & set(m.nodes)]


def _heuristic(model: Model, graph, by_key, dtype: str, weight: dict[int, float],
               partial: bool) -> HeuristicAnalysis | None:
    from .backends.cudnn import CONV_ALGOS, DECONV_ALGOS  # the counters index cuDNN's algorithm enums

    view = heuristic_choices(model, by_key, dtype, weight, {"conv": CONV_ALGOS, "deconv": DECONV_ALGOS})
    if view is None:
        return None
    return HeuristicAnalysis(view.choices, bounds_from_weights(graph, view.weights, partial),
                             view.heuristic_ms, view.ideal_ms, view.unknown)


def _joint(table: LayerTable, graph, by_key, dtype, matches, tc_bounds) -> tuple[Bounds | None, str]:
    """Fig 20: parallel execution + best algorithms + fusion + the fastest reduced-precision setup."""
    candidates = [(lbl, b) for lbl, b in tc_bounds.items() if lbl.split("/")[0] != dtype]
    if not candidates:
        return None, ""
    label, _ = min(candidates, key=lambda kv: kv[1].parallel_ms)
    dt, _, layout = label.partition("/")
    rows = table.rows(dt, (layout,) if layout else ())
    weight, _, _ = profitable_fusions(rows, matches, by_key, dt, (layout,) if layout else ())
    partial = any(r.status == LayerStatus.MISSING for r in rows)
    return bounds_from_weights(graph, weight, partial), f"parallel + best algorithm + fusion + {label}"


def profitable_fusions(rows: list[LayerRow], matches: list[FusionMatch], by_key, dtype: str,
                       layouts: tuple[str, ...] = ()):
    """``fused_weights`` without the fusions whose fused benchmark is no faster than the unfused
    layers it replaces (Q5 lists those as unprofitable); (weights, applied, unprofitable)."""
    # a view, an identity or a folded node inside a pattern (repeat_kv's Reshapes, a fold of Q's
    # heads) costs 0 by definition: the pattern is as comparable as its measured layers
    known = (LayerStatus.OK, LayerStatus.VIEW, LayerStatus.IDENTITY, LayerStatus.FOLDED)
    ok = {r.index for r in rows if r.status in known}
    unfused = {r.index: r.latency_ms for r in rows}
    _, candidates = fused_weights(rows, matches, by_key, dtype, layouts)
    # only comparable when every layer of the pattern has its own latency
    slower = [(m, r) for m, r in candidates if set(m.nodes) <= ok
              and float(r.latency_ms) >= sum(unfused[i] for i in m.nodes)]  # type: ignore[arg-type]
    dropped = {id(m) for m, _ in slower}
    weight, applied = fused_weights(rows, [m for m in matches if id(m) not in dropped], by_key, dtype, layouts)
    return weight, applied, slower


def _profile_views(a: Analysis, model: Model, profile: ExecutionProfile, by_key, weight, matches, graph) -> None:
    if profile.batch_size and profile.batch_size != model.batch_size:
        a.warnings.append(f"the profile ran batch size {profile.batch_size}, the analysis uses "
                          f"{model.batch_size}: ratios compare different work")
    a.notes = list(profile.notes)
    a.warnings.extend(profile.warnings)
    _compare_threads(a, profile)
    if profile.page_faults is not None:
        a.page_faults = PageFaultCost(profile.page_faults.per_run, profile.page_faults.fault_us, profile.measured_ms)
    if profile.trace is not None and profile.trace.ops:
        view = _framework_view(a, model, profile, by_key, weight, matches, graph)
        if any(g.nodes for g in view.match.groups):
            a.framework = view
            unmapped = view.match.unmapped
            if unmapped:
                a.warnings.append(
                    f"{view.framework} ran {len(unmapped)} ops the model does not have that this analysis cannot "
                    f"map back to the layers they replace (" + ", ".join(f"{g.name} ({g.op})" for g in unmapped[:6])
                    + (", …" if len(unmapped) > 6 else "") + f"; {sum(g.time_ms for g in unmapped):.4g} ms per "
                    f"run): the layers they run count 0 in the bound with its fusions, which is then no floor")
        else:  # e.g. a PyTorch trace: aten:: op names carry no ONNX node names to match on
            a.notes.append(f"the {view.framework} trace's ops could not be matched to the model's layers "
                           f"by name; the per-layer framework view is omitted")
    for library, calls in sorted(profile.library_calls.items()):
        if not calls:
            continue  # an empty log: the profile's notes say why
        alignment = align_calls(model, calls, a.backend, library)
        stack = dict(a.stack.stack) if a.stack is not None else {}
        lib = LibraryView(library, len(calls), alignment, [], profile.library_versions.get(library, ""),
                          stack.get(library, ""), profile.library_threads.get(library),
                          a.stack.threads if a.stack is not None else None)
        if lib.threads_differ and a.threads is None:  # else said once, for the whole profile
            a.warnings.append(f"{_threads_said(lib)}: the bound and the framework's times compare different "
                              f"thread counts (benchmark with `benanza run --threads {lib.framework_threads}` "
                              f"to compare them at equal threads)")
        if lib.versions_differ:
            a.notes.append(f"the framework's {library} is {lib.framework_version}, the benchmarks' "
                           f"{lib.benchmark_version}: implementation names do not compare across versions, so Q3 "
                           f"judges no algorithm choice and shows the framework's own per-call time from its log "
                           f"next to the best benchmark. Benchmark with {library} {lib.framework_version} (where a "
                           f"registry has it) to compare them")
        if library in ("cudnn", "onednn"):
            bound = {r.index: r.latency_ms for r in a.rows if r.status == LayerStatus.OK}
            lib.algorithms = [replace(c, explanation="; ".join(_call_reasons(a, lib, c))) if c.above_framework else c
                              for c in algorithm_choices(model, alignment, by_key, a.dtype,
                                                         not lib.versions_differ, bound)]
            _warn_calls(a, lib)
        a.libraries.append(lib)
    _compare_math(a, profile)
    if profile.nsys is not None:
        a.between_calls = between_library_calls(profile.nsys)
    kernels_from = profile.nsys if profile.nsys is not None and profile.nsys.kernels else profile.trace
    if kernels_from is not None and kernels_from.kernels:
        a.kernel_gaps = kernel_gaps(kernels_from)


def _compare_threads(a: Analysis, profile: ExecutionProfile) -> None:
    """The profile's threads against the benchmarks': unequal ones get one warning, and the
    ratio and Q3 say so wherever they are shown."""
    benchmarks = a.stack.threads if a.stack is not None else None
    counted, source = profile.threads, "the profile's record"
    if counted is None and "onednn" in profile.library_threads:
        counted, source = profile.library_threads["onednn"], "oneDNN's log (nthr)"
    if benchmarks is None or counted is None:
        return
    a.threads = ThreadsCompared(counted, benchmarks, source)
    if a.threads.differ:
        a.warnings.append(
            f"unequal threads: the profile ran {counted} threads ({source}), the benchmarks "
            f"{benchmarks} (stack {a.stack.stack_id if a.stack else '?'}): the Benanza ratio and Q3 compare a "
            f"framework and a bound at different thread counts; compare them at equal threads with "
            f"`benanza profile --threads {benchmarks}` or `benanza run --threads {counted}`")


def _compare_speed(a: Analysis, profile: ExecutionProfile, results: list[Result]) -> None:
    """The reference kernel around the profiled run against its readings before the bound's
    results were measured: a difference gets one warning (the host slowed one side unseen)."""
    if profile.speed is None:
        return
    chosen = {r.variant for r in a.rows if r.status == LayerStatus.OK}
    readings = [s for r in results if r.variant.name in chosen
                if (s := MachineSpeed.from_metrics(r.metrics)) is not None]
    benchmarks = typical(readings)
    if benchmarks is None:
        a.notes.append("the bound's results carry no reading of the machine's speed (measured by an earlier "
                       "version): whether the machine ran the profile and the benchmarks at one speed is unknown")
        return
    a.speed = SpeedCompared(profile.speed.typical, benchmarks, len(readings))
    # a quiet profile here once read 1.86 before and 0.97 after, at its usual latency
    changed = "" if profile.speed.steady else f"; {_changed_speed(profile.speed, benchmarks)}"
    if a.speed.differ and a.threads is not None and a.threads.differ:
        # each side reads the CPUs its own threads need (one thread: where the scheduler puts it;
        # more: the slowest CPU of those it may use), so unequal threads read unequal things: a
        # two-thread profile read 1.07-1.16x (core) one-thread readings on a quiet machine here
        a.notes.append(f"the profile's reading of the machine's speed ({a.speed.core_ratio:.2f}× core, "
                       f"{a.speed.memory_ratio:.2f}× memory) is not judged: it was read for "
                       f"{a.threads.profile} threads, the benchmarks' for {a.threads.benchmarks}{changed}")
    elif a.speed.differ:
        a.warnings.append(
            f"the machine ran at another speed in the profile than in the benchmarks: a fixed reference kernel "
            f"took {a.speed.core_ratio:.2f}× (core) and {a.speed.memory_ratio:.2f}× (memory) its time before the "
            f"bound's benchmarks ({len(readings)} results' readings), a difference steal time and the scheduler "
            f"do not show (a shared host slows its guests unseen): the Benanza ratio compares a run and a bound "
            f"at two speeds; profile again, or re-measure with `benanza run --force`, when the machine is steadier"
            f"{changed}")
    elif changed:
        a.notes.append(f"the profile's reading of the machine's speed matches the benchmarks' on average{changed}: "
                       f"the Benanza ratio may compare a run partly at another speed than its bound")


def _span(ratios: tuple[float, ...]) -> str:
    lo, hi = f"{min(ratios):.2f}", f"{max(ratios):.2f}"
    return lo if lo == hi else f"{lo}–{hi}"


def _changed_speed(speed: RunSpeed, benchmarks: MachineSpeed) -> str:
    """Each reading of a profile whose machine changed speed during its runs, as ratios to the
    benchmarks' readings."""
    def ratios(r: MachineSpeed) -> tuple[float, float]:
        return r.core_ms / benchmarks.core_ms, r.memory_ms / benchmarks.memory_ms

    (bc, bm), (ac, am) = ratios(speed.before), ratios(speed.after)
    between = ""
    if speed.during:
        core, memory = zip(*(ratios(r) for r in speed.during), strict=True)
        where = "the reading" if len(speed.during) == 1 else f"the {len(speed.during)} readings"
        between = f", {_span(core)}× and {_span(memory)}× in {where} between its runs"
    return (f"the machine changed speed during the profiled run: {bc:.2f}× (core) and {bm:.2f}× (memory) "
            f"the benchmarks' time before it{between}, {ac:.2f}× and {am:.2f}× after it")


def _compare_math(a: Analysis, profile: ExecutionProfile) -> None:
    """The framework's f32 library calls that allowed TF32: against an exact-f32 bound, one warning."""
    f32 = [c for calls in profile.library_calls.values() for c in calls if c.dtype == "f32"]
    if not f32:
        return
    # the math as logged names TF32 (the cuDNN parser's tf32_allowed, cuBLAS's CUBLAS_COMPUTE_32F_FAST_TF32,
    # cuBLASLt's COMPUTE_32F_FAST_TF32); a mode that allows TF32 on some versions and GPUs only (cuDNN 8's
    # CUDNN_DEFAULT_MATH) is not counted: a warning rests on what the log says
    tf32 = Counter((c.library, c.math) for c in f32 if "TF32" in c.math.upper())
    a.framework_tf32 = FrameworkTf32(sum(tf32.values()), len(f32),
                                     tuple((lib, math, n) for (lib, math), n in sorted(tf32.items())))
    t = _tf32_unbounded(a)
    if t is not None:
        a.warnings.append(
            f"the framework ran {t.calls} of its {t.of} f32 library calls with TF32 Tensor Core math allowed "
            f"({t.label}): the exact-f32 bound does not bound that run; `benanza analyze --math tf32` bounds it "
            f"where TF32 variants were measured (`benanza generate --math fma --math tf32_allowed`)")


def _tf32_unbounded(a: Analysis) -> FrameworkTf32 | None:
    """The framework's TF32 calls where the bound excludes TF32 (exact math, f32 data); else None."""
    t = a.framework_tf32
    return t if t is not None and t.calls and a.math == MATH_EXACT and a.dtype == "f32" else None


def _framework_view(a: Analysis, model: Model, profile: ExecutionProfile, by_key, weight, matches,
                    graph) -> FrameworkView:
    tm = match_trace(model, profile.trace)  # type: ignore[arg-type]
    done = _made_by(matches, tm.node_group())
    fw, applied = fused_weights(a.rows, done, by_key, a.dtype)
    for i in tm.eliminated:
        fw[i] = 0.0  # the framework never runs it (folded into a neighbour, or removed)
    same = bounds_from_weights(graph, fw, a.bounds.partial)
    overheads = layer_overheads(tm, fw, a.rows)
    view = FrameworkView(profile.framework or profile.trace.framework, tm, same,  # type: ignore[union-attr]
                         _fusion_uses(applied, weight), overheads, [])
    view.explanations = _explain(a, view)
    if view.framework == a.backend:  # the bound is the framework's own kernels: Q3 judges its choices
        bound = {r.index: r.latency_ms for r in a.rows if r.status == LayerStatus.OK}
        from .generator import get_backend

        native = get_backend(a.backend)
        view.kernels = native_kernel_choices(model, tm, matches, by_key, a.dtype, native.ran, bound,
                                             native.profiler_resolution_ms)
    return view


def _made_by(matches: list[FusionMatch], groups: dict[int, OpGroup]) -> list[FusionMatch]:
    """The matches whose nodes the framework ran inside one op, none sharing a node with another
    (library and framework patterns may share nodes): a match of exactly an op's nodes first,
    then the larger."""
    inside = [m for m in matches if groups.get(m.nodes[0]) is not None
              and len({id(groups.get(i)) for i in m.nodes}) == 1]
    inside.sort(key=lambda m: (set(m.nodes) != set(groups[m.nodes[0]].nodes), -len(m.nodes)))
    taken: set[int] = set()
    out = []
    for m in inside:
        if not taken & set(m.nodes):
            out.append(m)
            taken |= set(m.nodes)
    return out


def _explain(a: Analysis, v: FrameworkView) -> list[str]:
    """What the framework did differently from the model's layers (a bound above the measured
    latency is explained by ``_explain_bound``, with or without a framework view)."""
    out = []
    if v.match.fused:
        names = ", ".join(f"{g.name} ({'+'.join(model_ops(a, g.nodes))})" for g in v.match.fused[:4])
        out.append(f"{v.framework} fused {len(v.match.fused)} layer groups into single kernels ({names}"
                   f"{', …' if len(v.match.fused) > 4 else ''}); the bound with the same fusions is "
                   f"{v.bounds_same_fusions.sequential_ms:.4g} ms sequential")
    if v.match.eliminated:
        out.append(f"{len(v.match.eliminated)} layers never ran as separate ops in {v.framework} "
                   f"(folded or removed by its graph optimizer): "
                   + ", ".join(a.at(i) for i in v.match.eliminated[:6]))
    if v.match.inserted:
        kinds = sorted({g.op for g in v.match.inserted})
        out.append(f"{v.framework} inserted {len(v.match.inserted)} ops the model does not have "
                   f"({', '.join(kinds)}), {v.inserted_ms:.4g} ms per run: time the bound does not contain")
    return out


def model_ops(a: Analysis, nodes: tuple[int, ...]) -> list[str]:
    return [a.rows[i].op for i in nodes]


def _warn_speed_of_light(a: Analysis) -> None:
    sol = a.speed_of_light
    if a.peaks_contended is not None:
        a.warnings.append(f"the stack's peaks were measured while other processes took {a.peaks_contended:.0%} of "
                          f"their time: they are too low to judge by, so there is no speed-of-light bound and no "
                          f"result is checked against a roof; `benanza peaks --system {a.system}` on an idle machine "
                          f"replaces them")
        return
    if sol is None:
        how = (f"`benanza peaks --system {a.system}` measures them" if a.backend in GEMM_TYPES
               else f"this version measures no {a.backend} peaks")
        a.notes.append(f"no peaks stored for stack {a.stack.stack_id if a.stack else '?'}: no speed-of-light "
                       f"bound and no check for impossible results ({how})")
        return
    if sol.impossible:
        a.warnings.append(
            f"{len(sol.impossible)} results are faster than {IMPOSSIBLE_BELOW:.0%} of the floor the measured "
            f"peaks set for them (the machine allows no such kernel): a measurement defect such as an empty timed "
            f"region, flagged impossible and kept out of every bound; re-measure with `benanza run --force "
            f"--filter`: " + ", ".join(f"{f.variant} {f.latency_ms:.3g} ms < roof {f.floor_ms:.3g} ms"
                                       for f in sol.impossible[:3]) + (", …" if len(sol.impossible) > 3 else ""))
    if sol.no_compute_roof:
        a.notes.append(f"no compute peak (GEMM or FMA) in {', '.join(sol.no_compute_roof)} was measured on this "
                       f"stack: those layers' roofline is their memory roof only")


def _note_floors(a: Analysis) -> None:
    f = a.floors
    if f is None:
        return
    memory = next((x for x in f.floors if x.name == "memory"), None)
    if memory is not None and memory.ms > a.bounds.sequential_ms:
        a.notes.append(f"the memory floor ({memory.ms:.4g} ms) is above the sequential bound "
                       f"({a.bounds.sequential_ms:.4g} ms): each layer's benchmark ran with its own weights in cache, "
                       f"while one run of the model streams them from memory")


def _warn(a: Analysis) -> None:
    _warn_speed_of_light(a)
    _note_floors(a)
    unstable = a.unstable_rows
    if unstable:
        measured = sum(1 for r in a.rows if r.status == LayerStatus.OK)
        a.warnings.append(f"{len(unstable)} of the bound's {measured} measured layers rest on unstable results "
                          f"(their repetitions stayed too far apart after re-measurement; `benanza run "
                          f"--force --filter` on an idle machine replaces them): "
                          + ", ".join(a.at(r.index) for r in unstable[:5]) + (", …" if len(unstable) > 5 else ""))
    if a.contended:
        rows = a.contended_rows
        measured = sum(1 for r in a.rows if r.status == LayerStatus.OK)
        a.warnings.append(f"CONTENDED: {len(rows)} of the bound's {measured} measured layers "
                          f"({len(a.contended)} results it chooses from, fused ones included) were measured while "
                          f"other processes took the CPU, so every figure here may be inflated: " + contended_names(a))
    reference = a.reference_rows
    if reference:
        ms = sum(r.latency_ms for r in reference)
        a.warnings.append(
            f"{len(reference)} layers rest on {a.backend}'s reference code, not an optimized kernel (no variant "
            f"benchmarked for them ran one), {ms:.4g} ms of the {a.bounds.sequential_ms:.4g} ms bound: a framework's "
            f"own kernels can be far faster there, and the bound is then no floor: "
            + ", ".join(f"{a.at(r.index)} ({r.op}, {r.implementation})" for r in reference[:5])
            + (", …" if len(reference) > 5 else ""))
    slower = a.fusion.unprofitable
    if slower:
        a.warnings.append(f"Q5: {len(slower)} fusions measured no faster than their unfused layers and are not "
                          f"applied to the fused bound (unprofitable): " + ", ".join(
                              f"{u.pattern} at {a.at(u.nodes[0])} {u.fused_ms:.4g} vs {u.unfused_ms:.4g} ms"
                              for u in slower[:4]) + (", …" if len(slower) > 4 else ""))
    if a.missing:
        keys = sorted({r.key for r in a.missing})
        a.warnings.append(f"the database has no OK result on system {a.system!r} for {len(keys)} layer(s) "
                          f"({len(a.missing)} of {len(a.rows)} model layers): the bound is PARTIAL. "
                          f"Missing: {', '.join(keys[:5])}{', …' if len(keys) > 5 else ''}")
    if a.not_covered:
        ops = sorted({r.op for r in a.not_covered})
        a.warnings.append(f"{len(a.not_covered)} layers have no {a.backend} call and count as 0 in the bound "
                          f"(not covered: {', '.join(ops)})")
    if a.identity:
        ops = sorted({r.op for r in a.identity})
        a.notes.append(f"{len(a.identity)} layers are the identity at inference and cost 0 ({', '.join(ops)}: "
                       f"no training mode, nothing to compute)")
    if a.views:
        ops = sorted({r.op for r in a.views})
        a.notes.append(f"{len(a.views)} layers are free views and cost 0 ({', '.join(ops)}: "
                       f"the output is the input's data under another shape, or a Scan's slice of it read or "
                       f"written in place)")
    if a.folded:
        ops = sorted({r.op for r in a.folded})
        a.notes.append(f"{len(a.folded)} layers are folded at load time and cost 0 ({', '.join(ops)}: their "
                       f"outputs are constants once the input shapes are fixed)")
    for w in a.warnings:
        log.info(w)  # the caller presents warnings; this keeps them in -v logs too


def contended_names(a: Analysis, shown: int = 5) -> str:
    """The layers whose bound rests on a contended result, for a one-line message."""
    rows = a.contended_rows
    names = [a.at(r.index) for r in rows[:shown]] + (["…"] if len(rows) > shown else [])
    return ", ".join(names) or "fused results only"


def contended_subject(a: Analysis) -> str:
    """What a refused bound rests on, as the subject of "were measured while …": its layers and the
    results they choose from, or the fused results alone where no layer's own result was contended."""
    if not a.contended_rows:
        return f"{len(a.contended)} results of fused variants the bound chooses from"
    return f"{len(a.contended_rows)} layers ({contended_names(a)}; {len(a.contended)} results it chooses from)"


def contended_figures(a: Analysis) -> list[str]:
    """The figures besides the bound in the analysed dtype (another dtype's or layout's bound,
    the joint bound, the across-stack split) that rest on contended results."""
    labels = [f"the {label} bound" for label in a.tensor_cores.contended if label != a.dtype]
    return (labels + (["the joint bound"] if a.joint is not None and a.joint_contended else [])
            + (["the across-stack split"] if a.across_stack is not None and a.across_stack.contended else []))


def withhold_contended(a: Analysis) -> None:
    """Without ``--allow-contended``: drops the figures besides the bound that rest on contended
    results (they would read as real ones), and says so. The bound itself is the caller's to
    refuse (``a.contended``)."""
    figures = contended_figures(a)
    if not figures:
        return
    results = set(a.joint_contended).union(*(c for label, c in a.tensor_cores.contended.items()
                                             if label != a.dtype))
    a.tensor_cores.bounds = {k: b for k, b in a.tensor_cores.bounds.items()
                             if k == a.dtype or k not in a.tensor_cores.contended}
    if a.joint_contended:
        a.joint, a.joint_label = None, ""
    if a.across_stack is not None and a.across_stack.contended:
        results |= a.across_stack.contended
        a.across_stack = None
    named = " and ".join([", ".join(figures[:-1]), figures[-1]] if len(figures) > 1 else figures)
    a.warnings.append(f"{named} {'are' if len(figures) > 1 else 'is'} not shown: "
                      f"{'they rest' if len(figures) > 1 else 'it rests'} on {len(results)} results measured while "
                      f"other processes took the CPU (--allow-contended shows "
                      f"{'them' if len(figures) > 1 else 'it'} labelled CONTENDED)")


def _threads_said(lib: LibraryView) -> str:
    fw = f"{lib.framework_threads}" if lib.framework_threads else "a thread count its log does not state"
    return f"the framework's {lib.library} ran {fw}, the benchmarks {lib.benchmark_threads or '?'} threads"


def _call_reasons(a: Analysis, lib: LibraryView, c: AlgoChoice) -> tuple[str, ...]:
    """Why the bound's latency for a layer is above the framework's own time for its call: the
    causes this analysis can see, else what it cannot."""
    reasons = []
    if lib.versions_differ:
        reasons.append(f"a different library version (the framework's {lib.library} {lib.framework_version}, "
                       f"the benchmarks' {lib.benchmark_version}: their kernels differ)")
    if lib.threads_differ or (lib.library == "onednn" and not lib.framework_threads):
        reasons.append(_threads_said(lib))
    if a.rows[c.node].variant in a.unstable:
        reasons.append("the layer's benchmark result is unstable (its repetitions disagree)")
    if c.used_ms is None and not lib.versions_differ:
        reasons.append(f"the framework's implementation {c.used} is not among the benchmarked variants")
    if not reasons:
        reasons.append("no difference this analysis can see (same library version and threads, a stable "
                       "result): the two ran under different conditions (a busy machine, CPU frequency, warm "
                       "caches in the framework's loop), so re-measure the layer with `benanza run --force`")
    else:  # a stable result can still be one inflated throughout by a neighbour process
        reasons.append("a busy machine while the benchmark ran cannot be excluded (re-measure on an idle one "
                       "with `benanza run --force`)")
    return tuple(reasons)


def _warn_calls(a: Analysis, lib: LibraryView) -> None:
    """Say when the bound is above the framework's own per-call time, and what Q3 cannot judge."""
    above = lib.above_framework
    if above:
        worst = sorted(above, key=lambda c: (c.framework_ms or 0.0) - (c.bound_ms or 0.0))
        counts = Counter(r for c in above for r in _call_reasons(a, lib, c))
        a.warnings.append(
            f"bound above framework calls: for {len(above)} of {len(lib.algorithms)} layers the framework's "
            f"{lib.library} call took less time than the bound's latency for the layer ("
            + ", ".join(f"{a.at(c.node)} {c.framework_ms:.4g} vs {c.bound_ms:.4g} ms" for c in worst[:4])
            + (", …" if len(above) > 4 else "") + "), so the bound is not a floor there; likely because: "
            + "; ".join(f"{r} ({n} layers)" if n > 1 else r for r, n in counts.most_common()))
    fused = [c for c in lib.not_comparable if c.post_ops]
    if fused:
        kinds = sorted({"+".join(c.post_ops) for c in fused})
        a.notes.append(f"Q3: {len(fused)} {lib.library} calls not comparable: the call fuses "
                       f"{', '.join(kinds)} and no benchmark of the layer runs that fusion in its layout "
                       f"({', '.join(c.name for c in fused[:4])}{', …' if len(fused) > 4 else ''}); not judged")
    # the call's math or type ruled out every benchmark of the layer (questions._comparable says why)
    ruled_out = [c for c in lib.not_comparable if not c.post_ops and c.explanation and not c.above_framework]
    for why, n in sorted(Counter(c.explanation for c in ruled_out).items()):
        a.notes.append(f"Q3: {n} {lib.library} calls not comparable: {why}; not judged")
    other = [c for c in lib.not_comparable if not c.post_ops and c not in ruled_out]
    if other:
        a.notes.append(f"Q3: {len(other)} {lib.library} calls not comparable: no benchmark of the layer in the "
                       f"call's layout ({', '.join(f'{c.name} {c.layout}' for c in other[:4])}); not judged")


# How a framework can beat a floor (a floor is a lower bound too: raised above a measurement, it
# is said, with these).
_FLOOR_BEATEN = {
    "memory": "the framework streamed fewer weight bytes than the floor counts (kept more of them cached, skipped "
              "layers) or the stored memory bandwidth is below what this machine attains (peaks measured while it "
              "was busy)",
    "compute": "the framework computed fewer FLOPs than the layers count (fused or skipped layers, Winograd-like "
               "algorithms) or the stored compute peak is below what this machine attains (peaks measured while it "
               "was busy)",
    "work": "the framework ran more threads than the stack's, or its kernels did the layers' work in less time than "
            "the one-thread benchmarks",
}


def _explain_bound(a: Analysis) -> None:
    """A bound above the measured latency is never silent: one warning with every cause seen."""
    m = a.measured_ms
    if m is None or not (a.bounds.sequential_ms > m or a.bounds.parallel_ms > m):
        return
    seq_above, par_above = a.bounds.sequential_ms > m, a.bounds.parallel_ms > m
    which = (f"both bounds ({a.bounds.sequential_ms:.4g} ms sequential, {a.bounds.parallel_ms:.4g} ms parallel)"
             if seq_above and par_above else f"the sequential bound ({a.bounds.sequential_ms:.4g} ms)" if seq_above
             else f"the parallel bound ({a.bounds.parallel_ms:.4g} ms)")
    reasons = []
    if a.bounds.parallel_ms <= m:
        reasons.append(f"the framework may run independent branches concurrently: the critical-path bound "
                       f"({a.bounds.parallel_ms:.4g} ms) is below the measured latency")
    floors = a.floors
    floor = floors.binding if floors is not None else None
    if floors is not None and floor is not None and a.bounds.parallel_ms > m:
        reasons.append(f"the {floor.name} floor ({floor.ms:.4g} ms: {floor.detail}) raised the parallel bound above "
                       f"the critical path ({floors.critical_path_ms:.4g} ms): {_FLOOR_BEATEN[floor.name]}")
    tf32 = _tf32_unbounded(a)
    if tf32 is not None:
        reasons.append(f"the framework ran {tf32.calls} of its {tf32.of} f32 library calls with TF32 Tensor Core "
                       f"math allowed, the bound exact f32 math (`--math tf32` bounds TF32)")
    v = a.framework
    if v is not None:
        if v.bounds_same_fusions.sequential_ms < a.bounds.sequential_ms:
            reasons.append(f"{v.framework} fused or folded layers (the bound with its fusions is "
                           f"{v.bounds_same_fusions.sequential_ms:.4g} ms sequential)")
        if v.match.op_ms > m:
            # a bundle's latency comes from runs without the profiler, the ops' times from runs with it
            ok = [r for r in a.rows if r.status == LayerStatus.OK]
            traced = sum(1 for r in ok if r.variant not in a.untraced) if v.framework == a.backend else 0
            carried = ""  # the benchmarks the same profiler times carry its cost too
            if traced == len(ok) and traced:
                carried = (f", and so does each {a.backend} benchmark, which the same profiler times: for kernels "
                           f"of a few microseconds that cost is most of their time, and the bound is no floor")
            elif traced:
                carried = (f", and so do {traced} of the bound's {len(ok)} {a.backend} benchmarks, which the same "
                           f"profiler times")
            reasons.append(f"{v.framework}'s ops took {v.match.op_ms:.4g} ms per traced run, more than the measured "
                           f"latency: each op's time holds the profiler's own cost{carried}")
        faster = sorted((o for o in v.overheads if o.covered and o.overhead_ms < 0), key=lambda o: o.overhead_ms)
        if faster:
            worst = ", ".join(f"{o.group} {o.framework_ms:.3g} vs {o.bound_ms:.3g} ms" for o in faster[:3])
            reasons.append(f"{len(faster)} framework ops ran faster than the best benchmarked variant of the same "
                           f"layers ({worst}): the framework's own kernels (e.g. ONNX Runtime's MLAS on CPU) or "
                           f"library version beat the benchmarks there")
    for lib in a.libraries:
        if lib.above_framework:
            reasons.append(f"{len(lib.above_framework)} {lib.library} calls of the framework ran faster than the "
                           f"bound's latency for their layer (see the warning on framework calls)")
        if lib.versions_differ:
            reasons.append(f"the framework's {lib.library} is {lib.framework_version}, the benchmarks' "
                           f"{lib.benchmark_version}")
        if lib.threads_differ and a.threads is None:
            reasons.append(_threads_said(lib))
    if a.unstable_rows:
        reasons.append(f"{len(a.unstable_rows)} of the bound's layers rest on unstable results")
    if a.threads is not None and a.threads.differ:
        reasons.append(f"the framework ran {a.threads.profile} threads, the benchmarks {a.threads.benchmarks}")
    if a.threads is None and not any(lib.framework_threads for lib in a.libraries):  # nothing said how many
        threads = a.stack.threads if a.stack is not None else None
        if threads:
            reasons.append(f"the benchmarks ran {threads} threads; the framework's thread count is not compared "
                           f"here (a framework with more threads can beat a bound measured with fewer)")
    if not reasons:
        reasons.append("no layer was seen faster than its benchmark: the benchmarks and the framework ran "
                       "under different conditions (threads, frequency, a busy machine)")
    a.warnings.append(f"bound above measured: {which} exceed{'' if seq_above and par_above else 's'} the "
                      f"measured {m:.4g} ms ({a.measured_source or 'measured'}); likely because: " + "; ".join(reasons))
