"""Processing the 30 reference models vs bare `onnx.load` + `onnx.shape_inference.infer_shapes`.

Both sides run on the same files in the same process, alternating, best of N, so machine
noise hits both alike. Target (issue 2): ratio ≤ 1.3.

    python benchmarks/bench_processor.py [--models models] [--repeat 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import onnx

from benanza.layers import unique_layers
from benanza.processor import load_model


def bare(path: Path) -> None:
    onnx.shape_inference.infer_shapes(onnx.load(str(path)))


def ours(path: Path) -> None:
    load_model(path)


def timed(fn, paths) -> float:
    start = time.perf_counter()
    for p in paths:
        fn(p)
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="models", help="folder of <name>.onnx (built if empty)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", dest="json_out")
    args = ap.parse_args()
    folder = Path(args.models)
    from benanza.zoo import MODELS, build_all

    paths = [folder / f"{m.name}.onnx" for m in MODELS]
    if not all(p.exists() for p in paths):
        build_all(folder)
    bare_s, ours_s = [], []
    for _ in range(args.repeat):
        bare_s.append(timed(bare, paths))
        ours_s.append(timed(ours, paths))
    models = [load_model(p) for p in paths]
    result = {
        "models": len(paths),
        "layers": sum(len(m.nodes) for m in models),
        "unique_layers": len(unique_layers(models)),
        "bare_onnx_s": min(bare_s),
        "benanza_s": min(ours_s),
        "ratio": min(ours_s) / min(bare_s),
    }
    print(json.dumps(result, indent=1))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
