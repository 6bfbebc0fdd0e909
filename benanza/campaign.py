"""Campaigns: one set of models benchmarked on many systems through Slurm, into one database.

A *system* is whatever a Slurm partition or constraint selects (one GPU type, one CPU
generation). The campaign submits one job per system with submitit; on its node each job
processes the models, generates, builds and runs the benchmarks (the same library calls as
``benanza generate`` and ``benanza run``) into its own SQLite shard, and the head merges each
shard into the campaign's performance database as its job finishes. Everything lives in the
campaign folder, which must be on a filesystem the nodes share::

    campaign.json          the spec (models, systems, options) and every job submitted
    shards/<system>.db     the job's own database (never written by two processes at once)
    bench/<system>/        generated sources and the node's build
    progress/<system>.json what the running job has done so far (written by the job)
    slurm/                 submitit's files: sbatch scripts, pickles, the jobs' logs

Submitting again plans from the merged database: a system whose variants are all measured
on its current stack gets no job, one whose job is still queued or running gets no second
one, and a resubmitted job continues in its shard where the previous one stopped (the
runner skips what the shard holds). A job that fails, is cancelled or pre-empted is
reported with its state and the tail of its log; its partial results are merged all the
same. Pre-emption that Slurm signals (SIGUSR2 before the kill) requeues the job through
submitit's checkpointing, so it resumes by itself.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import Any

import submitit

from . import runner
from .errors import BenanzaError, UsageError
from .generator import GenOptions, expand_variants, generate, get_backend
from .layers import unique_layers
from .manifest import Manifest, build_manifest, write_manifest
from .measurement import MAX_CONTENTION
from .perfdb import PerfDB
from .processor import load_model
from .records import Variant
from .system import default_threads

log = logging.getLogger(__name__)

SPEC_NAME = "campaign.json"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# Slurm job states in which the job may still produce its result.
_ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
           "RESIZING", "SUSPENDED", "SIGNALING", "STAGE_OUT"}
# What a job gets unless the spec says otherwise: submitit's own default time limit is 5 minutes,
# far less than building and running a model set.
DEFAULT_SLURM: tuple[tuple[str, Any], ...] = (("time", 240),)
_LOG_TAIL = 20


class CampaignError(BenanzaError):
    """A campaign folder, spec or Slurm submission that cannot be used."""


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _slurm_value(text: str) -> Any:
    """sbatch parameters from the command line: integers as int (submitit checks some types)."""
    if re.fullmatch(r"\d+", text):
        return int(text)
    return {"true": True, "false": False}.get(text.lower(), text)


# submitit parameters that are lists of lines: each KEY=VALUE adds one line
_LINE_LISTS = ("setup", "teardown", "srun_args")


def parse_slurm_params(items: tuple[str, ...] | list[str], what: str = "--slurm") -> tuple[tuple[str, Any], ...]:
    """``KEY=VALUE`` strings (submitit's Slurm parameters: partition, time, gres, ...)."""
    out: list[tuple[str, Any]] = []
    lines: dict[str, tuple[str, ...]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"{what} {item!r}: expected KEY=VALUE (e.g. time=120, gres=gpu:1)")
        if key == "additional_parameters":
            raise UsageError(f"{what} {item!r}: additional_parameters is a mapping; give each sbatch option "
                             f"as its own KEY=VALUE instead")
        if key in _LINE_LISTS:
            lines[key] = (*lines.get(key, ()), value.strip())
        else:
            out.append((key, _slurm_value(value.strip())))
    return tuple(out) + tuple(lines.items())


@dataclass(frozen=True)
class SystemSpec:
    """One system of a campaign: the name its results are stored under, and how Slurm finds it.

    ``slurm`` holds submitit Slurm parameters for this system only (``partition``,
    ``constraint``, ``gres``, ``account``, ``setup`` lines, ...), applied over the campaign's.
    """

    name: str
    backend: str = "auto"  # auto: cudnn where the node has a GPU, else onednn
    threads: int | None = None  # oneDNN threads; default: the CPUs the job may use
    slurm: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise UsageError(f"system name {self.name!r}: use letters, digits, '.', '_' and '-' only")
        if self.backend not in ("auto", "onednn", "cudnn"):
            raise UsageError(f"system {self.name}: unknown backend {self.backend!r} (auto, onednn, cudnn)")

    @classmethod
    def parse(cls, text: str) -> SystemSpec:
        """``NAME:KEY=VALUE,...``: e.g. ``a100:partition=gpu-a100,gres=gpu:1`` or
        ``v100:constraint=v100,backend=cudnn``. ``backend`` and ``threads`` are Benanza's;
        every other key is a Slurm parameter."""
        name, _, rest = text.partition(":")
        slurm = list(parse_slurm_params([p for p in rest.split(",") if p], f"--system {text!r}:"))
        backend, threads = "auto", None
        for key, value in list(slurm):
            if key == "backend":
                backend = str(value)
                slurm.remove((key, value))
            elif key == "threads":
                if not isinstance(value, int) or value < 1:
                    raise UsageError(f"--system {text!r}: threads must be a positive integer")
                threads = value
                slurm.remove((key, value))
        return cls(name.strip(), backend, threads, tuple(slurm))

    def to_json(self) -> dict:
        return {"name": self.name, "backend": self.backend, "threads": self.threads,
                "slurm": [list(kv) for kv in self.slurm]}

    @classmethod
    def from_json(cls, d: dict) -> SystemSpec:
        return cls(d["name"], d["backend"], d.get("threads"), tuple((k, v) for k, v in d["slurm"]))


@dataclass(frozen=True)
class CampaignSpec:
    """What to measure where; stored in the campaign folder so a later call can resume it."""

    models: tuple[str, ...]  # absolute paths, visible from the nodes
    systems: tuple[SystemSpec, ...]
    db: str  # the merged performance database (absolute path, on the head)
    batch_size: int = 1
    gen: GenOptions = field(default_factory=GenOptions)
    min_time: float = 0.2
    repetitions: int = 3
    timeout: float = 300.0  # seconds one benchmark may take
    slurm: tuple[tuple[str, Any], ...] = DEFAULT_SLURM  # for every system's job
    max_contention: float = MAX_CONTENTION  # docs/measurement.md

    def __post_init__(self) -> None:
        names = [s.name for s in self.systems]
        if not names:
            raise UsageError("a campaign needs at least one --system")
        if len(set(names)) != len(names):
            raise UsageError(f"system names repeat: {', '.join(sorted(names))}")
        if not self.models:
            raise UsageError("a campaign needs at least one model")

    def system(self, name: str) -> SystemSpec:
        for s in self.systems:
            if s.name == name:
                return s
        raise CampaignError(f"no system {name!r} in this campaign")

    def to_json(self) -> dict:
        return {"models": list(self.models), "systems": [s.to_json() for s in self.systems], "db": self.db,
                "batch_size": self.batch_size, "gen": asdict(self.gen), "min_time": self.min_time,
                "repetitions": self.repetitions, "timeout": self.timeout,
                "slurm": [list(kv) for kv in self.slurm], "max_contention": self.max_contention}

    @classmethod
    def from_json(cls, d: dict) -> CampaignSpec:
        g = d["gen"]
        gen = GenOptions(dtypes=tuple(g["dtypes"]), layouts=tuple(g["layouts"]), math=tuple(g["math"]),
                         fusion=g["fusion"], cupti=g["cupti"], cupti_metrics=tuple(g["cupti_metrics"]),
                         extra=tuple((k, v) for k, v in g["extra"]))
        return cls(tuple(d["models"]), tuple(SystemSpec.from_json(s) for s in d["systems"]), d["db"],
                   d["batch_size"], gen, d["min_time"], d["repetitions"], d["timeout"],
                   tuple((k, v) for k, v in d["slurm"]), d.get("max_contention", MAX_CONTENTION))


# --- the job that runs on a node ----------------------------------------------------------

@dataclass(frozen=True)
class JobSummary:
    """What one system's job did; pickled back to the head by submitit."""

    system: str
    backend: str
    device: str
    stack_id: str
    total: int
    already: int
    ok: int
    unsupported: int
    failed: int
    seconds: float
    contended: float


class SystemJob(submitit.helpers.Checkpointable):
    """generate + build + run for one system into its shard. Checkpointable: when Slurm
    pre-empts or times the job out with a warning signal, submitit requeues this same call,
    and the runner's incremental store makes it continue where it stopped."""

    def __init__(self, root: str, spec: CampaignSpec, system: SystemSpec):
        self.root, self.spec, self.system = root, spec, system

    def __call__(self) -> JobSummary:
        folder = Folder(self.root)
        name = self.system.name
        report = _ProgressFile(folder.progress(name))
        report.write("processing models")
        loaded = [load_model(p, batch_size=self.spec.batch_size) for p in self.spec.models]
        manifest = build_manifest(loaded, unique_layers(loaded))
        backend = runner.resolve_backend(self.system.backend)
        runner.check_device(backend)
        bench = folder.bench(name)
        write_manifest(manifest, bench)
        generate(manifest, backend, bench, self.spec.gen)
        report.write("building")
        job = f"slurm job {os.environ.get('SLURM_JOB_ID', '?')}, run {os.environ.get('SLURM_RESTART_COUNT', '0')}"
        options = runner.RunOptions(
            min_time=self.spec.min_time, repetitions=self.spec.repetitions,
            threads=self.system.threads or default_threads(),  # a Slurm job owns its CPUs: all of them
            timeout=self.spec.timeout, build_jobs=default_threads(), max_contention=self.spec.max_contention,
            command=f"benanza campaign {self.root} system {name} ({job})")
        summary = runner.run(bench, name, backend, folder.shard(name), options, progress=report.step)
        if summary.interrupted:
            raise CampaignError(f"system {name}: interrupted after {summary.stored} results (stored)")
        report.write("done", summary.ok + summary.unsupported + summary.failed, len(summary.to_run))
        return JobSummary(name, summary.backend, summary.system.device, summary.system.stack_id,
                          summary.total, summary.already, summary.ok, summary.unsupported, summary.failed,
                          round(summary.seconds, 3), summary.contended)


class _ProgressFile:
    """The job's progress, rewritten atomically after each result (the head reads it)."""

    def __init__(self, path: Path):
        self.path = path
        self.counts = {"ok": 0, "unsupported": 0, "failed": 0}

    def write(self, phase: str, done: int = 0, total: int = 0) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps({"phase": phase, "done": done, "total": total, **self.counts,
                                   "job": os.environ.get("SLURM_JOB_ID", ""), "updated": _now()}))
        tmp.replace(self.path)

    def step(self, p: runner.Progress) -> None:
        if p.status is not None:
            self.counts[p.status.value] += 1
            self.write("running", p.done, p.total)  # one small file per benchmark, which takes far longer


