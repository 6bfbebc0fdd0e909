"""How long `benanza run` takes and in what order it measures: the dry run's time estimate and the
progress line's time left (docs/run.md)."""

from __future__ import annotations

import json
import math
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import FIXTURES, generated_conv_net

from benanza.cli import _duration, main
from benanza.generator import read_variants
from benanza.perfdb import PerfDB
from benanza.records import Result, Status, System, Variant
from benanza.resources import runtime_dir
from benanza.runner import RunOptions, RunSummary, _execute, _left, race_bounds, run


@pytest.fixture(scope="module")
def bench(tmp_path_factory) -> Path:
    return generated_conv_net(tmp_path_factory.mktemp("bench"))


def test_dry_run_counts_what_is_missing_and_estimates_from_the_budget_and_earlier_results(bench, tmp_path):
    """A variant measured before on the system (another stack: the stand-in's) is timed from its
    latency: an unsupported one costs nothing, one whose call outlasts --min-time runs each
    repetition and the sizing run for one call at least; the others get the fixed budget."""
    variants = read_variants(bench / "onednn")
    db = tmp_path / "r.db"
    refused, slow = variants[0], variants[1]
    with PerfDB(db) as pdb:
        pdb.insert_results(System("box", "onednn", "stand-in", (("threads", "1"),)), [
            Result(refused, "box", Status.UNSUPPORTED, message="no"),
            Result(slow, "box", Status.OK, median_ms=900.0, low_ms=800.0, samples=3)])
    options = RunOptions(dry_run=True, force=True, min_time=0.1, repetitions=3)
    summary = run(bench, "box", "onednn", db, options)
    assert sorted(summary.to_run) == sorted(v.name for v in variants) and summary.from_earlier == 2
    assert summary.expected[refused.name] == 0.0
    assert summary.expected[slow.name] >= (3 + 1) * 0.8  # no call of it is faster than its low percentile
    others = [summary.expected[v.name] for v in variants[2:]]
    # Google Benchmark: each repetition lasts at least --min-time (it aims at 1.4×), sizing adds less than one more
    assert all(3 * 0.1 <= t <= 5 * 0.1 for t in others) and len(set(others)) == 1
    out = CliRunner().invoke(main, ["run", "--system", "box", "--backend", "onednn", "--bench-dir", str(bench),
                                    "--db", str(db), "--dry-run", "--force", "--min-time", "0.1"])
    assert out.exit_code == 0, out.output
    assert f"{len(variants)} of {len(variants)} benchmarks would run" in out.output
    assert f"expected time: about {_duration(sum(summary.expected.values()))} of timed loops" in out.output
    assert f"2 of {len(variants)} timed from earlier results of box" in out.output
    # sampling adaptively: each at least its fewest samples (20 calls, 0.01 s), at most --max-time
    sampled = run(bench, "box", "onednn", db, RunOptions(dry_run=True, force=True, precision=0.02, max_time=0.3))
    assert sampled.expected[refused.name] == 0.0 and sampled.expected[slow.name] == 0.3  # 20 calls of 0.8 s: capped
    assert all(sampled.expected[v.name] == 0.01 for v in variants[2:])  # conv_net's kernels: unknown here
    assert sampled.at_most_s == pytest.approx((len(variants) - 1) * 0.3 * 1.25)  # racing's screening pass first


def test_the_cli_samples_onednn_adaptively_unless_a_fixed_budget_is_given(bench, tmp_path):
    """`benanza run` with no budget flags samples to --precision 0.02 and races; --min-time or
    --repetitions select the fixed budget; an explicit --precision wins over them."""
    variants = read_variants(bench / "onednn")

    def dry(*flags: str) -> str:
        out = CliRunner().invoke(main, ["run", "--system", "box", "--backend", "onednn", "--bench-dir", str(bench),
                                        "--db", str(tmp_path / "r.db"), "--dry-run", *flags])
        assert out.exit_code == 0, out.output
        return out.output

    limit = _duration(len(variants) * 0.5 * 1.25)  # each at --max-time, after racing's screening
    assert f"to at most {limit} (each sampling --max-time 0.5 s) at --precision 0.02" in dry()
    assert "of timed loops at --min-time 0.05 s × 3 repetitions" in dry("--min-time", "0.05")
    assert "of timed loops at --min-time 0.2 s × 5 repetitions" in dry("--repetitions", "5")
    assert "at --precision 0.05" in dry("--precision", "0.05", "--min-time", "0.05")


