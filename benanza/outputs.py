"""Output files: written whole or not at all, and a failure is one line naming the file.

A write goes to a temporary file beside the target and is renamed over it, so a full disk or
a kill never leaves a half-written output; the temporary file is removed on any failure.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from .errors import FileProblem


class OutputError(FileProblem):
    """An output file or folder that cannot be written."""


def _why(path: Path, exc: OSError) -> str:
    # mkdir under a file reports the file as "exists" or the target as "not a directory"
    for parent in [path, *path.parents]:
        if parent.exists():
            if not parent.is_dir():
                return f"cannot write: {parent} is a file, not a folder"
            break
    return f"cannot write ({exc.strerror or exc})"


def make_folder(path: str | Path, for_file: Path | None = None) -> Path:
    """``path`` and its parents, made where missing; errors name ``for_file`` when given."""
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(for_file or p, _why(p, exc)) from None
    return p


def write_with(path: str | Path, write: Callable[[Path], object]) -> Path:
    """``write(tmp)`` fills a temporary file that then replaces ``path``."""
    p = Path(path)
    make_folder(p.parent, for_file=p)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, p)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OutputError(p, _why(p.parent, exc)) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return p


def write_text(path: str | Path, text: str) -> Path:
    return write_with(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
