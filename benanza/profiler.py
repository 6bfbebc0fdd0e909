"""``benanza profile``: run a model in a framework and capture its execution profile (§III-D ④).

The model runs twice, each time in a child process (``python -m benanza.profiler SPEC PHASE``):
``timed`` measures the latency with every library logger off, ``traced`` records the
framework trace with the loggers on — cuDNN (``CUDNN_LOGINFO_DBG``/``CUDNN_LOGLEVEL_DBG``),
cuBLAS (``CUBLAS_LOGINFO_DBG``), cuBLASLt (``CUBLASLT_LOG_LEVEL``) and oneDNN
(``ONEDNN_VERBOSE``/``DNNL_VERBOSE``), which read their environment once at load time — and,
with ``--nsys``, under Nsight Systems. Loggers cost time on every call, so they never run in
the timed child. The bundle format is in ``parsers/bundle.py``.

``benanza profile --command CMD`` (``profile_command``) profiles the user's own application the
same way: CMD runs once with the loggers off and once with them on, and its latency comes from
its ``benanza.measure("name")`` blocks, which append one JSON line per block to the file the
``BENANZA_MEASURE_FILE`` environment variable names (the command inherits it).

``measure`` is the timing API for users' own code: ``with benanza.measure("preprocess"):``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import resource
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from . import machine_speed
from .children import kill_group, popen
from .errors import BenanzaError, ModelError, UsageError
from .heap import HeapHeadroom
from .machine_speed import RunSpeed
from .parsers.bundle import latency_stats, model_identity, page_faults_record, write_index
from .system import default_threads
from .toolchain import nsys_importer

log = logging.getLogger(__name__)

FRAMEWORKS = ("onnxruntime", "torch")
# The timed runs read the machine's speed between them this often, or where a reading of many
# CPUs is slow (0.03 s a CPU) at most this share of the time: a host slowdown of a few seconds
# inside the runs, which the readings before and after them both miss, is seen by one between
# them. The readings lengthen the profile, not its runs' times (the run after one is untimed).
READ_DURING_RUNS_S, READ_DURING_RUNS_SHARE = 2.0, 0.05


# --- timing API ----------------------------------------------------------------------------------


@dataclass
class Measurement:
    name: str
    elapsed_ms: float | None = None  # set when the block exits
    page_faults: int | None = None  # the process's minor page faults inside the block, likewise


def minor_faults() -> int:
    """This process's minor page faults so far, all its threads: each is a page the kernel
    had to map (and zero) on first touch, such as memory an allocator took back from the OS."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


# Fresh anonymous memory the fault probe touches: thousands of pages, so the clock's resolution
# and the probe's own loop are a small part of each fault's share
_FAULT_PROBE_BYTES = 16 << 20


