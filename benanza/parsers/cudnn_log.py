"""cuDNN API logs: the legacy format of v7/v8 (``CUDNN_LOGINFO_DBG=1``) and cuDNN 9's
(``CUDNN_LOGLEVEL_DBG=3``), whose headers carry a build number (``CuDNN (v90100 17)``) and
whose graph-API calls (``cudnnBackendExecute``) nest the execution plan → engine config →
engine → operation graph → operations and their tensor descriptors.

Only compute calls become ``LibraryCall`` records; descriptor set-up calls are context.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from ..records import Math
from .base import ConvSignature, LibraryCall, ProfileFormatError, dtype_name, read_text
from .blocklog import Block, enum_name, int_list, parse_blocks

_HEADER = re.compile(r"^(?P<level>[IWE])! CuDNN \(v(?P<version>\d+(?: \d+)?)\) function (?P<function>\w+)\(\) called:")

_COMPUTE = re.compile(r"(Forward|ForwardInference|ForwardTraining|AddTensor|OpTensor|ScaleTensor|"
                      r"TransformTensor|BackendExecute)$")
_CONV_APIS = {"cudnnConvolutionForward", "cudnnConvolutionBiasActivationForward"}
_ALGO_PREFIX = "CUDNN_CONVOLUTION_FWD_ALGO_"


def parse_cudnn_log(path: str | Path) -> list[LibraryCall]:
    text = read_text(path, "cuDNN log")
    blocks = parse_blocks(text, path, _HEADER, "cuDNN API log")
    if not blocks and text.strip():
        raise ProfileFormatError(path, "no `CuDNN (vN) function ...() called:` blocks: not a cuDNN API log")
    calls: list[LibraryCall] = []
    for b in blocks:
        if b.function == "cudnnBackendExecuteInternal" and calls and calls[-1].api == "cudnnBackendExecute" \
                and calls[-1].thread == b.thread and b.get("enable_tf32") == "true":
            # cuDNN 9.1x says only here whether the f32 plan it just executed may use TF32 Tensor Cores
            calls[-1] = dataclasses.replace(calls[-1], math=Math.TF32_ALLOWED.value)
            continue
        if not _COMPUTE.search(b.function) or _exit_record(b):
            continue
        calls.append(_call(b, len(calls)))
    return calls


def _exit_record(b: Block) -> bool:
    """cuDNN 9 logs a call twice: its arguments, then a block holding only the returned status."""
    return bool(b.fields) and all(p == "status" for p, _ in b.fields)


def _call(b: Block, index: int) -> LibraryCall:
    conv = None
    algo = math = ""
    if b.function in _CONV_APIS:
        conv = _legacy_conv(b)
        algo = enum_name(b.get("algo")).removeprefix(_ALGO_PREFIX)
        math = enum_name(b.get("convDesc.mathType", "mathType"))
    elif b.function == "cudnnBackendExecute":
        conv = _backend_conv(b)
        algo = _engine(b)
    shapes = tuple(int_list(v) for p, v in b.fields if p.endswith("dimA") or p.endswith(".dim"))
    dtype = dtype_name(enum_name(b.get("dataType", "type", "data_type")))
    detail = tuple((p, v) for p, v in b.fields if "addr=" not in v and not v.startswith("POINTER"))
    return LibraryCall(library="cudnn", api=b.function, index=index, conv=conv,
                       shapes=tuple(s for s in shapes if s), algo=algo, math=math, dtype=dtype,
                       timestamp=b.timestamp, thread=b.thread, detail=detail[:64], post_ops=_activation(b))


# cuDNN's activation modes in oneDNN's post-op spelling (LibraryCall.post_ops)
_ACTIVATIONS = {"CUDNN_ACTIVATION_IDENTITY": (), "CUDNN_ACTIVATION_RELU": ("eltwise_relu",)}


def _activation(b: Block) -> tuple[str, ...]:
    """The activation ConvolutionBiasActivationForward fuses after the conv and bias."""
    if b.function != "cudnnConvolutionBiasActivationForward":
        return ()
    mode = enum_name(b.get("activationDesc.mode"))
    return _ACTIVATIONS.get(mode, (f"eltwise_{mode.removeprefix('CUDNN_ACTIVATION_').lower() or 'unknown'}",))


def _conv_from(x: tuple[int, ...], w: tuple[int, ...], pad: tuple[int, ...], stride: tuple[int, ...],
               dil: tuple[int, ...], groups: int) -> ConvSignature | None:
    if len(x) != 4 or len(w) != 4:
        return None
    pad, stride, dil = pad or (0, 0), stride or (1, 1), dil or (1, 1)
    return ConvSignature(mb=x[0], ic=x[1], ih=x[2], iw=x[3], oc=w[0], kh=w[2], kw=w[3],
                         sh=stride[0], sw=stride[-1], ph=pad[0], pw=pad[-1], dh=dil[0], dw=dil[-1],
                         g=groups or max(1, x[1] // max(1, w[1])))


def _legacy_conv(b: Block) -> ConvSignature | None:
    groups = int_list(b.get("convDesc.groupCount"))
    return _conv_from(int_list(b.get("xDesc.dimA")), int_list(b.get("wDesc.dimA")),
                      int_list(b.get("convDesc.padA")), int_list(b.get("convDesc.strideA")),
                      int_list(b.get("convDesc.dilationA")), groups[0] if groups else 0)


def _backend_conv(b: Block) -> ConvSignature | None:
    """The forward convolution inside an executed plan: its X/W tensors and conv descriptor,
    wherever the plan nests them (engine config → engine → operation graph → ops)."""
    def pick(*suffixes: str) -> tuple[int, ...]:
        for s in suffixes:
            for p, v in b.fields:
                if p.lower().endswith(s.lower()):
                    return int_list(v)
        return ()

    return _conv_from(pick("xDesc.dimA", "xDesc.dim"), pick("wDesc.dimA", "wDesc.dim"),
                      pick("prePaddings", "padLower", "convDesc.lowerPadA"), pick("filterStrides", "convDesc.strideA"),
                      pick("dilations", "convDesc.dilationA"), 0)


def _engine(b: Block) -> str:
    """cuDNN 9 names a graph-API implementation by its engine's global index (``eng0``)."""
    engine = int_list(b.get("engine_id", "globalIndex", "engineId"))
    return f"eng{engine[0]}" if engine else ""
