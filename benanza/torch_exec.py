"""Benanza's eager executor of ONNX graphs in PyTorch, for ``benanza profile --framework torch``.

Converters (onnx2torch) build an ``nn.Module`` whose profiler trace speaks in ``aten::`` ops
that cannot be mapped back to ONNX layers, and they pull in torchvision. This executor runs
the graph node by node with ``torch`` / ``torch.nn.functional`` calls instead, each node
inside ``torch.profiler.record_function(<layer name>)``, so the Kineto trace names every
range exactly as ``benanza.processor`` names the layer. On CPU, torch runs its convolutions
through oneDNN, so the same run also yields the oneDNN verbose log Q3/Q4 compare against.

Layer names and order come from ``processor.load_model`` (the one naming rule); nodes the
processor folds as constants (Constant, ConstantOfShape, Identity/Cast of constants) are
evaluated once here at load, as the processor treats them as weights.
"""

from __future__ import annotations

import functools
import logging
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from .errors import BenanzaError, ModelError
from .ops.conv import AUTO_PAD_MODES, explicit_pads
from .processor import attrs_with_defaults, default_opset, load_model, read_onnx

log = logging.getLogger(__name__)

try:  # torch is optional: `pip install 'benanza[torch]'`
    import torch
    import torch.nn.functional as F
except ImportError:  # pragma: no cover - exercised where torch is absent
    torch = None  # type: ignore[assignment]
    F = None  # type: ignore[assignment]

Tensor = Any  # torch.Tensor, when torch is importable
Value = Any  # Tensor or None (an omitted optional input)


class UnsupportedOpError(BenanzaError):
    """A node the executor does not implement (or an attribute value it does not handle)."""


@dataclass(frozen=True)
class Ctx:
    """What an op implementation sees besides its inputs."""

    name: str
    op: str
    attrs: dict[str, Any]
    opset: int
    n_outputs: int

    def unsupported(self, what: str) -> UnsupportedOpError:
        return UnsupportedOpError(f"torch executor: node {self.name!r} ({self.op}): {what}")


OpFn = Callable[[Ctx, list[Value]], Any]


@dataclass(frozen=True)
class ExecNode:
    name: str
    op: str
    inputs: tuple[str, ...]  # "" for an omitted optional input
    outputs: tuple[str, ...]  # "" for an unused optional output
    ctx: Ctx
    fn: OpFn


@dataclass
class TorchGraph:
    """An ONNX graph ready to run eagerly in torch; ``run`` returns the graph outputs in order."""

    name: str
    nodes: list[ExecNode]
    constants: dict[str, Tensor]
    inputs: tuple[tuple[str, tuple[int, ...], np.dtype], ...]  # real inputs with concrete shapes
    outputs: tuple[str, ...]
    device: str = "cpu"
    _last_use: dict[str, int] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        # drop activations once their last consumer ran: deep models would otherwise hold them all
        for k, n in enumerate(self.nodes):
            for t in n.inputs:
                if t:
                    self._last_use[t] = k

    def run(self, feed: dict[str, Tensor], annotate: bool = True,
            after: Callable[[ExecNode], None] | None = None) -> list[Tensor]:
        """Execute every node in order; with ``annotate`` each runs inside a profiler range
        named after its layer (the ranges cost a little, so timing runs may leave them out);
        ``after(node)`` is called once each node returned (the torch backend marks there where
        a node's oneDNN calls end)."""
        env: dict[str, Tensor] = dict(self.constants)
        for name, _, _ in self.inputs:
            if name not in feed:
                raise BenanzaError(f"torch executor: graph input {name!r} missing from the feed")
            env[name] = feed[name]
        keep = set(self.outputs)
        for k, node in enumerate(self.nodes):
            args = [env[t] if t else None for t in node.inputs]
            if annotate:
                with torch.profiler.record_function(node.name):
                    result = node.fn(node.ctx, args)
            else:
                result = node.fn(node.ctx, args)
            if after is not None:
                after(node)
            results = result if isinstance(result, (tuple, list)) else (result,)
            for t, v in zip(node.outputs, results):
                if t:
                    env[t] = v
            for t in node.inputs:
                if t and self._last_use.get(t) == k and t not in keep and t not in self.constants:
                    env.pop(t, None)
        return [env[t] for t in self.outputs]

    def random_inputs(self, seed: int = 0) -> dict[str, Tensor]:
        """Deterministic random inputs of the graph's shapes: floats in [0, 1), ints in {0, 1}."""
        rng = np.random.default_rng(seed)
        feed = {}
        for name, shape, dtype in self.inputs:
            arr = (rng.random(shape) if np.issubdtype(dtype, np.floating)
                   else rng.integers(0, 2, shape)).astype(dtype)
            feed[name] = torch.from_numpy(arr).to(self.device)
        return feed


def require_torch() -> None:
    if torch is None:
        raise BenanzaError("torch is not installed: pip install torch")


def load_torch_graph(source: str | Path | onnx.ModelProto, batch_size: int = 1,
                     input_shapes: dict[str, tuple[int, ...]] | None = None,
                     device: str = "cpu") -> TorchGraph:
    """Load an ONNX model (weights as torch tensors) into a ``TorchGraph``.

    Every op is checked here, so an unimplemented one fails before anything runs.
    """
    require_torch()
    if isinstance(source, onnx.ModelProto):
        proto, path, base_dir = source, Path("<in-memory model>"), ""
    else:
        path = Path(source)
        proto = read_onnx(path)  # clear errors for missing / non-ONNX files
        base_dir = os.path.dirname(os.path.abspath(path))
    model = load_model(proto, batch_size, input_shapes, name=None if isinstance(source, onnx.ModelProto)
                       else path.stem, take_branches=False)  # its nodes map onto the file's graph
    opset = default_opset(proto)
    graph = proto.graph
    constants: dict[str, Tensor] = {}
    for t in graph.initializer:
        constants[t.name] = _tensor(numpy_helper.to_array(t, base_dir), device)
    by_output = {o: n for n in graph.node for o in n.output if o}
    layer_protos = [by_output[n.outputs[0]] for n in model.nodes]
    layer_ids = {id(p) for p in layer_protos}
    _fold_constants([n for n in graph.node if id(n) not in layer_ids], constants, opset, path)
    nodes = [_exec_node(p, n.name, opset) for p, n in zip(layer_protos, model.nodes)]
    inputs = tuple((name, shape, _input_dtype(graph, name)) for name, shape in model.input_shapes.items())
    return TorchGraph(model.name, nodes, constants, inputs, tuple(o.name for o in graph.output), device)


