"""Our GPU timing against the kernels' own durations: for the variants a model's exact bound takes,
the time Benanza's cuDNN/cuBLAS benchmark stores for one call (CUDA events around the call) ÷ the
summed durations of the kernels that call launched, as CUPTI's activity records time them (the
GPU's own start and end timestamps of each kernel, what Nsight Systems shows). A ratio near 1
says the events add nothing to the kernels; above 1.05 the stored time holds launch gaps between
a call's kernels or the events' own cost, which the bound then carries.

Both sides come from one result of a CUPTI-mode build (``benanza generate --cupti``): after
warm-up it records every kernel of a fixed number of back-to-back calls, then times the same
calls with events. Run it with ``benanza run --l2 hot``, so that the timed calls find the L2 as
the recorded ones did (a flush between the events' calls but not between the recorded ones would
compare a cold call with a hot kernel).

On the GPU machine (scripts/gpukit.py runs both):
``python3 benchmarks/kernel_durations.py select --db perfdb/<gpu>.db --system <gpu> > names.txt``
(the variants to build and run), then, after ``benanza run --l2 hot`` of those into a database of
their own, ``python3 benchmarks/kernel_durations.py compare --db kernels.db --system <gpu> --out
FILE.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benanza.analysis.bounds import best  # noqa: E402
from benanza.analyzer import MATH_EXACT, admits_math  # noqa: E402
from benanza.perfdb import PerfDB  # noqa: E402
from benanza.records import Result  # noqa: E402

MODELS = ("resnet50-v1", "inception-v1", "mobilenet-v2")
TARGET = 1.05  # the issue's bound on our time over the kernels' own


def bound_variants(db: Path, system: str, models: tuple[str, ...] = MODELS) -> list[str]:
    """Per layer of the models (as their occurrences name them), in the layer's own dtype, the
    variant its exact sequential bound takes: the analysis's own choice (bounds.best: the fastest
    ok unfused result by Result.latency_ms) among the results with no TF32 math; sorted, each once."""
    with PerfDB(db, readonly=True) as perf:
        marks = ",".join("?" * len(models))
        keys = [k for (k,) in perf.db.execute(
            f"SELECT DISTINCT layer_key FROM occurrences WHERE model IN ({marks})", models)]
        by_layer: dict[str, list[Result]] = {}
        for r in perf.results(system, keys):
            if admits_math(r.variant, MATH_EXACT):
                by_layer.setdefault(r.variant.layer_key, []).append(r)
    chosen = (best(rs, rs[0].variant.dtype) for rs in by_layer.values())
    return sorted({r.variant.name for r in chosen if r is not None})


def compare(db: Path, system: str) -> dict:
    """Every ok result that carries CUPTI's kernel records: its event time per call against its
    kernels' summed duration per call. A result timed with the L2 flushed is left out and
    counted (its calls ran cold, the recorded ones hot)."""
    with PerfDB(db, readonly=True) as perf:
        results = perf.results(system)
    rows, flushed = [], 0
    for r in results:
        m = r.metrics
        if not r.ok or "kernel_ms" not in m or r.latency_ms is None:
            continue
        if m.get("l2_flushed", 0):
            flushed += 1
            continue
        profile = m.get("cupti") or {}
        kernel_ms = float(m["kernel_ms"])
        rows.append({"variant": r.variant.name, "layer": r.variant.layer_key, "event_ms": r.latency_ms,
                     "kernel_ms": kernel_ms, "ratio": r.latency_ms / kernel_ms if kernel_ms > 0 else None,
                     "kernels_per_call": m.get("kernels_per_iteration"),
                     "incomplete_records": profile.get("incomplete_records", 0),
                     "kernels": [k.get("name", "") for k in profile.get("kernels", [])]})
    ratios = sorted(row["ratio"] for row in rows if row["ratio"] is not None)
    summary = {"compared": len(ratios), "no_kernel_time": sum(row["ratio"] is None for row in rows),
               "l2_flushed_left_out": flushed,
               "median_ratio": statistics.median(ratios) if ratios else None,
               "max_ratio": ratios[-1] if ratios else None, "min_ratio": ratios[0] if ratios else None,
               "target": TARGET, "over_target": sum(x > TARGET for x in ratios),
               "below_1": sum(x < 1.0 for x in ratios),
               "incomplete": sum(bool(row["incomplete_records"]) for row in rows)}
    return {"summary": summary, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    sel = sub.add_parser("select", help="the variants the models' exact bounds take, one name per line")
    sel.add_argument("--db", type=Path, required=True)
    sel.add_argument("--system", required=True)
    sel.add_argument("--models", nargs="+", default=list(MODELS))
    cmp = sub.add_parser("compare", help="event time ÷ the kernels' own, per result of a CUPTI-mode run")
    cmp.add_argument("--db", type=Path, required=True)
    cmp.add_argument("--system", required=True)
    cmp.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if not args.db.is_file():
        print(f"kernel_durations: {args.db}: no such database", file=sys.stderr)
        return 2
    if args.command == "select":
        names = bound_variants(args.db, args.system, tuple(args.models))
        if not names:
            print(f"kernel_durations: {args.db}: no ok exact result for a layer of {', '.join(args.models)} on "
                  f"{args.system}", file=sys.stderr)
            return 1
        print("\n".join(names))
        return 0
    data = compare(args.db, args.system)
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    print(json.dumps(data["summary"]))
    return 0 if data["summary"]["compared"] else 1


if __name__ == "__main__":
    sys.exit(main())
