"""Present the module tree (analysis/modules.py): its JSON, the terminal tree with repeated
siblings folded, the folding of the layer and parallel-module tables, and a static icicle chart."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .analysis.bounds import LayerRow, ParallelModule
from .analysis.modules import Fold, ModuleStats, fold, module_of, repeats
from .analyzer import Analysis

if TYPE_CHECKING:
    from rich.console import Console


def _r(x: float | None, digits: int = 6) -> float | None:
    return None if x is None else round(float(x), digits)


def modules_json(m: ModuleStats) -> dict:
    """One module and, nested, all its children (the tree unfolded; ``repeat_of`` marks folds)."""
    folds = {id(c): f for f in fold(m.children) for c in f.members}
    out = _module_json(m)
    out["children"] = []
    for c in m.children:
        j = modules_json(c)
        f = folds[id(c)]
        j["repeats"] = f.count
        j["repeat_of"] = None if c is f.first or f.count == 1 else list(f.first.path)
        out["children"].append(j)
    return out


def _module_json(m: ModuleStats) -> dict:
    return {"path": list(m.path), "name": m.name, "class": m.kind or None, "layers": list(m.layers),
            "sequential_ms": _r(m.sequential_ms), "parallel_ms": _r(m.parallel_ms), "partial": m.partial,
            "measured_ms": _r(m.measured_ms), "ratio": _r(m.ratio, 4), "share": _r(m.share, 4)}


def _ms(x: float | None) -> str:
    return "—" if x is None else f"{x:.4g}"


def _kind(kind: str) -> str:
    return kind.rsplit(".", 1)[-1]


def print_module_tree(a: Analysis, console: Console, depth: int = 2) -> None:
    """The tree to ``depth`` levels below the model; a fold shows its first member's values ("each")
    and its share of the model for all members; a fold's children are its first member's."""
    from rich.table import Table
    from rich.text import Text

    root = a.tree
    if root is None or not root.children:
        return
    t = Table("module", "class", "layers", "bound ms", "critical path ms", "measured ms", "ratio", "share",
              title=Text(f"modules (from {a.module_source}; to depth {depth}, identical repeats folded)"))

    def add(f: Fold, level: int) -> None:
        m = f.first
        each = " each" if f.count > 1 else ""
        measured = f.measured_ms / f.count if f.measured_ms is not None else None
        ratio = f.sequential_ms / f.measured_ms if f.measured_ms else None
        label = f.label + (", identical" if f.count > 1 else "")
        t.add_row(*(Text(c) for c in (
            "  " * level + label, _kind(m.kind), str(len(m.layers)), _ms(m.sequential_ms) + each,
            _ms(m.parallel_ms) + each, _ms(measured) + each if measured is not None else "—", _ms(ratio),
            f"{sum(x.share for x in f.members):.1%}")))
        if level < depth:
            for g in fold(m.children):
                add(g, level + 1)

    t.add_row(*(Text(c) for c in ("(model)", _kind(root.kind), str(len(root.layers)), _ms(root.sequential_ms),
                                  _ms(root.parallel_ms), _ms(root.measured_ms), _ms(root.ratio), "100%")))
    for f in fold(root.children):
        add(f, 1)
    console.print(t)
    if root.measured_ms is not None:
        console.print("modules' measured ms: the framework's ops wholly inside the module (— where an op fuses "
                      "layers of the module with layers outside it); ops it inserted belong to no module",
                      highlight=False, markup=False, soft_wrap=True)


def folded_layers(a: Analysis, rows: Sequence[LayerRow]) -> list[tuple[LayerRow, int, str]]:
    """``rows`` with the layers of repeated modules shown once: (row, how many repeat it, its
    innermost module's name)."""
    if a.tree is None:
        return [(r, 1, "") for r in rows]
    rep, where = repeats(a.tree), module_of(a.tree)
    return [(r, rep.get(r.index, (r.index, 1))[1], where[r.index].name) for r in rows
            if rep.get(r.index, (r.index, 1))[0] == r.index]


def folded_parallel(a: Analysis) -> list[tuple[ParallelModule, int]]:
    """Parallel modules, those of repeated modules once: a fork/join whose fork and join are the
    same layers of identical siblings is the same subgraph with the same latencies."""
    if a.tree is None:
        return [(p, 1) for p in a.modules]
    rep = repeats(a.tree)
    seen: dict[tuple[int, int], list[ParallelModule]] = {}
    for p in a.modules:
        key = (rep.get(p.fork, (p.fork, 1))[0], rep.get(p.join, (p.join, 1))[0])
        seen.setdefault(key, []).append(p)
    return [(ps[0], len(ps)) for ps in seen.values()]


# --- HTML: an icicle of the tree -----------------------------------------------------------------

_W, _ROW = 1100, 30


def _colour(ratio: float | None) -> str:
    """Red (the framework far above the bound) to green (at the bound); blue above 1 (the bound
    exceeds the measured time); grey without a measurement."""
    if ratio is None:
        return "#d9d9d9"
    if ratio > 1.0:
        return "#9ecae1"
    return f"hsl({120 * ratio:.0f},60%,72%)"


def icicle_svg(a: Analysis, max_depth: int = 8) -> str:
    """Each module a box as wide as its share of the model's sequential bound, its children below
    it; the colour is its Benanza ratio (bound over the framework's time inside it)."""
    from markupsafe import escape

    root = a.tree
    if root is None or not root.sequential_ms or not root.children:
        return ""
    scale = _W / root.sequential_ms
    boxes: list[str] = []
    deepest = 0

    def draw(m: ModuleStats, x: float, level: int) -> None:
        nonlocal deepest
        w = m.sequential_ms * scale
        if w < 1.0 or level > max_depth:
            return
        deepest = max(deepest, level)
        y = 24 + level * _ROW
        tip = (f"{'.'.join(m.path[-1:]) or '(model)'}{' (' + m.kind + ')' if m.kind else ''}: bound "
               f"{m.sequential_ms:.4g} ms sequential, {m.parallel_ms:.4g} ms critical path; measured "
               f"{_ms(m.measured_ms)} ms; ratio {_ms(m.ratio)}; {m.share:.1%} of the model; {len(m.layers)} layers")
        label = f"{m.local_name if m.path else '(model)'} {m.sequential_ms:.3g}/{_ms(m.measured_ms)} ms"
        text = (f"<text x='{x + 3:.1f}' y='{y + 19}'>{escape(label[:int(w / 7)])}</text>" if w > 40 else "")
        boxes.append(f"<g class='module'><title>{escape(tip)}</title><rect x='{x:.1f}' y='{y}' width='{w:.1f}' "
                     f"height='{_ROW - 2}' fill='{_colour(m.ratio)}'/>{text}</g>")
        cx = x
        for c in m.children:
            draw(c, cx, level + 1)
            cx += c.sequential_ms * scale

    draw(root, 0.0, 0)
    height = 24 + (deepest + 1) * _ROW + 4
    return (f"<svg xmlns='http://www.w3.org/2000/svg' class='icicle' width='{_W}' height='{height}'>"
            f"<text x='0' y='14' class='title'>modules: width = sequential bound; colour = bound / measured "
            f"(red far from the bound, green at it, blue above it, grey unmeasured)</text>"
            + "".join(boxes) + "</svg>")
