"""Typed problem records: what one layer computes, one frozen record per op family.

A problem holds the shapes and attributes that change a layer's computation, never its data
type: a Layer is a problem in the model's dtype, a benchmark Variant a problem in the variant's
dtype. So the fp16 benchmark of an fp32 model's convolution is found as (its problem, f16), and
no code edits key strings.

Every problem formats to a benchdnn-style key, ``family:token_token_...``, and parses back
(``parse_problem(format_problem(p)) == p``). A layer key is that text plus ``_<dtype>``:
``conv:mb1_ic64ih56iw56_oc64oh56ow56_kh3kw3_sh1sw1_ph1pw1_dh1dw1_g1_bias0_f32``.

The grammar: a token is a run of ``name value`` pairs (``ic64ih56iw56``) or a bare word
(``max``, ``flat``). Values are integers, ``x``-joined dims (``1x64x56x56``) or positional
decimals (never exponents). Floats are float32 values (ONNX attributes are), printed as the
shortest decimal that reads back to the same float32, so keys stay identical across machines
and Python versions. A family declares its key as a grammar of fields (``_F``), from which
both directions are derived; a text that does not print back to itself is rejected.
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Iterator

import numpy as np

from .errors import LayerKeyError

# --- the token grammar ---------------------------------------------------------------------

_NUM = r"-?\d+(?:\.\d+)?"
_VALUE = rf"{_NUM}(?:x{_NUM})*"
_PAIR = re.compile(rf"([a-z]+)({_VALUE})?")
_FAMILY = re.compile(r"^[a-z][a-z0-9]*$")
_DTYPE = re.compile(r"^[a-z]+\d*$")

FLT_MAX = float(np.finfo(np.float32).max)


def f32(x: float) -> float:
    """The float32 value of an attribute, as a Python float: what every problem stores."""
    return float(np.float32(x))


def format_number(x: float | int) -> str:
    """Shortest positional decimal for a float32-valued attribute; ints stay ints."""
    if isinstance(x, bool):
        return str(int(x))
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    text = np.format_float_positional(np.float32(x), trim="-")
    return "0" if text == "-0" else text


def format_dims(dims: tuple[int, ...] | list[int]) -> str:
    """``1x64x56x56``; a rank-0 tensor prints as an empty value."""
    return "x".join(str(int(d)) for d in dims)


@dataclass(frozen=True)
class LayerKey:
    """A key split into tokens of (name, value) pairs. ``str(parse_key(s)) == s``."""

    family: str
    tokens: tuple[tuple[tuple[str, str | None], ...], ...]

    def __str__(self) -> str:
        return self.family + ":" + "_".join(
            "".join(name + (value or "") for name, value in token) for token in self.tokens
        )

    def pairs(self) -> Iterator[tuple[str, str | None]]:
        for token in self.tokens:
            yield from token


def parse_key(text: str) -> LayerKey:
    """Split a key into its tokens (the grammar only; ``parse_layer_key`` gives the problem)."""
    family, sep, rest = text.partition(":")
    if not sep or not _FAMILY.match(family) or not rest:
        raise LayerKeyError(f"not a layer key (want family:tokens): {text!r}")
    tokens = []
    for token in rest.split("_"):
        pairs = []
        pos = 0
        for m in _PAIR.finditer(token):
            if m.start() != pos:
                break
            pairs.append((m.group(1), m.group(2)))
            pos = m.end()
        if pos != len(token) or not pairs:
            raise LayerKeyError(f"bad token {token!r} in layer key {text!r}")
        tokens.append(tuple(pairs))
    return LayerKey(family, tuple(tokens))


def key_hash(key: str) -> str:
    """Stable 16-hex-digit id of a key (sha256, independent of Python's hash seed)."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]


# --- declarative key fields ----------------------------------------------------------------

_REQUIRED: Any = object()


@dataclass(frozen=True)
class _F:
    """One field of a family's key grammar.

    Kinds: ``int``, ``bool`` (0/1), ``float``, ``dims``, ``floats`` (x-joined), ``word`` (the value
    is printed bare), ``words`` (one bare token each), ``shapes`` (one ``name<dims>`` token each),
    ``flag`` (the name, printed when true) and ``bound`` (a clip bound: omitted at its default
    ±FLT_MAX, ``<name>dyn`` when None, i.e. a run-time tensor).

    A token is left out when all its fields are at their defaults; inside a printed token,
    flags, bounds, empty lists and None values are left out one by one, and ``same`` fields
    (asymmetric pads) are left out together while each equals the field it names.
    """

    name: str
    attr: str
    kind: str = "int"
    default: Any = _REQUIRED
    same: str = ""

    @property
    def solo(self) -> bool:
        return self.kind in ("flag", "bound", "words", "floats") or self.default is None


def _read(f: _F, value: str | None, text: str) -> Any:
    if f.kind == "dims":
        return tuple(int(v) for v in value.split("x")) if value else ()
    if value is None:
        raise LayerKeyError(f"{f.name} needs a value in layer key {text!r}")
    if f.kind == "int":
        return int(value)
    if f.kind == "bool":
        return bool(int(value))
    if f.kind in ("float", "bound"):
        return f32(float(value))
    if f.kind == "floats":
        return tuple(f32(float(v)) for v in value.split("x"))
    raise AssertionError(f.kind)


def _print(f: _F, v: Any) -> str:
    if f.kind in ("int", "bool", "float", "bound"):
        return f.name + format_number(v) if v is not None else f.name + "dyn"
    if f.kind == "dims":
        return f.name + format_dims(v)
    if f.kind == "floats":
        return f.name + "x".join(format_number(x) for x in v)
    if f.kind == "flag":
        return f.name if v else ""
    if f.kind == "word":
        return str(v)
    raise AssertionError(f.kind)


class Problem:
    """Base of the problem records. Subclasses are frozen dataclasses with a ``KEY`` grammar."""

    FAMILY: ClassVar[str] = ""
    KEY: ClassVar[tuple[tuple[_F, ...], ...]] = ()

    @property
    def family(self) -> str:
        return self.FAMILY

    @property
    def identity(self) -> bool:
        """True when inference computes nothing (the output is the input): it costs no time."""
        return False

    @property
    def view(self) -> bool:
        """True when the op only relabels its input's shape (Reshape, Flatten, ...): the output
        is the input's bytes, so no kernel runs and it costs no time."""
        return False

    def macs(self) -> int:
        return 0

    def flops(self) -> int | None:
        """Floating-point operations of one run, by the convention in the README ("Work"):
        2 per multiply-add plus what else the op computes per element; data movement is 0.
        None: a family that does not model its work (an op no library runs)."""
        return 2 * self.macs()

    def compulsory_bytes(self, inputs: int, outputs: int) -> int:
        """The fewest bytes any kernel of the problem moves, given its tensors' bytes: every
        input read and every output written once, unless the op can skip inputs. The memory
        roof of the speed-of-light analysis (docs/speed-of-light.md) rests on it."""
        return inputs + outputs

    def text(self) -> str:
        """The key without its dtype (``format_problem``)."""
        tokens: list[str] = []
        for spec in self.KEY:
            values = [getattr(self, f.attr) for f in spec]
            if len(spec) == 1 and spec[0].kind in ("shapes", "words"):
                f = spec[0]
                tokens += [f.name + format_dims(s) for s in values[0]] if f.kind == "shapes" else list(values[0])
                continue
            if all(f.default is not _REQUIRED and v == f.default for f, v in zip(spec, values)):
                continue
            same = [f for f in spec if f.same]
            hide_same = all(getattr(self, f.attr) == getattr(self, f.same) for f in same)
            parts = [_print(f, v) for f, v in zip(spec, values)
                     if not (f.solo and v == f.default) and not (f.same and hide_same)]
            text = ""
            for part in parts:  # a part without a value (``mindyn``) would run into the next name
                text += ("_" if text and text[-1].isalpha() else "") + part
            if text:
                tokens.append(text)
        return self.family + ":" + "_".join(tokens)

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}  # type: ignore[arg-type]

    @classmethod
    def parse_tokens(cls, key: LayerKey, text: str) -> "Problem":
        pairs = list(key.pairs())
        claimed = [False] * len(pairs)
        values: dict[str, Any] = {}
        words: list[_F] = []
        for spec in cls.KEY:
            for f in spec:
                if f.kind in ("word", "words"):
                    words.append(f)
                    continue
                hits = [i for i, (n, v) in enumerate(pairs) if not claimed[i] and
                        (n == f.name or (f.kind == "bound" and n == f.name + "dyn" and v is None))]
                if f.kind == "flag":
                    hits = [i for i in hits if pairs[i][1] is None][:1]
                elif f.kind != "shapes":
                    hits = hits[:1]
                for i in hits:
                    claimed[i] = True
                if f.kind == "shapes":
                    values[f.attr] = tuple(_read(_F(f.name, f.attr, "dims"), pairs[i][1], text) for i in hits)
                elif f.kind == "flag":
                    values[f.attr] = bool(hits)
                elif hits:
                    n, v = pairs[hits[0]]
                    values[f.attr] = None if n != f.name else _read(f, v, text)
                elif f.same:
                    values[f.attr] = values[f.same]
                elif f.default is not _REQUIRED:
                    values[f.attr] = f.default
                else:
                    raise LayerKeyError(f"layer key {text!r} lacks {f.name}")
        bare = [i for i, (n, v) in enumerate(pairs) if not claimed[i] and v is None]
        for f in words:
            taken = bare[:1] if f.kind == "word" else bare
            if f.kind == "word" and not taken:
                raise LayerKeyError(f"layer key {text!r} lacks its {f.attr} word")
            names = tuple(pairs[i][0] for i in taken)
            values[f.attr] = names[0] if f.kind == "word" else names
            for i in taken:
                claimed[i] = True
            bare = bare[len(taken):]
        extra = [n + (v or "") for (n, v), c in zip(pairs, claimed) if not c]
        if extra:
            raise LayerKeyError(f"layer key {text!r} has fields {cls.FAMILY} does not know: {', '.join(extra)}")
        return cls(**values)


