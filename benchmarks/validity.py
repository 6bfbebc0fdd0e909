"""Validity of the bounds: bound vs measured latency, and our per-conv latency vs the framework's.

Usage: python benchmarks/validity.py [--work DIR] [--min-time 0.05] [--repetitions 3] [--threads N]
           [--layout any ...]

For ResNet-50 v1 and Inception-v1 (benanza.zoo) and a small transformer encoder
(tests/torch_models.py, opset 17) on CPU it generates and runs the oneDNN benchmarks (f32, no
fusion variants, ``--threads``, default every CPU this process may use), profiles each model in
ONNX Runtime and in PyTorch (``benanza profile``: the latency from the logger-free run, torch
with the same threads as the benchmarks through OMP_NUM_THREADS), and analyzes each profile.

It prints one JSON object: the machine, the threads and oneDNN versions of both sides, per model
the sequential and critical-path bounds against each framework's measured latency (with the
analysis' explanation whenever a bound is above it), and, for every convolution PyTorch sent to
oneDNN (its verbose log, aligned to the layers by Q3), the bound's latency for the layer and the
fastest benchmark in the call's own layout against PyTorch's per-call time, with the share of
convs where ours is ≤ the framework's. Every stage keeps its output under ``--work``: a second
run measures only what is missing and re-profiles only with ``--reprofile``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from bench_onednn_all import benchmark_onednn
from fidelity_common import ISA_FLAGS

from benanza.analyzer import Analysis
from benanza.errors import BenanzaError
from benanza.parsers import load_bundle
from benanza.parsers.bundle import INDEX_NAME
from benanza.perfdb import PerfDB
from benanza.profiler import ProfileSpec, profile_model
from benanza.sweep import SweepRequest, run_sweep
from benanza.system import cpu_flags, cpu_isa, cpu_model, default_threads
from benanza.zoo import build_all

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from torch_models import export  # the test suite's exporter: the same encoder it checks

ZOO = ("resnet50-v1", "inception-v1")
FRAMEWORKS = ("onnxruntime", "torch")
SYSTEM = "validity"


def models(work: Path) -> list[Path]:
    out = work / "models"
    have = [out / f"{m}.onnx" for m in ZOO]
    paths = have if all(p.exists() for p in have) else build_all(out, names=list(ZOO))
    return paths + [export("encoder", 17, out)]


def profile(model: Path, framework: str, work: Path, threads: int, again: bool) -> Path | str:
    """The profile bundle, or the error line that says why the framework could not run the model."""
    out = work / "profiles" / f"{model.stem}-{framework}"
    if again or not (out / INDEX_NAME).exists():
        # torch takes its intra-op threads from OMP_NUM_THREADS (the profile's children inherit it)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        try:
            profile_model(ProfileSpec(str(model), framework, str(out), warmup=5, iterations=50, trace_iterations=5))
        except BenanzaError as exc:
            return str(exc)
    return out


def analysis(model: Path, db: PerfDB, bundle: Path) -> Analysis:
    (a,) = run_sweep(SweepRequest(model=str(model), systems=(SYSTEM,), backend="onednn"), db, load_bundle(bundle))
    return a


def bound_json(a: Analysis) -> dict:
    m = a.measured_ms
    return {"measured_ms": round(m, 4) if m else None, "br_sequential": round(a.br_sequential or 0, 3),
            "br_parallel": round(a.br_parallel or 0, 3),
            "bound_above_measured": bool(m and a.bounds.sequential_ms > m),
            "explained": [w for w in a.warnings if w.startswith("bound above measured")]}


def conv_rows(a: Analysis) -> list[dict]:
    """Every conv torch sent to oneDNN that Q3 aligned to a layer, with its per-call time."""
    rows = []
    for lib in a.libraries:
        for c in lib.algorithms:
            if lib.library != "onednn" or c.framework_ms is None:
                continue
            rows.append({"layer": c.name, "layout": c.layout, "used": c.used, "fuses": list(c.post_ops),
                         "framework_ms": round(c.framework_ms, 4), "bound_ms": round(c.bound_ms, 4),
                         "same_layout_ms": None if c.best_ms is None else round(c.best_ms, 4),
                         "ours_le_framework": c.bound_ms <= c.framework_ms})
    return rows


def share(rows: list[dict], key: str) -> float | None:
    judged = [r for r in rows if r[key] is not None]
    return round(sum(r[key] <= r["framework_ms"] for r in judged) / len(judged), 3) if judged else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default="out/validity")
    ap.add_argument("--min-time", type=float, default=0.05)
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--layout", action="append", default=None, help="benchmark layouts (default: any)")
    ap.add_argument("--jobs", type=int, default=None, help="build jobs (default: every core)")
    ap.add_argument("--reprofile", action="store_true", help="profile again even when a bundle exists")
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    threads = args.threads or default_threads()
    t0 = time.monotonic()
    paths = models(work)
    bench = benchmark_onednn(work, paths, tuple(args.layout or ("any",)), args.min_time, args.repetitions,
                             threads, SYSTEM, fresh=False, jobs=args.jobs)
    t1 = time.monotonic()
    bundles = {(p, fw): profile(p, fw, work, threads, args.reprofile) for p in paths for fw in FRAMEWORKS}
    t2 = time.monotonic()
    per_model, convs = [], []
    versions: dict[str, str] = {}
    framework_threads: dict[str, int] = {}
    with PerfDB(bench.db) as db:
        for p in paths:
            entry: dict = {"model": p.stem}
            for fw in FRAMEWORKS:
                bundle = bundles[(p, fw)]
                if isinstance(bundle, str):
                    entry[fw] = {"error": bundle}
                    continue
                a = analysis(p, db, bundle)
                entry.update(sequential_ms=round(a.bounds.sequential_ms, 4), parallel_ms=round(a.bounds.parallel_ms, 4),
                             partial=a.bounds.partial, unstable_layers=len(a.unstable_rows),
                             not_covered=len(a.not_covered))
                entry[fw] = bound_json(a)
                if fw == "torch":
                    rows = conv_rows(a)
                    profile_ = load_bundle(bundle)
                    calls = profile_.library_calls.get("onednn", [])
                    # distinct conv problems in the log, and the layers Q3 aligned them to (exact shape)
                    entry["torch_onednn_conv_problems"] = len({c.conv for c in calls if c.conv is not None})
                    entry["torch_onednn_convs"] = len(rows)
                    convs += [{"model": p.stem, **r} for r in rows]
                    for lib in a.libraries:
                        versions.setdefault("framework", lib.framework_version)
                        versions.setdefault("benchmarks", lib.benchmark_version)
                    framework_threads.update(profile_.library_threads)
            per_model.append(entry)
    stack = dict(bench.summary.system.stack)
    ratios = [r["bound_ms"] / r["framework_ms"] for r in convs]
    print(json.dumps({
        "machine": {"cpu": cpu_model(), "cpus": default_threads(), "isa": cpu_isa(),
                    "isa_flags": [f for f in ISA_FLAGS if f in cpu_flags()]},
        "threads": {"benchmarks": int(stack["threads"]), "torch_omp_num_threads": threads,
                    "torch_onednn_log_nthr": framework_threads.get("onednn"),
                    "onnxruntime": "its default intra-op pool (one thread per physical core)"},
        "onednn": {"benchmarks": stack.get("onednn"), "torch": versions.get("framework")},
        "benchmarks": {"layouts": list(args.layout or ("any",)), "variants": len(bench.generated.variants),
                       "ok": bench.summary.ok, "unsupported": bench.summary.unsupported,
                       "failed": bench.summary.failed, "unstable": bench.summary.unstable,
                       "min_time_s": args.min_time, "repetitions": args.repetitions},
        "seconds": {"models_and_benchmarks": round(t1 - t0, 1), "profiles": round(t2 - t1, 1),
                    "analysis": round(time.monotonic() - t2, 1)},
        "models": per_model,
        "convs": {"count": len(convs), "share_bound_le_framework": share(convs, "bound_ms"),
                  "share_same_layout_le_framework": share(convs, "same_layout_ms"),
                  "median_bound_over_framework": round(statistics.median(ratios), 3) if ratios else None,
                  "target_share": 0.9, "rows": convs},
    }, indent=1))


if __name__ == "__main__":
    main()
