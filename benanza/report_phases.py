"""LLM phases in the reports (analysis.phases): JSON, the terminal and the HTML plot of the decode
bound against the KV-cache length."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .analysis.phases import DECODE, PhaseAnalysis
from .analyzer import Analysis
from .escape import printable

if TYPE_CHECKING:
    from rich.console import Console


def _r(x: float | None, digits: int = 6) -> float | None:
    return None if x is None else round(x, digits)


def _shares(s: dict[str, float] | None) -> dict[str, float] | None:
    return None if s is None else {k: round(v, 4) for k, v in s.items()}


def phase_json(p: PhaseAnalysis) -> dict:
    attributed = p.attributed_ms()
    return {
        "phase": p.phase.kind, "length": p.phase.length, "new_tokens": p.phase.new_tokens,
        "kv_length": p.phase.past, "label": p.phase.label,
        "sequential_ms": _r(p.sequential_ms), "parallel_ms": _r(p.parallel_ms), "partial": p.partial,
        "tokens_per_s": {"sequential": _r(p.tokens_per_s_sequential, 3), "parallel": _r(p.tokens_per_s_parallel, 3)},
        "roofline": p.roofline,
        "bytes": p.bytes_by_source(),
        "fused_bytes": p.fused_bytes.as_dict(),
        "attributed_ms": None if attributed is None else {k: _r(v) for k, v in attributed.items()},
        "layers": [{"index": la.index, "name": la.name, "op": la.op, "latency_ms": _r(la.latency_ms),
                    "flops": la.flops, "weight_bytes": la.weight_bytes, "kv_bytes": la.kv_bytes,
                    "activation_bytes": la.activation_bytes, "compute_ms": _r(la.compute_ms),
                    "memory_ms": _r(la.memory_ms), "byte_shares": _shares(la.byte_shares()),
                    "time_shares": _shares(la.time_shares())} for la in p.layers],
    }


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x:.0%}"


def print_phases(analyses: Sequence[Analysis], console: Console, max_layers: int = 10) -> None:
    """One table of the phases' bounds and tokens/s, then per phase its slowest layers' shares."""
    from rich.table import Table
    from rich.text import Text

    shown = [a for a in analyses if a.phase is not None]
    if not shown:
        return
    t = Table("phase", "system", "batch", "seq ms", "par ms", "tokens/s seq", "tokens/s par", "weights", "KV cache",
              "compute", "activations", title="phases (shares of the sequential bound, from the roofline)")
    for a in shown:
        p = a.phase
        assert p is not None
        att = p.attributed_ms()
        cells = ["—"] * 4 if att is None else [_pct(att[k] / p.sequential_ms if p.sequential_ms else None)
                                                for k in ("weights", "kv_cache", "compute", "activations")]
        t.add_row(*(Text(printable(c)) for c in (
            p.phase.label + (" (PARTIAL)" if p.partial else ""), a.system, str(a.batch_size),
            f"{p.sequential_ms:.4g}", f"{p.parallel_ms:.4g}", _rate(p.tokens_per_s_sequential),
            _rate(p.tokens_per_s_parallel), *cells)))
    console.print(t)
    if not all(a.phase is not None and a.phase.roofline for a in shown):
        console.print("phases: no trusted peaks stored for the stack: no time shares; the layer tables split "
                      "bytes only (`benanza peaks --system NAME` measures the roofs)", highlight=False)
    for a in shown:
        p = a.phase
        assert p is not None
        lt = Table("layer", "op", "ms", "weights", "KV cache", "compute", "activations", "bytes",
                   title=f"{p.phase.label} on {a.system}: the {max_layers} slowest layers, "
                         f"{'shares of their time' if p.roofline else 'shares of their bytes'}")
        for la in sorted(p.layers, key=lambda x: -x.latency_ms)[:max_layers]:
            shares: dict[str, float] = (la.time_shares() if p.roofline else None) or la.byte_shares()
            split = [shares.get(k) for k in ("weights", "kv_cache", "compute", "activations")]
            lt.add_row(*(Text(printable(c)) for c in (la.name, la.op, f"{la.latency_ms:.4g}",
                                                       *map(_pct, split), str(la.bytes))))
        console.print(lt)


def _rate(x: float | None) -> str:
    return "—" if x is None else f"{x:.4g}"


def decode_series(analyses: Sequence[Analysis]) -> dict[tuple[str, int], list[tuple[int, float, float]]]:
    """Per (system, batch), the decode phases' (KV length, sequential ms, parallel ms), by length."""
    out: dict[tuple[str, int], list[tuple[int, float, float]]] = {}
    for a in analyses:
        if a.phase is not None and a.phase.phase.kind == DECODE:
            out.setdefault((a.system, a.batch_size), []).append(
                (a.phase.phase.past, a.phase.sequential_ms, a.phase.parallel_ms))
    return {k: sorted(v) for k, v in out.items()}


