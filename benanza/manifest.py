"""The unique-layer manifest (``layers.json``): the contract between processor and generators."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import FileProblem
from .layers import Model, UniqueLayer
from .model_stats import ModelStats, model_stats
from .ort_fusions import all_fusions
from .outputs import write_text

MANIFEST_VERSION = 2  # 2: layers carry typed problems (keys parse back), no params
MANIFEST_NAME = "layers.json"


@dataclass(frozen=True)
class ManifestModel:
    """One model of the manifest: where it was read from, and its layer statistics."""

    path: str
    stats: ModelStats

    def to_json(self) -> dict[str, Any]:
        return self.stats.to_json() | {"path": self.path}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ManifestModel:
        return cls(d["path"], ModelStats.from_json(d))


@dataclass(frozen=True)
class FusionCount:
    """How often a fusion pattern anchored at one layer occurs across the models."""

    layer: str  # the anchor's layer key
    pattern: str  # a FusionPattern name
    count: int

    def to_json(self) -> dict[str, Any]:
        return {"layer": self.layer, "pattern": self.pattern, "count": self.count}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> FusionCount:
        return cls(d["layer"], d["pattern"], int(d["count"]))


@dataclass
class Manifest:
    batch_size: int
    models: list[ManifestModel]
    layers: list[UniqueLayer]
    fusions: list[FusionCount]

    def to_json(self) -> dict[str, Any]:
        return {
            "version": MANIFEST_VERSION,
            "batch_size": self.batch_size,
            "models": [m.to_json() for m in self.models],
            "layers": [u.to_json() for u in self.layers],
            "fusions": [f.to_json() for f in self.fusions],
        }


def build_manifest(models: list[Model], uniques: list[UniqueLayer]) -> Manifest:
    """The manifest of ``models`` and their ``uniques``, each list sorted on what its entries
    hold: layers.json is the same file for the same models in any order, like the sources. Models
    by name, then path; layers in the generator's order (``records.variant_order``: by problem
    text, then key); a layer's occurrences by model, then node index."""
    batch = models[0].batch_size if models else 1
    entries = sorted((ManifestModel(m.path, model_stats(m)) for m in models), key=lambda e: (e.stats.model, e.path))
    counts: Counter[tuple[str, str]] = Counter()
    # a fused form benchmarked as a layer no node is (an attention through repeat_kv): a layer
    # of the manifest without occurrences, whose only variants are fused ones
    fused_only: dict[str, UniqueLayer] = {}
    known = {u.layer.key for u in uniques}
    for m in models:
        for match in all_fusions(m):
            counts[(match.conv_key, match.pattern.name)] += 1
            if match.conv_key not in known:
                fused_only.setdefault(match.conv_key, UniqueLayer(match.conv))
    layers = [UniqueLayer(u.layer, sorted(u.occurrences, key=lambda o: (o.model, o.index)))
              for u in sorted([*uniques, *fused_only.values()], key=lambda u: (u.layer.problem.text(), u.layer.key))]
    fusions = [FusionCount(k, p, n) for (k, p), n in sorted(counts.items())]
    return Manifest(batch, entries, layers, fusions)


def write_manifest(manifest: Manifest, out_dir: str | Path) -> Path:
    return write_text(Path(out_dir) / MANIFEST_NAME, json.dumps(manifest.to_json(), indent=1, sort_keys=False) + "\n")


def read_manifest(path: str | Path) -> Manifest:
    p = Path(path)
    if p.is_dir():
        p = p / MANIFEST_NAME
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise FileProblem(p, "no manifest here: run `benanza generate MODELS --out DIR` first") from None
    except (OSError, ValueError) as exc:
        raise FileProblem(p, f"unreadable manifest ({exc})") from None
    if not isinstance(data, dict):
        raise FileProblem(p, f"not a manifest (a JSON {type(data).__name__}, not an object)")
    if data.get("version") != MANIFEST_VERSION:
        raise FileProblem(p, f"manifest version {data.get('version')!r}, expected {MANIFEST_VERSION}")
    try:
        return Manifest(data["batch_size"], [ManifestModel.from_json(d) for d in data["models"]],
                        [UniqueLayer.from_json(d) for d in data["layers"]],
                        [FusionCount.from_json(d) for d in data.get("fusions", [])])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:  # a field missing or of the wrong kind
        raise FileProblem(p, f"malformed manifest ({type(exc).__name__}: {exc})") from None

