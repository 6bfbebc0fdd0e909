"""The parallel bound against its resource floors, and the module tree beside ONNX Runtime's time
per module, on ResNet-50 v1 and Inception-v1 (the zoo), a BERT-style encoder, and a Llama-shaped
decode step and prefill of the same weights (made here in torch and exported with the TorchScript
exporter, whose node names carry the module paths), and the same at Llama-3.2-1B's shapes
(``llama1b-decode``, ``llama1b-prefill``: 6 GB of f32 weights in external data, asked for by name).

Everything runs through the real commands: `benanza generate` (oneDNN, f32, layout any),
`benanza run` at one thread and at ``--threads`` under one system name (two stacks: the one-thread
stack gives the work floor; each run measures its stack's peaks), `benanza profile --framework
onnxruntime`, and `benanza analyze --json` of the ``--threads`` stack. Printed: a Markdown table per
model (critical path, each floor or why it is absent, which binds, the parallel and sequential
bounds, ONNX Runtime's latency), the module tree's top level (bound, critical path, ORT's time per
module), the terminal lines of `benanza analyze`, and the machine's load while it ran (the load
average, and the share of the peaks' time other processes took: peaks above 10% are not trusted
and give no memory or compute floor).

    python benchmarks/bench_floors.py [--work out/bench_floors] [--threads 2] [--models ...]
    python benchmarks/bench_floors.py --models llama1b-decode llama1b-prefill   # ~15 GB RAM to export
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

BENANZA = str(Path(sys.executable).parent / "benanza")
ZOO = ("resnet50-v1", "inception-v1")
MADE = ("bert-encoder", "llama-decode", "llama-prefill")
LARGE = ("llama1b-decode", "llama1b-prefill")  # past protobuf's 2 GB: only when named
# The Llama-shaped decode step: Llama's layout (RMSNorm, grouped-query attention over a KV cache,
# a SiLU-gated MLP, untied embedding and head) at a size this machine's benchmarks run in minutes;
# 8 layers of 1024 make 622 MB of f32 weights, past a few hundred MB of last-level cache.
LLAMA = {"layers": 8, "hidden": 1024, "heads": 16, "kv_heads": 4, "ffn": 2816, "vocab": 32000, "cache": 128}
# Llama-3.2-1B's shapes (its config.json), the head untied like the smaller one's: 1.50 G
# parameters, 6.0 GB of f32 (the real model ties its head to the embedding: 1.24 G, 4.9 GB)
LLAMA1B = {"layers": 16, "hidden": 2048, "heads": 32, "kv_heads": 8, "ffn": 8192, "vocab": 128256, "cache": 128}
# each made model's config and prompt length (1: a decode step over the config's KV cache)
LLAMAS = {"llama-decode": (LLAMA, 1), "llama-prefill": (LLAMA, 128),
          "llama1b-decode": (LLAMA1B, 1), "llama1b-prefill": (LLAMA1B, 128)}
BERT = {"layers": 4, "hidden": 256, "heads": 4, "ffn": 1024, "seq": 128}


def sh(*args: str, cwd: Path) -> tuple[str, float]:
    start = time.monotonic()
    done = subprocess.run([BENANZA, *args], cwd=cwd, capture_output=True, text=True,
                          env=dict(os.environ, COLUMNS="200"))
    if done.returncode not in (0, 3):
        sys.exit(f"benanza {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout, time.monotonic() - start


def make_models(out: Path, names: list[str]) -> dict[str, tuple[Path, list[str]]]:
    """Each model's file and the extra `--input-shape`/`--input-value` flags it needs (none)."""
    from benanza.zoo import build_all

    out.mkdir(parents=True, exist_ok=True)
    zoo = [n for n in names if n in ZOO]
    if zoo:
        build_all(out, names=zoo)
    files = {n: out / f"{n}.onnx" for n in zoo}
    if "bert-encoder" in names:
        files["bert-encoder"] = _export(_bert(), (_randn(1, BERT["seq"], BERT["hidden"]),), out / "bert-encoder.onnx")
    for name in (n for n in names if n in LLAMAS):
        files[name] = make_llama(name, out)
    return {n: (p, []) for n, p in files.items()}


