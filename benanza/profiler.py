"""``benanza profile``: run a model in a framework and capture its execution profile (§III-D ④).

The model runs twice, each time in a child process (``python -m benanza.profiler SPEC PHASE``):
``timed`` measures the latency with every library logger off, ``traced`` records the
framework trace with the loggers on — cuDNN (``CUDNN_LOGINFO_DBG``/``CUDNN_LOGLEVEL_DBG``),
cuBLAS (``CUBLAS_LOGINFO_DBG``), cuBLASLt (``CUBLASLT_LOG_LEVEL``) and oneDNN
(``ONEDNN_VERBOSE``/``DNNL_VERBOSE``), which read their environment once at load time — and,
with ``--nsys``, under Nsight Systems. Loggers cost time on every call, so they never run in
the timed child. The bundle format is in ``parsers/bundle.py``.

``measure`` is the timing API for users' own code: ``with benanza.measure("preprocess"):``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator

from .errors import BenanzaError, ModelError, UsageError
from .parsers.bundle import latency_stats, model_identity, write_index
from .toolchain import nsys_importer

log = logging.getLogger(__name__)

FRAMEWORKS = ("onnxruntime", "torch")


# --- timing API ----------------------------------------------------------------------------------


@dataclass
class Measurement:
    name: str
    elapsed_ms: float | None = None  # set when the block exits


def _nvtx():
    """push/pop callables for NVTX ranges: the nvtx package, else torch.cuda.nvtx, else None."""
    try:
        import nvtx  # type: ignore[import-not-found]

        return nvtx.push_range, nvtx.pop_range
    except ImportError:
        pass
    torch = sys.modules.get("torch")  # never import torch just to time something
    if torch is not None and torch.cuda.is_available():
        return torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop
    return None


def _cuda_sync():
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.synchronize
    return None


@contextmanager
def measure(name: str, sync: bool = True) -> Iterator[Measurement]:
    """Time a block of code; the range also appears in Nsight Systems as an NVTX range.

    With ``sync`` and torch's CUDA initialised, the device is synchronised before the clock
    stops, so asynchronous kernels launched in the block are counted.
    """
    m = Measurement(name)
    nvtx = _nvtx()
    if nvtx:
        nvtx[0](name)
    start = time.perf_counter_ns()
    try:
        yield m
    finally:
        synchronize = _cuda_sync() if sync else None
        if synchronize:
            synchronize()
        m.elapsed_ms = (time.perf_counter_ns() - start) / 1e6
        if nvtx:
            nvtx[1]()
        log.debug("%s: %.4f ms", name, m.elapsed_ms)


# --- the profile command -------------------------------------------------------------------------


@dataclass(frozen=True)
class ProfileSpec:
    model: str
    framework: str
    out_dir: str
    batch_size: int = 1
    warmup: int = 5
    iterations: int = 50
    trace_iterations: int = 10
    device: str = "cpu"
    # --input-shape as given; profile_model hands the children every input's concrete shape
    input_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()

    @classmethod
    def from_json(cls, data: dict) -> ProfileSpec:
        shapes = tuple((name, tuple(dims)) for name, dims in data.pop("input_shapes", ()))
        return cls(**data, input_shapes=shapes)


LOG_ENV = {
    "CUDNN_LOGINFO_DBG": "1", "CUDNN_LOGLEVEL_DBG": "3", "CUBLAS_LOGINFO_DBG": "1",
    "CUBLASLT_LOG_LEVEL": "5", "ONEDNN_VERBOSE": "1", "DNNL_VERBOSE": "1",
}


def _log_env(out: Path) -> dict[str, str]:
    env = dict(LOG_ENV)
    env.update(CUDNN_LOGDEST_DBG=str(out / "cudnn.log"), CUBLAS_LOGDEST_DBG=str(out / "cublas.log"),
               CUBLASLT_LOG_FILE=str(out / "cublaslt.log"))
    return env


def check_framework(framework: str, device: str) -> str:
    """The framework's version; a clear error when it, or the device, is not usable here."""
    if framework == "onnxruntime":
        import onnxruntime as ort

        if device == "cuda" and "CUDAExecutionProvider" not in ort.get_available_providers():
            raise UsageError(f"--device cuda: this ONNX Runtime ({ort.__version__}) has no CUDA execution "
                             f"provider (available: {', '.join(ort.get_available_providers())}); install "
                             f"onnxruntime-gpu on a machine with an NVIDIA GPU")
        return ort.__version__
    if framework == "torch":
        try:
            import torch
        except ImportError:
            raise UsageError("torch is not installed: pip install torch") from None
        if device == "cuda" and not torch.cuda.is_available():
            raise UsageError("--device cuda: torch sees no CUDA device here")
        return torch.__version__
    raise UsageError(f"unknown framework {framework!r}; known: {', '.join(FRAMEWORKS)}")


