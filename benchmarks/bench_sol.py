"""Speed of light against the measured bound, row by row: the transformer exports of
tests/torch_models.py (TorchScript opset 17 and dynamo opset 18; docs/transformers.md) and reference
models of the zoo, generated for oneDNN (f32), run and their stack's peaks measured by
`benanza run`, then analysed per model.

Printed per model: the measured bound (sequential / parallel), the speed-of-light bound over the
same layers, whether SOL ≤ bound in both, the share of the bound in memory-bound layers, the
results flagged impossible, and the layers whose best kernel beats its roofline time unflagged.
Peaks measured on a busy machine are not trusted (`Peaks.trusted`) and give an analysis no speed of
light; the script then also reports the analysis with those peaks taken as if trusted, marked so.
Peaks that low raise every roofline time, so SOL ≤ bound under them is the harder test; impossible
flags under them may be real results held to a roof measured too low.

    python benchmarks/bench_sol.py [--work out/bench_sol] [--threads 1] [--zoo lenet ...]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

BENANZA = str(Path(sys.executable).parent / "benanza")
EXPORTS = [("encoder", 17, "torchscript"), ("gpt", 17, "torchscript"), ("vit", 17, "torchscript"),
           ("mbv3", 17, "torchscript"), ("encoder", 18, "dynamo"), ("gpt", 18, "dynamo"), ("vit", 18, "dynamo"),
           ("mbv3", 18, "dynamo")]


def sh(*args: str) -> str:
    done = subprocess.run([BENANZA, *args], capture_output=True, text=True, env=dict(os.environ, COLUMNS="200"))
    if done.returncode not in (0, 3):
        sys.exit(f"benanza {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout + done.stderr


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path, default=Path("out/bench_sol"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--zoo", nargs="*", default=["lenet"])
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from torch_models import export

    from benanza.analysis.bounds import LayerStatus
    from benanza.analyzer import analyze
    from benanza.perfdb import PerfDB
    from benanza.processor import load_model
    from benanza.zoo import build_all

    work = args.work.resolve()
    models = work / "models"
    models.mkdir(parents=True, exist_ok=True)
    files = [export(name, opset, models, exporter=exp) for name, opset, exp in EXPORTS]
    if args.zoo:
        build_all(models, names=args.zoo)
        files += [models / f"{n}.onnx" for n in args.zoo]
    bench, db = work / "bench", work / "sol.db"
    sh("generate", *map(str, files), "--out", str(bench), "--backend", "onednn", "--dtype", "f32", "--no-fusion")
    print(sh("run", "--system", "sol", "--backend", "onednn", "--bench-dir", str(bench), "--db", str(db),
             "--threads", str(args.threads), "--min-time", "0.02", "--repetitions", "2", "--remeasure", "0")
          .strip().splitlines()[-1])
    print("| model | peaks | layers in the bound | bound seq / par (ms) | speed of light seq / par (ms) | SOL ≤ bound "
          "| memory-bound share | impossible | beyond roof, unflagged | on contended results |\n"
          "| --- | --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: |")
    with PerfDB(db, readonly=True) as pdb:
        ((system, _, _),) = pdb.stacks("sol")
        peaks = pdb.peaks(system)
        assert peaks is not None, "benanza run stored no peaks"
        for path in files:
            model = load_model(path, batch_size=1, name=path.stem)
            results = pdb.results(system)
            variants = [("measured", peaks)] + ([] if peaks.trusted else
                                                [(f"as if trusted ({peaks.contended:.0%} contended)",
                                                  replace(peaks, contended=0.0))])
            for label, p in variants:
                a = analyze(model, results, "sol", "onednn", stack=system, peaks=p)
                sol, b = a.speed_of_light, a.bounds
                # of the layers a library call runs, those with an OK, uncontended result
                counted = sum(1 for r in a.rows if r.status == LayerStatus.OK)
                costed = counted + sum(1 for r in a.rows if r.status == LayerStatus.MISSING)
                # the CLI refuses such an analysis: a contended candidate may hide a faster kernel
                contended = sum(1 for r in a.rows if r.status == LayerStatus.OK and r.contended)
                head = f"| {path.stem} | {label} | {counted}/{costed} | {b.sequential_ms:.4g} / {b.parallel_ms:.4g} |"
                if sol is None:
                    print(f"{head} none | — | — | — | — | {contended} |")
                    continue
                ok = sol.sequential_ms <= b.sequential_ms and sol.parallel_ms <= b.parallel_ms
                beyond = sum(1 for r in sol.layers if r.latency_ms and r.sol_ms > r.latency_ms and not r.impossible)
                share = sol.memory_bound_ms() / b.sequential_ms if b.sequential_ms else 0.0
                print(f"{head} {sol.sequential_ms:.4g} / {sol.parallel_ms:.4g} | {'yes' if ok else 'NO'} | "
                      f"{share:.0%} | {len(sol.impossible)} | {beyond} | {contended} |")
    gemm = ", ".join(f"{x.label} {x.value / 1e9:.4g} GFLOP/s ({x.implementation})" for x in peaks.peaks
                     if x.kind != "bandwidth")
    dram, llc = (x.value / 1e9 if x else 0.0 for x in (peaks.dram, peaks.llc))
    print(f"peaks: {peaks.threads} threads, {peaks.contended:.0%} contended; {gemm}; DRAM {dram:.3g} GB/s, "
          f"LLC {llc:.3g} GB/s")
    print("load average:", os.getloadavg())


if __name__ == "__main__":
    main()
