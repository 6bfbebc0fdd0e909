"""The key grammar and the base of the problem records (the registry's lowest layer).

A problem holds the shapes and attributes that change a layer's computation, never its data
type: a Layer is a problem in the model's dtype, a benchmark Variant a problem in the variant's
dtype. So the fp16 benchmark of an fp32 model's convolution is found as (its problem, f16), and
no code edits key strings. Each op family (``benanza.ops.<family>``) defines its record here's
``Problem`` subclass with a ``KEY`` grammar.

Every problem formats to a benchdnn-style key, ``family:token_token_...``, and parses back
(``parse_problem(format_problem(p)) == p``). A layer key is that text plus ``_<dtype>``:
``conv:mb1_ic64ih56iw56_oc64oh56ow56_kh3kw3_sh1sw1_ph1pw1_dh1dw1_g1_bias0_f32``.

The grammar: a token is a run of ``name value`` pairs (``ic64ih56iw56``) or a bare word
(``max``, ``flat``). Values are integers, ``x``-joined dims (``1x64x56x56``) or positional
decimals (never exponents). Floats are float32 values (ONNX attributes are), printed as the
shortest decimal that reads back to the same float32, so keys stay identical across machines
and Python versions. A family declares its key as a grammar of fields (``F``), from which
both directions are derived; a text that does not print back to itself is rejected.
"""
from __future__ import annotations

import hashlib
import math
import numbers
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass, fields
from fractions import Fraction
from typing import Any, ClassVar

from ..errors import LayerKeyError

# --- the token grammar ---------------------------------------------------------------------

_NUM = r"-?\d+(?:\.\d+)?"
_VALUE = rf"{_NUM}(?:x{_NUM})*"
_PAIR = re.compile(rf"([a-z]+)({_VALUE})?")
FAMILY = re.compile(r"^[a-z][a-z0-9]*$")
DTYPE_RE = re.compile(r"^[a-z][a-z0-9]*$")  # f32, i8, f8e4m3fn

# Float32 arithmetic by the standard library's IEEE single packing, not NumPy: every command
# that reads a key parses its floats, and NumPy's import was a fifth of `analyze --json`'s time.
_F32 = struct.Struct("<f")
_BITS = struct.Struct("<I")
_INF_BITS = 0x7F800000
FLT_MAX = _F32.unpack(_BITS.pack(_INF_BITS - 1))[0]


def f32(x: float) -> float:
    """The float32 value of an attribute (rounded to nearest, ±inf past the range), as a Python
    float: what every problem stores."""
    try:
        value: float = _F32.unpack(_F32.pack(x))[0]
    except OverflowError:  # rounds past FLT_MAX: float32's infinity, as a C cast gives
        return math.copysign(math.inf, x)
    return value


def format_number(x: float | int) -> str:
    """Shortest positional decimal for a float32-valued attribute; ints stay ints. The text NumPy's
    ``format_float_positional(np.float32(x), trim="-")`` prints (its Dragon4), negative zero as 0."""
    if isinstance(x, numbers.Integral):  # NumPy's integers, and bool, register as Integral
        return str(int(x))
    v = f32(x)
    if v != v or v in (math.inf, -math.inf):
        return "nan" if v != v else "inf" if v > 0 else "-inf"
    if v == 0:
        return "0"
    digits, point = _shortest_digits(abs(v))
    digits = digits.rstrip("0")
    if point <= 0:
        text = "0." + "0" * -point + digits
    elif point >= len(digits):
        text = digits + "0" * (point - len(digits))
    else:
        text = digits[:point] + "." + digits[point:]
    return "-" + text if v < 0 else text


