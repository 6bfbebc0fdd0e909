"""Q3–Q6 and the framework-fusion view, as pure functions over typed inputs."""

from __future__ import annotations

import re
import statistics
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..fusion import BY_NAME as FUSION_PATTERNS
from ..fusion import FusionMatch
from ..layers import FLOAT_DTYPES, Model
from ..parsers import ExecutionProfile, FrameworkTrace, LibraryCall
from ..parsers.blocklog import int_list
from ..parsers.ort import NCHWC_SUFFIX
from ..problems import ConvProblem
from ..records import Math, Result, Variant
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
    # the database latency of that implementation in the call's layout and fusion, on the same
    # library version (None: never benchmarked, or the versions differ so names do not compare)
    used_ms: float | None
    best: str  # "" when no benchmark computes what the call computed (not comparable)
    best_ms: float | None  # the fastest benchmark of the same layout and fusion as the call
    framework_ms: float | None = None  # the call's own time in the library log (oneDNN verbose), median
    layout: str = ""  # the layout the call used ("" when the log does not say); both sides use it
    noise_ms: float = 0.0  # the larger stddev of the two compared results
    post_ops: tuple[str, ...] = ()  # what the call fused after the conv (LibraryCall.post_ops)
    fusion: str = ""  # the benchmark fusion (Variant.fusion) compared with the call; "" if none
    bound_ms: float | None = None  # the layer's latency in the bound (any layout, unfused)
    # why bound_ms is above framework_ms (set by the analyzer when it is); for a cuDNN graph-API
    # call, why used_ms is None or the call is not comparable (engine_of)
    explanation: str = ""
    used_variant: str = ""  # the benchmark behind used_ms ("" without one)
    best_variant: str = ""  # the benchmark behind best_ms ("" without one)
    # Where used_ms or best_ms is a result racing stopped at its screening estimate
    # (Result.eliminated), known to the screening precision only: the variants to measure in full
    # before the layer is judged (that one and the other candidates for its place racing only
    # screened; the analysis prints the command).
    screened: tuple[str, ...] = ()

    @property
    def comparable(self) -> bool:
        """Whether a benchmark computes what the call computed (the same post-ops and bias)."""
        return self.best_ms is not None

    @property
    def gain_ms(self) -> float | None:
        if self.used_ms is None or self.best_ms is None:
            return None
        return max(0.0, self.used_ms - self.best_ms)

    @property
    def suboptimal(self) -> bool:
        """A measured gain beyond the measurements' own spread; never without a measurement,
        nor from a screening estimate."""
        return not self.screened and self.gain_ms is not None and self.gain_ms > max(self.noise_ms, 1e-9)

    @property
    def optimal(self) -> bool:
        return self.used_ms is not None and not self.screened and not self.suboptimal

    @property
    def used_screened(self) -> bool:
        return bool(self.used_variant) and self.used_variant in self.screened

    @property
    def best_screened(self) -> bool:
        return bool(self.best_variant) and self.best_variant in self.screened

    @property
    def above_framework(self) -> bool:
        """The bound's latency for the layer is above the framework's own time for the call."""
        return self.framework_ms is not None and self.bound_ms is not None and self.bound_ms > self.framework_ms


_PLAIN_TAGS = {"abc": "nchw", "abcd": "nchw", "abcde": "nchw", "acb": "nhwc", "acdb": "nhwc", "acdeb": "nhwc"}


def call_layout(call: LibraryCall) -> str:
    """The activation layout a logged call used, in the database's terms ("" if unknown)."""
    detail = dict(call.detail)
    if call.library == "onednn":
        m = re.search(r"src[_:][a-z0-9]+:[a-z]*:blocked:([A-Za-z0-9]+)", detail.get("mds", ""))
        if m is None:
            return ""
        return _PLAIN_TAGS.get(m.group(1), "any")  # blocked tags (aBcd16b, ...) come from format any
    values = " ".join(v for _, v in call.detail)
    for fmt, layout in (("CUDNN_TENSOR_NHWC", "nhwc"), ("CUDNN_TENSOR_NCHW", "nchw")):
        if fmt in values:
            return layout
    return _strides_layout(call)


def _strides_layout(call: LibraryCall) -> str:
    """A graph-API call's layout, from its input's strides (its tensors have no format): packed
    NHWC or NCHW ("" if neither)."""
    strides = next((int_list(v) for p, v in call.detail if p.endswith("xDesc.strideA")), ())
    dims = next((int_list(v) for p, v in call.detail if p.endswith("xDesc.dimA")), ())
    if len(strides) != 4 or len(dims) != 4:
        return ""
    _, c, h, w = dims
    packed = {(c * h * w, 1, w * c, c): "nhwc", (c * h * w, h * w, w, 1): "nchw"}
    return packed.get(strides, "")


