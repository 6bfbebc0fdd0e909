"""oneDNN verbose output (``ONEDNN_VERBOSE=1`` / ``DNNL_VERBOSE=1``), v2 and v3 spellings::

    dnnl_verbose,exec,cpu,convolution,jit:avx512_core,forward_inference,<memory descs>,<attrs>,
        alg:convolution_direct,mb1_ic3oc64_ih224oh112kh7sh2dh0ph3_iw224ow112kw7sw2dw0pw3,0.5
    onednn_verbose,primitive,exec,cpu,convolution,brg_conv_fwd:avx512_core,forward_inference,...

    onednn_verbose,v1,primitive,exec,cpu,convolution,jit:avx2,forward_training,...   (torch's oneDNN 3.x)

(v3.4+ may add a timestamp after the marker.) Only ``exec`` lines are calls; ``create``,
``info`` and other lines are context. The problem descriptor is benchdnn's grammar;
oneDNN counts dilation from 0, Benanza from 1.
"""

from __future__ import annotations

import re
from pathlib import Path

from .base import ConvSignature, GemmSignature, LibraryCall, ProfileFormatError, dtype_name, read_text

_MARKERS = ("dnnl_verbose", "onednn_verbose", "mkldnn_verbose")
_PAIR = re.compile(r"([a-z]+)(\d+)")


def parse_onednn_verbose(path: str | Path) -> list[LibraryCall]:
    return parse_onednn_text(read_text(path, "oneDNN verbose log"), path)


def parse_onednn_text(text: str, path: str | Path) -> list[LibraryCall]:
    """The calls of a log's text (``path`` names where it came from in errors): a part of a log
    (the torch backend's child reads each node's calls between its own markers) parses alike."""
    calls: list[LibraryCall] = []
    seen_marker = False
    for lineno, line in enumerate(text.splitlines(), 1):
        fields = line.strip().split(",")
        if fields[0] not in _MARKERS:
            continue
        seen_marker = True
        if "exec" not in fields[:6]:  # v3.4+ may put a timestamp (and "v1") before it
            continue
        rest = fields[fields.index("exec") + 1:]
        if len(rest) < 8:
            raise ProfileFormatError(path, f"line {lineno}: oneDNN exec line has {len(rest)} fields after "
                                           f"'exec', expected at least 8 (line truncated?)")
        engine, kind, impl, prop, mds = rest[0], rest[1], rest[2], rest[3], rest[4]
        problem, time = rest[-2], rest[-1]
        aux = ",".join(rest[6:-2])
        try:
            time_ms = float(time)
        except ValueError:
            raise ProfileFormatError(path, f"line {lineno}: oneDNN exec line ends in {time!r}, not a time "
                                           f"in ms (line truncated?)") from None
        calls.append(LibraryCall(
            library="onednn", api=kind, index=len(calls),
            conv=_conv(problem) if kind in ("convolution", "deconvolution") else None,
            gemm=_gemm(kind, problem),
            algo=impl, dtype=_src_dtype(mds), time_ms=time_ms, thread="",
            detail=(("engine", engine), ("prop", prop), ("mds", mds), ("attrs", rest[5]),
                    ("aux", aux), ("problem", problem)),
            post_ops=_post_ops(rest[5]), bias=_has_bias(mds)))
    if not seen_marker and text.strip():
        raise ProfileFormatError(path, "no dnnl_verbose/onednn_verbose lines: not a oneDNN verbose log")
    return calls


def _post_ops(attrs: str) -> tuple[str, ...]:
    """``attr-post-ops:eltwise_relu`` (2.x ends it with a space, some versions quote it and
    separate with ``;``) → ("eltwise_relu",); several are joined by ``+``."""
    for attr in attrs.split():
        if attr.startswith("attr-post-ops:"):
            value = attr.removeprefix("attr-post-ops:").strip("'")
            return tuple(op for op in re.split(r"[+;]", value) if op)
    return ()


def _has_bias(mds: str) -> bool | None:
    """2.x ``bia_f32::blocked:a:f0``, 3.x ``bia:f32:a:blocked:a::f0``; ``bia:undef…`` or no bias
    descriptor at all: none."""
    m = re.search(r"(?:^|\s)bia[_:]([a-z0-9]+)", mds)
    return m is not None and m.group(1) != "undef"


_VERSION = re.compile(r"_verbose,(?:[^,]*,)*?info,oneDNN v(\d+\.\d+(?:\.\d+)?)")


def log_version(path: str | Path) -> str | None:
    """The oneDNN version the log's ``info`` header names (``oneDNN v3.12.0``), if any."""
    m = _VERSION.search(read_text(path, "oneDNN verbose log"))
    return m.group(1) if m else None


_THREADS = re.compile(r"_verbose,(?:[^,]*,)*?info,cpu,runtime:[^,]*,nthr:(\d+)")


def log_threads(path: str | Path) -> int | None:
    """The CPU threads the library used, from its ``info,cpu,runtime:OpenMP,nthr:N`` header (3.x;
    2.x does not print it)."""
    return threads_in(read_text(path, "oneDNN verbose log"))


def threads_in(text: str) -> int | None:
    """``log_threads`` of a log's text."""
    m = _THREADS.search(text)
    return int(m.group(1)) if m else None


def _src_dtype(mds: str) -> str:
    # v2: "src_f32::blocked:..."; v3: "src:f32::blocked:..."
    m = re.search(r"src[_:]([a-z0-9]+)", mds)
    return dtype_name(m.group(1)) if m else ""


def _pairs(problem: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for name, value in _PAIR.findall(problem):
        out.setdefault(name, int(value))
    return out


def _conv(problem: str) -> ConvSignature | None:
    p = _pairs(problem)
    if not {"mb", "ic", "oc", "ih", "kh"} <= p.keys():
        return None
    g = p.get("g", 1)
    return ConvSignature(mb=p["mb"], ic=p["ic"], ih=p["ih"], iw=p.get("iw", p["ih"]), oc=p["oc"],
                         kh=p["kh"], kw=p.get("kw", p["kh"]), sh=p.get("sh", 1), sw=p.get("sw", p.get("sh", 1)),
                         ph=p.get("ph", 0), pw=p.get("pw", p.get("ph", 0)),
                         dh=p.get("dh", 0) + 1, dw=p.get("dw", p.get("dh", 0)) + 1, g=g)


def _gemm(kind: str, problem: str) -> GemmSignature | None:
    if kind == "inner_product":
        p = _pairs(problem)
        if {"mb", "ic", "oc"} <= p.keys():
            return GemmSignature(p["mb"], p["oc"], p["ic"] * p.get("ih", 1) * p.get("iw", 1))
    if kind == "matmul":
        # "1x2048:2048x1000" (optionally ":1x1000" for the bias / dst)
        dims = [tuple(int(x) for x in part.split("x")) for part in problem.split(":")[:2]
                if re.fullmatch(r"\d+(x\d+)*", part)]
        if len(dims) == 2 and len(dims[0]) >= 2 and len(dims[1]) >= 2:
            a, b = dims
            batch = 1
            for d in a[:-2]:
                batch *= d
            return GemmSignature(a[-2], b[-1], a[-1], batch)
    return None
