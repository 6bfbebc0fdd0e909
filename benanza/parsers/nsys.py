"""Nsight Systems reports: the SQLite export, and ``.nsys-rep`` through ``nsys export``.

Tables read when present (names as the export documents them): ``StringIds`` (the symbol
table every ``*Id`` column points into), ``CUPTI_ACTIVITY_KIND_KERNEL`` (GPU kernels),
``CUPTI_ACTIVITY_KIND_RUNTIME`` (CUDA runtime calls; ``correlationId`` links a launch to its
kernel), ``NVTX_EVENTS`` (ranges, e.g. ``benanza.measure``), ``OSRT_API`` (OS runtime calls),
``CUDNN_EVENTS`` / ``CUBLAS_EVENTS`` (library API ranges) and ``OSRT_CALLCHAINS`` /
``CUDA_CALLCHAINS`` (backtraces). Times are nanoseconds; records carry microseconds.
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import tempfile
from pathlib import Path

from .base import ApiEvent, FrameworkTrace, KernelEvent, ProfileFormatError, Span

# NVTX_EVENTS.eventType values for ranges (push/pop and start/end) in the export schema
_NVTX_RANGE_TYPES = (59, 60, 70, 71)


def parse_nsys(path: str | Path) -> FrameworkTrace:
    """Parse ``.sqlite`` directly; export ``.nsys-rep``/``.qdrep`` first (needs ``nsys``)."""
    p = Path(path)
    if p.suffix in (".nsys-rep", ".qdrep"):
        # reading never writes beside its input (a bundle may be read-only or shared)
        with tempfile.TemporaryDirectory(prefix="benanza-nsys-") as tmp:
            return parse_nsys_sqlite(export_sqlite(p, Path(tmp)))
    return parse_nsys_sqlite(p)


def export_sqlite(report: Path, folder: Path) -> Path:
    nsys = shutil.which("nsys")
    if nsys is None:
        raise ProfileFormatError(report, "reading a .nsys-rep needs Nsight Systems' `nsys` on PATH "
                                         "(scripts/install-nsys.sh installs it), or pass the .sqlite "
                                         "from `nsys export --type sqlite` instead")
    out = folder / (report.stem + ".sqlite")
    proc = subprocess.run([nsys, "export", "--type", "sqlite", "--force-overwrite", "true",
                           "--output", str(out), str(report)], capture_output=True, text=True)
    if proc.returncode != 0 or not out.exists():
        raise ProfileFormatError(report, f"`nsys export --type sqlite` failed: "
                                         f"{(proc.stderr or proc.stdout).strip()[-400:]}")
    return out


def parse_nsys_sqlite(path: str | Path) -> FrameworkTrace:
    p = Path(path)
    if not p.is_file():
        raise ProfileFormatError(p, "no such Nsight Systems export")
    with open(p, "rb") as f:
        if f.read(16) != b"SQLite format 3\x00":
            raise ProfileFormatError(p, "not an SQLite file: expected the output of "
                                        "`nsys export --type sqlite`")
    con = sqlite3.connect(f"file:{p}?mode=ro", uri=True)
    try:
        return _read(con, p)
    except sqlite3.DatabaseError as exc:
        raise ProfileFormatError(p, f"unreadable Nsight Systems export ({exc}); file truncated?") from None
    finally:
        con.close()


def _columns(con: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in con.execute(f"PRAGMA table_info({table})")}


def _read(con: sqlite3.Connection, path: Path) -> FrameworkTrace:
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if "StringIds" not in tables:
        raise ProfileFormatError(path, "no StringIds table: not an Nsight Systems SQLite export")
    strings = dict(con.execute("SELECT id, value FROM StringIds"))
    trace = FrameworkTrace(path=str(path), framework="nsys")
    callchains = _callchains(con, tables, strings)

    if "CUPTI_ACTIVITY_KIND_KERNEL" in tables:
        cols = _columns(con, "CUPTI_ACTIVITY_KIND_KERNEL")
        name_col = "demangledName" if "demangledName" in cols else "shortName"
        for start, end, corr, stream, dev, name in con.execute(
                f"SELECT start, end, correlationId, streamId, deviceId, {name_col} "
                f"FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY start"):
            trace.kernels.append(KernelEvent(strings.get(name, str(name)), _span(start, end), corr, stream, dev))

    for table, kind in (("CUPTI_ACTIVITY_KIND_RUNTIME", "cuda_runtime"), ("OSRT_API", "osrt"),
                        ("CUDNN_EVENTS", "cudnn"), ("CUBLAS_EVENTS", "cublas")):
        if table not in tables:
            continue
        cols = _columns(con, table)
        corr = "correlationId" if "correlationId" in cols else "-1"
        chain = "callchainId" if "callchainId" in cols else "NULL"
        tid = "globalTid" if "globalTid" in cols else "0"
        for start, end, name, c, ch, t in con.execute(
                f"SELECT start, end, nameId, {corr}, {chain}, {tid} FROM {table} ORDER BY start"):
            trace.api_calls.append(ApiEvent(strings.get(name, str(name)), _span(start, end), kind, c,
                                            _thread(t), callchains.get(ch, ())))

    if "NVTX_EVENTS" in tables:
        cols = _columns(con, "NVTX_EVENTS")
        text_id = "textId" if "textId" in cols else "NULL"
        for start, end, text, tid, t in con.execute(
                f"SELECT start, end, text, {text_id}, globalTid FROM NVTX_EVENTS "
                f"WHERE eventType IN {_NVTX_RANGE_TYPES} AND end IS NOT NULL ORDER BY start"):
            label = text if text is not None else strings.get(tid, "")
            trace.api_calls.append(ApiEvent(label, _span(start, end), "nvtx", -1, _thread(t)))
    trace.api_calls.sort(key=lambda a: a.span.start_us)
    trace.runs = [a.span for a in trace.api_calls if a.kind == "nvtx" and a.name.startswith("benanza_run")]
    return trace


def _span(start: int, end: int | None) -> Span:
    return Span(start / 1000.0, max(0, (end if end is not None else start) - start) / 1000.0)


def _thread(global_tid: int | None) -> int:
    # globalTid packs the pid and tid; the low 24 bits are the tid
    return int(global_tid or 0) & 0xFFFFFF


def _callchains(con: sqlite3.Connection, tables: set[str], strings: dict) -> dict[int, tuple[str, ...]]:
    out: dict[int, list[tuple[int, str]]] = {}
    for table in ("OSRT_CALLCHAINS", "CUDA_CALLCHAINS"):
        if table not in tables:
            continue
        for cid, symbol, module, depth in con.execute(f"SELECT id, symbol, module, stackDepth FROM {table}"):
            frame = f"{strings.get(symbol, '?')} ({strings.get(module, '?')})"
            out.setdefault(cid, []).append((depth, frame))
    return {cid: tuple(f for _, f in sorted(frames)) for cid, frames in out.items()}
