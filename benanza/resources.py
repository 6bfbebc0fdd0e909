"""Where the templates and the C++ runtime live, in a checkout or an installed wheel."""

from __future__ import annotations

from pathlib import Path

_PKG = Path(__file__).resolve().parent


def _find(name: str) -> Path:
    for candidate in (_PKG / "_data" / name, _PKG.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"benanza resource folder {name!r} is missing from the installation")


def templates_dir() -> Path:
    return _find("templates")


def runtime_dir() -> Path:
    return _find("runtime_cpp")
