"""Fidelity of the oneDNN benchmarks: our latency vs oneDNN's own per-execution time.

Usage: python benchmarks/fidelity_onednn.py [--work DIR] [--min-time 0.2] [--repetitions 3]

For ResNet-50 v1's convolutions (f32, layout any, algo auto, unfused) it runs the generated
benchmarks twice with the same threads: once normally (our median, what the database
stores) and once with ONEDNN_VERBOSE/DNNL_VERBOSE=1, whose `exec` lines carry oneDNN's own
time of each execution (median taken per benchmark). It prints the ratio per layer and its
median (target 0.95-1.05). If torch is importable, PyTorch CPU conv2d for the same shapes
is timed beside it as a reference, not a target.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from benanza.backends.base import build
from benanza.generator import GenOptions, generate
from benanza.layers import unique_layers
from benanza.manifest import build_manifest, write_manifest
from benanza.problems import ConvProblem
from benanza.processor import load_model
from benanza.records import Variant
from benanza.runner import parse_result
from benanza.system import default_threads
from benanza.zoo import build_all


def verbose_exec_ms(line: str) -> float | None:
    """oneDNN's time of one convolution execution from a 2.x or 3.x verbose line."""
    fields = line.strip().split(",")
    if len(fields) < 5 or "exec" not in fields[:3] or "convolution" not in fields[:6]:
        return None
    try:
        return float(fields[-1])
    except ValueError:
        return None


def run_binary(binary: Path, names: list[str], env: dict, min_time: float, reps: int) -> dict[str, dict]:
    """Per benchmark: its result line and the verbose exec times printed while it ran."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("\n".join(names) + "\n")
    out = subprocess.run([str(binary), f"--benanza_names={f.name}", f"--benchmark_min_time={min_time:g}",
                          f"--benchmark_repetitions={reps}"], capture_output=True, text=True, env=env, check=True)
    os.unlink(f.name)
    per: dict[str, dict] = {}
    current = None
    for line in out.stdout.splitlines():
        tag, _, payload = line.partition(" ")
        if tag == "BENANZA_START":
            current = payload
            per[current] = {"exec_ms": []}
        elif tag == "BENANZA_RESULT":
            data = json.loads(payload)
            per.setdefault(data["name"], {"exec_ms": []})["result"] = data
            current = None
        elif current is not None:
            t = verbose_exec_ms(line)
            if t is not None:
                per[current]["exec_ms"].append(t)
    return per


def torch_conv_ms(p: ConvProblem, threads: int, min_time: float) -> float | None:
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(threads)
    x = torch.rand(p.mb, p.ic, p.ih, p.iw)
    w = torch.rand(p.oc, p.ic // p.g, p.kh, p.kw)
    b = torch.rand(p.oc) if p.bias else None
    if (p.pt, p.pl) != (p.pb, p.pr):
        return None

    def once():
        torch.nn.functional.conv2d(x, w, b, (p.sh, p.sw), (p.pt, p.pl), (p.dh, p.dw), p.g)

    with torch.inference_mode():
        for _ in range(3):
            once()
        samples = []
        for _ in range(3):
            n, start = 0, time.perf_counter()
            while time.perf_counter() - start < min_time:
                once()
                n += 1
            samples.append((time.perf_counter() - start) / n * 1e3)
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default="out/fidelity_onednn")
    ap.add_argument("--min-time", type=float, default=0.2)
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    work = Path(args.work)
    threads = args.threads or default_threads()
    paths = build_all(work / "models", names=["resnet50-v1"])
    models = [load_model(p, batch_size=1) for p in paths]
    manifest = build_manifest(models, unique_layers(models))
    write_manifest(manifest, work / "bench")
    gen = generate(manifest, "onednn", work / "bench", GenOptions(dtypes=("f32",), layouts=("any",), fusion=False))
    conv: list[Variant] = [v for v in gen.variants if isinstance(v.problem, ConvProblem) and v.algo == "auto"]
    binary = build(work / "bench" / "onednn")
    base_env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    ours = run_binary(binary, [v.name for v in conv], base_env, args.min_time, args.repetitions)
    verbose = run_binary(binary, [v.name for v in conv], dict(base_env, ONEDNN_VERBOSE="1", DNNL_VERBOSE="1"),
                         args.min_time, 1)
    rows = []
    for v in conv:
        result = parse_result(v, "fidelity", ours[v.name]["result"])
        execs = verbose.get(v.name, {}).get("exec_ms", [])
        if not result.ok or not execs:
            continue
        lib = statistics.median(execs)
        rows.append({"layer": v.layer_key, "ours_ms": round(result.median_ms, 4), "onednn_verbose_ms": round(lib, 4),
                     "ratio": round(result.median_ms / lib, 3), "impl": result.implementation,
                     "torch_ms": torch_conv_ms(v.problem, threads, args.min_time)})
    ratios = [r["ratio"] for r in rows]
    torch_ratios = [r["ours_ms"] / r["torch_ms"] for r in rows if r["torch_ms"]]
    print(json.dumps({"threads": threads, "layers": len(rows), "median_ratio": statistics.median(ratios),
                      "min_ratio": min(ratios), "max_ratio": max(ratios),
                      "median_ours_over_torch": statistics.median(torch_ratios) if torch_ratios else None,
                      "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