_ENGINE = re.compile(r"eng(\d+)")


def engine_of(algo: str) -> int | None:
    """The global engine index of a cuDNN graph-API call's ``algo`` (``eng28``); None for
    another kind of call (a legacy algorithm, a oneDNN implementation)."""
    m = _ENGINE.fullmatch(algo)
    return int(m.group(1)) if m else None


def _same_engine(engine: int, results: list[Result]) -> tuple[list[Result], str]:
    """The graph-API results that ran ``engine`` (their ``engine_id`` counter), and why none is
    there when none is."""
    same = [r for r in results if r.metrics.get("engine_id") == engine]
    if same:
        return same, ""
    measured = sorted({int(r.metrics["engine_id"]) for r in results if "engine_id" in r.metrics})
    return [], (f"engine {engine} was not among the measured plans"
                + (f" (engines {', '.join(map(str, measured))})" if measured else " (no graph-API result)"))


def _admitting_tf32(results: list[Result]) -> tuple[list[Result], str]:
    """A call that allowed TF32 compares with the variants that allow it only: an exact-f32
    variant is another computation. Empty, with why, where none was measured."""
    tf32 = [r for r in results if r.variant.math == Math.TF32_ALLOWED]
    why = "" if tf32 else ("the call allowed TF32 and no benchmark of the layer in its layout does "
                           "(generate --math tf32_allowed, analyze --math tf32)")
    return tf32, why


# a fusion pattern's activation as the post-op a library call logs for it
_ACTIVATION_POST_OPS = {"relu": ("eltwise_relu",), "gelu": ("eltwise_gelu_erf",), "identity": ()}


def _post_op(op: str) -> str:
    """A post-op without its default trailing parameters: oneDNN 2.x may log a ReLU as
    ``eltwise_relu:0`` where 3.x logs ``eltwise_relu``."""
    name, *params = op.split(":")
    while params and re.fullmatch(r"0+(\.0*)?", params[-1]):
        params.pop()
    return ":".join([name, *params])


def variant_epilogue(variant: Variant) -> tuple[bool, tuple[str, ...]]:
    """What a benchmark variant computes after its operation: (adds a bias, post-ops)."""
    if variant.fusion == "none":
        return isinstance(variant.problem, ConvProblem) and variant.problem.bias, ()
    pattern = FUSION_PATTERNS[variant.fusion]
    return pattern.bias_of(variant.problem), _ACTIVATION_POST_OPS[pattern.activation]


def _computes(call_bias: bool | None, post_ops: tuple[str, ...], variant: Variant) -> bool:
    """Whether the variant computes the call's work. A call without a bias still compares with a
    biased benchmark of its layer: a framework that keeps BatchNorm apart (PyTorch eager and
    inductor) runs the conv the ONNX export folded BN into, and the bias add is the same kernel's
    epilogue, so the comparison can only understate the framework's speed, never invent a gain."""
    bias, ops = variant_epilogue(variant)
    return ops == post_ops and (bias or not call_bias)


def _comparable(results: list[Result], call_dtype: str, dtype: str, tf32: bool) -> tuple[list[Result], str]:
    """Those of a layer's results in the call's layout and fusion that compare with the call,
    and why none does where its type or its math rules them all out."""
    # a QDQ layer's int8 call compares with the layer's int8 fusion, whatever the analysed float type
    if call_dtype in FLOAT_DTYPES and dtype in FLOAT_DTYPES and call_dtype != dtype:
        return [], f"the call computed in {call_dtype}, the analysis is of {dtype}"
    if tf32 and dtype == "f32":
        return _admitting_tf32(results)
    return results, ""


