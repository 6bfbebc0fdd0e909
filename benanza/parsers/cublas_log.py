"""cuBLAS API logs (``CUBLAS_LOGINFO_DBG=1``) and cuBLASLt API traces (``CUBLASLT_LOG_LEVEL=5``).

cuBLAS prints blocks in the same grammar as cuDNN (``I! cuBLAS (v11) function cublasGemmEx()
called:``). cuBLASLt prints one line per call::

    [2021-04-14 19:18:36][cublasLt][14337][Api][cublasLtMatmul] Adesc=[type=R_16F rows=1024 ...]
    ... computeDesc=[computeType=COMPUTE_32F scaleType=R_32F transa=OP_T] algo=[algoId=6 ...]

GEMM sizes are logged column-major; ``GemmSignature`` keeps them as logged and the matcher
compares them without regard to which operand is transposed.
"""

from __future__ import annotations

import re
from pathlib import Path

from .base import GemmSignature, LibraryCall, ProfileFormatError, dtype_name, read_text
from .blocklog import enum_name, int_list, parse_blocks

# cuBLAS 13 prints the C signature (``function cublasStatus_t cublasSgemm_v2(cublasHandle_t, ...)
# called:``), earlier versions the bare name (``function cublasGemmEx() called:``)
_HEADER = re.compile(r"^(?P<level>[IWE])! cuBLAS \(v(?P<version>[\d.]+)\) function (?:[\w ]+?\s)?(?P<function>\w+)"
                     r"\([^()]*(?:\([^()]*\)[^()]*)*\) called:")
_LT_LINE = re.compile(r"^\[(?P<time>[^\]]+)\]\[cublasLt\]\[(?P<pid>\d+)\]\[(?P<kind>Api|Trace)\]\[(?P<function>\w+)\]"
                      r"\s*(?P<args>.*)$")
_COMPUTE = re.compile(r"(gemm|gemv|Gemm|Gemv|Matmul)")


def parse_cublas_log(path: str | Path) -> list[LibraryCall]:
    """Both formats may share one file (cuBLAS routes through cuBLASLt); order is kept."""
    text = read_text(path, "cuBLAS log")
    calls: list[LibraryCall] = []
    for b in parse_blocks(text, path, _HEADER, "cuBLAS API log"):
        if not _COMPUTE.search(b.function):
            continue
        dims = [int_list(b.get(n)) for n in ("m", "n", "k")]
        gemm = GemmSignature(dims[0][0], dims[1][0], dims[2][0], batch=_first(int_list(b.get("batchCount")), 1)) \
            if all(dims) else None
        detail = tuple((p, v) for p, v in b.fields if not v.startswith("POINTER"))
        calls.append(LibraryCall(
            library="cublas", api=b.function, index=len(calls), gemm=gemm,
            algo=enum_name(b.get("algo")), math=enum_name(b.get("computeType")),
            dtype=dtype_name(enum_name(b.get("Atype", "computeType"))) if b.get("Atype") else _dtype_of(b.function),
            timestamp=b.timestamp, thread=b.thread, detail=detail))
    calls += _lt_calls(text, path, len(calls))
    if not calls and text.strip() and not _HEADER.search(text) and "[cublasLt]" not in text:
        raise ProfileFormatError(path, "no `cuBLAS (vN) function ...() called:` blocks or [cublasLt] "
                                       "lines: not a cuBLAS log")
    return calls


def _lt_calls(text: str, path: str | Path, start: int) -> list[LibraryCall]:
    """One call per cublasLtMatmul. cuBLASLt up to 12 prints the descriptors on the [Api] line;
    cuBLASLt 13 prints their addresses there (``Adesc=0X29379140``) and the descriptors on the
    [Trace] line that follows it, so an [Api] line without them waits for its process's trace."""
    calls: list[LibraryCall] = []
    waiting: dict[str, int] = {}  # pid → line number of an [Api] call whose descriptors are to come
    for lineno, line in enumerate(text.splitlines(), 1):
        m = _LT_LINE.match(line.strip())
        if not m or m.group("function") != "cublasLtMatmul":
            continue
        pid, described = m.group("pid"), "Adesc=[" in m.group("args")
        if m.group("kind") == "Api" and not described:
            if pid in waiting:
                break
            waiting[pid] = lineno
            continue
        if m.group("kind") == "Trace" and (pid not in waiting or not described):
            continue  # a trace of a call whose [Api] line held the descriptors already
        waiting.pop(pid, None)
        calls.append(_lt_call(m, start + len(calls), path, lineno))
    if waiting:
        lineno = min(waiting.values())
        raise ProfileFormatError(path, f"line {lineno}: cublasLtMatmul whose descriptors never follow (no [Trace] "
                                       f"line of the call): log truncated, or CUBLASLT_LOG_LEVEL below 5?")
    return calls


def _first(values: tuple[int, ...], default: int) -> int:
    return values[0] if values else default


def _dtype_of(function: str) -> str:
    return {"S": "f32", "D": "f64", "H": "f16"}.get(function.removeprefix("cublas")[:1], "")


def _brackets(args: str) -> dict[str, dict[str, str]]:
    """``Adesc=[type=R_16F rows=4 cols=8 ld=4]`` → {"Adesc": {"type": "R_16F", ...}}."""
    out = {}
    for name, body in re.findall(r"(\w+)=\[([^\]]*)\]", args):
        out[name] = dict(kv.split("=", 1) for kv in body.split() if "=" in kv)
    return out


def _lt_call(m: re.Match, index: int, path: str | Path, lineno: int) -> LibraryCall:
    desc = _brackets(m.group("args"))
    try:
        a, d = desc["Adesc"], desc["Ddesc"] if "Ddesc" in desc else desc["Cdesc"]
        compute = desc.get("computeDesc", {})
        rows_a, cols_a = int(a["rows"]), int(a["cols"])
        k = rows_a if compute.get("transa", "OP_N") == "OP_T" else cols_a
        batch = int(a.get("batchCount", 1))
        gemm = GemmSignature(int(d["rows"]), int(d["cols"]), k, batch)
    except (KeyError, ValueError):
        raise ProfileFormatError(path, f"line {lineno}: cublasLtMatmul without complete Adesc/Ddesc "
                                       f"(rows, cols): line truncated?") from None
    algo = desc.get("algo", {})
    return LibraryCall(
        library="cublaslt", api="cublasLtMatmul", index=index, gemm=gemm,
        algo=" ".join(f"{k}={v}" for k, v in algo.items()),
        math=compute.get("computeType", ""), dtype=dtype_name("CUDA_" + a.get("type", "")),
        timestamp=m.group("time"), thread=m.group("pid"),
        detail=tuple((f"{n}.{k}", v) for n, kv in desc.items() for k, v in kv.items()))
