"""The H200's shipped database, unpacked once per session (git tracks it packed:
scripts/gpukit.py unpack_db)."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest

PACKED = Path(__file__).resolve().parents[2] / "perfdb" / "nvidia-h200.db.gz"


@pytest.fixture(scope="session")
def h200_db(tmp_path_factory) -> Path:
    db = tmp_path_factory.mktemp("perfdb") / "nvidia-h200.db"
    with gzip.open(PACKED, "rb") as src, db.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    return db
