"""`benanza analyze` of DenseNet-121 (910 layers) against a warm performance database. Target: ≤ 2 s.

Timed: the analysis in-process (process the model, query the database, all analyses), and the
whole `benanza analyze --json` command (wall and CPU time, interpreter start-up included).

The database is filled for this benchmark only, with SYNTHETIC results: every oneDNN variant
the generator expands for DenseNet-121's layers gets a Result whose latency follows the layer's
FLOPs and bytes (so the chosen variants and critical path are structured like a real run), and
one variant in seven is stored as unsupported. No real benchmark ran; the numbers measure the
analyzer, never a machine.

    python benchmarks/bench_analyze.py [--repeat 5] [--json out.json] [--compare OTHER_TREE]

The command is timed twice from this tree: with the processed model in its cache
(``benanza.model_cache``, written by the untimed first round: what every analysis of an unchanged
file gets), and with an empty cache each run (``cold``: the model processed, and the entry written).
``--compare`` also runs the same command with the ``benanza`` package of another source tree
(e.g. ``git archive <commit> benanza | tar -x -C OTHER_TREE``); all alternate run by run so a busy
machine weighs on each alike, and all must print the same bytes. Both trees must read the
database's schema. The in-process figure is of the analysis with the processed model cached.

Each command runs with warm bytecode, as an installed package has: the children write and read
their ``.pyc`` files under a temporary prefix, whatever PYTHONDONTWRITEBYTECODE says.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

from benanza.generator import GenOptions, expand_variants, get_backend
from benanza.layers import unique_layers
from benanza.manifest import build_manifest
from benanza.perfdb import PerfDB
from benanza.processor import load_model
from benanza.records import Result, Status, System
from benanza.sweep import SweepRequest, run_sweep
from benanza.zoo import build_all

MODEL = "densenet-121"
SYSTEM = System("bench-synthetic", "onednn", "synthetic (bench_analyze.py)", (("onednn", "synthetic"),))


def synthetic_results(model_path: Path) -> list[Result]:
    model = load_model(model_path, 1)
    manifest = build_manifest([model], unique_layers([model]))
    layers = {u.layer.problem: u.layer for u in manifest.layers}
    variants = expand_variants(manifest, get_backend("onednn"), GenOptions())
    out = []
    for i, v in enumerate(variants):
        layer = layers.get(v.problem)
        if i % 7 == 3:
            out.append(Result(v, SYSTEM.name, Status.UNSUPPORTED, "synthetic: unsupported"))
            continue
        work = (layer.flops / 50e9 + layer.bytes / 20e9) * 1e3 if layer else 0.01
        factor = 1.0 + (zlib.crc32(v.algo.encode()) % 5) * 0.1 + (0.3 if v.dtype != "f32" else 0.0)
        out.append(Result(v, SYSTEM.name, Status.OK, median_ms=work * factor + 0.002, mean_ms=work * factor,
                          iterations=100, repetitions=1, implementation=f"synthetic:{v.algo}"))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", dest="json_out")
    ap.add_argument("--compare", metavar="TREE", help="Also time (and diff) the command with this tree's package.")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        os.environ["BENANZA_MODEL_CACHE"] = str(root / "model-cache")  # never the user's cache
        (model_path,) = build_all(root, names=[MODEL])
        results = synthetic_results(model_path)
        nodes = len(load_model(model_path, 1).nodes)
        req = SweepRequest(str(model_path), (SYSTEM.name,))
        lib = []
        # closed before the commands run, as `benanza run` leaves it: its writes checkpointed out
        # of the write-ahead log, which every reader would otherwise search
        with PerfDB(root / "bench.db") as db:
            db.insert_results(SYSTEM, results, command="benchmarks/bench_analyze.py (synthetic)")
            run_sweep(req, db)  # warm: OS cache, SQLite pages, imports
            for _ in range(args.repeat):
                t = time.perf_counter()
                (a,) = run_sweep(req, db)
                lib.append(time.perf_counter() - t)
        argv = ["analyze", str(model_path), "--system", SYSTEM.name, "--db", str(root / "bench.db"), "--json"]
        here = Path(__file__).resolve().parent.parent
        trees = {"this": here, "cold": here}
        if args.compare:
            trees["compare"] = Path(args.compare).resolve()
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        cli: dict[str, list[float]] = {k: [] for k in trees}
        cli_cpu: dict[str, list[float]] = {k: [] for k in trees}
        printed: dict[str, bytes] = {}
        load = []  # the 1-minute load average, each round
        for i in range(args.repeat + 1):  # the first round only writes the bytecode (and the cache entry)
            load.append(os.getloadavg()[0])
            for which, tree in trees.items():
                # the console script's own call, with the package imported from ``tree``
                cmd = [sys.executable, "-c", "import sys; from benanza.cli import main; sys.exit(main())", *argv]
                cache = root / "model-cache" if which != "cold" else root / f"cold-cache-{i}"
                pycache = root / "pycache" / ("compare" if which == "compare" else "this")
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                t = time.perf_counter()
                # run where no package lies: `-c` puts the working directory first on the path
                out = subprocess.run(cmd, check=True, capture_output=True, cwd=root,
                                     env={**env, "PYTHONPATH": str(tree), "BENANZA_MODEL_CACHE": str(cache),
                                          "PYTHONPYCACHEPREFIX": str(pycache)}).stdout
                if i:
                    cli[which].append(time.perf_counter() - t)
                    after = resource.getrusage(resource.RUSAGE_CHILDREN)
                    cli_cpu[which].append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
                printed[which] = out
    # the whole command, interpreter start and imports included; CPU time is robust to a busy machine
    timed = {which: {"median": statistics.median(cli[which]), "min": min(cli[which]),
                     "cpu_median": statistics.median(cli_cpu[which])} for which in trees}
    report = {"model": MODEL, "layers": nodes, "results_in_db": len(results),
              "analyze_library_s": {"median": statistics.median(lib), "min": min(lib)},
              "analyze_cli_s": timed["this"], "analyze_cli_s_cold_cache": timed["cold"],
              "same_output": len(set(printed.values())) == 1,
              "target_s": 2.0, "sequential_ms": a.bounds.sequential_ms, "parallel_ms": a.bounds.parallel_ms,
              "load_average_1min": {"min": min(load), "max": max(load)}}
    if args.compare:
        base = timed["compare"]["cpu_median"]
        report["analyze_cli_s_compare"] = {"tree": str(trees["compare"]), **timed["compare"],
                                           "cpu_ratio": timed["this"]["cpu_median"] / base,
                                           "cold_cpu_ratio": timed["cold"]["cpu_median"] / base}
    print(json.dumps(report, indent=1))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=1))
    if not report["same_output"]:
        print("the runs print different JSON", file=sys.stderr)
        return 1
    # the target is the analysis itself (model processing + database query + analyses)
    return 0 if statistics.median(lib) <= 2.0 else 1


if __name__ == "__main__":
    sys.exit(main())