# The phases of a profile, each its own child process: loggers slow every library call they
# log (cuDNN and oneDNN format and write a line per call), so the latency that is the
# Benanza ratio's denominator is timed in a child that has them off.
TIMED, TRACED = "timed", "traced"


def profile_model(spec: ProfileSpec, nsys: bool = False) -> Path:
    """Time the model in a child without loggers, then record its trace and library logs (and
    nsys) in a second child with them on; write the bundle and return its folder."""
    from .processor import input_shapes_of  # not at import: benanza.measure needs none of it

    version = check_framework(spec.framework, spec.device)
    # the processor's rule (batch axis, --input-shape), so the run has the shapes analyze keys
    shapes = input_shapes_of(spec.model, spec.batch_size, dict(spec.input_shapes))
    spec = replace(spec, input_shapes=tuple(shapes.items()))
    out = Path(spec.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    spec_path = out / "spec.json"
    spec_path.write_text(json.dumps(spec.__dict__, indent=1))
    identity = model_identity(spec.model, spec.batch_size)
    nsys_bin = shutil.which("nsys") if nsys else None
    if nsys and nsys_bin is None:
        raise UsageError("--nsys: Nsight Systems' `nsys` is not on PATH (scripts/install-nsys.sh installs it)")
    quiet = {k: v for k, v in os.environ.items() if k not in _log_env(out)}
    timed, timed_cmd = _child_run(spec, spec_path, TIMED, quiet, None)
    traced, traced_cmd = _child_run(spec, spec_path, TRACED, {**quiet, **_log_env(out)}, nsys_bin)
    files = {"trace": traced["trace"]}
    notes = timed.get("notes", []) + [n for n in traced.get("notes", []) if n not in timed.get("notes", [])]
    _collect_onednn(out, files, notes, spec)
    _collect_gpu_logs(out, files, notes, spec)
    if nsys_bin:
        _collect_nsys(out, files, notes)
    write_index(out, {
        "model": spec.model, "model_identity": identity, "framework": spec.framework,
        "framework_version": version, "device": spec.device, "batch_size": spec.batch_size,
        "warmup": spec.warmup, "iterations": spec.iterations, "trace_iterations": spec.trace_iterations,
        "input_shapes": {name: list(dims) for name, dims in spec.input_shapes},
        "providers": timed.get("providers", []), "command": timed_cmd,
        "runs": {TIMED: {"command": timed_cmd, "loggers": timed["loggers"]},
                 TRACED: {"command": traced_cmd, "loggers": traced["loggers"]}},
        "latency_ms": latency_stats(timed["samples_ms"]).to_json(), "files": files, "notes": notes,
    })
    return out


def _last_error(stderr: Path) -> str:
    """The line that says what went wrong: a traceback's final exception line, else the last
    non-empty line. The whole traceback stays in the file, not in the one-line error."""
    lines = [ln.strip() for ln in stderr.read_text(errors="replace").splitlines() if ln.strip()]
    if not lines:
        return "no error output"
    if any(ln.startswith("Traceback (most recent call last)") for ln in lines):
        for ln in reversed(lines):
            if not ln.startswith(("File ", "^", "~")) and (":" in ln or ln.isidentifier()):
                return ln
    return lines[-1]


def _child_run(spec: ProfileSpec, spec_path: Path, phase: str, env: dict[str, str],
               nsys_bin: str | None) -> tuple[dict, str]:
    """One phase in a child process; its result record and command line."""
    out = Path(spec.out_dir)
    cmd = [sys.executable, "-m", "benanza.profiler", str(spec_path), phase]
    if nsys_bin:
        trace = "osrt,nvtx" if spec.device == "cpu" else "cuda,nvtx,osrt,cudnn,cublas"
        cmd = [nsys_bin, "profile", f"--trace={trace}", "--sample=none", "--cpuctxsw=none",
               "--force-overwrite=true", "-o", str(out / "nsys")] + cmd
    # the traced child's stdout carries oneDNN's verbose lines (collected as child.stdout)
    stem = "child" if phase == TRACED else f"child-{phase}"
    log.info("running %s", " ".join(cmd))
    result = out / f"{stem}.json"
    result.unlink(missing_ok=True)
    with open(out / f"{stem}.stdout", "w") as so, open(out / f"{stem}.stderr", "w") as se:
        proc = subprocess.run(cmd, env=env, stdout=so, stderr=se)
    if proc.returncode != 0 or not result.exists():
        raise BenanzaError(f"{spec.model}: the {phase} {spec.framework} run failed (exit {proc.returncode}): "
                           f"{_last_error(out / f'{stem}.stderr')} (full output: {out / f'{stem}.stderr'})")
    return json.loads(result.read_text()), " ".join(cmd)


def _collect_onednn(out: Path, files: dict, notes: list[str], spec: ProfileSpec) -> None:
    """oneDNN prints verbose lines on stdout, interleaved with anything else the child prints."""
    lines = [ln for ln in (out / "child.stdout").read_text(errors="replace").splitlines()
             if ln.startswith(("onednn_verbose,", "dnnl_verbose,"))]
    (out / "onednn.log").write_text("".join(ln + "\n" for ln in lines))
    files["onednn_log"] = "onednn.log"
    if not lines:
        if spec.framework == "onnxruntime":
            notes.append("oneDNN verbose log is empty: ONNX Runtime's CPU execution provider runs its own MLAS "
                         "kernels, not oneDNN, so there are no oneDNN calls to compare (Q3/Q4 library views "
                         "need a oneDNN-backed framework, e.g. PyTorch on CPU)")
        else:
            notes.append("oneDNN verbose log is empty: the framework made no oneDNN calls")


def _collect_gpu_logs(out: Path, files: dict, notes: list[str], spec: ProfileSpec) -> None:
    for name, key in (("cudnn.log", "cudnn_log"), ("cublas.log", "cublas_log"), ("cublaslt.log", "cublas_log")):
        p = out / name
        if p.exists() and p.stat().st_size > 0:
            if key in files:  # cuBLAS and cuBLASLt share one parser: append Lt lines to cublas.log
                with open(out / files[key], "a") as f:
                    f.write(p.read_text(errors="replace"))
            else:
                files[key] = name
    if spec.device == "cpu":
        notes.append("device cpu: no cuDNN/cuBLAS calls, so no cuDNN/cuBLAS logs were captured")
    elif "cudnn_log" not in files:
        notes.append("the cuDNN logger wrote nothing: the framework made no cuDNN calls on this run")


def _collect_nsys(out: Path, files: dict, notes: list[str]) -> None:
    rep = out / "nsys.nsys-rep"
    qdstrm = out / "nsys.qdstrm"
    if not rep.exists() and qdstrm.exists():
        # Without a GPU, nsys may leave the raw stream; its importer turns it into a report.
        importer = nsys_importer()
        if importer is not None:
            subprocess.run([str(importer), "-i", str(qdstrm)], capture_output=True, text=True)
    if rep.exists():
        files["nsys"] = rep.name
    else:
        notes.append("nsys ran but produced no .nsys-rep (see child.stderr); the Nsight view is absent")


# --- child process -------------------------------------------------------------------------------


def _random_feed(inputs, shapes: dict[str, tuple[int, ...]]) -> dict:
    """Deterministic random values of the given shapes in each ORT input's type."""
    import numpy as np

    rng = np.random.default_rng(0)
    feed = {}
    for i in inputs:
        if i.name not in shapes:  # a weight an IR < 4 file lists as an input: its own value stays
            continue
        shape = shapes[i.name]
        dtype = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64,
                 "tensor(int32)": np.int32, "tensor(double)": np.float64}.get(i.type, np.float32)
        feed[i.name] = (rng.random(shape) if np.issubdtype(dtype, np.floating)
                        else rng.integers(0, 2, shape)).astype(dtype)
    return feed