def _tensor(arr: np.ndarray, device: str) -> Tensor:
    return torch.from_numpy(np.array(arr, copy=True)).to(device)


def _input_dtype(graph: onnx.GraphProto, name: str) -> np.dtype:
    vi = next(i for i in graph.input if i.name == name)
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type))


def _exec_node(proto: onnx.NodeProto, name: str, opset: int) -> ExecNode:
    fn = OPS.get(proto.op_type) if proto.domain in ("", "ai.onnx") else None
    if fn is None:
        domain = f" of domain {proto.domain!r}" if proto.domain not in ("", "ai.onnx") else ""
        raise UnsupportedOpError(f"torch executor: node {name!r}: op {proto.op_type}{domain} is not implemented")
    ctx = Ctx(name, proto.op_type, attrs_with_defaults(proto, opset), opset, len(proto.output))
    return ExecNode(name, proto.op_type, tuple(proto.input), tuple(proto.output), ctx, fn)


def _fold_constants(protos: list[onnx.NodeProto], constants: dict[str, Tensor], opset: int, path: Path) -> None:
    """Evaluate the nodes the processor folds as constants; they depend only on constants."""
    pending = list(protos)
    while pending:
        ready = [p for p in pending if all(not i or i in constants for i in p.input)]
        if not ready:
            raise ModelError(path, f"constant node {pending[0].name or pending[0].op_type!r} depends on "
                                   f"tensors that are not constants")
        for p in ready:
            node = _exec_node(p, p.name or p.op_type, opset)
            out = node.fn(node.ctx, [constants[i] if i else None for i in p.input])
            for t, v in zip(p.output, out if isinstance(out, (tuple, list)) else (out,)):
                if t:
                    constants[t] = v
        pending = [p for p in pending if p not in ready]


# --- helpers ----------------------------------------------------------------------------------


def _ints(v: Value) -> list[int]:
    return [int(x) for x in v.reshape(-1).tolist()]


def _axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def _axes_arg(ctx: Ctx, x: list[Value], index: int, since: int) -> list[int] | None:
    """Axes given as an attribute before opset ``since`` and as input ``index`` from it on."""
    if ctx.opset >= since:
        return _ints(x[index]) if len(x) > index and x[index] is not None else None
    axes = ctx.attrs.get("axes")
    return [int(a) for a in axes] if axes is not None else None


def _torch_pad(pads: Sequence[int]) -> list[int]:
    """ONNX pads (x1_begin, x2_begin, …, x1_end, x2_end, …) → F.pad order (last dim first)."""
    n = len(pads) // 2
    out: list[int] = []
    for d in reversed(range(n)):
        out += [pads[d], pads[d + n]]
    return out


def _spatial_pads(ctx: Ctx, x: Tensor, kernel: Sequence[int], strides: Sequence[int],
                  dilations: Sequence[int]) -> list[int]:
    """Explicit begin/end pads, resolved by the same rule the processor's layer keys use."""
    mode = ctx.attrs.get("auto_pad", "NOTSET")
    if mode not in AUTO_PAD_MODES + ("",):
        raise ctx.unsupported(f"auto_pad {mode!r}")
    return explicit_pads(ctx.attrs, x.shape[2:], kernel, strides, dilations)


def _symmetric(pads: Sequence[int]) -> list[int] | None:
    n = len(pads) // 2
    return list(pads[:n]) if list(pads[:n]) == list(pads[n:]) else None


# --- op implementations -----------------------------------------------------------------------


def _conv(ctx: Ctx, x: list[Value]) -> Tensor:
    inp, w, b = x[0], x[1], x[2] if len(x) > 2 else None
    n = w.dim() - 2
    if n not in (1, 2, 3):
        raise ctx.unsupported(f"{n}-d convolution")
    kernel = list(ctx.attrs.get("kernel_shape") or w.shape[2:])
    strides = list(ctx.attrs.get("strides") or [1] * n)
    dilations = list(ctx.attrs.get("dilations") or [1] * n)
    pads = _spatial_pads(ctx, inp, kernel, strides, dilations)
    same = _symmetric(pads)
    if same is None:  # torch's conv takes one pad per side pair: pad asymmetric inputs first
        inp, same = F.pad(inp, _torch_pad(pads)), [0] * n
    conv = (F.conv1d, F.conv2d, F.conv3d)[n - 1]
    return conv(inp, w, b, strides, same, dilations, int(ctx.attrs.get("group", 1)))


def _pool_geometry(ctx: Ctx, x: Tensor) -> tuple[list[int], list[int], list[int], list[int]]:
    kernel = list(ctx.attrs["kernel_shape"])
    n = len(kernel)
    strides = list(ctx.attrs.get("strides") or [1] * n)
    dilations = list(ctx.attrs.get("dilations") or [1] * n)
    return kernel, strides, dilations, _spatial_pads(ctx, x, kernel, strides, dilations)


