"""A campaign in minutes: the same models' oneDNN campaign measured four ways, against a long reference.

Usage: python benchmarks/bench_campaign.py [--work DIR] [--models NAME ...] [--reference-models NAME ...]
           [--precision 0.02] [--max-time 0.5] [--min-time 0.2] [--repetitions 3]
           [--reference-min-time 1] [--reference-repetitions 5] [--threads N] [--jobs N]
           [--modes defaults precision race reference] [--chunks 8]

Builds the models (benanza.zoo), generates their oneDNN benchmarks once (f32, every layout and
fusion variant, as `benanza generate` does) and builds them once, then runs the campaign into a
fresh database per mode, each mode's time summed over ``--chunks`` chunks of the layers that the
modes take in turn (interleaved, so the machine's drift over the campaign does not favour a mode):

- ``defaults``: ``--min-time 0.2 --repetitions 3`` (`benanza run`'s fixed budget);
- ``precision``: ``--precision 0.02 --no-race`` (every variant sampled to the precision);
- ``race``: ``--precision 0.02 --race`` (variants that cannot win stopped after screening);
- ``reference``: ``--min-time 1 --repetitions 5``, only the layers of ``--reference-models``
  (default: every model).

``--modes`` runs only those (default: all four): the whole 30-model campaign in ``race`` alone
answers "how long", a few models in every mode answer "how close"; without ``reference`` no
ratio is computed, only each mode's bounds.

Every mode runs at the same threads (``--threads``, default the cores free at the start) and
without measuring the stack's peaks (seconds, the same in every mode; the sequential bound does
not use them). Per model and mode, `benanza analyze --json --allow-contended` gives the sequential
bound and each layer's best variant. It prints one JSON object: wall time per mode, and per model
and mode the bound, its ratio to the reference's (target: within ``BOUND_TOLERANCE``), the share
of layers whose best variant is the reference's (target: at least ``SAME_BEST_TARGET``) and, of
the others, how many the reference measured within the precision of its own best.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from bench_onednn_all import generate_onednn

from benanza.backends.base import build
from benanza.generator import GenOptions
from benanza.measurement import MAX_SAMPLING_SECONDS, free_cores
from benanza.perfdb import PerfDB
from benanza.problems import layer_key
from benanza.runner import RunOptions, RunSummary, run
from benanza.zoo import build_all

SYSTEM = "campaign"
BOUND_TOLERANCE = 0.02  # a fast mode's sequential bound within 2% of the reference's
SAME_BEST_TARGET = 0.95  # and at least 95% of its layers with the reference's best variant
MODE_NAMES = ("defaults", "precision", "race", "reference")


@dataclass(frozen=True)
class Mode:
    name: str
    flags: str  # the `benanza run` flags it stands for
    options: RunOptions


def modes(args: argparse.Namespace, threads: int, reference_only: bool) -> list[Mode]:
    common = {"threads": threads, "peaks": False, "build_jobs": args.jobs}
    p, t = args.precision, args.max_time
    return [
        Mode("defaults", f"--min-time {args.min_time:g} --repetitions {args.repetitions}",
             RunOptions(min_time=args.min_time, repetitions=args.repetitions, **common)),
        Mode("precision", f"--precision {p:g} --max-time {t:g} --no-race",
             RunOptions(precision=p, max_time=t, race=False, **common)),
        Mode("race", f"--precision {p:g} --max-time {t:g} --race", RunOptions(precision=p, max_time=t, **common)),
        Mode("reference", f"--min-time {args.reference_min_time:g} --repetitions {args.reference_repetitions}"
             + (f" --filter <the layers of {', '.join(args.reference_models)}>" if reference_only else ""),
             RunOptions(min_time=args.reference_min_time, repetitions=args.reference_repetitions, **common)),
    ]


@dataclass
class Tally:
    """One mode's campaign, summed over its chunks."""

    seconds: float = 0.0
    counts: dict[str, int] = field(default_factory=dict)
    interrupted: bool = False

    def add(self, s: RunSummary, seconds: float) -> None:
        self.seconds += seconds
        self.interrupted |= s.interrupted
        for k, v in {"variants_run": len(s.to_run), "ok": s.ok, "unsupported": s.unsupported, "failed": s.failed,
                     "unstable": s.unstable, "eliminated": s.eliminated, "contended": len(s.still_contended)}.items():
            self.counts[k] = self.counts.get(k, 0) + v


