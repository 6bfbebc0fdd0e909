"""Whether two runs of a fidelity measurement agree: the noise floor of the fidelity readings.

Usage: python benchmarks/fidelity_repeat.py FIRST.json SECOND.json

FIRST and SECOND are the per-op pairs ``fidelity_onnxruntime.py`` or ``fidelity_torch.py`` keep
(``--work/MODEL-tN-fidelity*.json``) from two runs of the same model, threads and reading, each
with its own ``--work`` (so its own benchmark processes, database and profile). Prints one JSON
object (``fidelity_common.repeatability``): the share of the ops whose isolated reading, and
whose in-model reading, repeats within ±10 %, by count and by their time in the model, and how
many ops change their fidelity verdict between the runs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from fidelity_common import repeatability


def _pairs(name: str) -> list[dict]:
    """A kept pairs file, or the script's exit with one line naming the file and its fault."""
    try:
        data = json.loads(Path(name).read_text())
    except (OSError, ValueError) as exc:
        sys.exit(f"fidelity_repeat: {name}: not a fidelity pairs file ({exc})")
    if not isinstance(data, list) or not all(
            isinstance(p, dict) and isinstance(p.get("op"), str)
            and all(isinstance(p.get(k), (int, float)) and p[k] > 0 for k in ("isolated_ms", "in_model_ms"))
            for p in data):
        sys.exit(f"fidelity_repeat: {name}: not a fidelity pairs file (a list of objects with op, isolated_ms "
                 "and in_model_ms, as fidelity_onnxruntime.py and fidelity_torch.py keep them)")
    return data


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        sys.exit(__doc__.split("\n\n")[1])
    pairs = [_pairs(name) for name in argv]
    print(json.dumps({"first": argv[0], "second": argv[1], **repeatability(*pairs)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
