"""Q3–Q6 and the framework-fusion view, as pure functions over typed inputs."""

from __future__ import annotations

import re
import statistics
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from ..layers import Model
from ..parsers import ExecutionProfile, FrameworkTrace, LibraryCall
from .bounds import LayerRow, LayerStatus, ResultIndex, best, layer_results
from .matching import CallAlignment, TraceMatch

# --- Q3: algorithm selection -----------------------------------------------------------------


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower().removeprefix("cudnn_convolution_fwd_algo_"))


@dataclass(frozen=True)
class AlgoChoice:
    node: int
    name: str
    used: str  # algorithm / implementation the framework's library call used
    # the database latency of that implementation in the call's layout, on the same library
    # version (None: never benchmarked, or the versions differ so names do not compare)
    used_ms: float | None
    best: str
    best_ms: float
    framework_ms: float | None = None  # the call's own time in the library log (oneDNN verbose), median
    layout: str = ""  # the layout the call used ("" when the log does not say); both sides use it
    noise_ms: float = 0.0  # the larger stddev of the two compared results

    @property
    def gain_ms(self) -> float | None:
        return None if self.used_ms is None else max(0.0, self.used_ms - self.best_ms)

    @property
    def suboptimal(self) -> bool:
        """A measured gain beyond the measurements' own spread; never without a measurement."""
        return self.gain_ms is not None and self.gain_ms > max(self.noise_ms, 1e-9)

    @property
    def optimal(self) -> bool:
        return self.used_ms is not None and not self.suboptimal


_PLAIN_TAGS = {"abc": "nchw", "abcd": "nchw", "abcde": "nchw", "acb": "nhwc", "acdb": "nhwc", "acdeb": "nhwc"}


def call_layout(call: LibraryCall) -> str:
    """The activation layout a logged call used, in the database's terms ("" if unknown)."""
    detail = dict(call.detail)
    if call.library == "onednn":
        m = re.search(r"src[_:][a-z0-9]+:[a-z]*:blocked:([A-Za-z0-9]+)", detail.get("mds", ""))
        if m is None:
            return ""
        return _PLAIN_TAGS.get(m.group(1), "any")  # blocked tags (aBcd8b, ...) come from format any
    values = " ".join(v for _, v in call.detail)
    for fmt, layout in (("CUDNN_TENSOR_NHWC", "nhwc"), ("CUDNN_TENSOR_NCHW", "nchw")):
        if fmt in values:
            return layout
    return ""


def algorithm_choices(model: Model, alignment: CallAlignment, by_problem: ResultIndex,
                      dtype: str, same_version: bool = True) -> list[AlgoChoice]:
    """Per conv layer: the algorithm used most across passes vs the fastest benchmarked one in
    the same layout. ``same_version``: the log's library version is the benchmarks' (else
    implementation names are not compared and only the log's own call time is shown)."""
    used: dict[int, Counter[str]] = {}
    layouts: dict[int, Counter[str]] = {}
    times: dict[int, list[float]] = {}
    for p in alignment.passes:
        for m in p:
            if m.call.conv is not None and m.call.algo:
                used.setdefault(m.node, Counter())[m.call.algo] += 1
                layouts.setdefault(m.node, Counter())[call_layout(m.call)] += 1
                if m.call.time_ms is not None:
                    times.setdefault(m.node, []).append(m.call.time_ms)
    out = []
    for index, counts in sorted(used.items()):
        node = model.nodes[index]
        dt = node.layer.in_dtype(dtype)
        layout = layouts[index].most_common(1)[0][0]
        results = [r for r in layer_results(by_problem, node.layer, dtype)
                   if r.ok and r.variant.fusion == "none" and (not layout or r.variant.layout == layout)]
        fastest = best(results, dt)
        if fastest is None:
            continue
        algo = counts.most_common(1)[0][0]
        same = [r for r in results if _norm(algo) in (_norm(r.variant.algo), _norm(r.implementation))]
        match = min(same, key=lambda r: float(r.median_ms)) if same and same_version else None  # type: ignore[arg-type]
        noise = max((r.stddev_ms or 0.0) for r in (fastest, match)) if match is not None else 0.0
        out.append(AlgoChoice(index, node.name, algo, None if match is None else float(match.median_ms),  # type: ignore[arg-type]
                              fastest.implementation or fastest.variant.algo, float(fastest.median_ms),  # type: ignore[arg-type]
                              statistics.median(times[index]) if index in times else None, layout, noise))
    return out


