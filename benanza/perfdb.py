"""The performance database (paper §III-C): SQLite through sqlite-utils.

Tables (schema in ``perfdb/SCHEMA.md``): ``systems`` (one row per machine + stack),
``layers``, ``variants``, ``results`` (every measurement ever stored, never overwritten; a
lookup takes the latest per variant), ``models`` and ``occurrences``. Results are indexed by
system, dtype and layer key. The file is in WAL mode with a busy timeout, every write is one
transaction retried while another writer holds the lock, so concurrent ``benanza run``
processes lose nothing.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shlex
import shutil
import sqlite3
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from .errors import BenanzaError, FileProblem, LayerKeyError
from .layers import Layer
from .manifest import Manifest
from .measurement import MAX_SAMPLING_SECONDS, RACE_MAX_TIME, RACE_PRECISION, UNSTABLE_RSD
from .peaks import Peak, Peaks
from .problems import Problem, parse_layer_key
from .records import Result, Status, System, Variant

if TYPE_CHECKING:
    import sqlite_utils


log = logging.getLogger(__name__)

SCHEMA_VERSION = 4
DEFAULT_PATH = Path("perfdb") / "benanza.db"
ENV_VAR = "BENANZA_DB"
_BUSY_MS = 60_000
_RETRY_SECONDS = 120.0
_FULL_BYTES = 1 << 20  # less free space than this: a failed write is the disk being full

T = TypeVar("T")
S = TypeVar("S")


class DatabaseError(FileProblem):
    """A database that cannot be opened, is not Benanza's, or is newer than this Benanza."""


class BadRow(ValueError):
    """A stored row whose columns cannot be read back (edited or damaged outside Benanza)."""


