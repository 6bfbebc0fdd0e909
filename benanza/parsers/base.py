"""Typed records every profile parser produces, and the helpers they share.

Parsers turn one file of one format into these records; they never analyse. A file that is
not of the format, or is cut short, raises ``ProfileFormatError`` naming the file and what
is wrong with it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import FileProblem


class ProfileFormatError(FileProblem):
    """A profile, trace or library log that cannot be parsed."""


@dataclass(frozen=True)
class Span:
    """A time interval in microseconds on the trace's own clock."""

    start_us: float
    dur_us: float

    @property
    def end_us(self) -> float:
        return self.start_us + self.dur_us


@dataclass(frozen=True)
class OpEvent:
    """One framework operator execution (ONNX Runtime node, PyTorch aten op)."""

    name: str  # the framework's node name (ORT may rename fused nodes, e.g. ``r1_nchwc``)
    op: str  # op type as the framework names it (Conv, FusedConv, ReorderInput, aten::conv2d)
    span: Span
    run: int  # which inference (0-based) it belongs to; -1 when the trace does not say
    input_shapes: tuple[tuple[int, ...], ...] = ()
    output_shapes: tuple[tuple[int, ...], ...] = ()
    provider: str = ""  # ORT execution provider, torch device
    thread: int = 0


@dataclass(frozen=True)
class KernelEvent:
    """One GPU kernel (from a Kineto trace or an Nsight Systems export)."""

    name: str
    span: Span
    correlation: int = -1  # links the kernel to the API call that launched it
    stream: int = -1
    device: int = -1


@dataclass(frozen=True)
class ApiEvent:
    """One host-side API call: CUDA runtime, OS runtime, cuDNN/cuBLAS, NVTX range."""

    name: str
    span: Span
    kind: str  # "cuda_runtime" | "osrt" | "cudnn" | "cublas" | "nvtx" | "annotation"
    correlation: int = -1
    thread: int = 0
    backtrace: tuple[str, ...] = ()  # innermost frame first, when the profile recorded one


@dataclass
class FrameworkTrace:
    """What a framework's own profiler recorded of a model run."""

    path: str
    framework: str  # "onnxruntime" | "torch" | "nsys"
    runs: list[Span] = field(default_factory=list)  # one per inference
    ops: list[OpEvent] = field(default_factory=list)
    kernels: list[KernelEvent] = field(default_factory=list)
    api_calls: list[ApiEvent] = field(default_factory=list)
    # the intra-op threads the framework's profiler says its run used (None: it does not say)
    threads: int | None = None

    def ops_of_run(self, run: int) -> list[OpEvent]:
        return [o for o in self.ops if o.run == run]


@dataclass(frozen=True)
class ConvSignature:
    """The shape parameters of a 2-D forward convolution, as libraries log them."""

    mb: int
    ic: int
    ih: int
    iw: int
    oc: int
    kh: int
    kw: int
    sh: int
    sw: int
    ph: int
    pw: int
    dh: int  # dilation, 1 = dense (oneDNN logs 0 for dense; parsers convert)
    dw: int
    g: int


@dataclass(frozen=True)
class GemmSignature:
    m: int
    n: int
    k: int
    batch: int = 1


@dataclass(frozen=True)
class LibraryCall:
    """One compute call a vendor library logged (cuDNN, cuBLAS, cuBLASLt, oneDNN)."""

    library: str  # "cudnn" | "cublas" | "cublaslt" | "onednn"
    api: str  # cudnnConvolutionForward, cublasGemmEx, oneDNN primitive kind (convolution), ...
    index: int  # position among the log's compute calls
    conv: ConvSignature | None = None
    gemm: GemmSignature | None = None
    shapes: tuple[tuple[int, ...], ...] = ()  # tensor dims in the order the log gives them
    algo: str = ""  # cuDNN algorithm / engine, cuBLAS algo, oneDNN implementation
    math: str = ""  # cuDNN math type, cuBLAS compute type
    dtype: str = ""  # f32 | f16 | bf16 | ...
    time_ms: float | None = None  # only oneDNN verbose reports a per-call time
    timestamp: str = ""
    thread: str = ""
    detail: tuple[tuple[str, str], ...] = ()  # the other logged parameters, flattened
    # What the call computes after its operation, in order, in oneDNN's post-op spelling
    # (``eltwise_relu``, ``eltwise_clip:0:6``, ``sum``, ``binary_add``…): oneDNN's attr-post-ops,
    # the activation of cuDNN's ConvolutionBiasActivationForward. Empty: nothing fused.
    post_ops: tuple[str, ...] = ()
    bias: bool | None = None  # whether the call adds a bias itself; None when the log does not say


def load_json(path: str | Path, what: str) -> object:
    """JSON from ``path`` with errors that say which file and what is wrong."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise ProfileFormatError(p, f"cannot read {what}: {exc.strerror or exc}") from None
    if not text.strip():
        raise ProfileFormatError(p, f"empty file; expected {what}")
    try:
        return json.loads(text)
    except RecursionError:
        raise ProfileFormatError(p, f"not valid {what} JSON: nested deeper than Python's JSON reader goes") from None
    except json.JSONDecodeError as exc:
        # a JSON document that does not end in its closing bracket was cut off while written
        hint = " (file looks truncated)" if not text.rstrip().endswith(("]", "}")) else ""
        raise ProfileFormatError(
            p, f"not valid {what} JSON: {exc.msg} at line {exc.lineno} column {exc.colno}{hint}"
        ) from None


def read_text(path: str | Path, what: str) -> str:
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise ProfileFormatError(p, f"cannot read {what}: {exc.strerror or exc}") from None


_DTYPES = {
    "CUDNN_DATA_FLOAT": "f32", "CUDNN_DATA_HALF": "f16", "CUDNN_DATA_BFLOAT16": "bf16",
    "CUDNN_DATA_DOUBLE": "f64", "CUDNN_DATA_INT8": "i8", "CUDA_R_32F": "f32", "CUDA_R_16F": "f16",
    "CUDA_R_16BF": "bf16", "CUDA_R_64F": "f64", "CUDA_R_8I": "i8", "f32": "f32", "f16": "f16",
    "bf16": "bf16", "s8": "i8", "u8": "u8",
}


def dtype_name(text: str) -> str:
    """Benanza's short dtype name for a library's enum spelling (unknown ones pass through)."""
    return _DTYPES.get(text.split(" ")[0], text)
