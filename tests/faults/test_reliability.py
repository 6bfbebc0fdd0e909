"""The Reliability table of docs/reliability.md, recomputed: every fault case of the suite run
again as a user meets it, each outcome classified from what the command printed and what the
database holds, and the table compared with the documented one line by line.

Outcomes: *completed* (exit 0, doing what it promises: a damaged row named and the rest read),
*clean error* (one `error:` line, non-zero exit), *wrong* (neither: the promise failed without a
crash, e.g. a terminal command printed raw), *traceback*, *hang* (killed after its time limit).
*Lost rows*: good rows a command did not store or show; *duplicated rows*: rows stored twice.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from faultprobe import Probe
from helpers import REPO

from benanza.perfdb import PerfDB
from tests.faults.test_data import (  # noqa: F401
    CORRUPTIONS,
    TERMINAL_NAMES,
    bundle_probes,
    corrupt_row_probes,
    measured,
    output_probes,
    serve_probe,
    terminal_probes,
)
from tests.faults.test_inputs import (
    bench_path_probes,
    campaign_probes,
    invalid_models,
    invalid_utf8_model,
    number_probes,
)
from tests.faults.test_run import bench, concurrent_runs, execute, full_database_run, variants  # noqa: F401 - fixtures

DOC = REPO / "docs" / "reliability.md"
COLUMNS = ("cases tried", "completed", "clean errors", "wrong", "tracebacks", "hangs", "lost rows",
           "duplicated rows")


@dataclass(frozen=True)
class Outcome:
    kind: str  # completed, clean, wrong, traceback, hang
    lost: int = 0
    duplicated: int = 0


def judged(p: Probe, promise: bool, expect_error: bool) -> Outcome:
    """How a command ended: ``promise`` is whether it did what it must (checked by the caller)."""
    if p.hung:
        return Outcome("hang")
    if p.traceback:
        return Outcome("traceback")
    if expect_error:
        return Outcome("clean" if p.clean_error and promise else "wrong")
    return Outcome("completed" if p.rc == 0 and promise else "wrong")


def row_counts(rows: list[tuple], expected: set[tuple]) -> tuple[int, int]:
    """Lost and duplicated among stored ``rows`` (system, variant) against what had to be stored."""
    seen = Counter(rows)
    return len(expected - set(seen)), sum(n - 1 for n in seen.values() if n > 1)


def concurrent(tmp_path: Path, save) -> list[Outcome]:
    probes, rows, names = concurrent_runs(tmp_path, save)
    expected = {(f"s{i}", n) for i in range(4) for n in names}
    lost, dup = row_counts([(s, v) for s, v, _ in rows], expected)
    out = [judged(p, True, expect_error=False) for p in probes]
    return [Outcome(o.kind, lost if i == 0 else 0, dup if i == 0 else 0) for i, o in enumerate(out)]


def result_lines(tmp_path: Path, variants) -> list[Outcome]:  # noqa: F811
    """Each bad result line of the stand-in (13 kinds), in the runs that carry them."""
    out = []
    for offset, count in ((0, 6), (6, 5), (11, 2)):
        folder = tmp_path / f"lines{offset}"
        folder.mkdir()
        bad = [v.name for v in variants[:count]]
        _, results, _, leaked, _ = execute(folder, variants, "malformed", ",".join(bad), offset=offset)
        with PerfDB(folder / "r.db", readonly=True) as db:
            rows = [(s, v) for s, v in db.db.conn.execute("SELECT system, variant FROM results")]
        lost, dup = row_counts(rows, {("box", v.name) for v in variants})
        for i, name in enumerate(bad):
            kept = "BENANZA_RESULT" in results[name].message and results[name].status.value == "failed"
            out.append(Outcome("completed" if kept and not leaked else "wrong", lost if i == 0 else 0,
                               dup if i == 0 else 0))
    return out


def full_database(bench, tmp_path: Path) -> list[Outcome]:  # noqa: F811
    done, stored = full_database_run(bench, tmp_path)
    said = re.search(r"; (\d+) results of this run were stored before it", done.stdout)
    if "Traceback" in done.stderr:
        return [Outcome("traceback")]
    told = said is not None and done.returncode == 0
    return [Outcome("clean" if told else "wrong", lost=abs(stored - int(said.group(1))) if said else stored)]


def damaged_databases(measured, tmp_path: Path) -> list[Outcome]:  # noqa: F811
    with PerfDB(measured / "r.db", readonly=True) as db:
        good = {r.variant.name for r in db.results("box")}
    out = []
    for case in sorted(CORRUPTIONS):
        folder = tmp_path / case
        folder.mkdir()
        path, target, probes = corrupt_row_probes(measured, folder, case)
        why = CORRUPTIONS[case][1]
        bad_id = {"metrics": 1, "metrics_nan": 1, "status": 2, "median_text": 3, "median_negative": 4}.get(case)
        with sqlite3.connect(path) as conn:  # the damaged row's variant; the stack: all of them
            bad = {conn.execute("SELECT variant FROM results WHERE id = ?", (bad_id,)).fetchone()[0]} \
                if bad_id else good
        conn.close()
        for what, p in probes.items():
            if what == "merge":
                with PerfDB(target, readonly=True) as merged:
                    nothing = merged.counts()[3].rows == 0
                out.append(judged(p, nothing and why in p.error, expect_error=True))
            elif case == "stack" and what in ("list", "analyze"):  # the one system is unreadable: named, then
                out.append(judged(p, why in p.err, expect_error=True))  # "not in the database"
            elif what == "list":
                shown = {ln.split("│")[1].strip() for ln in p.out.splitlines() if ln.startswith("│")}
                o = judged(p, why in p.err, expect_error=False)
                out.append(Outcome(o.kind, lost=len((good - bad) - shown)))
            elif what == "analyze":
                try:
                    json.loads(p.out, parse_constant=lambda c: 1 / 0)
                    valid = True
                except (ValueError, ZeroDivisionError):
                    valid = False
                out.append(judged(p, valid and why in p.err, expect_error=False))
            else:  # db info: the systems table, the damaged stack named
                out.append(judged(p, case != "stack" or why in p.err, expect_error=False))
    return out


def unwritable_outputs(measured, tmp_path: Path) -> list[Outcome]:  # noqa: F811
    probes = output_probes(measured, tmp_path)
    left = [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]
    return [judged(p, named in p.error and not left, expect_error=True) for p, named in probes.values()]


def hostile_bundles(measured, tmp_path: Path) -> list[Outcome]:  # noqa: F811
    out = []
    for case, (p, folder) in bundle_probes(measured, tmp_path).items():
        if case in ("nsys report", "no model_identity"):
            untouched = sorted(f.name for f in folder.iterdir()) in (["nsys.nsys-rep", "profile.json"],
                                                                      ["profile.json"])
            out.append(judged(p, untouched, expect_error=False))
        else:
            out.append(judged(p, str(folder / "profile.json") in p.error, expect_error=True))
    return out


def terminal_names(tmp_path: Path) -> list[Outcome]:
    probes = terminal_probes(tmp_path)
    rc, raw = probes["tty"]
    tty = Probe(("analyze",), rc, raw.decode(errors="replace"), "")
    out = []
    for p, text in ((tty, raw), (probes["pipe"], probes["pipe"].out.encode())):
        escaped = not any(n.encode() in text or n[1:].encode() in text for n in TERMINAL_NAMES.values())
        out.append(judged(p, escaped, expect_error=False))
    return out


def serving(measured, tmp_path: Path) -> list[Outcome]:  # noqa: F811
    probe = serve_probe(measured, tmp_path)
    with sqlite3.connect(measured / "r.db") as conn:
        ids = [r[0] for r in conn.execute("SELECT id FROM results")]
    conn.close()
    served = [r["id"] for r in probe["served"] or []]
    ok = probe["left"] == ["--root"] and "auth-token" not in probe["output"]
    return [Outcome("completed" if ok and served else "wrong", lost=len(set(ids) - set(served)))]


def campaigns(tmp_path: Path) -> list[Outcome]:
    return [judged(p, "sbatch:" not in p.err.split("error:")[0], expect_error=True)
            for p in campaign_probes(tmp_path).values()]


def bench_paths(tmp_path: Path) -> list[Outcome]:
    return [judged(p, "path contains" in p.error, expect_error=True) for p in bench_path_probes(tmp_path).values()]


def numbers(tmp_path: Path) -> list[Outcome]:
    return [judged(p, "not a finite number" in p.error, expect_error=True)
            for p in number_probes(tmp_path).values()]


def models(tmp_path: Path) -> list[Outcome]:
    from faultprobe import benanza

    cases = dict(invalid_models(tmp_path))
    cases["invalid UTF-8 node name"] = (invalid_utf8_model(tmp_path), "not valid UTF-8")
    return [judged(p, why in p.error, expect_error=True) for path, why in cases.values()
            for p in [benanza("generate", str(path), "--backend", "onednn", "--out", str(tmp_path / path.stem))]]


def table(rows: dict[str, list[Outcome]]) -> str:
    lines = ["| category | " + " | ".join(COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for name, outcomes in rows.items():
        kinds = Counter(o.kind for o in outcomes)
        cells = [len(outcomes), kinds["completed"], kinds["clean"], kinds["wrong"], kinds["traceback"],
                 kinds["hang"], sum(o.lost for o in outcomes), sum(o.duplicated for o in outcomes)]
        lines.append(f"| {name} | " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def documented() -> str:
    text = DOC.read_text()
    return "\n".join(ln for ln in text.splitlines() if ln.startswith("|"))


@pytest.mark.slow  # every probe of the fault suite again: builds, runs, a campaign
def test_reliability_table_is_what_the_fault_suite_measures(tmp_path, save, bench, variants, measured):  # noqa: F811
    def at(name: str) -> Path:
        (tmp_path / name).mkdir()
        return tmp_path / name

    rows = {
        "concurrent `run` on one unbuilt bench dir (4 processes)": concurrent(at("concurrent"), save),
        "result lines a benchmark binary lies in": result_lines(at("lines"), variants),
        "a database that stops taking writes mid-run": full_database(bench, at("full")),
        "damaged database rows (info, list, analyze, merge)": damaged_databases(measured, at("damaged")),
        "outputs that cannot be written": unwritable_outputs(measured, at("outputs")),
        "hostile profile bundles": hostile_bundles(measured, at("bundles")),
        "terminal commands in node names (TTY and pipe)": terminal_names(at("terminal")),
        "`db serve` of a file named like a flag": serving(measured, at("serve")),
        "`campaign submit` errors": campaigns(at("campaign")),
        "bench paths CMake reads as syntax": bench_paths(at("paths")),
        "non-finite numbers on the command line": numbers(at("numbers")),
        "invalid models": models(at("models")),
    }
    measured_table = table(rows)
    assert measured_table == documented(), "docs/reliability.md differs from what was measured:\n" + measured_table
    for name, outcomes in rows.items():
        assert all(o.kind in ("completed", "clean") for o in outcomes), (name, outcomes)
        assert sum(o.lost for o in outcomes) == 0 and sum(o.duplicated for o in outcomes) == 0, name