def _ort_model_bytes(path: str, notes: list[str]) -> bytes:
    """The model, with its IR version lowered when this ONNX Runtime is older than the file.

    ORT states the highest IR version it reads only in its load error, so probe once.
    """
    import re

    import onnx
    import onnxruntime as ort

    model = onnx.load(path)
    data = model.SerializeToString()
    try:
        ort.InferenceSession(data, providers=["CPUExecutionProvider"])
        return data
    except Exception as exc:  # noqa: BLE001 - ORT raises its own Fail type
        m = re.search(r"Unsupported model IR version: \d+, max supported IR version: (\d+)", str(exc))
        if m is None:
            raise ModelError(path, f"onnxruntime cannot load the model: {exc}") from None
        max_ir = int(m.group(1))
    notes.append(f"model IR version {model.ir_version} lowered to {max_ir} for onnxruntime {ort.__version__}")
    model.ir_version = max_ir
    return model.SerializeToString()


def _run_onnxruntime(spec: ProfileSpec, out: Path, notes: list[str], phase: str) -> dict:
    import onnxruntime as ort

    data = _ort_model_bytes(spec.model, notes)
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if spec.device == "cuda" else ["CPUExecutionProvider"]
    if phase == TIMED:
        sess = ort.InferenceSession(data, providers=providers)
        feed = _random_feed(sess.get_inputs(), dict(spec.input_shapes))
        return {"samples_ms": _time_runs(lambda: sess.run(None, feed), spec), "providers": sess.get_providers()}
    so = ort.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(out / "ort_profile")
    traced = ort.InferenceSession(data, so, providers=providers)
    feed = _random_feed(traced.get_inputs(), dict(spec.input_shapes))
    for _ in range(spec.trace_iterations):
        with measure("benanza_run"):  # an NVTX range per run for nsys
            traced.run(None, feed)
    trace = Path(traced.end_profiling())
    final = out / "ort_profile.json"
    trace.replace(final)
    return {"trace": final.name, "providers": traced.get_providers()}