def algorithm_choices(model: Model, alignment: CallAlignment, by_problem: ResultIndex,
                      dtype: str, same_version: bool = True,
                      bound: Mapping[int, float] | None = None) -> list[AlgoChoice]:
    """Per conv layer: the algorithm used most across passes vs the fastest benchmark that
    computes what the call computed: the same layout, and the same fusion (a call with a ReLU
    post-op against the conv+bias+relu variant). A call no benchmark computes is listed with no
    best (not comparable), never judged against an unfused benchmark. ``same_version``: the log's
    library version is the benchmarks' (else implementation names are not compared and only the
    log's own call time is shown). ``bound``: each layer's latency in the bound."""
    used: dict[int, Counter[str]] = {}
    shapes: dict[int, Counter[tuple[str, bool | None, tuple[str, ...], bool, str]]] = {}
    times: dict[int, list[float]] = {}
    for p in alignment.passes:
        for m in p:
            # a call matched with deviations computed another problem (Q4 reports it): not the layer's
            if m.call.conv is not None and m.call.algo and not m.deviations:
                used.setdefault(m.node, Counter())[m.call.algo] += 1
                epilogue = tuple(_post_op(op) for op in m.call.post_ops)
                tf32 = m.call.math == Math.TF32_ALLOWED
                key = (call_layout(m.call), m.call.bias, epilogue, tf32, m.call.dtype)
                shapes.setdefault(m.node, Counter())[key] += 1
                if m.call.time_ms is not None:
                    times.setdefault(m.node, []).append(m.call.time_ms)
    bound = bound or {}
    out = []
    for index, counts in sorted(used.items()):
        node = model.nodes[index]
        dt = node.layer.in_dtype(dtype)
        layout, bias, post_ops, tf32, call_dtype = shapes[index].most_common(1)[0][0]
        measured = [r for r in layer_results(by_problem, node.layer, dtype) if r.ok and r.variant.dtype == dt]
        results = [r for r in measured if (not layout or r.variant.layout == layout)
                   and _computes(bias, post_ops, r.variant)]
        results, why = _comparable(results, call_dtype, dt, tf32)
        # one computation, possibly under two fusion names (an unfused conv with its bias and "bias")
        fastest = min(results, key=lambda r: (float(r.latency_ms), r.variant.name), default=None)  # type: ignore[arg-type]
        algo = counts.most_common(1)[0][0]
        framework_ms = statistics.median(times[index]) if index in times else None
        if fastest is None:
            if not measured:
                continue  # nothing measured for the layer: the bound's missing-layer warning says so
            # measured, but not in the call's layout or not with its fusion: listed, never judged
            out.append(AlgoChoice(index, node.name, algo, None, "", None, framework_ms, layout,
                                  post_ops=post_ops, bound_ms=bound.get(index), explanation=why))
            continue
        engine = engine_of(algo)
        if engine is not None:  # a graph-API execute: the results of the plans that ran its engine
            same, why = _same_engine(engine, results)
        else:
            same = [r for r in results if _norm(algo) in (_norm(r.variant.algo), _norm(r.implementation))]
        match = min(same, key=lambda r: float(r.latency_ms)) if same and same_version else None  # type: ignore[arg-type]
        noise = max((r.stddev_ms or 0.0) for r in (fastest, match)) if match is not None else 0.0
        out.append(AlgoChoice(index, node.name, algo, None if match is None else float(match.latency_ms),  # type: ignore[arg-type]
                              fastest.implementation or fastest.variant.algo, float(fastest.latency_ms),  # type: ignore[arg-type]
                              framework_ms, layout, noise, post_ops, fastest.variant.fusion, bound.get(index),
                              why, **_compared(match, same, fastest, results)))
    return out


def _compared(used: Result | None, used_from: list[Result], best: Result, best_from: list[Result]) -> dict:
    """AlgoChoice's fields naming the two results compared (each the fastest of its candidates)
    and, where one is a screening estimate, every candidate for its place that racing only
    screened: measured in full, they leave a fastest that is a measurement whichever it is."""
    screened = {r.variant.name for chosen, pool in ((used, used_from), (best, best_from))
                if chosen is not None and chosen.eliminated for r in pool if r.eliminated}
    return {"used_variant": used.variant.name if used is not None else "", "best_variant": best.variant.name,
            "screened": tuple(sorted(screened))}


# --- Q3 on a framework's own backend: the kernel it ran vs its fastest variant ------------------



def _one_clock(results: list[Result]) -> Callable[[Result], float]:
    """The latency the variants of one op compare on: their own where one clock took them all,
    else the framework profiler's reading every one of them has (ORT times a variant under
    0.1 ms without its profiler, a larger or NCHWc one with it: a few microseconds apart on
    the clocks alone, which Q3 must not read as a better kernel)."""
    if len({r.untraced for r in results}) > 1:
        return lambda r: float(r.traced_ms)  # type: ignore[arg-type]
    return lambda r: float(r.latency_ms)  # type: ignore[arg-type]