def resolve_db_path(cli_value: str | None) -> Path:
    """The database to use: the --db flag, else $BENANZA_DB, else perfdb/benanza.db."""
    if cli_value:
        return Path(cli_value)
    env = os.environ.get(ENV_VAR)
    return Path(env) if env else DEFAULT_PATH


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS systems (
  stack_id TEXT PRIMARY KEY, name TEXT NOT NULL, backend TEXT NOT NULL, device TEXT NOT NULL,
  stack TEXT NOT NULL, first_seen TEXT NOT NULL, last_used TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS systems_name ON systems(name, last_used);
CREATE TABLE IF NOT EXISTS layers (
  key TEXT PRIMARY KEY, hash TEXT NOT NULL, op TEXT NOT NULL, family TEXT NOT NULL,
  params TEXT NOT NULL, inputs TEXT NOT NULL, outputs TEXT NOT NULL, macs INTEGER NOT NULL,
  flops INTEGER NOT NULL, bytes INTEGER NOT NULL, cudnn_api TEXT, onednn_primitive TEXT);
CREATE INDEX IF NOT EXISTS layers_hash ON layers(hash);
CREATE TABLE IF NOT EXISTS variants (
  name TEXT PRIMARY KEY, layer_key TEXT NOT NULL, backend TEXT NOT NULL, api TEXT NOT NULL,
  algo TEXT NOT NULL, dtype TEXT NOT NULL, layout TEXT NOT NULL, math TEXT NOT NULL,
  fusion TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS variants_layer ON variants(layer_key, dtype);
CREATE TABLE IF NOT EXISTS results (
  id INTEGER PRIMARY KEY AUTOINCREMENT, system TEXT NOT NULL, stack_id TEXT NOT NULL,
  variant TEXT NOT NULL, layer_key TEXT NOT NULL, dtype TEXT NOT NULL, status TEXT NOT NULL,
  message TEXT NOT NULL, median_ms REAL, mean_ms REAL, stddev_ms REAL, min_ms REAL,
  iterations INTEGER NOT NULL, repetitions INTEGER NOT NULL, workspace_bytes INTEGER NOT NULL,
  implementation TEXT NOT NULL, metrics TEXT NOT NULL, raw TEXT NOT NULL, command TEXT NOT NULL,
  timestamp TEXT NOT NULL, rsd REAL, unstable INTEGER NOT NULL DEFAULT 0, low_ms REAL,
  sample_median_ms REAL, sample_iqr_ms REAL, samples INTEGER NOT NULL DEFAULT 0, contention REAL,
  clean_share REAL, contended INTEGER NOT NULL DEFAULT 0, precision REAL,
  eliminated INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS results_lookup ON results(system, dtype, layer_key);
CREATE INDEX IF NOT EXISTS results_stack ON results(stack_id, variant);
CREATE TABLE IF NOT EXISTS models (
  name TEXT NOT NULL, batch_size INTEGER NOT NULL, path TEXT NOT NULL, stats TEXT NOT NULL,
  recorded TEXT NOT NULL, PRIMARY KEY (name, batch_size));
CREATE TABLE IF NOT EXISTS occurrences (
  model TEXT NOT NULL, batch_size INTEGER NOT NULL, node TEXT NOT NULL, idx INTEGER NOT NULL,
  layer_key TEXT NOT NULL, PRIMARY KEY (model, batch_size, idx));
CREATE INDEX IF NOT EXISTS occurrences_layer ON occurrences(layer_key);
CREATE TABLE IF NOT EXISTS peaks (
  stack_id TEXT NOT NULL, name TEXT NOT NULL, kind TEXT NOT NULL, dtype TEXT NOT NULL, level TEXT NOT NULL,
  value REAL NOT NULL, size INTEGER NOT NULL, implementation TEXT NOT NULL, measured_at TEXT NOT NULL,
  info TEXT NOT NULL, PRIMARY KEY (stack_id, name));
CREATE TABLE IF NOT EXISTS merge_conflicts (
  id INTEGER PRIMARY KEY AUTOINCREMENT, table_name TEXT NOT NULL, pk TEXT NOT NULL, source TEXT NOT NULL,
  row TEXT NOT NULL, merged_at TEXT NOT NULL, UNIQUE (table_name, pk, row));
"""

_PEAKS_STATEMENT = next(i for i, stmt in enumerate(_SCHEMA.split(";")) if "TABLE IF NOT EXISTS peaks" in stmt)

_TABLES = frozenset({"meta", "systems", "layers", "variants", "results", "models", "occurrences"})

_RESULT_COLUMNS = ("system", "stack_id", "variant", "layer_key", "dtype", "status", "message",
                   "median_ms", "mean_ms", "stddev_ms", "min_ms", "iterations", "repetitions",
                   "workspace_bytes", "implementation", "metrics", "raw", "command", "timestamp", "rsd",
                   "unstable", "low_ms", "sample_median_ms", "sample_iqr_ms", "samples", "contention",
                   "clean_share", "contended", "precision", "eliminated")

# Per table: primary-key columns, and the columns whose difference under one key is a merge
# conflict (bookkeeping stamps such as last_used are not).
_MERGE_TABLES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "systems": (("stack_id",), ("name", "backend", "device", "stack")),
    "layers": (("key",), ("hash", "op", "family", "params", "inputs", "outputs", "macs", "flops", "bytes",
                          "cudnn_api", "onednn_primitive")),
    "variants": (("name",), ("layer_key", "backend", "api", "algo", "dtype", "layout", "math", "fusion")),
    # the path and stats name where a file was, which differs between machines; a different
    # model under the same name shows in its occurrences
    "models": (("name", "batch_size"), ()),
    "occurrences": (("model", "batch_size", "idx"), ("node", "layer_key")),
}


@dataclass(frozen=True)
class TableCount:
    table: str
    rows: int


class PerfDB:
    """One performance database file.

    Opening for writing creates it (and its folder) if missing. ``readonly=True`` is for
    commands that only read: the file must exist, nothing is created or stamped, and a file
    in a read-only folder or on read-only media still opens.
    """

    def __init__(self, path: str | Path, *, readonly: bool = False):
        self.path = Path(path)
        self.readonly = readonly
        self._reported: set[tuple[str, str]] = set()
        try:
            if readonly:
                self.conn = _connect_readonly(self.path)
                if _check_schema(self.conn, self.path, readonly=True) < SCHEMA_VERSION:
                    self._migrate_for_reading()
                return
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(str(self.path), timeout=_BUSY_MS / 1000, isolation_level=None)
            conn.execute(f"PRAGMA busy_timeout={_BUSY_MS}")
            self.conn = conn
            self._retry(self._init_schema)
            self._enable_wal()
        except OSError as exc:
            raise DatabaseError(self.path, f"cannot create the database ({exc.strerror or exc})") from None
        except sqlite3.DatabaseError as exc:
            raise DatabaseError(self.path, _sqlite_problem(exc, self.path)) from None

    def _migrate_for_reading(self) -> None:
        """An older schema is migrated in place (as any opening for writing does), then read;
        a file that cannot be written is refused rather than misread."""
        self.conn.close()
        if not (os.access(self.path, os.W_OK) and os.access(self.path.parent, os.W_OK)):
            raise DatabaseError(self.path, f"schema version {_stored_version(self.path)} must be migrated to "
                                           f"{SCHEMA_VERSION}, and this file is read-only: copy it somewhere "
                                           f"writable and open the copy")
        PerfDB(self.path).close()
        self.conn = _connect_readonly(self.path)

    @cached_property
    def db(self) -> sqlite_utils.Database:
        """The file through sqlite-utils, for the writes and counts it makes short: loaded on
        first use, as a command that only reads (``analyze``) never needs it."""
        return _import_sqlite_utils().Database(self.conn)

    # --- plumbing ------------------------------------------------------------------------

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> PerfDB:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _retry(self, fn: Callable[[], T]) -> T:
        """Runs ``fn`` in one IMMEDIATE transaction, retrying while another writer holds the lock."""
        if self.readonly:
            raise DatabaseError(self.path, "opened read-only; this command does not write")
        deadline = time.monotonic() + _RETRY_SECONDS
        delay = 0.05
        while True:
            try:
                self.conn.execute("BEGIN IMMEDIATE")
                try:
                    out = fn()
                except BaseException:
                    self.conn.execute("ROLLBACK")
                    raise
                self.conn.execute("COMMIT")
                return out
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise DatabaseError(self.path, _sqlite_problem(exc, self.path, writing=True)) from None
                if time.monotonic() > deadline:
                    raise DatabaseError(self.path, f"still locked by another writer after "
                                                   f"{_RETRY_SECONDS:.0f}s ({exc})") from None
                log.debug("database busy, retrying in %.2fs", delay)
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
            except sqlite3.DatabaseError as exc:
                raise DatabaseError(self.path, _sqlite_problem(exc, self.path, writing=True)) from None

    def _init_schema(self) -> None:
        version = _check_schema(self.conn, self.path, readonly=False)
        if version == SCHEMA_VERSION:
            return
        conn = self.conn
        if version == 1:
            _migrate_v1(conn)
            version = 2
        if version == 2:
            _migrate_v2(conn)
            version = 3
        if version == 3:
            _migrate_v3(conn)
            return
        for stmt in _SCHEMA.split(";"):
            if stmt.strip():
                conn.execute(stmt)
        conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('schema_version', ?)",
                     (str(SCHEMA_VERSION),))

    def _enable_wal(self) -> None:
        # Outside any transaction; persistent in the file, so a no-op once set. Another
        # process holding the file can make it fail: that process then sets it.
        try:
            self.conn.execute("PRAGMA journal_mode=wal")
        except sqlite3.OperationalError as exc:
            log.debug("WAL not enabled yet (%s)", exc)

    @property
    def schema_version(self) -> int:
        return _check_schema(self.conn, self.path, readonly=True)

    # --- systems -------------------------------------------------------------------------

    def upsert_system(self, system: System) -> None:
        """Stores the system+stack, marking it the name's current stack."""
        stamp = now()

        def write() -> None:
            self.conn.execute(
                "INSERT INTO systems(stack_id, name, backend, device, stack, first_seen, last_used) "
                "VALUES (?,?,?,?,?,?,?) ON CONFLICT(stack_id) DO UPDATE SET last_used=excluded.last_used",
                (system.stack_id, system.name, system.backend, system.device,
                 json.dumps(dict(system.stack), sort_keys=True), stamp, stamp))

        self._retry(write)

    def _readable(self, table: str, rows: Iterable[T], read: Callable[[T], S],
                  label: Callable[[T], object]) -> list[S]:
        """``read`` of every row; a row it cannot read is left out and named in one warning, so
        one damaged row never costs the rest of the database."""
        good, bad = [], []
        for row in rows:
            try:
                good.append(read(row))
            except BadRow as exc:
                bad.append(f"{label(row)} ({exc})")
        bad = [b for b in bad if (table, b) not in self._reported]  # each one once per command
        self._reported.update((table, b) for b in bad)
        if bad:
            log.warning("%s: %d corrupt %s row(s) left out: %s", self.path, len(bad), table, _first_few(bad))
        return good

    def systems(self) -> list[System]:
        rows = self.conn.execute(
            "SELECT name, backend, device, stack, stack_id FROM systems ORDER BY name, last_used DESC").fetchall()
        return self._readable("systems", rows, lambda r: _system(r[:4]), lambda r: f"stack_id {r[4]!r}")

    def system(self, name: str, backend: str | None = None, stack: str | None = None) -> System | None:
        """The stack most recently used under ``name`` (and ``backend``); ``stack`` picks one by its
        id or an unambiguous prefix of it instead."""
        sql = "SELECT name, backend, device, stack, stack_id FROM systems WHERE name = ?"
        args: list = [name]
        if backend:
            sql += " AND backend = ?"
            args.append(backend)
        rows = self.conn.execute(sql + " ORDER BY last_used DESC, rowid DESC", args).fetchall()
        if stack:
            rows = [r for r in rows if r[4].startswith(stack)]
            if len(rows) > 1:
                raise DatabaseError(self.path, f"stack {stack!r} of system {name!r} is ambiguous: "
                                               f"{', '.join(r[4] for r in rows)}")
        systems = self._readable("systems", rows, lambda r: _system(r[:4]), lambda r: f"stack_id {r[4]!r}")
        if not stack:
            # a cold stack (`run --cold-cache`, `--cold-weights`) is a study of cold data, above the
            # bound the warm results give: chosen by default only where the name has no warm stack
            systems.sort(key=lambda s: "cache" in dict(s.stack))
        return systems[0] if systems else None

    def stacks(self, name: str) -> list[tuple[System, str, str]]:
        """Every stack stored under ``name``, newest first, with its first and last use."""
        rows = self.conn.execute(
            "SELECT name, backend, device, stack, first_seen, last_used, stack_id FROM systems WHERE name = ? "
            "ORDER BY last_used DESC, rowid DESC", (name,)).fetchall()
        return self._readable("systems", rows, lambda r: (_system(r[:4]), r[4], r[5]), lambda r: f"stack_id {r[6]!r}")

    # --- peaks ---------------------------------------------------------------------------

    def store_peaks(self, system: System, peaks: Peaks) -> None:
        """Stores the stack's measured peaks, replacing any it had (the ``peaks`` table: a
        database of schema 2 made before it gets it here)."""
        self.upsert_system(system)
        info = json.dumps({"threads": peaks.threads, "command": peaks.command, "source": peaks.source,
                           "unsupported": [list(u) for u in peaks.unsupported],
                           "levels": [list(lv) for lv in peaks.levels], "contended": peaks.contended},
                          sort_keys=True)
        rows = [(system.stack_id, p.name, p.kind, p.dtype, p.level, p.value, p.size, p.implementation,
                 peaks.measured_at or now(), info) for p in peaks.peaks]

        def write() -> None:
            self.conn.execute(_SCHEMA.split(";")[_PEAKS_STATEMENT])
            self.conn.execute("DELETE FROM peaks WHERE stack_id = ?", (system.stack_id,))
            self.conn.executemany("INSERT INTO peaks(stack_id, name, kind, dtype, level, value, size, "
                                     "implementation, measured_at, info) VALUES (?,?,?,?,?,?,?,?,?,?)", rows)

        self._retry(write)

    def peaks(self, system: System) -> Peaks | None:
        """The stack's stored peaks; None when they were never measured."""
        if not self.conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'peaks'").fetchone():
            return None
        rows = self.conn.execute(
            "SELECT kind, value, size, dtype, level, implementation, measured_at, info FROM peaks "
            "WHERE stack_id = ? ORDER BY kind, size, dtype", (system.stack_id,)).fetchall()
        if not rows:
            return None
        info = json.loads(rows[0][7])
        return Peaks(tuple(Peak(*r[:6]) for r in rows), tuple((str(d), str(m)) for d, m in info["unsupported"]),
                     info["threads"], rows[0][6], info["command"], info["source"],
                     tuple((str(n), int(b)) for n, b in info["levels"]), float(info["contended"]))

    # --- layers, variants, models --------------------------------------------------------

    def upsert_layers(self, layers: Iterable[Layer]) -> None:
        rows = [_layer_row(layer) for layer in layers]
        self._retry(lambda: self.db.table("layers").upsert_all(rows, pk="key") if rows else None)

    def upsert_variants(self, variants: Iterable[Variant]) -> None:
        rows = [v.to_json() for v in variants]
        self._retry(lambda: self.db.table("variants").upsert_all(rows, pk="name") if rows else None)

    def record_models(self, manifest: Manifest) -> None:
        """Stores the manifest's models, their layers and where each layer occurs."""
        self.upsert_layers(u.layer for u in manifest.layers)
        stamp = now()
        models = [{"name": m.stats.model, "batch_size": manifest.batch_size,
                   "path": m.path, "stats": json.dumps(m.to_json(), sort_keys=True), "recorded": stamp}
                  for m in manifest.models]
        occ = [{"model": o.model, "batch_size": manifest.batch_size, "node": o.node, "idx": o.index,
                "layer_key": u.layer.key} for u in manifest.layers for o in u.occurrences]

        def write() -> None:
            if models:
                self.db.table("models").upsert_all(models, pk=("name", "batch_size"))
            if occ:
                self.db.table("occurrences").upsert_all(occ, pk=("model", "batch_size", "idx"))

        self._retry(write)

    # --- results -------------------------------------------------------------------------

    def insert_results(self, system: System, results: Iterable[Result], command: str = "",
                       raw: dict | None = None) -> int:
        """Appends results (one transaction); never overwrites earlier measurements."""
        return self.insert_measurements(system, [(r, raw or {}) for r in results], command)

    def insert_measurements(self, system: System, measured: Iterable[tuple[Result, dict]],
                            command: str = "") -> int:
        """Like insert_results, with each result's own raw record (the runtime's JSON line)."""
        measured = list(measured)
        if not measured:
            return 0
        self.upsert_system(system)
        variants = [v.to_json() for v in {r.variant.name: r.variant for r, _ in measured}.values()]
        rows = [[_result_row(system, r, command, raw)[c] for c in _RESULT_COLUMNS] for r, raw in measured]
        sql = (f"INSERT INTO results({', '.join(_RESULT_COLUMNS)}) "
               f"VALUES ({', '.join('?' * len(_RESULT_COLUMNS))})")

        def write() -> None:
            self.db.table("variants").upsert_all(variants, pk="name")
            self.conn.executemany(sql, rows)

        self._retry(write)
        return len(rows)

    def results(self, system: str | System, layer_keys: Iterable[str] | None = None) -> list[Result]:
        """The latest result per variant on one system+stack (any status), of its backend only.

        A name resolves to its most recently used stack; results of other stacks or backends
        stored under the same name are never mixed in.
        """
        sys_ = system if isinstance(system, System) else self.system(system)
        if sys_ is None:
            return []
        sql = (f"SELECT {_RESULT_READ}, v.backend, v.api, v.algo, v.layout, v.math, v.fusion FROM results r "
               "JOIN variants v ON v.name = r.variant "
               "WHERE r.id IN (SELECT max(id) FROM results WHERE stack_id = ? GROUP BY variant) "
               "AND v.backend = ?")
        args: list = [sys_.stack_id, sys_.backend]
        keys = list(layer_keys) if layer_keys is not None else None
        if keys is not None:
            if not keys:
                return []
            sql += f" AND r.layer_key IN ({', '.join('?' * len(keys))})"
            args += keys
        cur = self.conn.execute(sql, args)
        names = [d[0] for d in cur.description]
        rows = [dict(zip(names, row)) for row in cur.fetchall()]
        # ordered here, as ORDER BY r.layer_key, r.variant would: SQLite's sorter copies every
        # whole row, a third of the query's time
        rows.sort(key=lambda d: (_sqlite_order(d["layer_key"]), _sqlite_order(d["variant"])))
        return self._readable("results", rows, _result, lambda d: f"id {d['id']}")

    def measured(self, system: System) -> set[str]:
        """Variant names whose latest result on exactly this system+stack is ok or unsupported.

        A failure is not a measurement: a re-run retries it (see ``failure_streaks``).
        """
        rows = self.conn.execute(
            "SELECT variant FROM results WHERE id IN (SELECT max(id) FROM results WHERE stack_id = ? "
            "GROUP BY variant) AND status != 'failed'", (system.stack_id,)).fetchall()
        return {r[0] for r in rows}

    def contended(self, system: System) -> set[str]:
        """Variant names whose latest result on exactly this system+stack is ok and contended."""
        rows = self.conn.execute(
            "SELECT variant FROM results WHERE id IN (SELECT max(id) FROM results WHERE stack_id = ? "
            "GROUP BY variant) AND status = 'ok' AND contended = 1", (system.stack_id,)).fetchall()
        return {r[0] for r in rows}

    def failure_streaks(self, system: System) -> dict[str, int]:
        """Per variant that failed last on this system+stack: how many times in a row it failed."""
        rows = self.conn.execute(
            "SELECT f.variant, count(*) FROM results f WHERE f.stack_id = ? AND f.status = 'failed' "
            "AND f.id > coalesce((SELECT max(o.id) FROM results o WHERE o.stack_id = f.stack_id "
            "AND o.variant = f.variant AND o.status != 'failed'), 0) GROUP BY f.variant",
            (system.stack_id,)).fetchall()
        return {name: n for name, n in rows}

    def missing(self, system: str | System, variants: Iterable[Variant],
                max_failures: int | None = None) -> list[Variant]:
        """Variants with no ok/unsupported result on the system's (current) stack.

        With ``max_failures``, variants that failed that many times in a row are left out.
        """
        sys_ = system if isinstance(system, System) else self.system(system)
        variants = list(variants)
        if sys_ is None:
            return variants
        done = self.measured(sys_)
        streaks = self.failure_streaks(sys_) if max_failures is not None else {}
        return [v for v in variants if v.name not in done
                and (max_failures is None or streaks.get(v.name, 0) < max_failures)]

    # --- maintenance ---------------------------------------------------------------------

    def counts(self) -> list[TableCount]:
        return [TableCount(t, self.db[t].count) for t in
                ("systems", "layers", "variants", "results", "models", "occurrences")]

    def results_frame(self, system: str | None = None, latest: bool = True):
        """Results joined with their variant and layer, as a pandas DataFrame (for export)."""
        import pandas as pd

        where = "WHERE r.system = ?" if system else ""
        if latest:
            inner = "SELECT max(id) FROM results " + ("WHERE system = ? " if system else "") + \
                    "GROUP BY stack_id, variant"
            where = (where + " AND " if where else "WHERE ") + f"r.id IN ({inner})"
        sql = ("SELECT r.id, r.system, r.stack_id, s.device, r.layer_key, l.family, l.op, r.variant, "
               "v.backend, v.api, v.algo, r.dtype, v.layout, v.math, v.fusion, r.status, r.message, "
               "r.median_ms, r.mean_ms, r.stddev_ms, r.min_ms, r.rsd, r.unstable, r.low_ms, r.sample_median_ms, "
               "r.sample_iqr_ms, r.samples, r.contention, r.clean_share, r.contended, r.precision, r.eliminated, "
               "r.iterations, r.repetitions, "
               "r.workspace_bytes, r.implementation, l.flops, l.bytes, r.metrics, r.command, r.timestamp "
               "FROM results r JOIN variants v ON v.name = r.variant "
               "LEFT JOIN layers l ON l.key = r.layer_key LEFT JOIN systems s ON s.stack_id = r.stack_id "
               f"{where} ORDER BY r.id")
        args = [system, system] if system and latest else [system] if system else []
        return pd.read_sql_query(sql, self.conn, params=args)

    def merge_from(self, other: str | Path) -> dict[str, int]:
        """Copies every row of ``other`` that this database lacks; returns rows added per table,
        plus ``conflicts``: source rows whose key is here with different content.

        Results are append-only, so a result row is only skipped when an identical one
        (same stack, variant, timestamp and latency) is already here. A conflicting row of
        another table keeps this database's row under its key and is itself kept, whole, in
        ``merge_conflicts`` (and logged): nothing of either side is lost, and merging twice
        adds nothing. A source of an older schema is migrated in a temporary copy; the source
        file is never modified.
        """
        if Path(other).resolve() == self.path.resolve():
            raise DatabaseError(other, "cannot merge a database into itself")
        if not Path(other).is_file():
            raise DatabaseError(other, "no such database file")
        with tempfile.TemporaryDirectory(prefix="benanza-merge-") as tmp:
            src = _current_schema_copy(Path(other), Path(tmp))
            _refuse_corrupt_rows(src, Path(other))
            return self._merge_attached(src, str(other))

    def _merge_attached(self, src_path: Path, label: str) -> dict[str, int]:
        added: dict[str, int] = {}
        conflicts: list[tuple[str, str, str]] = []

        def write() -> None:
            conn = self.conn
            stamp = now()
            for table, (pk, compare) in _MERGE_TABLES.items():
                on = " AND ".join(f"t.{c} = s.{c}" for c in pk)
                differs = " OR ".join(f"t.{c} IS NOT s.{c}" for c in compare) or "0"
                cur = conn.execute(f"SELECT s.* FROM src.{table} s JOIN {table} t ON {on} WHERE {differs}")
                names = [d[0] for d in cur.description]
                for row in cur.fetchall():
                    d = dict(zip(names, row))
                    key = json.dumps([d[c] for c in pk])
                    blob = json.dumps(d, sort_keys=True)
                    if conn.execute("INSERT OR IGNORE INTO merge_conflicts(table_name, pk, source, row, merged_at) "
                                    "VALUES (?,?,?,?,?)", (table, key, label, blob, stamp)).rowcount:
                        conflicts.append((table, key, blob))
                before = self.db[table].count
                conn.execute(f"INSERT OR IGNORE INTO {table} SELECT * FROM src.{table}")
                added[table] = self.db[table].count - before
            added["peaks"] = _merge_peaks(conn, label, stamp, conflicts)
            conn.execute("UPDATE systems SET last_used = max(last_used, (SELECT s.last_used FROM "
                         "src.systems s WHERE s.stack_id = systems.stack_id)) WHERE stack_id IN "
                         "(SELECT stack_id FROM src.systems)")
            cols = ", ".join(_RESULT_COLUMNS)
            before = self.db["results"].count
            conn.execute(
                f"INSERT INTO results({cols}) SELECT {cols} FROM src.results s WHERE NOT EXISTS ("
                "SELECT 1 FROM results r WHERE r.stack_id = s.stack_id AND r.variant = s.variant "
                "AND r.timestamp = s.timestamp AND r.status = s.status "
                "AND r.median_ms IS s.median_ms) ORDER BY s.id")
            added["results"] = self.db["results"].count - before

        self.conn.execute("ATTACH DATABASE ? AS src", (str(src_path),))
        try:
            self._retry(write)
        finally:
            self.conn.execute("DETACH DATABASE src")
        for table, key, blob in conflicts:
            log.warning("%s: %s row %s differs from the one here; kept in merge_conflicts: %s",
                        label, table, key, blob)
        added["conflicts"] = len(conflicts)
        return added

    def conflicts(self) -> list[tuple[str, str, str, str]]:
        """Rows merges kept aside: (table, key as JSON, source file, row as JSON)."""
        return [tuple(r) for r in self.conn.execute(  # type: ignore[misc]
            "SELECT table_name, pk, source, row FROM merge_conflicts ORDER BY id").fetchall()]


def _merge_peaks(conn: sqlite3.Connection, label: str, stamp: str, conflicts: list[tuple[str, str, str]]) -> int:
    """A stack's peaks are one measurement, replaced whole: they come from the source only for
    stacks that have none here, never mixed in row by row. The source's differing peaks of a
    stack measured here too are kept in ``merge_conflicts``, as other tables' rows are."""
    if not conn.execute("SELECT 1 FROM src.sqlite_master WHERE type = 'table' AND name = 'peaks'").fetchone():
        return 0
    conn.execute(_SCHEMA.split(";")[_PEAKS_STATEMENT])
    cur = conn.execute("SELECT s.* FROM src.peaks s WHERE s.stack_id IN (SELECT stack_id FROM peaks) AND NOT EXISTS "
                       "(SELECT 1 FROM peaks t WHERE t.stack_id = s.stack_id AND t.name = s.name AND t.value = s.value "
                       "AND t.measured_at = s.measured_at)")
    names = [d[0] for d in cur.description]
    for row in cur.fetchall():
        d = dict(zip(names, row))
        key, blob = json.dumps([d["stack_id"], d["name"]]), json.dumps(d, sort_keys=True)
        if conn.execute("INSERT OR IGNORE INTO merge_conflicts(table_name, pk, source, row, merged_at) "
                        "VALUES (?,?,?,?,?)", ("peaks", key, label, blob, stamp)).rowcount:
            conflicts.append(("peaks", key, blob))
    return conn.execute("INSERT INTO peaks SELECT * FROM src.peaks WHERE stack_id NOT IN "
                        "(SELECT stack_id FROM peaks)").rowcount


def _refuse_corrupt_rows(path: Path, label: Path) -> None:
    """A merge copies rows as they are: a damaged one would spread to every merged database."""
    conn = _connect_readonly(path)
    try:
        bad = []
        for stack_id, *row in conn.execute("SELECT stack_id, name, backend, device, stack FROM systems"):
            try:
                _system(row)
            except BadRow as exc:
                bad.append(f"systems stack_id {stack_id!r} ({exc})")
        cur = conn.execute("SELECT * FROM results ORDER BY id")
        names = [d[0] for d in cur.description]
        for row in cur:
            d = dict(zip(names, row))
            try:
                _result_columns(d)
            except BadRow as exc:
                bad.append(f"results id {d['id']} ({exc})")
    finally:
        conn.close()
    if bad:
        raise DatabaseError(label, f"{len(bad)} corrupt row(s), nothing merged: {_first_few(bad)}; delete or "
                                   f"repair them in this file first")


def _first_few(items: list[str], n: int = 5) -> str:
    return "; ".join(items[:n]) + (" …" if len(items) > n else "")


def _current_schema_copy(path: Path, tmp: Path) -> Path:
    """``path`` itself when its schema is current, else a migrated copy under ``tmp``; the
    source is validated read-only and never written."""
    if _stored_version(path) == SCHEMA_VERSION:
        return path
    copy = tmp / path.name
    src_conn, dst = _connect_readonly(path), sqlite3.connect(copy)
    try:
        src_conn.backup(dst)
    finally:
        src_conn.close()
        dst.close()
    PerfDB(copy).close()  # migrates the copy
    return copy


# --- opening ---------------------------------------------------------------------------

def _connect_readonly(path: Path) -> sqlite3.Connection:
    """A read-only connection that creates nothing (no folder, no file, no journal)."""
    if not path.is_file():
        what = "is a folder, not a database file" if path.is_dir() else "no such database file"
        raise DatabaseError(path, what + " (reading commands never create one; `benanza run` does)")
    uri = "file:" + urllib.parse.quote(str(path.resolve())) + "?mode=ro"
    conn = sqlite3.connect(uri, uri=True, timeout=_BUSY_MS / 1000, isolation_level=None)
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return conn
    except sqlite3.OperationalError as exc:
        conn.close()
        # A WAL database needs its -shm file; in a read-only folder without one, SQLite can
        # only read the file as immutable. That is only correct while nobody writes it, so
        # only where nobody can: never for a folder a `benanza run` could be writing into.
        if os.access(path.parent, os.W_OK):
            raise
        log.info("%s: %s; reading the file as immutable", path, exc)
    conn = sqlite3.connect(uri + "&immutable=1", uri=True, isolation_level=None)
    conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    return conn


def writer_active(path: Path) -> bool:
    """Whether a WAL holds commits not yet in the main file: a writer is running (or died)."""
    wal = path.with_name(path.name + "-wal")
    return wal.exists() and wal.stat().st_size > 0


def check_idle_file(path: Path) -> int:
    """The schema version of a database no writer is using, validated without creating its
    -shm/-wal files (a read-only connection to a WAL database creates and leaves them)."""
    if not path.is_file():
        raise DatabaseError(path, "no such database file")
    conn = sqlite3.connect("file:" + urllib.parse.quote(str(path.resolve())) + "?immutable=1", uri=True)
    try:
        return _check_schema(conn, path, readonly=True)
    except sqlite3.DatabaseError as exc:
        raise DatabaseError(path, _sqlite_problem(exc, path)) from None
    finally:
        conn.close()


def _check_schema(conn: sqlite3.Connection, path: Path, readonly: bool) -> int:
    """The file's schema version, validated; 0 for an empty file that may still get a schema.

    Every way a file can fail to be a usable Benanza database is one DatabaseError line.
    """
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if not tables:
        if readonly:
            raise DatabaseError(path, "empty file, not a Benanza performance database")
        return 0
    if "meta" not in tables:
        raise DatabaseError(path, "not a Benanza performance database (no meta table)")
    row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
    if row is None:
        raise DatabaseError(path, "not a Benanza performance database (meta has no schema_version)")
    try:
        version = int(row[0])
    except (TypeError, ValueError):
        raise DatabaseError(path, f"schema_version {row[0]!r} is not an integer") from None
    if version > SCHEMA_VERSION:
        raise DatabaseError(path, f"schema version {version} is newer than this Benanza understands "
                                  f"({SCHEMA_VERSION}); upgrade benanza")
    if version < 1:
        raise DatabaseError(path, f"schema version {version} predates every version Benanza can read")
    absent = sorted(_TABLES - tables) if version == SCHEMA_VERSION else []
    if absent:
        raise DatabaseError(path, f"schema version {version} but tables missing: {', '.join(absent)}")
    return version


def _stored_version(path: Path) -> int:
    """The validated schema version of the file, read without changing it."""
    try:
        conn = _connect_readonly(path)
        try:
            return _check_schema(conn, path, readonly=True)
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        raise DatabaseError(path, _sqlite_problem(exc, path)) from None


def _sqlite_problem(exc: sqlite3.Error, path: Path, writing: bool = False) -> str:
    """``writing``: the error came from a write to a database that opened fine."""
    text = str(exc)
    if "disk is full" in text or _disk_full(path):  # "disk I/O error" when no -shm file can be made
        return f"cannot write: the disk holding it is full ({text})"
    if "readonly" in text or "read-only" in text:
        return f"cannot write: the file or its folder is read-only ({text})"
    if "unable to open" in text:
        return f"cannot open ({text}): check that the folder exists and is accessible"
    if writing and "malformed" not in text and "not a database" not in text:
        return f"cannot write ({text})"
    return f"not a usable SQLite database ({text})"


def _disk_full(path: Path) -> bool:
    try:
        return shutil.disk_usage(path.absolute().parent).free < _FULL_BYTES
    except OSError:
        return False


def missing_command(models: Iterable[str], system: str, backend: str, *, bench_dir: str = "out/bench",
                    batch_size: int = 1, db: str | None = None, dtype: str | None = None,
                    input_shapes: Iterable[tuple[str, tuple[int, ...]]] = (),
                    input_values: Iterable[tuple[str, tuple[float, ...]]] = (), input_data: str | None = None,
                    generate_flags: Iterable[str] = (), run_flags: Iterable[str] = ()) -> str:
    """The exact shell command that generates and runs the benchmarks a lookup missed: the same
    input shapes, input values and input data the models were processed with (they decide the
    shapes by execution and the branches taken, so the layers), the dtype the analysis asked for,
    and the variant options (``generate_flags``) the lookup expected."""
    models = [str(m) for m in models]
    gen = ["benanza", "generate", *models, "--out", bench_dir, "--backend", backend, *generate_flags]
    if batch_size != 1:
        gen += ["--batch-size", str(batch_size)]
    for name, shape in input_shapes:
        gen += ["--input-shape", f"{name}={'x'.join(str(d) for d in shape)}"]
    for name, values in input_values:
        gen += ["--input-value", f"{name}={','.join(f'{v:.17g}' for v in values)}"]
    if input_data is not None:
        gen += ["--input-data", input_data]
    if dtype is not None:
        gen += ["--dtype", dtype]
    run = ["benanza", "run", "--system", system, "--backend", backend, "--bench-dir", bench_dir]
    if db:
        run += ["--db", db]
    return shlex.join(gen) + " && " + shlex.join([*run, *run_flags])


def remeasure_flags(threads: int | None = None) -> list[str]:
    """The `benanza run` flags that measure again exactly the results the database flags
    contended (at ``threads``, the stack's, so the new results land on the same stack)."""
    return ["--remeasure-contended"] + (["--threads", str(threads)] if threads else [])


def full_sampling_flags(screened: Iterable[Result], threads: int | None = None) -> list[str]:
    """The `benanza run` flags that measure exactly ``screened`` (results racing stopped at their
    screening estimate) again, each sampled in full: no race among them, at the --precision and
    --max-time their full sampling would have had (the fixed budget where a result does not say),
    at ``threads``, the stack's. The new results are the latest, so they are what analyses read."""
    screened = list(screened)
    names = sorted({r.variant.name for r in screened})
    flags = ["--force", "--filter", "^(?:" + "|".join(re.escape(n) for n in names) + ")$", "--no-race"]
    precisions = [r.metrics[RACE_PRECISION] for r in screened if r.metrics.get(RACE_PRECISION)]
    if precisions:  # the strictest budget any of them had
        max_time = max(r.metrics.get(RACE_MAX_TIME) or MAX_SAMPLING_SECONDS for r in screened)
        flags += ["--precision", repr(float(min(precisions))), "--max-time", repr(float(max_time))]
    return flags + (["--threads", str(threads)] if threads else [])


# --- schema migration --------------------------------------------------------------------

def _migrate_v1(conn: sqlite3.Connection) -> None:
    """v1 → v2 in the caller's transaction; every row is kept.

    v2 stores each result's dispersion (``rsd``, ``unstable``) and a stack id that includes the
    system name. A v1 stack row was shared by every name that stored results on it, so each
    (name, stack) pair found in the results becomes its own system row and its results move to
    that row's id.
    """
    conn.execute("ALTER TABLE results ADD COLUMN rsd REAL")
    conn.execute("ALTER TABLE results ADD COLUMN unstable INTEGER NOT NULL DEFAULT 0")
    conn.execute("UPDATE results SET rsd = stddev_ms / median_ms WHERE status = 'ok' AND median_ms > 0 "
                 "AND stddev_ms IS NOT NULL")
    conn.execute("UPDATE results SET unstable = 1 WHERE rsd > ?", (UNSTABLE_RSD,))
    old = {r[0]: r for r in conn.execute(
        "SELECT stack_id, name, backend, device, stack, first_seen, last_used FROM systems").fetchall()}
    pairs = {(sid, name): (first, last) for name, sid, first, last in conn.execute(
        "SELECT system, stack_id, min(timestamp), max(timestamp) FROM results GROUP BY system, stack_id")}
    for sid, (_, name, _, _, _, first, last) in old.items():
        prev = pairs.get((sid, name))
        pairs[(sid, name)] = (min(first, prev[0]), max(last, prev[1])) if prev else (first, last)
    conn.execute("DELETE FROM systems")
    for (sid, name), (first, last) in sorted(pairs.items()):
        if sid not in old:
            log.warning("migration: results of %r name stack %s, which has no systems row; kept as is",
                        name, sid)
            continue
        _, _, backend, device, stack, _, _ = old[sid]
        new = _system((name, backend, device, stack)).stack_id
        conn.execute("INSERT INTO systems(stack_id, name, backend, device, stack, first_seen, last_used) "
                     "VALUES (?,?,?,?,?,?,?)", (new, name, backend, device, stack, first, last))
        conn.execute("UPDATE results SET stack_id = ? WHERE system = ? AND stack_id = ?", (new, name, sid))
    for stmt in _SCHEMA.split(";"):  # the tables v1 lacked
        if stmt.strip():
            conn.execute(stmt)
    conn.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")


def _migrate_v2(conn: sqlite3.Connection) -> None:
    """v2 → v3 in the caller's transaction: each result's per-call sample summary and the
    contention it was measured under (docs/measurement.md). Older rows have neither: their
    bound is their median, as before, and their contention is unknown (NULL), not zero."""
    for column in ("low_ms REAL", "sample_median_ms REAL", "sample_iqr_ms REAL",
                   "samples INTEGER NOT NULL DEFAULT 0", "contention REAL", "clean_share REAL",
                   "contended INTEGER NOT NULL DEFAULT 0"):
        conn.execute(f"ALTER TABLE results ADD COLUMN {column}")
    conn.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version'")


def _migrate_v3(conn: sqlite3.Connection) -> None:
    """v3 → v4 in the caller's transaction: the precision adaptive sampling reached (NULL for
    every older row: measured with the fixed budget, their stability is their ``rsd``) and
    whether racing eliminated the variant (0: older rows were measured in full)."""
    conn.execute("ALTER TABLE results ADD COLUMN precision REAL")
    conn.execute("ALTER TABLE results ADD COLUMN eliminated INTEGER NOT NULL DEFAULT 0")
    conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))


def _import_sqlite_utils():
    """sqlite-utils imports pandas (and through it pyarrow) only to accept DataFrames and Timestamps,
    which Benanza never passes it: a fifth of a second of every command's start-up. Hide pandas
    while sqlite-utils loads, unless something already imported it."""
    import sys

    hide = "pandas" not in sys.modules
    if hide:
        sys.modules["pandas"] = None  # type: ignore[assignment]  # import raises ImportError
    try:
        import sqlite_utils
    finally:
        if hide:
            del sys.modules["pandas"]
    return sqlite_utils


# --- row conversion ----------------------------------------------------------------------

def _json(text: object, what: str) -> dict:
    """A JSON object column; BadRow for anything else (NaN included: it is not JSON)."""
    def refuse(constant: str) -> None:
        raise ValueError(constant)

    try:
        value = json.loads(text, parse_constant=refuse)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise BadRow(f"{what} is not JSON: {str(text)[:60]!r}") from None
    if not isinstance(value, dict):
        raise BadRow(f"{what} is not a JSON object: {str(text)[:60]!r}")
    return value


def _system(row) -> System:
    name, backend, device, stack = row
    items = _json(stack, "stack").items()
    if not all(isinstance(v, str) for _, v in items):
        raise BadRow(f"stack holds values that are not strings: {stack[:60]!r}")
    return System(name, backend, device, tuple(sorted(items)))


def _layer_row(layer: Layer) -> dict:
    d = layer.to_json()
    return {"key": layer.key, "hash": layer.hash, "op": layer.op, "family": layer.family,
            "params": json.dumps(d["problem"], sort_keys=True), "inputs": json.dumps(d["inputs"]),
            "outputs": json.dumps(d["outputs"]), "macs": layer.macs, "flops": layer.flops,
            "bytes": layer.bytes, "cudnn_api": layer.cudnn_api, "onednn_primitive": layer.onednn_primitive}


def _result_row(system: System, r: Result, command: str, raw: dict | None) -> dict:
    return {"system": system.name, "stack_id": system.stack_id, "variant": r.variant.name,
            "layer_key": r.variant.layer_key, "dtype": r.variant.dtype, "status": r.status.value,
            "message": r.message, "median_ms": r.median_ms, "mean_ms": r.mean_ms,
            "stddev_ms": r.stddev_ms, "min_ms": r.min_ms, "iterations": r.iterations,
            "repetitions": r.repetitions, "workspace_bytes": r.workspace_bytes,
            "implementation": r.implementation, "metrics": json.dumps(r.metrics, sort_keys=True),
            "raw": json.dumps(raw or {}, sort_keys=True), "command": command,
            "timestamp": r.timestamp or now(), "rsd": r.rsd, "unstable": int(r.unstable), "low_ms": r.low_ms,
            "sample_median_ms": r.sample_median_ms, "sample_iqr_ms": r.sample_iqr_ms, "samples": r.samples,
            "contention": r.contention, "clean_share": r.clean_share, "contended": int(r.contended),
            "precision": r.precision, "eliminated": int(r.eliminated)}


# The results columns a Result is read from (and ``variant``, which orders them): every analysis
# reads thousands of rows, and ``raw`` (the runtime's whole JSON line) and ``command`` are long
# texts no Result holds.
_RESULT_READ = ", ".join(f"r.{c}" for c in (
    "id", "variant", "system", "layer_key", "dtype", "status", "message", "median_ms", "mean_ms", "stddev_ms", "min_ms",
    "iterations", "repetitions", "workspace_bytes", "implementation", "metrics", "timestamp", "unstable", "low_ms",
    "sample_median_ms", "sample_iqr_ms", "samples", "contention", "clean_share", "contended", "precision",
    "eliminated"))


def _sqlite_order(value: object) -> tuple[int, object]:
    """Sorts values as SQLite orders a column (NULL, numbers, text by its UTF-8 bytes, which is
    Python's order of str, then blobs), whatever types a damaged row holds."""
    if value is None:
        return 0, 0
    if isinstance(value, (int, float)):
        return 1, value
    return (2, value) if isinstance(value, str) else (3, value)


def _result_columns(d: dict) -> tuple[Status, Problem, dict]:
    """Checks a results row's own columns as a run writes them; its status, problem and metrics."""
    try:
        status = Status.of(d["status"], "status")
    except BenanzaError:
        raise BadRow(f"unknown status {d['status']!r}") from None
    for key in ("median_ms", "mean_ms", "stddev_ms", "min_ms"):
        x = d[key]
        if x is not None and (isinstance(x, (bool, str, bytes)) or not math.isfinite(x) or x < 0
                              or (x == 0 and key != "stddev_ms")):
            raise BadRow(f"{key} is {x!r}, not a time in ms")
    x = d["precision"]
    if x is not None and (isinstance(x, (bool, str, bytes)) or not math.isfinite(x) or x < 0):
        raise BadRow(f"precision is {x!r}, not a relative half-width")
    for key in ("iterations", "repetitions", "workspace_bytes"):
        if not isinstance(d[key], int) or d[key] < 0:
            raise BadRow(f"{key} is {d[key]!r}, not a count")
    if status is Status.OK and d["median_ms"] is None:
        raise BadRow("status ok without median_ms")
    for key in ("system", "message", "implementation", "timestamp"):
        if not isinstance(d[key], str):
            raise BadRow(f"{key} is {d[key]!r}, not text")
    try:
        problem, _ = parse_layer_key(d["layer_key"])
    except (LayerKeyError, TypeError, AttributeError):
        raise BadRow(f"layer_key {d['layer_key']!r} does not parse") from None
    # most rows hold no metrics: their text needs no parser
    return status, problem, {} if d["metrics"] == "{}" else _json(d["metrics"], "metrics")


def _result(d: dict) -> Result:
    # The row's dtype column is the variant's; rows written before variants were keyed by their
    # own dtype hold an f16 variant under the layer's ``…_f32`` key, which this reads correctly.
    status, problem, metrics = _result_columns(d)
    variant = Variant(problem, d["backend"], d["api"], d["algo"], d["dtype"], d["layout"], d["math"], d["fusion"])
    return Result(variant=variant, system=d["system"], status=status, message=d["message"],
                  median_ms=d["median_ms"], mean_ms=d["mean_ms"], stddev_ms=d["stddev_ms"],
                  min_ms=d["min_ms"], iterations=d["iterations"], repetitions=d["repetitions"],
                  workspace_bytes=d["workspace_bytes"], implementation=d["implementation"],
                  metrics=metrics, timestamp=d["timestamp"], unstable=bool(d["unstable"]),
                  low_ms=d["low_ms"], sample_median_ms=d["sample_median_ms"], sample_iqr_ms=d["sample_iqr_ms"],
                  samples=d["samples"], contention=d["contention"], clean_share=d["clean_share"],
                  contended=bool(d["contended"]), precision=d["precision"], eliminated=bool(d["eliminated"]))

