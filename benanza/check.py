"""Correctness of what the oneDNN benchmarks compute, in the spirit of benchdnn's correctness mode.

A benchmark could time the wrong work (a wrong offset, operand, axis or post-op) and still
report a plausible latency. ``check`` builds the generated oneDNN project, runs each benchmark
once in the runtime's check mode (``--benanza_check``: inputs from the seedable generator
``generated`` reproduces, outputs written to files) and compares the outputs with an independent
reference: ONNX Runtime (onnx's reference evaluator where ONNX Runtime lacks the op) running the
original ONNX node, or the fusion pattern's subgraph, taken from the real model, fed with the same
generated inputs. Constant inputs that define the computation (axes, Slice bounds, Split sizes,
Gather indices, exponents, epsilons, scales) keep the model's own values.

Each benchmark gets one ``CheckResult`` saying what was compared. Copies standing in for ops
they do not compute (Expand, Where, Trilu, a strided Slice: ``copy:*_dense_*``) are checked for
what they do — the output's bytes moved from a buffer of its shape, and that size equal to the
op's real output — never as if they computed the op.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shlex
import subprocess
import tempfile
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .backends.base import SubgraphBackend, build
from .errors import BenanzaError, UsageError
from .fusion import BY_NAME as PATTERNS
from .generator import get_backend, read_variants
from .layers import Model
from .model_values import ModelValues, NoValue, evaluate, write_model
from .ops.reference import Gen, NoReference, Spec, generated
from .ops.registry import FAMILIES
from .records import Variant

log = logging.getLogger(__name__)
_FAMILIES = {f.name: f for f in FAMILIES}

BACKEND = "onednn"
# The largest error accepted, |got − want| / max(1, |want|), per output dtype (benchdnn's way:
# relative above 1, absolute below). f32: the generator's inputs make products and short sums
# exact, what remains is the library's exp/erf/rsqrt approximations and summation order; bf16
# outputs carry its 8-bit significand (2^-8 relative) and the chains' bf16 intermediates.
TOLERANCE = {"f32": 1e-5, "bf16": 1e-2, "u8": 0.0, "i8": 0.0, "b": 0.0}
# oneDNN's reductions and softmax/normalization sum in another order than the reference, and
# their exp/erf/rsqrt are polynomial approximations: f32 results differ in the last bits.
_APPROXIMATE_F32 = 1e-4
# The onnxruntime backend's subgraphs multiply by the model's own weights, not the generator's
# exact values: a kernel summing in another order (NCHWc, a fused epilogue) differs in the last
# bits of the significand (f16: 11 bits).
_ORT_TOLERANCE = {"f32": _APPROXIMATE_F32, "f16": 1e-3, "bf16": TOLERANCE["bf16"]}
# An 8-bit quantized output is a rounded value: with the generator's exact power-of-two scales
# a result often falls exactly halfway between two steps, and libraries break that tie in
# different places (where the output zero point enters the rounding), so such outputs are
# compared in quantization steps, one step accepted whatever the variant's dtype.
_QUANTIZED_OUTPUTS = (np.dtype(np.uint8), np.dtype(np.int8))
QUANTIZED_STEPS = 1.0


class CheckStatus(Enum):
    OK = "ok"
    MISMATCH = "mismatch"
    NOT_CHECKED = "not_checked"  # no reference for it (said why), never counted as passing
    UNSUPPORTED = "unsupported"  # the library refused the variant: nothing ran
    FAILED = "failed"  # the benchmark or the check run failed


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: CheckStatus
    compared: str  # what was compared with what, or why nothing was
    error: float | None = None  # the largest error found
    tolerance: float | None = None
    where: str = ""  # the worst element: output, index, got and want
    reproduce: str = ""


@dataclass(frozen=True)
class CheckOptions:
    filter: str | None = None
    seed: int = 0
    threads: int = 1
    timeout: float = 600.0
    build_jobs: int | None = None
    command: str = "benanza check"  # the command line up to its --filter and --seed (reproduce lines)


# --- one benchmark's reference, in the model's terms -----------------------------------------

def _gen(seed: int) -> Gen:
    return lambda stream, shape: generated(stream, tuple(shape), seed)


class _Site:
    """One model's occurrence of a benchmark: the nodes and their tensors' real shapes
    (``ops.reference.Site``)."""

    def __init__(self, ref: ModelValues, nodes: tuple[int, ...]):
        self.ref, self.nodes = ref, nodes

    def node(self, pos: int):
        return self.ref.model.nodes[self.nodes[pos]]

    def proto(self, pos: int) -> onnx.NodeProto:
        return self.ref.proto_of(self.node(pos))

    def shape(self, name: str) -> tuple[int, ...]:
        return self.ref.shape(name)

    def in_shape(self, pos: int, i: int) -> tuple[int, ...]:
        return self.ref.shape(self.proto(pos).input[i])

    def external(self, pos: int, inside: str) -> int:
        ins = list(self.proto(pos).input)
        others = [i for i, name in enumerate(ins) if name != inside]
        if len(others) != 1:
            raise NoReference(f"{self.proto(pos).op_type} has no single other input")
        return others[0]

    def with_producer(self, pos: int, i: int) -> _Site:
        return _Site(self.ref, self.nodes + (self.ref.model.producer[self.node(pos).inputs[i]],))


def _spec(site: _Site, v: Variant, gen: Gen) -> tuple[Spec, str]:
    """The reference of the variant's family (or fusion pattern) at ``site``, and what it
    compares."""
    if v.fusion == "none":
        family = _FAMILIES.get(v.problem.family)
        reference = family.onednn.reference if family is not None and family.onednn is not None else None
        if reference is None:
            raise NoReference(f"no reference adapter for the {v.problem.family} family")
        proto = site.proto(0)
        spec = reference(site, v, gen)
        return spec, f"{proto.op_type} node {proto.name or proto.output[0]!r}{spec.note}"
    pattern = PATTERNS[v.fusion]
    if pattern.reference is None:
        raise NoReference(f"no reference adapter for the {v.fusion} pattern")
    protos = [site.proto(i) for i in range(len(site.nodes))]
    spec = pattern.reference(site, v, gen, pattern)
    return spec, f"fusion {v.fusion} over nodes {', '.join(repr(p.name or p.output[0]) for p in protos)}{spec.note}"


def _reference(site: _Site, spec: Spec) -> list[np.ndarray]:
    """Runs the spec's nodes, taken from the model, on its feeds and constants and the model's
    other constants."""
    ref = site.ref
    site = _Site(ref, spec.nodes)  # the site's nodes and any more the reference runs
    protos = []
    produced: set[str] = set()
    for pos in range(len(spec.nodes)):
        node = onnx.NodeProto()
        node.CopyFrom(site.proto(pos))
        node.input.extend(spec.extra_inputs.get(pos, []))
        for name, value in spec.attrs.get(pos, {}).items():
            kept = [a for a in node.attribute if a.name != name]
            del node.attribute[:]
            node.attribute.extend(kept + [helper.make_attribute(name, value)])
        protos.append(node)
    inputs, inits, kept_names = [], [], []
    # a tensor fed at one slot is that input wherever the nodes read it (x in x·Φ(x))
    first_fed: dict[str, str] = {}
    for (pos, i) in sorted(spec.feeds.keys() | spec.constants.keys()):
        first_fed.setdefault(protos[pos].input[i], f"__in{pos}_{i}")
    # in the model's order: a pattern's nodes after its anchor may feed it (Q's and K's scales)
    ordered = sorted(range(len(protos)), key=lambda pos: spec.nodes[pos])
    for pos in ordered:
        node = protos[pos]
        for i, name in enumerate(node.input):
            if not name or name in produced:
                continue
            value = spec.feeds.get((pos, i))
            if value is not None:
                node.input[i] = f"__in{pos}_{i}"
                inputs.append((node.input[i], value))
            elif (pos, i) in spec.constants:
                node.input[i] = f"__in{pos}_{i}"
                inits.append(numpy_helper.from_array(spec.constants[(pos, i)], node.input[i]))
            elif name in first_fed:
                node.input[i] = first_fed[name]
            else:
                kept_names.append(name)
        produced.update(node.output)
    feeds = dict(inputs)
    for name, value in ref.values(sorted(set(kept_names))).items():
        inits.append(numpy_helper.from_array(value, name))
    graph = helper.make_graph(
        [protos[pos] for pos in ordered], "check",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for n, v in feeds.items()],
        [helper.make_empty_tensor_value_info(o) for o in spec.outputs], inits)
    m = helper.make_model(graph, opset_imports=list(ref.proto.opset_import))
    m.ir_version = ref.proto.ir_version
    return evaluate(m, feeds, list(spec.outputs))


# --- comparing -----------------------------------------------------------------------------

def _read_outputs(entry: dict) -> list[np.ndarray]:
    """The benchmark's outputs from its check file, as f32 (bf16 widened) or, for integer
    outputs (u8 booleans as 0/1, quantized data, s32 accumulators), f64."""
    data = Path(entry["file"]).read_bytes()
    out, at = [], 0
    for o in entry["outputs"]:
        raw = data[at:at + o["bytes"]]
        at += o["bytes"]
        if o["dtype"] == "bf16":
            arr = (np.frombuffer(raw, np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)
        elif o["dtype"] in ("u8", "s8", "s32"):
            arr = np.frombuffer(raw, {"u8": np.uint8, "s8": np.int8, "s32": np.int32}[o["dtype"]]).astype(np.float64)
        else:
            arr = np.frombuffer(raw, np.float32)
        out.append(arr.reshape(o["dims"]))
    return out


def _errors(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    g, w = got.astype(np.float64).reshape(-1), want.astype(np.float64).reshape(-1)
    with np.errstate(invalid="ignore"):
        err = np.abs(g - w) / np.maximum(1.0, np.abs(w))
    same = (np.isnan(g) & np.isnan(w)) | (g == w)  # NaN where the reference has NaN; equal infinities
    return np.where(same, 0.0, np.where(np.isnan(err), np.inf, err))


def _compare(got: list[np.ndarray], want: list[np.ndarray], tol: float) -> tuple[CheckStatus, float, str, float]:
    """The verdict, the worst error, where it is, and the tolerance it was held to."""
    if len(got) != len(want):
        return CheckStatus.MISMATCH, math.inf, f"{len(got)} outputs written, the reference has {len(want)}", tol
    worst, worst_share, where, held_to = 0.0, 0.0, "", tol
    for k, (g, w) in enumerate(zip(got, want)):
        if g.size != w.size:
            return (CheckStatus.MISMATCH, math.inf, f"output {k}: {g.size} elements written, the reference has "
                                                     f"{w.size}", tol)
        steps = w.dtype in _QUANTIZED_OUTPUTS
        err = np.abs(g.astype(np.float64).reshape(-1) - w.astype(np.float64).reshape(-1)) if steps else _errors(g, w)
        # as a share of the output's own tolerance, so outputs judged in steps and relatively compare
        share = err / (QUANTIZED_STEPS if steps else tol) if tol > 0 or steps else np.where(err > 0, np.inf, 0.0)
        if share.size and share.max() > worst_share:
            i = int(share.argmax())
            worst_share, worst, held_to = float(share[i]), float(err[i]), QUANTIZED_STEPS if steps else tol
            where = (f"output {k} element {i}: got {g.reshape(-1)[i]:.6g}, want {w.reshape(-1)[i]:.6g}"
                     + (" (quantization steps)" if steps else ""))
    return (CheckStatus.OK if worst_share <= 1.0 else CheckStatus.MISMATCH), worst, where, held_to


def _tolerance(v: Variant) -> float:
    tol = TOLERANCE[v.dtype]
    family = _FAMILIES.get(v.problem.family)
    if v.dtype == "f32" and (v.fusion != "none" or family is None or not family.exact):
        tol = _APPROXIMATE_F32
    return tol


# --- the check -----------------------------------------------------------------------------

def check(bench_dir: str | Path, models: list[Model], options: CheckOptions = CheckOptions()) -> list[CheckResult]:
    """Builds and runs the oneDNN benchmarks of ``bench_dir`` in check mode and compares every
    output with the reference computed from ``models`` (the models they were generated from)."""
    project = Path(bench_dir) / BACKEND
    variants = _selected(read_variants(project), options)
    binary = build(project, options.build_jobs)
    with tempfile.TemporaryDirectory(prefix="benanza-check-") as tmp:
        statuses, entries = _run_binary(binary, variants, Path(tmp), options)
        refs = [ModelValues(m) for m in models]
        return [_check_one(v, statuses.get(v.name), entries.get(v.name), refs, options) for v in variants]


def _selected(variants: list[Variant], options: CheckOptions) -> list[Variant]:
    if not options.filter:
        return variants
    try:
        rx = re.compile(options.filter)
    except re.error as exc:
        raise UsageError(f"--filter {options.filter!r} is not a regular expression ({exc})") from None
    return [v for v in variants if rx.search(v.name)]


def check_subgraphs(bench_dir: str | Path, backend: str, options: CheckOptions = CheckOptions()) -> list[CheckResult]:
    """A framework backend's benchmarks (``onnxruntime``, ``torch``): each variant's subgraph (the
    models' own nodes, cut out at generate time with their constants) run as the variant runs it
    (ORT at its optimization level, through the fused and NCHWc kernels it times; torch in its
    layout, dtype and oneDNN setting), against the same subgraph run node by node by ONNX Runtime
    with every graph optimization off, on the same generated inputs: what the framework's kernels
    compute must be what the model's nodes compute. (onnx 1.23's reference evaluator is no oracle
    here: for an opset-13 BatchNormalization of mean 0, variance 1, scale 1 and bias 0, the
    identity, its outputs differ from the inputs by up to 5%.)"""
    from .backends import ort as ort_backend
    from .backends.inprocess import INDEX_NAME, Refused

    runner = get_backend(backend)
    if not isinstance(runner, SubgraphBackend):
        raise UsageError(f"--backend {backend}: its benchmarks are not the models' subgraphs")
    project = Path(bench_dir) / backend
    variants = _selected(read_variants(project), options)
    index = json.loads((project / INDEX_NAME).read_text())
    out = []
    for v in variants:
        repro = _reproduce(v, options)
        entry = index.get(v.name, {"unsupported": "not in benchmarks.json (generate again)"})
        if "unsupported" in entry:
            out.append(CheckResult(v.name, CheckStatus.NOT_CHECKED, entry["unsupported"], reproduce=repro))
            continue
        path = project / entry["model"]
        m = onnx.load(path)
        inits = {t.name for t in m.graph.initializer}
        feeds = {}
        for k, i in enumerate(x for x in m.graph.input if x.name not in inits):
            shape = tuple(d.dim_value for d in i.type.tensor_type.shape.dim)
            dtype = helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type)
            feeds[i.name] = generated(k, shape, options.seed).astype(dtype) if dtype.kind == "f" else \
                np.zeros(shape, dtype)
        how = (f"ONNX Runtime at level {entry['level']}" if "level" in entry else
               f"torch ({entry['algo']}, {entry['layout']}, {entry['dtype']})")
        compared = (f"{how} vs ONNX Runtime unoptimized" + (" on its constants rounded to bf16" if entry.get("dtype")
                                                             == "bf16" else "") + f", on nodes {entry['nodes']}")
        timed = dict(feeds)
        if os.environ.get("BENANZA_FAULT_PERTURB") == v.name and timed:  # the runtime's fault hook (tests)
            first = next(iter(timed))
            timed[first] = timed[first].copy()
            timed[first].reshape(-1)[0] += 1
        try:
            got = runner.outputs(path, entry, timed, options.threads)
            if entry.get("dtype") == "bf16":  # torch's bf16 run of an f32 subgraph
                want = _reference_on_bf16_values(m, options.threads, feeds)
            else:
                want = ort_backend.run_once(path, "none", options.threads, feeds)
        except Refused as exc:
            out.append(CheckResult(v.name, CheckStatus.UNSUPPORTED, str(exc), reproduce=repro))
            continue
        except Exception as exc:  # noqa: BLE001 - the frameworks' errors share no base class
            out.append(CheckResult(v.name, CheckStatus.FAILED, f"{type(exc).__name__}: {str(exc)[:300]}",
                                   reproduce=repro))
            continue
        tol = _ORT_TOLERANCE[v.dtype]
        status, error, where, held_to = _compare([np.asarray(g) for g in got], [np.asarray(w) for w in want], tol)
        out.append(CheckResult(v.name, status, compared, error, held_to, where, repro))
    return out


def bf16_values(a: np.ndarray) -> np.ndarray:
    """f32 values rounded to the nearest bf16 (ties to even), kept as f32."""
    bits = np.ascontiguousarray(a, np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return rounded.view(np.float32)


def _reference_on_bf16_values(m: onnx.ModelProto, threads: int, feeds: dict[str, np.ndarray]) -> list:
    """A bf16 variant of an f32 subgraph (torch's) casts the model's f32 constants to bf16: the
    reference is the f32 subgraph on those same values, so what is compared is the bf16
    arithmetic (its rounded intermediates and outputs), not the constants' rounding, whose error
    grows with each output's number of products. The generated inputs are multiples of 1/128
    in [-1, 1): bf16 values already."""
    from .backends import ort as ort_backend

    rounded = onnx.ModelProto()
    rounded.CopyFrom(m)
    tensors = list(rounded.graph.initializer) + [a.t for n in rounded.graph.node if n.op_type == "Constant"
                                                 for a in n.attribute if a.name == "value"]
    for t in tensors:
        if t.data_type == onnx.TensorProto.FLOAT:
            t.CopyFrom(numpy_helper.from_array(bf16_values(numpy_helper.to_array(t)), t.name))
    with tempfile.TemporaryDirectory(prefix="benanza-check-") as tmp:
        path = Path(tmp) / "reference.onnx"
        write_model(rounded, path)
        return ort_backend.run_once(path, "none", threads, feeds)


def _run_binary(binary: Path, variants: list[Variant], tmp: Path, options: CheckOptions
                ) -> tuple[dict[str, dict], dict[str, dict]]:
    import os

    names = tmp / "names.txt"
    names.write_text("".join(v.name + "\n" for v in variants))
    env = dict(os.environ, OMP_NUM_THREADS=str(options.threads))
    cmd = [str(binary), f"--benanza_names={names}", f"--benanza_check={tmp}", f"--benanza_seed={options.seed}"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, errors="replace", env=env,
                              timeout=options.timeout, check=False)
    except subprocess.TimeoutExpired:
        raise BenanzaError(f"{binary}: check mode did not finish in {options.timeout:g}s") from None
    statuses, entries = {}, {}
    started = None
    for line in done.stdout.splitlines():
        tag, _, payload = line.partition(" ")
        if tag == "BENANZA_START":
            started = payload
        elif tag == "BENANZA_RESULT":
            d = json.loads(payload)
            statuses[d["name"]] = d
        elif tag == "BENANZA_CHECK":
            d = json.loads(payload)
            d["outputs_data"] = _read_outputs(d)  # read now: the folder goes away after the run
            entries[d["name"]] = d
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        log.warning("%s exited with status %d in check mode (%s)", binary, done.returncode, tail)
        if started is not None and started not in statuses:
            statuses[started] = {"status": "failed",
                                 "message": f"the benchmark died (exit status {done.returncode}: {tail})"}
        for v in variants:
            statuses.setdefault(v.name, {"status": "failed", "message": f"not run: the binary died in {started}"})
    return statuses, entries


def _reproduce(v: Variant, options: CheckOptions) -> str:
    return f"{options.command} --seed {options.seed} --filter {shlex.quote('^' + re.escape(v.name) + '$')}"


def _check_one(v: Variant, status: dict | None, entry: dict | None, refs: list[ModelValues],
               options: CheckOptions) -> CheckResult:
    repro = _reproduce(v, options)
    if status is None:
        return CheckResult(v.name, CheckStatus.FAILED, "the benchmark printed no result (it crashed)", reproduce=repro)
    if status.get("status") == "unsupported":
        return CheckResult(v.name, CheckStatus.UNSUPPORTED, f"nothing ran: {status.get('message', '')}")
    if status.get("status") != "ok" or entry is None:
        return CheckResult(v.name, CheckStatus.FAILED, status.get("message") or "no outputs written",
                           reproduce=repro)
    gen = _gen(options.seed)
    for ref in refs:
        nodes = ref.find(v, same_dtype=False)
        if nodes is None:
            continue
        site = _Site(ref, nodes)
        try:
            spec, compared = _spec(site, v, gen)
            got = entry["outputs_data"]
            if spec.dense is not None:
                return _check_dense(v, site, spec, compared, got, gen, repro)
            want = _reference(site, spec)
        except (NoReference, NoValue) as exc:
            return CheckResult(v.name, CheckStatus.NOT_CHECKED, str(exc))
        verdict, err, where, tol = _compare(got, want, _tolerance(v))
        return CheckResult(v.name, verdict, f"{compared} in {ref.model.name}", err, tol, where,
                           repro if verdict is not CheckStatus.OK else "")
    return CheckResult(v.name, CheckStatus.NOT_CHECKED, "its layer (and fusion) is in none of the given models")


def _check_dense(v: Variant, site: _Site, spec: Spec, compared: str, got: list[np.ndarray], gen: Gen,
                 repro: str) -> CheckResult:
    assert spec.dense is not None
    real = site.ref.outputs(spec.outputs)
    what = f"{compared} in {site.ref.model.name}"
    if len(got) != len(spec.dense):
        return CheckResult(v.name, CheckStatus.MISMATCH, what, math.inf, 0.0,
                           f"{len(got)} outputs written for {len(spec.dense)}", repro)
    for k, (g, box) in enumerate(zip(got, spec.dense)):
        if g.size != real[spec.outputs[k]].size:
            return CheckResult(v.name, CheckStatus.MISMATCH, what, math.inf, 0.0,
                               f"output {k}: {g.size} elements moved, the op writes {real[spec.outputs[k]].size}",
                               repro)
        err = _errors(g, gen(k, box).astype(g.dtype))
        if err.size and err.max() > 0:
            i = int(err.argmax())
            return CheckResult(v.name, CheckStatus.MISMATCH, what, float(err[i]), 0.0,
                               f"output {k} element {i}: got {g.reshape(-1)[i]:.6g}, its source holds "
                               f"{gen(k, box).reshape(-1)[i]:.6g}", repro)
    return CheckResult(v.name, CheckStatus.OK, what, 0.0, 0.0)