def test_time_left_scales_the_expectation_by_how_the_finished_ones_went(monkeypatch):
    """Before anything finished, the expected time of all; later, the expected time of those left
    times the ratio of the time spent to the expected time of those finished."""
    import benanza.runner as runner

    now = [10.0]
    monkeypatch.setattr(runner.time, "monotonic", lambda: now[0])
    names = ["a", "b", "c", "d"]
    expected = {"a": 1.0, "b": 3.0, "c": 0.0, "d": 2.0}
    first: list[float] = []
    assert _left(names, set(), expected, first) == 6.0
    now[0] = 16.0  # a and b finished after 6 s: twice their expected 4 s
    assert _left(names, {"a", "b"}, expected, first) == pytest.approx(3.0)  # 2 s expected left × 6 / 4
    assert _left(names, {"a", "b"}, {}, first) is None


def test_benchmarks_run_in_a_seeded_shuffle_that_a_resumed_run_continues(bench, tmp_path):
    """The order spreads each layer's variants over the run (the generated order keeps them
    together), is the same for the same seed and another for another, and a run resumed after
    the first half was stored measures exactly the second half, in the same order."""
    generated = [v.name for v in read_variants(bench / "onednn")]
    db = tmp_path / "r.db"
    order = run(bench, "box", "onednn", db, RunOptions(dry_run=True)).to_run
    assert sorted(order) == sorted(generated) and order != generated
    assert run(bench, "box", "onednn", db, RunOptions(dry_run=True, seed=0)).to_run == order
    assert run(bench, "box", "onednn", db, RunOptions(dry_run=True, seed=1)).to_run != order

    def runs_of_one_layer(names: list[str]) -> int:  # neighbours measuring the same layer
        return sum(a.split("/")[0] == b.split("/")[0] for a, b in zip(names, names[1:]))

    assert runs_of_one_layer(order) < runs_of_one_layer(generated)
    system = run(bench, "box", "onednn", db, RunOptions(dry_run=True)).system
    by_name = {v.name: v for v in read_variants(bench / "onednn")}
    half = len(order) // 2
    with PerfDB(db) as pdb:
        pdb.insert_results(system, [Result(by_name[n], "box", Status.OK, median_ms=0.01) for n in order[:half]])
    assert run(bench, "box", "onednn", db, RunOptions(dry_run=True)).to_run == order[half:]


