"""Compile time of the cuDNN/cuBLAS benchmarks for all 30 reference models. Target: ≤ 5 min on 2 cores.

Steps, each timed: build the zoo models (skipped when --models holds them), process them and
generate every cuDNN variant (default options: 8 algorithms × f32/f16 × NCHW/NHWC plus fused
variants), CMake configure, and the build (nvcc + g++, `-j JOBS`), all from a clean build folder.
Then the binary is run once with --benanza_list to check that every generated variant is
registered. No GPU is needed: this measures the generator and the compiler only.

    python benchmarks/bench_cudnn_compile.py [--models models] [--jobs 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benanza.generator import GenOptions, generate
from benanza.layers import unique_layers
from benanza.manifest import build_manifest
from benanza.processor import load_model
from benanza.zoo import MODELS, build_all


def timed(label: str, fn, timings: dict):
    start = time.perf_counter()
    out = fn()
    timings[label] = round(time.perf_counter() - start, 2)
    print(f"{label:>10}: {timings[label]:8.2f} s", file=sys.stderr)
    return out


def run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd[:3])} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, help="folder with the zoo's .onnx files (built if missing)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", type=Path, help="also write the numbers here")
    args = ap.parse_args()

    timings: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-cudnn-") as tmp:
        work = Path(tmp)
        models_dir = args.models or work / "models"
        names = [m.name for m in MODELS]
        if not all((models_dir / f"{n}.onnx").exists() for n in names):
            timed("zoo", lambda: build_all(models_dir, names=names), timings)

        def gen():
            loaded = [load_model(models_dir / f"{n}.onnx") for n in names]
            manifest = build_manifest(loaded, unique_layers(loaded))
            return manifest, generate(manifest, "cudnn", work / "bench", GenOptions())

        manifest, generated = timed("generate", gen, timings)
        project = generated.out_dir
        build = project / "build"
        configure = ["cmake", "-S", str(project), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release"]
        if shutil.which("ninja"):
            configure += ["-G", "Ninja"]
        timed("configure", lambda: run(configure), timings)
        timed("build", lambda: run(["cmake", "--build", str(build), "-j", str(args.jobs)]), timings)
        listed = subprocess.run([str(build / "benanza_bench"), "--benanza_list"], capture_output=True,
                                text=True, check=True).stdout.split()
        if len(listed) != len(generated.variants):
            sys.exit(f"binary registers {len(listed)} benchmarks, generator wrote {len(generated.variants)}")
        sources = sorted(p.name for p in project.glob("tables_*.cpp"))

    result = {
        "models": len(names),
        "unique_layers": len(manifest.layers),
        "covered_unique_layers": sum(1 for u in manifest.layers if u.layer.cudnn_api),
        "variants": len(generated.variants),
        "table_files": len(sources),
        "jobs": args.jobs,
        "cpus": os.cpu_count(),
        "seconds": timings,
        "compile_seconds": round(timings["configure"] + timings["build"], 2),
        "target_seconds": 300,
    }
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
