"""PyTorch profiler traces (Kineto Chrome-trace JSON from ``export_chrome_trace``).

CPU operators (``cat: cpu_op``, ``Operator`` before torch 1.10) nest: ``aten::conv2d`` calls
``aten::convolution`` calls ``aten::mkldnn_convolution``. Only the outermost operator of each
nest is kept as an op, since that is the one a model layer maps to. Kernels and CUDA runtime
calls are linked by ``args.correlation``. Inference runs are the ``user_annotation`` ranges
named ``benanza_run`` (what ``benanza profile`` records) or ``ProfilerStep#N``.

Other ``user_annotation`` ranges (``record_function``) are layers: Benanza's torch executor
(``benanza.torch_exec``) wraps each ONNX node in one named after the layer. When a trace has
them, each outermost range is an op named after it, its ``op`` the outermost operator it ran
(``aten::conv2d``), and the operators inside it are not ops of their own.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from .base import ApiEvent, FrameworkTrace, KernelEvent, OpEvent, ProfileFormatError, Span, load_json

_OP_CATS = {"cpu_op", "operator"}
_KERNEL_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
_RUNTIME_CATS = {"cuda_runtime", "runtime", "cuda_driver"}
_RUN_NAMES = ("benanza_run", "ProfilerStep#")


def _dims(value: Iterable[object] | None) -> tuple[tuple[int, ...], ...]:
    out = []
    for d in value or []:
        if isinstance(d, list) and all(isinstance(x, int) for x in d):
            out.append(tuple(d))
    return tuple(out)


def parse_kineto_trace(path: str | Path) -> FrameworkTrace:
    data = load_json(path, "PyTorch profiler trace")
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ProfileFormatError(path, "not a PyTorch/Kineto trace: no traceEvents array")
    trace = FrameworkTrace(path=str(path), framework="torch")
    raw_ops: list[tuple[dict, Span]] = []
    ranges: list[tuple[dict, Span]] = []
    for i, ev in enumerate(events):
        if not isinstance(ev, dict):
            raise ProfileFormatError(path, f"traceEvents[{i}] is not an object")
        if ev.get("ph") != "X":
            continue
        try:
            span = Span(float(ev["ts"]), float(ev.get("dur", 0)))
        except (KeyError, TypeError, ValueError):
            raise ProfileFormatError(path, f"traceEvents[{i}] ({ev.get('name')!r}) has no numeric ts") from None
        cat = str(ev.get("cat", "")).lower()
        args = ev.get("args") or {}
        name = str(ev.get("name", ""))
        if cat in _OP_CATS:
            raw_ops.append((ev, span))
        elif cat in _KERNEL_CATS:
            trace.kernels.append(KernelEvent(name, span, int(args.get("correlation", -1)),
                                             int(args.get("stream", -1)), int(args.get("device", -1))))
        elif cat in _RUNTIME_CATS:
            trace.api_calls.append(ApiEvent(name, span, "cuda_runtime", int(args.get("correlation", -1)),
                                            int(ev.get("tid", 0)) if str(ev.get("tid", "0")).isdigit() else 0))
        elif cat == "user_annotation" and name.startswith(_RUN_NAMES):
            trace.runs.append(span)
        elif cat == "user_annotation":
            ranges.append((ev, span))
    if not raw_ops and not ranges and not trace.kernels:
        raise ProfileFormatError(path, "no operator or kernel events: not a PyTorch profiler trace, or "
                                       "the profiled region ran nothing")
    trace.runs.sort(key=lambda s: s.start_us)
    trace.ops = _outermost(raw_ops, ranges, trace.runs)
    trace.kernels.sort(key=lambda k: k.span.start_us)
    trace.api_calls.sort(key=lambda a: a.span.start_us)
    return trace


def _outermost(raw: list[tuple[dict, Span]], ranges: list[tuple[dict, Span]], runs: list[Span]) -> list[OpEvent]:
    """Keep the layer ranges and the operators not contained in another range or operator of
    the same thread; a range takes the name of the first outermost operator inside it as its op."""
    # at equal start and length a range encloses the operator, so it sorts first
    items = [(ev, span, True) for ev, span in ranges] + [(ev, span, False) for ev, span in raw]
    items.sort(key=lambda e: (str(e[0].get("tid")), e[1].start_us, -e[1].dur_us, not e[2]))
    kept: list[tuple[dict, Span, dict | None]] = []  # (event, span, first operator inside a range)
    open_end: dict[str, float] = {}
    open_range: dict[str, int] = {}  # thread → index in kept of its enclosing range
    for ev, span, is_range in items:
        tid = str(ev.get("tid"))
        if span.start_us < open_end.get(tid, float("-inf")):
            k = open_range.get(tid)
            if not is_range and k is not None and kept[k][2] is None:
                kept[k] = (kept[k][0], kept[k][1], ev)
            continue
        open_end[tid] = span.end_us
        if is_range:
            open_range[tid] = len(kept)
        else:
            open_range.pop(tid, None)
        kept.append((ev, span, None))
    out = []
    for ev, span, inner in kept:
        op_ev = inner if inner is not None else ev
        args = op_ev.get("args") or {}
        is_range = str(ev.get("cat", "")).lower() == "user_annotation"
        op = str(op_ev.get("name", "")) if (inner is not None or not is_range) else ""
        run = next((i for i, r in enumerate(runs) if r.start_us <= span.start_us <= r.end_us), -1)
        out.append(OpEvent(name=str(ev.get("name", "")), op=op, span=span, run=run,
                           input_shapes=_dims(args.get("Input Dims")), provider="cpu",
                           thread=int(ev["tid"]) if isinstance(ev.get("tid"), int) else 0))
    out.sort(key=lambda o: o.span.start_us)
    return out
