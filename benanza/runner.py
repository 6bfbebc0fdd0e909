"""``benanza run``: build the generated benchmarks, run what the database lacks, store results.

The binary speaks the line protocol of ``runtime_cpp/common`` (BENANZA_START / BENANZA_RESULT).
Results are stored as they arrive (small transactions), so Ctrl-C or a crash keeps
everything measured so far and a re-run continues where it stopped. A benchmark that kills
its process (segfault, abort) or exceeds ``timeout`` is stored as failed with the reason, and
the binary is restarted after it.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from .errors import BenanzaError, UsageError
from .generator import read_variants
from .manifest import read_manifest
from .perfdb import PerfDB, resolve_db_path
from .records import UNSTABLE_RSD, Result, Status, System, Variant
from .system import default_threads, detect_system, probe_gpu, runnable_tasks

log = logging.getLogger(__name__)

BINARY = "benanza_bench"
BACKENDS = ("onednn", "cudnn")
_FLUSH_EVERY = 16  # results per transaction while running
_FLUSH_SECONDS = 2.0


class NoDeviceError(BenanzaError):
    """The cuDNN backend was asked for on a machine without a CUDA device."""


class BuildError(BenanzaError):
    """CMake could not configure or build the generated project."""


@dataclass(frozen=True)
class RunOptions:
    filter: str | None = None  # regex over benchmark names (re.search)
    dry_run: bool = False
    force: bool = False  # re-run variants already measured on this system+stack
    min_time: float = 0.2  # seconds per repetition (Google Benchmark --benchmark_min_time)
    repetitions: int = 3
    threads: int | None = None  # CPU threads (oneDNN: OMP_NUM_THREADS); default all cores
    timeout: float = 300.0  # seconds one benchmark may run before it is killed
    build_jobs: int | None = None
    cmake_args: tuple[str, ...] = ()
    command: str = ""  # the command line, stored beside each result
    env: tuple[tuple[str, str], ...] = ()  # extra environment for the benchmark binary
    max_rsd: float = UNSTABLE_RSD  # relative stddev above which a result is unstable
    remeasure: int = 2  # extra measurements of a result while it is unstable
    max_failures: int = 3  # a variant that failed this often in a row is skipped (--force retries)


@dataclass
class RunSummary:
    system: System
    backend: str
    db_path: Path
    total: int  # variants generated (after --filter)
    already: int  # skipped: already measured (ok or unsupported) on this system+stack
    to_run: list[str] = field(default_factory=list)
    ok: int = 0  # final outcome per variant run
    unsupported: int = 0
    failed: int = 0
    unstable: int = 0  # ok, but still above max_rsd after every re-measurement (flagged in the DB)
    remeasured: int = 0  # extra measurements of unstable results
    gave_up: list[str] = field(default_factory=list)  # failed max_failures times in a row: skipped
    interrupted: bool = False
    seconds: float = 0.0
    # Share of samples, while benchmarks ran, in which more tasks were runnable than the
    # benchmark's threads plus the sampler: other work competed for the CPU.
    contended: float = 0.0
    context: dict = field(default_factory=dict)

    @property
    def stored(self) -> int:
        return self.ok + self.unsupported + self.failed


@dataclass(frozen=True)
class Progress:
    done: int
    total: int
    name: str
    status: Status | None  # None: started


def resolve_backend(backend: str) -> str:
    if backend == "auto":
        return "cudnn" if probe_gpu().present else "onednn"
    if backend not in BACKENDS:
        raise UsageError(f"unknown backend {backend!r}; choose auto, {', '.join(BACKENDS)}")
    return backend


def check_device(backend: str) -> None:
    """Stops before anything is built when the backend needs a GPU this machine lacks."""
    if backend != "cudnn":
        return
    gpu = probe_gpu()
    if not gpu.present:
        raise NoDeviceError(f"no CUDA device found ({gpu.reason}); the cudnn backend needs one. "
                            f"On this machine `--backend auto` runs onednn.")


def run(bench_dir: str | Path, system_name: str, backend: str = "auto", db_path: str | Path | None = None,
        options: RunOptions = RunOptions(), progress: Callable[[Progress], None] | None = None) -> RunSummary:
    """Builds and runs the missing benchmarks of ``bench_dir`` into the database."""
    backend = resolve_backend(backend)
    check_device(backend)
    bench_dir = Path(bench_dir)
    project = bench_dir / backend
    manifest = read_manifest(bench_dir)
    variants = _select(read_variants(project), options.filter)
    threads = options.threads or default_threads()
    path = Path(db_path) if db_path else resolve_db_path(None)
    started = time.monotonic()

    if options.dry_run:
        # Nothing is built, so the stack is what the machine reports, not the binary's context.
        system = detect_system(system_name, backend, threads=threads)
        if options.force or not path.exists():
            return RunSummary(system, backend, path, len(variants), 0, [v.name for v in variants])
        with PerfDB(path) as db:
            return _plan(db, system, variants, options, path)

    binary = build(project, options.build_jobs, options.cmake_args)
    env = _bench_env(backend, threads, options)
    context = binary_context(binary, env)
    system = detect_system(system_name, backend, threads=threads, overrides=_stack_overrides(backend, context))
    with PerfDB(path) as db:
        db.record_models(manifest)
        db.upsert_system(system)
        if options.force:
            summary = RunSummary(system, backend, path, len(variants), 0, [v.name for v in variants])
        else:
            summary = _plan(db, system, variants, options, path)
        summary.context = context
        by_name = {v.name: v for v in variants}
        todo = [by_name[n] for n in summary.to_run]
        if todo:
            _execute(binary, todo, env, options, db, system, summary, progress)
    summary.seconds = time.monotonic() - started
    return summary


def _select(variants: list[Variant], pattern: str | None) -> list[Variant]:
    if not pattern:
        return variants
    try:
        rx = re.compile(pattern)
    except re.error as exc:
        raise UsageError(f"--filter {pattern!r} is not a regular expression ({exc})") from None
    return [v for v in variants if rx.search(v.name)]


def _plan(db: PerfDB, system: System, variants: list[Variant], options: RunOptions, path: Path) -> RunSummary:
    """What a run without --force measures: what has no ok/unsupported result yet, retrying
    failures unless one failed ``max_failures`` times in a row."""
    todo = db.missing(system, variants, max_failures=options.max_failures)
    retry = {v.name for v in db.missing(system, variants)}
    gave_up = sorted(retry - {v.name for v in todo})
    return RunSummary(system, system.backend, path, len(variants), len(variants) - len(retry),
                      [v.name for v in todo], gave_up=gave_up)


def _stack_overrides(backend: str, context: dict) -> dict[str, str]:
    """Versions the built binary reports about the library it actually linked."""
    custom = context.get("custom", {})
    keys = {"onednn": "onednn_version", "cudnn": "cudnn_version", "cublas": "cublas_version"}
    return {k: custom[v] for k, v in keys.items() if custom.get(v)}


def _bench_env(backend: str, threads: int, options: RunOptions) -> dict[str, str]:
    env = dict(os.environ)
    if backend == "onednn":
        env["OMP_NUM_THREADS"] = str(threads)
    env.update(dict(options.env))
    return env


# --- build -------------------------------------------------------------------------------

def build(project: Path, jobs: int | None = None, cmake_args: tuple[str, ...] = ()) -> Path:
    """Configures (Release) and builds the generated CMake project; returns the binary."""
    if not (project / "CMakeLists.txt").is_file():
        raise BuildError(f"{project}: no generated CMake project here; run `benanza generate` first")
    build_dir = project / "build"
    build_dir.mkdir(exist_ok=True)
    logfile = build_dir / "benanza-build.log"
    configure = ["cmake", "-S", str(project), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release", *cmake_args]
    if shutil.which("ninja") and not (build_dir / "CMakeCache.txt").exists():
        configure += ["-G", "Ninja"]
    steps = [configure, ["cmake", "--build", str(build_dir), "-j", str(jobs or os.cpu_count() or 1)]]
    with logfile.open("w") as log_out:
        for cmd in steps:
            log.info("%s", " ".join(cmd))
            done = subprocess.run(cmd, stdout=log_out, stderr=subprocess.STDOUT)
            if done.returncode != 0:
                tail = logfile.read_text(errors="replace").strip().splitlines()[-15:]
                raise BuildError(f"{project}: `{' '.join(cmd[:2])}` failed (full log: {logfile}):\n"
                                 + "\n".join(tail))
    binary = build_dir / BINARY
    if not binary.is_file():
        raise BuildError(f"{project}: the build produced no {BINARY} (log: {logfile})")
    return binary


def binary_context(binary: Path, env: dict[str, str]) -> dict:
    out = subprocess.run([str(binary), "--benanza_context"], capture_output=True, text=True, env=env,
                         timeout=60)
    for line in out.stdout.splitlines():
        tag, _, payload = line.partition(" ")
        if tag == "BENANZA_CONTEXT":
            return json.loads(payload)
    raise BenanzaError(f"{binary}: printed no context line (exit {out.returncode}): {out.stderr[-500:]}")


# --- execution ---------------------------------------------------------------------------

class _Store:
    """Buffers results and writes them in small transactions as they arrive."""

    def __init__(self, db: PerfDB, system: System, command: str, max_rsd: float):
        self.db, self.system, self.command, self.max_rsd = db, system, command, max_rsd
        self.pending: list[tuple[Result, dict]] = []
        self.last = time.monotonic()
        self.final: dict[str, Result] = {}  # the latest outcome per variant name

    def add(self, result: Result, raw: dict) -> None:
        rsd = result.rsd
        if rsd is not None and rsd > self.max_rsd:
            result = replace(result, unstable=True)
        self.pending.append((result, raw))
        self.final[result.variant.name] = result
        if len(self.pending) >= _FLUSH_EVERY:
            self.flush()
        else:
            self.tick()

    def tick(self) -> None:
        """Writes what waits longer than a moment, also while a long benchmark runs."""
        if self.pending and time.monotonic() - self.last > _FLUSH_SECONDS:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            self.db.insert_measurements(self.system, self.pending, command=self.command)
            self.pending = []
        self.last = time.monotonic()


def _execute(binary: Path, todo: list[Variant], env: dict[str, str], options: RunOptions, db: PerfDB,
             system: System, summary: RunSummary, progress: Callable[[Progress], None] | None) -> None:
    """Runs ``todo``, then re-measures the unstable results (at most ``options.remeasure`` times
    each); every measurement is stored, the last one of a variant is what analyses use."""
    by_name = {v.name: v for v in todo}
    store = _Store(db, system, options.command, options.max_rsd)
    monitor = ContentionMonitor(int(dict(system.stack).get("threads", "1")))
    monitor.start()
    try:
        batch = [v.name for v in todo]
        for attempt in range(options.remeasure + 1):
            if attempt:
                log.info("re-measuring %d unstable results (attempt %d of %d)", len(batch), attempt,
                         options.remeasure)
                summary.remeasured += len(batch)
            _run_all(binary, batch, env, options, system, store, by_name, progress)
            batch = [n for n in batch if store.final[n].unstable]
            if not batch:
                break
    except KeyboardInterrupt:
        summary.interrupted = True
    finally:
        summary.contended = monitor.stop()
        store.flush()
        for status in Status:
            setattr(summary, status.value, sum(r.status is status for r in store.final.values()))
        summary.unstable = sum(r.unstable for r in store.final.values())


def _run_all(binary: Path, names: list[str], env: dict[str, str], options: RunOptions, system: System,
             store: _Store, by_name: dict[str, Variant], progress: Callable[[Progress], None] | None) -> None:
    finished: set[str] = set()

    def notify(name: str, status: Status | None) -> None:
        if progress:
            progress(Progress(len(finished), len(names), name, status))

    remaining = list(names)
    while remaining:
        _run_batch(binary, remaining, env, options, system, store, by_name, finished, notify)
        remaining = [n for n in remaining if n not in finished]


class ContentionMonitor:
    """Samples how many tasks are runnable while benchmarks run.

    On a small machine one busy neighbour process costs a multi-threaded benchmark whole
    scheduler quanta (milliseconds) at every barrier, which inflates latencies far beyond
    their noise; this makes such runs visible instead of silently stored as the bound.
    """

    def __init__(self, threads: int, interval: float = 0.2,
                 read: Callable[[], int | None] = runnable_tasks):
        self.allowed = threads + 1  # the benchmark's threads and this sampler
        self.interval = interval
        self.read = read
        self.samples = 0
        self.busy = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            n = self.read()
            if n is not None:
                self.samples += 1
                self.busy += n > self.allowed

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> float:
        """Ends sampling; the share of samples with more runnable tasks than allowed."""
        self._stop.set()
        self._thread.join()
        return self.busy / self.samples if self.samples else 0.0


def _run_batch(binary: Path, names: list[str], env: dict[str, str], options: RunOptions, system: System,
               store: _Store, by_name: dict[str, Variant], finished: set[str],
               notify: Callable[[str, Status | None], None]) -> None:
    """Runs ``names`` in one process until it ends, crashes or hangs; records each outcome.

    Always finishes at least one name, so the caller's restart loop terminates.
    """
    with tempfile.TemporaryDirectory(prefix="benanza-run-") as tmp:
        names_file = Path(tmp) / "names.txt"
        names_file.write_text("\n".join(names) + "\n")
        err_path = Path(tmp) / "stderr.txt"
        cmd = [str(binary), f"--benanza_names={names_file}", f"--benchmark_min_time={options.min_time:g}",
               f"--benchmark_repetitions={options.repetitions}"]
        with err_path.open("w") as err:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env,
                                    start_new_session=True)  # Ctrl-C reaches us, not the child
            lines: queue.Queue[str | None] = queue.Queue()
            threading.Thread(target=_pump, args=(proc, lines), daemon=True).start()
            current: str | None = None
            since = 0.0
            kernels: dict[str, object] = {}  # CUPTI mode: kernel records, ahead of the result
            try:
                while True:
                    try:
                        line = lines.get(timeout=0.5)
                    except queue.Empty:
                        store.tick()
                        if current is not None and time.monotonic() - since > options.timeout:
                            _kill(proc)
                            _record_failure(store, by_name, system, current, finished, notify,
                                            f"timed out after {options.timeout:g}s")
                            return
                        continue
                    if line is None:
                        break
                    tag, _, payload = line.rstrip("\n").partition(" ")
                    if tag == "BENANZA_START":
                        current, since = payload, time.monotonic()
                        notify(current, None)
                    elif tag == "BENANZA_METRICS":
                        data = json.loads(payload)
                        kernels[data.get("name", "")] = data.get("profile")
                    elif tag == "BENANZA_RESULT":
                        data = json.loads(payload)
                        name = data.get("name", "")
                        if name in kernels:
                            data["cupti"] = kernels.pop(name)
                        if name in by_name and name not in finished:
                            result = parse_result(by_name[name], system.name, data)
                            store.add(result, data)
                            finished.add(name)
                            notify(name, result.status)
                        current = None
            finally:
                if proc.poll() is None:
                    _kill(proc)
            rc = proc.wait()
        stderr_tail = err_path.read_text(errors="replace").strip()[-400:]
    if current is not None and current not in finished:
        _record_failure(store, by_name, system, current, finished, notify,
                        f"{_exit_reason(rc)} while running" + (f": {stderr_tail}" if stderr_tail else ""))
        return
    unreported = [n for n in names if n not in finished]
    if unreported:
        # The process ended between benchmarks (or never started one): none of them is to
        # blame, but they cannot be retried forever either.
        reason = f"benchmark binary {_exit_reason(rc)} before running it" + (
            f": {stderr_tail}" if stderr_tail else "")
        for name in unreported:
            _record_failure(store, by_name, system, name, finished, notify, reason)


def _pump(proc: subprocess.Popen, lines: "queue.Queue[str | None]") -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.put(line)
    lines.put(None)


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _exit_reason(rc: int) -> str:
    if rc < 0:
        try:
            return f"crashed ({signal.Signals(-rc).name})"
        except ValueError:
            return f"crashed (signal {-rc})"
    return f"exited with status {rc}"


def _record_failure(store: _Store, by_name: dict[str, Variant], system: System, name: str,
                    finished: set[str], notify: Callable[[str, Status | None], None], message: str) -> None:
    store.add(Result(by_name[name], system.name, Status.FAILED, message=message, timestamp=_now()),
              {"name": name, "status": "failed", "message": message})
    finished.add(name)
    notify(name, Status.FAILED)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def parse_result(variant: Variant, system: str, data: dict) -> Result:
    """A Result from one BENANZA_RESULT line of the runtime."""
    status = Status(data["status"])
    counters = data.get("counters", {})
    metrics = {k: v for k, v in counters.items() if k != "workspace_bytes"}
    if "times_ms" in data:
        metrics["times_ms"] = data["times_ms"]
    if "cupti" in data:
        metrics["cupti"] = data["cupti"]
    return Result(variant=variant, system=system, status=status, message=data.get("message", ""),
                  median_ms=data.get("median_ms"), mean_ms=data.get("mean_ms"),
                  stddev_ms=data.get("stddev_ms"), min_ms=data.get("min_ms"),
                  iterations=int(data.get("iterations", 0)), repetitions=int(data.get("repetitions", 0)),
                  workspace_bytes=int(counters.get("workspace_bytes", 0)),
                  implementation=data.get("implementation", ""), metrics=metrics, timestamp=_now())
