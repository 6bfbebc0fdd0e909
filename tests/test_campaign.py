"""`benanza campaign`: two systems (two partitions of a real single-node Slurm cluster) measure
two reference models with oneDNN; shards merge into one database; a cancelled job is reported
and resumed where it stopped; a campaign with nothing missing submits nothing."""

from __future__ import annotations

import json
import os
import shlex
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import quote

import pandas as pd
import pytest
from click.testing import CliRunner

from benanza import campaign as cmp
from benanza.cli import main
from benanza.generator import GenOptions, read_variants
from benanza.perfdb import PerfDB
from benanza.runner import RunOptions, measurement_order
from benanza.system import cpu_model

sys.path.insert(0, str(Path(__file__).parent))
from slurm_cluster import SlurmCluster, missing_programs

PARTITIONS = ("sys-a", "sys-b")
MODELS = ("lenet", "emotion-ferplus")


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """munged + slurmctld + slurmd on loopback, two partitions over this machine's one node."""
    absent = missing_programs()
    assert not absent, f"Slurm test cluster needs {', '.join(absent)} (scripts/setup.sh installs them)"
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"), PARTITIONS)
    saved = os.environ.get("SLURM_CONF")
    cluster.start()
    os.environ.update(cluster.env)
    try:
        yield cluster
    finally:
        cluster.stop()
        if saved is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = saved
        strays = cluster.strays()
        assert not strays, f"processes outlived the Slurm test cluster: {strays}"


def _rows(db: Path, sql: str, *args) -> list[tuple]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def _stored(shard: Path) -> int:
    """Results in a shard its job may be creating right now."""
    try:
        return _rows(shard, "SELECT count(*) FROM results")[0][0]
    except sqlite3.OperationalError:  # not there yet, or its tables not yet created
        return 0


def _get(url: str, server: subprocess.Popen):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError:
        raise
    except OSError:
        assert server.poll() is None, server.stdout.read().decode() if server.stdout else ""
        return None


def _scontrol(job_id: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True,
                         check=True).stdout
    return dict(f.split("=", 1) for f in out.split() if "=" in f)


def _wait_for(what: str, ready, seconds: float = 240.0, poll: float = 0.5):
    deadline = time.monotonic() + seconds
    while True:
        value = ready()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(poll)


