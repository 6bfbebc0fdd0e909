"""Small transformer models exported by torch.onnx.export, with the TorchScript exporter (the
shape subgraphs, Mod-based slicing and causal masks it writes) or the dynamo exporter (torch.export
and onnxscript: opsets 18 on, decomposed SDPA until the Attention op of opset 23)."""

from __future__ import annotations

import math
import warnings
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

D_MODEL, HEADS, SEQ = 32, 4, 16


class Encoder(nn.Module):
    """nn.TransformerEncoderLayer, batch first. ``is_causal`` is passed explicitly: left to its
    default the tracer turns it into a tensor and the export fails inside MultiheadAttention."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(D_MODEL, HEADS, 2 * D_MODEL, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x, is_causal=False)


class GptBlock(nn.Module):
    """A GPT-2 style pre-LN decoder block: causal SDPA and an erf-GELU MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D_MODEL), nn.LayerNorm(D_MODEL)
        self.qkv, self.proj = nn.Linear(D_MODEL, 3 * D_MODEL), nn.Linear(D_MODEL, D_MODEL)
        self.fc, self.out = nn.Linear(D_MODEL, 4 * D_MODEL), nn.Linear(4 * D_MODEL, D_MODEL)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class BertLayer(nn.Module):
    """A Hugging Face BERT encoder layer (post-LN): separate Q, K and V projections, scores
    divided by √d, erf-GELU (or GPT-2's tanh ``gelu_new``) feed-forward. This is the graph
    ONNX Runtime's transformer optimizer (``onnxruntime.transformers.optimizer``) fuses into
    its Attention op; the packed in-projection of ``nn.MultiheadAttention`` it does not."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(D_MODEL, D_MODEL), nn.Linear(D_MODEL, D_MODEL), nn.Linear(D_MODEL, D_MODEL)
        self.o, self.ln1 = nn.Linear(D_MODEL, D_MODEL), nn.LayerNorm(D_MODEL, eps=1e-12)
        self.up, self.down = nn.Linear(D_MODEL, 4 * D_MODEL), nn.Linear(4 * D_MODEL, D_MODEL)
        self.ln2, self.approximate = nn.LayerNorm(D_MODEL, eps=1e-12), approximate

    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        b, s, _ = t.shape
        return t.view(b, s, HEADS, D_MODEL // HEADS).permute(0, 2, 1, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self._heads(self.q(x)), self._heads(self.k(x)), self._heads(self.v(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(D_MODEL // HEADS)
        ctx = torch.matmul(scores.softmax(-1), v).permute(0, 2, 1, 3).contiguous()
        h = self.ln1(self.o(ctx.view(ctx.shape[0], ctx.shape[1], D_MODEL)) + x)
        return self.ln2(self.down(F.gelu(self.up(h), approximate=self.approximate)) + h)


class TinyVit(nn.Module):
    """A ViT in small: 8×8 patches of a 3×32×32 image, a class token, position embeddings,
    one pre-LN encoder layer (GELU MLP) and the head on the class token."""

    def __init__(self) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, D_MODEL, 8, stride=8)
        self.cls = nn.Parameter(torch.randn(1, 1, D_MODEL))
        self.pos = nn.Parameter(torch.randn(1, 17, D_MODEL))
        self.block = nn.TransformerEncoderLayer(D_MODEL, HEADS, 2 * D_MODEL, activation="gelu", batch_first=True,
                                                norm_first=True)
        self.norm, self.head = nn.LayerNorm(D_MODEL), nn.Linear(D_MODEL, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.patch(x).flatten(2).transpose(1, 2)
        t = torch.cat([self.cls.expand(x.shape[0], -1, -1), t], dim=1) + self.pos
        return self.head(self.norm(self.block(t, is_causal=False))[:, 0])


class MobileV3Block(nn.Module):
    """A MobileNet-v3 inverted residual: 1×1 expand, depthwise 3×3, squeeze-and-excite
    (global pool, ReLU, hard-sigmoid gate), 1×1 project, with hard-swish activations."""

    def __init__(self) -> None:
        super().__init__()
        c, e = 16, 64
        self.expand = nn.Sequential(nn.Conv2d(c, e, 1, bias=False), nn.BatchNorm2d(e), nn.Hardswish())
        self.dw = nn.Sequential(nn.Conv2d(e, e, 3, padding=1, groups=e, bias=False), nn.BatchNorm2d(e), nn.Hardswish())
        self.se = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(e, 16, 1), nn.ReLU(), nn.Conv2d(16, e, 1),
                                nn.Hardsigmoid())
        self.project = nn.Sequential(nn.Conv2d(e, c, 1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.dw(self.expand(x))
        return x + self.project(h * self.se(h))


def gelu_tanh_mlp() -> nn.Module:
    """A Linear and ``nn.GELU(approximate="tanh")``, the module itself (not the functional form)."""
    return nn.Sequential(nn.Linear(D_MODEL, 4 * D_MODEL), nn.GELU(approximate="tanh"))


MODELS = {"encoder": Encoder, "gpt": GptBlock, "vit": TinyVit, "mbv3": MobileV3Block, "bert": BertLayer,
          "bert-tanh": partial(BertLayer, "tanh"), "gelu-tanh": gelu_tanh_mlp}
INPUTS = {"vit": (1, 3, 32, 32), "mbv3": (1, 16, 16, 16)}  # the others take 1×SEQ×D_MODEL


EXPORTERS = ("torchscript", "dynamo")


def export(name: str, opset: int, out_dir: Path, dynamic: bool = False, exporter: str = "torchscript") -> Path:
    """The model exported at ``opset`` with ``exporter``, input ``x`` of shape ``INPUTS[name]`` or
    1×SEQ×D_MODEL. With ``dynamic`` the TorchScript exporter makes batch and sequence length
    symbolic (``batch``, ``seq``); the dynamo exporter only the sequence length (``seq``: torch.export
    specialises a batch of 1)."""
    path = out_dir / f"{name}{opset}{'-dynamo' * (exporter == 'dynamo')}{'-dyn' if dynamic else ''}.onnx"
    if not path.exists():
        torch.manual_seed(0)
        module = MODELS[name]().eval()
        x = torch.randn(*INPUTS.get(name, (1, SEQ, D_MODEL)))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
            if exporter == "dynamo":
                shapes = ({1: torch.export.Dim("seq", min=2, max=1024)},) if dynamic else None
                program = torch.onnx.export(module, (x,), dynamo=True, opset_version=opset, input_names=["x"],
                                            output_names=["y"], dynamic_shapes=shapes, verbose=False)
                assert program is not None
                program.save(str(path))
            else:
                axes = {"x": {0: "batch", 1: "seq"}, "y": {0: "batch", 1: "seq"}} if dynamic else None
                torch.onnx.export(module, (x,), str(path), opset_version=opset, dynamo=False, input_names=["x"],
                                  output_names=["y"], dynamic_axes=axes)
    return path
