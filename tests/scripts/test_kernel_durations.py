"""benchmarks/kernel_durations.py: which variants it rebuilds in CUPTI mode (read from the database
the H200 campaign shipped), its ratio of our event time to the kernels' own, taken through the
runner's own parsing of a result line, and the results page's section of its JSON."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from benanza.cli import main
from benanza.generator import read_variants
from benanza.perfdb import PerfDB
from benanza.runner import parse_result

REPO = Path(__file__).resolve().parents[2]
MODELS = ("resnet50-v1", "inception-v1", "mobilenet-v2")
sys.path.insert(0, str(REPO / "benchmarks"))

from kernel_durations import bound_variants, compare  # noqa: E402


def _latest(con: sqlite3.Connection) -> tuple[str, str]:
    stack = con.execute("select stack_id from systems where name = 'nvidia-h200' "
                        "order by last_used desc, rowid desc limit 1").fetchone()[0]
    return stack, "r.id in (select max(id) from results where stack_id = ? group by variant)"


def test_the_variants_are_those_the_exact_bounds_take(h200_db):
    names = bound_variants(h200_db, "nvidia-h200")
    # recomputed in SQL: per layer of the three CNNs at batch 1, the latest ok result of each
    # unfused variant on the current stack, TF32 left out, the fastest by the bound's estimator
    # (the first name among equally fast ones)
    con = sqlite3.connect(f"file:{h200_db}?mode=ro", uri=True)
    stack, latest = _latest(con)
    rows = con.execute(
        f"""select r.layer_key, r.variant, coalesce(r.low_ms, r.median_ms) from results r
            join variants v on v.name = r.variant
            where {latest} and r.status = 'ok' and r.median_ms is not null and v.backend = 'cudnn'
              and v.fusion = 'none' and not (v.dtype = 'f32' and v.math = 'tf32_allowed')
              and r.layer_key in (select layer_key from occurrences where model in (?, ?, ?))""",
        [stack, *MODELS]).fetchall()
    fastest: dict[str, tuple[float, str]] = {}
    for key, variant, ms in rows:
        fastest[key] = min(fastest.get(key, (ms, variant)), (ms, variant))
    assert names == sorted({v for _, v in fastest.values()})
    assert len(names) == 220
    assert not any("/math=tf32_allowed/" in n or "/dtype=f16/" in n for n in names)


def test_a_cupti_build_of_the_three_cnns_has_every_one_of_them(h200_db, tmp_path):
    names = bound_variants(h200_db, "nvidia-h200")
    # the kit's own call (scripts/gpukit.py _kernel_durations) on the zoo's files
    zoo = CliRunner().invoke(main, ["zoo", "--out", str(tmp_path / "zoo"), *(a for m in MODELS for a in ("--only", m))])
    assert zoo.exit_code == 0, zoo.output
    gen = CliRunner().invoke(main, ["generate", *(str(tmp_path / "zoo" / f"{m}.onnx") for m in MODELS), "--out",
                                    str(tmp_path / "bench"), "--backend", "cudnn", "--dtype", "f32", "--cupti"])
    assert gen.exit_code == 0, gen.output
    built = {v.name for v in read_variants(tmp_path / "bench" / "cudnn")}
    assert set(names) <= built
    assert 'BENANZA_CUPTI "' in (tmp_path / "bench" / "cudnn" / "CMakeLists.txt").read_text()


def _cupti_line(raw: str, kernel_ms: float, kernels: list[tuple[str, float]], flushed: int) -> dict:
    """A real result line of the campaign as the CUPTI build prints it: its counters gain the
    kernel time per call (runtime_cpp/cudnn/cupti.cpp), the runner attaches the profile that the
    BENANZA_METRICS line before it carried."""
    data = json.loads(raw)
    data["counters"] = {**data["counters"], "kernel_ms": kernel_ms, "kernels_per_iteration": float(len(kernels)),
                        "cupti_incomplete_records": 0.0, "l2_flushed": flushed}
    data["cupti"] = {"warmup": 5, "iterations": 20, "kernel_ms_per_iteration": kernel_ms, "incomplete_records": 0,
                     "kernels": [{"name": n, "calls_per_iteration": 1.0, "total_ns": int(ns * 20e6),
                                  "mean_ns": ns * 1e6, "grid": [1, 1, 1], "block": [128, 1, 1]} for n, ns in kernels],
                     "metrics": {"requested": [], "collected": False}}
    return data


def test_the_ratio_is_the_stored_time_over_the_kernels_time(h200_db, tmp_path):
    names = bound_variants(h200_db, "nvidia-h200")[:4]
    con = sqlite3.connect(f"file:{h200_db}?mode=ro", uri=True)
    stack, latest = _latest(con)
    raws = dict(con.execute(f"select r.variant, r.raw from results r where {latest} and r.variant in "
                            f"({','.join('?' * len(names))})", [stack, *names]).fetchall())
    with PerfDB(h200_db, readonly=True) as src:
        system = src.system("nvidia-h200")
        variants = {r.variant.name: r.variant for r in src.results(system) if r.variant.name in names}
    assert system is not None and set(raws) == set(names) == set(variants)
    kernels = [[("implicit_convolve_sgemm", 0.004)], [("gemv2T_kernel", 0.002), ("splitKreduce", 0.001)],
               [("op_generic_tensor_kernel", 0.003)], [("cudnn_infer_ampere_scudnn", 0.01)]]
    medians = {n: json.loads(raws[n])["median_ms"] for n in names}
    db = tmp_path / "kernels.db"
    with PerfDB(db) as out:
        out.upsert_system(system)
        out.upsert_variants(variants.values())
        lines = [_cupti_line(raws[n], sum(ms for _, ms in k), k, 0) for n, k in zip(names[:3], kernels)]
        lines.append(_cupti_line(raws[names[3]], 0.01, kernels[3], 1))  # timed cold: not comparable
        out.insert_results(system, [parse_result(variants[d["name"]], system.name, d) for d in lines])
    data = compare(db, "nvidia-h200")
    want = {n: medians[n] / sum(ms for _, ms in k) for n, k in zip(names[:3], kernels)}
    assert {r["variant"]: r["ratio"] for r in data["rows"]} == pytest.approx(want)
    assert [r["kernels"] for r in sorted(data["rows"], key=lambda r: names.index(r["variant"]))] == \
        [[n for n, _ in k] for k in kernels[:3]]
    s = data["summary"]
    assert (s["compared"], s["l2_flushed_left_out"]) == (3, 1)
    assert s["median_ratio"] == pytest.approx(sorted(want.values())[1])
    assert s["over_target"] == sum(x > 1.05 for x in want.values())

    page = tmp_path / "page.md"
    out_json = tmp_path / "kernels.json"
    out_json.write_text(json.dumps(data))
    subprocess.run([sys.executable, str(REPO / "scripts" / "gpu-results.py"), "--db", str(h200_db), "--system",
                    "nvidia-h200", "--out", str(page), "--campaign-seconds", "73", "--kernels", str(out_json)],
                   check=True, capture_output=True, text=True, env={"PYTHONPATH": str(REPO), "PATH": ""})
    section = page.read_text().split("## Our times vs the kernels' own durations")[1].split("\n## ")[0]
    assert f"median **{sorted(want.values())[1]:.2f}**" in section
    worst = max(want, key=want.__getitem__)
    table = [line for line in section.splitlines() if line.startswith("| ")][2:]
    assert len(table) == 3 and table[0].startswith(f"| {worst.split('/backend=')[0][:50]} cudnnAddTensor |")
    assert table[0].endswith(f"| {want[worst]:.2f} |")


def test_a_database_without_kernel_records_compares_nothing(h200_db, tmp_path):
    out = tmp_path / "k.json"
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "kernel_durations.py"), "compare", "--db",
                           str(h200_db), "--system", "nvidia-h200", "--out", str(out)],
                          capture_output=True, text=True)
    assert done.returncode == 1 and json.loads(out.read_text())["summary"]["compared"] == 0
    missing = subprocess.run([sys.executable, str(REPO / "benchmarks" / "kernel_durations.py"), "select", "--db",
                              str(tmp_path / "none.db"), "--system", "nvidia-h200"], capture_output=True, text=True)
    assert missing.returncode == 2 and missing.stderr.strip() == \
        f"kernel_durations: {tmp_path / 'none.db'}: no such database"