# --- Q3 without a framework: the library's heuristic vs the ideal algorithm (Figs 10, 14) ----------


@dataclass(frozen=True)
class HeuristicChoice:
    """One conv layer: what cuDNN's heuristic (cudnnGetConvolutionForwardAlgorithm_v7) and
    cudnnFind pick, against the fastest algorithm measured, all in one layout and math mode
    (the one of the fastest result: the ideal)."""

    node: int
    name: str
    layout: str
    math: str
    heuristic: str  # "" when the heuristic offered no algorithm
    heuristic_ms: float | None  # its measured latency; None when that variant has no OK result
    find: str
    find_ms: float | None
    best: str
    best_ms: float

    @property
    def heuristic_optimal(self) -> bool:
        return self.heuristic == self.best


@dataclass(frozen=True)
class HeuristicView:
    choices: list[HeuristicChoice]
    weights: dict[int, float]  # node weights with each conv at its heuristic's latency (else the best)
    unknown: int  # conv layers whose heuristic algorithm has no OK measurement (they keep the best)

    @property
    def heuristic_ms(self) -> float:
        return sum(c.heuristic_ms if c.heuristic_ms is not None else c.best_ms for c in self.choices)

    @property
    def ideal_ms(self) -> float:
        return sum(c.best_ms for c in self.choices)


def _algo_name(metrics: dict, counter: str, algos: tuple[str, ...]) -> str:
    index = metrics.get(counter)
    if index is None or not 0 <= int(index) < len(algos):
        return ""
    return algos[int(index)]


def heuristic_choices(model: Model, by_problem: ResultIndex, dtype: str, weight: Mapping[int, float],
                      algos: tuple[str, ...]) -> HeuristicView | None:
    """Per conv layer, from the database alone: the heuristic's and Find's algorithm (recorded by
    each cuDNN conv benchmark as ``heuristic_algo`` / ``find_algo``, indexes into ``algos``) and
    their measured latency vs the fastest. None when no result records the heuristic's choice."""
    out = []
    for node in model.nodes:
        results = [r for r in layer_results(by_problem, node.layer, dtype)
                   if r.ok and r.variant.fusion == "none" and "heuristic_algo" in r.metrics]
        fastest = best(results, node.layer.in_dtype(dtype))
        if fastest is None:
            continue
        group = [r for r in results if (r.variant.layout, r.variant.math) == (fastest.variant.layout, fastest.variant.math)]
        by_algo = {r.variant.algo: float(r.median_ms) for r in group}  # type: ignore[arg-type]
        heuristic = _algo_name(fastest.metrics, "heuristic_algo", algos)
        find = _algo_name(fastest.metrics, "find_algo", algos)
        out.append(HeuristicChoice(node.index, node.name, fastest.variant.layout, fastest.variant.math,
                                   heuristic, by_algo.get(heuristic), find, by_algo.get(find),
                                   fastest.variant.algo, float(fastest.median_ms)))  # type: ignore[arg-type]
    if not out:
        return None
    weights = dict(weight)
    for c in out:
        if c.heuristic_ms is not None:
            weights[c.node] = c.heuristic_ms
    return HeuristicView(out, weights, sum(1 for c in out if c.heuristic_ms is None))


# --- Q4: framework inefficiencies ---------------------------------------------------------------


