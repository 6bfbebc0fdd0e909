import sys
from pathlib import Path

import pytest

# the shared helpers (helpers, torch_models, llm_models, ...) import by name from every test folder
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True)
def _model_cache(tmp_path_factory, monkeypatch):
    """Each test its own cache of processed models (benanza.model_cache), commands it runs too:
    no test reads a model another one processed, and none writes into the user's cache."""
    monkeypatch.setenv("BENANZA_MODEL_CACHE", str(tmp_path_factory.mktemp("model-cache")))


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


# --- skips ---------------------------------------------------------------------------------
# A test may skip only because of a GPU device (marked `gpu`). Any other skip means scripts/setup.sh
# left a tool out, and a skipped capability would read as a pass: it fails instead, with its reason.

def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: its skip depends on whether a CUDA GPU device is present")


def _fail_skip(report) -> None:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    report.outcome = "failed"
    report.longrepr = (f"skipped for a reason other than a GPU device ({reason}); "
                       "scripts/setup.sh installs every tool the tests use")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and not hasattr(report, "wasxfail") and item.get_closest_marker("gpu") is None:
        _fail_skip(report)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    if report.skipped:  # a module-level importorskip
        _fail_skip(report)


@pytest.fixture(scope="session")
def cudnn_runtime(tmp_path_factory) -> Path:
    """The cuDNN runtime (runtime_cpp/cudnn) built alone once per session: the tests that build a
    generated cuDNN project to run or validate it link this (``_build(..., runtime=)``) instead of
    each compiling the same runtime again. What still compiles the runtime inside a generated
    project: test_reference_models_build_and_report_no_gpu, the CUPTI build and the top-level one."""
    from tests.backends.test_cudnn import build_cudnn_runtime

    return build_cudnn_runtime(tmp_path_factory.mktemp("cudnn-runtime"))
