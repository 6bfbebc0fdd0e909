"""A small ONNX graph builder used by the reference-model definitions.

It tracks the shape of every activation (batch dimension symbolic, named ``N``), creates
deterministic random parameters from one seeded generator per model, and emits ONNX
nodes with the attribute conventions of the exporters the ONNX Model Zoo models came from
(MXNet, Caffe2, CNTK, WinMLTools).  Only ``onnx.helper`` and numpy are used.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

OPSET = 13
IR_VERSION = 8  # opset 13 needs IR >= 7; 8 is accepted by every onnxruntime since 1.10
BATCH = "N"

Shape = tuple  # (BATCH, d1, d2, ...) for activations, plain ints for parameters


def conv_out(size: int, k: int, s: int, pb: int, pe: int, d: int = 1) -> int:
    return (size + pb + pe - d * (k - 1) - 1) // s + 1


def pool_out(size: int, k: int, s: int, pb: int, pe: int, ceil: bool = False) -> int:
    num = size + pb + pe - k
    return (-(-num // s) if ceil else num // s) + 1


def caffe_pool_pads(size: int, k: int, s: int, p: int = 0) -> tuple[int, int]:
    """Begin/end pads that make a floor-mode ONNX pool reproduce Caffe's ceil-mode output.

    This is what the Caffe2 -> ONNX frontend emits for Caffe's ``legacy_pad`` pools: the
    symmetric pad ``p`` plus an extra pad at the end where Caffe rounds the window count up.
    """
    out = -(-(size + 2 * p - k) // s) + 1
    if p > 0 and (out - 1) * s >= size + p:
        out -= 1
    end = (out - 1) * s + k - size - p
    return p, max(end, p)


class GraphBuilder:
    """Builds one ONNX graph; every op helper returns the name of its output tensor."""

    def __init__(self, name: str, seed: int, doc: str = "", producer: str = "benanza.zoo"):
        self.name = name
        self.rng = np.random.default_rng(seed)
        # Build straight into the ModelProto: large initializers are copied only once.
        self.model = onnx.ModelProto()
        self.model.ir_version = IR_VERSION
        self.model.producer_name = producer
        self.model.producer_version = "1"
        self.model.model_version = 1
        self.model.opset_import.add(domain="", version=OPSET)
        self.graph = self.model.graph
        self.graph.name = name
        if doc:
            self.graph.doc_string = doc
        self.outputs: list[str] = []
        self.shapes: dict[str, Shape] = {}
        self._names: set[str] = set()
        self._counters: dict[str, int] = {}

    # ------------------------------------------------------------------ naming
    def uniq(self, base: str) -> str:
        if base not in self._names:
            self._names.add(base)
            return base
        i = self._counters.get(base, 1)
        while f"{base}_{i}" in self._names:
            i += 1
        self._counters[base] = i + 1
        name = f"{base}_{i}"
        self._names.add(name)
        return name

    def auto(self, op: str) -> str:
        i = self._counters.get("#" + op, 0)
        self._counters["#" + op] = i + 1
        return self.uniq(f"{op.lower()}{i}")

    def shape(self, x: str) -> Shape:
        return self.shapes[x]

    def channels(self, x: str) -> int:
        return self.shapes[x][1]

    # ------------------------------------------------------------------ tensors
    def input(self, name: str, dims: Sequence[int]) -> str:
        name = self.uniq(name)
        shape: tuple[str | int, ...] = (BATCH, *dims)
        self.graph.input.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))
        self.shapes[name] = shape
        return name

    def tensor(self, name: str, array: np.ndarray) -> str:
        """An initializer with exactly these values."""
        name = self.uniq(name)
        array = np.ascontiguousarray(array)
        t = self.graph.initializer.add()
        t.name = name
        t.dims.extend(int(d) for d in array.shape)
        t.data_type = helper.np_dtype_to_tensor_dtype(array.dtype)
        t.raw_data = array.tobytes()
        self.shapes[name] = tuple(int(d) for d in array.shape)
        return name

    def ints(self, name: str, values: Iterable[int]) -> str:
        return self.tensor(name, np.asarray(list(values), dtype=np.int64))

    def scalar(self, name: str, value: float) -> str:
        return self.tensor(name, np.asarray(value, dtype=np.float32))

    def uniform(self, shape: Sequence[int], limit: float) -> np.ndarray:
        """Deterministic U(-limit, limit) float32 samples (fast: integer draws, then scaled)."""
        n = int(np.prod(shape)) if len(shape) else 1
        raw = self.rng.integers(0, 1 << 32, size=n, dtype=np.uint32).view(np.int32)
        arr = raw.astype(np.float32)
        arr *= np.float32(limit / 2147483648.0)
        return arr.reshape(tuple(shape))

    def random(self, name: str, shape: Sequence[int], std: float, mean: float = 0.0) -> str:
        """Random initializer with the given mean and standard deviation (uniform law)."""
        arr = self.uniform(shape, std * math.sqrt(3.0))
        if mean:
            arr += np.float32(mean)
        return self.tensor(name, arr)

    def weight(self, name: str, shape: Sequence[int], fan_in: int | None = None,
               gain: float = 1.0) -> str:
        """He-scaled random weights (keeps activations finite through deep random nets)."""
        if fan_in is None:
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else int(shape[0])
        return self.random(name, shape, std=gain * math.sqrt(2.0 / max(fan_in, 1)))

    def bias(self, name: str, n: int) -> str:
        return self.random(name, (n,), std=0.01)

    def bn_params(self, prefix: str, c: int, fixed: bool = False) -> list[str]:
        """gamma, beta, running mean, running var; sane values (var > 0, gamma ~ 1)."""
        if fixed:  # e.g. Gluon BatchNorm(scale=False, center=False)
            gamma = self.tensor(prefix + "_gamma", np.ones(c, np.float32))
            beta = self.tensor(prefix + "_beta", np.zeros(c, np.float32))
        else:
            gamma = self.random(prefix + "_gamma", (c,), std=0.05, mean=1.0)
            beta = self.random(prefix + "_beta", (c,), std=0.05)
        mean = self.random(prefix + "_running_mean", (c,), std=0.05)
        var = self.tensor(
            prefix + "_running_var",
            (1.0 + np.abs(self.uniform((c,), 0.2))).astype(np.float32),
        )
        return [gamma, beta, mean, var]

    # ------------------------------------------------------------------ nodes
    def node(self, op: str, inputs: Sequence[str], shape: Shape, name: str | None = None,
             n_outputs: int = 1, **attrs) -> str:
        name = self.uniq(name) if name else self.auto(op)
        outs = [name] + [self.uniq(f"{name}_out{i}") for i in range(1, n_outputs)]
        attrs = {k: v for k, v in attrs.items() if v is not None}
        self.graph.node.append(helper.make_node(op, list(inputs), outs, name=name, **attrs))
        self.shapes[outs[0]] = tuple(shape)
        return outs[0]

    # convolution / dense -----------------------------------------------------
    def conv(self, x: str, out_ch: int, k: int | Sequence[int], stride: int = 1,
             pad: int | Sequence[int] = 0, group: int = 1, dilation: int = 1, bias: bool = True,
             name: str | None = None, weight_name: str | None = None, gain: float = 1.0) -> str:
        """Conv; ``gain`` scales the He-initialised weights (small for the last conv of a
        residual branch so that random deep residual nets keep moderate activations)."""
        n, c, h, w = self.shape(x)
        kh, kw = (k, k) if isinstance(k, int) else tuple(k)
        if isinstance(pad, int):
            pads = [pad, pad, pad, pad]
        elif len(pad) == 2:
            pads = [pad[0], pad[1], pad[0], pad[1]]
        else:
            pads = list(pad)
        assert c % group == 0 and out_ch % group == 0, (x, c, out_ch, group)
        name = self.uniq(name) if name else self.auto("Conv")
        wname = self.weight(weight_name or name + "_weight", (out_ch, c // group, kh, kw), gain=gain)
        inputs = [x, wname]
        if bias:
            inputs.append(self.bias(name + "_bias", out_ch))
        oh = conv_out(h, kh, stride, pads[0], pads[2], dilation)
        ow = conv_out(w, kw, stride, pads[1], pads[3], dilation)
        assert oh > 0 and ow > 0, (name, h, w)
        self._names.discard(name)  # re-registered by node()
        return self.node("Conv", inputs, (n, out_ch, oh, ow), name=name,
                         kernel_shape=[kh, kw], strides=[stride, stride], pads=pads,
                         dilations=[dilation, dilation], group=group)

    def gemm(self, x: str, out_features: int, name: str | None = None, bias: bool = True) -> str:
        n, k = self.shape(x)
        name = self.uniq(name) if name else self.auto("Gemm")
        inputs = [x, self.weight(name + "_weight", (out_features, k))]
        if bias:
            inputs.append(self.bias(name + "_bias", out_features))
        self._names.discard(name)
        return self.node("Gemm", inputs, (n, out_features), name=name, alpha=1.0, beta=1.0, transB=1)

    def matmul(self, x: str, w: str, name: str | None = None) -> str:
        xs, ws = self.shape(x), self.shape(w)
        assert xs[-1] == ws[0], (xs, ws)
        return self.node("MatMul", [x, w], (*xs[:-1], ws[-1]), name=name)

    # normalisation / activation ----------------------------------------------
    def bn(self, x: str, eps: float = 1e-5, momentum: float = 0.9, name: str | None = None,
           fixed: bool = False) -> str:
        name = self.uniq(name) if name else self.auto("BatchNormalization")
        params = self.bn_params(name, self.channels(x), fixed=fixed)
        self._names.discard(name)
        return self.node("BatchNormalization", [x, *params], self.shape(x), name=name,
                         epsilon=eps, momentum=momentum)

    def relu(self, x: str, name: str | None = None) -> str:
        return self.node("Relu", [x], self.shape(x), name=name)

    def leaky_relu(self, x: str, alpha: float, name: str | None = None) -> str:
        return self.node("LeakyRelu", [x], self.shape(x), name=name, alpha=alpha)

    def clip(self, x: str, lo: float, hi: float, name: str | None = None) -> str:
        name = self.uniq(name) if name else self.auto("Clip")
        mn, mx = self.scalar(name + "_min", lo), self.scalar(name + "_max", hi)
        self._names.discard(name)
        return self.node("Clip", [x, mn, mx], self.shape(x), name=name)

    def lrn(self, x: str, size: int = 5, alpha: float = 1e-4, beta: float = 0.75, bias: float = 1.0,
            name: str | None = None) -> str:
        return self.node("LRN", [x], self.shape(x), name=name, size=size, alpha=alpha, beta=beta,
                         bias=bias)

    def dropout(self, x: str, name: str | None = None) -> str:
        return self.node("Dropout", [x], self.shape(x), name=name)

    def softmax(self, x: str, axis: int = -1, name: str | None = None) -> str:
        return self.node("Softmax", [x], self.shape(x), name=name, axis=axis)

    # pooling ---------------------------------------------------------------
    def _pool(self, op: str, x: str, k: int, stride: int, pads: Sequence[int], name: str | None,
              **attrs) -> str:
        n, c, h, w = self.shape(x)
        if len(pads) == 2:
            pads = [pads[0], pads[0], pads[1], pads[1]]
        oh = pool_out(h, k, stride, pads[0], pads[2])
        ow = pool_out(w, k, stride, pads[1], pads[3])
        assert oh > 0 and ow > 0, (op, h, w, k, stride, pads)
        return self.node(op, [x], (n, c, oh, ow), name=name, kernel_shape=[k, k],
                         strides=[stride, stride], pads=list(pads), **attrs)

    def maxpool(self, x: str, k: int, stride: int, pad: int | Sequence[int] = 0,
                name: str | None = None) -> str:
        pads = [pad] * 4 if isinstance(pad, int) else list(pad)
        return self._pool("MaxPool", x, k, stride, pads, name)

    def avgpool(self, x: str, k: int, stride: int, pad: int | Sequence[int] = 0,
                name: str | None = None, count_include_pad: int = 0) -> str:
        pads = [pad] * 4 if isinstance(pad, int) else list(pad)
        return self._pool("AveragePool", x, k, stride, pads, name,
                          count_include_pad=count_include_pad or None)

    def caffe_maxpool(self, x: str, k: int, stride: int, pad: int = 0, name: str | None = None,
                      op: str = "MaxPool") -> str:
        """Caffe ceil-mode pooling as exported by Caffe2: explicit (possibly asymmetric) pads."""
        _, _, h, w = self.shape(x)
        ph = caffe_pool_pads(h, k, stride, pad)
        pw = caffe_pool_pads(w, k, stride, pad)
        pads = [ph[0], pw[0], ph[1], pw[1]]
        if op == "MaxPool":
            return self._pool("MaxPool", x, k, stride, pads, name)
        return self._pool("AveragePool", x, k, stride, pads, name)

    def global_avgpool(self, x: str, name: str | None = None) -> str:
        n, c = self.shape(x)[:2]
        return self.node("GlobalAveragePool", [x], (n, c, 1, 1), name=name)

    # shape ops -------------------------------------------------------------
    def flatten(self, x: str, name: str | None = None) -> str:
        s = self.shape(x)
        return self.node("Flatten", [x], (s[0], int(np.prod(s[1:]))), name=name, axis=1)

    def reshape(self, x: str, target: Sequence[int], out_shape: Shape, name: str | None = None) -> str:
        name = self.uniq(name) if name else self.auto("Reshape")
        shp = self.ints(name + "_shape", target)
        self._names.discard(name)
        return self.node("Reshape", [x, shp], out_shape, name=name)

    def unsqueeze(self, x: str, axes: Sequence[int], name: str | None = None) -> str:
        name = self.uniq(name) if name else self.auto("Unsqueeze")
        ax = self.ints(name + "_axes", axes)
        s = list(self.shape(x))
        for a in sorted(axes):
            s.insert(a, 1)
        self._names.discard(name)
        return self.node("Unsqueeze", [x, ax], tuple(s), name=name)

    def transpose(self, x: str, perm: Sequence[int], name: str | None = None) -> str:
        s = self.shape(x)
        return self.node("Transpose", [x], tuple(s[p] for p in perm), name=name, perm=list(perm))

    def concat(self, xs: Sequence[str], axis: int = 1, name: str | None = None) -> str:
        shapes = [self.shape(x) for x in xs]
        out = list(shapes[0])
        out[axis] = sum(s[axis] for s in shapes)
        for s in shapes:
            assert s[:axis] == shapes[0][:axis] and s[axis + 1:] == shapes[0][axis + 1:], shapes
        return self.node("Concat", list(xs), tuple(out), name=name, axis=axis)

    # elementwise ------------------------------------------------------------
    def _bcast(self, a: str, b: str) -> Shape:
        sa, sb = self.shape(a), self.shape(b)
        n = max(len(sa), len(sb))
        sa = (1,) * (n - len(sa)) + tuple(sa)
        sb = (1,) * (n - len(sb)) + tuple(sb)
        out = []
        for da, db in zip(sa, sb):
            if da == db or db == 1:
                out.append(da)
            elif da == 1:
                out.append(db)
            else:
                raise ValueError(f"cannot broadcast {sa} and {sb}")
        return tuple(out)

    def binary(self, op: str, a: str, b: str, name: str | None = None) -> str:
        return self.node(op, [a, b], self._bcast(a, b), name=name)

    def add(self, a: str, b: str, name: str | None = None) -> str:
        return self.binary("Add", a, b, name)

    def mul(self, a: str, b: str, name: str | None = None) -> str:
        return self.binary("Mul", a, b, name)

    def sum(self, xs: Sequence[str], name: str | None = None) -> str:
        for x in xs[1:]:
            assert self.shape(x) == self.shape(xs[0])
        return self.node("Sum", list(xs), self.shape(xs[0]), name=name)

    # ------------------------------------------------------------------ model
    def output(self, x: str) -> str:
        self.outputs.append(x)
        return x

    def build(self) -> onnx.ModelProto:
        for o in self.outputs:
            self.graph.output.append(
                helper.make_tensor_value_info(o, TensorProto.FLOAT, list(self.shapes[o])))
        model = self.model
        del self.model, self.graph  # a builder builds once
        return model