# --- the campaign folder -----------------------------------------------------------------

class Folder:
    def __init__(self, root: str | Path):
        self.root = Path(root).resolve()

    @property
    def spec_path(self) -> Path:
        return self.root / SPEC_NAME

    @property
    def slurm(self) -> Path:
        return self.root / "slurm"

    def shard(self, system: str) -> Path:
        return self.root / "shards" / f"{system}.db"

    def bench(self, system: str) -> Path:
        return self.root / "bench" / system

    def progress(self, system: str) -> Path:
        return self.root / "progress" / f"{system}.json"


@dataclass
class JobRecord:
    """One job submitted for a system, as remembered in campaign.json."""

    job_id: str
    submitted: str
    planned: int | None  # variants missing when it was submitted (None: unknown, new system)
    outcome: str = ""  # "" while not collected; else "completed" or "failed"
    state: str = ""  # Slurm's last word on it
    message: str = ""
    merged: dict = field(default_factory=dict)  # what merging its shard added, per table


@dataclass
class Campaign:
    folder: Folder
    spec: CampaignSpec
    jobs: dict[str, list[JobRecord]]

    @classmethod
    def open(cls, root: str | Path) -> Campaign:
        folder = Folder(root)
        try:
            data = json.loads(folder.spec_path.read_text())
        except FileNotFoundError:
            raise CampaignError(f"{folder.spec_path}: no campaign here; start one with "
                                f"`benanza campaign submit MODELS --dir {root} --system ...`") from None
        except ValueError as exc:
            raise CampaignError(f"{folder.spec_path}: unreadable campaign file ({exc})") from None
        try:
            spec = CampaignSpec.from_json(data["spec"])
            jobs = {k: [JobRecord(**r) for r in v] for k, v in data["jobs"].items()}
        except (KeyError, TypeError) as exc:
            raise CampaignError(f"{folder.spec_path}: not a campaign file Benanza wrote ({exc})") from None
        return cls(folder, spec, jobs)

    @classmethod
    def create(cls, root: str | Path, spec: CampaignSpec) -> Campaign:
        """A new campaign, or an existing one (its job history kept) with this spec."""
        folder = Folder(root)
        jobs: dict[str, list[JobRecord]] = {}
        if folder.spec_path.exists():
            jobs = cls.open(root).jobs
        camp = cls(folder, spec, jobs)
        camp.save()
        return camp

    def save(self) -> None:
        self.folder.root.mkdir(parents=True, exist_ok=True)
        data = {"spec": self.spec.to_json(), "jobs": {k: [asdict(r) for r in v] for k, v in self.jobs.items()}}
        tmp = self.folder.spec_path.with_name(SPEC_NAME + ".tmp")
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        tmp.replace(self.folder.spec_path)

    def latest(self, system: str) -> JobRecord | None:
        records = self.jobs.get(system)
        return records[-1] if records else None


