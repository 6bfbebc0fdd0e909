"""Typed records shared by the generator, runner, performance database and analyzer."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, TypeVar, cast

from .errors import BenanzaError
from .problems import Problem, layer_key, parse_layer_key

# Order of the variant fields in a benchmark name; the layer key comes first.
_VARIANT_FIELDS = ("backend", "api", "algo", "dtype", "layout", "math", "fusion")


_E = TypeVar("_E", bound="StrEnum")


class StrEnum(str, Enum):
    """An enum whose members are their strings: equal to them, hashed, formatted, written to
    JSON and stored in SQLite as the value, so files and databases hold the same text as before."""

    def __str__(self) -> str:
        return str(self.value)

    @classmethod
    def of(cls: type[_E], value: str, what: str) -> _E:
        """The member ``value`` names; any other string is an error saying what is offered."""
        # a dict lookup: calling the enum costs ten times as much, once per field of every
        # variant an analysis reads from the database
        member = cls._value2member_map_.get(value) if isinstance(value, str) else None
        if member is not None:
            return cast(_E, member)
        try:
            return cls(value)
        except ValueError:
            offered = ", ".join(m.value for m in cls)
            raise BenanzaError(f"{what} {value!r}: not one of {offered}") from None


class Dtype(StrEnum):
    """What a benchmark computes in."""

    F32 = "f32"
    F16 = "f16"
    BF16 = "bf16"
    # integer layers of quantized models (oneDNN's int8 primitives): the type of their activations
    U8 = "u8"
    I8 = "i8"
    # ONNX bool (a mask's And, Or), one byte 0/1: oneDNN's u8
    B = "b"


class Layout(StrEnum):
    NCHW = "nchw"
    NHWC = "nhwc"
    ANY = "any"  # oneDNN picks (blocked)
    PLAIN = "plain"  # oneDNN: a family without spatial layouts (dense row-major)
    # oneDNN: a row-major tensor reordered so the op's axis is innermost, and back (a softmax over
    # another axis, which only oneDNN's reference code takes row-major)
    AXIS_INNER = "axis_inner"


class Math(StrEnum):
    """cuDNN/cuBLAS math modes; DEFAULT: the call has no math setting (and every oneDNN one)."""

    DEFAULT = "default"
    FMA = "fma"
    TF32_ALLOWED = "tf32_allowed"
    TENSOR_OP = "tensor_op"


class Status(StrEnum):
    OK = "ok"
    FAILED = "failed"  # crashed, timed out, or the library returned an error at run time
    UNSUPPORTED = "unsupported"  # the library refused this combination (status string kept)


@dataclass(frozen=True)
class Variant:
    """One benchmark: a problem run through one library call in one configuration.

    The problem is computed in the variant's ``dtype``, so ``layer_key`` is the problem's key in
    that dtype: the fp16 variant of an fp32 layer is keyed ``…_f16``. Its ``name`` is the Google
    Benchmark name, so results map back without guessing:
    ``conv:mb1_..._f16/backend=cudnn/api=cudnnConvolutionForward/algo=WINOGRAD/dtype=f16/``
    ``layout=nhwc/math=tensor_op/fusion=none``.
    """

    problem: Problem
    backend: str  # "cudnn" | "onednn"
    api: str  # library call or primitive, e.g. cudnnConvolutionBiasActivationForward, convolution
    algo: str = "default"  # cuDNN algorithm, oneDNN algorithm ("direct", "winograd", "auto")
    dtype: Dtype = Dtype.F32
    layout: Layout = Layout.NCHW
    math: Math = Math.DEFAULT
    fusion: str = "none"  # a FusionPattern name, or "none"
    layer_key: str = field(init=False, compare=False)

    # Written out (the dataclass keeps it) to take the plain strings that backends, variant
    # names and database rows hold, and store the members they name.
    def __init__(self, problem: Problem, backend: str, api: str, algo: str = "default",
                 dtype: Dtype | str = Dtype.F32, layout: Layout | str = Layout.NCHW,
                 math: Math | str = Math.DEFAULT, fusion: str = "none") -> None:
        put = object.__setattr__
        put(self, "problem", problem)
        put(self, "backend", backend)
        put(self, "api", api)
        put(self, "algo", algo)
        put(self, "dtype", Dtype.of(dtype, "dtype"))
        put(self, "layout", Layout.of(layout, "layout"))
        put(self, "math", Math.of(math, "math"))
        put(self, "fusion", fusion)
        put(self, "layer_key", layer_key(problem, self.dtype.value))

    @property
    def name(self) -> str:
        # kept once made (the record is frozen): analyses and runs look variants up by name
        cached: str | None = self.__dict__.get("_name")
        if cached is None:
            cached = self.layer_key + "".join(f"/{f}={getattr(self, f)}" for f in _VARIANT_FIELDS)
            object.__setattr__(self, "_name", cached)
        return cached

    def to_json(self) -> dict[str, str]:
        """The ``variants`` table row (and variants.json entry): name, layer_key and the fields."""
        return {"name": self.name, "layer_key": self.layer_key} | {f: str(getattr(self, f)) for f in _VARIANT_FIELDS}

    @classmethod
    def from_json(cls, d: dict[str, str]) -> Variant:
        return cls.of_key(d["layer_key"], **{f: d[f] for f in _VARIANT_FIELDS})

    @classmethod
    def of_key(cls, key: str, backend: str, api: str, algo: str = "default", dtype: str | None = None,
               layout: str = "nchw", math: str = "default", fusion: str = "none") -> Variant:
        """The variant of a layer key; its dtype is the key's (a different ``dtype`` is an error)."""
        problem, key_dtype = parse_layer_key(key)
        if dtype not in (None, key_dtype):
            raise BenanzaError(f"variant of {key!r} cannot compute in {dtype}: the key is {key_dtype}")
        return cls(problem, backend, api, algo, key_dtype, layout, math, fusion)

    @classmethod
    def from_name(cls, name: str) -> Variant:
        """Inverse of ``name``; ignores segments Google Benchmark appends (manual_time, repeats)."""
        parts = name.split("/")
        fields_ = dict(p.split("=", 1) for p in parts[1:] if "=" in p)
        missing = [f for f in _VARIANT_FIELDS if f not in fields_]
        if missing:
            raise BenanzaError(f"benchmark name {name!r} lacks variant fields {missing}")
        problem, dtype = parse_layer_key(parts[0])
        if dtype != fields_["dtype"]:
            raise BenanzaError(f"benchmark name {name!r}: its key is {dtype}, its dtype field {fields_['dtype']}")
        return cls(problem, **{f: fields_[f] for f in _VARIANT_FIELDS})


