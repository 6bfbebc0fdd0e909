"""Generated files do not depend on the order models are given in, on the 30 reference models.

Builds the reference models (``benanza zoo``, offline and deterministic), runs ``benanza
generate`` on them in the zoo's order and in the reverse order, each time into the same folder
(so paths written into the output are the same), and compares every file the two runs wrote
byte for byte: sources, build files, cut-out subgraphs and the JSON indexes (the manifest
``layers.json``, ``variants.json``). Prints one line per backend and exits 1 when a file differs.

    python benchmarks/generated_order.py [--models models] [--backend onednn --backend cudnn ...]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from click.testing import CliRunner

from benanza.cli import main as cli
from benanza.zoo import MODELS, build_all

BACKENDS = ("onednn", "cudnn", "onnxruntime")


def tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder``, by its path relative to it."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def generate(models: list[Path], out: Path, backend: str) -> dict[str, bytes]:
    if out.exists():
        shutil.rmtree(out)
    result = CliRunner().invoke(cli, ["generate", *map(str, models), "--out", str(out), "--backend", backend])
    if result.exit_code != 0:
        raise SystemExit(f"benanza generate --backend {backend} failed: {result.output.strip()}")
    return tree(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", help="folder of the zoo's <name>.onnx (built into a temporary folder if not given; "
                                     "missing ones are built there)")
    ap.add_argument("--backend", action="append", choices=BACKENDS, help=f"repeatable; default: {', '.join(BACKENDS)}")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="benanza-order-") as tmp:
        folder = Path(args.models) if args.models else Path(tmp) / "models"
        missing = [m.name for m in MODELS if not (folder / f"{m.name}.onnx").exists()]
        if missing:
            build_all(folder, names=missing)
        models = [folder / f"{m.name}.onnx" for m in MODELS]
        differing = 0
        for backend in args.backend or BACKENDS:
            start = time.perf_counter()
            forward = generate(models, Path(tmp) / "out", backend)
            backward = generate(models[::-1], Path(tmp) / "out", backend)
            diff = sorted(name for name in forward.keys() | backward.keys() if forward.get(name) != backward.get(name))
            differing += len(diff)
            took = time.perf_counter() - start
            verdict = f"{len(forward) - len(diff)} of {len(forward)} files byte-identical"
            verdict += f"; {len(diff)} differ: {', '.join(diff[:10])}" if diff else ""
            print(f"{backend}: {len(models)} models in both orders, {verdict} ({took:.0f}s)")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
