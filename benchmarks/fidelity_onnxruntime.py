"""ONNX Runtime against its own backend: BR ≤ 1, fidelity of the isolated kernels, and Q3 on a CPU.

Usage: python benchmarks/fidelity_onnxruntime.py [--model NAME ...] [--threads N ...] [--work DIR]
           [--min-time 0.05] [--repetitions 3] [--runs 100] [--iterations 50] [--reprofile]

For each model (default ResNet-50 v1 and Inception-v1 of ``benanza.zoo``, and the test suite's
encoder and GPT block, ``tests/torch_models.py`` at opset 17) and each thread count (default 1
and 2) it generates the model's onnxruntime benchmarks, runs them (``--threads``), profiles the
whole model with ``benanza profile --framework onnxruntime --threads N`` (the latency from
``--iterations`` runs without ORT's profiler; ORT's own profile of ``--runs`` runs after 10
warm-up runs), and analyzes the profile against the onnxruntime results. It prints one JSON
object: the machine and its load, and per model and threads

- the measured latency against the sequential bound of ORT's own kernels (BR ≤ 1 expected);
- fidelity, as nn-Meter reports it: per ORT op that ran model layers, the isolated benchmark of
  the variant ORT used (its fusion and NCHWc layout; the 10th percentile of its per-call samples)
  against the 10th percentile of that op's own kernel times in the whole model's profile, and the
  share of ops within ±10 % (and within ±10 % or one step of the profiler's 1 µs clock,
  ``within_10pct_or_step``; the share of the ops' time in the model those within ±10 % take,
  ``within_10pct_of_time``); and the same of the isolated benchmarks measured with a cold cache
  (``fidelity_cold``: ``benanza run --cold-cache``, the last-level cache evicted before every
  timed call, a stack of its own in the same database; pairs in ``MODEL-tN-fidelity-cold.json``),
  with that stack's bound (``bound_ms_cold``), and with cold weights (``--cold-weights``: evicted,
  then the op's inputs read back; ``fidelity_cold_weights``, ``bound_ms_cold_weights``);
  ``--cache`` picks which of the two;
- Q3: how many ops ORT ran with a slower variant than its fastest, and the milliseconds to gain;

and on stderr the rows as docs/backends.md's Markdown table (each op's pair is kept in
``--work/MODEL-tN-fidelity.json``). The benchmarks are generated once under ``--work`` and a
second run measures only what the database lacks; a profile is taken again only with
``--reprofile``.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import onnxruntime as ort
from fidelity_common import (
    COLD_STATES,
    DEFAULT_MODELS,
    EXPORTED,
    SYSTEM,
    cold_suffix,
    fidelity,
    fidelity_pairs,
    load_average,
    machine,
    markdown,
    measure_benchmarks,
    model_choices,
    models,
    op_samples_ms,
    profiled_ms,
    readings,
    row,
)
from fidelity_common import profile as profile_bundle

from benanza.generator import GenOptions
from benanza.parsers import load_profile
from benanza.perfdb import PerfDB
from benanza.runner import RunOptions
from benanza.sweep import SweepRequest, run_sweep

WARMUP_RUNS = 10  # profiled runs of the whole model before those that count
STEP_MS = 0.001  # ORT's profiler records whole microseconds, on both sides of the fidelity pairs


def measure(model: Path, threads: int, args: argparse.Namespace, work: Path) -> dict:
    """One model at one thread count: the row of the warm isolated benchmarks, with the fidelity
    of each cold state asked for (``fidelity_cold``, ``benanza run --cold-cache``;
    ``fidelity_cold_weights``, ``--cold-weights``) beside it."""
    warm = RunOptions(threads=threads, min_time=args.min_time, repetitions=args.repetitions, timeout=120)
    stacks = {suffix: measure_benchmarks(model, "onnxruntime", work / f"bench-{model.stem}", work / f"{model.stem}.db",
                                         GenOptions(), options)
              for suffix, options in (("", warm), *((cold_suffix(c), replace(warm, cache=c)) for c in args.cache))}
    profile = load_profile([str(profile_bundle(model, "onnxruntime", threads, args, work, WARMUP_RUNS + args.runs))])
    assert profile is not None and profile.trace is not None  # one ORT profile given, one read
    in_model = op_samples_ms(profile.trace, WARMUP_RUNS)
    with PerfDB(work / f"{model.stem}.db", readonly=True) as pdb:
        analyses = {suffix: run_sweep(SweepRequest(model=str(model), systems=(SYSTEM,), stack=m.system.stack_id),
                                      pdb, profile)[0] for suffix, m in stacks.items()}
        # the profile's op times hold ORT's profiler's cost: each op against its benchmark's reading
        # on that clock, where the stored time is the replicas clock
        traced = {suffix: profiled_ms(pdb, m.system) for suffix, m in stacks.items()}
        speeds = {suffix: readings(pdb, m.system) for suffix, m in stacks.items()}
    detail = f"{model.stem}-t{threads}-fidelity"
    out = {"model": model.stem, "threads": threads,
           **row(analyses[""], stacks[""], fidelity_pairs(analyses[""], in_model, traced[""], speeds[""]),
                 work / f"{detail}.json", STEP_MS)}
    for suffix, a in analyses.items():
        if suffix:
            out |= {f"bound_ms{suffix}": round(a.bounds.sequential_ms, 4),
                    f"fidelity{suffix}": fidelity(fidelity_pairs(a, in_model, traced[suffix], speeds[suffix]),
                                                  work / f"{detail}{suffix.replace('_', '-')}.json")}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", default=None, choices=model_choices(),
                    help=f"a benanza.zoo model or {' / '.join(EXPORTED)} (default {', '.join(DEFAULT_MODELS)})")
    ap.add_argument("--threads", action="append", type=int, default=None, help="intra-op threads (default 1 and 2)")
    ap.add_argument("--work", default="out/fidelity_onnxruntime")
    ap.add_argument("--min-time", type=float, default=0.05)
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--runs", type=int, default=100, help=f"profiled runs of the whole model, after {WARMUP_RUNS}")
    ap.add_argument("--iterations", type=int, default=50, help="timed runs of the whole model (its latency)")
    ap.add_argument("--reprofile", action="store_true", help="profile again though a profile is kept")
    ap.add_argument("--cache", action="append", choices=COLD_STATES, default=None,
                    help=f"the cold readings beside the warm one (default {' and '.join(COLD_STATES)})")
    args = ap.parse_args()
    args.cache = args.cache or list(COLD_STATES)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    paths = models(args.model or DEFAULT_MODELS, work / "models")
    load = load_average()
    rows = [measure(p, t, args, work) for p in paths for t in (args.threads or [1, 2])]
    print(json.dumps({**machine(), "onnxruntime": ort.__version__, "load_before": load,
                      "load_after": load_average(), "rows": rows}, indent=1))
    print(markdown(rows, "ORT", tuple((f"fidelity{cold_suffix(c)}", f"{c}: ops, within ±10 %, median")
                                      for c in args.cache)), file=sys.stderr)


if __name__ == "__main__":
    main()