@pytest.mark.slow
def test_campaign_two_systems_merge_resume_and_nothing_twice(slurm, zoo_model, tmp_path):
    models = tuple(str(zoo_model(m)) for m in MODELS)
    root, db = tmp_path / "campaign", tmp_path / "team.db"
    gen = GenOptions(dtypes=("f32",), layouts=("nchw",))
    # exact result counts: no re-measurement of what two jobs on this small machine contend for
    base = {"models": models, "db": str(db), "gen": gen, "min_time": 0.01, "repetitions": 1,
            "timeout": 60.0, "slurm": (("time", 10), ("cpus_per_task", 1)), "max_contention": 1.0}
    sys_a = cmp.SystemSpec("sys-a", "onednn", 1, (("partition", "sys-a"),))

    # The runner measures in its seeded order (the campaign's jobs use the default seed). On its
    # first run, sys-b's job hangs in the middle of that order (the runtime's fault hook), so it is
    # caught mid-run with part of its results stored; Slurm then pre-empts it with the warning
    # signal submitit asks for (USR2), submitit requeues it, and the second run (no fault) continues.
    wanted = cmp._Wanted(cmp.CampaignSpec(systems=(sys_a,), **base)).variants("onednn")
    order = measurement_order([v.name for v in wanted], RunOptions().seed)
    stuck = len(order) // 2
    hang = (f'[ "${{SLURM_RESTART_COUNT:-0}}" = 0 ] && '
            f'export BENANZA_FAULT_HANG={shlex.quote(order[stuck])}')
    sys_b = cmp.SystemSpec("sys-b", "onednn", 1, (("partition", "sys-b"), ("setup", [hang])))
    # A system set up wrong: cuDNN asked for on a node without a GPU. Its job fails.
    sys_gpu = cmp.SystemSpec("sys-gpu", "cudnn", None, (("partition", "sys-a"),))

    camp = cmp.Campaign.create(root, cmp.CampaignSpec(systems=(sys_a, sys_b, sys_gpu), **base))
    first = cmp.run(camp)
    assert [(p.system, p.state, p.total) for p in first.plans] == [
        (s, cmp.PlanState.SUBMIT, None) for s in ("sys-a", "sys-b", "sys-gpu")]
    job_a, job_b, job_gpu = (p.job_id for p in first.submitted)
    # Slurm runs each system's job in that system's partition
    assert _scontrol(job_a)["Partition"] == "sys-a" and _scontrol(job_b)["Partition"] == "sys-b"

    shard_b = root / "shards" / "sys-b.db"
    _wait_for(f"{stuck} results in sys-b's shard", lambda: _stored(shard_b) >= stuck)
    time.sleep(1.0)  # the hung benchmark never reports; nothing more can arrive
    assert _stored(shard_b) == stuck
    assert cmp.progress(camp)[1].done == stuck  # the job's own report of how far it got
    subprocess.run(["scancel", "--signal=USR2", job_b], check=True)
    # Slurm holds a requeued job back for a while (BeginTime) so its node can clean up; a test
    # need not wait for that.
    _wait_for("sys-b's job requeued", lambda: _scontrol(job_b)["Restarts"] == "1"
              and _scontrol(job_b)["JobState"] == "PENDING")
    subprocess.run(["scontrol", "update", f"JobId={job_b}", "StartTime=now"], check=True)

    seen: list[list[cmp.SystemProgress]] = []
    reports: dict[str, cmp.JobReport] = {}
    _wait_for("every job to end", lambda: seen.append(cmp.progress(camp)) or reports.update(
        {r.system: r for r in cmp.collect(camp)}) or len(reports) == 3)
    a, b, gpu = reports["sys-a"], reports["sys-b"], reports["sys-gpu"]
    assert a.outcome == "completed" and a.summary.device == cpu_model() and a.summary.backend == "onednn"
    assert a.summary.total == len(wanted) and a.summary.already == 0 and a.added_results == len(wanted)
    # CI once saw sys-b's second run end FAILED with no result and nothing in its stderr: what
    # each run printed and what the daemons logged are the only record of why
    out_b = Path(b.log_path).with_suffix(".out")
    assert b.outcome == "completed", (b.state, b.message, b.log_tail, slurm.logs(),
                                      out_b.read_text(errors="replace")[-3000:] if out_b.exists() else "")
    assert _scontrol(job_b)["Restarts"] == "1"
    assert b.summary.already == stuck and b.added_results == len(wanted)
    assert b.summary.ok + b.summary.unsupported + b.summary.failed == len(wanted) - stuck
    assert any(p[1].state == "RUNNING" and 0 < p[1].done < p[1].total for p in seen)
    assert gpu.outcome == "failed" and "no CUDA device" in gpu.message and gpu.added_results == 0
    assert Path(gpu.log_path).is_file() and "no CUDA device" in gpu.log_tail

    # Without the failed system nothing is missing: no job is submitted, Slurm saw exactly three.
    camp = cmp.Campaign.create(root, cmp.CampaignSpec(systems=(sys_a, sys_b), **base))
    second = cmp.run(camp, wait=True, poll=0.5)
    assert second.submitted == [] and second.reports == []
    assert [(p.system, p.state, p.total, p.missing) for p in second.plans] == [
        (s, cmp.PlanState.COMPLETE, len(wanted), 0) for s in PARTITIONS]
    resumed = CliRunner().invoke(main, ["campaign", "resume", "--dir", str(root), "--no-wait"])
    assert resumed.exit_code == 0, resumed.output
    assert f"sys-a: complete ({len(wanted)} variants" in resumed.output and "submitted" not in resumed.output
    jobs = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i"], capture_output=True, text=True,
                          check=True).stdout.split()
    assert sorted(jobs) == sorted([job_a, job_b, job_gpu])

    # One database: every variant once per system, each row carrying its system and stack, the
    # variant list being what each node generated; each result written by the job that measured it.
    for name in PARTITIONS:
        generated = {v.name for v in read_variants(root / "bench" / name / "onednn")}
        assert generated == {v.name for v in wanted}
        rows = _rows(db, "SELECT variant, count(*), min(stack_id), max(stack_id), min(command) "
                         "FROM results WHERE system = ? GROUP BY variant", name)
        assert {r[0] for r in rows} == generated and all(r[1] == 1 and r[2] == r[3] for r in rows)
        shard_rows = _rows(root / "shards" / f"{name}.db", "SELECT variant, timestamp, median_ms FROM results")
        assert set(shard_rows) == set(_rows(db, "SELECT variant, timestamp, median_ms FROM results "
                                                "WHERE system = ?", name))
    by_run = dict(_rows(db, "SELECT substr(command, instr(command, 'slurm job')), count(*) FROM results "
                            "WHERE system = 'sys-b' GROUP BY 1"))
    assert by_run == {f"slurm job {job_b}, run 0)": stuck, f"slurm job {job_b}, run 1)": len(wanted) - stuck}
    with PerfDB(db) as pdb:
        systems = {s.name: s for s in pdb.systems()}
        assert set(systems) == set(PARTITIONS)
        assert systems["sys-a"].stack_id != systems["sys-b"].stack_id
        assert all(s.backend == "onednn" and s.device == cpu_model() for s in systems.values())
        assert all(r.ok and r.median_ms > 0 for r in pdb.results("sys-a") if r.status.value == "ok")

    runner = CliRunner()
    status = runner.invoke(main, ["campaign", "status", "--dir", str(root)])
    assert status.exit_code == 0, status.output
    assert status.output.count("completed") == 2 and "sys-gpu" not in status.output

    # Analysis across the systems from the merged database: each system's bound is built from
    # its own rows.
    out = runner.invoke(main, ["analyze", models[0], "--system", "sys-a", "--system", "sys-b",
                               "--db", str(db), "--json"])
    assert out.exit_code == 0, out.output
    analyses = json.loads(out.output)["analyses"]
    assert [x["system"] for x in analyses] == list(PARTITIONS)
    for x in analyses:
        # the latency a bound uses: the calls' low percentile where they were timed, else the median
        measured = dict(_rows(db, "SELECT variant, coalesce(low_ms, median_ms) FROM results WHERE system = ? "
                                  "AND status = 'ok'",
                              x["system"]))
        ok = [layer for layer in x["layers"] if layer["status"] == "ok"]
        assert ok and all(layer["latency_ms"] == pytest.approx(measured[layer["variant"]], abs=1e-6)
                          for layer in ok)
        assert x["bounds"]["sequential_ms"] == pytest.approx(sum(layer["latency_ms"] for layer in ok), abs=1e-5)

    # The team's database published with Datasette: both systems' rows, and no way to change them.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cli = Path(sys.executable).parent / "benanza"
    server = subprocess.Popen([str(cli), "db", "serve", "--db", str(db), "--host", "127.0.0.1", "--port",
                               str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    base_url = f"http://127.0.0.1:{port}/team.json?_shape=array&sql="
    try:
        rows = _wait_for("datasette to answer", lambda: _get(
            base_url + quote("SELECT system, count(*) AS n FROM results GROUP BY system"), server))
        assert {r["system"]: r["n"] for r in rows} == {"sys-a": len(wanted), "sys-b": len(wanted)}
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(base_url + quote("DELETE FROM results"), timeout=10)
    finally:
        server.terminate()
        server.wait(timeout=10)
    assert _rows(db, "SELECT count(*) FROM results")[0][0] == 2 * len(wanted)

    # The team's dashboard export holds both systems.
    csv = tmp_path / "team.csv"
    exported = runner.invoke(main, ["db", "export", "--db", str(db), "--out", str(csv)])
    assert exported.exit_code == 0, exported.output
    frame = pd.read_csv(csv)
    assert frame.groupby("system").size().to_dict() == {"sys-a": len(wanted), "sys-b": len(wanted)}


def test_system_spec_parsing_and_bad_input():
    s = cmp.SystemSpec.parse("a100:partition=gpu-a100,gres=gpu:1,backend=cudnn,time=120")
    assert s == cmp.SystemSpec("a100", "cudnn", None, (("partition", "gpu-a100"), ("gres", "gpu:1"),
                                                      ("time", 120)))
    assert cmp.SystemSpec.parse("cpu:constraint=icelake,threads=8").threads == 8
    runner = CliRunner()
    for bad, says in (("a b:partition=x", "system name"), ("x:partition", "KEY=VALUE"),
                      ("x:backend=rocm", "unknown backend"), ("x:threads=0", "threads")):
        out = runner.invoke(main, ["campaign", "submit", __file__, "--dir", "unused", "--system", bad])
        assert out.exit_code == 1 and says in out.output and "Traceback" not in out.output, out.output


def test_a_requeued_jobs_earlier_result_is_not_its_outcome(tmp_path, monkeypatch):
    """Slurm's SIGTERM for a requeue can interrupt the runner before submitit exits, so the first
    run writes an error result; while Slurm runs the job again that file is not the job's end."""
    import submitit

    sys_a = cmp.SystemSpec("sys-a", "onednn", 1, (("partition", "sys-a"),))
    camp = cmp.Campaign.create(tmp_path / "c", cmp.CampaignSpec(models=("m.onnx",), db=str(tmp_path / "t.db"),
                                                                systems=(sys_a,)))
    camp.jobs["sys-a"] = [cmp.JobRecord("41", "2026-11-25T00:00:00", None)]
    job = submitit.SlurmJob(folder=str(camp.folder.slurm / "%j"), job_id="41")
    job.paths.result_pickle.parent.mkdir(parents=True)
    submitit.core.utils.cloudpickle_dump(("error", "CampaignError: system sys-a: interrupted after 3 results"),
                                         job.paths.result_pickle)
    states = iter(["PENDING", "RUNNING", "FAILED"])
    monkeypatch.setattr(cmp, "slurm_state", lambda job_id: next(states))
    assert cmp.collect(camp) == [] and cmp.collect(camp) == []
    (report,) = cmp.collect(camp)  # Slurm says it ended: now the file is its result
    assert report.outcome == "failed" and report.state == "FAILED" and "interrupted after 3" in report.message