# --- scheduler state ---------------------------------------------------------------------

def _query(cmd: list[str]) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        log.debug("%s: %s", cmd[0], exc)
        return None


def slurm_state(job_id: str) -> str | None:
    """Slurm's state of a job: the controller's (squeue) while it remembers the job, else the
    accounting database's (sacct); None when neither knows it. A controller that cannot be
    asked is an error, never taken for a job that is gone."""
    if shutil.which("squeue") is None:
        raise CampaignError("no Slurm client here (squeue is not on PATH): run campaigns where sbatch runs")
    live = _query(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T"])
    if live is not None and live.returncode == 0 and live.stdout.strip():
        return live.stdout.split()[0].upper()
    if live is None or (live.returncode != 0 and "invalid job id" not in live.stderr.lower()):
        why = live.stderr.strip() if live is not None else "did not answer"
        raise CampaignError(f"cannot ask Slurm about job {job_id}: squeue: {why}")
    acct = _query(["sacct", "-n", "-X", "-P", "-o", "State", "-j", job_id])
    if acct is not None and acct.returncode == 0 and acct.stdout.strip():
        return acct.stdout.split()[0].upper()  # e.g. "CANCELLED by 0": the state is the first word
    return None


# --- what the head does ------------------------------------------------------------------

class PlanState(str, Enum):
    COMPLETE = "complete"  # every variant measured on the system's current stack
    ACTIVE = "active"  # its job is queued or running
    SUBMIT = "submit"  # needs a job


@dataclass(frozen=True)
class SystemPlan:
    system: str
    state: PlanState
    total: int | None  # variants the models need on it (None: backend unknown until it runs)
    missing: int | None
    job_id: str = ""


@dataclass(frozen=True)
class JobReport:
    """A job the head saw end: what it did, or why it failed and where its log is."""

    system: str
    job_id: str
    outcome: str  # completed | failed
    state: str
    message: str
    added_results: int
    log_path: str
    log_tail: str
    summary: JobSummary | None = None


@dataclass(frozen=True)
class SystemProgress:
    system: str
    job_id: str
    state: str  # Slurm state, or the outcome once collected
    phase: str
    done: int
    total: int
    ok: int
    unsupported: int
    failed: int


class _Wanted:
    """The variants the models need per backend: processed and expanded once, when first asked."""

    def __init__(self, spec: CampaignSpec):
        self.spec = spec
        self._manifest: Manifest | None = None
        self._variants: dict[str, list[Variant]] = {}

    def manifest(self) -> Manifest:
        if self._manifest is None:
            loaded = [load_model(p, batch_size=self.spec.batch_size) for p in self.spec.models]
            self._manifest = build_manifest(loaded, unique_layers(loaded))
        return self._manifest

    def variants(self, backend: str) -> list[Variant]:
        if backend not in self._variants:
            self._variants[backend] = expand_variants(self.manifest(), get_backend(backend), self.spec.gen)
        return self._variants[backend]


def plan(camp: Campaign) -> list[SystemPlan]:
    """Per system: complete, active (job in the queue) or to submit, from the merged database."""
    wanted = _Wanted(camp.spec)
    # Models are processed here, on the login node: a model that cannot be read never reaches
    # sbatch, whatever the database knows.
    wanted.manifest()
    out = []
    with PerfDB(camp.spec.db) as db:
        for s in camp.spec.systems:
            rec = camp.latest(s.name)
            if rec is not None and not rec.outcome:
                out.append(SystemPlan(s.name, PlanState.ACTIVE, None, None, rec.job_id))
                continue
            known = db.system(s.name, backend=None if s.backend == "auto" else s.backend)
            if known is None:
                out.append(SystemPlan(s.name, PlanState.SUBMIT, None, None))
                continue
            variants = wanted.variants(known.backend)
            # as the runner counts it: a variant that failed too often in a row is given up on
            missing = len(db.missing(known, variants, max_failures=runner.RunOptions().max_failures))
            out.append(SystemPlan(s.name, PlanState.COMPLETE if missing == 0 else PlanState.SUBMIT,
                                  len(variants), missing))
    return out


def _executor(camp: Campaign, system: SystemSpec) -> submitit.SlurmExecutor:
    try:
        ex = submitit.SlurmExecutor(folder=str(camp.folder.slurm / "%j"))
    except RuntimeError as exc:  # no srun on PATH
        raise CampaignError(f"cannot submit to Slurm: {exc}") from None
    params = {k: list(v) if k in _LINE_LISTS else v for k, v in (dict(camp.spec.slurm) | dict(system.slurm)).items()}
    params.setdefault("job_name", f"benanza-{system.name}")
    try:
        ex.update_parameters(**params)
    except ValueError as exc:
        bad = str(exc).splitlines()[0]
        raise UsageError(f"system {system.name}: {bad} (see submitit's SlurmExecutor parameters)") from None
    return ex


def submit(camp: Campaign, plans: list[SystemPlan]) -> list[SystemPlan]:
    """Submits one job per system planned SUBMIT; returns those plans with their job ids."""
    submitted = []
    for p in plans:
        if p.state is not PlanState.SUBMIT:
            continue
        system = camp.spec.system(p.system)
        ex = _executor(camp, system)
        try:
            # submitit prints sbatch's stderr before raising: it belongs in the one error line
            with contextlib.redirect_stderr(io.StringIO()):
                job = ex.submit(SystemJob(str(camp.folder.root), camp.spec, system))
        except submitit.core.utils.FailedJobError as exc:  # what submitit raises when sbatch fails
            why = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
            raise CampaignError(f"system {system.name}: sbatch refused the job: "
                                f"{' / '.join(why[-4:]) if why else 'no message'}") from None
        camp.jobs.setdefault(system.name, []).append(JobRecord(job.job_id, _now(), p.missing))
        camp.save()
        log.info("system %s: submitted Slurm job %s", system.name, job.job_id)
        submitted.append(SystemPlan(p.system, PlanState.ACTIVE, p.total, p.missing, job.job_id))
    return submitted


def _tail(path: Path, lines: int = _LOG_TAIL) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").rstrip().splitlines()[-lines:])
    except OSError:
        return ""


def collect(camp: Campaign) -> list[JobReport]:
    """Merges the shard of every job that has ended since the last call; reports each such job.

    A failed job's partial results are real measurements: they are merged too, and a
    resubmitted job skips them.
    """
    reports = []
    for s in camp.spec.systems:
        rec = camp.latest(s.name)
        if rec is None or rec.outcome:
            continue
        job: submitit.SlurmJob = submitit.SlurmJob(folder=str(camp.folder.slurm / "%j"), job_id=rec.job_id)
        summary: JobSummary | None = None
        state = slurm_state(rec.job_id)
        if state in _ACTIVE:
            # A result file now is an earlier run's: a requeued job's first run may write one
            # (Slurm's SIGTERM for the requeue interrupts the runner before submitit exits).
            continue
        if job.paths.result_pickle.exists():
            try:
                summary = job.result()
                rec.outcome, rec.message = "completed", ""
            except submitit.core.utils.UncompletedJobError as exc:  # the job's exception, with its trace
                rec.outcome = "failed"
                rec.message = _job_error(exc)
        elif state == "COMPLETED":
            continue  # its result file is not visible yet on this filesystem
        else:
            rec.outcome = "failed"
            rec.message = (f"job ended as {state} without a result" if state else
                           "Slurm no longer knows this job and it left no result")
        rec.state = state or ""
        shard = camp.folder.shard(s.name)
        if shard.exists():
            with PerfDB(camp.spec.db) as db:
                rec.merged = dict(db.merge_from(shard))
        camp.save()
        log_path = job.paths.stderr
        reports.append(JobReport(s.name, rec.job_id, rec.outcome, rec.state, rec.message,
                                 int(rec.merged.get("results", 0)), str(log_path),
                                 _tail(log_path) if rec.outcome == "failed" else "", summary))
    return reports


def _job_error(exc: Exception) -> str:
    """The last line of the job's traceback: the error itself (a BenanzaError's one line)."""
    text = str(exc)
    trace = text.split("-" * 22)
    body = trace[1] if len(trace) > 2 else text
    lines = [ln for ln in body.strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else type(exc).__name__


def progress(camp: Campaign) -> list[SystemProgress]:
    """Per system: its latest job, Slurm's state of it and what the job reports it has done."""
    out = []
    for s in camp.spec.systems:
        rec = camp.latest(s.name)
        if rec is None:
            out.append(SystemProgress(s.name, "", "not submitted", "", 0, 0, 0, 0, 0))
            continue
        state = rec.outcome or (slurm_state(rec.job_id) or "UNKNOWN")
        try:
            p = json.loads(camp.folder.progress(s.name).read_text())
        except (OSError, ValueError):
            p = {}
        if p.get("job") and p["job"] != rec.job_id:
            p = {}  # an earlier job's report
        out.append(SystemProgress(s.name, rec.job_id, state, p.get("phase", ""), p.get("done", 0),
                                  p.get("total", 0), p.get("ok", 0), p.get("unsupported", 0),
                                  p.get("failed", 0)))
    return out


@dataclass
class CampaignRun:
    submitted: list[SystemPlan]
    plans: list[SystemPlan]
    reports: list[JobReport]


def run(camp: Campaign, wait: bool = False, poll: float = 5.0,
        on_poll: Callable[[list[SystemProgress], list[JobReport]], None] | None = None) -> CampaignRun:
    """Collects what ended, plans, submits what is missing and, with ``wait``, merges each
    system's results as its job ends until none is left in the queue."""
    reports = collect(camp)
    plans = plan(camp)
    submitted = submit(camp, plans)
    if on_poll:
        on_poll(progress(camp), reports)
    while wait and any(r is not None and not r.outcome for r in (camp.latest(s.name) for s in camp.spec.systems)):
        time.sleep(poll)
        new = collect(camp)
        reports.extend(new)
        if on_poll:
            on_poll(progress(camp), new)
    return CampaignRun(submitted, plans, reports)
