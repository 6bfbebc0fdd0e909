"""PyTorch against its own backend: BR ≤ 1, fidelity of the isolated kernels, and Q3 on a CPU.

Usage: python benchmarks/fidelity_torch.py [--model NAME ...] [--threads N ...] [--work DIR]
           [--min-time 0.05] [--repetitions 3] [--runs 100] [--iterations 50] [--reprofile]

For each model (default ResNet-50 v1 and Inception-v1 from benanza.zoo, and the test suite's
transformer encoder and GPT block, tests/torch_models.py at opset 17: ``encoder``, ``gpt``) and
each thread count (default 1 and 2) it generates the model's torch benchmarks (f32, no fusion
variants: torch's eager executor runs every node alone, so no profile ever runs a pattern), runs
them (``benanza run --backend torch --threads N``), profiles the whole model in torch with the
same threads (``benanza profile --framework torch --threads N``: the latency from ``--iterations``
runs without the profiler, the trace from ``--runs`` runs after one warm-up run), and analyzes the
profile against the torch results. It prints one JSON object on stdout: the machine, its load at
the start and end, torch and the oneDNN it bundles, and per model and threads

- the measured latency against the sequential bound of torch's own kernels (BR ≤ 1 expected);
- fidelity, as nn-Meter reports it: per layer the profile attributes to an op of torch's run,
  the isolated benchmark of the variant torch ran (``Backend.ran``: oneDNN enabled, contiguous;
  the 10th percentile of its per-call kernel times) against the 10th percentile of that layer's
  own time in the whole model's runs (its ``record_function`` range in the trace, the time the
  analysis gives the layer), and the share of layers within ±10 %, by count and by the
  layers' time in the model (``within_10pct_of_time``; each pair in
  ``--work/MODEL-tN-fidelity.json``); and the same against the layer's aten ops alone in the
  model (``fidelity_aten_ops``: the operators its range called, without torch_exec's Python
  around them; pairs in ``MODEL-tN-fidelity-aten.json``), which tells the kernels' fidelity
  apart from the executor's per-layer overhead; and kernel to kernel (``fidelity_onednn_calls``),
  for the layers torch ran through oneDNN in the profile: the same isolated time, oneDNN's own
  execution times, against the layer's oneDNN execution times in the whole model's verbose log
  (the profile's ``onednn.log``, its calls aligned to the layers as Q3/Q4 align them, the
  reorders torch makes around a call counted with it as the isolated benchmark counts them),
  10th percentile over the traced runs (pairs in ``MODEL-tN-fidelity-onednn.json``; its ``ops``
  says how many layers it covers: a layer torch ran with its own kernels has no oneDNN call);
- the same three readings of the isolated benchmarks measured with a cold cache (``benanza run
  --cold-cache``: the last-level cache evicted before every timed call, a stack of its own in the
  same database): ``fidelity_cold``, ``fidelity_aten_ops_cold``, ``fidelity_onednn_calls_cold``
  (pairs in ``MODEL-tN-fidelity-cold*.json``), and that stack's bound, ``bound_ms_cold``; and
  with cold weights (``--cold-weights``: evicted, then the layer's inputs read back, the state
  of a layer inside a model too big for the cache), the same keys ending ``_cold_weights``
  (pairs in ``MODEL-tN-fidelity-cold-weights*.json``); ``--cache`` picks which of the two;
- Q3: how many layers torch ran with a slower variant than its fastest, and the milliseconds
  to gain;

and on stderr the rows as docs/backends.md's Markdown table. Every stage keeps its output under
``--work``: the benchmarks are generated once, a second run measures only what the database
lacks, and a profile is taken again only with ``--reprofile``.
"""

from __future__ import annotations

import argparse
import bisect
import json
import sys
from dataclasses import replace
from pathlib import Path

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
    profile,
    readings,
    row,
)

