"""Runs `benanza` as a user does and classifies how it ended: success, one clean error line,
a traceback, or a hang. The fault suite and its reliability table (docs/reliability.md) use it."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

CLI = str(Path(sys.executable).parent / "benanza")


@dataclass(frozen=True)
class Probe:
    args: tuple[str, ...]
    rc: int | None  # None: killed after the timeout (a hang)
    out: str
    err: str

    @property
    def hung(self) -> bool:
        return self.rc is None

    @property
    def traceback(self) -> bool:
        return "Traceback (most recent call last)" in self.err

    @property
    def clean_error(self) -> bool:
        """Failed with exactly one `error:` line and nothing that looks like a stack."""
        errors = [ln for ln in self.err.splitlines() if ln.lower().startswith("error:")]  # click: "Error:"
        return self.rc not in (0, None) and not self.traceback and len(errors) == 1

    @property
    def error(self) -> str:
        return next((ln for ln in self.err.splitlines() if ln.lower().startswith("error:")), "")


def benanza(*args: str, cwd: Path | None = None, timeout: float = 120, env: dict | None = None,
            stdin: str | None = None) -> Probe:
    try:
        done = subprocess.run([CLI, *args], cwd=cwd, env=env, input=stdin, capture_output=True, text=True,
                              errors="replace", timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        def text(b: bytes | str | None) -> str:
            return b.decode(errors="replace") if isinstance(b, bytes) else b or ""
        return Probe(args, None, text(exc.stdout), text(exc.stderr))
    return Probe(args, done.returncode, done.stdout, done.stderr)
