"""Analyses over the performance database: one model × systems × batch sizes (Figs 8–20).

This is the only analysis code that touches the database; ``analyze`` itself stays pure.
"""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..analyzer import Analysis, analyze
from ..errors import BenanzaError
from ..generator import get_backend
from ..parsers import ExecutionProfile
from ..processor import load_model
from ..problems import layer_key

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SweepRequest:
    model: str
    systems: tuple[str, ...]
    batch_sizes: tuple[int, ...] = (1,)
    dtype: str = "f32"
    input_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    measured_ms: float | None = None
    generate_missing: bool = False


def _profile_for(profile: ExecutionProfile | None, batch: int, single: bool) -> ExecutionProfile | None:
    """A profile counts for the configuration of its batch size (or the only configuration)."""
    if profile is None:
        return None
    if profile.batch_size in (None, batch) or single:
        return profile
    return None


def run_sweep(req: SweepRequest, db, profile: ExecutionProfile | None = None) -> list[Analysis]:
    """``db`` is a ``benanza.perfdb.PerfDB``."""
    from ..perfdb import missing_command

    single = len(req.systems) * len(req.batch_sizes) == 1
    out = []
    for batch in req.batch_sizes:
        model = load_model(req.model, batch_size=batch, input_shapes=dict(req.input_shapes))
        keys = sorted({layer_key(n.layer.problem, n.layer.in_dtype(d))
                       for n in model.nodes for d in ("f32", "f16", "bf16", req.dtype)})
        for name in req.systems:
            system = db.system(name)
            if system is None:
                known = ", ".join(s.name for s in db.systems()) or "none"
                raise BenanzaError(f"system {name!r} is not in the performance database (known: {known}); "
                                   f"run `benanza run --system {name}` first")
            results = db.results(name, keys)
            a = analyze(model, results, name, system.backend, req.dtype,
                        _profile_for(profile, batch, single), req.measured_ms if single else None)
            dtypes = get_backend(system.backend).dtypes
            if a.missing and req.dtype not in dtypes:
                a.warnings.append(f"the {system.backend} backend benchmarks {', '.join(dtypes)}, not {req.dtype}: "
                                  f"no command can fill this bound on system {name!r}")
            elif a.missing:
                cmd = missing_command([req.model], name, system.backend, batch_size=batch, db=str(db.path),
                                      dtype=req.dtype, input_shapes=req.input_shapes)
                if req.generate_missing:
                    log.info("filling %d missing benchmarks: %s", len(a.missing), cmd)
                    _run(cmd)
                    a = analyze(model, db.results(name, keys), name, system.backend, req.dtype,
                                _profile_for(profile, batch, single), req.measured_ms if single else None)
                if a.missing:
                    a.warnings.append(f"to fill the missing benchmarks run: {cmd}")
            out.append(a)
    return out


def _run(cmd: str) -> None:
    # the command is `benanza generate ... && benanza run ...`, shell-quoted by perfdb
    proc = subprocess.run(cmd, shell=True)
    if proc.returncode != 0:
        raise BenanzaError(f"--generate-missing: `{cmd}` failed with exit status {proc.returncode}")


def write_report(path: str | Path, html: str) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(html, encoding="utf-8")
    tmp.replace(p)
    return p


__all__: Sequence[str] = ("SweepRequest", "run_sweep", "write_report")
