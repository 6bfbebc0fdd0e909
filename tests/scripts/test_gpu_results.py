"""scripts/gpu-results.py's sections read from the H200's own database, recomputed in SQL."""

from __future__ import annotations

import sqlite3
import statistics
import subprocess
import sys
from contextlib import closing
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_graph_heuristics_first_plan_against_the_fastest_plan(h200_db, tmp_path):
    """Per graph-API convolution problem whose 8 plan slots all have a latest result on the
    current stack: is `plan0` (the frontend heuristic's first) the fastest ok plan, and by how much
    is it slower where not."""
    with closing(sqlite3.connect(f"file:{h200_db}?mode=ro", uri=True)) as con:
        stack = con.execute("select stack_id from systems where name = 'nvidia-h200' "
                            "order by last_used desc, rowid desc limit 1").fetchone()[0]
        rows = con.execute(
            """select v.layer_key, v.dtype, v.layout, v.math, count(*),
                      min(case when r.status = 'ok' then r.median_ms end),
                      max(case when v.algo = 'plan0' and r.status = 'ok' then r.median_ms end)
               from results r join variants v on v.name = r.variant
               where r.id in (select max(id) from results where stack_id = ? group by variant)
                 and v.api = 'cudnn_frontend.conv'
               group by 1, 2, 3, 4""", (stack,)).fetchall()
    whole = [(best, first) for *_, n, best, first in rows if n == 8 and first is not None]
    assert len(whole) > 100  # the second run measured every plan of ResNet-50's convolutions
    ratios = [first / best for best, first in whole]
    out = tmp_path / "page.md"
    subprocess.run([sys.executable, str(REPO / "scripts" / "gpu-results.py"), "--db", str(h200_db), "--system",
                    "nvidia-h200", "--out", str(out), "--campaign-seconds", "1"],
                   check=True, capture_output=True, env={"PYTHONPATH": str(REPO), "PATH": ""})
    assert (f"Through the graph API (`cudnn_frontend.conv`), {len(whole)} convolution problems have a result in "
            f"all 8 plan slots: the heuristic's first plan (`plan0`) was the fastest in "
            f"{sum(best == first for best, first in whole)}; `plan0` ÷ fastest plan: median "
            f"{statistics.median(ratios):.2f}, max {max(ratios):.2f}.") in out.read_text()
