"""Bounds on a busy machine (issue 26, docs/measurement.md): quiet vs competing busy loops.

Usage: python benchmarks/busy.py [--work DIR] [--models inception-v1,resnet50-v1] [--threads 2]
                                 [--busy 2] [--min-time 0.2] [--repetitions 3] [--json FILE]

For each model (oneDNN, f32, the generator's default variants) it runs the benchmarks twice
into two databases, each run with `--threads` fixed so both measure the same stack:

1. quiet: nothing else started (the load seen is printed: a shared machine is rarely quiet);
2. busy: `--busy` unpinned busy-loop processes spin for the whole run.

Then `benanza analyze` on each. The target: sequential bound busy ÷ quiet ≤ 1.1 for every
model, or a refusal (exit status 3: the bound rests on contended results). For comparison it
also prints what today's estimator would have given: the same bound from each chosen variant's
`median_ms` (the median of the repetitions' means), and the estimator's cost: the run times,
the re-measurements, and an upper estimate of the per-call clock's share of a call (Google
Benchmark's per-iteration time vs the timed calls' median, over the quiet phase's uncontended
results).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benanza.measurement import MAX_CONTENTION
from benanza.zoo import build_all

BENANZA = str(Path(sys.executable).parent / "benanza")
SPIN = "import time\nend = time.time() + {seconds}\nwhile time.time() < end: pass\n"


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().strip()


def benanza(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([BENANZA, *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        sys.exit(f"benanza {' '.join(args[:2])} failed ({done.returncode}): {done.stderr[-2000:]}")
    return done


def median_bound(db: Path, analysis: dict) -> float:
    """The sequential bound from the same chosen variants' median_ms (today's estimator)."""
    with sqlite3.connect(db) as conn:
        total = 0.0
        for layer in analysis["layers"]:
            if layer["status"] == "ok":
                (ms,) = conn.execute("SELECT median_ms FROM results WHERE variant = ? ORDER BY id DESC LIMIT 1",
                                     (layer["variant"],)).fetchone()
                total += ms
    return total


def clock_share(db: Path) -> float | None:
    """Median over uncontended results of (Google Benchmark's per-iteration time − the timed calls'
    median) / the calls' median: an upper estimate of what timing each call adds to a call (it
    also holds the calls' mean-over-median skew, which a quiet machine keeps small)."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT median_ms, sample_median_ms FROM results WHERE status = 'ok' "
                            "AND sample_median_ms > 0 AND coalesce(contention, 0) <= ?", (MAX_CONTENTION,)).fetchall()
    return statistics.median((m - s) / s for m, s in rows) if rows else None


def phase(label: str, model: Path, bench: Path, db: Path, args, busy: int) -> dict:
    hogs = [subprocess.Popen([sys.executable, "-c", SPIN.format(seconds=args.busy_limit)]) for _ in range(busy)]
    try:
        time.sleep(0.5 if busy else 0)
        load_before = loadavg()
        started = time.monotonic()
        run = benanza("run", "--system", label, "--backend", "onednn", "--bench-dir", str(bench), "--db", str(db),
                      "--threads", str(args.threads), "--min-time", str(args.min_time),
                      "--repetitions", str(args.repetitions))
        seconds = time.monotonic() - started
        load_after = loadavg()
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    ana = benanza("analyze", str(model), "--system", label, "--db", str(db), "--json", check=False)
    out = {"label": label, "busy_loops": busy, "run_s": round(seconds, 1), "loadavg_before": load_before,
           "loadavg_after": load_after, "run_stderr_tail": run.stderr.strip().splitlines()[-3:],
           "analyze_exit": ana.returncode}
    with sqlite3.connect(db) as conn:
        shares = [c for (c,) in conn.execute("SELECT contention FROM results WHERE contention IS NOT NULL")]
        out["contention_median"] = round(statistics.median(shares), 3) if shares else None
        out["measurements"], out["contended"] = conn.execute(
            "SELECT count(*), sum(contended) FROM results WHERE status = 'ok'").fetchone()
    out["clock_share"] = clock_share(db)
    if ana.returncode == 0:
        (a,) = json.loads(ana.stdout)["analyses"]
        out["sequential_ms"] = a["bounds"]["sequential_ms"]
        out["sequential_median_estimator_ms"] = median_bound(db, a)
    else:
        out["refusal"] = ana.stderr.strip()[:600]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, default=Path("out/busy"))
    ap.add_argument("--models", default="inception-v1,resnet50-v1")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--busy", type=int, default=2, help="busy-loop processes in the busy phase")
    ap.add_argument("--busy-limit", type=float, default=14400.0,
                    help="seconds a busy loop spins at most (killed when its phase ends; this bounds an orphan)")
    ap.add_argument("--min-time", type=float, default=0.2)
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    names = args.models.split(",")
    paths = build_all(args.work / "models", names=names)
    report = []
    for name, model in zip(names, paths):
        bench = args.work / "bench" / name
        benanza("generate", str(model), "--out", str(bench), "--backend", "onednn", "--dtype", "f32")
        row = {"model": name}
        for label, busy in (("quiet", 0), ("busy", args.busy)):
            db = args.work / f"{name}-{label}.db"
            for stale in db.parent.glob(db.name + "*"):
                os.unlink(stale)
            row[label] = phase(label, model, bench, db, args, busy)
        q, b = row["quiet"], row["busy"]
        if "sequential_ms" in q and "sequential_ms" in b:
            row["busy_over_quiet"] = round(b["sequential_ms"] / q["sequential_ms"], 3)
            row["median_estimator_busy_over_quiet"] = round(
                b["sequential_median_estimator_ms"] / q["sequential_median_estimator_ms"], 3)
            row["verdict"] = "pass" if row["busy_over_quiet"] <= 1.1 else "FAIL: inflated bound printed"
        elif "refusal" in b and "sequential_ms" in q:
            row["verdict"] = "pass: refused under contention"
        else:
            row["verdict"] = "no quiet bound (the quiet phase was itself contended: run on an idle machine)"
        report.append(row)
        print(f"{name}: quiet {q.get('sequential_ms', 'refused')} ms ({q['run_s']} s, load {q['loadavg_before']}), "
              f"busy {b.get('sequential_ms', 'refused')} ms ({b['run_s']} s, load {b['loadavg_before']}); "
              f"busy/quiet {row.get('busy_over_quiet', '—')} (median estimator "
              f"{row.get('median_estimator_busy_over_quiet', '—')}); contended results {q['contended']}/"
              f"{b['contended']}; per-call clock adds "
              f"{'—' if q['clock_share'] is None else format(q['clock_share'], '.1%')} → {row['verdict']}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
