"""Llama-, Qwen2- and Phi-style causal language models from Hugging Face transformers' own
modeling code (tiny configs built here, random weights from a fixed seed, nothing downloaded), as
one forward step over flat tensors the way deployments export it: a prefill of S tokens, or a
decode step of one token after a KV cache of length L given as inputs. Exported with both of
torch.onnx.export's exporters; the int8 form is llm_models.quantize (ONNX Runtime's
quantize_dynamic)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

# Each family at the same small size; grouped-query attention where the family has it (Phi's
# attention is multi-head: its KV heads are its heads). Phi keeps its own traits: LayerNorm,
# partial rotary embeddings, a parallel attention/MLP block with biases, a tanh-GELU MLP 4× wide.
SIZE = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 256,
        "max_position_embeddings": 512, "tie_word_embeddings": False}
FAMILIES = {
    "llama": ("LlamaForCausalLM", "LlamaConfig", {"num_key_value_heads": 2, "intermediate_size": 128}),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config", {"num_key_value_heads": 2, "intermediate_size": 128}),
    "phi": ("PhiForCausalLM", "PhiConfig", {"num_key_value_heads": 4, "intermediate_size": 256}),
}
EXPORTERS = {"torchscript": 17, "dynamo": 18}  # exporter → the opset it writes


@dataclass(frozen=True)
class Step:
    """One exported forward step: ``seq`` new tokens after a cache of ``past`` (0: a prefill).
    ``masked``: the padding mask is an input (``attention_mask``, as Optimum's and transformers'
    own exporters write it), so the step computes its attention mask from data; unmasked, one
    unpadded sequence, whose causal mask transformers builds from the positions alone."""

    family: str
    seq: int
    past: int
    masked: bool = True

    @property
    def phase(self) -> str:
        return "prefill" if self.past == 0 else "decode"

    def name(self, exporter: str) -> str:
        shape = f"s{self.seq}" if self.past == 0 else f"l{self.past}"
        return f"{self.family}_{self.phase}_{shape}{'' if self.masked else '_nomask'}_{exporter}"


def config(family: str):
    import transformers

    _, config_class, extra = FAMILIES[family]
    return getattr(transformers, config_class)(**SIZE, **extra)


def model(family: str) -> nn.Module:
    """The family's causal LM with weights from seed 0 (the same weights for every step)."""
    import transformers

    torch.manual_seed(0)
    return getattr(transformers, FAMILIES[family][0])(config(family)).eval()


class Forward(nn.Module):
    """``input_ids`` [1, S], ``attention_mask`` [1, L+S] (when ``masked``) and ``position_ids``
    [1, S], then per layer the cache's keys and values [1, kv_heads, L, head_dim] (none in a
    prefill), into transformers' DynamicCache; returns the logits and the cache after the step,
    flat."""

    def __init__(self, lm: nn.Module, masked: bool) -> None:
        super().__init__()
        self.lm, self.masked = lm, masked

    def forward(self, input_ids, *rest):
        from transformers import DynamicCache

        attention_mask, position_ids, *past = rest if self.masked else (None, *rest)
        cache = DynamicCache(list(zip(past[::2], past[1::2])), config=self.lm.config) if past else None
        out = self.lm(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, cache=cache,
                      use_cache=True)
        return (out.logits, *(t for layer in out.cache.layers for t in (layer.keys, layer.values)))


def inputs(step: Step) -> tuple[torch.Tensor, ...]:
    cfg = config(step.family)
    g = torch.Generator().manual_seed(step.seq * 1000 + step.past)
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    ids = torch.randint(0, cfg.vocab_size, (1, step.seq), generator=g)
    mask = torch.ones(1, step.past + step.seq, dtype=torch.int64)
    pos = torch.arange(step.past, step.past + step.seq)[None]
    cache = [torch.randn(1, cfg.num_key_value_heads, step.past, head_dim, generator=g)
             for _ in range(2 * cfg.num_hidden_layers if step.past else 0)]
    return (ids, *([mask] if step.masked else []), pos, *cache)


def input_names(step: Step) -> list[str]:
    layers = config(step.family).num_hidden_layers
    return ["input_ids", *(["attention_mask"] if step.masked else []), "position_ids"] + (
        [f"past_{kv}{i}" for i in range(layers) for kv in ("key", "value")] if step.past else [])


def export(step: Step, exporter: str, out_dir: Path, dynamic: bool = False) -> Path:
    """``step`` exported with ``exporter`` (a key of EXPORTERS) at its fixed shapes, or with
    ``dynamic`` (the TorchScript exporter only) the cache's length symbolic (``past``, the
    mask's and the present K/V's ``past + seq``) and the new tokens' (``seq``), as
    ``analyze --phase`` wants them. The trace follows the step's own code path (a one-token step's
    attention stays a one-token step's at every cache length)."""
    layers = config(step.family).num_hidden_layers
    path = out_dir / f"{step.name(exporter)}{'_dyn' if dynamic else ''}.onnx"
    outputs = ["logits"] + [f"present_{kv}{i}" for i in range(layers) for kv in ("key", "value")]
    axes = None
    if dynamic:
        assert exporter == "torchscript", "dynamic axes: the TorchScript exporter's dynamic_axes"
        axes = {"input_ids": {1: "seq"}, "position_ids": {1: "seq"}, "logits": {1: "seq"},
                **({"attention_mask": {1: "past + seq"}} if step.masked else {}),
                **{n: {2: "past"} for n in input_names(step) if n.startswith("past_")},
                **{n: {2: "past + seq"} for n in outputs if n.startswith("present_")}}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(Forward(model(step.family), step.masked), inputs(step), str(path),
                          input_names=input_names(step), output_names=outputs, opset_version=EXPORTERS[exporter],
                          dynamo=exporter == "dynamo", dynamic_axes=axes)
    return path


def linear_macs(family: str, tokens: int) -> int:
    """Multiply-adds of the step's linear layers, counted from the config: every weight of every
    projection and of the head is used once per token (the embedding is a lookup, no MACs)."""
    c = config(family)
    head_dim = c.hidden_size // c.num_attention_heads
    q, kv = c.num_attention_heads * head_dim, c.num_key_value_heads * head_dim
    mlp = (3 if c.hidden_act == "silu" else 2) * c.hidden_size * c.intermediate_size  # gated (SwiGLU) or not
    per_layer = c.hidden_size * (q + 2 * kv) + q * c.hidden_size + mlp
    return tokens * (c.num_hidden_layers * per_layer + c.hidden_size * c.vocab_size)


def attention_macs(family: str, seq: int, past: int) -> int:
    """Scores (Q·Kᵀ) and their weighting of V over all L+S keys, for every head of every layer."""
    c = config(family)
    head_dim = c.hidden_size // c.num_attention_heads
    return c.num_hidden_layers * 2 * c.num_attention_heads * seq * (past + seq) * head_dim
