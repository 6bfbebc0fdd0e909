"""The stack's peaks against independent ones: oneDNN's GEMM vs torch.mm, our triad vs a NumPy copy.

Usage: python benchmarks/bench_peaks.py [--threads 1 2] [--rounds 5] [--n 512 1024]

For each thread count, `--rounds` rounds of: `benanza.peaks.measure` (the program `benanza peaks`
runs: oneDNN's GEMM per dtype the CPU has, the bandwidth ladder), then torch.mm at the same threads
for each size in `--n` (its BLAS in f32, the oneDNN build in its wheel in bf16), then a one-thread
NumPy copy beyond the last-level cache, back to back so each round's pair sees the same moment of a
shared machine (the oracles are the test suite's, tests/analysis/test_speed_of_light.py). Prints one JSON
object: the machine, the load before and after, and per threads every round's figures, the best of
each side, and each round's ratio ours ÷ torch.mm (target ≥ 0.9, issue 25).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from pathlib import Path

from benanza.peaks import measure
from benanza.system import cpu_has_bf16


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().strip()


def one_round(threads: int, sizes: list[int], dtypes: list[tuple[str, str]]) -> dict:
    import torch

    from tests.analysis.test_speed_of_light import _numpy_copy, _torch_gemm

    _, peaks = measure("onednn", threads)
    out: dict = {"contended": round(peaks.contended, 3), "gemm": {}, "bandwidth_GBps": {}}
    for name, torch_name in dtypes:
        ours = peaks.gemm(name)
        theirs = {n: _torch_gemm(getattr(torch, torch_name), threads, n=n) / 1e9 for n in sizes}
        out["gemm"][name] = {"ours_GFLOPs": None if ours is None else round(ours.value / 1e9, 1),
                             "torch_mm_GFLOPs": {n: round(v, 1) for n, v in theirs.items()}}
    for level in ("llc", "dram"):
        peak = getattr(peaks, level)
        out["bandwidth_GBps"][level] = None if peak is None else round(peak.value / 1e9, 2)
    dram = peaks.dram
    if dram is not None:
        nbytes = min(dram.size, 512 << 20)
        out["bandwidth_GBps"]["triad_at_copy_size"] = round(peaks.bandwidth_for(nbytes).value / 1e9, 2)  # type: ignore[union-attr]
        out["bandwidth_GBps"]["numpy_copy_1_thread"] = round(_numpy_copy(nbytes) / 1e9, 2)
    out["gemm_unsupported"] = [f"{dtype}: {why}" for dtype, why in peaks.unsupported]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n", type=int, nargs="+", default=[512, 1024], help="torch.mm sizes")
    args = ap.parse_args()
    repo = Path(__file__).resolve().parents[1]
    sys.path[:0] = [str(repo), str(repo / "tests")]  # the test suite's oracles, and the helpers they import
    dtypes = [("f32", "float32")] + ([("bf16", "bfloat16")] if cpu_has_bf16() else [])
    report: dict = {"cpu": platform.processor() or platform.machine(), "bf16": cpu_has_bf16(),
                    "loadavg_before": loadavg(), "threads": {}}
    for threads in args.threads:
        rounds = [one_round(threads, args.n, dtypes) for _ in range(args.rounds)]
        summary: dict = {"rounds": rounds}
        for name, _ in dtypes:
            ours = [r["gemm"][name]["ours_GFLOPs"] for r in rounds if r["gemm"][name]["ours_GFLOPs"]]
            if not ours:
                continue
            theirs = [max(r["gemm"][name]["torch_mm_GFLOPs"].values()) for r in rounds]
            ratios = [r["gemm"][name]["ours_GFLOPs"] / t
                      for r, t in zip(rounds, theirs) if r["gemm"][name]["ours_GFLOPs"]]
            summary[name] = {"ours_best": max(ours), "torch_mm_best": max(theirs),
                             "ratio_per_round": [round(x, 2) for x in ratios],
                             "ratio_median": round(statistics.median(ratios), 2),
                             "best_over_best": round(max(ours) / max(theirs), 2)}
        report["threads"][threads] = summary
    report["loadavg_after"] = loadavg()
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