def make_llama(name: str, out: Path) -> Path:
    """``out/NAME.onnx``, one of LLAMAS: a decode step feeds a token and the config's KV cache, a
    prefill its prompt of as many tokens as the cache holds; weights past 2 GB lie in external data."""
    import torch

    c, seq = LLAMAS[name]
    path = out / f"{name}.onnx"
    if path.exists():  # made before: the module alone takes seconds and GBs to build
        return path
    if seq == 1:
        past = torch.zeros(c["layers"], 2, 1, c["kv_heads"], c["cache"], c["hidden"] // c["heads"])
        args: tuple = (torch.tensor([[7]]), past)
    else:
        args = (torch.arange(seq)[None],)
    if not weights_bytes(c) > PROTO_LIMIT:
        return _export(_llama(c, seq), args, path)
    # the exporter writes a model past 2 GB as one file per weight: rewritten as one data file
    folder = out / f".{name}.export"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    _export(_llama(c, seq), args, folder / "model.onnx")
    to_external_data(folder / "model.onnx", path)
    shutil.rmtree(folder)
    return path


PROTO_LIMIT = 2**31 - 1  # protobuf's limit on one serialized message


def weights_bytes(c: dict) -> int:
    """The f32 bytes of a LLAMAS config's weights: embedding, head, and per layer the attention
    projections, the MLP and two norms, plus the final norm."""
    d, kv = c["hidden"], c["kv_heads"] * (c["hidden"] // c["heads"])
    layer = 2 * d * d + 2 * d * kv + 3 * d * c["ffn"] + 2 * d
    return 4 * (2 * c["vocab"] * d + c["layers"] * layer + d)


def to_external_data(src: Path, dst: Path, inline_below: int = 1024) -> None:
    """``src`` (weights inline or in files beside it) saved as ``dst`` with every weight of
    ``inline_below`` bytes or more in one file, ``dst.data``, read and written one weight at a
    time (the whole model is never in memory). Small constants stay inline: shape inference and
    the processor read their values from the graph."""
    import onnx
    from onnx import numpy_helper
    from onnx.external_data_helper import load_external_data_for_tensor

    model = onnx.load(str(src), load_external_data=False)
    data = dst.with_name(dst.name + ".data")
    # the exporter writes large Constant nodes' values (a prefill's causal mask) to files too
    constants = [a.t for n in model.graph.node for a in n.attribute if a.type == onnx.AttributeProto.TENSOR]
    with data.open("wb") as f:
        for t in (*model.graph.initializer, *constants):
            if t.data_location == onnx.TensorProto.EXTERNAL:
                load_external_data_for_tensor(t, str(src.parent))
            raw = numpy_helper.to_array(t).tobytes()
            if len(raw) < inline_below:
                continue
            stub = onnx.TensorProto(name=t.name, data_type=t.data_type, dims=t.dims,
                                    data_location=onnx.TensorProto.EXTERNAL)
            for key, value in (("location", data.name), ("offset", f.tell()), ("length", len(raw))):
                stub.external_data.add(key=key, value=str(value))
            f.write(raw)
            t.CopyFrom(stub)
    onnx.save_model(model, str(dst))


def _randn(*shape: int):
    import torch

    return torch.randn(*shape)


def _export(module, args: tuple, path: Path) -> Path:
    import torch

    if not path.exists():
        with torch.no_grad():
            torch.onnx.export(module.eval(), args, str(path), opset_version=17, dynamo=False)
    return path


def _bert():
    import torch
    from torch import nn

    c = BERT

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            d = c["hidden"]
            self.query, self.key, self.value, self.output = (nn.Linear(d, d) for _ in range(4))
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.up, self.down = nn.Linear(d, c["ffn"]), nn.Linear(c["ffn"], d)

        def heads(self, t):
            return t.view(1, c["seq"], c["heads"], -1).permute(0, 2, 1, 3)

        def forward(self, x):
            q, k, v = self.heads(self.query(x)), self.heads(self.key(x)), self.heads(self.value(x))
            p = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(c["hidden"] // c["heads"]), -1)
            h = self.ln1(self.output((p @ v).permute(0, 2, 1, 3).reshape(1, c["seq"], -1)) + x)
            return self.ln2(self.down(nn.functional.gelu(self.up(h))) + h)

    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(Layer() for _ in range(c["layers"]))

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    torch.manual_seed(0)
    return Encoder()


def _llama(c: dict, seq: int):
    """The Llama-shaped model of config ``c`` over ``seq`` new tokens: a decode step (1) reads a KV
    cache, a prefill (more) attends causally among its own tokens only. The seed makes both the
    same weights."""
    import torch
    from torch import nn

    hd = c["hidden"] // c["heads"]

    class RMSNorm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(c["hidden"]))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.weight

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            d, kv = c["hidden"], c["kv_heads"] * hd
            self.q_proj, self.k_proj = nn.Linear(d, d, bias=False), nn.Linear(d, kv, bias=False)
            self.v_proj, self.o_proj = nn.Linear(d, kv, bias=False), nn.Linear(d, d, bias=False)

        def forward(self, x, past_k=None, past_v=None):
            q = self.q_proj(x).view(1, seq, c["heads"], hd).transpose(1, 2)
            k = self.k_proj(x).view(1, seq, c["kv_heads"], hd).transpose(1, 2)
            v = self.v_proj(x).view(1, seq, c["kv_heads"], hd).transpose(1, 2)
            if past_k is not None:
                k, v = torch.cat([past_k, k], 2), torch.cat([past_v, v], 2)
            group = c["heads"] // c["kv_heads"]
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
            s = q @ k.transpose(-1, -2) / math.sqrt(hd)
            if seq > 1:
                s = s + torch.full((seq, seq), float("-inf")).triu(1)
            return self.o_proj((torch.softmax(s, -1) @ v).transpose(1, 2).reshape(1, seq, c["hidden"]))

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            d, f = c["hidden"], c["ffn"]
            self.gate_proj, self.up_proj = nn.Linear(d, f, bias=False), nn.Linear(d, f, bias=False)
            self.down_proj = nn.Linear(f, d, bias=False)

        def forward(self, x):
            return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))

    class DecoderLayer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.input_layernorm, self.self_attn = RMSNorm(), Attention()
            self.post_attention_layernorm, self.mlp = RMSNorm(), MLP()

        def forward(self, x, past_k=None, past_v=None):
            x = x + self.self_attn(self.input_layernorm(x), past_k, past_v)
            return x + self.mlp(self.post_attention_layernorm(x))

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed_tokens = nn.Embedding(c["vocab"], c["hidden"])
            self.layers = nn.ModuleList(DecoderLayer() for _ in range(c["layers"]))
            self.norm = RMSNorm()

        def forward(self, ids, past=None):
            x = self.embed_tokens(ids)
            for i, layer in enumerate(self.layers):
                x = layer(x, *(() if past is None else (past[i, 0], past[i, 1])))
            return self.norm(x)

    class CausalLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model, self.lm_head = Model(), nn.Linear(c["hidden"], c["vocab"], bias=False)

        def forward(self, ids, past=None):
            return self.lm_head(self.model(ids, past))

    torch.manual_seed(0)
    return CausalLM()