def decode_svg(analyses: Sequence[Analysis]) -> str:
    """The decode bound (sequential, solid; parallel, dashed) against the KV-cache length; ""
    with fewer than two decode lengths of one system and batch."""
    from markupsafe import escape

    series = {k: v for k, v in decode_series(analyses).items() if len(v) >= 2}
    if not series:
        return ""
    points = [p for v in series.values() for p in v]
    x_hi = max(p[0] for p in points) or 1
    y_hi = max(p[1] for p in points) or 1.0
    w, h, ml, mt, mb = 420, 220, 80, 24, 36
    colours = ("#4c78a8", "#d62728", "#54a24b", "#f58518")

    def xy(x: float, y: float) -> tuple[float, float]:
        return ml + w * x / x_hi, mt + h - h * y / y_hi

    def point(x: float, y: float) -> str:
        px, py = xy(x, y)
        return f"{px:.1f},{py:.1f}"

    out = [f"<svg xmlns='http://www.w3.org/2000/svg' class='chart decode' width='{w + ml + 200}' "
           f"height='{h + mt + mb}'><text x='0' y='14' class='title'>decode bound (ms) against KV-cache length</text>",
           f"<rect x='{ml}' y='{mt}' width='{w}' height='{h}' fill='none' stroke='#999'/>",
           f"<text x='{ml - 4}' y='{mt + 10}' text-anchor='end'>{y_hi:.3g}</text>"
           f"<text x='{ml - 4}' y='{mt + h}' text-anchor='end'>0</text>"
           f"<text x='{ml}' y='{mt + h + 16}'>0</text>"
           f"<text x='{ml + w}' y='{mt + h + 16}' text-anchor='end'>{x_hi}</text>"
           f"<text x='{ml + w / 2}' y='{mt + h + 30}' text-anchor='middle'>KV-cache length L</text>"]
    for k, ((system, batch), v) in enumerate(sorted(series.items())):
        colour = colours[k % len(colours)]
        for col, dash in ((1, ""), (2, " stroke-dasharray='5 3'")):
            out.append(f"<polyline fill='none' stroke='{colour}' stroke-width='2'{dash} "
                       f"points='{' '.join(point(p[0], p[col]) for p in v)}'/>")
        for length, seq, par in v:
            cx, cy = xy(length, seq)
            out.append(f"<circle cx='{cx:.1f}' cy='{cy:.1f}' r='3' fill='{colour}'><title>decode:{length} on "
                       f"{escape(system)}: {seq:.4g} ms sequential, {par:.4g} ms parallel</title></circle>")
        out.append(f"<text x='{ml + w + 10}' y='{mt + 14 + 16 * k}' fill='{colour}'>"
                   f"{escape(system)}, batch {batch}</text>")
    out.append("</svg>")
    return "".join(out)


__all__: Sequence[str] = ("decode_series", "decode_svg", "phase_json", "print_phases")
