import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def save(tmp_path):
    """Save a ModelProto under tmp_path and return its path."""
    import onnx

    def _save(model, name="m.onnx", **kwargs):
        path = tmp_path / name
        onnx.save(model, str(path), **kwargs)
        return path

    return _save


@pytest.fixture(scope="session")
def zoo_model(tmp_path_factory):
    """Path of a reference model (benanza.zoo name), built once per test session on demand."""
    out = tmp_path_factory.mktemp("zoo")

    def _get(name: str) -> Path:
        from benanza.zoo import build_all

        path = out / f"{name}.onnx"
        if not path.exists():
            build_all(out, names=[name])
        return path

    return _get