def floors_row(name: str, a: dict, layers_lines: int, seconds: float) -> str:
    f = a["floors"]
    got = {x["name"]: x for x in f["floors"]}

    def cell(kind: str) -> str:  # an absent floor's reason is listed under the table
        return f"{got[kind]['ms']:.4g}" if kind in got else "—"

    b, m = a["bounds"], a["measured_ms"]
    return (f"| {name} | {len(a['layers'])} | {f['critical_path_ms']:.4g} | {cell('memory')} | {cell('compute')} | "
            f"{cell('work')} | **{f['binds']}** | {b['parallel_ms']:.4g} | {b['sequential_ms']:.4g} | "
            + (f"{m:.4g} | {b['br_parallel']:.3g}" if m else "— | —") + f" | {layers_lines} | {seconds:.1f} |")


def modules_rows(module: dict, depth: int = 2, indent: str = "") -> list[str]:
    """Two levels of the tree, a run of identical siblings shown once with its count."""
    out = []
    for c in module.get("children", []):
        if c["repeat_of"] is not None:
            continue
        measured = c["measured_ms"]
        out.append(f"| {indent}{c['path'][-1]}{' ×' + str(c['repeats']) if c['repeats'] > 1 else ''} | "
                   f"{len(c['layers'])} | {c['sequential_ms']:.4g} | {c['parallel_ms']:.4g} | "
                   + (f"{measured:.4g}" if measured is not None else "—") + " |")
        if depth > 1:
            out += modules_rows(c, depth - 1, indent + "  ")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default="out/bench_floors")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models", nargs="*", default=list(ZOO + MADE), choices=list(ZOO + MADE + LARGE))
    ap.add_argument("--min-time", default="0.02")
    ap.add_argument("--system", default="bench-floors")
    args = ap.parse_args()
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    load = [os.getloadavg()[0]]
    models = make_models(work / "models", args.models)
    db = str(work / "perf.db")
    timings: dict[str, float] = {}
    for name, (path, flags) in models.items():
        bench = work / "bench" / name
        _, timings[f"generate {name}"] = sh("generate", str(path), "--out", str(bench), "--backend", "onednn",
                                            "--dtype", "f32", "--layout", "any", "--no-fusion", *flags, cwd=work)
        for threads in ("1", str(args.threads)):
            _, timings[f"run {name} {threads}t"] = sh(
                "run", "--bench-dir", str(bench), "--system", args.system, "--db", db, "--backend", "onednn",
                "--threads", threads, "--min-time", args.min_time, "--repetitions", "1", "--max-contention", "1",
                cwd=work)
            load.append(os.getloadavg()[0])
        _, timings[f"profile {name}"] = sh("profile", str(path), "--framework", "onnxruntime", "--out",
                                           str(work / "prof" / name), "--warmup", "3", "--iterations", "20",
                                           "--trace-iterations", "3", *flags, cwd=work)
    from benanza.perfdb import PerfDB

    with PerfDB(db, readonly=True) as pdb:
        stacks = {int(dict(s.stack)["threads"]): (s, pdb.peaks(s)) for s, _, _ in pdb.stacks(args.system)}
    details = []
    for threads in sorted({1, args.threads}):
        stack, peaks = stacks[threads]
        print(f"\nstack {stack.stack_id}: {dict(stack.stack)}")
        if peaks is not None:
            dram, gemm = peaks.dram, peaks.gemm("f32")
            print(f"peaks: {peaks.contended:.0%} of their time taken by other processes "
                  f"({'trusted' if peaks.trusted else 'NOT trusted: no memory or compute floor'}); "
                  f"caches {dict(peaks.levels)}; DRAM {dram.value / 1e9 if dram else 0:.3g} GB/s; "
                  f"f32 GEMM {gemm.value / 1e9 if gemm else 0:.4g} GFLOP/s")
        print("\n| model | layers | critical path ms | memory floor ms | compute floor ms | work floor ms | binds | "
              "parallel bound ms | sequential ms | ORT ms | BR par | terminal lines | analyze s |")
        print("| --- | ---: | ---: | --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for name, (path, flags) in models.items():
            common = [str(path), "--system", args.system, "--db", db, "--stack", stack.stack_id, "--profile",
                      str(work / "prof" / name), "--allow-contended", *flags]
            out, seconds = sh("analyze", *common, "--json", cwd=work)
            (a,) = json.loads(out)["analyses"]
            text, _ = sh("analyze", *common, cwd=work)
            (work / f"{name}-{threads}t.txt").write_text(text)
            print(floors_row(f"{name} ({threads}t)", a, len(text.splitlines()), seconds))
            details.append((f"{name} ({threads}t)", a))
    for name, a in details:
        print(f"\n{name}: floors")
        for x in a["floors"]["floors"]:
            print(f"- {x['name']} {x['ms']:.4g} ms: {x['detail']}")
        for w in a["floors"]["absent"]:
            print(f"- no {w}")
        print(f"\n{name} ({a['module_source']}): top level of the module tree\n")
        print("| module | layers | bound ms | critical path ms | ORT ms |\n| --- | ---: | ---: | ---: | ---: |")
        print("\n".join(modules_rows(a["modules"])))
    load.append(os.getloadavg()[0])
    print(f"\nload average (1 min) over the run: {min(load):.2f}–{max(load):.2f} on {os.cpu_count()} CPUs")
    print("timings (s): " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))


if __name__ == "__main__":
    main()