def chunks(keys: list[str], n: int) -> list[list[str]]:
    """The layers split into ``n`` chunks by a hash of their key (a layer's variants stay
    together: racing compares them), each in its own stable order."""
    out: list[list[str]] = [[] for _ in range(n)]
    for k in keys:
        out[int(hashlib.sha256(k.encode()).hexdigest(), 16) % n].append(k)
    return [c for c in out if c]


def layer_filter(keys: list[str]) -> str:
    return "^(?:" + "|".join(re.escape(k) for k in keys) + ")/"  # a variant's name starts with its layer's key


def measure(work: Path, todo: list[Mode], parts: list[list[str]], reference: set[str]) -> dict[str, Tally]:
    """The campaign in every mode of ``todo``, each into its own fresh database, interleaved: chunk
    by chunk of the layers, every mode in turn (the order rotated per chunk), so a drift of the
    machine over the campaign (seen here: 5-10% slower bounds 15 minutes later) lands on every
    mode alike instead of on whichever ran last. The reference measures only ``reference``'s layers."""
    for mode in todo:
        db = work / f"{mode.name}.db"
        for stale in (db, Path(f"{db}-wal"), Path(f"{db}-shm")):
            stale.unlink(missing_ok=True)
    tallies = {m.name: Tally() for m in todo}
    for i, part in enumerate(parts):
        for mode in todo[i % len(todo):] + todo[:i % len(todo)]:
            keys = [k for k in part if mode.name != "reference" or k in reference]
            if not keys:
                continue
            t0 = time.monotonic()
            s = run(work / "bench", SYSTEM, "onednn", work / f"{mode.name}.db",
                    replace(mode.options, filter=layer_filter(keys)))
            tallies[mode.name].add(s, time.monotonic() - t0)
    return tallies


def analyze(model: Path, db: Path) -> dict:
    """`benanza analyze --json` of one model (labelled, not refused, if a result was contended)."""
    cli = Path(sys.executable).parent / "benanza"
    out = subprocess.run([str(cli), "analyze", str(model), "--system", SYSTEM, "--db", str(db), "--json",
                          "--allow-contended"], capture_output=True, text=True, check=True).stdout
    (a,) = json.loads(out)["analyses"]
    return a