def test_first_groups_run_before_the_others_each_in_the_seeded_order(bench, tmp_path):
    """--first FILE (repeatable): the names of the first file, then those of the second, then the
    rest, each part in the order the seeded shuffle gives it alone; a name in both files goes with
    the first; a resumed run keeps that order; names not generated are ignored."""
    db = tmp_path / "r.db"
    order = run(bench, "box", "onednn", db, RunOptions(dry_run=True)).to_run
    one = [order[-1], order[len(order) // 2], "not:a_generated_name"]
    two = [order[-2], order[-1], order[0]]
    (tmp_path / "one.txt").write_text("\n".join(one) + "\n\n")
    (tmp_path / "two.txt").write_text("\n".join(two) + "\n")
    expected = ([n for n in order if n in one] + [n for n in order if n in two and n not in one]
                + [n for n in order if n not in one and n not in two])
    assert expected[:4] == [order[len(order) // 2], order[-1], order[0], order[-2]]
    out = CliRunner().invoke(main, ["run", "--system", "box", "--backend", "onednn", "--bench-dir", str(bench),
                                    "--db", str(db), "--dry-run", "--first", str(tmp_path / "one.txt"),
                                    "--first", str(tmp_path / "two.txt")])
    assert out.exit_code == 0, out.output
    listed = [line for line in out.output.splitlines() if line in order]
    assert listed == expected
    first = (tuple(one), tuple(two))
    system = run(bench, "box", "onednn", db, RunOptions(dry_run=True)).system
    by_name = {v.name: v for v in read_variants(bench / "onednn")}
    with PerfDB(db) as pdb:
        pdb.insert_results(system, [Result(by_name[n], "box", Status.OK, median_ms=0.01) for n in expected[:3]])
    assert run(bench, "box", "onednn", db, RunOptions(dry_run=True, first=first)).to_run == expected[3:]

    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe\x00")
    bad = CliRunner().invoke(main, ["run", "--system", "box", "--backend", "onednn", "--bench-dir", str(bench),
                                    "--db", str(db), "--dry-run", "--first", str(tmp_path / "bad.txt")])
    assert bad.exit_code != 0
    assert f"{tmp_path / 'bad.txt'}: --first: not a readable text file of benchmark names" in bad.output


# --- adaptive sampling (docs/measurement.md) ------------------------------------------------------

STANDIN_SOURCE = FIXTURES / "adaptive_standin"


def low_ms(base_us: float, spread: float) -> float:
    """The true 10th percentile of the stand-in's base × (1 + Exp(mean spread)) calls, in ms."""
    return base_us * (1 - spread * math.log(0.9)) / 1e3


@pytest.fixture(scope="module")
def standin(tmp_path_factory) -> Path:
    """The C++ stand-in over the real runtime (the Google Benchmark the oneDNN backend uses)."""
    build = tmp_path_factory.mktemp("standin")
    subprocess.run(["cmake", "-S", str(STANDIN_SOURCE), "-B", str(build),
                    f"-DBENANZA_RUNTIME={runtime_dir() / 'common'}"], check=True, capture_output=True)
    subprocess.run(["cmake", "--build", str(build)], check=True, capture_output=True)
    return build / "benanza_bench"


def measure(standin: Path, db: Path, spec: dict[Variant, tuple[float, float]], options: RunOptions,
            seed: int = 1) -> tuple[dict[Variant, Result], dict[Variant, dict], dict[Variant, int]]:
    """Runs the stand-in with ``spec`` (variant → base µs, spread) through the runner: each
    variant's latest result, its latest raw line, and how many rows it has."""
    env = dict(os.environ, STANDIN_SEED=str(seed),
               STANDIN_SPEC="\n".join(f"{base} {spread} {v.name}" for v, (base, spread) in spec.items()))
    system = System("box", "onednn", "stand-in", (("threads", "1"),))
    with PerfDB(db) as pdb:
        _execute(standin, list(spec), env, options, pdb, system, RunSummary(system, "onednn", db, len(spec), 0), None)
        results = {r.variant: r for r in pdb.results(system)}
        rows = pdb.db.execute("SELECT variant, raw FROM results ORDER BY id").fetchall()
    raw = {v: json.loads(line) for v in spec for name, line in rows if name == v.name}
    return results, raw, {v: sum(name == v.name for name, _ in rows) for v in spec}


@pytest.mark.slow  # builds the stand-in against the runtime
def test_adaptive_sampling_reaches_the_precision_or_stops_at_the_maximum_time(standin, bench, tmp_path):
    """The narrow distribution stops at the precision asked, its estimate within the interval's
    reach of the true percentile, after far fewer calls than the fixed budget times; the wide one
    cannot get there within --max-time: it stops there, says so, and is flagged unstable (the
    stability check reads the precision)."""
    n, w = read_variants(bench / "onednn")[:2]
    spec = {n: (50.0, 0.1), w: (50.0, 4.0)}  # the wide one's percentile needs ~8,500 calls of 0.25 ms
    sampled = RunOptions(precision=0.02, max_time=0.3, race=False, remeasure=0, timeout=120, max_contention=1.0)
    adaptive, raw, _ = measure(standin, tmp_path / "adaptive.db", spec, sampled)
    fixed, fixed_raw, _ = measure(standin, tmp_path / "fixed.db", spec,
                                  RunOptions(min_time=0.2, repetitions=3, remeasure=0, timeout=120, max_contention=1.0))
    narrow = adaptive[n]
    assert raw[n]["stopped"] == "precision" and narrow.precision is not None and narrow.precision <= 0.02
    assert narrow.low_ms is not None and abs(narrow.low_ms - low_ms(50.0, 0.1)) <= 0.05 * low_ms(50.0, 0.1)
    assert not narrow.unstable and narrow.repetitions == 1 and narrow.iterations == narrow.samples >= 20
    assert narrow.samples * 10 < fixed[n].samples  # the fixed budget times ~0.8 s of calls
    assert fixed[n].precision is None and "stopped" not in fixed_raw[n]

    wide = adaptive[w]
    assert raw[w]["stopped"] == "max_time" and wide.precision is not None and wide.precision > 0.02
    assert wide.unstable
    # the calls it timed fit the maximum time, but for the one that crossed it (a slowest call at most)
    assert wide.samples * wide.mean_ms <= 300.0 + raw[w]["sample_percentiles_ms"][100] + 1e-6
    assert wide.low_ms is not None and low_ms(50.0, 0.0) <= wide.low_ms <= 1.5 * low_ms(50.0, 4.0)


@pytest.mark.slow  # builds the stand-in against the runtime
def test_a_single_call_that_uses_up_the_maximum_time_claims_no_precision(standin, bench, tmp_path):
    """A kernel slower than --max-time is timed once: its interval is unknown (null), not a
    zero width, so it is neither held to the precision (re-measured in vain) nor lets racing
    stop another variant on one call."""
    (v,) = read_variants(bench / "onednn")[:1]
    options = RunOptions(precision=0.02, max_time=0.05, race=False, remeasure=0, timeout=120, max_contention=1.0)
    results, raw, rows = measure(standin, tmp_path / "slow.db", {v: (80_000.0, 0.01)}, options)
    r = results[v]
    assert r.samples == 1 and raw[v]["stopped"] == "max_time" and raw[v]["precision"] is None
    assert r.precision is None and not r.unstable and rows[v] == 1 and race_bounds(r) is None
    assert r.low_ms is not None and 80.0 <= r.low_ms <= 80.0 * 1.5  # the one call: 80 ms of spinning


@pytest.mark.slow  # builds the stand-in against the runtime
def test_racing_stops_what_cannot_win_and_never_the_true_best(standin, bench, tmp_path):
    """Three variants of one layer, their true 10th percentiles 52.6, 55.8 and 105 µs, at a
    precision no screening reaches: in every seeded trial the true best is measured in full and
    the slow one is stopped after the screening pass, stored eliminated with its estimate;
    --no-race measures all three in full."""
    groups: dict[tuple[str, str, str], list[Variant]] = {}
    for v in read_variants(bench / "onednn"):
        groups.setdefault((v.layer_key, v.dtype, v.fusion), []).append(v)
    best, close, slow = next(g for g in groups.values() if len(g) >= 3)[:3]
    spec = {best: (50.0, 0.5), close: (53.0, 0.5), slow: (100.0, 0.5)}
    options = RunOptions(precision=0.002, max_time=0.4, remeasure=0, timeout=120, max_contention=1.0)
    for seed in range(5):
        results, raw, rows = measure(standin, tmp_path / f"race{seed}.db", spec, options, seed)
        assert not results[best].eliminated and rows[best] == 2 and raw[best]["stopped"] == "max_time"
        assert results[slow].eliminated and rows[slow] == 2 and not results[slow].unstable
        # the budget its full sampling would have had, for measuring it in full on demand (Q3)
        assert (results[slow].metrics["race_precision"], results[slow].metrics["race_max_time"]) == (0.002, 0.4)
        assert abs(results[slow].low_ms - low_ms(100.0, 0.5)) <= 0.05 * low_ms(100.0, 0.5)
    results, _, rows = measure(standin, tmp_path / "full.db", spec, replace(options, race=False))
    assert not any(r.eliminated for r in results.values()) and set(rows.values()) == {1}


@pytest.mark.slow  # builds and runs the oneDNN project
def test_real_onednn_samples_adaptively_and_a_second_run_resumes(bench, tmp_path):
    """generate → build → run --precision with the oneDNN runtime: every result carries the
    precision it reached (the one asked, or --max-time said stop), from at least the fewest calls;
    a run after one that stored part of the variants measures only the rest."""
    db = tmp_path / "r.db"
    options = RunOptions(precision=0.05, max_time=0.2, race=False, threads=1, remeasure=0, max_contention=1.0,
                         timeout=120)
    first = run(bench, "ci", "onednn", db, replace(options, filter="^conv:"))
    second = run(bench, "ci", "onednn", db, options)
    assert first.ok > 0 and second.already == first.stored and second.stored == second.total - first.stored
    with PerfDB(db) as pdb:
        raw = dict(pdb.db.execute("SELECT variant, raw FROM results").fetchall())
        results = [r for r in pdb.results("ci") if r.ok]
        assert pdb.db.execute("SELECT count(*) FROM results").fetchone()[0] == second.total  # none twice
    assert len(results) == first.ok + second.ok
    for r in results:
        line = json.loads(raw[r.variant.name])
        assert r.samples >= 20 and r.repetitions == 1 and r.low_ms is not None
        reached = r.precision is not None and r.precision <= 0.05
        assert reached == (line["stopped"] == "precision")
        if r.precision is not None:  # null: no interval could be bounded; the calls' rsd then judges
            assert r.unstable == (not reached)
