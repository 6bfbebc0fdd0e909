"""``python -m benanza.zoo``: build the reference models, or print their layer/MAC table.

    python -m benanza.zoo                      # build all 30 into ./models
    python -m benanza.zoo --out DIR lenet duc  # build some
    python -m benanza.zoo --table              # paper vs built layers and MACs (markdown)
"""

from __future__ import annotations

import argparse
import sys
import time

from . import MODELS, build_all, get
from ._count import summarize


def _fmt_macs(x: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if x >= scale:
            return f"{x / scale:.2f}{unit}" if unit == "G" else f"{x / scale:.1f}{unit}"
    return f"{x:.0f}"


def table(names: list[str] | None = None) -> str:
    rows = ["| ID | name | paper layers | built layers | paper MACs | built MACs | MACs delta |",
            "|---:|---|---:|---:|---:|---:|---:|"]
    for m in (MODELS if not names else [get(n) for n in names]):
        s = summarize(m.build())
        delta = (s.macs - m.paper_macs) / m.paper_macs * 100
        mark = " *" if (s.layers != m.paper_layers or m.macs_note) else ""
        rows.append(f"| {m.id} | {m.name}{mark} | {m.paper_layers} | {s.layers} | "
                    f"{_fmt_macs(m.paper_macs)} | {_fmt_macs(s.macs)} | {delta:+.1f}% |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benanza.zoo", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help="model names (default: all 30)")
    ap.add_argument("--out", default="models", help="output folder (default: models)")
    ap.add_argument("--table", action="store_true", help="print the layer/MAC table instead")
    args = ap.parse_args(argv)
    if args.table:
        print(table(args.names or None))
        return 0
    t0 = time.time()
    paths = build_all(args.out, names=args.names or None,
                      progress=lambda n: print(f"built {n}", file=sys.stderr, flush=True))
    for p in paths:
        print(p)
    print(f"{len(paths)} models in {time.time() - t0:.1f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