# --- the families ----------------------------------------------------------------------------

def _windowed(inputs: int, kernel: tuple[int, ...], strides: tuple[int, ...]) -> int:
    """Input bytes a sliding window must read: where the stride exceeds the window, the
    positions between windows are never read (a 1×1 stride-2 conv reads a quarter)."""
    return math.ceil(inputs * math.prod(min(1.0, k / s) for k, s in zip(kernel, strides)))


def _pads() -> tuple[_F, ...]:
    return (_F("ph", "pt"), _F("pw", "pl"), _F("pb", "pb", same="pt"), _F("pr", "pr", same="pl"))


@dataclass(frozen=True)
class _Conv2d(Problem):
    """The fields of a 2-D convolution (NCHW) and of its transpose; pads top/left/bottom/right."""

    KEY: ClassVar[tuple[tuple[_F, ...], ...]] = (
        (_F("mb", "mb"),), (_F("ic", "ic"), _F("ih", "ih"), _F("iw", "iw")),
        (_F("oc", "oc"), _F("oh", "oh"), _F("ow", "ow")), (_F("kh", "kh"), _F("kw", "kw")),
        (_F("sh", "sh"), _F("sw", "sw")), _pads(), (_F("dh", "dh"), _F("dw", "dw")), (_F("g", "g"),),
        (_F("bias", "bias", "bool"),))

    mb: int
    ic: int
    ih: int
    iw: int
    oc: int
    oh: int
    ow: int
    kh: int
    kw: int
    sh: int
    sw: int
    pt: int
    pl: int
    pb: int
    pr: int
    dh: int
    dw: int
    g: int
    bias: bool

    def flops(self) -> int:
        """2 per multiply-add, and the bias's add per output element."""
        return 2 * self.macs() + (self.mb * self.oc * self.oh * self.ow if self.bias else 0)