from benanza.analysis.matching import CallAlignment
from benanza.backends.torch_native import BACKEND
from benanza.errors import BenanzaError
from benanza.generator import GenOptions
from benanza.layers import Model
from benanza.parsers import load_profile
from benanza.parsers.base import LibraryCall
from benanza.perfdb import PerfDB
from benanza.processor import load_model
from benanza.runner import RunOptions
from benanza.sweep import SweepRequest, run_sweep


def aten_samples_ms(trace: Path, first_run: int) -> dict[str, list[float]]:
    """Per layer, its time in each run from ``first_run`` on, counting only the aten ops its
    ``record_function`` range called (the outermost operators inside it), in ms: what the
    isolated benchmark times for a node that made no oneDNN call, without the executor's Python
    around them. The kineto parser keeps no operator inside a range, so the raw trace is read."""
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") == "X"]
    runs = sorted(float(e["ts"]) for e in events if e.get("cat") == "user_annotation" and e["name"] == "benanza_run")
    ops: dict[str, list[tuple[float, float]]] = {}  # per thread, (start, end), sorted
    for e in sorted((e for e in events if e.get("cat") == "cpu_op"), key=lambda e: float(e["ts"])):
        ops.setdefault(str(e["tid"]), []).append((float(e["ts"]), float(e["ts"]) + float(e["dur"])))
    times: dict[str, list[float]] = {}
    for r in events:
        if r.get("cat") != "user_annotation" or r["name"] == "benanza_run":
            continue
        start, end = float(r["ts"]), float(r["ts"]) + float(r["dur"])
        if bisect.bisect_right(runs, start) - 1 < first_run:
            continue
        thread = ops.get(str(r["tid"]), [])
        inside, covered, i = 0.0, start, bisect.bisect_left(thread, (start, start))
        while i < len(thread) and thread[i][0] <= end:
            a, b = thread[i]
            if a >= covered:  # not inside the operator counted before it
                inside, covered = inside + (min(b, end) - a), b
            i += 1
        times.setdefault(r["name"], []).append(inside / 1e3)
    return times


def onednn_samples_ms(model: Model, alignment: CallAlignment, calls: list[LibraryCall],
                      first_run: int) -> dict[str, list[float]]:
    """Per layer torch ran through oneDNN, its oneDNN execution time in each pass of the log from
    ``first_run`` on (a pass is one run of the model: the log starts with the trace's warm-up run),
    in ms, by the layer's name (torch_exec's range name, so its trace op's). The layer's calls are
    those torch's isolated benchmark sums for it (torch_native: all of a node's oneDNN calls): the
    call the analysis aligned to it (Q3/Q4's ``alignment``; a call matched with deviations
    computed another problem, so its layer is left out) and the reorders torch makes around it,
    which name no layer: those after the previous aligned call go to the next one, except the
    reorder right after an aligned call that has its layer's output dims (its result written back
    to a plain tensor)."""
    aligned = sorted((m.call.index, p, m) for p, matches in enumerate(alignment.passes) for m in matches)
    at = [i for i, _, _ in aligned]
    per_call = {i: m.call.time_ms or 0.0 for i, _, m in aligned}
    for c in calls:
        if c.api != "reorder":
            continue
        k = bisect.bisect_left(at, c.index)  # the next aligned call
        before = aligned[k - 1][2] if k else None
        if before is not None and c.index == before.call.index + 1 and \
                dict(c.detail).get("problem") == "x".join(map(str, model.nodes[before.node].layer.outputs[0].shape)):
            per_call[before.call.index] += c.time_ms or 0.0
        elif k < len(aligned):
            per_call[aligned[k][0]] += c.time_ms or 0.0
    times: dict[str, list[float]] = {}
    for i, p, m in aligned:
        if p >= first_run and not m.deviations:
            times.setdefault(model.nodes[m.node].name, []).append(per_call[i])
    return times


