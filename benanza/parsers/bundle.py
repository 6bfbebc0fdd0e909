"""The model execution profile (paper §III-D ④): a bundle folder, or single profile files.

``benanza profile`` writes a folder with ``profile.json`` (the index, format below) next to
the framework trace, library logs and Nsight report it captured. ``load_profile`` reads a
bundle or any single file of a known format, so users can also bring their own logs.

``profile.json``::

    {"schema_version": 2, "model": "...", "framework": "onnxruntime", "framework_version": "...",
     "model_identity": {"name": "resnet50", "graph_sha256": "...", "batch_size": 1,
                        "inputs": {"data": [1, 3, 224, 224]}},
     "device": "cpu", "batch_size": 1, "warmup": 5, "iterations": 50,
     "runs": {"timed": {"command": "...", "loggers": {}},
              "traced": {"command": "...", "loggers": {"ONEDNN_VERBOSE": "1", ...},
                         "page_faults": {...}, "heap": {"kept": true, "grown_bytes": .., "why_not": null}}},
     "latency_ms": {"trimmed_mean": .., "p50": .., "p90": .., "mean": .., "min": .., "max": ..,
                    "samples": [..]},
     "files": {"trace": "ort_profile.json", "cudnn_log": "cudnn.log", "cublas_log": "cublas.log",
               "onednn_log": "onednn.log", "nsys": "nsys.nsys-rep"},
     "threads": 2, "threads_requested": 2, "threads_source": "...",
     "page_faults": {"per_run": 812.4, "fault_us": 0.9, "samples": [..]},
     "machine_speed": {"before": {"core_ms": 2.2, "memory_ms": 6.3}, "after": {..}, "during": [{..}]},
     "notes": ["..."]}

``latency_ms`` comes from the ``timed`` run (no library loggers), as do ``page_faults`` (the
process's minor page faults in each timed run and the measured cost of one, ``PageFaults``), and
``machine_speed`` is the reference kernel's readings just before and after it on a CPU, and
between its runs every two seconds and at least once (``during``; absent from older bundles)
(``benanza/machine_speed.py``: ``analyze`` compares them with the benchmarks' own); the trace
and the logs come from the ``traced`` run (a torch run's ``traced`` also has its runs' page faults
and whether its heap was kept on mapped pages: ``benanza/heap.py``). ``graph_sha256`` identifies the
model: an analysis of another model refuses the bundle. ``threads`` is the framework's intra-op
thread count in the runs, as the framework itself reported it (``torch.get_num_threads()``, ONNX
Runtime's thread-pool statistics, oneDNN's ``nthr``), ``threads_requested`` what ``--threads`` asked
for (null: the framework's default), ``threads_source`` where the count comes from; ``analyze``
compares it with the benchmarks' threads. Version 1 bundles (no identity, latency timed with the
loggers on) still load, with a note saying so.

``benanza profile --command`` writes the same index with ``"framework": "command"``, the
command line, ``"measure_name"`` (the ``benanza.measure`` name whose blocks are ``latency_ms``)
and ``"measures"``: per name ``{"latency_ms": {..}, "blocks": n, "warmup_dropped": k,
"onednn_log": "onednn-1.log"}``. ``model_identity`` is null unless ``--model`` named the ONNX
file; such a bundle loads with a note that it cannot be checked against the analysed model.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..machine_speed import RunSpeed
from .base import FrameworkTrace, LibraryCall, ProfileFormatError, load_json
from .cublas_log import parse_cublas_log
from .cudnn_log import parse_cudnn_log
from .kineto import parse_kineto_trace
from .nsys import parse_nsys
from .onednn_verbose import log_threads as onednn_log_threads
from .onednn_verbose import log_version as onednn_log_version
from .onednn_verbose import parse_onednn_verbose
from .ort import parse_ort_profile

INDEX_NAME = "profile.json"
BUNDLE_SCHEMA_VERSION = 2


@dataclass(frozen=True)
class LatencyStats:
    trimmed_mean_ms: float  # MLModelScope/XSP: mean after dropping 20% at each end
    p50_ms: float
    p90_ms: float
    mean_ms: float
    min_ms: float
    max_ms: float
    samples_ms: tuple[float, ...]

    def to_json(self) -> dict:
        return {"trimmed_mean": self.trimmed_mean_ms, "p50": self.p50_ms, "p90": self.p90_ms,
                "mean": self.mean_ms, "min": self.min_ms, "max": self.max_ms,
                "samples": list(self.samples_ms)}

    @classmethod
    def from_json(cls, d: dict) -> LatencyStats:
        """KeyError names a missing field; ValueError/TypeError a value that is not a number."""
        tm, p50, p90, mean, lo, hi = (float(d[k]) for k in ("trimmed_mean", "p50", "p90", "mean", "min", "max"))
        return cls(tm, p50, p90, mean, lo, hi, tuple(float(x) for x in d.get("samples", ())))


@dataclass(frozen=True)
class PageFaults:
    """The minor page faults the process took in each timed run (``getrusage``'s ``ru_minflt``
    around the run, every thread's), and what one first-touch fault costs on the machine, measured
    in the same process beside the runs (``profiler.fault_cost_us``; None where it was not)."""

    samples: tuple[int, ...]
    fault_us: float | None

    @property
    def per_run(self) -> float:
        """The mean: faults come in bursts (an allocator trims its heap every few runs), and the
        time they cost adds up over all runs."""
        return sum(self.samples) / len(self.samples)

    def to_json(self) -> dict:
        return {"per_run": self.per_run, "fault_us": self.fault_us, "samples": list(self.samples)}

    @classmethod
    def from_json(cls, d: dict) -> PageFaults:
        """KeyError names a missing field; ValueError/TypeError a value of the wrong kind."""
        samples = tuple(int(x) for x in d["samples"])
        if not samples or any(x < 0 for x in samples):
            raise ValueError("no samples, or a negative count")
        cost = d.get("fault_us")
        return cls(samples, None if cost is None else float(cost))


def page_faults_record(samples: list[int], fault_us: float | None) -> dict | None:
    """The index's ``page_faults`` of the timed runs (None: no run was timed)."""
    return PageFaults(tuple(samples), fault_us).to_json() if samples else None


def _percentile(ordered: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    pos = (len(ordered) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def latency_stats(samples_ms: list[float] | tuple[float, ...]) -> LatencyStats:
    if not samples_ms:
        raise ValueError("latency statistics need at least one sample")
    ordered = sorted(samples_ms)
    cut = int(0.2 * len(ordered))
    kept = ordered[cut: len(ordered) - cut] or ordered
    return LatencyStats(sum(kept) / len(kept), _percentile(ordered, 0.5), _percentile(ordered, 0.9),
                        sum(ordered) / len(ordered), ordered[0], ordered[-1], tuple(samples_ms))


@dataclass
class ExecutionProfile:
    """Everything known about one framework run of one model."""

    path: str
    framework: str = ""
    framework_version: str = ""
    device: str = ""
    batch_size: int | None = None
    model: str = ""
    latency: LatencyStats | None = None
    trace: FrameworkTrace | None = None  # the framework's own per-op trace
    nsys: FrameworkTrace | None = None
    library_calls: dict[str, list[LibraryCall]] = field(default_factory=dict)  # by library
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # what makes the analysis of it doubtful
    identity: dict | None = None  # model_identity() of the profiled model, when the bundle has it
    library_versions: dict[str, str] = field(default_factory=dict)  # e.g. {"onednn": "3.12.0"} from its log
    library_threads: dict[str, int] = field(default_factory=dict)  # e.g. {"onednn": 2}, when its log says
    # the framework's intra-op threads in the profiled run (the bundle's record, else the trace's
    # own statistics); None when neither says
    threads: int | None = None
    page_faults: PageFaults | None = None  # of the timed runs (measure blocks), where the bundle counted them
    speed: RunSpeed | None = None  # the machine's speed around the timed runs, where the bundle read it

    @property
    def measured_ms(self) -> float | None:
        """Trimmed-mean latency, else the framework trace's mean run time."""
        if self.latency is not None:
            return self.latency.trimmed_mean_ms
        runs = self.trace.runs if self.trace else []
        return latency_stats([r.dur_us / 1000.0 for r in runs]).trimmed_mean_ms if runs else None

    def merge(self, other: ExecutionProfile) -> None:
        """Fold a second source (e.g. a separately captured log) into this profile."""
        for name in ("framework", "framework_version", "device", "model"):
            if not getattr(self, name):
                setattr(self, name, getattr(other, name))
        self.batch_size = self.batch_size or other.batch_size
        self.threads = self.threads or other.threads
        self.identity = self.identity or other.identity
        for lib, version in other.library_versions.items():
            self.library_versions.setdefault(lib, version)
        for lib, threads in other.library_threads.items():
            self.library_threads.setdefault(lib, threads)
        self.latency = self.latency or other.latency
        self.page_faults = self.page_faults or other.page_faults
        self.speed = self.speed or other.speed
        self.trace = self.trace or other.trace
        self.nsys = self.nsys or other.nsys
        for lib, calls in other.library_calls.items():
            self.library_calls.setdefault(lib, []).extend(calls)
        self.notes.extend(other.notes)
        self.warnings.extend(other.warnings)


def _sniff(path: Path) -> str:
    if path.suffix in (".sqlite", ".nsys-rep", ".qdrep"):
        return "nsys"
    with open(path, "rb") as f:
        head = f.read(65536).decode("utf-8", errors="replace")
    stripped = head.lstrip()
    if stripped.startswith("["):
        return "ort"
    if stripped.startswith("{"):
        return "kineto"
    if "CuDNN (v" in head:
        return "cudnn"
    if "cuBLAS (v" in head or "[cublasLt]" in head:
        return "cublas"
    if "_verbose," in head:
        return "onednn"
    raise ProfileFormatError(path, "unknown profile format: expected an ONNX Runtime profile, a PyTorch "
                                   "trace, a cuDNN/cuBLAS/oneDNN log, an Nsight Systems report, or a "
                                   "`benanza profile` bundle folder")


def load_file(path: str | Path, kind: str | None = None) -> ExecutionProfile:
    p = Path(path)
    if not p.exists():
        raise ProfileFormatError(p, "no such profile file or bundle")
    kind = kind or _sniff(p)
    prof = ExecutionProfile(path=str(p))
    if kind == "ort":
        prof.trace, prof.framework = parse_ort_profile(p), "onnxruntime"
        prof.threads = prof.trace.threads
    elif kind == "kineto":
        prof.trace, prof.framework = parse_kineto_trace(p), "torch"
    elif kind == "nsys":
        prof.nsys = parse_nsys(p)
    elif kind == "cudnn":
        prof.library_calls["cudnn"] = parse_cudnn_log(p)
    elif kind == "cublas":
        calls = parse_cublas_log(p)
        for c in calls:
            prof.library_calls.setdefault(c.library, []).append(c)
    elif kind == "onednn":
        prof.library_calls["onednn"] = parse_onednn_verbose(p)
        version = onednn_log_version(p)
        if version:
            prof.library_versions["onednn"] = version
        threads = onednn_log_threads(p)
        if threads:
            prof.library_threads["onednn"] = threads
    else:
        raise ProfileFormatError(p, f"unknown profile kind {kind!r}")
    return prof


_FIELD_TYPES: dict[str, tuple[type, str]] = {
    "model_identity": (dict, "an object"), "notes": (list, "a list"), "framework": (str, "text"),
    "framework_version": (str, "text"), "device": (str, "text"), "model": (str, "text"),
    "batch_size": (int, "a whole number"), "threads": (int, "a whole number")}


def _check_fields(index: Path, data: dict) -> None:
    """The index's fields have the types the analysis reads them as (null: absent)."""
    for key, (kind, what) in _FIELD_TYPES.items():
        value = data.get(key)
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
            raise ProfileFormatError(index, f"{key} is {str(value)[:80]!r}, not {what}")
    if not all(isinstance(n, str) for n in data.get("notes") or []):
        raise ProfileFormatError(index, "notes holds entries that are not text")
    identity = data.get("model_identity")
    if identity is not None and not isinstance(identity.get("graph_sha256"), str):
        raise ProfileFormatError(index, "model_identity has no graph_sha256 text")


_FILE_KINDS = {"trace": None, "cudnn_log": "cudnn", "cublas_log": "cublas", "onednn_log": "onednn",
               "nsys": "nsys"}


def _record(index: Path, data: dict, key: str, kind: Any, what: str) -> Any:
    """The index's ``key`` read by ``kind.from_json`` (None when absent); one line naming the
    field when it is malformed."""
    if not data.get(key):
        return None
    try:
        return kind.from_json(data[key])
    except KeyError as exc:
        raise ProfileFormatError(index, f"{key} lacks the {exc.args[0]!r} field") from None
    except (TypeError, ValueError, AttributeError):
        raise ProfileFormatError(index, f"{key} is not {what}: {str(data[key])[:200]}") from None


def load_bundle(folder: str | Path) -> ExecutionProfile:
    root = Path(folder)
    index = root / INDEX_NAME
    data = load_json(index, "profile bundle index")
    if not isinstance(data, dict) or data.get("schema_version") not in (1, BUNDLE_SCHEMA_VERSION):
        raise ProfileFormatError(index, f"not a Benanza profile index (schema_version "
                                        f"{data.get('schema_version') if isinstance(data, dict) else None!r}, "
                                        f"expected 1 or {BUNDLE_SCHEMA_VERSION})")
    _check_fields(index, data)
    notes = list(data.get("notes", []))
    warnings = []
    if data["schema_version"] == 1:
        notes.append("a version 1 bundle: its latency was timed with the library loggers on (an overestimate)")
    if not data.get("model_identity"):  # version 1, or `profile --command` without --model
        warnings.append("the profile bundle names no ONNX model, so Benanza cannot verify that it ran the model "
                        "analysed")
    latency = _record(index, data, "latency_ms", LatencyStats, "a latency record")
    faults = _record(index, data, "page_faults", PageFaults, "a page-fault record")
    speed = _record(index, data, "machine_speed", RunSpeed, "a machine-speed record")
    files = data.get("files") or {}
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        raise ProfileFormatError(index, "files is not a map of kinds to file names")
    prof = ExecutionProfile(
        path=str(root), framework=data.get("framework", ""), framework_version=data.get("framework_version", ""),
        device=data.get("device", ""), batch_size=data.get("batch_size"), model=data.get("model", ""),
        latency=latency, notes=notes, warnings=warnings, identity=data.get("model_identity"),
        threads=data.get("threads"), page_faults=faults, speed=speed)
    for name, rel in sorted(files.items()):
        if name not in _FILE_KINDS:
            continue
        file = root / rel
        if not file.resolve().is_relative_to(root.resolve()):
            # an index is input: it must not make an analysis read (or nsys export beside) other files
            raise ProfileFormatError(index, f"names {name} file {rel!r}, which is outside the bundle folder")
        if not file.is_file():
            raise ProfileFormatError(index, f"names {name} file '{rel}', which is missing from the bundle")
        kind = _FILE_KINDS[name] or _sniff(file)
        if file.exists() and file.stat().st_size == 0 and kind in ("cudnn", "cublas", "onednn"):
            prof.library_calls.setdefault(kind, [])  # captured, and the library logged nothing
            continue
        prof.merge(load_file(file, kind))
    return prof


def load_profile(paths: list[str | Path] | tuple[str | Path, ...]) -> ExecutionProfile | None:
    """One profile from any mix of bundle folders and single files; None when none given."""
    merged: ExecutionProfile | None = None
    for path in paths:
        p = Path(path)
        prof = load_bundle(p) if p.is_dir() else load_file(p)
        if merged is None:
            merged = prof
        else:
            merged.merge(prof)
    return merged


def graph_sha256(model_path: str | Path) -> str:
    """Content hash of an ONNX file's graph (nodes, weights, inputs): names its computation,
    not where the file lies or what its producer metadata says."""
    import hashlib

    import onnx

    try:
        graph = onnx.load(str(model_path), load_external_data=False).graph
    except Exception as exc:  # noqa: BLE001 - protobuf raises its own DecodeError
        raise ProfileFormatError(model_path, f"cannot read the ONNX model ({exc})") from None
    return hashlib.sha256(graph.SerializeToString(deterministic=True)).hexdigest()


def model_identity(model_path: str | Path, batch_size: int) -> dict:
    """What a bundle records about the model it profiled."""
    import onnx

    graph = onnx.load(str(model_path), load_external_data=False).graph
    weights = {t.name for t in graph.initializer}
    inputs = {i.name: [d.dim_value if d.HasField("dim_value") else d.dim_param
                       for d in i.type.tensor_type.shape.dim] for i in graph.input if i.name not in weights}
    return {"name": Path(model_path).stem, "graph_sha256": graph_sha256(model_path), "batch_size": batch_size,
            "inputs": inputs}


def check_model(profile: ExecutionProfile, model_path: str | Path) -> None:
    """Refuses a profile recorded for another model than ``model_path``."""
    if not profile.identity:
        return
    digest = graph_sha256(model_path)
    if profile.identity.get("graph_sha256") != digest:
        raise ProfileFormatError(profile.path, f"a profile of model {profile.identity.get('name')!r} "
                                               f"(graph {str(profile.identity.get('graph_sha256'))[:12]}), not of "
                                               f"{model_path} (graph {digest[:12]})")


def write_index(folder: Path, data: dict) -> Path:
    path = folder / INDEX_NAME
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"schema_version": BUNDLE_SCHEMA_VERSION, **data}, indent=1) + "\n")
    tmp.replace(path)
    return path