def variant_order(v: Variant) -> tuple[str, str]:
    """The order of variants in everything the generator writes: by problem text (which starts
    with the family: by family, then problem), then by name. A key of the variant alone, so the
    same models give the same files whatever order they are given in."""
    return (v.problem.text(), v.name)


@dataclass(frozen=True)
class System:
    """A machine and its software stack; results compare only within one stack."""

    name: str  # what the user called it (--system)
    backend: str
    device: str  # CPU or GPU model
    stack: tuple[tuple[str, str], ...]  # sorted (component, version): driver, cuda, cudnn, ...

    @property
    def stack_id(self) -> str:
        """Identifies the name together with the stack: two names on one machine are two systems."""
        blob = json.dumps([self.name, self.backend, self.device, list(self.stack)], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @property
    def threads(self) -> int | None:
        """The CPU threads its benchmarks ran (None: a GPU's stack, or one stored without them)."""
        threads = dict(self.stack).get("threads", "")
        return int(threads) if threads.isdigit() and int(threads) > 0 else None


# Result.metrics of a time taken without the framework's profiler (backends/ort.py): the copies
# of the subgraph its clock ran, and the profiler's reading of the same variant (10th percentile)
REPLICAS_METRIC = "replicas"
TRACED_METRIC = "profiled_ms"


@dataclass(frozen=True)
class Result:
    """What one benchmark run produced on one system."""

    variant: Variant
    system: str
    status: Status
    message: str = ""  # library status string or crash reason when not OK
    median_ms: float | None = None
    mean_ms: float | None = None
    stddev_ms: float | None = None
    min_ms: float | None = None
    iterations: int = 0
    repetitions: int = 0
    workspace_bytes: int = 0
    implementation: str = ""  # oneDNN impl name, or the cuDNN algorithm actually run
    metrics: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    timestamp: str = ""
    # Dispersion stayed above the run's threshold after the bounded re-measurements: the
    # median is stored, and every analysis that uses it says so.
    unstable: bool = False
    # The per-call samples the runtime timed (CPU backends; docs/measurement.md): the low
    # percentile a bound uses, their median and interquartile range, and how many there were.
    low_ms: float | None = None
    sample_median_ms: float | None = None
    sample_iqr_ms: float | None = None
    samples: int = 0
    # Share of the benchmark's runnable time lost to other work while it ran (None: not
    # measured); the share of its calls expected to have run without a thread losing its CPU; and whether
    # it stayed spoiled by contention after the re-measurements: a contended result never
    # enters a bound unless the analysis is asked to label it so.
    contention: float | None = None
    clean_share: float | None = None
    contended: bool = False
    # Adaptive sampling (`benanza run --precision`): the relative half-width of the 95%
    # confidence interval of the low percentile when sampling stopped (None: the fixed budget,
    # or an interval the samples could not bound); it replaces ``rsd`` as the stability check.
    precision: float | None = None
    # Racing (`benanza run --precision`, not --no-race): sampling stopped early because even the
    # lowest this variant's interval allows is above the highest its layer's best one allows; its
    # estimate is kept, at the screening precision, and it cannot be a layer's best.
    eliminated: bool = False

    @property
    def ok(self) -> bool:
        return self.status is Status.OK and self.median_ms is not None

    @property
    def latency_ms(self) -> float | None:
        """The latency a bound uses: the samples' low percentile where the runtime timed each
        call, else (older results, GPU backends) the median of the repetitions."""
        if not self.ok:
            return None
        return self.low_ms if self.low_ms is not None else self.median_ms

    @property
    def untraced(self) -> bool:
        """Whether the stored time comes from a clock without the framework's profiler (ORT's
        replicas clock), whose own per-kernel cost the other readings of a framework hold."""
        return bool(self.metrics.get(REPLICAS_METRIC))

    @property
    def traced_ms(self) -> float | None:
        """The latency on the framework profiler's clock: the profiler's own reading kept beside an
        untraced time, else the latency (which that profiler timed, or a library's clock)."""
        traced = self.metrics.get(TRACED_METRIC)
        return float(traced) if traced is not None else self.latency_ms

    @property
    def rsd(self) -> float | None:
        """Relative standard deviation of the repetitions (stddev / median); None without timings."""
        if not self.ok or self.stddev_ms is None or not self.median_ms:
            return None
        return self.stddev_ms / self.median_ms