def fault_cost_us(probes: int = 5) -> float | None:
    """Microseconds one first-touch page fault costs this process on this machine: fresh
    anonymous pages mapped and each written once, the median of ``probes`` probes (None when the
    kernel counted no fault, as where the memory came pre-faulted)."""
    import mmap

    import numpy as np

    costs = []
    for _ in range(probes):
        m = mmap.mmap(-1, _FAULT_PROBE_BYTES)
        pages = np.frombuffer(m, np.uint8)
        before, start = minor_faults(), time.perf_counter_ns()
        pages[::mmap.PAGESIZE] = 1
        elapsed_ns, faults = time.perf_counter_ns() - start, minor_faults() - before
        del pages  # the buffer's export ends before the mapping closes
        m.close()
        if faults > 0:
            costs.append(elapsed_ns / 1e3 / faults)
    return sorted(costs)[len(costs) // 2] if costs else None


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


# ``profile --command`` hands these to the command it runs: measure() appends each block to
# the first; with the second set (the traced run only) it also writes begin/end marks into
# stdout, where oneDNN prints its verbose lines, so each logged call maps to its block.
MEASURE_FILE_ENV = "BENANZA_MEASURE_FILE"
MEASURE_MARKS_ENV = "BENANZA_MEASURE_MARKS"
MARK = "benanza_measure"


def _flush_c_stdio() -> None:
    import ctypes

    try:
        ctypes.CDLL(None).fflush(None)  # fflush(NULL): every C stdio stream, oneDNN's stdout included
    except (OSError, AttributeError):
        pass


def _mark(event: str, name: str) -> None:
    """A begin/end line in fd 1, after whatever the libraries (C stdio) and Python buffered, so
    the marks sit between the right verbose lines."""
    _flush_c_stdio()
    sys.stdout.flush()
    os.write(1, f"{MARK},{event},{json.dumps(name)}\n".encode())


def _append_record(path: str, record: dict) -> None:
    # one write() on an O_APPEND descriptor: lines from concurrent threads and processes never interleave
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


@contextmanager
def measure(name: str, sync: bool = True) -> Iterator[Measurement]:
    """Time a block of code; the range also appears in Nsight Systems as an NVTX range.

    With ``sync`` and torch's CUDA initialised, the device is synchronised before the clock
    stops, so asynchronous kernels launched in the block are counted. Under ``benanza profile
    --command`` every block is recorded in the profile bundle.
    """
    m = Measurement(name)
    sink = os.environ.get(MEASURE_FILE_ENV)
    marks = os.environ.get(MEASURE_MARKS_ENV) == "1"
    nvtx = _nvtx()
    if nvtx:
        nvtx[0](name)
    if marks:
        _mark("begin", name)
    faults = minor_faults()
    start = time.perf_counter_ns()
    try:
        yield m
    finally:
        synchronize = _cuda_sync() if sync else None
        if synchronize:
            synchronize()
        m.elapsed_ms = (time.perf_counter_ns() - start) / 1e6
        m.page_faults = minor_faults() - faults
        if marks:
            _mark("end", name)
        if nvtx:
            nvtx[1]()
        if sink:
            _append_record(sink, {"name": name, "ms": m.elapsed_ms, "page_faults": m.page_faults, "pid": os.getpid(),
                                  "thread": threading.get_ident(), "start_ns": start})
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
    # --input-value and --input-data: what the runs feed instead of random values
    input_values: tuple[tuple[str, tuple[float, ...]], ...] = ()
    input_data: str | None = None
    threads: int | None = None  # the framework's intra-op threads (None: its default)

    @classmethod
    def from_json(cls, data: dict) -> ProfileSpec:
        shapes = tuple((name, tuple(dims)) for name, dims in data.pop("input_shapes", ()))
        values = tuple((name, tuple(v)) for name, v in data.pop("input_values", ()))
        return cls(**data, input_shapes=shapes, input_values=values)


# the variables by which oneDNN (and DNNL, its former name) read their verbose level at load time
ONEDNN_VERBOSE_ENV = ("ONEDNN_VERBOSE", "DNNL_VERBOSE")
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


def _quiet_env(out: Path) -> dict[str, str]:
    """This process's environment without any logger variable (even a user's own setting)."""
    return {k: v for k, v in os.environ.items() if k not in _log_env(out) and k != ORT_PROFILE_ENV}


# Where, in the traced run of `profile --command`, an application's ONNX Runtime sessions built
# with ort_session_options() write ORT's profile (ORT has no environment switch of its own).
ORT_PROFILE_ENV = "BENANZA_ORT_PROFILE_PREFIX"
_ORT_APP = "ort-app"
# `profile --command --threads N`: ONNX Runtime reads no environment variable for its intra-op
# threads, so ort_session_options() sets them from this one; torch (at its start), OpenMP and
# MKL read theirs
THREADS_ENV = "BENANZA_THREADS"


def _threads_env(threads: int | None) -> dict[str, str]:
    if threads is None:
        return {}
    return {name: str(threads) for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", THREADS_ENV)}


def ort_session_options(options: Any = None) -> Any:
    """``onnxruntime.SessionOptions`` for an application's session, so that ``benanza profile
    --command`` gets ONNX Runtime's per-node profile: in the traced run the profiler writes into
    the bundle; in the timed run and outside Benanza the options are returned unchanged, so the
    latency is never timed with the profiler on. ``options``: the application's own (else new)."""
    import onnxruntime as ort

    so = ort.SessionOptions() if options is None else options
    threads = os.environ.get(THREADS_ENV)
    if threads and not so.intra_op_num_threads:  # the application's own choice stands
        so.intra_op_num_threads = int(threads)
    prefix = os.environ.get(ORT_PROFILE_ENV)
    if prefix:
        stem = f"{prefix}-{os.getpid()}-{id(so):x}"
        so.enable_profiling = True
        so.profile_file_prefix = stem
        # the profile itself does not name the version or the threads the session ran with
        Path(f"{stem}.meta").write_text(json.dumps({"onnxruntime": ort.__version__,
                                                    "intra_op_num_threads": so.intra_op_num_threads}))
    return so


def _fresh(out: Path) -> None:
    """Remove the logs and reports an earlier profile left in OUT: the collectors take what
    exists, so a stale cuDNN log or Nsight report would pass for this run's."""
    for pattern in ("cudnn.log", "cublas.log", "cublaslt.log", "onednn*.log", "nsys.*", f"{_ORT_APP}-*",
                    "ort_profile.json"):
        for stale in out.glob(pattern):
            stale.unlink()


def _nsys_bin(nsys: bool) -> str | None:
    nsys_bin = shutil.which("nsys") if nsys else None
    if nsys and nsys_bin is None:
        raise UsageError("--nsys: Nsight Systems' `nsys` is not on PATH (scripts/install-nsys.sh installs it)")
    return nsys_bin


def _under_nsys(cmd: list[str], nsys_bin: str | None, out: Path, device: str) -> list[str]:
    if not nsys_bin:
        return cmd
    trace = "osrt,nvtx" if device == "cpu" else "cuda,nvtx,osrt,cudnn,cublas"
    return [nsys_bin, "profile", f"--trace={trace}", "--sample=none", "--cpuctxsw=none",
            "--force-overwrite=true", "-o", str(out / "nsys")] + cmd


def profile_model(spec: ProfileSpec, nsys: bool = False) -> Path:
    """Time the model in a child without loggers, then record its trace and library logs (and
    nsys) in a second child with them on; write the bundle and return its folder."""
    from .processor import input_shapes_of  # not at import: benanza.measure needs none of it

    version = check_framework(spec.framework, spec.device)
    # the processor's rule (batch axis, --input-shape; --input-data arrays give their own shapes),
    # so the run has the shapes analyze keys
    given = _given_inputs(spec)
    arrays = {n: given[n].shape for n in given if n not in dict(spec.input_values)}  # --input-data's
    shapes = input_shapes_of(spec.model, spec.batch_size, {**arrays, **dict(spec.input_shapes)})
    for name, arr in given.items():
        if name in shapes and arr.size != math.prod(shapes[name]):
            raise UsageError(f"--input-value/--input-data {name}: {arr.size} values for an input of shape "
                             f"{'x'.join(map(str, shapes[name])) or 'scalar'}")
    spec = replace(spec, input_shapes=tuple(shapes.items()),
                   input_data=str(Path(spec.input_data).resolve()) if spec.input_data else None)
    out = Path(spec.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _fresh(out)
    spec_path = out / "spec.json"
    spec_path.write_text(json.dumps(spec.__dict__, indent=1))
    identity = model_identity(spec.model, spec.batch_size)
    nsys_bin = _nsys_bin(nsys)
    quiet = _quiet_env(out)
    timed, timed_cmd = _child_run(spec, spec_path, TIMED, quiet, None)
    traced, traced_cmd = _child_run(spec, spec_path, TRACED, {**quiet, **_log_env(out)}, nsys_bin)
    files = {"trace": traced["trace"]}
    notes = timed.get("notes", []) + [n for n in traced.get("notes", []) if n not in timed.get("notes", [])]
    if timed.get("threads", traced["threads"]) != traced["threads"]:
        notes.append(f"the timed run used {timed['threads']} intra-op threads, the traced run {traced['threads']}")
    _collect_onednn(out, files, notes, spec.framework)
    _collect_gpu_logs(out, files, notes, spec.device)
    if nsys_bin:
        _collect_nsys(out, files, notes)
    write_index(out, {
        "model": spec.model, "model_identity": identity, "framework": spec.framework,
        "framework_version": version, "device": spec.device, "batch_size": spec.batch_size,
        "warmup": spec.warmup, "iterations": spec.iterations, "trace_iterations": spec.trace_iterations,
        "input_shapes": {name: list(dims) for name, dims in spec.input_shapes},
        "providers": timed.get("providers", []), "command": timed_cmd,
        "runs": {TIMED: {"command": timed_cmd, "loggers": timed["loggers"]},
                 TRACED: {"command": traced_cmd, "loggers": traced["loggers"],
                          **({"page_faults": page_faults_record(traced["page_faults"], None), "heap": traced["heap"]}
                             if "heap" in traced else {})}},
        "latency_ms": latency_stats(timed["samples_ms"]).to_json(), "files": files, "notes": notes,
        "page_faults": page_faults_record(timed["page_faults"], timed["fault_us"]),
        "threads": traced["threads"], "threads_requested": spec.threads, "threads_source": traced["threads_source"],
        "machine_speed": timed.get("machine_speed"),
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


def _shown(cmd: list[str] | tuple[str, ...]) -> str:
    """A command as one line for messages (a `python -c` program may span several)."""
    return shlex.join(cmd).replace("\n", "\\n")


def _run_logged(cmd: list[str], env: dict[str, str], out: Path, stem: str, timeout: float | None = None) -> int:
    """Run ``cmd`` with stdout and stderr in OUT/STEM.stdout/.stderr; its exit status.

    The child leads its own process group, which is killed whole on a timeout, Ctrl-C or
    SIGTERM (a serving command's workers too), and dies with Benanza (children.popen)."""
    log.info("running %s", _shown(cmd))
    with open(out / f"{stem}.stdout", "w") as so, open(out / f"{stem}.stderr", "w") as se:
        try:
            proc = popen(cmd, env=env, stdout=so, stderr=se, stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:  # not found, not executable
            raise BenanzaError(f"cannot run `{_shown(cmd)}`: {exc.strerror or exc}") from None
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            raise BenanzaError(f"`{_shown(cmd)}` ran past --timeout {timeout:g} s and was killed "
                               f"(output so far: {out / f'{stem}.stderr'})") from None
        except BaseException:  # Ctrl-C, SIGTERM: no orphaned command keeps running
            kill_group(proc)
            raise


def _child_run(spec: ProfileSpec, spec_path: Path, phase: str, env: dict[str, str],
               nsys_bin: str | None) -> tuple[dict, str]:
    """One phase in a child process; its result record and command line."""
    out = Path(spec.out_dir)
    cmd = _under_nsys([sys.executable, "-m", "benanza.profiler", str(spec_path), phase], nsys_bin, out, spec.device)
    # the traced child's stdout carries oneDNN's verbose lines (collected as child.stdout)
    stem = "child" if phase == TRACED else f"child-{phase}"
    result = out / f"{stem}.json"
    result.unlink(missing_ok=True)
    returncode = _run_logged(cmd, env, out, stem)
    if returncode != 0 or not result.exists():
        raise BenanzaError(f"{spec.model}: the {phase} {spec.framework} run failed (exit {returncode}): "
                           f"{_last_error(out / f'{stem}.stderr')} (full output: {out / f'{stem}.stderr'})")
    return json.loads(result.read_text()), " ".join(cmd)


_VERBOSE = ("onednn_verbose,", "dnnl_verbose,")


def _collect_onednn(out: Path, files: dict, notes: list[str], framework: str) -> None:
    """oneDNN prints verbose lines on stdout, interleaved with anything else the child prints."""
    lines = [ln for ln in (out / "child.stdout").read_text(errors="replace").splitlines() if ln.startswith(_VERBOSE)]
    (out / "onednn.log").write_text("".join(ln + "\n" for ln in lines))
    files["onednn_log"] = "onednn.log"
    if not lines:
        if framework == "onnxruntime":
            notes.append("oneDNN verbose log is empty: ONNX Runtime's CPU execution provider runs its own MLAS "
                         "kernels, not oneDNN, so there are no oneDNN calls to compare (Q3/Q4 library views "
                         "need a oneDNN-backed framework, e.g. PyTorch on CPU)")
        else:
            notes.append("oneDNN verbose log is empty: the framework made no oneDNN calls")


def _collect_gpu_logs(out: Path, files: dict, notes: list[str], device: str) -> None:
    for name, key in (("cudnn.log", "cudnn_log"), ("cublas.log", "cublas_log"), ("cublaslt.log", "cublas_log")):
        p = out / name
        if p.exists() and p.stat().st_size > 0:
            if key in files:  # cuBLAS and cuBLASLt share one parser: append Lt lines to cublas.log
                with open(out / files[key], "a") as f:
                    f.write(p.read_text(errors="replace"))
            else:
                files[key] = name
    if device == "cpu":
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
        qdstrm.unlink(missing_ok=True)  # the raw stream the report was imported from (tens of MB)
    else:
        notes.append("nsys ran but produced no .nsys-rep (see child.stderr); the Nsight view is absent")
    # nsys writes its files with modes of its own (group- or world-writable): give them the
    # user's umask like every other file of the bundle
    mask = os.umask(0)
    os.umask(mask)
    for made in out.glob("nsys.*"):
        made.chmod(0o666 & ~mask)


# --- profile --command: the user's own application ---------------------------------------------


@dataclass(frozen=True)
class CommandSpec:
    """``benanza profile --command``: a user's command whose ``benanza.measure`` blocks time the model."""

    command: tuple[str, ...]
    out_dir: str
    name: str | None = None  # which measure name is the model's latency (needed when there are several)
    warmup: int = 5  # the first WARMUP blocks of each name are dropped, in both runs
    model: str | None = None  # the ONNX file the command runs, for the analyzer's identity check
    batch_size: int | None = None
    device: str = "cpu"
    timeout: float | None = None  # seconds per run
    threads: int | None = None  # intra-op threads, through the environment the command's frameworks read


@dataclass(frozen=True)
class _Blocks:
    """The measure blocks of one run, by name, in the order they ended."""

    samples: dict[str, list[float]]
    # each block's page faults, by name; a name any of whose records lacks the count (a
    # benanza.measure older than the count) has none
    faults: dict[str, list[int]]

    @classmethod
    def read(cls, path: Path) -> _Blocks:
        samples: dict[str, list[float]] = {}
        faults: dict[str, list[int | None]] = {}
        if path.exists():
            for lineno, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                try:
                    rec = json.loads(line)
                    samples.setdefault(str(rec["name"]), []).append(float(rec["ms"]))
                    count = rec.get("page_faults")
                    faults.setdefault(str(rec["name"]), []).append(None if count is None else int(count))
                except (ValueError, KeyError, TypeError):
                    raise BenanzaError(f"{path}: line {lineno} is not a benanza.measure record "
                                       f"(did something else write to ${MEASURE_FILE_ENV}?)") from None
        return cls(samples, {n: [c for c in v if c is not None] for n, v in faults.items() if None not in v})


def _split_by_measure(stdout: Path, warmup: int) -> tuple[list[str], dict[str, list[str]]]:
    """Every oneDNN verbose line of a run, and per measure name the lines logged inside its
    blocks after the first WARMUP of them (the marks measure() wrote say where blocks begin
    and end; a line inside nested blocks belongs to each of them). Each name's lines start
    with the log's ``info`` header, which names the oneDNN version."""
    every: list[str] = []
    header: list[str] = []
    by_name: dict[str, list[str]] = {}
    opened: dict[str, int] = {}  # blocks of each name begun so far
    stack: list[tuple[str, int]] = []
    for line in stdout.read_text(errors="replace").splitlines():
        if line.startswith(_VERBOSE):
            every.append(line)
            if ",info," in line:
                header.append(line)
                continue
            for name, k in {n: k for n, k in stack}.items():
                if k >= warmup:
                    by_name.setdefault(name, header.copy()).append(line)
        elif line.startswith(MARK + ","):
            _, event, quoted = line.split(",", 2)
            name = json.loads(quoted)
            if event == "begin":
                stack.append((name, opened.get(name, 0)))
                opened[name] = opened.get(name, 0) + 1
            elif any(n == name for n, _ in stack):
                while stack.pop()[0] != name:  # an inner block another thread left open
                    pass
    return every, by_name


def _measured(blocks: _Blocks, spec: CommandSpec, shown: str, stdout: Path) -> tuple[str, dict[str, dict]]:
    """The measure name that is the model's latency, and every name's statistics after warmup."""
    if not blocks.samples:
        raise BenanzaError(f"`{shown}` never called benanza.measure: time the model's inference in the command "
                           f"with `with benanza.measure(\"NAME\"):` (the latency comes from those blocks; output: "
                           f"{stdout})")
    names = sorted(blocks.samples)
    if spec.name is not None and spec.name not in blocks.samples:
        raise UsageError(f"--name {spec.name}: `{shown}` measured no block of that name (it measured "
                         f"{', '.join(names)})")
    if spec.name is None and len(names) > 1:
        raise UsageError(f"`{shown}` measured several names ({', '.join(names)}): say which is the model's "
                         f"latency with --name")
    chosen = spec.name or names[0]
    stats = {}
    for name in names:
        kept = blocks.samples[name][spec.warmup:]
        if kept:
            stats[name] = {"latency_ms": latency_stats(kept).to_json(), "blocks": len(blocks.samples[name]),
                           "warmup_dropped": len(blocks.samples[name]) - len(kept)}
            if name in blocks.faults:
                stats[name]["page_faults"] = blocks.faults[name][spec.warmup:]
    if chosen not in stats:
        raise UsageError(f"`{shown}` measured {chosen!r} {len(blocks.samples[chosen])} times, all of them dropped "
                         f"as --warmup {spec.warmup}: run more iterations or lower --warmup")
    return chosen, stats


def profile_command(spec: CommandSpec, nsys: bool = False) -> Path:
    """Profile a user's command: its ``benanza.measure`` blocks timed in a run without loggers,
    its library calls logged in a second run (under nsys with ``nsys``); write the bundle."""
    if not spec.command:
        raise UsageError("--command: no command given")
    out = Path(spec.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _fresh(out)
    shown = _shown(spec.command)
    identity = model_identity(spec.model, spec.batch_size or 1) if spec.model else None
    nsys_bin = _nsys_bin(nsys)
    quiet = {**_quiet_env(out), **_threads_env(spec.threads)}
    quiet.pop(MEASURE_MARKS_ENV, None)
    runs: dict[str, dict] = {}
    blocks: dict[str, _Blocks] = {}
    traced_env = {**quiet, **_log_env(out), MEASURE_MARKS_ENV: "1", ORT_PROFILE_ENV: str((out / _ORT_APP).resolve())}
    # the machine's speed for the command's threads, read here just before its timed run starts and
    # just after it exits: between its blocks it would be read inside the user's process
    reader = machine_speed.Reader(spec.threads or default_threads()) if spec.device == "cpu" else None
    speed: RunSpeed | None = None
    for phase, env, wrap in ((TIMED, quiet, None), (TRACED, traced_env, nsys_bin)):
        stem = "command" if phase == TRACED else f"command-{phase}"
        sink = out / f"measure-{phase}.jsonl"
        sink.unlink(missing_ok=True)
        cmd = _under_nsys(list(spec.command), wrap, out, spec.device)
        before = reader() if reader is not None and phase == TIMED else None
        returncode = _run_logged(cmd, {**env, MEASURE_FILE_ENV: str(sink.resolve())}, out, stem, spec.timeout)
        if reader is not None and before is not None:
            speed = RunSpeed(before, reader())
        stderr = out / f"{stem}.stderr"
        if returncode != 0:
            raise BenanzaError(f"`{shown}` failed in the {phase} run (exit {returncode}): {_last_error(stderr)} "
                               f"(full output: {stderr})")
        blocks[phase] = _Blocks.read(sink)
        runs[phase] = {"command": shlex.join(cmd), "loggers": {k: env[k] for k in sorted(LOG_ENV) if k in env},
                       "threads_env": _threads_env(spec.threads),
                       "measure_blocks": {n: len(v) for n, v in blocks[phase].samples.items()}}
        if phase == TIMED:
            chosen, measures = _measured(blocks[phase], spec, shown, out / f"{stem}.stdout")

    files: dict[str, str] = {}
    notes: list[str] = []
    every, by_name = _split_by_measure(out / "command.stdout", spec.warmup)
    _collect_gpu_logs(out, files, notes, spec.device)
    gpu_calls = any(k in files for k in ("cudnn_log", "cublas_log"))
    ort_app = _collect_app_ort(out, files, notes)
    if not any(",exec," in ln for ln in every) and not gpu_calls and ort_app is None:
        # the latency stands; only the views that map calls to layers (Q3, Q4) have nothing to read
        notes.append(f"no library call was captured in the traced run (no oneDNN verbose line on its stdout, no "
                     f"cuDNN/cuBLAS log, no ONNX Runtime profile): the bundle has the latency only. An "
                     f"application serving with ONNX Runtime gives its per-node profile when it builds its "
                     f"session with benanza.ort_session_options() (output: {out / 'command.stdout'})")
    (out / "onednn-all.log").write_text("".join(ln + "\n" for ln in every))
    for i, name in enumerate(sorted(measures), 1):
        if by_name.get(name):
            (out / f"onednn-{i}.log").write_text("".join(ln + "\n" for ln in by_name[name]))
            measures[name]["onednn_log"] = f"onednn-{i}.log"
    if chosen in by_name:
        files["onednn_log"] = measures[chosen]["onednn_log"]
        notes.append(f"the oneDNN calls are those logged inside the {chosen!r} blocks after the first "
                     f"{spec.warmup} (onednn-all.log has every call of the run)")
    elif every:
        files["onednn_log"] = "onednn-all.log"
        notes.append(f"no oneDNN call was logged inside a {chosen!r} block after warmup: the oneDNN view uses "
                     f"every call of the run")
    if gpu_calls:
        notes.append("cuDNN/cuBLAS logs hold every call of the traced run, not only those inside measure blocks")
    if nsys_bin:
        _collect_nsys(out, files, notes)
    threads, source = _command_threads(out, files, every, spec.threads, notes)
    others = [n for n in measures if n != chosen]
    if others:
        notes.append(f"latency from the {chosen!r} blocks; the bundle's \"measures\" also has "
                     f"{', '.join(repr(n) for n in others)}")
    write_index(out, {
        "model": str(Path(spec.model).resolve()) if spec.model else "", "model_identity": identity,
        # an application's ORT trace is analysed as ORT's own (its backend, its Q3)
        "framework": "command" if ort_app is None else "onnxruntime",
        "framework_version": "" if ort_app is None else ort_app, "device": spec.device, "batch_size": spec.batch_size,
        "warmup": spec.warmup, "command": shown, "measure_name": chosen, "measures": measures,
        "runs": runs,
        "latency_ms": measures[chosen]["latency_ms"], "files": files, "notes": notes,
        # the command's own process took the faults; a fault costs the same in this one, on this machine
        "page_faults": page_faults_record(measures[chosen].get("page_faults", []), fault_cost_us()),
        "threads": threads, "threads_requested": spec.threads, "threads_source": source,
        "machine_speed": None if speed is None else speed.to_json(),
    })
    return out


def _command_threads(out: Path, files: dict, verbose: list[str], requested: int | None,
                     notes: list[str]) -> tuple[int | None, str | None]:
    """The command's intra-op threads as its frameworks reported them in the traced run (ONNX
    Runtime's thread-pool statistics, else oneDNN's ``nthr``), else those it was given, and where
    the count comes from."""
    from .parsers import parse_ort_profile
    from .parsers.onednn_verbose import threads_in

    seen: list[tuple[int | None, str]] = []
    if files.get("trace") == "ort_profile.json":
        seen.append((parse_ort_profile(out / "ort_profile.json").threads,
                     "ONNX Runtime's thread-pool statistics in the application's profile"))
    seen.append((threads_in("\n".join(verbose)), "oneDNN's verbose log (nthr)"))
    for threads, source in seen:
        if threads is not None:
            if requested is not None and threads != requested:
                notes.append(f"--threads {requested}: the command ran {threads} threads ({source}): it sets its own")
            return threads, source
    if requested is not None:
        return requested, "OMP_NUM_THREADS, MKL_NUM_THREADS and $BENANZA_THREADS given to the command (no " \
                          "framework in it reported its count)"
    return None, None


def _collect_app_ort(out: Path, files: dict, notes: list[str]) -> str | None:
    """The ONNX Runtime profile the application's sessions wrote in the traced run (through
    ort_session_options()) as the bundle's trace; the ORT version it ran, None without one."""
    from .parsers import parse_ort_profile

    written = sorted(p for p in out.glob(f"{_ORT_APP}-*.json"))
    if not written:
        return None
    runs = {p: len(parse_ort_profile(p).runs) for p in written}
    chosen = max(written, key=lambda p: runs[p])  # the serving session, not a warm-up or helper one
    meta = json.loads(chosen.with_name(chosen.name.split("_", 1)[0] + ".meta").read_text())
    chosen.replace(out / "ort_profile.json")
    files["trace"] = "ort_profile.json"
    threads = meta["intra_op_num_threads"]
    notes.append(f"the application's ONNX Runtime {meta['onnxruntime']} session wrote its per-node profile in the "
                 f"traced run ({runs[chosen]} runs, warm-up included; intra-op threads "
                 f"{threads if threads else 'ORT default'}); the latency is from the timed run, profiler off")
    if len(written) > 1:
        notes.append(f"{len(written)} ONNX Runtime sessions wrote profiles; the trace is the one with the most runs, "
                     f"the others are kept as {', '.join(p.name for p in written if p != chosen)}")
    return str(meta["onnxruntime"])


# --- child process -------------------------------------------------------------------------------


def _given_inputs(spec: ProfileSpec) -> dict:
    """The arrays --input-data and --input-value give (values flat: shaped by the caller)."""
    import numpy as np

    from .shapes_by_execution import load_input_data

    given = load_input_data(spec.input_data) if spec.input_data else {}
    given.update((name, np.array(v)) for name, v in spec.input_values)
    return given


def _with_given(feed: dict, spec: ProfileSpec, to_feed=lambda arr, like: arr.astype(like.dtype)) -> dict:
    """``feed`` with the given inputs in place of random ones, in each input's dtype and shape."""
    shapes = dict(spec.input_shapes)
    for name, arr in _given_inputs(spec).items():
        if name in feed:
            feed[name] = to_feed(arr.reshape(shapes[name]), feed[name])
    return feed


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


def _ort_session(path: str, notes: list[str], providers: list[str], options=None):
    """One ONNX Runtime session of the model, given its path: ORT reads the weights, external data
    included, itself (a model past 2 GB cannot be serialized to bytes, and a copy in this process
    would double its memory).

    ORT states the highest IR version it reads only in its load error, which it raises before
    reading any weight: then the model's graph (without its weights) is lowered to that version,
    handed over as bytes, or, when its weights are external data, written beside the file so
    the references resolve.
    """
    import re

    import onnx
    import onnxruntime as ort

    try:
        return ort.InferenceSession(path, options, providers=providers)
    except Exception as exc:  # noqa: BLE001 - ORT raises its own Fail type
        m = re.search(r"Unsupported model IR version: \d+, max supported IR version: (\d+)", str(exc))
        if m is None:
            raise ModelError(path, f"onnxruntime cannot load the model: {exc}") from None
        max_ir = int(m.group(1))
    model = onnx.load(path, load_external_data=False)
    notes.append(f"model IR version {model.ir_version} lowered to {max_ir} for onnxruntime {ort.__version__}")
    model.ir_version = max_ir
    if not any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer):
        return ort.InferenceSession(model.SerializeToString(), options, providers=providers)
    lowered = Path(path).with_name(f".{Path(path).stem}.ir{max_ir}.benanza.onnx")
    try:
        onnx.save(model, str(lowered))
        return ort.InferenceSession(str(lowered), options, providers=providers)
    except OSError as exc:
        raise ModelError(path, f"cannot write the IR-lowered copy beside it for onnxruntime ({exc})") from None
    finally:
        lowered.unlink(missing_ok=True)


def _run_onnxruntime(spec: ProfileSpec, out: Path, notes: list[str], phase: str) -> dict:
    import onnxruntime as ort

    from .parsers.ort import parse_ort_profile

    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if spec.device == "cuda" else ["CPUExecutionProvider"]
    so = ort.SessionOptions()
    so.intra_op_num_threads = spec.threads or 0  # 0: ORT's default, one per physical core
    if phase == TIMED:
        sess = _ort_session(spec.model, notes, providers, so)
        feed = _with_given(_random_feed(sess.get_inputs(), dict(spec.input_shapes)), spec)
        # ORT's default threads (one per physical core) are known only from the traced run's
        # profile: without --threads each CPU this process may use is read
        return {**_time_runs(lambda: sess.run(None, feed), spec, spec.threads or default_threads()),
                "providers": sess.get_providers()}
    so.enable_profiling = True
    so.profile_file_prefix = str(out / "ort_profile")
    traced = _ort_session(spec.model, notes, providers, so)
    feed = _with_given(_random_feed(traced.get_inputs(), dict(spec.input_shapes)), spec)
    for _ in range(spec.trace_iterations):
        with measure("benanza_run"):  # an NVTX range per run for nsys
            traced.run(None, feed)
    trace = Path(traced.end_profiling())
    final = out / "ort_profile.json"
    trace.replace(final)
    # ORT states the threads its session used only in its profile's thread-pool statistics; the
    # timed session has the same options, so the same pool
    threads, source = parse_ort_profile(final).threads, "ONNX Runtime's thread-pool statistics in its profile"
    if threads is None:  # a release whose profile records no statistics
        threads, source = spec.threads, "the sessions' intra_op_num_threads"
    return {"trace": final.name, "providers": traced.get_providers(), "threads": threads, "threads_source": source}


def _run_torch(spec: ProfileSpec, out: Path, notes: list[str], phase: str) -> dict:
    """Run the graph with Benanza's own executor: one profiler range per layer, named as the
    processor names it, so the trace maps to layers; on CPU its convs go through oneDNN."""
    import torch

    from .torch_exec import load_torch_graph

    if spec.threads:
        torch.set_num_threads(spec.threads)
    graph = load_torch_graph(spec.model, batch_size=spec.batch_size, input_shapes=dict(spec.input_shapes),
                             device=spec.device)
    threads = {"threads": torch.get_num_threads(), "threads_source": "torch.get_num_threads() in the run"}
    feed = _with_given(graph.random_inputs(), spec,
                       lambda arr, like: torch.from_numpy(arr).to(dtype=like.dtype, device=like.device))
    notes.append(f"torch {torch.__version__} ran the ONNX graph with Benanza's eager executor (one torch call "
                 f"per ONNX node, no graph optimisation or fusion), {torch.get_num_threads()} threads")
    with torch.inference_mode():
        if phase == TIMED:
            # the per-layer ranges cost a little: latency samples run without them
            return {**_time_runs(lambda: graph.run(feed, annotate=False), spec, torch.get_num_threads()),
                    "providers": [spec.device], **threads}
        activities = [torch.profiler.ProfilerActivity.CPU]
        if spec.device == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        # oneDNN's log comes from runs of its own, after the profiler's: its verbose printing is
        # no part of a kernel's time
        onednn_log = spec.device == "cpu" and any(os.environ.get(k, "0") not in ("", "0") for k in ONEDNN_VERBOSE_ENV)
        if onednn_log:
            torch._C._verbose.mkldnn_set_verbose(0)  # what torch.backends.mkldnn.verbose sets, switched off
        # the profiler's growing event memory must not push the tensors onto fresh pages (heap.py)
        heap = HeapHeadroom()
        if heap.active:
            graph.run(feed, annotate=False)
            heap.hold()
        faults = []
        # no shapes: the analysis reads none from a torch trace (its layers are named ranges), and
        # recording them costs every op time the isolated benchmarks' profiler does not spend,
        # and memory (ResNet-50: about 40 MB per run)
        with torch.profiler.profile(activities=activities, record_shapes=False) as prof:
            for _ in range(spec.trace_iterations):
                heap.refill()
                with measure("benanza_run") as m, torch.profiler.record_function("benanza_run"):
                    graph.run(feed)
                heap.spent()
                faults.append(m.page_faults or 0)
        notes.append(f"the profiler's runs kept the model's tensors on mapped pages: the heap untrimmed and "
                     f"grown by {heap.grown_bytes / 2**20:.0f} MiB of pages touched ahead of them" if heap.active else
                     f"the profiler's runs may put the model's tensors on fresh pages ({heap.reason})")
        if onednn_log:
            with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
                for _ in range(spec.trace_iterations):
                    graph.run(feed, annotate=False)
            notes.append(f"the oneDNN log comes from {spec.trace_iterations} runs after the profiler's, without it")
        notes.append(f"the profiler's runs took {sum(faults) / max(1, len(faults)):.0f} page faults per run, which its "
                     f"per-layer times hold")
    prof.export_chrome_trace(str(out / "torch_trace.json"))
    return {"trace": "torch_trace.json", "providers": [spec.device], **threads, "page_faults": faults,
            "heap": {"kept": heap.active, "grown_bytes": heap.grown_bytes, "why_not": heap.reason}}


def _time_runs(run, spec: ProfileSpec, threads: int, read_every_s: float = READ_DURING_RUNS_S) -> dict[str, Any]:
    """The timed child's record: each run's latency and page faults, what a fault costs here, and
    on a CPU the machine's speed for a run of ``threads`` threads just before and after the runs
    and between them every ``read_every_s`` (at least once), read in this process (the parent, woken from its
    wait, may read another CPU in another state: a GPU's kernels run on device clocks the host
    does not slow)."""
    # read before the warm-up runs: its copy leaves the caches cold, and they warm them again
    speed = machine_speed.Periodic(threads, read_every_s, READ_DURING_RUNS_SHARE) if spec.device == "cpu" else None
    before = speed.read() if speed is not None else None
    for _ in range(spec.warmup):
        run()
    samples, faults = [], []
    during: list[machine_speed.MachineSpeed] = []
    for i in range(spec.iterations):
        # and once halfway whatever the time: the median of three readings resists one slow
        # reading of a short run (a 1.3 s profile read 1.16 ms core before its runs, 0.86 after)
        if speed is not None and (speed.due() or (i == spec.iterations // 2 and not during)):
            during.append(speed.read())
            run()  # untimed: the reading's copy left the caches cold, as the warm-up runs found them
        with measure("benanza_run") as m:
            run()
        assert m.elapsed_ms is not None and m.page_faults is not None  # measure() sets them as the block exits
        samples.append(m.elapsed_ms)
        faults.append(m.page_faults)
    record = None
    if speed is not None and before is not None:
        record = RunSpeed(before, speed.read(), tuple(during)).to_json()
    return {"samples_ms": samples, "page_faults": faults, "fault_us": fault_cost_us(), "machine_speed": record}


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
