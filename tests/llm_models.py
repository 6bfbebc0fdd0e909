"""A tiny Llama/Qwen2-style decoder written as Hugging Face's modeling code writes it (RMSNorm
with an f32 upcast, rotate-half rotary embeddings from the position ids, grouped-query attention
over a KV cache given as inputs, SiLU-gated MLP), exported with torch.onnx.export; and its ONNX
Runtime dynamic int8 quantization. Random weights from a fixed seed, nothing downloaded."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

HIDDEN, HEADS, KV_HEADS, LAYERS, VOCAB, INTER = 64, 4, 2, 2, 128, 128
HEAD_DIM = HIDDEN // HEADS


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(dim) + 0.1 * torch.randn(dim)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(HIDDEN, HEADS * HEAD_DIM, bias=True)  # Qwen2 has q/k/v biases
        self.k = nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM, bias=True)
        self.v = nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM, bias=True)
        self.o = nn.Linear(HEADS * HEAD_DIM, HIDDEN, bias=False)
        self.gate = nn.Linear(HIDDEN, INTER, bias=False)
        self.up = nn.Linear(HIDDEN, INTER, bias=False)
        self.down = nn.Linear(INTER, HIDDEN, bias=False)
        self.ln1, self.ln2 = RMSNorm(HIDDEN), RMSNorm(HIDDEN)

    def forward(self, h, cos, sin, past_k, past_v, mask):
        b, s, _ = h.shape
        x = self.ln1(h)
        q = self.q(x).view(b, s, HEADS, HEAD_DIM).transpose(1, 2)
        k = self.k(x).view(b, s, KV_HEADS, HEAD_DIM).transpose(1, 2)
        v = self.v(x).view(b, s, KV_HEADS, HEAD_DIM).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = torch.cat((past_k, k), dim=2)
        v = torch.cat((past_v, v), dim=2)
        rep = HEADS // KV_HEADS  # repeat_kv: grouped-query attention
        kk = k[:, :, None].expand(b, KV_HEADS, rep, k.shape[2], HEAD_DIM).reshape(b, HEADS, k.shape[2], HEAD_DIM)
        vv = v[:, :, None].expand(b, KV_HEADS, rep, v.shape[2], HEAD_DIM).reshape(b, HEADS, v.shape[2], HEAD_DIM)
        scores = torch.matmul(q, kk.transpose(2, 3)) / HEAD_DIM ** 0.5 + mask
        y = torch.matmul(F.softmax(scores, dim=-1, dtype=torch.float32), vv)
        h = h + self.o(y.transpose(1, 2).reshape(b, s, HIDDEN))
        x = self.ln2(h)
        return h + self.down(F.silu(self.gate(x)) * self.up(x)), k, v


class Decoder(nn.Module):
    """One forward step: ``ids`` [1, S] at ``pos`` [1, S] after a cache of length L per layer."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))
        self.norm, self.head = RMSNorm(HIDDEN), nn.Linear(HIDDEN, VOCAB, bias=False)
        inv = 1.0 / (10000.0 ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float32) / HEAD_DIM))
        self.register_buffer("inv_freq", inv, persistent=False)

    def forward(self, ids, pos, mask, *cache):
        freqs = pos[:, :, None].float() * self.inv_freq[None, None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[:, None], emb.sin()[:, None]
        h = self.embed(ids)
        present = []
        for i, layer in enumerate(self.layers):
            h, k, v = layer(h, cos, sin, cache[2 * i], cache[2 * i + 1], mask)
            present += [k, v]
        return (self.head(self.norm(h)), *present)


def example(seq: int, past: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seq * 1000 + past)
    ids = torch.randint(0, VOCAB, (1, seq), generator=g)
    pos = torch.arange(past, past + seq)[None]
    mask = torch.zeros(1, 1, seq, past + seq)
    mask[..., past:] = torch.triu(torch.full((seq, seq), -1e4), 1)
    cache = [torch.randn(1, KV_HEADS, past, HEAD_DIM, generator=g) for _ in range(2 * LAYERS)]
    return (ids, pos, mask, *cache)


def input_names() -> list[str]:
    return ["ids", "pos", "mask"] + [f"past_{kv}{i}" for i in range(LAYERS) for kv in "kv"]


def export(out_dir: Path, seq: int = 1, past: int = 8, opset: int = 17, exporter: str = "torchscript",
           dynamic: bool = False) -> Path:
    """The decoder at one (seq, past) shape, weights from seed 0; ``dynamic`` (TorchScript):
    symbolic axes as Hugging Face exports name them, ``seq`` for the new tokens, ``past`` for
    the KV cache and ``total`` for the mask's keys."""
    torch.manual_seed(0)
    model = Decoder().eval()
    path = out_dir / f"llama_{exporter}_{'dyn' if dynamic else f's{seq}_p{past}'}.onnx"
    outputs = ["logits"] + [f"present_{kv}{i}" for i in range(LAYERS) for kv in "kv"]
    axes = {"ids": {1: "seq"}, "pos": {1: "seq"}, "mask": {2: "seq", 3: "total"},
            **{n: {2: "past"} for n in input_names()[3:]}} if dynamic else None
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, example(seq, past), str(path), input_names=input_names(), output_names=outputs,
                          opset_version=opset, dynamo=exporter == "dynamo", dynamic_axes=axes)
    return path


def quantize(src: Path, out: Path) -> Path:
    """ONNX Runtime's dynamic int8 quantization (what CPU deployments run)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(src), str(out), weight_type=QuantType.QInt8)
    return out
