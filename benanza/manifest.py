"""The unique-layer manifest (``layers.json``): the contract between processor and generators."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from .errors import FileProblem
from .fusion import match_fusions
from .layers import Model, UniqueLayer
from .outputs import write_text
from .processor import model_stats

MANIFEST_VERSION = 2  # 2: layers carry typed problems (keys parse back), no params
MANIFEST_NAME = "layers.json"


@dataclass
class Manifest:
    batch_size: int
    models: list[dict]  # per-model statistics (ModelStats.to_json) plus path
    layers: list[UniqueLayer]
    fusions: list[dict]  # {"layer": conv key, "pattern": FusionPattern name, "count": n}

    def to_json(self) -> dict:
        return {
            "version": MANIFEST_VERSION,
            "batch_size": self.batch_size,
            "models": self.models,
            "layers": [u.to_json() for u in self.layers],
            "fusions": self.fusions,
        }


def build_manifest(models: list[Model], uniques: list[UniqueLayer]) -> Manifest:
    batch = models[0].batch_size if models else 1
    entries = []
    for m in models:
        d = model_stats(m).to_json()
        d["path"] = m.path
        entries.append(d)
    counts: Counter[tuple[str, str]] = Counter()
    for m in models:
        for match in match_fusions(m):
            counts[(match.conv_key, match.pattern.name)] += 1
    fusions = [{"layer": k, "pattern": p, "count": n} for (k, p), n in sorted(counts.items())]
    return Manifest(batch, entries, uniques, fusions)


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
    if data.get("version") != MANIFEST_VERSION:
        raise FileProblem(p, f"manifest version {data.get('version')!r}, expected {MANIFEST_VERSION}")
    return Manifest(data["batch_size"], data["models"],
                    [UniqueLayer.from_json(d) for d in data["layers"]], data.get("fusions", []))

