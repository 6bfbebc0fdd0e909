"""Timing fidelity on a GPU: each convolution's latency in the performance database (the fastest
f32 NCHW algorithm Benanza's cuDNN benchmark timed, FMA math, no fusion) against the same
convolution timed through PyTorch on the same GPU, in the same conditions: L2 flushed before every
timed call, CUDA events around the call alone, PyTorch's own algorithm search
(``cudnn.benchmark``) with TF32 off, so both sides run exact f32. A ratio above 1 means Benanza's
"fastest" is slower than what PyTorch gets from the same library: the bound would not bound.

Also timed with PyTorch's defaults (TF32 allowed for cuDNN convolutions), which is what a
PyTorch model runs: the f32 bound has no TF32 variants to match it (the ratio says how far).

Run on the GPU machine after a campaign:
``python3 benchmarks/fidelity_cuda.py --db perfdb/<gpu>.db --system <gpu> --out FILE.json``
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benanza.perfdb import PerfDB  # noqa: E402
from benanza.records import Dtype, Layout, Math, Result, Status  # noqa: E402

FLUSH_BYTES = 256 << 20  # over twice the L2 of any current NVIDIA GPU (H200: 60 MB)


def our_best(db: Path, system: str, models: list[str]) -> list[dict]:
    """Per unique convolution of the models: its parameters and the fastest f32 NCHW FMA unfused
    variant among the latest ok results (the ones a bound uses)."""
    with PerfDB(db, readonly=True) as perf:
        q = ",".join("?" * len(models))
        params = {k: json.loads(p) for k, p in perf.db.execute(
            f"select key, params from layers where family = 'conv' and key in "
            f"(select layer_key from occurrences where model in ({q}))", models).fetchall()}
        best: dict[str, Result] = {}
        for r in perf.results(system, params):
            v = r.variant
            if r.status == Status.OK and r.median_ms is not None and (v.dtype, v.layout, v.math, v.fusion) == \
                    (Dtype.F32, Layout.NCHW, Math.FMA, "none"):
                if v.layer_key not in best or r.median_ms < (best[v.layer_key].median_ms or 0.0):
                    best[v.layer_key] = r
    return [{"layer": k, "params": params[k], "ours_ms": r.median_ms, "variant": r.variant.name}
            for k, r in sorted(best.items())]


def torch_ms(p: dict, tf32: bool, reps: int) -> float:
    import torch
    import torch.nn.functional as F

    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = tf32
    x = torch.randn(p["mb"], p["ic"], p["ih"], p["iw"], device="cuda")
    w = torch.randn(p["oc"], p["ic"] // p["g"], p["kh"], p["kw"], device="cuda")
    if p["pt"] != p["pb"] or p["pl"] != p["pr"]:
        x = F.pad(x, (p["pl"], p["pr"], p["pt"], p["pb"]))
        pad = (0, 0)
    else:
        pad = (p["pt"], p["pl"])

    def conv() -> object:
        return F.conv2d(x, w, None, (p["sh"], p["sw"]), pad, (p["dh"], p["dw"]), p["g"])

    flush = torch.empty(FLUSH_BYTES // 4, device="cuda")
    for _ in range(3):  # the algorithm search, then warm
        conv()
    times = []
    for _ in range(reps):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        conv()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", type=Path, required=True)
    ap.add_argument("--system", required=True)
    ap.add_argument("--models", nargs="+", default=["resnet50-v1", "inception-v1", "mobilenet-v2"])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    import torch

    rows = our_best(args.db, args.system, args.models)
    for r in rows:
        r["torch_exact_ms"] = torch_ms(r["params"], False, args.reps)
        r["torch_default_ms"] = torch_ms(r["params"], True, args.reps)
        r["ratio_exact"] = r["ours_ms"] / r["torch_exact_ms"]
        r["ratio_default"] = r["ours_ms"] / r["torch_default_ms"]
    ratios = sorted(r["ratio_exact"] for r in rows)
    summary = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
               "torch_cudnn": torch.backends.cudnn.version(), "convolutions": len(rows),
               "median_ratio_exact": statistics.median(ratios) if ratios else None,
               "over_1": sum(x > 1.0 for x in ratios), "over_1_05": sum(x > 1.05 for x in ratios),
               "max_ratio_exact": max(ratios) if ratios else None,
               "median_ratio_default": statistics.median(r["ratio_default"] for r in rows) if rows else None}
    args.out.write_text(json.dumps({"summary": summary, "rows": rows}, indent=1) + "\n")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