@dataclass(frozen=True)
class LayerOverhead:
    group: str  # the framework op's name
    op: str
    nodes: tuple[int, ...]
    framework_ms: float  # mean time in the framework op per run
    bound_ms: float  # the bound's latency for the same layers
    covered: bool  # every layer of the group has a database result

    @property
    def overhead_ms(self) -> float:
        return self.framework_ms - self.bound_ms


def layer_overheads(trace: TraceMatch, weight: Mapping[int, float], rows: list[LayerRow]) -> list[LayerOverhead]:
    status = {r.index: r.status for r in rows}
    out = []
    for g in trace.groups:
        bound = sum(weight.get(i, 0.0) for i in g.nodes)
        out.append(LayerOverhead(g.name, g.op, g.nodes, g.time_ms, bound,
                                 bool(g.nodes) and all(status.get(i) == LayerStatus.OK for i in g.nodes)))
    return out


@dataclass(frozen=True)
class BetweenCalls:
    """What ran between consecutive library calls (Nsight Systems), per name."""

    name: str
    kind: str  # "kernel" | "cuda_runtime" | ...
    count: int
    total_ms: float
    backtrace: tuple[str, ...]


def between_library_calls(nsys: FrameworkTrace, top: int = 10) -> list[BetweenCalls]:
    lib = sorted((a for a in nsys.api_calls if a.kind in ("cudnn", "cublas")), key=lambda a: a.span.start_us)
    if len(lib) < 2:
        return []
    windows = [(a.span.end_us, b.span.start_us) for a, b in zip(lib, lib[1:])]
    starts = [w[0] for w in windows]
    import bisect

    stats: dict[tuple[str, str], list] = {}

    def add(name: str, kind: str, t: float, dur: float, bt: tuple[str, ...]) -> None:
        k = bisect.bisect_right(starts, t) - 1
        if k >= 0 and t < windows[k][1]:
            s = stats.setdefault((name, kind), [0, 0.0, bt])
            s[0] += 1
            s[1] += dur
            s[2] = s[2] or bt

    for a in nsys.api_calls:
        if a.kind in ("cuda_runtime", "osrt"):
            add(a.name, a.kind, a.span.start_us, a.span.dur_us, a.backtrace)
    for kern in nsys.kernels:
        add(kern.name, "kernel", kern.span.start_us, kern.span.dur_us, ())
    ranked = sorted(stats.items(), key=lambda kv: -kv[1][0])[:top]
    return [BetweenCalls(n, k, c, t / 1000.0, bt) for (n, k), (c, t, bt) in ranked]


@dataclass(frozen=True)
class IdleGap:
    after: str
    before: str
    mean_us: float


def kernel_gaps(trace: FrameworkTrace, top: int = 5) -> list[IdleGap]:
    """Largest idle gaps between consecutive GPU kernels."""
    ks = sorted(trace.kernels, key=lambda k: k.span.start_us)
    gaps = [(b.span.start_us - a.span.end_us, a.name, b.name) for a, b in zip(ks, ks[1:])]
    gaps = [g for g in gaps if g[0] > 0]
    gaps.sort(reverse=True)
    return [IdleGap(a, b, g) for g, a, b in gaps[:top]]


# --- Q6: Tensor Cores ------------------------------------------------------------------------------

# The paper's `_[ish]\d+` (volta_h884gemm, _s1688, _i8816) plus today's names.
TENSOR_CORE_RE = re.compile(r"(_[ish]\d{3,5}(?=[a-z_]|$)|h1688|s16816|hmma|imma|xmma|_tensorop_|wgmma|"
                            r"sm90_xmma_gemm|tensorop)", re.IGNORECASE)


def tensor_core_kernels(profile: ExecutionProfile | None) -> tuple[int, int, list[str]]:
    """(kernels using Tensor Cores, kernels seen, a few TC kernel names) over the profile."""
    if profile is None:
        return 0, 0, []
    names = [k.name for t in (profile.trace, profile.nsys) if t is not None for k in t.kernels]
    tc = [n for n in names if TENSOR_CORE_RE.search(n)]
    return len(tc), len(names), sorted(set(tc))[:5]
