"""What PyTorch's calls into cuDNN, cuBLAS and cuBLASLt write to the libraries' own API logs on
this GPU, as `benanza profile --device cuda` turns the loggers on (profiler.LOG_ENV): the samples
the log parsers are checked against (tests/data/cuda_logs/).

Run on the GPU machine: ``python3 benchmarks/cuda_log_probe.py --out DIR``. Each case runs in its
own process with its own log files, so a sample holds only that case's calls; the files are cut
at ``--max-bytes`` (the headers of each log come first, and a case's calls repeat).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benanza.profiler import LOG_ENV  # noqa: E402

# (name, what torch runs): the layer kinds of the kit's models
CASES = {
    "conv_f32_nchw": "x = torch.randn(1, 64, 56, 56, device='cuda'); w = torch.randn(64, 64, 3, 3, device='cuda');"
                     " y = F.conv2d(x, w, padding=1)",
    "conv_f16_nhwc": "x = torch.randn(1, 64, 56, 56, device='cuda', dtype=torch.half)"
                     ".to(memory_format=torch.channels_last);"
                     " w = torch.randn(64, 64, 3, 3, device='cuda', dtype=torch.half)"
                     ".to(memory_format=torch.channels_last); y = F.conv2d(x, w, padding=1)",
    "conv_bias_relu_f32": "x = torch.randn(1, 3, 224, 224, device='cuda'); w = torch.randn(64, 3, 7, 7, device='cuda');"
                          " b = torch.randn(64, device='cuda'); y = F.relu(F.conv2d(x, w, b, stride=2, padding=3))",
    "linear_f32": "x = torch.randn(1, 2048, device='cuda'); w = torch.randn(1000, 2048, device='cuda');"
                  " b = torch.randn(1000, device='cuda'); y = F.linear(x, w, b)",
    "linear_f32_seq": "x = torch.randn(128, 256, device='cuda'); w = torch.randn(1024, 256, device='cuda');"
                      " b = torch.randn(1024, device='cuda'); y = F.linear(x, w, b)",
    "matmul_nobias_f32": "a = torch.randn(128, 256, device='cuda'); b = torch.randn(256, 256, device='cuda');"
                         " y = a @ b",
    "bmm_f32": "a = torch.randn(4, 128, 64, device='cuda'); b = torch.randn(4, 64, 128, device='cuda');"
               " y = torch.bmm(a, b)",
    "sdpa_f16": "q = torch.randn(1, 4, 128, 64, device='cuda', dtype=torch.half);"
                " y = F.scaled_dot_product_attention(q, q, q, is_causal=True)",
}

_CHILD = """
import torch, torch.nn.functional as F
torch.backends.cudnn.benchmark = False
for _ in range(2):
    {code}
torch.cuda.synchronize()
print(torch.backends.cudnn.version(), torch.version.cuda)
"""


def run_case(name: str, code: str, out: Path, max_bytes: int, python: str) -> dict:
    case = out / name
    case.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **LOG_ENV, "CUDNN_LOGDEST_DBG": str(case / "cudnn.log"),
           "CUBLAS_LOGDEST_DBG": str(case / "cublas.log"), "CUBLASLT_LOG_FILE": str(case / "cublaslt.log")}
    p = subprocess.run([python, "-c", _CHILD.format(code=code)], env=env, capture_output=True, text=True,
                       timeout=120)
    sizes = {}
    for f in sorted(case.glob("*.log")):
        sizes[f.name] = f.stat().st_size
        if f.stat().st_size > max_bytes:
            with f.open("rb") as fh:
                head = fh.read(max_bytes)
            f.write_bytes(head)
    return {"case": name, "rc": p.returncode, "stdout": p.stdout.strip()[-500:], "stderr": p.stderr.strip()[-1500:],
            "log_bytes": sizes}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--max-bytes", type=int, default=400_000)
    ap.add_argument("--python", default=sys.executable)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results = [run_case(n, c, args.out, args.max_bytes, args.python) for n, c in CASES.items()]
    (args.out / "probe.json").write_text(json.dumps(results, indent=1) + "\n")
    for r in results:
        print(r["case"], r["rc"], r["log_bytes"], r["stdout"], r["stderr"][-300:] if r["rc"] else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