def _shortest_digits(a: float) -> tuple[str, int]:
    """The fewest significant digits that read back as the positive float32 ``a`` (the one
    nearest ``a`` when two of that length do), and the count of them before the decimal point."""
    bits = _BITS.unpack(_F32.pack(a))[0]
    exact = Fraction(a)
    down = Fraction(_F32.unpack(_BITS.pack(bits - 1))[0])
    if bits + 1 < _INF_BITS:
        up = Fraction(_F32.unpack(_BITS.pack(bits + 1))[0])
    else:  # FLT_MAX: infinity's boundary lies as far above as the next float32 would
        up = 2 * exact - Fraction(_F32.unpack(_BITS.pack(bits - 1))[0])
    lo, hi = (exact + down) / 2, (exact + up) / 2
    even = bits % 2 == 0  # a decimal on a boundary reads back as the float32 with the even mantissa

    def reads_back(decimal: str) -> bool:
        q = Fraction(decimal)
        return lo < q < hi or (even and q in (lo, hi))

    for p in range(1, 10):  # 9 significant digits tell every float32 apart
        nearest = f"{a:.{p - 1}e}"  # correctly rounded
        mantissa, exp = nearest.split("e")
        if reads_back(nearest):
            return mantissa.replace(".", ""), int(exp) + 1
        # Below a power of two the interval is half as wide: the p-digit decimal on the other
        # side of ``a`` may read back although the nearest does not.
        digits = int(mantissa.replace(".", ""))
        other = digits + 1 if Fraction(nearest) < exact else digits - 1
        last = int(exp) - (p - 1)
        if other > 0 and reads_back(f"{other}e{last}"):
            return str(other), last + len(str(other))
    raise AssertionError(f"no decimal of 9 digits reads back as the float32 {a!r}")


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
    if not sep or not FAMILY.match(family) or not rest:
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

REQUIRED: Any = object()


@dataclass(frozen=True)
class F:
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
    default: Any = REQUIRED
    same: str = ""

    @property
    def solo(self) -> bool:
        return self.kind in ("flag", "bound", "words", "floats") or self.default is None


def _read(f: F, value: str | None, text: str) -> Any:
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


def _print(f: F, v: Any) -> str:
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


def windowed(inputs: int, kernel: tuple[int, ...], strides: tuple[int, ...]) -> int:
    """Input bytes a sliding window must read: where the stride exceeds the window, the
    positions between windows are never read (a 1×1 stride-2 conv reads a quarter)."""
    return math.ceil(inputs * math.prod(min(1.0, k / s) for k, s in zip(kernel, strides)))


class Problem:
    """Base of the problem records. Subclasses are frozen dataclasses with a ``KEY`` grammar."""

    FAMILY: ClassVar[str] = ""
    KEY: ClassVar[tuple[tuple[F, ...], ...]] = ()

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

    def essential_flops(self) -> int | None:
        """The FLOPs no kernel can skip: ``flops`` less the work a kernel need not do on zero
        padding. The speed-of-light defect check holds results to it (docs/speed-of-light.md)."""
        return self.flops()

    def compulsory_bytes(self, inputs: int, outputs: int) -> int:
        """The fewest bytes any kernel of the problem moves, given its tensors' bytes: every
        input read and every output written once, unless the op can skip inputs. The memory
        roof of the speed-of-light analysis (docs/speed-of-light.md) rests on it."""
        return inputs + outputs

    def text(self) -> str:
        """The key without its dtype (``format_problem``). Kept on the record once printed: a
        problem is frozen, and an analysis asks for the keys of thousands of variants."""
        cached: str | None = self.__dict__.get("_text")
        if cached is None:
            cached = self._format()
            object.__setattr__(self, "_text", cached)
        return cached

    def _format(self) -> str:
        tokens: list[str] = []
        for spec in self.KEY:
            values = [getattr(self, f.attr) for f in spec]
            if len(spec) == 1 and spec[0].kind in ("shapes", "words"):
                f = spec[0]
                tokens += [f.name + format_dims(s) for s in values[0]] if f.kind == "shapes" else list(values[0])
                continue
            if all(f.default is not REQUIRED and v == f.default for f, v in zip(spec, values)):
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

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}  # type: ignore[arg-type]

    @classmethod
    def parse_tokens(cls, key: LayerKey, text: str) -> Problem:
        pairs = list(key.pairs())
        claimed = [False] * len(pairs)
        values: dict[str, Any] = {}
        words: list[F] = []
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
                    values[f.attr] = tuple(_read(F(f.name, f.attr, "dims"), pairs[i][1], text) for i in hits)
                elif f.kind == "flag":
                    values[f.attr] = bool(hits)
                elif hits:
                    n, v = pairs[hits[0]]
                    values[f.attr] = None if n != f.name else _read(f, v, text)
                elif f.same:
                    values[f.attr] = values[f.same]
                elif f.default is not REQUIRED:
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



# The dtypes the benchmarks compute in; a layer on other data (i64 shape arithmetic, bool
# masks) is analysed in its own dtype, never in the one asked for.
FLOAT_DTYPES = ("f32", "f16", "bf16")


def layer_key(problem: Problem, dtype: str) -> str:
    """The key of a problem in a dtype: what layers, variants and the database are keyed by."""
    return f"{problem.text()}_{dtype}"
