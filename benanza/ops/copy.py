"""Data movement: Transpose, Concat, Pad, and the copies no library has a primitive for (Slice,
Split, Gather, Expand, Where, Trilu), each benchmarked as a copy of the same bytes, never as
free. A constant zero Pad is cuDNN's padding transform; oneDNN has no padding primitive, so there
it is what a framework runs (PyTorch's constant_pad_nd): the output zero-filled, then the input
reordered into its box of the output."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from .base import (
    CudnnLowering,
    CudnnTable,
    Dims,
    DimsList,
    Family,
    NodeView,
    OnednnLowering,
    const,
    dims8,
    present,
    required,
    word,
)
from .grammar import FLOAT_DTYPES, F, Problem, f32
from .reference import Fills, Gen, Site, Spec, fill

if TYPE_CHECKING:
    from ..records import Variant


@dataclass(frozen=True)
class ConcatProblem(Problem):
    FAMILY: ClassVar[str] = "concat"
    KEY: ClassVar[tuple[tuple[F, ...], ...]] = ((F("axis", "axis"),), (F("in", "shapes", "shapes"),))

    axis: int
    shapes: tuple[tuple[int, ...], ...]

    def flops(self) -> int:
        return 0  # data movement: its cost is bytes



@dataclass(frozen=True)
class TransposeProblem(Problem):
    """ONNX Transpose: a real copy of the input into the permuted layout (``perm`` as ONNX's)."""

    FAMILY: ClassVar[str] = "transpose"
    KEY: ClassVar[tuple[tuple[F, ...], ...]] = ((F("in", "shape", "dims"),), (F("perm", "perm", "dims"),))

    shape: tuple[int, ...]
    perm: tuple[int, ...]

    def flops(self) -> int:
        return 0  # a copy: its cost is bytes


@dataclass(frozen=True)
class CopyProblem(Problem):
    """Pure data movement that no library has a primitive for (Slice, Split, Gather, Expand,
    Where, Trilu): benchmarked as a copy of the same bytes, never as free.

    ``how``: ``region``: each output is a box of the input (``src``) at ``offsets``, read with
    the input's strides and written densely (Slice with unit steps, Split, a Gather of constant
    indices); ``dense``: the outputs' bytes copied from buffers of their own shape (Expand,
    Where, Trilu, a strided Slice: what they write, read as if contiguous). ``op`` names the ONNX
    op the copy stands for. ``outs`` are the boxes in ``src``'s rank (a Gather's output with its
    gathered axis kept as 1: the same bytes)."""

    FAMILY: ClassVar[str] = "copy"
    KEY: ClassVar[tuple[tuple[F, ...], ...]] = (
        (F("", "op", "word"),), (F("", "how", "word"),), (F("in", "src", "dims", None),),
        (F("out", "outs", "shapes"),), (F("at", "offsets", "shapes"),))

    op: str
    how: str
    src: tuple[int, ...] | None
    outs: tuple[tuple[int, ...], ...]
    offsets: tuple[tuple[int, ...], ...] = ()

    @property
    def moved_elements(self) -> int:
        """Elements written (and read): the outputs' sizes."""
        return sum(math.prod(o) for o in self.outs)

    def flops(self) -> int:
        return 0  # a copy: its cost is bytes

    def compulsory_bytes(self, inputs: int, outputs: int) -> int:
        """What it writes, read once: a slice or gather skips the rest of its input; Expand,
        Where and Trilu read no more than they write from buffers of the output's shape."""
        return 2 * outputs



@dataclass(frozen=True)
class PadProblem(Problem):
    """ONNX Pad with its pads known at load time: ``before`` and ``after`` elements on each axis
    of ``shape`` (negative: a crop), in ``mode`` (constant, reflect, edge, wrap), a constant
    mode's ``value``."""

    FAMILY: ClassVar[str] = "pad"
    KEY: ClassVar[tuple[tuple[F, ...], ...]] = (
        (F("", "mode", "word"),), (F("in", "shape", "dims"),), (F("pb", "before", "dims"), F("pa", "after", "dims")),
        (F("val", "value", "float", 0.0),))

    mode: str
    shape: tuple[int, ...]
    before: tuple[int, ...]
    after: tuple[int, ...]
    value: float = 0.0

    def flops(self) -> int:
        return 0  # data movement: its cost is bytes


# --- recognition ---------------------------------------------------------------------------

def _concat_build(view: NodeView) -> Problem:
    rank = len(view.outputs[0].shape)
    axis = int(view.attrs["axis"])
    axis = axis + rank if axis < 0 else axis
    return ConcatProblem(axis, tuple(tuple(t.shape) for t in view.inputs if t is not None))



def _transpose_build(view: NodeView) -> Problem:
    shape = tuple(required(view, 0).shape)
    perm = tuple(int(a) for a in view.attrs.get("perm") or reversed(range(len(shape))))
    return TransposeProblem(shape, perm)




# Gather/Slice/Split index values beyond this many regions are copied as dense outputs.
_MAX_REGIONS = 64


def _float_data(view: NodeView) -> bool:
    return bool(view.outputs) and all(o.dtype in FLOAT_DTYPES for o in view.outputs)


def _slice_window(view: NodeView) -> tuple[tuple[int, ...], tuple[int, ...], bool] | None:
    """(box, start) of a Slice in its input's rank, and whether every step is 1; None when a
    start, end, axis or step is a run-time tensor."""
    shape = required(view, 0).shape
    rank = len(shape)
    if view.opset < 10:
        starts, ends = view.attrs.get("starts"), view.attrs.get("ends")
        axes, steps = view.attrs.get("axes"), None
    else:
        got = [view.value(i) if present(view, i) else None for i in range(1, 5)]
        if got[0] is None or got[1] is None or any(present(view, i) and got[i - 1] is None for i in (3, 4)):
            return None
        starts, ends, axes, steps = (None if g is None else [int(x) for x in g.reshape(-1)] for g in got)
    if starts is None or ends is None:
        return None
    axes = list(axes) if axes is not None else list(range(len(starts)))
    steps = list(steps) if steps is not None else [1] * len(starts)
    box, start = list(shape), [0] * rank
    for a, b, e, st in zip(axes, starts, ends, steps):
        a = a + rank if a < 0 else a
        first, _, step = slice(b, e, st).indices(shape[a])
        box[a] = len(range(*slice(b, e, st).indices(shape[a])))
        start[a] = first
        if step != 1:
            return tuple(box), tuple(start), False
    return tuple(box), tuple(start), True


def _copy_build(view: NodeView) -> Problem:
    op = word(view.op)
    outs = tuple(tuple(o.shape) for o in view.outputs)
    dense = CopyProblem(op, "dense", None, outs)
    src = tuple(required(view, 0).shape)
    rank = len(src)
    if view.op == "Slice":
        window = _slice_window(view)
        if window is None or not window[2]:
            return dense
        return CopyProblem(op, "region", src, (window[0],), (window[1],))
    if view.op == "Split":
        axis = int(view.attrs.get("axis", 0))
        axis = axis + rank if axis < 0 else axis
        at, boxes, offsets = 0, [], []
        for o in outs:
            offsets.append(tuple(at if i == axis else 0 for i in range(rank)))
            boxes.append(o)
            at += o[axis]
        return CopyProblem(op, "region", src, tuple(boxes), tuple(offsets))
    if view.op == "Gather":
        idx = view.value(1)
        axis = int(view.attrs.get("axis", 0))
        axis = axis + rank if axis < 0 else axis
        if idx is None or idx.size > _MAX_REGIONS:
            return dense
        box = tuple(1 if i == axis else d for i, d in enumerate(src))
        starts = tuple(tuple((int(j) + src[axis] if j < 0 else int(j)) if i == axis else 0 for i in range(rank))
                       for j in idx.reshape(-1))
        return CopyProblem(op, "region", src, (box,) * len(starts), starts)
    return dense  # Expand, Where, Trilu


def _pad_given(view: NodeView) -> tuple[list[int], float, list[int] | None] | None:
    """The pads (ONNX's order: every axis's begin, then every end), the constant and the axes
    they apply to (None: all); None when one is a run-time tensor."""
    if view.opset < 11:
        pads = view.attrs.get("pads", view.attrs.get("paddings"))
        return None if pads is None else ([int(x) for x in pads], float(view.attrs.get("value", 0.0)), None)
    got = [view.value(i) if present(view, i) else None for i in (1, 2, 3)]
    if got[0] is None or any(present(view, i) and g is None for i, g in zip((2, 3), got[1:])):
        return None
    value = float(got[1].reshape(-1)[0]) if got[1] is not None and got[1].size else 0.0
    axes = None if got[2] is None else [int(a) for a in got[2].reshape(-1)]
    return [int(x) for x in got[0].reshape(-1)], value, axes


def _pad_when(view: NodeView) -> bool:
    return _float_data(view) and _pad_given(view) is not None


def _pad_build(view: NodeView) -> Problem:
    shape = tuple(required(view, 0).shape)
    given = _pad_given(view)
    assert given is not None
    pads, value, axes = given
    rank = len(shape)
    axes = [a + rank if a < 0 else a for a in (axes if axes is not None else range(rank))]
    before, after = [0] * rank, [0] * rank
    for i, a in enumerate(axes):
        before[a], after[a] = pads[i], pads[i + len(axes)]
    return PadProblem(word(view.attrs.get("mode", "constant")), shape, tuple(before), tuple(after), f32(value))


# what computes a zero Pad on each backend, as its reasons name it
_PAD_CALL = {"cudnn": "cudnnTransformTensorEx", "onednn": "a zero fill and a reorder into the padded box"}


def _pad_refused(p: Problem, backend: str) -> str | None:
    """Why the backend's zero pad does not compute the Pad, in one line; None: it does."""
    assert isinstance(p, PadProblem)
    call = _PAD_CALL[backend]
    if p.mode != "constant":
        return f"mode {p.mode} ({call} pads with zeros only)"
    if p.value != 0:
        return f"constant value {p.value:g} ({call} pads with zeros only)"
    if min(p.before + p.after, default=0) < 0:
        return f"negative pads (a crop: {call} only adds)"
    if backend == "cudnn" and not 1 <= len(p.shape) <= 5:
        return f"rank {len(p.shape)} (cuDNN's transform takes 4 or 5 dims)"
    if backend == "onednn" and not 1 <= len(p.shape) <= 6:
        return f"rank {len(p.shape)} (oneDNN's reorder takes 1 to 6 dims)"
    return None


def _pad_cudnn(p: Problem) -> str | None:
    return "cudnnTransformTensorEx" if _pad_refused(p, "cudnn") is None else None


def _pad_onednn(p: Problem) -> str | None:
    # labelled as the copy family's reorders are: no oneDNN primitive pads
    return "reorder_pad" if _pad_refused(p, "onednn") is None else None


def _pad_uncovered(p: Problem, backend: str) -> str | None:
    return _pad_refused(p, backend) if backend in _PAD_CALL else None


def _copy_cudnn(p: Problem) -> str | None:
    assert isinstance(p, CopyProblem)
    # one cudnnTransformTensor per output (the runtime's table holds up to 8 of rank up to 8)
    ranks = [len(o) for o in p.outs] + [len(p.src or ())]
    return "cudnnTransformTensor" if 1 <= len(p.outs) <= 8 and max(ranks) <= 8 and min(ranks[:-1]) >= 1 else None


def _transpose_cudnn(p: Problem) -> str | None:
    assert isinstance(p, TransposeProblem)
    # the copy family's cudnnTransformTensor, its source read through permuted strides
    return "cudnnTransformTensor" if 1 <= len(p.shape) <= 8 else None


def _concat_cudnn(p: Problem) -> str | None:
    assert isinstance(p, ConcatProblem)
    # the copy family's cudnnTransformTensor, one per input, each written into its box of the output
    return "cudnnTransformTensor" if 1 <= len(p.shapes) <= 8 and 1 <= len(p.shapes[0]) <= 8 else None


def _copy_onednn(p: Problem) -> str | None:
    assert isinstance(p, CopyProblem)
    # a reorder per output, labelled: no oneDNN primitive computes these ops themselves
    return "reorder_copy" if all(1 <= len(o) <= 6 for o in p.outs) else None


def _copy_when(view: NodeView) -> bool:
    """Data movement on float data; on integers and booleans it is shape arithmetic or a mask,
    which no library computes on (and, with static shapes, frameworks fold at load time). Where's
    first input is its boolean condition."""
    return _float_data(view) and (view.op == "Where" or required(view, 0).dtype in FLOAT_DTYPES)


# --- lowerings -----------------------------------------------------------------------------

@dataclass(frozen=True)
class ConcatParams:
    """oneDNN ConcatParams."""

    axis: int
    inputs: DimsList


@dataclass(frozen=True)
class TransposeParams:
    """oneDNN TransposeParams."""

    shape: Dims
    perm: Dims


@dataclass(frozen=True)
class CopyParams:
    """oneDNN CopyParams: ``region``: the outputs are boxes of ``src`` at ``offsets``."""

    op: str
    region: bool
    src: Dims
    outs: DimsList
    offsets: DimsList


@dataclass(frozen=True)
class CopyLayer:
    """cuDNN CopyLayer: ``count`` cudnnTransformTensor copies between boxes of ``src`` (``into``:
    each input written into its box of the output), dims padded to the runtime's 8."""

    region: bool
    into: bool
    rank: int
    count: int
    src: Dims
    outs: DimsList
    at: DimsList
    perm: Dims


def _copy_layer(src: Dims, outs: DimsList, offsets: DimsList, perm: Dims, region: bool, into: bool) -> CopyLayer:
    rank = max([4, len(src)] + [len(o) for o in outs])
    lead = rank - len(src)  # the leading 1s keep their places; the permuted dims shift past them
    boxes = tuple(dims8(o, rank, 1) for o in outs) + (dims8((), 0, 0),) * (8 - len(outs))
    starts = tuple(dims8(a, rank, 0) for a in offsets) + (dims8((), 0, 0),) * (8 - len(offsets))
    order = tuple(range(lead)) + tuple(a + lead for a in perm)
    return CopyLayer(region=region, into=into, rank=rank, count=len(outs), src=dims8(src, rank, 1), outs=boxes,
                     at=starts, perm=order + (0,) * (8 - rank))


def _transpose_copy(p: TransposeProblem, api: str) -> CopyLayer:
    """One box, the whole input, read in the permuted order."""
    return _copy_layer(p.shape, (tuple(p.shape[a] for a in p.perm),), ((0,) * len(p.shape),), p.perm, True, False)


def _concat_copy(p: ConcatProblem, api: str) -> CopyLayer:
    """Each input written into its box of the output."""
    at_axis = [sum(s[p.axis] for s in p.shapes[:i]) for i in range(len(p.shapes))]
    src = p.shapes[0][:p.axis] + (at_axis[-1] + p.shapes[-1][p.axis],) + p.shapes[0][p.axis + 1:]
    offsets = tuple(tuple(at if d == p.axis else 0 for d in range(len(src))) for at in at_axis)
    return _copy_layer(src, p.shapes, offsets, tuple(range(len(src))), True, True)


def _copy_copy(p: CopyProblem, api: str) -> CopyLayer:
    src = p.src or ()
    return _copy_layer(src, p.outs, p.offsets, tuple(range(len(src))), p.how == "region", False)


CUDNN_COPY = CudnnTable("copy", "add_copy", False, False)


@dataclass(frozen=True)
class PadLayer:
    """cuDNN PadLayer: dims right-aligned to 4 (or 5) with leading 1s and pads 0, padded to the
    runtime's 8."""

    rank: int
    src: Dims
    before: Dims
    after: Dims


def _pad_layer(p: PadProblem, api: str) -> PadLayer:
    rank = max(4, len(p.shape))
    return PadLayer(rank=rank, src=dims8(p.shape, rank, 1), before=dims8(p.before, rank, 0),
                    after=dims8(p.after, rank, 0))


@dataclass(frozen=True)
class PadParams:
    """oneDNN PadParams."""

    shape: Dims
    before: Dims
    after: Dims


def _copy_reference(site: Site, v: Variant, gen: Gen) -> Spec:
    """The source and every output of the op it computes; a dense copy, which stands in for an
    op it does not compute, is compared for the bytes it moves, never as the op."""
    p = v.problem
    assert isinstance(p, CopyProblem)
    proto = site.proto(0)
    if p.how == "dense":
        note = (f" as a dense copy: its output's {sum(math.prod(o) for o in p.outs)} elements moved from a buffer of "
                f"their shape (the values are generated, not the op's: the copy does not compute {proto.op_type}); "
                f"sizes against the op's real outputs")
        return Spec(site.nodes, {}, tuple(proto.output), note, dense=p.outs)
    return Spec(site.nodes, fill(site, gen, [(0, 0)]), tuple(proto.output))


CONCAT = Family("concat", ConcatProblem, ("Concat",), _concat_build, cudnn_api=_concat_cudnn,
                onednn_api=const("concat"),
                cudnn={"cudnnTransformTensor": CudnnLowering(CUDNN_COPY, _concat_copy)},
                onednn=OnednnLowering("concat", False, lambda p, api: ConcatParams(axis=p.axis, inputs=p.shapes),
                                      spatial_if=lambda p: all(len(s) == 4 for s in p.shapes),
                                      reference=Fills(lambda p: tuple(range(len(p.shapes))))), exact=True)
TRANSPOSE = Family("transpose", TransposeProblem, ("Transpose",), _transpose_build, cudnn_api=_transpose_cudnn,
                   onednn_api=const("reorder"),
                   cudnn={"cudnnTransformTensor": CudnnLowering(CUDNN_COPY, _transpose_copy)},
                   onednn=OnednnLowering("transpose", False,
                                         lambda p, api: TransposeParams(shape=p.shape, perm=p.perm),
                                         reference=Fills(lambda p: (0,))), exact=True)
COPY = Family("copy", CopyProblem, ("Slice", "Split", "Gather", "Expand", "Trilu", "Where"), _copy_build,
              _copy_when, cudnn_api=_copy_cudnn, onednn_api=_copy_onednn,
              cudnn={"cudnnTransformTensor": CudnnLowering(CUDNN_COPY, _copy_copy)},
              onednn=OnednnLowering("copy", False, lambda p, api: CopyParams(
                  op=p.op, region=p.how == "region", src=p.src or (), outs=p.outs, offsets=p.offsets),
                  reference=_copy_reference),
              dtype=lambda view: view.outputs[0].dtype, exact=True)
PAD = Family("pad", PadProblem, ("Pad",), _pad_build, _pad_when, cudnn_api=_pad_cudnn, onednn_api=_pad_onednn,
             cudnn={"cudnnTransformTensorEx": CudnnLowering(CudnnTable("pad", "add_pad", False, False), _pad_layer)},
             onednn=OnednnLowering("pad", False, lambda p, api: PadParams(shape=p.shape, before=p.before,
                                                                          after=p.after),
                                   reference=Fills(lambda p: (0,))),
             uncovered=_pad_uncovered, exact=True)
FAMILIES = (CONCAT, TRANSPOSE, COPY, PAD)
