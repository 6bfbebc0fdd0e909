"""PyTorch backend: every unique layer, and every fusion pattern, through the kernels PyTorch runs.

A framework's bound, not a vendor library's: each layer is its model's own ONNX node (a fusion
pattern: its subgraph), cut out of the model as the ``onnxruntime`` backend cuts it, and run by
``benanza.torch_exec``, the eager executor ``profile --framework torch`` runs whole models with:
the same ``torch`` / ``torch.nn.functional`` calls a torch model makes for those nodes. Variants
are the choices a torch user has (docs/backends.md):

- ``algo``: ``onednn`` (torch's default: ``torch.backends.mkldnn`` enabled, so convolutions and
  linear layers may go to the oneDNN torch bundles) or ``native`` (disabled: torch's own kernels),
  for the convolution and GEMM layers torch can send to oneDNN; ``default`` for the others;
- ``layout``: ``nchw`` (contiguous) or ``nhwc`` (``torch.channels_last``) for 4-D data, ``plain``
  below;
- ``dtype``: the model's, plus ``bf16`` for an f32 layer: by default where torch says this CPU
  runs oneDNN in bf16 (its own check, never a table of CPUs); on a CPU without (AVX2 only) when
  asked for with ``--dtype bf16``. There oneDNN takes no bf16 work, and torch runs its own bf16
  kernels, which convert to f32 and back around f32 arithmetic (a convolution over 100 times
  slower than in f32): measured only on request, the ``native``/``default`` variants alone, so a
  default run is not slowed by a choice no user makes for speed on that CPU.

Time is the kernels' own, never Python's wall time around a call: a node that called oneDNN
is timed by oneDNN's verbose execution times (``ONEDNN_VERBOSE`` switched on in-process for the
timed calls, its lines parsed by ``benanza.parsers.onednn_verbose``), all of its primitives
(the reorders torch does per call around a blocked-layout kernel included: they are that layer's
cost in every torch model; their share is the ``reorder_ms`` counter); any other node by the
torch profiler's time of the aten ops it called.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import os
import re
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..layers import Layer, Model, UniqueLayer
from ..parsers.onednn_verbose import parse_onednn_text
from ..problems import ConvProblem, DeconvProblem, GemmProblem, MatMulProblem
from ..records import Dtype, Variant
from .base import Device, SubgraphBackend
from .inprocess import Evictor, Refused, result_line, serve, timed_calls
from .ort import write_subgraphs

if TYPE_CHECKING:
    import jinja2

    from ..generator import GenOptions
    from ..manifest import Manifest

NAME = "torch"
DTYPES = ("f32", "bf16")
LAYOUTS = ("nchw", "nhwc")  # contiguous, channels_last (4-D data; "plain" below)
# the layers torch can run through oneDNN or its own kernels, as torch.backends.mkldnn says
ONEDNN_PROBLEMS = (ConvProblem, DeconvProblem, GemmProblem, MatMulProblem)
THREADS_ENV = "BENANZA_TORCH_THREADS"
WARMUP_CALLS = 3
MAX_CALLS = 2000  # per repetition: the profiler keeps every event of the timed calls in memory
NODE_MARK = "BENANZA_NODE_DONE"


@functools.cache
def bf16_supported() -> bool:
    """Whether torch runs oneDNN in bf16 on this CPU (its own check of the CPU's ISA)."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def _algos(layer: Layer, dtype: str) -> tuple[str, ...]:
    """oneDNN on or off where torch can send the layer to oneDNN: in bf16 only where it does on
    this CPU (elsewhere both would run torch's own kernels)."""
    if not isinstance(layer.problem, ONEDNN_PROBLEMS):
        return ("default",)
    return ("onednn", "native") if dtype != "bf16" or bf16_supported() else ("native",)


def _own_layout(layer: Layer) -> str:
    return "nchw" if any(len(t.shape) == 4 for t in layer.inputs) else "plain"


class TorchBackend(SubgraphBackend):
    name = NAME
    dtypes = DTYPES
    layouts = LAYOUTS
    device = Device.CPU
    vendor = "onednn"
    package = "torch"
    threads_env = THREADS_ENV

    def covers(self, layer: Layer) -> bool:
        """torch runs every node torch_exec maps (one it does not is stored unsupported at run
        time, with the executor's reason): every layer that computes something is covered."""
        return not layer.free

    def variants(self, unique: UniqueLayer, fusions: tuple[str, ...], options: GenOptions) -> list[Variant]:
        layer = unique.layer
        if not self.covers(layer):
            return []
        bf16 = layer.dtype == "f32" and (bf16_supported() or "bf16" in options.dtypes)
        dtypes = [layer.dtype, *(["bf16"] if bf16 else [])]
        dtypes = [d for d in dtypes if not options.dtypes or d in options.dtypes]
        own = _own_layout(layer)
        layouts = [own] if own == "plain" else [lay for lay in LAYOUTS if not options.layouts or lay in options.layouts]
        return [Variant(layer.problem, NAME, layer.op, algo, dtype, layout, "default", fusion)
                for fusion in ("none", *fusions) for dtype in dtypes for layout in layouts
                for algo in _algos(layer, dtype)]

    def render(self, manifest: Manifest, variants: list[Variant], env: jinja2.Environment,
               out_dir: Path, options: GenOptions, models: Sequence[Model] = ()) -> list[Path]:
        return write_subgraphs(NAME, variants, models, out_dir,
                               lambda v: {"algo": v.algo, "dtype": str(v.dtype), "layout": str(v.layout)},
                               _sites)

    def outputs(self, path: Path, entry: dict[str, str], feeds: dict[str, Any], threads: int) -> list[Any]:
        import torch

        from ..torch_exec import UnsupportedOpError

        torch.set_num_threads(threads)
        try:
            graph, feed = _prepared(path, entry["algo"], entry["dtype"], entry["layout"], feeds)
        except UnsupportedOpError as exc:
            raise Refused(str(exc)) from None
        with torch.backends.mkldnn.flags(enabled=entry["algo"] != "native"), torch.no_grad():
            return [t.float().contiguous().numpy() for t in graph.run(feed, annotate=False)]

    def ran(self, variant: Variant, op: str) -> bool:
        # `benanza profile --framework torch` runs the model as given (contiguous tensors) with
        # torch's defaults (oneDNN enabled): what a torch user gets without choosing
        return variant.algo != "native" and variant.layout != "nhwc"

    def stack_overrides(self, context: dict | None) -> dict[str, str]:
        # the child runs this interpreter's torch: a dry run knows its versions too
        custom = context["custom"] if context is not None else _context(0)["custom"]
        return {k: str(custom[v]) for k, v in (("torch", "torch_version"), ("onednn", "onednn_version"))
                if custom.get(v)}


def _sites(v: Variant) -> tuple[Variant, ...]:
    """A bf16 variant of an f32 layer runs the model's f32 subgraph cast to bf16."""
    if v.dtype != "bf16":
        return (v,)
    return (v, dataclasses.replace(v, dtype=Dtype.F32))


BACKEND = TorchBackend()


# --- the measuring child ---------------------------------------------------------------------

def _context(threads: int) -> dict[str, Any]:
    import torch

    from ..system import cpu_model

    # torch names the oneDNN it bundles only in its build configuration ("MKL-DNN v3.12.0")
    m = re.search(r"MKL-DNN v(\d+(?:\.\d+)+)", torch.__config__.show())
    return {"cpu_model": cpu_model(), "num_cpus": os.cpu_count(),
            "custom": {"backend": NAME, "torch_version": torch.__version__,
                       "onednn_version": m.group(1) if m else "", "intra_op_threads": threads,
                       "bf16": bf16_supported()}}


@dataclass(frozen=True)
class _Timed:
    """The per-call kernel times of one benchmark, in ms, by repetition."""

    reps: list[list[float]]
    reorder_ms: list[float]  # the oneDNN reorders among them, per call
    kernels: str  # what ran, node by node: oneDNN's implementation, or the aten op that took longest


def _prepared(path: Path, algo: str, dtype: str, layout: str,
              feeds: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
    """The subgraph as torch_exec runs it, its constants and inputs (``feeds``' numpy arrays, or
    the executor's random ones) in the variant's dtype and memory format."""
    import torch

    from ..torch_exec import load_torch_graph

    if dtype == "bf16" and algo == "onednn" and not bf16_supported():  # a project generated on another CPU
        raise Refused("torch runs no oneDNN bf16 kernels on this CPU (torch.ops.mkldnn._is_mkldnn_bf16_supported)")

    def cast(t: Any) -> Any:
        if dtype == "bf16" and t.dtype.is_floating_point:
            t = t.to(torch.bfloat16)
        return t.contiguous(memory_format=torch.channels_last) if layout == "nhwc" and t.dim() == 4 else t

    graph = load_torch_graph(path)
    graph = dataclasses.replace(graph, constants={k: cast(t) for k, t in graph.constants.items()})
    inputs = {k: torch.from_numpy(v) for k, v in feeds.items()} if feeds is not None else graph.random_inputs()
    return graph, {k: cast(t) for k, t in inputs.items()}


def _measure(path: Path, entry: dict[str, str], min_time: float, repetitions: int, evict: Evictor | None) -> _Timed:
    import torch

    graph, feed = _prepared(path, entry["algo"], entry["dtype"], entry["layout"])
    libc = ctypes.CDLL(None)

    def mark(node: Any) -> None:
        # oneDNN prints through C's stdout: flush it, so the mark follows the node's own lines
        libc.fflush(None)
        os.write(1, f"{NODE_MARK}\n".encode())

    def logged(calls: Any, profiled: bool) -> tuple[str, list[Any], Any]:
        """``calls()`` with oneDNN's verbose log on (and the torch profiler where ``profiled``):
        the log's text, the profiler's events, what ``calls`` returned."""
        with tempfile.TemporaryFile("w+b") as log:
            sys.stdout.flush()
            saved = os.dup(1)
            os.dup2(log.fileno(), 1)  # the verbose lines and the marks go to the log, not the protocol
            try:
                with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON), \
                        (torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) if profiled
                         else contextlib.nullcontext()) as prof:
                    out = calls()
            finally:
                libc.fflush(None)
                os.dup2(saved, 1)
                os.close(saved)
            log.seek(0)
            return log.read().decode(errors="replace"), list(prof.events()) if prof is not None else [], out

    nodes = [n.name for n in graph.nodes]
    with torch.backends.mkldnn.flags(enabled=entry["algo"] != "native"), torch.no_grad():
        for _ in range(WARMUP_CALLS):
            graph.run(feed, annotate=False)
        # the profiler only where a node makes no oneDNN call: its event memory grows in every
        # call and takes the heap's freed blocks, so the kernels' buffers land on fresh pages and
        # fault (docs/profile.md), time that is not the kernels'
        probe, _, _ = logged(lambda: graph.run(feed, annotate=False, after=mark), False)
        profiled = not all(parse_onednn_text(seg, str(path)) for seg in probe.split(f"{NODE_MARK}\n")[:-1])
        text, events, counts = logged(lambda: timed_calls(lambda: graph.run(feed, annotate=profiled, after=mark),
                                                          min_time, repetitions, MAX_CALLS, evict, feed.values()),
                                      profiled)
    return _per_call(text, events, nodes, counts, str(path))


