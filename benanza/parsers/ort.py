"""ONNX Runtime profiler JSON (``SessionOptions.enable_profiling``).

The file is a Chrome-trace array. ``cat: "Session"`` events mark ``model_run`` per inference;
``cat: "Node"`` events named ``<node>_kernel_time`` carry each kernel's op type, execution
provider and tensor shapes (older releases also emit ``_fence_before``/``_fence_after``,
which are bookkeeping, not work).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from pathlib import Path

from .base import FrameworkTrace, OpEvent, ProfileFormatError, Span, load_json

_SUFFIX = "_kernel_time"
# ONNX Runtime names a node its NCHWc transform rewrote after its output plus this suffix
NCHWC_SUFFIX = "_nchwc"


def _shapes(items: Iterable[object] | None) -> tuple[tuple[int, ...], ...]:
    out = []
    for item in items or []:
        if isinstance(item, dict):
            for dims in item.values():
                out.append(tuple(int(d) for d in dims))
    return tuple(out)


def parse_ort_profile(path: str | Path) -> FrameworkTrace:
    data = load_json(path, "ONNX Runtime profile")
    if isinstance(data, dict) and "traceEvents" in data:
        data = data["traceEvents"]
    if not isinstance(data, list):
        raise ProfileFormatError(path, "not an ONNX Runtime profile: expected a JSON array of events")
    runs: list[Span] = []
    nodes: list[dict] = []
    for i, ev in enumerate(data):
        if not isinstance(ev, dict) or "name" not in ev or "ts" not in ev:
            raise ProfileFormatError(path, f"event {i} is not a trace event (needs name and ts)")
        if ev.get("cat") == "Session" and ev["name"] == "model_run":
            runs.append(Span(float(ev["ts"]), float(ev.get("dur", 0))))
        elif ev.get("cat") == "Node" and str(ev["name"]).endswith(_SUFFIX):
            nodes.append(ev)
    if not runs and not nodes:
        raise ProfileFormatError(path, "no model_run or node events: not an ONNX Runtime profile, "
                                       "or profiling ended before any inference")
    runs.sort(key=lambda s: s.start_us)
    starts = [r.start_us for r in runs]
    ops = []
    for ev in nodes:
        args = ev.get("args") or {}
        ts = float(ev["ts"])
        k = bisect.bisect_right(starts, ts) - 1
        run = k if k >= 0 and ts <= runs[k].end_us else -1
        ops.append(OpEvent(
            name=str(ev["name"])[: -len(_SUFFIX)],
            op=str(args.get("op_name", "")),
            span=Span(ts, float(ev.get("dur", 0))),
            run=run,
            input_shapes=_shapes(args.get("input_type_shape")),
            output_shapes=_shapes(args.get("output_type_shape")),
            provider=str(args.get("provider", "")),
            thread=int(ev.get("tid", 0)),
        ))
    ops.sort(key=lambda o: o.span.start_us)
    return FrameworkTrace(path=str(path), framework="onnxruntime", runs=runs, ops=ops, threads=_threads(nodes))


def _threads(nodes: list[dict]) -> int | None:
    """The session's intra-op threads, as ORT's own thread-pool statistics give them: a node's
    ``thread_scheduling_stats`` name the pool's calling thread and each of its other threads, and
    are empty text in a session of one thread, which has no pool. None: the profile has none
    (releases before 1.10 record no statistics)."""
    found = None
    for ev in nodes:
        stats = (ev.get("args") or {}).get("thread_scheduling_stats")
        if stats == "":
            found = max(found or 1, 1)
        elif isinstance(stats, dict) and isinstance(stats.get("sub_threads"), dict):
            found = max(found or 1, 1 + len(stats["sub_threads"]))
    return found
