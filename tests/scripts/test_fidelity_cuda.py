"""benchmarks/fidelity_cuda.py's side that needs no GPU (what it compares PyTorch with, read from
the database the H200 campaign shipped) and the results page's section of its JSON."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MODELS = ["resnet50-v1", "inception-v1", "mobilenet-v2"]
sys.path.insert(0, str(REPO / "benchmarks"))

from fidelity_cuda import our_best  # noqa: E402


def test_each_convolution_of_the_models_gets_its_fastest_exact_f32_result(h200_db):
    rows = our_best(h200_db, "nvidia-h200", MODELS)
    # recomputed in SQL from the stored rows: the latest result of each variant on the stack the
    # system last used (the H200 has two: cuDNN 9.14, then the image's 9.19), then the fastest
    con = sqlite3.connect(f"file:{h200_db}?mode=ro", uri=True)
    stack = con.execute("select stack_id from systems where name = 'nvidia-h200' "
                        "order by last_used desc, rowid desc limit 1").fetchone()[0]
    best = dict(con.execute(
        f"""select v.layer_key, min(r.median_ms) from results r join variants v on v.name = r.variant
            where r.id in (select max(id) from results where stack_id = ? group by variant)
              and r.status = 'ok' and v.dtype = 'f32' and v.layout = 'nchw' and v.math = 'fma'
              and v.fusion = 'none' and v.layer_key in (select o.layer_key from occurrences o
                join layers l on l.key = o.layer_key where l.family = 'conv' and o.model in ({','.join('?' * 3)}))
            group by v.layer_key""", [stack, *MODELS]).fetchall())
    assert {r["layer"] for r in rows} == set(best)
    assert len(rows) == 102  # ResNet-50, Inception-v1 and MobileNet-v2's unique convolutions at batch 1
    for r in rows:
        assert r["ours_ms"] == pytest.approx(best[r["layer"]])
        assert r["variant"].startswith(r["layer"] + "/") and "/math=fma/fusion=none" in r["variant"]
        assert {"ic", "oc", "kh", "sh", "pt", "pb", "g"} <= set(r["params"])


def test_the_results_page_shows_the_comparison(h200_db, tmp_path):
    rows = our_best(h200_db, "nvidia-h200", ["resnet50-v1"])[:3]
    for r, (exact, default) in zip(rows, [(0.01, 0.008), (0.5, 0.2), (0.02, 0.02)]):
        r.update(torch_exact_ms=exact, torch_default_ms=default, ratio_exact=r["ours_ms"] / exact,
                 ratio_default=r["ours_ms"] / default)
    ratios = sorted(r["ratio_exact"] for r in rows)
    summary = {"gpu": "NVIDIA H200", "torch": "2.11.0+cu130", "torch_cudnn": 91900, "convolutions": 3,
               "median_ratio_exact": ratios[1], "over_1": sum(x > 1 for x in ratios),
               "over_1_05": sum(x > 1.05 for x in ratios), "max_ratio_exact": ratios[-1],
               "median_ratio_default": sorted(r["ratio_default"] for r in rows)[1]}
    fid = tmp_path / "fid.json"
    fid.write_text(json.dumps({"summary": summary, "rows": rows}))
    out = tmp_path / "page.md"
    subprocess.run([sys.executable, str(REPO / "scripts" / "gpu-results.py"), "--db", str(h200_db), "--system",
                    "nvidia-h200", "--out", str(out), "--campaign-seconds", "73", "--fidelity", str(fid)],
                   check=True, capture_output=True, text=True, env={"PYTHONPATH": str(REPO), "PATH": ""})
    page = out.read_text()
    section = page.split("## Timing fidelity")[1].split("\n## ")[0]
    assert f"median **{ratios[1]:.2f}**" in section
    worst = max(rows, key=lambda r: r["ratio_exact"])
    table = [line for line in section.splitlines() if line.startswith("| conv:")]
    assert len(table) == 3 and table[0].startswith(f"| {worst['layer'][:60]} |")
    assert f"| {worst['ratio_exact']:.2f} |" in table[0]
