"""Prefill and decode steps of Llama-, Qwen2- and Phi-style models from transformers' own code
(tests/hf_models.py: tiny configs, seeded weights, transformers' DynamicCache fed the KV cache as
inputs), exported with both of torch.onnx.export's exporters, and ONNX Runtime's dynamic int8
quantization of each decode export: what Benanza costs of them and how their oneDNN bound compares
with the frameworks' latency.

Every step both with the padding mask as an input (``attention_mask``, as Optimum and
transformers' own exporter write it) and without (one unpadded sequence). Per file: the export's
time (or the exporter's exact error), Benanza's processing time (load_model and its statistics, in
process), the share of the layers that run costed on oneDNN and on cuDNN/cuBLAS and the ops left
uncovered (`benanza generate --json` of every file together: the generator's own numbers). Then on
oneDNN, f32, at ``--threads``: `benanza run` with short settings (``--min-time 0.02 --repetitions
2``), `benanza profile --framework onnxruntime` at the same threads, PyTorch eager's time of the
same step (the transformers module itself; for the int8 files torch's own dynamic int8
quantization of its Linear layers) at the same threads, and `benanza analyze` of each file: the
sequential bound and BR = bound / measured for both, and Q5's fused bound (every matched fusion
pattern that pays off run as its one fused call: what a framework that fuses, as ONNX Runtime does,
is to be compared with) and its BR against ONNX Runtime. A bound resting on results measured under
contention is refused by `analyze`: the script re-measures the contended results once (`run
--remeasure-contended`) and prints a bound still refused marked as contended. Prints a Markdown
table, the uncovered ops and the load.

    python benchmarks/llm_exports.py [--work out/llm_exports] [--threads 1] [--seq 32] [--past 128]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import hf_models  # noqa: E402  (the test suite's builder: the same models its test checks)
from llm_models import quantize  # noqa: E402

BENANZA = str(Path(sys.executable).parent / "benanza")
SYSTEM = "llm-exports"


@dataclass
class File:
    """One exported step (or the exporter's error) and what was measured of it."""

    step: hf_models.Step
    form: str  # an exporter, or "<exporter> int8"
    path: Path | None = None
    error: str = ""
    export_s: float = 0.0
    process_s: float = 0.0
    stats: dict = field(default_factory=dict)
    analysis: dict = field(default_factory=dict)
    torch_ms: float | None = None
    contended: bool = False

    @property
    def int8(self) -> bool:
        return self.form.endswith("int8")


def sh(*args: str, ok: tuple[int, ...] = (0,)) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    done = subprocess.run([BENANZA, *args], capture_output=True, text=True, env=dict(os.environ, COLUMNS="200"))
    if done.returncode not in ok:
        sys.exit(f"benanza {' '.join(args)} failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
    return done, time.monotonic() - start


def export_all(families: list[str], seq: int, past: int, out: Path) -> list[File]:
    files = []
    for family in families:
        shapes = ((seq, 0), (1, past))  # a prefill, a decode step
        for step in (hf_models.Step(family, s, p, masked) for masked in (True, False) for s, p in shapes):
            for exporter in hf_models.EXPORTERS:
                f = File(step, exporter)
                start = time.monotonic()
                try:
                    f.path = hf_models.export(step, exporter, out)
                except Exception as exc:  # the exporter's own error is the result: record it, go on
                    f.error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
                f.export_s = time.monotonic() - start
                files.append(f)
                if step.phase == "decode" and f.path is not None:
                    q = File(step, f"{exporter} int8")
                    start = time.monotonic()
                    try:
                        q.path = quantize(f.path, out / f"{f.path.stem}_int8.onnx")
                    except Exception as exc:
                        q.error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
                    q.export_s = time.monotonic() - start
                    files.append(q)
    return files


def process_time(path: Path) -> float:
    """Benanza's processing of one file: load (shape inference, layers, folding) and statistics."""
    from benanza.model_stats import model_stats
    from benanza.processor import load_model

    start = time.monotonic()
    model_stats(load_model(path))
    return time.monotonic() - start


def torch_ms(f: File, threads: int, iterations: int = 50, warmup: int = 5) -> float:
    """PyTorch eager's trimmed-mean time of the same step (the statistic `benanza profile` reports)."""
    import torch

    from benanza.parsers.bundle import latency_stats

    torch.set_num_threads(threads)
    module = hf_models.Forward(hf_models.model(f.step.family), f.step.masked)
    if f.int8:
        module = torch.ao.quantization.quantize_dynamic(module, {torch.nn.Linear}, dtype=torch.qint8)
    args = hf_models.inputs(f.step)
    samples = []
    with torch.inference_mode():
        for i in range(warmup + iterations):
            start = time.perf_counter_ns()
            module(*args)
            if i >= warmup:
                samples.append((time.perf_counter_ns() - start) / 1e6)
    return latency_stats(samples).trimmed_mean_ms


def analyze(f: File, db: str, prof: Path) -> None:
    """The analysis against ONNX Runtime's profile; one refused (its bound rests on a contended
    result even after the re-measurement) is taken with --allow-contended and marked."""
    common = [str(f.path), "--system", SYSTEM, "--db", db, "--profile", str(prof), "--json"]
    done, _ = sh("analyze", *common, ok=(0, 3))
    if done.returncode == 3:
        f.contended = True
        done, _ = sh("analyze", *common, "--allow-contended")
    (f.analysis,) = json.loads(done.stdout)["analyses"]


def pct(stats: dict, backend: str) -> str:
    return f"{stats['backends'][backend]['covered_pct']:.1f}%"


def row(f: File) -> str:
    label = f"| {f.step.family} | {f.step.phase}{'' if f.step.masked else ', no mask'} | {f.form} |"
    if f.path is None:
        return f"{label} — | failed: `{f.error}` | | | | | | | | | |"
    a, s = f.analysis, f.stats
    bound, ort = a["bounds"]["sequential_ms"], a["measured_ms"]
    head = (f"{label} {s['running_layers']} | {f.export_s:.1f} / {f.process_s:.2f} | {pct(s, 'onednn')} | "
            f"{pct(s, 'cudnn')} |")
    if f.contended:  # what analyze refuses is no bound: its figure is shown only as the refusal's
        return (f"{head} refused: {len(a['contended_layers'])} layers rest on contended results "
                f"({bound:.4g} with them) | {ort:.4g} | — | — | — | {f.torch_ms:.4g} | — |")
    mark = " (partial)" if a["bounds"].get("partial") else ""
    fused = a["fusion"]["bounds"]["sequential_ms"]
    return (f"{head} {bound:.4g}{mark} | {ort:.4g} | {bound / ort:.2f} | {fused:.4g} | {fused / ort:.2f} | "
            f"{f.torch_ms:.4g} | {bound / f.torch_ms:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default="out/llm_exports")
    # one thread: on a loaded 2-core machine two threads' barriers wait on other processes, and
    # even a 64-element Mul measured milliseconds (stored contended)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seq", type=int, default=32, help="prompt tokens of the prefill")
    ap.add_argument("--past", type=int, default=128, help="KV-cache length of the decode step")
    ap.add_argument("--families", nargs="*", default=list(hf_models.FAMILIES), choices=list(hf_models.FAMILIES))
    args = ap.parse_args()
    work = Path(args.work).resolve()
    (work / "models").mkdir(parents=True, exist_ok=True)
    load = [os.getloadavg()[0]]
    files = export_all(args.families, args.seq, args.past, work / "models")
    made = [f for f in files if f.path is not None]
    for f in made:
        f.process_s = process_time(f.path)
    db, bench = str(work / "perf.db"), work / "bench"
    done, generate_s = sh("generate", *(str(f.path) for f in made), "--out", str(bench), "--backend", "onednn",
                          "--dtype", "f32", "--json")
    by_name = {m["model"]: m for m in json.loads(done.stdout)["models"]}
    for f in made:
        f.stats = by_name[f.path.stem]
    measure = ["run", "--bench-dir", str(bench), "--system", SYSTEM, "--db", db, "--backend", "onednn",
               "--threads", str(args.threads), "--min-time", "0.02", "--repetitions", "2"]
    _, run_s = sh(*measure, ok=(0, 3))
    sh(*measure, "--remeasure-contended", ok=(0, 3))  # once more, for what other processes disturbed
    load.append(os.getloadavg()[0])
    for f in made:
        prof = work / "prof" / f.path.stem
        sh("profile", str(f.path), "--framework", "onnxruntime", "--threads", str(args.threads), "--out", str(prof))
        f.torch_ms = torch_ms(f, args.threads)
        analyze(f, db, prof)
        load.append(os.getloadavg()[0])
    print(f"\nprefill {args.seq} tokens, decode 1 token after a KV cache of {args.past}; oneDNN f32, "
          f"{args.threads} threads\n")
    print("| family | step | exporter | layers that run | export / process s | oneDNN-costed | cuDNN/cuBLAS-costed "
          "| bound ms | ORT ms | BR ORT | fused bound ms | fused BR ORT | PyTorch ms | BR PyTorch |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for f in files:
        print(row(f))
    print()
    for f in made:
        gaps = {b: s["not_covered"] for b, s in f.stats["backends"].items() if s["not_covered"]}
        if gaps:
            print(f"- {f.path.stem}: not covered " + "; ".join(
                f"{b}: " + ", ".join(f"{op} ×{n}" for op, n in sorted(ops.items())) for b, ops in gaps.items()))
    load.append(os.getloadavg()[0])
    print(f"\nload average (1 min) over the run: {min(load):.2f}–{max(load):.2f} on {os.cpu_count()} CPUs; "
          f"generate {generate_s:.1f} s, run {run_s:.1f} s")


if __name__ == "__main__":
    main()
