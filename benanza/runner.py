"""``benanza run``: build the generated benchmarks, run what the database lacks, store results.

The binary speaks the line protocol of ``runtime_cpp/common`` (BENANZA_START / BENANZA_RESULT).
Results are stored as they arrive (small transactions), so Ctrl-C, SIGTERM or a crash keeps
everything measured so far and a re-run continues where it stopped. A benchmark that kills
its process (segfault, abort), exceeds ``timeout`` or prints a malformed result is stored as
failed with the reason and a line that reproduces it, and the binary is restarted after it.
The binary never outlives Benanza (``children``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import select
import shlex
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

from . import children, machine_speed
from .backends.base import Command, Device
from .errors import BenanzaError, UsageError
from .generator import BACKEND_MODULES, get_backend, read_variants
from .machine_speed import MachineSpeed
from .manifest import read_manifest
from .measurement import (
    LOW_PERCENTILE,
    MAX_CONTENTION,
    MAX_SAMPLING_SECONDS,
    MIN_SAMPLES,
    MIN_SAMPLING_SECONDS,
    RACE_MAX_TIME,
    RACE_PRECISION,
    UNSTABLE_RSD,
    Contention,
    CpuClock,
    FreeCores,
    SampleSummary,
    clock_of,
    contention,
    cpu_clock,
    free_cores,
    summarize,
)
from .peaks import GEMM_TYPES, Peaks
from .perfdb import DatabaseError, PerfDB, resolve_db_path
from .records import Result, Status, System, Variant
from .system import cache_levels, cpu_model, detect_system, probe_gpu

log = logging.getLogger(__name__)

BACKENDS = tuple(BACKEND_MODULES)
_FLUSH_EVERY = 16  # results per transaction while running
_FLUSH_SECONDS = 2.0


class NoDeviceError(BenanzaError):
    """The backend cannot run on this machine (the cuDNN backend without a CUDA device)."""


@dataclass(frozen=True)
class RunOptions:
    filter: str | None = None  # regex over benchmark names (re.search)
    dry_run: bool = False
    force: bool = False  # re-run variants already measured on this system+stack
    # run only the variants whose latest result on this system+stack is flagged contended
    # (nothing missing, no peaks): the command `analyze` prints when it refuses a bound
    remeasure_contended: bool = False
    min_time: float = 0.2  # seconds per repetition (Google Benchmark --benchmark_min_time)
    repetitions: int = 3
    threads: int | None = None  # CPU threads (oneDNN: OMP_NUM_THREADS); default the cores free at the start
    timeout: float = 300.0  # seconds one benchmark may run before it is killed
    build_jobs: int | None = None
    cmake_args: tuple[str, ...] = ()
    command: str = ""  # the command line, stored beside each result
    env: tuple[tuple[str, str], ...] = ()  # extra environment for the benchmark binary
    l2: str = "flush"  # cuDNN: flush the L2 cache before each timed call, or time it "hot"
    # in-process frameworks: what a timed call finds in the CPU's caches (inprocess.CACHE_STATES);
    # each state but "warm" is a stack of its own (``cache=cold``, ``cache=cold-weights``), so
    # readings of different states are never mixed
    cache: str = "warm"
    max_rsd: float = UNSTABLE_RSD  # relative stddev above which a result is unstable
    remeasure: int = 2  # extra measurements of a result while it is unstable or contended
    # share of a benchmark's runnable time lost to other work above which its result is contended
    max_contention: float = MAX_CONTENTION
    max_failures: int = 3  # a variant that failed this often in a row is skipped (--force retries)
    peaks: bool = True  # measure the stack's peaks (benanza.peaks) when the database has none
    seed: int = 0  # of the order benchmarks are measured in (``measurement_order``)
    # groups of names measured before all others, the first group first (``measurement_order``)
    first: tuple[tuple[str, ...], ...] = ()
    # Adaptive sampling (docs/measurement.md): the relative precision of the low percentile each
    # benchmark samples to, and the most seconds it may sample; None: the fixed budget above
    # (a library caller's default, reproducible for studies; `benanza run` asks DEFAULT_PRECISION).
    precision: float | None = None
    max_time: float = MAX_SAMPLING_SECONDS
    race: bool = True  # with precision: screen every variant first, measure fully only what may win (``_race``)

    def budget_flags(self) -> list[str]:
        """The binary's flags for this budget. Google Benchmark's are always given: a binary
        that times its batches itself (cuDNN) keeps them when sampling adaptively."""
        flags = [f"--benchmark_min_time={self.min_time:g}", f"--benchmark_repetitions={self.repetitions}"]
        if self.precision is not None:
            flags += [f"--benanza_precision={self.precision:g}", f"--benanza_percentile={LOW_PERCENTILE}",
                      f"--benanza_min_samples={MIN_SAMPLES}", f"--benanza_min_time={MIN_SAMPLING_SECONDS:g}",
                      f"--benanza_max_time={self.max_time:g}"]
        return flags


@dataclass(frozen=True)
class Failure:
    """A benchmark stored as failed in this run, with the line that reproduces it."""

    name: str
    message: str
    reproduce: str


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
    remeasured: int = 0  # extra measurements of unstable or contended results
    gave_up: list[str] = field(default_factory=list)  # failed max_failures times in a row: skipped
    eliminated: int = 0  # racing stopped them early: they cannot be their layer's best
    interrupted: bool = False
    seconds: float = 0.0
    # Share of this run's CPU measurements that lost more than max_contention of their time to
    # other work, and the results still contended after the re-measurements (flagged in the DB).
    contended: float = 0.0
    still_contended: list[str] = field(default_factory=list)
    threads: int = 0  # the benchmarks' CPU threads
    free: FreeCores | None = None  # the cores found free at the start, when threads were not given
    threads_kept: bool = False  # threads not given: those of the stack already measured under the name
    context: dict = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)
    peaks: Peaks | None = None  # measured by this run (the stack had none)
    peaks_error: str = ""  # why they could not be measured
    # Expected seconds per variant to run (``expected_seconds``), how many of them rest on an
    # earlier result of this system, and the most the run can take where that is bounded.
    expected: dict[str, float] = field(default_factory=dict)
    from_earlier: int = 0
    at_most_s: float = 0.0  # adaptive sampling: every variant that may run sampling to --max-time
    precision: float | None = None  # what the run sampled to (None: the fixed budget)

    @property
    def stored(self) -> int:
        return self.ok + self.unsupported + self.failed


@dataclass(frozen=True)
class Progress:
    done: int
    total: int
    name: str
    status: Status | None  # None: started
    left_s: float | None = None  # the pass's expected time left (``_run_all``)


# Google Benchmark sizes a repetition by running the loop with 1, 10, 100 ... iterations until a
# run lasts a tenth of --min-time, then aims at 1.4 × min-time; the other repetitions reuse that
# count. So a repetition lasts about 1.4 min-times and the sizing runs of the first add under
# about one more (half on average).
_REPETITION_MIN_TIMES = 1.4
_SIZING_MIN_TIMES = 0.5


def expected_seconds(options: RunOptions, earlier: Result | None) -> float:
    """The timed loops' expected wall time for one variant under the run's budget (setup and the
    binary's start-up not counted), from the latency an ``earlier`` result of the same system
    found (None: none): an unsupported variant costs nothing."""
    if earlier is not None and earlier.status is Status.UNSUPPORTED:
        return 0.0
    call_s = (earlier.latency_ms or 0.0) / 1e3 if earlier is not None else 0.0
    if options.precision is not None:
        # The fewest calls sampling takes: a variant whose spread keeps its percentile uncertain
        # samples up to --max-time (``RunSummary.at_most_s``).
        return min(options.max_time, max(MIN_SAMPLING_SECONDS, MIN_SAMPLES * call_s))
    return options.repetitions * max(_REPETITION_MIN_TIMES * options.min_time, call_s) + max(
        _SIZING_MIN_TIMES * options.min_time, call_s)


def resolve_backend(backend: str) -> str:
    if backend == "auto":
        return "cudnn" if probe_gpu().present else "onednn"
    if backend not in BACKENDS:
        raise UsageError(f"unknown backend {backend!r}; choose auto, {', '.join(BACKENDS)}")
    return backend


def check_device(backend: str) -> None:
    """Stops before anything is built when the backend cannot run here (a GPU it needs)."""
    why = get_backend(backend).unavailable()
    if why is not None:
        raise NoDeviceError(why)


def run(bench_dir: str | Path, system_name: str, backend: str = "auto", db_path: str | Path | None = None,
        options: RunOptions = RunOptions(), progress: Callable[[Progress], None] | None = None) -> RunSummary:
    """Builds and runs the missing benchmarks of ``bench_dir`` into the database."""
    if options.force and options.remeasure_contended:
        raise UsageError("--force re-runs every benchmark, --remeasure-contended only the contended ones: give one")
    backend = resolve_backend(backend)
    check_device(backend)
    impl = get_backend(backend)
    if options.cache != "warm":
        flag = f"--{options.cache if options.cache == 'cold-weights' else 'cold-cache'}"
        if not impl.reads_cold:
            raise UsageError(f"{flag}: the {backend} backend has no cold-cache reading (the torch and onnxruntime "
                             f"backends have{'; cudnn flushes its L2 with --l2 flush' if backend == 'cudnn' else ''})")
        if not cache_levels(1):
            raise UsageError(f"{flag}: /sys/devices/system/cpu/cpu*/cache names no cache of this CPU: no size to evict")
    if options.precision is not None and not impl.samples_adaptively:
        options = replace(options, precision=None)  # what its benchmarks do with any flags
    bench_dir = Path(bench_dir)
    project = bench_dir / backend
    manifest = read_manifest(bench_dir)
    variants = _select(read_variants(project), options.filter)
    path = Path(db_path) if db_path else resolve_db_path(None)
    # CPU threads (GPU runs use none): what the user gave; else those of the stack this name
    # already measured on this CPU, so an interrupted or incremental run continues it; else the
    # cores other work leaves free now.
    free = free_cores() if impl.device is Device.CPU and not options.threads else None
    kept = _stack_threads(path, system_name, backend) if free is not None else None
    threads = options.threads or kept or (free.free if free is not None else 1)
    started = time.monotonic()

    if options.dry_run:
        # Nothing is built, so the stack is what the machine reports, not the binary's context.
        system = detect_system(system_name, backend, threads=threads,
                               overrides=_stack_overrides(impl.stack_overrides(None), options))
        if not path.exists():
            summary = RunSummary(system, backend, path, len(variants), 0,
                                 measurement_order([v.name for v in variants], options.seed, options.first))
            _estimate(None, summary, options)
        else:
            with PerfDB(path, readonly=True) as db:
                summary = _plan(db, system, variants, options, path)
        summary.threads, summary.free, summary.threads_kept = threads, free, kept is not None
        summary.precision = options.precision
        return summary

    binary = impl.prepare(project, options)
    env = {**os.environ, **impl.bench_env(threads, options), **dict(options.env)}
    context = binary_context(binary, env)
    system = detect_system(system_name, backend, threads=threads,
                           overrides=_stack_overrides(impl.stack_overrides(context), options))
    with PerfDB(path) as db:
        db.record_models(manifest)
        db.upsert_system(system)
        summary = _plan(db, system, variants, options, path)
        summary.context = context
        summary.threads, summary.free, summary.threads_kept = threads, free, kept is not None
        summary.precision = options.precision
        by_name = {v.name: v for v in variants}
        todo = [by_name[n] for n in summary.to_run]
        # Before the pass: they take seconds, and a campaign cut short (a GPU lease's time limit,
        # a stopped run) is still held to its roofline.
        if (options.peaks and not options.remeasure_contended and backend in GEMM_TYPES
                and db.peaks(system) is None):
            _measure_peaks(db, system, threads, options, summary)
        if todo:
            _execute(binary, todo, env, options, db, system, summary, progress)
    summary.seconds = time.monotonic() - started
    return summary


def _stack_overrides(backend: dict[str, str], options: RunOptions) -> dict[str, str]:
    """The backend's stack entries, and the cache state of a cold run (``cache=cold``,
    ``cache=cold-weights``): its results are another stack's, never compared or merged with warm
    ones (a warm stack names no cache, as every stack did before cold readings existed, so its
    identity is unchanged)."""
    return backend if options.cache == "warm" else {**backend, "cache": options.cache}


def _measure_peaks(db: PerfDB, system: System, threads: int, options: RunOptions, summary: RunSummary) -> None:
    """Once per stack: its peaks, for the roofline (a failure is reported, never fatal)."""
    from .peaks import measure

    try:
        _, summary.peaks = measure(system.backend, threads, options.cmake_args, options.command)
    except BenanzaError as exc:
        summary.peaks_error = str(exc)
        log.warning("peaks not measured: %s", exc)
        return
    db.store_peaks(system, summary.peaks)


def _stack_threads(path: Path, system_name: str, backend: str) -> int | None:
    """The threads of the newest stack of the CPU ``backend`` stored under ``system_name`` for
    this CPU, if it fits the cores this process may use."""
    if not path.is_file():
        return None
    with PerfDB(path, readonly=True) as db:
        system = db.system(system_name, backend)
    if system is None or system.threads is None or system.device != cpu_model():  # a CPU stack's device: its CPU
        return None
    return system.threads if system.threads <= len(os.sched_getaffinity(0)) else None


def _select(variants: list[Variant], pattern: str | None) -> list[Variant]:
    if not pattern:
        return variants
    try:
        rx = re.compile(pattern)
    except re.error as exc:
        raise UsageError(f"--filter {pattern!r} is not a regular expression ({exc})") from None
    return [v for v in variants if rx.search(v.name)]


def _plan(db: PerfDB, system: System, variants: list[Variant], options: RunOptions, path: Path) -> RunSummary:
    """What the run measures (with --force: everything; with ``remeasure_contended``: exactly what
    the database flags contended on this stack; else what has no ok/unsupported result yet,
    retrying failures unless one failed ``max_failures`` times in a row) and how long that is
    expected to take."""
    if options.force:
        summary = RunSummary(system, system.backend, path, len(variants), 0, [v.name for v in variants])
    elif options.remeasure_contended:
        contended = db.contended(system)
        names = [v.name for v in variants if v.name in contended]
        summary = RunSummary(system, system.backend, path, len(variants), len(variants) - len(names), names)
    else:
        todo = db.missing(system, variants, max_failures=options.max_failures)
        retry = {v.name for v in db.missing(system, variants)}
        summary = RunSummary(system, system.backend, path, len(variants), len(variants) - len(retry),
                             [v.name for v in todo], gave_up=sorted(retry - {v.name for v in todo}))
    summary.to_run = measurement_order(summary.to_run, options.seed, options.first)
    _estimate(db, summary, options)
    return summary


def measurement_order(names: list[str], seed: int, first: tuple[tuple[str, ...], ...] = ()) -> list[str]:
    """``names`` in the order a run measures them: shuffled by ``seed``, so that a drift of the
    machine's state during the run (its clock frequency, a neighbour job) spreads over all layers
    and models instead of landing on the ones generated last. Each name's place comes from a hash
    of it and the seed alone, so a resumed run (a subset) keeps the order of the first. Names in
    a group of ``first`` come before the others (a run that may be stopped measures what matters
    most first), an earlier group before a later one; each group is shuffled the same way."""
    group: dict[str, int] = {}
    for i, members in reversed(list(enumerate(first))):  # a name in two groups goes with the earlier
        group.update(dict.fromkeys(members, i))
    return sorted(names, key=lambda n: (group.get(n, len(first)), hashlib.sha256(f"{seed}\n{n}".encode()).digest()))


def _estimate(db: PerfDB | None, summary: RunSummary, options: RunOptions) -> None:
    """Each variant's expected time, from the latest results of the system's newest stack under
    its name (another thread count or library version still tells a kernel's scale)."""
    stored = db.system(summary.system.name, summary.system.backend) if db is not None else None
    earlier = {r.variant.name: r for r in db.results(stored)} if db is not None and stored is not None else {}
    known = [n for n in summary.to_run if n in earlier and earlier[n].status is not Status.FAILED]
    summary.from_earlier = len(known)
    summary.expected = {n: expected_seconds(options, earlier[n] if n in known else None) for n in summary.to_run}
    refused = sum(earlier[n].status is Status.UNSUPPORTED for n in known)
    # racing's screening pass comes before a variant's full sampling
    screen = RACE_SCREEN if options.race else 0.0
    summary.at_most_s = (sum(summary.expected.values()) if options.precision is None
                         else (len(summary.to_run) - refused) * options.max_time * (1 + screen))


_CONTEXT_SECONDS = 60.0


def binary_context(binary: Command, env: dict[str, str]) -> dict:
    """The binary's context line. Its output goes to files, not pipes: a child that never
    exits or hands its stdout to a grandchild cannot hang this call past its limit."""
    with tempfile.TemporaryFile() as out_f, tempfile.TemporaryFile() as err_f:
        proc = children.popen([*binary.argv, "--benanza_context"], stdout=out_f, stderr=err_f, env=env,
                              start_new_session=True)
        try:
            rc = proc.wait(timeout=_CONTEXT_SECONDS)
        except subprocess.TimeoutExpired:
            children.kill_group(proc)
            raise BenanzaError(f"{binary}: --benanza_context did not finish in {_CONTEXT_SECONDS:g}s") from None
        finally:
            children.kill_group(proc)
        out_f.seek(0)
        err_f.seek(0)
        stdout = out_f.read().decode("utf-8", errors="replace")
        stderr = err_f.read().decode("utf-8", errors="replace")
    for line in stdout.splitlines():
        tag, _, payload = line.partition(" ")
        if tag == "BENANZA_CONTEXT":
            try:
                context = json.loads(payload)
            except ValueError as exc:
                raise BenanzaError(f"{binary}: malformed context line ({exc}): {line[:300]}") from None
            if isinstance(context, dict):
                return context
            raise BenanzaError(f"{binary}: malformed context line (not a JSON object): {line[:300]}")
    raise BenanzaError(f"{binary}: printed no context line (exit {rc}): {stderr[-500:]}")


# --- execution ---------------------------------------------------------------------------

class _Store:
    """Buffers results and writes them in small transactions as they arrive."""

    def __init__(self, db: PerfDB, system: System, command: str, max_rsd: float, max_contention: float | None,
                 precision: float | None = None, read_speed: bool = False):
        self.db, self.system, self.command, self.max_rsd = db, system, command, max_rsd
        # a CPU's results carry the machine's speed read before their child started (where the
        # child reads none of its own); a GPU's device clocks are not what the host slows
        self.read_speed = read_speed
        self.speed: MachineSpeed | None = None
        self._reader: machine_speed.Reader | None = None  # its buffers allocated once per run
        self.precision = precision  # adaptive sampling's target: what its results are held to
        self.max_contention = max_contention  # None: contention does not flag (GPU timing)
        self.measured = self.contended = 0  # this run's OK measurements, and those contended
        self.pending: list[tuple[Result, dict]] = []
        self.last = time.monotonic()
        self.final: dict[str, Result] = {}  # the latest outcome per variant name
        self.stored = 0  # measurements written

    def read_speed_now(self) -> None:
        """Reads the machine's speed for the results of the child about to start."""
        self._reader = self._reader or machine_speed.Reader(self.system.threads or 1)
        self.speed = self._reader()

    def add(self, result: Result, raw: dict, lost: Contention | None = None) -> None:
        """Buffers one result, flagged unstable or contended (``lost``: what other work cost it
        while it ran; None when not measured)."""
        # A sampled result is as stable as its percentile's interval is narrow (the spread of
        # single calls says nothing about that); a result of repetitions, as they agree.
        if result.eliminated:
            unstable = False  # known well enough to lose
        elif result.precision is not None and self.precision is not None:
            unstable = result.precision > self.precision
        else:
            unstable = result.rsd is not None and result.rsd > self.max_rsd
        result = replace(result, unstable=unstable)
        if result.ok and self.speed is not None:
            result = replace(result, metrics={**self.speed.metrics(), **result.metrics})  # the child's own first
        if result.ok and lost is not None:
            clean = lost.clean_share(result.low_ms) if result.low_ms is not None else None
            result = replace(result, contention=lost.share, clean_share=clean)
            self.measured += 1
            samples = (SampleSummary(result.low_ms, result.sample_median_ms or result.low_ms,
                                     result.sample_iqr_ms or 0.0, result.samples)
                       if result.low_ms is not None else None)
            if self.max_contention is not None and lost.spoils(samples, self.max_contention):
                result = replace(result, contended=True)
                self.contended += 1
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
            pending, self.pending = self.pending, []
            try:
                self.db.insert_measurements(self.system, pending, command=self.command)
            except DatabaseError as exc:
                raise DatabaseError(exc.path, f"{exc.problem}; {self.stored} results of this run were stored before "
                                              f"it, the {len(pending)} measured since were not: run the same "
                                              f"command again to measure them") from None
            self.stored += len(pending)
        self.last = time.monotonic()


def _execute(binary: Path | Command, todo: list[Variant], env: dict[str, str], options: RunOptions, db: PerfDB,
             system: System, summary: RunSummary, progress: Callable[[Progress], None] | None) -> None:
    """Runs ``todo`` with ``binary`` (a built binary's path, or the backend's command), then
    re-measures the unstable and the contended results (at most ``options.remeasure`` times
    each, after every other benchmark of the round: later, not while the same neighbour still
    runs); every measurement is stored, the last one of a variant is what analyses use."""
    command = binary if isinstance(binary, Command) else Command((str(binary.resolve()),))
    by_name = {v.name: v for v in todo}
    # GPU times come from device events, which a busy host does not stretch (the harness
    # counts the repetitions the host could have delayed): contention flags CPU results only.
    backend = get_backend(system.backend)
    cpu = backend.device is Device.CPU
    store = _Store(db, system, options.command, options.max_rsd, options.max_contention if cpu else None,
                   options.precision, read_speed=cpu and not backend.reads_speed)
    try:
        with children.sigterm_interrupts():
            names = batch = [v.name for v in todo]
            first_attempt = 0
            if options.precision is not None and options.race:
                screen = replace(options, max_time=options.max_time * RACE_SCREEN)
                _run_all(command, batch, env, screen, system, store, by_name, progress, summary.expected)
                batch = _race(store, names, options)
                # Each layer's leader sampled in full first: its narrower interval stops more of
                # the others before they are sampled in full too.
                leaders = _leaders(store, batch)
                if len(leaders) < len(batch):
                    _run_all(command, leaders, env, options, system, store, by_name, progress, summary.expected)
                    others = [n for n in _race(store, names, options) if n not in leaders]
                    _run_all(command, others, env, options, system, store, by_name, progress, summary.expected)
                    batch = [n for n in leaders + others if store.final[n].unstable or store.final[n].contended]
                    first_attempt = 1  # every survivor has had its full sampling
            for attempt in range(first_attempt, options.remeasure + 1):
                if not batch:
                    break
                if attempt:
                    log.info("re-measuring %d unstable or contended results (attempt %d of %d)", len(batch),
                             attempt, options.remeasure)
                    summary.remeasured += len(batch)
                _run_all(command, batch, env, options, system, store, by_name, progress, summary.expected)
                batch = [n for n in batch if store.final[n].unstable or store.final[n].contended]
                if not batch:
                    break
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the child is gone, what was measured is kept
        summary.interrupted = True
    finally:
        summary.contended = store.contended / store.measured if store.measured else 0.0
        store.flush()
        for status in Status:
            setattr(summary, status.value, sum(r.status is status for r in store.final.values()))
        summary.unstable = sum(r.unstable for r in store.final.values())
        summary.eliminated = sum(r.eliminated for r in store.final.values())
        summary.still_contended = sorted(n for n, r in store.final.items() if r.contended)
        summary.failures = [Failure(n, r.message, r.metrics["reproduce"]) for n, r in store.final.items()
                            if r.status is Status.FAILED and "reproduce" in r.metrics]


# Racing's screening pass samples each variant for this share of --max-time: enough for most to
# reach the precision (they are done) or to show they cannot be their layer's best.
RACE_SCREEN = 0.25


def race_bounds(result: Result) -> tuple[float, float] | None:
    """The lowest and the highest latency a sampled result's 95% interval allows, or None (not
    sampled, no bounded interval). Only the half-width is stored and the interval need not be
    centred on the estimate, so its full width is taken on either side: wider, never narrower."""
    if not result.ok or result.low_ms is None or result.precision is None:
        return None
    return result.low_ms * (1 - 2 * result.precision), result.low_ms * (1 + 2 * result.precision)


def eliminated(results: list[Result]) -> set[str]:
    """Variants of ``results`` that cannot be their layer's best: each layer's variants of one
    dtype and fusion compete (what a bound picks from), and one whose lowest possible latency is
    above the lowest highest-possible latency among them is out. The best is never out (its low
    end is below its high end); a contended result neither eliminates nor is eliminated."""
    groups: dict[tuple[str, str, str], list[tuple[Result, tuple[float, float]]]] = {}
    for r in results:
        bounds = race_bounds(r)
        if bounds is not None and not r.contended:
            groups.setdefault((r.variant.layer_key, r.variant.dtype, r.variant.fusion), []).append((r, bounds))
    out: set[str] = set()
    for members in groups.values():
        best_high = min(high for _, (_, high) in members)
        out |= {r.variant.name for r, (low, _) in members if low > best_high}
    return out


def _race(store: _Store, names: list[str], options: RunOptions) -> list[str]:
    """After a pass of racing: stores the verdict of the variants of ``names`` that cannot win
    now (their latest result, flagged eliminated: the latest row is what analyses read) and
    returns those still to measure in full (not at the precision yet, or contended)."""
    screened = [store.final[n] for n in names]
    # every variant may be the best; only one not at the precision yet (nor stopped) is stopped
    out = eliminated(screened) & {r.variant.name for r in screened if r.unstable and not r.eliminated}
    # what measures it in full later, on demand (Q3, when a framework ran it: perfdb.full_sampling_flags)
    budget = {RACE_PRECISION: options.precision, RACE_MAX_TIME: options.max_time}
    for n in names:
        if n in out:
            r = store.final[n]
            store.add(replace(r, eliminated=True, metrics={**r.metrics, **budget}), {"name": n, "eliminated": True})
    return [n for n in names if n not in out and (store.final[n].unstable or store.final[n].contended)]


def _leaders(store: _Store, names: list[str]) -> list[str]:
    """Of ``names``, each competing group's (a layer's variants of one dtype and fusion) lowest
    estimate, in the order of ``names``."""
    best: dict[tuple[str, str, str], Result] = {}
    for n in names:
        r = store.final[n]
        key = (r.variant.layer_key, r.variant.dtype, r.variant.fusion)
        if r.low_ms is not None and (key not in best or r.low_ms < (best[key].low_ms or 0.0)):
            best[key] = r
    chosen = {r.variant.name for r in best.values()}
    return [n for n in names if n in chosen]


def _run_all(binary: Command, names: list[str], env: dict[str, str], options: RunOptions, system: System,
             store: _Store, by_name: dict[str, Variant], progress: Callable[[Progress], None] | None,
             expected: dict[str, float]) -> None:
    finished: set[str] = set()
    first: list[float] = []  # when the pass's first benchmark started

    def notify(name: str, status: Status | None) -> None:
        if progress:
            progress(Progress(len(finished), len(names), name, status, _left(names, finished, expected, first)))

    remaining = list(names)
    pace = _Pace(expected) if store.read_speed else None
    while remaining:
        take = remaining if pace is None else pace.next(remaining)
        began = time.monotonic()
        if not _run_batch(binary, take, env, options, system, store, by_name, finished, notify):
            pace = None  # a binary that starts no benchmark hangs or fails once, not once per child
        if pace is not None:
            pace.ran([n for n in take if n in finished], time.monotonic() - began)
        remaining = [n for n in remaining if n not in finished]


class _Pace:
    """Where the runner reads the machine's speed before each child (a C++ backend on a CPU), the
    names each child runs: about ``READ_EVERY_S`` of them by their expected times, scaled by
    how long the pass's finished ones took against theirs (setup and start-up are in that ratio),
    at least one. Each result's reading is then as fresh as an in-process backend's; one child
    for a whole pass had carried one reading through minutes of it. A child's start (the
    reading, the process, the library's first primitive) cost 0.04 s here (docs/measurement.md)."""

    def __init__(self, expected: dict[str, float]) -> None:
        self._expected = expected
        self._spent = self._planned = 0.0

    def next(self, remaining: list[str]) -> list[str]:
        scale = self._spent / self._planned if self._planned > 0 else 1.0
        take, total = [], 0.0
        for name in remaining:
            take.append(name)
            total += self._expected.get(name, 0.0) * scale
            if total >= machine_speed.READ_EVERY_S:
                break
        return take

    def ran(self, done: list[str], seconds: float) -> None:
        self._spent += seconds
        self._planned += sum(self._expected.get(n, 0.0) for n in done)


def _left(names: list[str], finished: set[str], expected: dict[str, float], first: list[float]) -> float | None:
    """The pass's expected time left: the expected times of the benchmarks not finished, scaled
    by how long the finished ones took against their expectation (setup, start-up and the machine
    are in that ratio); None without an estimate."""
    now = time.monotonic()
    if not first:
        first.append(now)
    if not expected:
        return None
    left = sum(expected.get(n, 0.0) for n in names if n not in finished)
    done = sum(expected.get(n, 0.0) for n in finished)
    return left * (now - first[0]) / done if done > 0 else left


# While the binary is silent this long after exiting, a grandchild holds its stdout open;
# once every benchmark has reported, this long is all a binary gets to exit by itself.
_DRAIN_SECONDS = 2.0
# A line longer than this without a newline is not the protocol: it is cut and passed on.
_MAX_LINE = 1 << 20


class _Lines:
    """Lines of the child's stdout, read without a thread: a read never blocks past its
    timeout, whoever holds the pipe open, and bytes that are not UTF-8 are replaced."""

    IDLE = object()

    def __init__(self, fd: int):
        self.fd = fd
        self.buf = b""
        self.eof = False

    def read(self, timeout: float) -> str | None | object:
        """The next line; ``IDLE`` when none arrived within ``timeout``; None at the end."""
        deadline = time.monotonic() + timeout
        while True:
            cut = self.buf.find(b"\n")
            if cut < 0 and (len(self.buf) >= _MAX_LINE or (self.eof and self.buf)):
                cut = min(len(self.buf), _MAX_LINE) - 1
            if cut >= 0:
                line, self.buf = self.buf[:cut + 1], self.buf[cut + 1:]
                return line.decode("utf-8", errors="replace")
            if self.eof:
                return None
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                return self.IDLE
            chunk = os.read(self.fd, 65536)
            if chunk:
                self.buf += chunk
            else:
                self.eof = True


@dataclass
class _Batch:
    """What one run of the binary needs beside the names: where results go and how it ran
    (``finished`` and ``started`` fill as it runs)."""

    binary: Command
    env: dict[str, str]
    options: RunOptions
    system: System
    store: _Store
    by_name: dict[str, Variant]
    finished: set[str]
    notify: Callable[[str, Status | None], None]
    started: bool = False  # whether the process started a benchmark

    def reproduce(self, name: str) -> str:
        """A shell line that runs this one benchmark the way the runner did (benchdnn-style)."""
        changed = sorted((k, v) for k, v in self.env.items() if os.environ.get(k) != v)
        return shlex.join([*(f"{k}={v}" for k, v in changed), *self.binary.argv,
                           # Google Benchmark appends /real_time or /manual_time to the name
                           f"--benchmark_filter=^{_regex_literal(name)}(/|$)", *self.options.budget_flags()])

    def store_result(self, result: Result, raw: dict, lost: Contention | None = None) -> None:
        if result.status is Status.FAILED:
            line = self.reproduce(result.variant.name)
            result = replace(result, metrics={**result.metrics, "reproduce": line})
        self.store.add(result, raw, lost)
        self.finished.add(result.variant.name)
        self.notify(result.variant.name, result.status)

    def fail(self, name: str, message: str, line: str | None = None) -> None:
        raw = {"name": name, "status": "failed", "message": message}
        if line is not None:
            raw["line"] = line
        self.store_result(Result(self.by_name[name], self.system.name, Status.FAILED, message=message,
                                 timestamp=_now()), raw)


def _regex_literal(text: str) -> str:
    """``text`` as a regex matching itself in both ECMAScript and POSIX ERE (Google Benchmark
    uses either): only the metacharacters the two share are escaped."""
    return "".join("\\" + c if c in ".[]{}()*+?^$|\\" else c for c in text)


def _run_batch(binary: Command, names: list[str], env: dict[str, str], options: RunOptions, system: System,
               store: _Store, by_name: dict[str, Variant], finished: set[str],
               notify: Callable[[str, Status | None], None]) -> bool:
    """Runs ``names`` in one process until it ends, crashes, hangs or stalls; records each
    outcome; whether the process started any benchmark.

    Always finishes at least one name, so the caller's restart loop terminates. ``--timeout``
    bounds every silence of the binary, not only a running benchmark: at start-up, between
    benchmarks and after the last one. Nothing is written to disk for the child (its names
    and stderr are unlinked files), so a killed Benanza leaves no temp folder behind.
    """
    batch = _Batch(binary, env, options, system, store, by_name, finished, notify)
    if store.read_speed:  # while no child runs: the reading is the machine's, not a neighbour's
        store.read_speed_now()
    with tempfile.TemporaryFile("w+") as names_file, tempfile.TemporaryFile("w+b") as err:
        names_file.write("\n".join(names) + "\n")
        names_file.flush()
        fd = names_file.fileno()
        cmd = [*binary.argv, f"--benanza_names=/dev/fd/{fd}", *options.budget_flags()]
        proc = children.popen(cmd, stdout=subprocess.PIPE, stderr=err, env=env, pass_fds=(fd,),
                              start_new_session=True)  # Ctrl-C reaches us, not the child
        assert proc.stdout is not None
        try:
            outcome = _read_results(proc, _Lines(proc.stdout.fileno()), names, batch)
        finally:
            children.kill_group(proc)  # also what the binary left running in its group
            proc.stdout.close()
        rc = proc.wait()
        err.seek(0)
        stderr_tail = err.read().decode("utf-8", errors="replace").strip()[-400:]
    if isinstance(outcome, _TimedOut):
        if outcome.current is not None:
            batch.fail(outcome.current, f"timed out after {options.timeout:g}s")
        elif batch.started:
            # Silent between two benchmarks: the next one's setup is the suspect; the rest
            # get a fresh process.
            nxt = next(n for n in names if n not in finished)
            batch.fail(nxt, f"benchmark binary stalled {options.timeout:g}s before starting it (killed)")
        else:
            reason = f"benchmark binary printed nothing for {options.timeout:g}s at start-up (killed)"
            for name in [n for n in names if n not in finished]:
                batch.fail(name, reason + (f": {stderr_tail}" if stderr_tail else ""))
        return batch.started
    current = outcome
    if current is not None and current not in finished:
        batch.fail(current, f"{_exit_reason(rc)} while running" + (f": {stderr_tail}" if stderr_tail else ""))
        return batch.started
    unreported = [n for n in names if n not in finished]
    if unreported:
        # The process ended between benchmarks (or never started one): none of them is to
        # blame, but they cannot be retried forever either.
        reason = f"benchmark binary {_exit_reason(rc)} before running it" + (
            f": {stderr_tail}" if stderr_tail else "")
        for name in unreported:
            batch.fail(name, reason)
    return batch.started


@dataclass(frozen=True)
class _TimedOut:
    current: str | None  # the benchmark running when the binary fell silent


def _read_results(proc: subprocess.Popen, lines: _Lines, names: list[str],
                  batch: _Batch) -> str | None | _TimedOut:
    """Reads the protocol until the binary is done; the benchmark running when its output
    ended (None between benchmarks), or ``_TimedOut`` when it fell silent and was killed."""
    current: str | None = None
    clock: CpuClock | None = None  # the child's CPU clock when the running benchmark started
    last = time.monotonic()  # the last sign of life
    exited: float | None = None
    kernels: dict[str, object] = {}  # CUPTI mode: kernel records, ahead of the result
    while True:
        line = lines.read(0.5)
        now = time.monotonic()
        if line is _Lines.IDLE:
            batch.store.tick()
            if proc.poll() is not None:
                exited = exited or now
                if now - exited > _DRAIN_SECONDS:
                    return current  # the pipe is held open by a grandchild: stop listening
            elif all(n in batch.finished for n in names) and now - last > min(_DRAIN_SECONDS, batch.options.timeout):
                return None  # everything reported; the binary just does not exit
            elif now - last > batch.options.timeout:
                children.kill_group(proc)
                return _TimedOut(current)
            continue
        if line is None:
            return current
        assert isinstance(line, str)
        last = now
        tag, _, payload = line.rstrip("\n").partition(" ")
        if tag == "BENANZA_START":
            current, batch.started = payload, True
            clock = cpu_clock(proc.pid)
            batch.notify(current, None)
        elif tag == "BENANZA_METRICS":
            try:
                data = json.loads(payload)
                kernels[data["name"]] = data.get("profile")
            except (ValueError, TypeError, KeyError, AttributeError):
                log.warning("ignoring a malformed metrics line: %.200s", line)
        elif tag == "BENANZA_RESULT":
            _take_result(line, payload, current, kernels, batch, contention(clock, cpu_clock(proc.pid)))
            current = None


def _take_result(line: str, payload: str, current: str | None, kernels: dict[str, object],
                 batch: _Batch, lost: Contention | None = None) -> None:
    """Stores one result line, with the share of its time ``lost`` to other work; a malformed
    one fails its benchmark (or the running one) and keeps the line, so one bad line never costs
    the run."""
    try:
        parsed = json.loads(payload)
    except ValueError:
        parsed = None
    data = parsed if isinstance(parsed, dict) else None
    named = data.get("name") if data is not None else None
    # The line belongs to the running benchmark whatever it names: taking another name would
    # store a result for a benchmark that has not run and drop that one's real result later.
    name = current if current is not None else named if isinstance(named, str) and named in batch.by_name else None
    if name is None or name in batch.finished:
        if name is None:
            log.warning("ignoring a result line for no benchmark of this run: %.200s", line)
        return
    problem = "not a JSON object" if data is None else ""
    if data is not None:
        if data.get("name") != name:
            problem = f"names {data.get('name')!r}, not the running benchmark"
        else:
            if name in kernels:
                data["cupti"] = kernels.pop(name)
            try:
                result = parse_result(batch.by_name[name], batch.system.name, data, max_ms=batch.options.timeout * 1e3)
                batch.store_result(result, data, _own_contention(data) if "sched" in data else lost)
                return
            except MalformedResult as exc:
                problem = str(exc)
    batch.fail(name, f"malformed result line ({problem}): {line.strip()[:500]}", line=line.strip()[:4000])


def _own_contention(data: dict) -> Contention | None:
    """The contention from the clocks a binary read of itself around the benchmark (``sched``):
    preferred over the runner's own reading of the child's counters, which is taken when the
    runner gets to the lines and so may include some of the next benchmark's start."""
    sched = data["sched"]
    try:
        if not isinstance(sched, dict):
            raise ValueError(f"{sched!r} is not an object")
        return contention(clock_of(sched.get("before")), clock_of(sched.get("after")))
    except ValueError as exc:
        raise MalformedResult(f"sched: {exc}") from None


def _exit_reason(rc: int) -> str:
    if rc < 0:
        try:
            return f"crashed ({signal.Signals(-rc).name})"
        except ValueError:
            return f"crashed (signal {-rc})"
    return f"exited with status {rc}"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class MalformedResult(ValueError):
    """A BENANZA_RESULT line that does not follow the protocol."""


def _number(data: dict, key: str) -> float | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise MalformedResult(f"{key} is {value!r}, not a finite number")
    return float(value)


def _time(key: str, value: object, max_ms: float, zero: bool = False) -> float:
    """A time in ms: finite, positive (``zero``: or 0) and at most ``max_ms`` (the benchmark
    ran within the runner's timeout, so no call of it took longer)."""
    ms = _number({key: value}, key)
    if ms is None or ms < 0 or (ms == 0 and not zero) or ms > max_ms:
        raise MalformedResult(f"{key} is {value!r}, not a time between 0 and {max_ms:g} ms")
    return ms


def _count(data: dict, key: str) -> int:
    """A non-negative whole number (Google Benchmark counters arrive as doubles)."""
    value = _number(data, key)
    if value is None:
        return 0
    if value < 0 or value != int(value):
        raise MalformedResult(f"{key} is {data[key]!r}, not a count")
    return int(value)


def parse_result(variant: Variant, system: str, data: dict, max_ms: float = math.inf) -> Result:
    """A Result from one BENANZA_RESULT line of the runtime; MalformedResult if it is not one
    (``max_ms``: the longest time a call of it can have taken)."""
    try:
        status = Status(data["status"])
    except KeyError:
        raise MalformedResult("no status") from None
    except ValueError:
        raise MalformedResult(f"unknown status {data['status']!r}") from None
    counters = data.get("counters", {})
    if not isinstance(counters, dict):
        raise MalformedResult(f"counters is {counters!r}, not an object")
    for key in ("message", "implementation"):
        if not isinstance(data.get(key, ""), str):
            raise MalformedResult(f"{key} is {data[key]!r}, not a string")
    median, mean, stddev, fastest = (None if data.get(k) is None else _time(k, data[k], max_ms, zero=k == "stddev_ms")
                                     for k in ("median_ms", "mean_ms", "stddev_ms", "min_ms"))
    if status is Status.OK and median is None:
        raise MalformedResult("status ok without median_ms")
    if median is not None and fastest is not None and fastest > median:
        raise MalformedResult(f"min_ms {fastest!r} exceeds median_ms {median!r}")
    for key in counters:
        _number(counters, key)  # stored as JSON: NaN or text would make the column unreadable
    sampled = _samples(data) if status is Status.OK else None
    precision = _number(data, "precision") if status is Status.OK else None
    if precision is not None and precision < 0:
        raise MalformedResult(f"precision is {precision!r}, not a relative half-width")
    metrics = {k: v for k, v in counters.items() if k != "workspace_bytes"}
    if "times_ms" in data:
        times = data["times_ms"]
        if not isinstance(times, list):
            raise MalformedResult(f"times_ms is {times!r}, not a list")
        metrics["times_ms"] = [_time("times_ms", t, max_ms) for t in times]
    if "cupti" in data:
        metrics["cupti"] = data["cupti"]
    return Result(variant=variant, system=system, status=status, message=data.get("message", ""),
                  iterations=_count(data, "iterations"), repetitions=_count(data, "repetitions"),
                  workspace_bytes=_count(counters, "workspace_bytes"),
                  implementation=data.get("implementation", ""), metrics=metrics, timestamp=_now(),
                  median_ms=median, mean_ms=mean, stddev_ms=stddev, min_ms=fastest,
                  low_ms=sampled.low_ms if sampled else None, sample_median_ms=sampled.median_ms if sampled else None,
                  sample_iqr_ms=sampled.iqr_ms if sampled else None, samples=sampled.count if sampled else 0,
                  precision=precision)


def _samples(data: dict) -> SampleSummary | None:
    """The summary of the per-call samples a result line carries (None for a runtime that sends
    none: the bound then uses the median)."""
    if "sample_percentiles_ms" not in data:
        return None
    percentiles = data["sample_percentiles_ms"]
    if not isinstance(percentiles, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                    for x in percentiles):
        raise MalformedResult(f"sample_percentiles_ms is {str(percentiles)[:80]}, not a list of numbers")
    try:
        return summarize([float(x) for x in percentiles], _count(data, "samples"))
    except ValueError as exc:
        raise MalformedResult(f"sample_percentiles_ms: {exc}") from None
