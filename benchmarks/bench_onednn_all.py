"""Time to benchmark every unique layer of the 30 reference models with oneDNN at f32.

Usage: python benchmarks/bench_onednn_all.py [--work DIR] [--min-time 0.05] [--repetitions 3]
           [--layout any] [--models NAME ...]

Builds the models (benanza.zoo), generates the oneDNN benchmarks (f32, one layout, no fusion
variants), builds and runs them into a fresh database, and prints one JSON object: unique
layers, variants, seconds per stage, status counts and the median relative stddev
(stddev / median over the OK results).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from benanza.generator import Generated, GenOptions, generate
from benanza.layers import Model, unique_layers
from benanza.manifest import Manifest, build_manifest, write_manifest
from benanza.perfdb import PerfDB
from benanza.processor import load_model
from benanza.runner import RunOptions, RunSummary, run
from benanza.zoo import build_all


@dataclass
class OneDNNRun:
    models: list[Model]
    manifest: Manifest
    generated: Generated
    summary: RunSummary
    db: Path
    seconds_generate: float
    seconds_build_and_run: float


def generate_onednn(work: Path, paths: list[Path], options: GenOptions) -> tuple[list[Model], Manifest, Generated]:
    """The models' unique layers as oneDNN benchmarks in ``work/bench``, with their manifest."""
    models = [load_model(p, batch_size=1) for p in paths]
    manifest = build_manifest(models, unique_layers(models))
    write_manifest(manifest, work / "bench")
    return models, manifest, generate(manifest, "onednn", work / "bench", options)


def benchmark_onednn(work: Path, paths: list[Path], layouts: tuple[str, ...], min_time: float,
                     repetitions: int, threads: int | None = None, system: str = "bench",
                     fresh: bool = True, jobs: int | None = None) -> OneDNNRun:
    """The models' unique layers as f32 oneDNN benchmarks (no fusion variants), built and run
    into ``work/bench.db``; ``fresh=False`` keeps what the database holds and runs the rest."""
    t0 = time.monotonic()
    models, manifest, gen = generate_onednn(work, paths, GenOptions(dtypes=("f32",), layouts=layouts, fusion=False))
    t1 = time.monotonic()
    db = work / "bench.db"
    if fresh:
        db.unlink(missing_ok=True)
    summary = run(work / "bench", system, "onednn", db,
                  RunOptions(min_time=min_time, repetitions=repetitions, threads=threads, timeout=120,
                                                   build_jobs=jobs))
    return OneDNNRun(models, manifest, gen, summary, db, t1 - t0, time.monotonic() - t1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default="out/bench_onednn_all")
    ap.add_argument("--min-time", type=float, default=0.05)
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--layout", default="any")
    ap.add_argument("--models", nargs="*", default=None)
    args = ap.parse_args()
    work = Path(args.work)
    t0 = time.monotonic()
    paths = build_all(work / "models", names=args.models)
    t_zoo = time.monotonic() - t0
    r = benchmark_onednn(work, paths, (args.layout,), args.min_time, args.repetitions)
    summary = r.summary
    with PerfDB(r.db) as pdb:
        results = pdb.results("bench")
    rel = [x.stddev_ms / x.median_ms for x in results if x.ok and x.median_ms]
    print(json.dumps({
        "models": len(r.models), "unique_layers": len(r.manifest.layers), "variants": len(r.generated.variants),
        "seconds_models_and_generate": round(t_zoo + r.seconds_generate, 1),
        "seconds_build_and_run": round(r.seconds_build_and_run, 1),
        "seconds_run_only": round(summary.seconds, 1),
        "ok": summary.ok, "unsupported": summary.unsupported, "failed": summary.failed,
        "median_rel_stddev": round(statistics.median(rel), 4) if rel else None,
        "p90_rel_stddev": round(sorted(rel)[int(0.9 * len(rel))], 4) if rel else None,
        "threads": dict(summary.system.stack).get("threads"), "onednn": dict(summary.system.stack).get("onednn"),
        "cpu": summary.system.device,
    }, indent=1))


if __name__ == "__main__":
    main()