def compare(a: dict, ref: dict, ref_ms: dict[str, float], precision: float) -> dict:
    """One mode's analysis of a model against the reference's: the bound's ratio, and per layer
    both measured whether the best variant is the same, else whether the reference measured the
    two within the precision of each other."""
    ratio = a["bounds"]["sequential_ms"] / ref["bounds"]["sequential_ms"]
    pairs = [(x, r) for x, r in zip(a["layers"], ref["layers"]) if x["status"] == r["status"] == "ok"]
    other = [(x["variant"], r["variant"]) for x, r in pairs if x["variant"] != r["variant"]]
    close = sum(1 for mine, best in other if mine in ref_ms and ref_ms[mine] <= ref_ms[best] * (1 + precision))
    return {"ratio_to_reference": round(ratio, 4), "bound_within_target": abs(ratio - 1) <= BOUND_TOLERANCE,
            "layers": len(pairs), "same_best": len(pairs) - len(other),
            "same_best_share": round(1 - len(other) / len(pairs), 4) if pairs else None,
            "same_best_on_target": not pairs or 1 - len(other) / len(pairs) >= SAME_BEST_TARGET,
            "other_best_within_precision": close}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default="out/bench_campaign")
    ap.add_argument("--models", nargs="*", default=None, help="zoo models (default: all 30)")
    ap.add_argument("--reference-models", nargs="*", default=None,
                    help="the models whose layers the long reference measures (default: --models)")
    ap.add_argument("--precision", type=float, default=0.02)
    ap.add_argument("--max-time", type=float, default=MAX_SAMPLING_SECONDS)
    ap.add_argument("--min-time", type=float, default=0.2)
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--reference-min-time", type=float, default=1.0)
    ap.add_argument("--reference-repetitions", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--jobs", type=int, default=None, help="parallel build jobs")
    ap.add_argument("--modes", nargs="+", default=list(MODE_NAMES), choices=MODE_NAMES)
    ap.add_argument("--chunks", type=int, default=8, help="interleave the modes over this many chunks of the layers")
    args = ap.parse_args()
    work = Path(args.work)
    paths = build_all(work / "models", names=args.models)
    if unknown := sorted(set(args.reference_models or ()) - {p.stem for p in paths}):
        ap.error(f"--reference-models {' '.join(unknown)}: not among --models")
    t0 = time.monotonic()
    models, manifest, generated = generate_onednn(work, paths, GenOptions(dtypes=("f32",)))
    t1 = time.monotonic()
    build(work / "bench" / "onednn", args.jobs)  # once: every mode then runs the same binary
    t2 = time.monotonic()
    threads = args.threads or free_cores().free
    by_name = {p.stem: (p, m) for p, m in zip(paths, models)}
    reference = args.reference_models or sorted(by_name)
    reference_keys = {layer_key(n.layer.problem, n.layer.in_dtype("f32")) for name in reference
                      for n in by_name[name][1].nodes}
    parts = chunks(sorted({v.layer_key for v in generated.variants}), args.chunks)
    out: dict = {"models": sorted(by_name), "reference_models": reference, "unique_layers": len(manifest.layers),
                 "variants": len(generated.variants), "threads": threads,
                 "seconds_generate": round(t1 - t0, 1), "seconds_build": round(t2 - t1, 1),
                 "targets": {"bound_within": BOUND_TOLERANCE, "same_best_share": SAME_BEST_TARGET,
                             "precision": args.precision},
                 "modes": {}, "per_model": {}}
    todo = [m for m in modes(args, threads, bool(args.reference_models)) if m.name in args.modes]
    tallies = measure(work, todo, parts, reference_keys)
    dbs = {m.name: work / f"{m.name}.db" for m in todo}
    out["chunks"] = len(parts)
    for mode in todo:
        t = tallies[mode.name]
        out["modes"][mode.name] = {"flags": mode.flags, "seconds": round(t.seconds, 1), **t.counts,
                                   "interrupted": t.interrupted}
    with PerfDB(next(iter(dbs.values())), readonly=True) as pdb:
        system = pdb.system(SYSTEM, "onednn")
    if system is not None:
        out.update(cpu=system.device, onednn=dict(system.stack).get("onednn"))
    ref_ms: dict[str, float] = {}
    if "reference" in dbs:
        with PerfDB(dbs["reference"], readonly=True) as pdb:
            ref_ms = {r.variant.name: float(r.latency_ms) for r in pdb.results(SYSTEM) if r.ok}  # type: ignore[arg-type]
    for name, (path, _) in sorted(by_name.items()):
        analyses = {m: analyze(path, db) for m, db in dbs.items() if m != "reference" or name in reference}
        row: dict = {}
        for m, a in analyses.items():
            row[m] = {"sequential_ms": a["bounds"]["sequential_ms"],
                      "contended_layers": len(a["contended_layers"])}
            if m != "reference" and "reference" in analyses:
                row[m].update(compare(a, analyses["reference"], ref_ms, args.precision))
        out["per_model"][name] = row
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