def native_kernel_choices(model: Model, trace: TraceMatch, fusions: list[FusionMatch], by_problem: ResultIndex,
                          dtype: str, ran: Callable[[Variant, str], bool],
                          bound: Mapping[int, float] | None = None, resolution_ms: float = 0.0) -> list[AlgoChoice]:
    """Per framework op that ran model layers, against the benchmarks of the framework's own
    backend (the same versions by construction): the variant that computes what the op ran (its
    layers unfused, or the fusion pattern its layers form) as the op ran it (``ran(variant, op
    name)``, the backend's word: ORT's NCHWc by the name its transform gives the node; torch's
    contiguous layout with oneDNN enabled), vs the fastest variant computing the same in any
    layout or kernel choice. An op over layers no pattern names is listed, never judged; two
    readings of the framework profiler's clock ``resolution_ms`` apart, never told apart."""
    patterns = {tuple(sorted(m.nodes)): m for m in fusions}
    bound = bound or {}
    out = []
    for g in trace.groups:
        if not g.nodes:
            continue
        pattern = patterns.get(tuple(sorted(g.nodes)))
        # a fused op's benchmarks are its pattern's, on the layer the pattern is benchmarked on
        node = model.nodes[g.nodes[0] if pattern is None else pattern.nodes[0]]
        layer = node.layer if pattern is None else pattern.conv
        fusion = "none" if len(g.nodes) == 1 else pattern.pattern.name if pattern is not None else ""
        measured = [r for r in layer_results(by_problem, layer, dtype)
                    if r.ok and r.variant.dtype == layer.in_dtype(dtype)]
        if not measured:
            continue  # nothing measured for the layer: the bound's missing-layer warning says so
        nchwc = g.name.endswith(NCHWC_SUFFIX)
        same = [r for r in measured if r.variant.fusion == fusion]
        used = [r for r in same if ran(r.variant, g.name)]
        ms = _one_clock(same)
        fastest = min(same, key=lambda r: (ms(r), r.variant.name), default=None)
        match = min(used, key=ms, default=None)
        layout = "any" if nchwc else (match.variant.layout if match is not None else "")
        name = f"{g.op}{' (NCHWc)' if nchwc else ''}"
        if fastest is None:
            out.append(AlgoChoice(node.index, node.name, name, None, "", None, g.time_ms, layout,
                                  bound_ms=bound.get(node.index)))
            continue
        noise = max((r.stddev_ms or 0.0) for r in (fastest, match)) if match is not None else 0.0
        if match is not None and not (match.untraced and fastest.untraced):  # read on the profiler's clock
            noise = max(noise, resolution_ms)
        v = fastest.variant
        best_name = f"{fastest.implementation or v.algo} ({v.algo}, {v.layout})"
        out.append(AlgoChoice(node.index, node.name, name, None if match is None else ms(match),
                              best_name, ms(fastest), g.time_ms, layout, noise,
                              fusion=fusion, bound_ms=bound.get(node.index),
                              **_compared(match, used, fastest, same)))
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
                      algos: Mapping[str, tuple[str, ...]]) -> HeuristicView | None:
    """Per conv (or transposed conv) layer, from the database alone: the heuristic's and Find's
    algorithm (recorded by each cuDNN benchmark of it as ``heuristic_algo`` / ``find_algo``,
    indexes into its family's enum in ``algos``) and their measured latency vs the fastest. None
    when no result records the heuristic's choice."""
    out = []
    for node in model.nodes:
        enum = algos.get(node.layer.problem.family)
        if enum is None:
            continue
        results = [r for r in layer_results(by_problem, node.layer, dtype)
                   if r.ok and r.variant.fusion == "none" and "heuristic_algo" in r.metrics]
        fastest = best(results, node.layer.in_dtype(dtype))
        if fastest is None:
            continue
        group = [r for r in results
                 if (r.variant.layout, r.variant.math) == (fastest.variant.layout, fastest.variant.math)]
        by_algo = {r.variant.algo: float(r.latency_ms) for r in group}  # type: ignore[arg-type]
        heuristic = _algo_name(fastest.metrics, "heuristic_algo", enum)
        find = _algo_name(fastest.metrics, "find_algo", enum)
        out.append(HeuristicChoice(node.index, node.name, fastest.variant.layout, fastest.variant.math,
                                   heuristic, by_algo.get(heuristic), find, by_algo.get(find),
                                   fastest.variant.algo, float(fastest.latency_ms)))  # type: ignore[arg-type]
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