def _max_pool(ctx: Ctx, x: list[Value]) -> Tensor:
    if ctx.n_outputs > 1:
        raise ctx.unsupported("the Indices output")
    inp = x[0]
    kernel, strides, dilations, pads = _pool_geometry(ctx, inp)
    n = len(kernel)
    same = _symmetric(pads)
    if same is None or any(p > k // 2 for p, k in zip(same, kernel)):
        inp, same = F.pad(inp, _torch_pad(pads), value=-math.inf), [0] * n
    pool = (F.max_pool1d, F.max_pool2d, F.max_pool3d)[n - 1]
    return pool(inp, kernel, strides, same, dilations, ceil_mode=bool(ctx.attrs.get("ceil_mode", 0)))


def _avg_pool(ctx: Ctx, x: list[Value]) -> Tensor:
    inp = x[0]
    kernel, strides, dilations, pads = _pool_geometry(ctx, inp)
    if any(d != 1 for d in dilations):
        raise ctx.unsupported("dilated average pooling")
    n = len(kernel)
    pool = (F.avg_pool1d, F.avg_pool2d, F.avg_pool3d)[n - 1]
    ceil = bool(ctx.attrs.get("ceil_mode", 0))
    include = bool(ctx.attrs.get("count_include_pad", 0))
    same = _symmetric(pads)
    if same is not None and all(p <= k // 2 for p, k in zip(same, kernel)):
        return pool(inp, kernel, strides, same, ceil_mode=ceil, count_include_pad=include)
    padded = F.pad(inp, _torch_pad(pads))
    total = pool(padded, kernel, strides, 0, ceil_mode=ceil)
    if include:
        return total
    # average over the real elements only: divide by the share of the window inside the input
    mask = F.pad(torch.ones_like(inp[:1, :1]), _torch_pad(pads))
    return total / pool(mask, kernel, strides, 0, ceil_mode=ceil)


def _global_avg(ctx: Ctx, x: list[Value]) -> Tensor:
    return x[0].mean(dim=tuple(range(2, x[0].dim())), keepdim=True)


def _global_max(ctx: Ctx, x: list[Value]) -> Tensor:
    return x[0].amax(dim=tuple(range(2, x[0].dim())), keepdim=True)


def _batch_norm(ctx: Ctx, x: list[Value]) -> Tensor:
    if ctx.n_outputs > 1 and ctx.attrs.get("training_mode", 0):
        raise ctx.unsupported("training mode")
    inp, scale, bias, mean, var = x[:5]
    return F.batch_norm(inp, mean, var, scale, bias, False, 0.0, float(ctx.attrs.get("epsilon", 1e-5)))


def _lrn(ctx: Ctx, x: list[Value]) -> Tensor:
    inp = x[0]
    size, alpha = int(ctx.attrs["size"]), float(ctx.attrs.get("alpha", 1e-4))
    beta, bias = float(ctx.attrs.get("beta", 0.75)), float(ctx.attrs.get("bias", 1.0))
    if size % 2 == 1:  # torch's window equals ONNX's for odd sizes
        return F.local_response_norm(inp, size, alpha, beta, bias)
    # even size: ONNX puts the extra channel after c, torch before
    sq = F.pad((inp * inp).unsqueeze(1), [0, 0] * (inp.dim() - 2) + [(size - 1) // 2, size // 2])
    window = sq.unfold(2, size, 1).sum(-1).squeeze(1)
    return inp / (bias + alpha / size * window) ** beta


def _gemm(ctx: Ctx, x: list[Value]) -> Tensor:
    a, b = x[0], x[1]
    c = x[2] if len(x) > 2 else None
    alpha, beta = float(ctx.attrs.get("alpha", 1.0)), float(ctx.attrs.get("beta", 1.0))
    if ctx.attrs.get("transA", 0):
        a = a.t()
    if ctx.attrs.get("transB", 0) and alpha == 1.0 and beta == 1.0 and c is not None and c.dim() <= 1:
        return F.linear(a, b, c)  # what a torch model's nn.Linear runs
    if ctx.attrs.get("transB", 0):
        b = b.t()
    if c is None:
        return alpha * (a @ b)
    return torch.addmm(c, a, b, beta=beta, alpha=alpha)


def _div(ctx: Ctx, x: list[Value]) -> Tensor:
    a, b = x
    if a.dtype.is_floating_point:
        return a / b
    return torch.div(a, b, rounding_mode="trunc")  # ONNX integer division truncates


def _variadic(op: Callable[[Tensor, Tensor], Tensor]) -> OpFn:
    def fn(ctx: Ctx, x: list[Value]) -> Tensor:
        out = x[0]
        for v in x[1:]:
            out = op(out, v)
        return out
    return fn


def _mean(ctx: Ctx, x: list[Value]) -> Tensor:
    return _variadic(torch.add)(ctx, x) / len(x)


def _clip(ctx: Ctx, x: list[Value]) -> Tensor:
    if ctx.opset < 11:
        lo, hi = ctx.attrs.get("min"), ctx.attrs.get("max")
    else:
        lo = x[1].item() if len(x) > 1 and x[1] is not None else None
        hi = x[2].item() if len(x) > 2 and x[2] is not None else None
    return torch.clamp(x[0], lo, hi)


def _prelu(ctx: Ctx, x: list[Value]) -> Tensor:
    inp, slope = x
    return torch.where(inp < 0, inp * slope, inp)  # ONNX broadcasts the slope unidirectionally


def _softmax(fn: Callable[..., Tensor]) -> OpFn:
    def op(ctx: Ctx, x: list[Value]) -> Tensor:
        inp = x[0]
        if ctx.opset >= 13:
            return fn(inp, dim=int(ctx.attrs.get("axis", -1)))
        # before opset 13 the input is coerced to 2-D at axis and normalised over the second dim
        axis = _axis(int(ctx.attrs.get("axis", 1)), inp.dim())
        flat = inp.reshape(math.prod(inp.shape[:axis]), -1)
        return fn(flat, dim=1).reshape(inp.shape)
    return op


def _flatten(ctx: Ctx, x: list[Value]) -> Tensor:
    inp = x[0]
    axis = _axis(int(ctx.attrs.get("axis", 1)), inp.dim())
    return inp.reshape(math.prod(inp.shape[:axis]), -1)


def _reshape(ctx: Ctx, x: list[Value]) -> Tensor:
    inp, shape = x[0], _ints(x[1])
    if not ctx.attrs.get("allowzero", 0):  # 0 copies the input's dim at that position
        shape = [inp.shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return inp.reshape(shape)


def _unsqueeze(ctx: Ctx, x: list[Value]) -> Tensor:
    inp = x[0]
    axes = _axes_arg(ctx, x, 1, 13)
    if axes is None:
        raise ctx.unsupported("no axes")
    rank = inp.dim() + len(axes)
    for a in sorted(_axis(a, rank) for a in axes):
        inp = inp.unsqueeze(a)
    return inp


def _squeeze(ctx: Ctx, x: list[Value]) -> Tensor:
    inp = x[0]
    axes = _axes_arg(ctx, x, 1, 13)
    if axes is None:
        return inp.squeeze()
    keep = {_axis(a, inp.dim()) for a in axes}
    return inp.reshape([d for i, d in enumerate(inp.shape) if i not in keep])


def _transpose(ctx: Ctx, x: list[Value]) -> Tensor:
    perm = ctx.attrs.get("perm") or list(reversed(range(x[0].dim())))
    return x[0].permute(*perm)


def _concat(ctx: Ctx, x: list[Value]) -> Tensor:
    return torch.cat(_one_device(*(v for v in x if v is not None)), dim=int(ctx.attrs["axis"]))


def _dropout(ctx: Ctx, x: list[Value]) -> Any:
    # inference: identity; the optional mask output is all true
    return (x[0], torch.ones_like(x[0], dtype=torch.bool)) if ctx.n_outputs > 1 else x[0]


def _identity(ctx: Ctx, x: list[Value]) -> Tensor:
    return x[0]


_NP_TO_TORCH_CACHE: dict[int, Any] = {}


def _torch_dtype(onnx_type: int) -> Any:
    if onnx_type not in _NP_TO_TORCH_CACHE:
        np_type = onnx.helper.tensor_dtype_to_np_dtype(onnx_type)
        _NP_TO_TORCH_CACHE[onnx_type] = torch.from_numpy(np.zeros(1, np_type)).dtype
    return _NP_TO_TORCH_CACHE[onnx_type]


def _cast(ctx: Ctx, x: list[Value]) -> Tensor:
    return x[0].to(_torch_dtype(int(ctx.attrs["to"])))


def _constant(ctx: Ctx, x: list[Value]) -> Tensor:
    a = ctx.attrs
    if "value" in a:
        return _tensor(numpy_helper.to_array(a["value"]), "cpu")
    for key, dtype in (("value_float", np.float32), ("value_floats", np.float32),
                       ("value_int", np.int64), ("value_ints", np.int64)):
        if key in a:
            return _tensor(np.array(a[key], dtype=dtype), "cpu")
    raise ctx.unsupported(f"constant attribute {sorted(a)}")


def _constant_of_shape(ctx: Ctx, x: list[Value]) -> Tensor:
    value = ctx.attrs.get("value")
    fill = numpy_helper.to_array(value).reshape(-1) if value is not None else np.zeros(1, np.float32)
    return _tensor(np.full(_ints(x[0]), fill[0], dtype=fill.dtype), "cpu").to(x[0].device)


def _shape(ctx: Ctx, x: list[Value]) -> Tensor:
    dims = list(x[0].shape)
    start, end = ctx.attrs.get("start", 0), ctx.attrs.get("end")
    return torch.tensor(dims[start:end], dtype=torch.int64)


def _gather(ctx: Ctx, x: list[Value]) -> Tensor:
    data, idx = x
    axis = _axis(int(ctx.attrs.get("axis", 0)), data.dim())
    size = data.shape[axis]
    # indices computed from shapes (Shape, Constant) live on the CPU while the data is on the GPU
    flat = torch.remainder(idx.reshape(-1).long().to(data.device), size)  # negative: from the end
    out = data.index_select(axis, flat)
    return out.reshape(list(data.shape[:axis]) + list(idx.shape) + list(data.shape[axis + 1:]))


def _pad(ctx: Ctx, x: list[Value]) -> Tensor:
    inp = x[0]
    if ctx.opset >= 11:
        pads = _ints(x[1])
        value = x[2].item() if len(x) > 2 and x[2] is not None else 0.0
        if len(x) > 3 and x[3] is not None:
            raise ctx.unsupported("the axes input")
    else:
        pads, value = list(ctx.attrs["pads"]), float(ctx.attrs.get("value", 0.0))
    mode = ctx.attrs.get("mode", "constant")
    tp = _torch_pad(pads)
    if mode == "constant":
        return F.pad(inp, tp, value=value)
    if mode not in ("reflect", "edge"):
        raise ctx.unsupported(f"pad mode {mode!r}")
    while tp and tp[-1] == 0 and tp[-2] == 0:  # torch pads only trailing dims in these modes
        tp = tp[:-2]
    return F.pad(inp, tp, mode="reflect" if mode == "reflect" else "replicate")


def _split(ctx: Ctx, x: list[Value]) -> tuple[Tensor, ...]:
    inp = x[0]
    axis = _axis(int(ctx.attrs.get("axis", 0)), inp.dim())
    if ctx.opset >= 13:
        sizes = _ints(x[1]) if len(x) > 1 and x[1] is not None else None
    else:
        sizes = list(ctx.attrs["split"]) if ctx.attrs.get("split") else None
    if sizes is None:
        parts = ctx.n_outputs
        chunk = -(-inp.shape[axis] // parts)
        sizes = [min(chunk, inp.shape[axis] - i * chunk) for i in range(parts)]
    return tuple(torch.split(inp, sizes, dim=axis))


def _slice(ctx: Ctx, x: list[Value]) -> Tensor:
    inp = x[0]
    if ctx.opset >= 10:
        starts, ends = _ints(x[1]), _ints(x[2])
        axes = _ints(x[3]) if len(x) > 3 and x[3] is not None else list(range(len(starts)))
        steps = _ints(x[4]) if len(x) > 4 and x[4] is not None else [1] * len(starts)
    else:
        starts, ends = list(ctx.attrs["starts"]), list(ctx.attrs["ends"])
        axes = list(ctx.attrs.get("axes") or range(len(starts)))
        steps = [1] * len(starts)
    for start, end, axis, step in zip(starts, ends, axes, steps):
        axis = _axis(axis, inp.dim())
        size = inp.shape[axis]
        if step > 0:
            lo = min(max(start + size if start < 0 else start, 0), size)
            hi = min(max(end + size if end < 0 else end, 0), size)
            index = [slice(None)] * axis + [slice(lo, hi, step)]
            inp = inp[tuple(index)]
        else:  # torch slicing has no negative step: gather the indices instead
            lo = min(max(start + size if start < 0 else start, -1), size - 1)
            hi = min(max(end + size if end < 0 else end, -1), size - 1)
            inp = inp.index_select(axis, torch.arange(lo, hi, step, device=inp.device))
    return inp


def _conv_transpose(ctx: Ctx, x: list[Value]) -> Tensor:
    inp, w, b = x[0], x[1], x[2] if len(x) > 2 else None
    n = w.dim() - 2
    if n not in (1, 2, 3):
        raise ctx.unsupported(f"{n}-d transposed convolution")
    a = ctx.attrs
    kernel = list(a.get("kernel_shape") or w.shape[2:])
    strides = list(a.get("strides") or [1] * n)
    dilations = list(a.get("dilations") or [1] * n)
    extra = list(a.get("output_padding") or [0] * n)
    if any(e >= max(s, d) for e, s, d in zip(extra, strides, dilations)):
        raise ctx.unsupported("output_padding not below the stride or dilation")
    full = [s * (i - 1) + e + (k - 1) * d + 1
            for s, i, e, k, d in zip(strides, inp.shape[2:], extra, kernel, dilations)]
    mode = a.get("auto_pad", "NOTSET") or "NOTSET"
    if a.get("output_shape") or mode in ("SAME_UPPER", "SAME_LOWER"):
        # the pads that give the requested size: the spec's total_padding, split by auto_pad
        want = (list(a["output_shape"])[-n:] if a.get("output_shape")
                else [i * s for i, s in zip(inp.shape[2:], strides)])
        total = [f - o for f, o in zip(full, want)]
        if any(t < 0 for t in total):
            raise ctx.unsupported("an output_shape larger than the full transposed convolution")
        upper = mode == "SAME_UPPER"
        begin = [t // 2 if upper else t - t // 2 for t in total]
        end = [t - bg for t, bg in zip(total, begin)]
    elif mode in ("NOTSET", "VALID"):
        pads = list(a.get("pads") or [0] * 2 * n) if mode == "NOTSET" else [0] * 2 * n
        begin, end = pads[:n], pads[n:]
    else:
        raise ctx.unsupported(f"auto_pad {mode!r}")
    conv = (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)[n - 1]
    same = _symmetric(begin + end)
    if same is not None:  # torch's own padding: what a torch model's ConvTranspose runs
        return conv(inp, w, b, strides, same, extra, int(a.get("group", 1)), dilations)
    out = conv(inp, w, b, strides, 0, extra, int(a.get("group", 1)), dilations)
    index = [slice(None), slice(None)] + [slice(bg, f - e) for bg, f, e in zip(begin, full, end)]
    return out[tuple(index)]


def _layer_norm(ctx: Ctx, x: list[Value]) -> Any:
    inp, scale = x[0], x[1]
    bias = x[2] if len(x) > 2 else None
    axis = _axis(int(ctx.attrs.get("axis", -1)), inp.dim())
    eps = float(ctx.attrs.get("epsilon", 1e-5))
    dims = tuple(range(axis, inp.dim()))
    if ctx.n_outputs == 1 and tuple(scale.shape) == tuple(inp.shape[axis:]) \
            and (bias is None or tuple(bias.shape) == tuple(inp.shape[axis:])):
        return F.layer_norm(inp, inp.shape[axis:], scale, bias, eps)  # what nn.LayerNorm runs
    mean = inp.mean(dim=dims, keepdim=True)
    inv_std = torch.rsqrt(((inp - mean) ** 2).mean(dim=dims, keepdim=True) + eps)
    y = (inp - mean) * inv_std * scale
    y = y + bias if bias is not None else y
    return (y, mean, inv_std)[:ctx.n_outputs]


def _gelu(ctx: Ctx, x: list[Value]) -> Tensor:
    approximate = ctx.attrs.get("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise ctx.unsupported(f"approximate {approximate!r}")
    return F.gelu(x[0], approximate=approximate)


def _trilu(ctx: Ctx, x: list[Value]) -> Tensor:
    k = int(x[1].item()) if len(x) > 1 and x[1] is not None else 0
    return torch.triu(x[0], k) if ctx.attrs.get("upper", 1) else torch.tril(x[0], k)


def _expand(ctx: Ctx, x: list[Value]) -> Tensor:
    # ONNX broadcasts both ways (a 1 in the shape keeps the input's dim); torch's expand is a view
    shape = torch.broadcast_shapes(tuple(x[0].shape), tuple(_ints(x[1])))
    return x[0].expand(shape)


def _range(ctx: Ctx, x: list[Value]) -> Tensor:
    start, limit, delta = (v.item() for v in x[:3])
    return torch.arange(start, limit, delta, dtype=x[0].dtype, device=x[0].device)


def _mod(ctx: Ctx, x: list[Value]) -> Tensor:
    # fmod=1: the sign of the dividend (C fmod); 0 (integers only): the sign of the divisor
    a, b = _one_device(x[0], x[1])
    return torch.fmod(a, b) if ctx.attrs.get("fmod", 0) else torch.remainder(a, b)


def _where(ctx: Ctx, x: list[Value]) -> Tensor:
    return torch.where(*_one_device(x[0].bool(), x[1], x[2]))


def _resize(ctx: Ctx, x: list[Value]) -> Tensor:
    """Resize (opset 10+) and Upsample as ``F.interpolate``, for the coordinate conventions
    torch has; others are refused by name."""
    inp = x[0]
    a = ctx.attrs
    n = inp.dim() - 2
    if ctx.op == "Upsample" or ctx.opset < 11:
        scales = _floats(x[1]) if len(x) > 1 and x[1] is not None else list(a.get("scales") or [])
        sizes: list[int] | None = None
        coords = "asymmetric"  # what opset < 11 computes
    else:
        scales = _floats(x[2]) if len(x) > 2 and x[2] is not None and x[2].numel() else []
        sizes = _ints(x[3]) if len(x) > 3 and x[3] is not None and x[3].numel() else None
        coords = a.get("coordinate_transformation_mode", "half_pixel")
    for attr, default in (("antialias", 0), ("exclude_outside", 0), ("axes", None)):
        if a.get(attr, default) not in (default, [], ()):
            raise ctx.unsupported(f"attribute {attr}")
    if sizes is not None and a.get("keep_aspect_ratio_policy", "stretch") != "stretch":
        raise ctx.unsupported("keep_aspect_ratio_policy other than stretch")
    if n not in (1, 2, 3) or (sizes[:2] != list(inp.shape[:2]) if sizes is not None else scales[:2] != [1.0, 1.0]):
        raise ctx.unsupported("resizing the batch or channel axis, or a tensor not N×C×spatial")
    mode = a.get("mode", "nearest")
    kwargs: dict[str, Any] = {"size": sizes[2:]} if sizes is not None else \
        {"scale_factor": scales[2:], "recompute_scale_factor": False}
    if mode == "nearest":
        nearest = a.get("nearest_mode", "round_prefer_floor")
        if coords == "asymmetric" and (nearest == "floor" or ctx.op == "Upsample" or ctx.opset < 11):
            return F.interpolate(inp, mode="nearest", **kwargs)
        if coords == "half_pixel" and nearest == "round_prefer_ceil":
            return F.interpolate(inp, mode="nearest-exact", **kwargs)
        raise ctx.unsupported(f"nearest mode {nearest!r} with coordinate_transformation_mode {coords!r}")
    if mode in ("linear", "cubic"):
        torch_mode = ("linear", "bilinear", "trilinear")[n - 1] if mode == "linear" else "bicubic"
        if mode == "cubic" and (n != 2 or float(a.get("cubic_coeff_a", -0.75)) != -0.75):
            raise ctx.unsupported("cubic other than 2-d with coefficient -0.75")
        if coords in ("half_pixel", "pytorch_half_pixel", "align_corners"):
            return F.interpolate(inp, mode=torch_mode, align_corners=coords == "align_corners", **kwargs)
    raise ctx.unsupported(f"mode {mode!r} with coordinate_transformation_mode {coords!r}")


def _floats(v: Value) -> list[float]:
    return [float(f) for f in v.reshape(-1).tolist()]


# ONNX gate order → torch's: LSTM i,o,f,c → i,f,c(g),o; GRU z,r,h → r,z,n
_GATES = {"LSTM": (0, 2, 3, 1), "GRU": (1, 0, 2), "RNN": (0,)}
_DEFAULT_ACTS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"]}


def _rnn(ctx: Ctx, x: list[Value]) -> tuple[Tensor, ...]:
    """LSTM, GRU and RNN through torch's fused recurrent kernels (``torch.lstm`` and friends,
    what ``nn.LSTM`` runs), with ONNX's weights re-ordered into torch's gate order."""
    a = ctx.attrs
    op = ctx.op
    direction = a.get("direction", "forward")
    dirs = 2 if direction == "bidirectional" else 1
    acts = [v.decode() if isinstance(v, bytes) else v for v in a.get("activations") or []]
    per = len(_DEFAULT_ACTS[op])
    acts = acts * dirs if len(acts) == per else acts[:per * dirs]  # one list may serve both directions
    kernel: Any
    if op == "RNN" and acts == ["Relu"] * dirs:
        kernel = torch.rnn_relu
    elif acts and acts != _DEFAULT_ACTS[op] * dirs:
        raise ctx.unsupported(f"activations {acts}")
    else:
        kernel = {"LSTM": torch.lstm, "GRU": torch.gru, "RNN": torch.rnn_tanh}[op]
    if a.get("clip") is not None or a.get("input_forget", 0):
        raise ctx.unsupported("clip or input_forget")
    if op == "GRU" and not a.get("linear_before_reset", 0):
        raise ctx.unsupported("linear_before_reset=0 (torch's GRU applies the reset gate after the linear "
                              "transformation)")
    if op == "LSTM" and len(x) > 7 and x[7] is not None:
        raise ctx.unsupported("peepholes")
    inp, w, r = x[0], x[1], x[2]
    b = x[3] if len(x) > 3 else None
    if len(x) > 4 and x[4] is not None and bool((x[4] != inp.shape[1 - int(a.get("layout", 0))]).any()):
        raise ctx.unsupported("sequence_lens shorter than the sequence")
    batch_first = bool(a.get("layout", 0))
    hidden = int(a["hidden_size"]) if a.get("hidden_size") else r.shape[-1]
    batch = inp.shape[0] if batch_first else inp.shape[1]

    def gates(t: Tensor) -> Tensor:
        return torch.cat([t[g * hidden:(g + 1) * hidden] for g in _GATES[op]])

    params = []
    for d in range(dirs):
        params += [gates(w[d]), gates(r[d])]
        if b is not None:
            half = b.shape[-1] // 2
            params += [gates(b[d][:half]), gates(b[d][half:])]
    zeros = torch.zeros(dirs, batch, hidden, dtype=inp.dtype, device=inp.device)
    h0 = x[5] if len(x) > 5 and x[5] is not None else zeros
    if batch_first:
        h0 = h0.transpose(0, 1)
    for state in x[5:7]:  # torch's kernels abort the process on a mismatch instead of raising
        if state is not None and state.numel() != zeros.numel():
            raise ctx.unsupported(f"an initial state of shape {list(state.shape)} for batch {batch}, "
                                  f"{dirs} direction(s), hidden size {hidden}")
    seq = inp.flip(1 if batch_first else 0) if direction == "reverse" else inp
    if op == "LSTM":
        c0 = x[6] if len(x) > 6 and x[6] is not None else zeros
        y, h_n, c_n = kernel(seq, (h0, c0.transpose(0, 1) if batch_first else c0), params, b is not None, 1,
                             0.0, False, dirs == 2, batch_first)
        states = [h_n, c_n]
    else:
        y, h_n = kernel(seq, h0, params, b is not None, 1, 0.0, False, dirs == 2, batch_first)
        states = [h_n]
    if direction == "reverse":
        y = y.flip(1 if batch_first else 0)
    # torch: [seq, batch, dirs*hidden]; ONNX: [seq, dirs, batch, hidden] (layout 1: [batch, seq, dirs, hidden])
    if batch_first:
        out = y.reshape(batch, -1, dirs, hidden)
        states = [s.transpose(0, 1) for s in states]
    else:
        out = y.reshape(y.shape[0], batch, dirs, hidden).permute(0, 2, 1, 3)
    return tuple([out, *states][:ctx.n_outputs])


def _attention(ctx: Ctx, x: list[Value]) -> Any:
    """The opset-23 Attention op through ``F.scaled_dot_product_attention``: 4-D or 3-D
    (heads from q_num_heads/kv_num_heads) inputs, grouped KV heads, a boolean or additive
    mask, causal masking (bottom-right aligned after a past cache) and the KV cache."""
    a = ctx.attrs
    q, k, v = x[0], x[1], x[2]
    mask = x[3] if len(x) > 3 else None
    past_k, past_v = (x[4] if len(x) > 4 else None), (x[5] if len(x) > 5 else None)
    if ctx.n_outputs > 3:
        raise ctx.unsupported("the qk_matmul_output output")
    if float(a.get("softcap", 0.0)) != 0.0:
        raise ctx.unsupported("softcap")
    three_d = q.dim() == 3
    if three_d:
        qh, kvh = int(a["q_num_heads"]), int(a["kv_num_heads"])
        q = q.reshape(q.shape[0], q.shape[1], qh, -1).transpose(1, 2)
        k = k.reshape(k.shape[0], k.shape[1], kvh, -1).transpose(1, 2)
        v = v.reshape(v.shape[0], v.shape[1], kvh, -1).transpose(1, 2)
    if past_k is not None and past_v is not None:
        k, v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
    present = (k, v)
    if q.shape[1] != k.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    scale = a.get("scale")
    causal = bool(a.get("is_causal", 0))
    bias = None
    if mask is not None:
        bias = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(~mask, -math.inf) \
            if mask.dtype == torch.bool else mask.to(q.dtype)
        if bias.shape[-1] < k.shape[2]:  # a mask shorter than past + new keys masks the rest out
            bias = F.pad(bias, [0, k.shape[2] - bias.shape[-1]], value=-math.inf)
    if causal and (bias is not None or past_k is not None):
        offset = k.shape[2] - q.shape[2] if past_k is not None else 0
        allowed = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril(offset)
        causal_bias = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device).masked_fill(~allowed, -math.inf)
        bias = causal_bias if bias is None else bias + causal_bias
        causal = False
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, is_causal=causal,
                                       scale=float(scale) if scale is not None else None)
    if three_d:
        y = y.transpose(1, 2).reshape(y.shape[0], y.shape[2], -1)
    return (y, *present)[:ctx.n_outputs]


def _reduce(fn: Callable[..., Tensor], axes_input_since: int) -> OpFn:
    def op(ctx: Ctx, x: list[Value]) -> Tensor:
        inp = x[0]
        axes = _axes_arg(ctx, x, 1, axes_input_since)
        keep = bool(ctx.attrs.get("keepdims", 1))
        if not axes:
            if ctx.attrs.get("noop_with_empty_axes", 0):
                return inp
            axes = list(range(inp.dim()))
        return fn(inp, dim=tuple(_axis(a, inp.dim()) for a in axes), keepdim=keep)
    return op


def _dynamic_quantize_linear(ctx: Ctx, x: list[Value]) -> tuple[Tensor, Tensor, Tensor]:
    """ONNX's uint8 formula: the range widened to hold 0, its scale and zero point, values rounded
    half to even (torch.round) and saturated."""
    v = x[0].float()
    lo, hi = torch.clamp(v.min(), max=0.0), torch.clamp(v.max(), min=0.0)
    scale = (hi - lo) / 255.0
    # an all-zero input: scale 0; ORT then quantizes everything to the zero point 0
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    zero = torch.clamp(torch.round(-lo / safe), 0, 255)
    y = torch.clamp(torch.round(v / safe) + zero, 0, 255)
    return y.to(torch.uint8), scale, zero.to(torch.uint8)


def _matmul_integer(ctx: Ctx, x: list[Value]) -> Tensor:
    """(A - a_zero_point) · (B - b_zero_point) in int32. CUDA has no integer matmul: there it runs in
    float64, exact for any product of 8-bit values below 2^53 in magnitude."""
    a, b = _one_device(x[0], x[1])
    azp = x[2] if len(x) > 2 and x[2] is not None else None
    bzp = x[3] if len(x) > 3 and x[3] is not None else None
    wide = torch.float64 if a.device.type == "cuda" else torch.int32
    if azp is not None and azp.dim() == 1 and azp.numel() > 1:
        azp = azp.unsqueeze(-1)  # one per row of A, [M]: along its rows
    # one per column of B, [N], broadcasts along its last axis as it is
    a = a.to(wide) - (azp.to(a.device, wide) if azp is not None else 0)
    b = b.to(wide) - (bzp.to(b.device, wide) if bzp is not None else 0)
    return torch.matmul(a, b).to(torch.int32)


def _unary(fn: Callable[[Tensor], Tensor]) -> OpFn:
    return lambda ctx, x: fn(x[0])


def _binary(fn: Callable[[Tensor, Tensor], Tensor]) -> OpFn:
    return lambda ctx, x: fn(*_one_device(x[0], x[1]))


def _one_device(*ts: Tensor) -> list[Tensor]:
    """Values computed from shapes (Shape, Constant) stay on the CPU, where reading them costs no
    GPU sync; an elementwise op mixing them with GPU tensors takes them to the GPU."""
    gpu = next((t.device for t in ts if t.device.type != "cpu"), None)
    return [t.to(gpu) if gpu is not None and t.device.type == "cpu" and t.dim() > 0 else t for t in ts]


def _register() -> dict[str, OpFn]:
    if torch is None:
        return {}
    return {
        "Conv": _conv, "MaxPool": _max_pool, "AveragePool": _avg_pool,
        "GlobalAveragePool": _global_avg, "GlobalMaxPool": _global_max,
        "BatchNormalization": _batch_norm, "LRN": _lrn, "Gemm": _gemm,
        "MatMul": _binary(torch.matmul),
        "Add": _binary(torch.add), "Sub": _binary(torch.sub), "Mul": _binary(torch.mul), "Div": _div,
        "Pow": _binary(torch.pow),
        "Sum": _variadic(torch.add), "Max": _variadic(torch.maximum), "Min": _variadic(torch.minimum),
        "Mean": _mean,
        "Relu": _unary(F.relu), "Sigmoid": _unary(torch.sigmoid), "Tanh": _unary(torch.tanh),
        "Exp": _unary(torch.exp), "Log": _unary(torch.log), "Sqrt": _unary(torch.sqrt),
        "Abs": _unary(torch.abs), "Neg": _unary(torch.neg), "Reciprocal": _unary(torch.reciprocal),
        "Floor": _unary(torch.floor), "Ceil": _unary(torch.ceil), "Erf": _unary(torch.erf),
        "Cos": _unary(torch.cos), "Sin": _unary(torch.sin), "IsNaN": _unary(torch.isnan),
        "Softplus": _unary(F.softplus), "Softsign": _unary(F.softsign),
        "LeakyRelu": lambda ctx, x: F.leaky_relu(x[0], float(ctx.attrs.get("alpha", 0.01))),
        "Elu": lambda ctx, x: F.elu(x[0], float(ctx.attrs.get("alpha", 1.0))),
        "HardSigmoid": lambda ctx, x: torch.clamp(
            float(ctx.attrs.get("alpha", 0.2)) * x[0] + float(ctx.attrs.get("beta", 0.5)), 0.0, 1.0),
        "PRelu": _prelu, "Clip": _clip,
        "Softmax": _softmax(torch.softmax), "LogSoftmax": _softmax(torch.log_softmax),
        "Flatten": _flatten, "Reshape": _reshape, "Unsqueeze": _unsqueeze, "Squeeze": _squeeze,
        "Transpose": _transpose, "Concat": _concat, "Split": _split, "Slice": _slice, "Pad": _pad,
        "Dropout": _dropout, "Identity": _identity, "Cast": _cast,
        "Constant": _constant, "ConstantOfShape": _constant_of_shape, "Shape": _shape, "Gather": _gather,
        "ReduceMean": _reduce(torch.mean, 18), "ReduceSum": _reduce(torch.sum, 13),
        "ReduceMax": _reduce(torch.amax, 18), "ReduceMin": _reduce(torch.amin, 18),
        "ReduceL1": _reduce(functools.partial(torch.linalg.vector_norm, ord=1), 18),
        "ReduceL2": _reduce(functools.partial(torch.linalg.vector_norm, ord=2), 18),
        "ConvTranspose": _conv_transpose, "LayerNormalization": _layer_norm, "Gelu": _gelu,
        "HardSwish": _unary(F.hardswish), "Where": _where, "Trilu": _trilu, "Expand": _expand, "Range": _range,
        "Mod": _mod, "Not": _unary(torch.logical_not), "Equal": _binary(torch.eq), "Less": _binary(torch.lt),
        "Greater": _binary(torch.gt), "LessOrEqual": _binary(torch.le), "GreaterOrEqual": _binary(torch.ge),
        "And": _binary(torch.logical_and), "Or": _binary(torch.logical_or), "Xor": _binary(torch.logical_xor),
        "Resize": _resize, "Upsample": _resize, "LSTM": _rnn, "GRU": _rnn, "RNN": _rnn, "Attention": _attention,
        "DynamicQuantizeLinear": _dynamic_quantize_linear, "MatMulInteger": _matmul_integer,
    }


OPS: dict[str, OpFn] = _register()
