"""ONNX Runtime against its own backend: BR ≤ 1, fidelity of the isolated kernels, and Q3 on a CPU.

Usage: python benchmarks/fidelity_onnxruntime.py [--model NAME ...] [--threads N ...] [--work DIR]
           [--min-time 0.05] [--repetitions 3] [--runs 100]

For each zoo model (default ResNet-50 v1 and Inception-v1) and each thread count (default 1 and
2) it generates the model's onnxruntime benchmarks, runs them (``--threads``), profiles the whole
model in ONNX Runtime with the same intra-op threads (its own profiler, ``--runs`` runs after 10
warm-up runs), and analyzes the profile against the onnxruntime results. It prints one JSON
object: the machine and its load, and per model and threads

- the measured latency against the sequential bound of ORT's own kernels (BR ≤ 1 expected);
- fidelity, as nn-Meter reports it: per ORT op that ran model layers, the isolated benchmark of
  the variant ORT used (its fusion and NCHWc layout; the 10th percentile of its per-call samples)
  against the 10th percentile of that op's own kernel times in the whole model's profile, and the
  share of ops within ±10 %;
- Q3: how many ops ORT ran with a slower variant than its fastest, and the milliseconds to gain.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from benanza.generator import GenOptions, generate
from benanza.layers import unique_layers
from benanza.manifest import build_manifest, write_manifest
from benanza.parsers import load_profile
from benanza.parsers.ort import parse_ort_profile
from benanza.perfdb import PerfDB
from benanza.processor import load_model
from benanza.runner import RunOptions, run
from benanza.sweep import SweepRequest, run_sweep
from benanza.system import cpu_model
from benanza.zoo import build_all

SYSTEM = "fidelity"


def whole_profile(model: Path, threads: int, runs: int, out: Path) -> Path:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.enable_profiling = True
    opts.profile_file_prefix = str(out / f"{model.stem}-t{threads}")
    sess = ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])
    feeds = {i.name: np.random.default_rng(0).standard_normal([d if isinstance(d, int) else 1 for d in i.shape])
             .astype(np.float32) for i in sess.get_inputs()}
    for _ in range(10 + runs):
        sess.run(None, feeds)
    return Path(sess.end_profiling())


def op_low_ms(profile: Path) -> dict[str, float]:
    """The 10th percentile of each op's kernel times over the profile's runs after the warm-up."""
    trace = parse_ort_profile(profile)
    times: dict[str, list[float]] = {}
    for o in trace.ops:
        if o.run >= 10:
            times.setdefault(o.name, []).append(o.span.dur_us / 1e3)
    return {name: float(np.percentile(t, 10)) for name, t in times.items()}


def measure(model: Path, threads: int, args: argparse.Namespace, work: Path) -> dict:
    bench, db = work / f"bench-{model.stem}", work / f"{model.stem}.db"
    loaded = [load_model(model, batch_size=1)]
    manifest = build_manifest(loaded, unique_layers(loaded))
    write_manifest(manifest, bench)
    generate(manifest, "onnxruntime", bench, GenOptions(), loaded)
    t0 = time.monotonic()
    summary = run(bench, SYSTEM, "onnxruntime", db, RunOptions(threads=threads, min_time=args.min_time,
                                                               repetitions=args.repetitions, timeout=120))
    run_s = time.monotonic() - t0
    profile = whole_profile(model, threads, args.runs, work)
    with PerfDB(db, readonly=True) as pdb:
        (a,) = run_sweep(SweepRequest(model=str(model), systems=(SYSTEM,)), pdb, load_profile([str(profile)]))
    low = op_low_ms(profile)
    names = {g.nodes[0]: g.name for g in a.framework.match.groups if g.nodes} if a.framework else {}
    kernels = a.framework.kernels if a.framework else []
    pairs = [(c.name, c.used_ms, low[names[c.node]]) for c in kernels
             if c.used_ms is not None and names.get(c.node) in low and low[names[c.node]] > 0]
    within = [abs(ours / theirs - 1) <= 0.10 for _, ours, theirs in pairs]
    return {
        "model": model.stem, "threads": threads, "backend": a.backend, "variants": summary.total,
        "ok": summary.ok, "unsupported": summary.unsupported, "failed": summary.failed,
        "contended_share": round(summary.contended, 3), "run_s": round(run_s, 1),
        "measured_ms": round(a.measured_ms or 0, 4), "bound_ms": round(a.bounds.sequential_ms, 4),
        "br_sequential": round(a.br_sequential or 0, 3), "partial": a.bounds.partial,
        "fidelity": {"ops": len(pairs), "within_10pct": round(sum(within) / len(within), 3) if within else None,
                     "median_ratio": round(statistics.median(o / t for _, o, t in pairs), 3) if pairs else None},
        "q3": {"judged": sum(1 for c in kernels if c.comparable), "slower_than_fastest": len(a.framework.suboptimal)
               if a.framework else 0, "gain_ms": round(a.framework.kernel_gain_ms, 4) if a.framework else 0.0},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", default=None, help="zoo model (default resnet50-v1, inception-v1)")
    ap.add_argument("--threads", action="append", type=int, default=None, help="intra-op threads (default 1 and 2)")
    ap.add_argument("--work", default="out/fidelity_onnxruntime")
    ap.add_argument("--min-time", type=float, default=0.05)
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--runs", type=int, default=100)
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    names = args.model or ["resnet50-v1", "inception-v1"]
    have = [work / "models" / f"{n}.onnx" for n in names]
    paths = have if all(p.exists() for p in have) else build_all(work / "models", names=names)
    load = os.getloadavg()
    rows = [measure(p, t, args, work) for p in paths for t in (args.threads or [1, 2])]
    print(json.dumps({"cpu": cpu_model(), "onnxruntime": ort.__version__, "cores": len(os.sched_getaffinity(0)),
                      "load_before": [round(x, 2) for x in load],
                      "load_after": [round(x, 2) for x in os.getloadavg()], "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