def _per_call(text: str, events: list[Any], nodes: list[str], counts: list[int], origin: str) -> _Timed:
    """Each call's kernel time: per node, the sum of its oneDNN calls' execution times (the
    lines between its marks), or, where it made none, the profiler's time of the aten ops it
    called (the children of its ``record_function`` range; ``events`` is empty where the calls
    ran without the profiler, every node calling oneDNN)."""
    calls = sum(counts)
    segments = text.split(f"{NODE_MARK}\n")
    if len(segments) != calls * len(nodes) + 1:
        raise RuntimeError(f"the verbose log holds {len(segments) - 1} node marks, {calls * len(nodes)} were made")
    ranges: dict[str, list[Any]] = {name: [] for name in nodes}
    for e in events:
        if e.name in ranges and e.cpu_parent is None:
            ranges[e.name].append(e)
    for name, found in ranges.items():
        if events and len(found) != calls:
            raise RuntimeError(f"the profile holds {len(found)} ranges of node {name!r}, {calls} calls were made")
        found.sort(key=lambda e: e.time_range.start)
    kernel, reorder = [0.0] * calls, [0.0] * calls
    ran: dict[str, None] = {}
    for c in range(calls):
        for j, name in enumerate(nodes):
            onednn = parse_onednn_text(segments[c * len(nodes) + j], origin)
            if onednn:
                kernel[c] += sum(x.time_ms or 0.0 for x in onednn)
                reorder[c] += sum(x.time_ms or 0.0 for x in onednn if x.api == "reorder")
                if c == 0:
                    ran.update(dict.fromkeys(x.algo for x in onednn if x.api != "reorder"))
                continue
            if not events:
                raise RuntimeError(f"node {name!r} made no oneDNN call in call {c + 1}, though it made some when "
                                   f"probed, and the calls ran without the profiler: no time for it")
            ev = ranges[name][c]
            kernel[c] += sum(ch.time_range.elapsed_us() for ch in ev.cpu_children) / 1e3
            if c == 0:
                ops = _descendants(ev)
                if ops:
                    ran.setdefault(max(ops, key=lambda d: d.self_cpu_time_total).name)
    timed, at = [], 0
    for n in counts:
        timed.append(kernel[at:at + n])
        at += n
    return _Timed(timed, reorder, "+".join(ran))


def _descendants(event: Any) -> list[Any]:
    out = []
    for ch in event.cpu_children:
        out += [ch, *_descendants(ch)]
    return out


def _measure_entry(project: Path, name: str, entry: dict[str, str], threads: int, min_time: float,
                   repetitions: int, evict: Evictor | None) -> dict[str, Any]:
    import numpy as np

    from ..torch_exec import UnsupportedOpError

    try:
        t = _measure(project / entry["model"], entry, min_time, repetitions, evict)
    except UnsupportedOpError as exc:
        raise Refused(str(exc)) from None
    return result_line(name, t.reps, t.kernels, {"reorder_ms": float(np.median(t.reorder_ms))},
                       "its kernels ran below the timers' resolution in most calls: no time to store")


def main(argv: list[str]) -> int:
    import torch

    threads = int(os.environ.get(THREADS_ENV, "1"))
    if threads > 0:
        torch.set_num_threads(threads)
    return serve(argv, THREADS_ENV, _context, _measure_entry)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