@dataclass(frozen=True)
class ConvProblem(_Conv2d):
    """2-D convolution (NCHW), as cuDNN and oneDNN take it."""

    FAMILY: ClassVar[str] = "conv"

    def macs(self) -> int:
        return self.mb * self.oc * self.oh * self.ow * (self.ic // self.g) * self.kh * self.kw

    def compulsory_bytes(self, inputs: int, outputs: int) -> int:
        return _windowed(inputs, (self.kh, self.kw), (self.sh, self.sw)) + outputs


@dataclass(frozen=True)
class DeconvProblem(_Conv2d):
    """2-D transposed convolution (ONNX ConvTranspose, oneDNN deconvolution): the same fields
    as a convolution's, read from the output's side; the end pads are what makes the output
    size come out (ONNX's output_padding included)."""

    FAMILY: ClassVar[str] = "deconv"

    def macs(self) -> int:
        return self.mb * self.ic * self.ih * self.iw * (self.oc // self.g) * self.kh * self.kw


@dataclass(frozen=True)
class PoolProblem(Problem):
    """2-D pooling; ``alg``: max, gmax, avgi (count pads), avgx (exclude pads), gavg."""

    FAMILY: ClassVar[str] = "pool"
    KEY: ClassVar[tuple[tuple[_F, ...], ...]] = (
        (_F("", "alg", "word"),), (_F("mb", "mb"), _F("ic", "ic"), _F("ih", "ih"), _F("iw", "iw")),
        (_F("oh", "oh"), _F("ow", "ow")), (_F("kh", "kh"), _F("kw", "kw")), (_F("sh", "sh"), _F("sw", "sw")),
        _pads(), (_F("dh", "dh", default=1), _F("dw", "dw", default=1)))

    alg: str
    mb: int
    ic: int
    ih: int
    iw: int
    oh: int
    ow: int
    kh: int
    kw: int
    sh: int
    sw: int
    pt: int
    pl: int
    pb: int
    pr: int
    dh: int = 1
    dw: int = 1

    def flops(self) -> int:
        """Every output reads its window (a compare or an add each, padding included); an
        average divides once more per output."""
        out = self.mb * self.ic * self.oh * self.ow
        return out * self.kh * self.kw + (out if self.alg in ("avgi", "avgx", "gavg") else 0)

    def compulsory_bytes(self, inputs: int, outputs: int) -> int:
        return _windowed(inputs, (self.kh, self.kw), (self.sh, self.sw)) + outputs


@dataclass(frozen=True)
class BnormProblem(Problem):
    """Batch normalization over an (N, C, H, W) view. ``per_activation``: ONNX ``spatial=0``
    (statistics per C×H×W element); ``training``: ``training_mode=1`` (batch statistics)."""

    FAMILY: ClassVar[str] = "bnorm"
    KEY: ClassVar[tuple[tuple[_F, ...], ...]] = (
        (_F("mb", "mb"), _F("ic", "ic"), _F("ih", "ih"), _F("iw", "iw")), (_F("eps", "eps", "float"),),
        (_F("peract", "per_activation", "flag", False),), (_F("train", "training", "flag", False),))

    mb: int
    ic: int
    ih: int
    iw: int
    eps: float
    per_activation: bool = False
    training: bool = False

    def flops(self) -> int:
        """(x − mean) / √(var + ε) · γ + β: 4 per element, plus the statistics in training
        (sum, subtract, square, sum: 4 more)."""
        return (8 if self.training else 4) * self.mb * self.ic * self.ih * self.iw


@dataclass(frozen=True)
class LrnProblem(Problem):
    FAMILY: ClassVar[str] = "lrn"
    KEY: ClassVar[tuple[tuple[_F, ...], ...]] = (
        (_F("mb", "mb"), _F("ic", "ic"), _F("ih", "ih"), _F("iw", "iw")), (_F("ls", "size"),),
        (_F("alpha", "alpha", "float"), _F("beta", "beta", "float"), _F("k", "k", "float")))

    mb: int
    ic: int
    ih: int
    iw: int
    size: int
    alpha: float
    beta: float
    k: float

    def flops(self) -> int:
        """Per element: the window's squares and their sum (2·size), then k + α/size·Σ, its
        power and the division."""
        return (2 * self.size + 3) * self.mb * self.ic * self.ih * self.iw


@dataclass(frozen=True)
class EltwiseProblem(Problem):
    """An element-wise activation. ``alpha``/``beta`` where the op has them (else None);
    ``min``/``max`` for Clip (±FLT_MAX: unbounded; None: a run-time tensor)."""

    FAMILY: ClassVar[str] = "eltwise"
    KEY: ClassVar[tuple[tuple[_F, ...], ...]] = (
        (_F("", "alg", "word"),), (_F("in", "shape", "dims"),),
        (_F("alpha", "alpha", "float", None), _F("beta", "beta", "float", None),
         _F("min", "min", "bound", -FLT_MAX), _F("max", "max", "bound", FLT_MAX)))

    alg: str
    shape: tuple[int, ...]
    alpha: float | None = None
    beta: float | None = None
    min: float | None = -FLT_MAX
    max: float | None = FLT_MAX

    def flops(self) -> int:
        return math.prod(self.shape)  # one function evaluation per element


@dataclass(frozen=True)
class PreluProblem(Problem):
    FAMILY: ClassVar[str] = "prelu"
    KEY: ClassVar[tuple[tuple[_F, ...], ...]] = ((_F("in", "shape", "dims"),), (_F("slope", "slope", "dims"),))

    shape: tuple[int, ...]
    slope: tuple[int, ...]

    def flops(self) -> int:
        return math.prod(self.shape)


COMMUTATIVE = ("add", "mul", "min", "max", "sum", "eq")


def broadcast(shapes: tuple[tuple[int, ...], ...]) -> tuple[int, ...]:
    """NumPy/ONNX multidirectional broadcasting of the shapes."""
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for axis in range(rank):
        dims = {s[axis - rank + len(s)] for s in shapes if axis - rank + len(s) >= 0}
        big = dims - {1}
        out.append(max(big) if big else 1)
    return tuple(out)


@dataclass(frozen=True)
class BinaryProblem(Problem):
    """Element-wise binary (n-ary for Sum) with broadcasting. Operands of commutative ops are in
    canonical order (``canonical_operands``); ``exponent`` is Pow's constant uniform exponent.
    The comparisons (``eq``, ``gt``, ``lt``) write booleans."""

    FAMILY: ClassVar[str] = "binary"
    KEY: ClassVar[tuple[tuple[_F, ...], ...]] = (
        (_F("", "alg", "word"),), (_F("in", "shapes", "shapes"),), (_F("exp", "exponent", "float", None),))

    alg: str
    shapes: tuple[tuple[int, ...], ...]
    exponent: float | None = None

    @property
    def out(self) -> tuple[int, ...]:
        return broadcast(self.shapes)

    def flops(self) -> int:
        return max(len(self.shapes) - 1, 1) * math.prod(self.out)  # n inputs: n − 1 ops per output


def canonical_operands(alg: str, shapes: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, ...], ...]:
    """Operands of a commutative op in one order: those with the output's shape first, then by
    rank and dims; ``Add(x, b)`` and ``Add(b, x)`` are one problem."""
    if alg not in COMMUTATIVE:
        return shapes
    out = broadcast(shapes)
    return tuple(sorted(shapes, key=lambda s: (tuple(s) != out, -len(s), tuple(s))))


@dataclass(frozen=True)
class GemmProblem(Problem):
    """ONNX Gemm: ``alpha·op(A)·op(B) + beta·C``; ``c`` is C's shape (None: no C, beta is 0)."""

    FAMILY: ClassVar[str] = "gemm"
    KEY: ClassVar[tuple[tuple[_F, ...], ...]] = (
        (_F("m", "m"), _F("n", "n"), _F("k", "k")), (_F("ta", "ta", "bool"), _F("tb", "tb", "bool")),
        (_F("alpha", "alpha", "float"), _F("beta", "beta", "float")), (_F("c", "c", "dims", None),))

    m: int
    n: int
    k: int
    ta: bool
    tb: bool
    alpha: float
    beta: float
    c: tuple[int, ...] | None = None

    def macs(self) -> int:
        return self.m * self.n * self.k

    def flops(self) -> int:
        """2·m·n·k, the addition of C, and a multiply per output for alpha and beta ≠ 1."""
        out = self.m * self.n
        extra = (self.alpha != 1.0) + (self.c is not None) + (self.c is not None and self.beta not in (0.0, 1.0))
        return 2 * self.macs() + extra * out


@dataclass(frozen=True)
class MatMulProblem(Problem):
    """NumPy matmul of A and B (batched over leading dims, 1-D operands promoted)."""

    FAMILY: ClassVar[str] = "matmul"
    KEY: ClassVar[tuple[tuple[_F, ...], ...]] = ((_F("a", "a", "dims"),), (_F("b", "b", "dims"),))

    a: tuple[int, ...]
    b: tuple[int, ...]

    @property
    def m(self) -> int:
        return self.a[-2] if len(self.a) > 1 else 1

    @property
    def k(self) -> int:
        return self.a[-1]

    @property
    def n(self) -> int:
        return self.b[-1] if len(self.b) > 1 else 1

    @property
    def batch(self) -> int:
        lead = broadcast((self.a[:-2], self.b[:-2]))
        return math.prod(lead)

    def macs(self) -> int:
        return self.m * self.n * self.k * self.batch


@dataclass(frozen=True)
class SoftmaxProblem(Problem):
    """Softmax/LogSoftmax over ``axis``; ``flat``: opset < 13 coerces to 2-D at a non-last axis."""

    FAMILY: ClassVar[str] = "softmax"
    KEY: ClassVar[tuple[tuple[_F, ...], ...]] = (
        (_F("", "alg", "word"),), (_F("in", "shape", "dims"),), (_F("axis", "axis"),),
        (_F("flat", "flat", "flag", False),))

    alg: str
    shape: tuple[int, ...]
    axis: int
    flat: bool = False

    def flops(self) -> int:
        """Per element: the running max, the subtraction, exp, the sum and the division (for
        LogSoftmax the log-sum subtraction): 5."""
        return 5 * math.prod(self.shape)


@dataclass(frozen=True)
class DropoutProblem(Problem):
    """Dropout. At inference (``training`` false) it is the identity: the ratio changes nothing
    and is not part of the problem."""

    FAMILY: ClassVar[str] = "dropout"
    KEY: ClassVar[tuple[tuple[_F, ...], ...]] = (
        (_F("in", "shape", "dims"),), (_F("ratio", "ratio", "float", None),), (_F("train", "training", "flag", False),))

    shape: tuple[int, ...]
    ratio: float | None = None
    training: bool = False

    @property
    def identity(self) -> bool:
        return not self.training

    def flops(self) -> int:
        return math.prod(self.shape) if self.training else 0  # training: the mask's multiply


# ONNX's default activations per direction
RNN_DEFAULT_ACTIVATIONS = {"lstm": ("sigmoid", "tanh", "tanh"), "gru": ("sigmoid", "tanh"), "rnn": ("tanh",)}
_GATES = {"lstm": 4, "gru": 3, "rnn": 1}


@dataclass(frozen=True)
class RnnProblem(Problem):
    """One ONNX LSTM/GRU/RNN layer. ``activations`` are empty when they are ONNX's defaults;
    ``clip`` None: no cell clip; ``peephole``: LSTM's P input; ``lbr``: GRU linear_before_reset."""

    FAMILY: ClassVar[str] = "rnn"
    KEY: ClassVar[tuple[tuple[_F, ...], ...]] = (
        (_F("", "cell", "word"),), (_F("t", "seq"), _F("mb", "mb")), (_F("ic", "ic"),), (_F("sic", "hidden"),),
        (_F("dir", "dirs"),), (_F("bias", "bias", "bool"),), (_F("lbr", "lbr", "bool", False),),
        (_F("clip", "clip", "float", None),), (_F("inforget", "input_forget", "flag", False),),
        (_F("peep", "peephole", "flag", False),), (_F("", "activations", "words", ()),),
        (_F("actalpha", "act_alpha", "floats", ()),), (_F("actbeta", "act_beta", "floats", ()),))

    cell: str
    seq: int
    mb: int
    ic: int
    hidden: int
    dirs: int
    bias: bool
    lbr: bool = False
    clip: float | None = None
    input_forget: bool = False
    peephole: bool = False
    activations: tuple[str, ...] = ()
    act_alpha: tuple[float, ...] = ()
    act_beta: tuple[float, ...] = ()

    def macs(self) -> int:
        per_step = _GATES[self.cell] * (self.ic + self.hidden) * self.hidden
        return per_step * self.seq * self.mb * self.dirs


@dataclass(frozen=True)
class ConcatProblem(Problem):
    FAMILY: ClassVar[str] = "concat"
    KEY: ClassVar[tuple[tuple[_F, ...], ...]] = ((_F("axis", "axis"),), (_F("in", "shapes", "shapes"),))

    axis: int
    shapes: tuple[tuple[int, ...], ...]

    def flops(self) -> int:
        return 0  # data movement: its cost is bytes


@dataclass(frozen=True)
class LnormProblem(Problem):
    """ONNX LayerNormalization (opset 17): normalise over the dims from ``axis`` on, then scale
    and (``bias``) shift. Those dims are contiguous, so a library sees one normalised axis."""

    FAMILY: ClassVar[str] = "lnorm"
    KEY: ClassVar[tuple[tuple[_F, ...], ...]] = (
        (_F("in", "shape", "dims"),), (_F("axis", "axis"),), (_F("eps", "eps", "float"),),
        (_F("bias", "bias", "bool"),))

    shape: tuple[int, ...]
    axis: int
    eps: float
    bias: bool

    def flops(self) -> int:
        """Per element: the mean's sum, the subtraction, the square, the variance's sum, the
        normalising multiply and the scale (6), the shift (1 more with a bias); per normalised
        row: the two divisions by its length, + ε and the reciprocal square root (4)."""
        rows = math.prod(self.shape[:self.axis])
        return (7 if self.bias else 6) * math.prod(self.shape) + 4 * rows


@dataclass(frozen=True)
class ReduceProblem(Problem):
    """A reduction (``alg``: mean, sum, max, min, prod, sumabs = ReduceL1, sqrtsumsq = ReduceL2;
    words without digits, which keys cannot hold) over sorted non-negative ``axes``;
    keepdims only relabels the output's shape and is not part of the problem."""

    FAMILY: ClassVar[str] = "reduce"
    KEY: ClassVar[tuple[tuple[_F, ...], ...]] = (
        (_F("", "alg", "word"),), (_F("in", "shape", "dims"),), (_F("axes", "axes", "dims"),))

    alg: str
    shape: tuple[int, ...]
    axes: tuple[int, ...]

    def flops(self) -> int:
        """Every input element is read once: one add (compare, multiply) each, two for the
        norms (|x| or x² before the add); per output, the mean's division or L2's square root."""
        out = math.prod(d for i, d in enumerate(self.shape) if i not in self.axes)
        per_input = 2 if self.alg in ("sumabs", "sqrtsumsq") else 1
        return per_input * math.prod(self.shape) + (out if self.alg in ("mean", "sqrtsumsq") else 0)


@dataclass(frozen=True)
class TransposeProblem(Problem):
    """ONNX Transpose: a real copy of the input into the permuted layout (``perm`` as ONNX's)."""

    FAMILY: ClassVar[str] = "transpose"
    KEY: ClassVar[tuple[tuple[_F, ...], ...]] = ((_F("in", "shape", "dims"),), (_F("perm", "perm", "dims"),))

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
    KEY: ClassVar[tuple[tuple[_F, ...], ...]] = (
        (_F("", "op", "word"),), (_F("", "how", "word"),), (_F("in", "src", "dims", None),),
        (_F("out", "outs", "shapes"),), (_F("at", "offsets", "shapes"),))

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
class AttentionProblem(Problem):
    """The ONNX Attention op (opset 23) over 4-d Q [B, H, S, D], K [B, H, Skv, D] and V
    [B, H, Skv, Dv]: softmax(scale·Q·Kᵀ + mask)·V. ``mask``: the float attn_mask's shape (None:
    none); ``causal``: is_causal; ``scale`` None is ONNX's default 1/√D."""

    FAMILY: ClassVar[str] = "attention"
    KEY: ClassVar[tuple[tuple[_F, ...], ...]] = (
        (_F("q", "q", "dims"),), (_F("k", "k", "dims"),), (_F("v", "v", "dims"),), (_F("mask", "mask", "dims", None),),
        (_F("causal", "causal", "flag", False),), (_F("scale", "scale", "float", None),))

    q: tuple[int, ...]
    k: tuple[int, ...]
    v: tuple[int, ...]
    mask: tuple[int, ...] | None = None
    causal: bool = False
    scale: float | None = None

    def macs(self) -> int:
        b, h, s, d = self.q
        return b * h * s * self.k[2] * (d + self.v[3])

    def flops(self) -> int:
        """The two GEMMs, and per score: the scale, the mask's add (a causal one too) and the
        softmax's 5."""
        b, h, s, _ = self.q
        per_score = 6 + (self.mask is not None or self.causal)
        return 2 * self.macs() + per_score * b * h * s * self.k[2]


@dataclass(frozen=True)
class ResampleProblem(Problem):
    """ONNX Resize/Upsample of the spatial dims (``alg``: nearest or linear), the batch and
    channel dims unchanged."""

    FAMILY: ClassVar[str] = "resample"
    KEY: ClassVar[tuple[tuple[_F, ...], ...]] = (
        (_F("", "alg", "word"),), (_F("in", "shape", "dims"),), (_F("out", "out", "dims"),))

    alg: str
    shape: tuple[int, ...]
    out: tuple[int, ...]

    def flops(self) -> int:
        """Nearest copies (0); linear weighs the 2^s neighbours over s spatial dims per output
        (2^s multiplies, 2^s − 1 adds)."""
        corners = 2 ** (len(self.shape) - 2)
        return 0 if self.alg == "nearest" else (2 * corners - 1) * math.prod(self.out)

    def compulsory_bytes(self, inputs: int, outputs: int) -> int:
        """A downsample reads only the neighbours of its outputs (1 per spatial dim nearest, 2
        linear)."""
        taps = 1 if self.alg == "nearest" else 2
        share = math.prod(min(1.0, taps * o / i) for i, o in zip(self.shape[2:], self.out[2:]))
        return math.ceil(inputs * share) + outputs


# Ops whose output is their input's data under another shape: views in every framework.
VIEW_OPS = ("reshape", "squeeze", "unsqueeze", "flatten", "identity")


@dataclass(frozen=True)
class GenericProblem(Problem):
    """An op no family models: its key is the op word and descriptive tokens (input shapes,
    small constant values, outputs, attributes), built by ``ops``; no library call runs it."""

    op: str
    tokens: tuple[str, ...]

    @property
    def family(self) -> str:
        return self.op

    @property
    def view(self) -> bool:
        return self.op in VIEW_OPS

    def flops(self) -> int | None:
        return 0 if self.view else None  # an op no family models: the layer counts one per output element

    def text(self) -> str:
        return self.op + ":" + "_".join(self.tokens)

    def to_json(self) -> dict:
        return {"op": self.op, "tokens": list(self.tokens)}


TYPED: dict[str, type[Problem]] = {cls.FAMILY: cls for cls in (
    ConvProblem, PoolProblem, BnormProblem, LrnProblem, EltwiseProblem, PreluProblem, BinaryProblem,
    GemmProblem, MatMulProblem, SoftmaxProblem, DropoutProblem, RnnProblem, ConcatProblem, LnormProblem,
    ReduceProblem, TransposeProblem, CopyProblem, AttentionProblem, DeconvProblem,
    ResampleProblem)}


def format_problem(p: Problem) -> str:
    return p.text()


@functools.lru_cache(maxsize=65536)
def parse_problem(text: str) -> Problem:
    """The problem a key (without dtype) names; a family Benanza does not model is generic."""
    key = parse_key(text)
    cls = TYPED.get(key.family)
    if cls is None:
        rest = text.partition(":")[2]
        return GenericProblem(key.family, tuple(rest.split("_")))
    problem = cls.parse_tokens(key, text)
    if problem.text() != text:
        raise LayerKeyError(f"layer key {text!r} is not in canonical form (it reads as {problem.text()!r})")
    return problem


def layer_key(problem: Problem, dtype: str) -> str:
    """The key of a problem in a dtype: what layers, variants and the database are keyed by."""
    return f"{problem.text()}_{dtype}"


@functools.lru_cache(maxsize=65536)
def parse_layer_key(text: str) -> tuple[Problem, str]:
    """(problem, dtype) of a layer key: the inverse of ``layer_key``."""
    head, sep, dtype = text.rpartition("_")
    if not sep or not _DTYPE.match(dtype):
        raise LayerKeyError(f"layer key {text!r} does not end in a dtype")
    return parse_problem(head), dtype