def measure(model: Path, threads: int, args: argparse.Namespace, work: Path) -> dict:
    """One model at one thread count: the row of the warm isolated benchmarks, with the three
    fidelity readings of each cold state asked for (``_cold``, ``benanza run --cold-cache``;
    ``_cold_weights``, ``--cold-weights``) beside it."""
    db = work / f"{model.stem}.db"
    warm = RunOptions(threads=threads, min_time=args.min_time, repetitions=args.repetitions, timeout=120)
    stacks = {suffix: measure_benchmarks(model, "torch", work / f"bench-{model.stem}", db,
                                         GenOptions(dtypes=("f32",), fusion=False), options)
              for suffix, options in (("", warm), *((cold_suffix(c), replace(warm, cache=c)) for c in args.cache))}
    # the analysis leaves the trace's first run out (it warms up): --runs runs after it count
    folder = profile(model, "torch", threads, args, work, args.runs + 1)
    bundle = load_profile([str(folder)])
    assert bundle is not None and bundle.trace is not None  # profile_model wrote its trace
    out: dict = {"model": model.stem, "threads": threads}
    for suffix, measured in stacks.items():
        with PerfDB(db, readonly=True) as pdb:
            (a,) = run_sweep(SweepRequest(model=str(model), systems=(SYSTEM,), stack=measured.system.stack_id), pdb,
                             bundle)
            speeds = readings(pdb, measured.system)
        detail = f"{model.stem}-t{threads}-fidelity{suffix.replace('_', '-')}"
        onednn = next((lib.alignment for lib in a.libraries if lib.library == "onednn"), None)
        calls = onednn_samples_ms(load_model(model, batch_size=1), onednn, bundle.library_calls["onednn"], 1) \
            if onednn is not None else {}
        pairs = fidelity_pairs(a, op_samples_ms(bundle.trace, 1), speeds=speeds)
        aten = fidelity(fidelity_pairs(a, aten_samples_ms(folder / "torch_trace.json", 1)),
                        work / f"{detail}-aten.json")
        onednn_calls = fidelity(fidelity_pairs(a, calls), work / f"{detail}-onednn.json")
        if not suffix:
            threads_compared = {"profile": a.threads.profile, "benchmarks": a.threads.benchmarks} if a.threads else None
            out |= {"threads_compared": threads_compared, **row(a, measured, pairs, work / f"{detail}.json"),
                    "fidelity_aten_ops": aten, "fidelity_onednn_calls": onednn_calls}
        else:
            out |= {f"bound_ms{suffix}": round(a.bounds.sequential_ms, 4),
                    f"fidelity{suffix}": fidelity(pairs, work / f"{detail}.json"), f"fidelity_aten_ops{suffix}": aten,
                    f"fidelity_onednn_calls{suffix}": onednn_calls}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", default=None, choices=model_choices(),
                    help=f"a benanza.zoo model or {' / '.join(EXPORTED)} (default {', '.join(DEFAULT_MODELS)})")
    ap.add_argument("--threads", action="append", type=int, default=None, help="intra-op threads (default 1 and 2)")
    ap.add_argument("--work", default="out/fidelity_torch")
    ap.add_argument("--min-time", type=float, default=0.05)
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--runs", type=int, default=100, help="profiled runs of the whole model, after one warm-up run")
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
    try:
        rows = [measure(p, t, args, work) for p in paths for t in (args.threads or [1, 2])]
    except BenanzaError as exc:  # a model torch cannot run, a run that failed: its one line
        sys.exit(f"fidelity_torch: {exc}")
    print(json.dumps({**machine(), **BACKEND.stack_overrides(None), "load_before": load,
                      "load_after": load_average(), "rows": rows}, indent=1))
    print(markdown(rows, "torch", (("fidelity_onednn_calls", "oneDNN calls: layers, within ±10 %, median"),
                                   *((f"fidelity_onednn_calls{cold_suffix(c)}", f"oneDNN calls, {c}")
                                     for c in args.cache))),
          file=sys.stderr)


if __name__ == "__main__":
    main()