def _run_torch(spec: ProfileSpec, out: Path, notes: list[str], phase: str) -> dict:
    """Run the graph with Benanza's own executor: one profiler range per layer, named as the
    processor names it, so the trace maps to layers; on CPU its convs go through oneDNN."""
    import torch

    from .torch_exec import load_torch_graph

    graph = load_torch_graph(spec.model, batch_size=spec.batch_size, input_shapes=dict(spec.input_shapes),
                             device=spec.device)
    feed = graph.random_inputs()
    notes.append(f"torch {torch.__version__} ran the ONNX graph with Benanza's eager executor (one torch call "
                 f"per ONNX node, no graph optimisation or fusion), {torch.get_num_threads()} threads")
    with torch.inference_mode():
        if phase == TIMED:
            # the per-layer ranges cost a little: latency samples run without them
            return {"samples_ms": _time_runs(lambda: graph.run(feed, annotate=False), spec),
                    "providers": [spec.device]}
        activities = [torch.profiler.ProfilerActivity.CPU]
        if spec.device == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
            for _ in range(spec.trace_iterations):
                with measure("benanza_run"), torch.profiler.record_function("benanza_run"):
                    graph.run(feed)
    prof.export_chrome_trace(str(out / "torch_trace.json"))
    return {"trace": "torch_trace.json", "providers": [spec.device]}


def _time_runs(run, spec: ProfileSpec) -> list[float]:
    for _ in range(spec.warmup):
        run()
    samples = []
    for _ in range(spec.iterations):
        with measure("benanza_run") as m:
            run()
        assert m.elapsed_ms is not None  # measure() sets it as the block exits
        samples.append(m.elapsed_ms)
    return samples


def _child(spec_path: str, phase: str) -> int:
    spec = ProfileSpec.from_json(json.loads(Path(spec_path).read_text()))
    out = Path(spec.out_dir)
    notes: list[str] = []
    runner = _run_onnxruntime if spec.framework == "onnxruntime" else _run_torch
    result = runner(spec, out, notes, phase)
    result["notes"] = notes
    # what this process saw, so the bundle shows which run had loggers on
    result["loggers"] = {k: os.environ[k] for k in sorted(LOG_ENV) if k in os.environ}
    stem = "child" if phase == TRACED else f"child-{phase}"
    (out / f"{stem}.json").write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1], sys.argv[2]))
