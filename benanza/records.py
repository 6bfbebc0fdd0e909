"""Typed records shared by the generator, runner, performance database and analyzer."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from enum import Enum

from .errors import BenanzaError

# Order of the variant fields in a benchmark name; the layer key comes first.
_VARIANT_FIELDS = ("backend", "api", "algo", "dtype", "layout", "math", "fusion")

# Default relative standard deviation (stddev / median of the repetitions) above which a
# result is unstable: re-measured by `benanza run`, flagged when it stays so.
UNSTABLE_RSD = 0.1


class Status(str, Enum):
    OK = "ok"
    FAILED = "failed"  # crashed, timed out, or the library returned an error at run time
    UNSUPPORTED = "unsupported"  # the library refused this combination (status string kept)


@dataclass(frozen=True)
class Variant:
    """One benchmark: a layer key run through one library call in one configuration.

    Its ``name`` is the Google Benchmark name, so results map back without guessing:
    ``conv:mb1_..._f32/backend=cudnn/api=cudnnConvolutionForward/algo=WINOGRAD/dtype=f16/``
    ``layout=nhwc/math=tensor_op/fusion=none``.
    """

    layer_key: str
    backend: str  # "cudnn" | "onednn"
    api: str  # library call or primitive, e.g. cudnnConvolutionBiasActivationForward, convolution
    algo: str = "default"  # cuDNN algorithm, oneDNN algorithm ("direct", "winograd", "auto")
    dtype: str = "f32"  # f32 | f16 | bf16
    layout: str = "nchw"  # nchw | nhwc | any (oneDNN picks, blocked)
    math: str = "default"  # default | tensor_op | tf32
    fusion: str = "none"  # a FusionPattern name, or "none"

    @property
    def name(self) -> str:
        return self.layer_key + "".join(f"/{f}={getattr(self, f)}" for f in _VARIANT_FIELDS)

    @classmethod
    def from_name(cls, name: str) -> "Variant":
        """Inverse of ``name``; ignores segments Google Benchmark appends (manual_time, repeats)."""
        parts = name.split("/")
        fields = dict(p.split("=", 1) for p in parts[1:] if "=" in p)
        missing = [f for f in _VARIANT_FIELDS if f not in fields]
        if missing:
            raise BenanzaError(f"benchmark name {name!r} lacks variant fields {missing}")
        return cls(parts[0], **{f: fields[f] for f in _VARIANT_FIELDS})


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
    metrics: dict = field(default_factory=dict, hash=False, compare=False)
    timestamp: str = ""
    # Dispersion stayed above the run's threshold after the bounded re-measurements: the
    # median is stored, and every analysis that uses it says so.
    unstable: bool = False

    @property
    def ok(self) -> bool:
        return self.status is Status.OK and self.median_ms is not None

    @property
    def rsd(self) -> float | None:
        """Relative standard deviation of the repetitions (stddev / median); None without timings."""
        if not self.ok or self.stddev_ms is None or not self.median_ms:
            return None
        return self.stddev_ms / self.median_ms
