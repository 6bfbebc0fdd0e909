"""The GPU kit (scripts/gpukit.py) without a GPU: the travelling folder it prepares, and a dry run
of the device steps against a stand-in of the GPU machine's image (a venv at opt/torch/.venv with
the cu13 cuDNN/cuBLAS wheel folders, nvcc 13.0 at a CUDA_HOME of its own, no Google Benchmark,
no sqlite-utils, no cuDNN frontend headers), which must pass every step that needs no GPU and
stop with one clear line at the first that does."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import time
import zipfile
from collections import Counter
from pathlib import Path

import pytest
import tomllib
from helpers import REPO
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

KIT_SCRIPT = REPO / "scripts" / "gpukit.py"


def _load_kit():
    spec = importlib.util.spec_from_file_location("gpukit", KIT_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpukit"] = module
    spec.loader.exec_module(module)
    return module


gpukit = _load_kit()


def kit_cmd(*args: str) -> list[str]:
    return [sys.executable, str(KIT_SCRIPT), *args]


@pytest.fixture(scope="module")
def kit(tmp_path_factory) -> Path:
    """`gpukit.py prepare` for real: pip download from PyPI, apt-get source from Debian."""
    out = tmp_path_factory.mktemp("kit") / "kit"
    done = subprocess.run(kit_cmd("--kit", str(out), "prepare"), check=False, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.mark.slow  # `gpukit.py prepare` downloads wheels and sources (the `kit` fixture)
def test_prepare_carries_only_what_the_image_lacks_under_the_limit(kit):
    manifest = json.loads((kit / "MANIFEST.json").read_text())
    wheels = {Requirement(w.split("-")[0].replace("_", "-")).name: kit / "wheels" / w for w in manifest["wheels"]}
    assert sorted(p.name for p in (kit / "wheels").iterdir()) == sorted(manifest["wheels"])
    assert set(wheels) == {"sqlite-utils", "sqlite-fts4", "click-default-group", "click"}

    # every requirement, Benanza's own and the carried wheels', is met on the image: by a carried
    # wheel whose version satisfies it, or by a package the image has (unversioned requirements only)
    versions = {name: path.name.split("-")[1] for name, path in wheels.items()}
    for req in map(Requirement, gpukit._requirements("dependencies")):  # their floors are checked on the device
        name = gpukit.norm(req.name)
        assert name in gpukit.IMAGE_PACKAGES or req.specifier.contains(versions[name]), req
    assert manifest["requires"]["benanza (pyproject.toml)"] == gpukit._requirements("dependencies")
    reqs = []
    for path in wheels.values():
        with zipfile.ZipFile(path) as z:
            meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
        for line in meta.splitlines():
            if line.startswith("Requires-Dist:") and "extra ==" not in line:
                req = Requirement(line.split(":", 1)[1])
                if req.marker is None or req.marker.evaluate({"sys_platform": "linux", "python_version": "3.12"}):
                    reqs.append(req)
    for req in reqs:
        name = gpukit.norm(req.name)
        if name in versions:
            assert req.specifier.contains(versions[name]), (req, versions[name])
        else:
            assert name in gpukit.IMAGE_PACKAGES and not str(req.specifier), req

    # the frontend's headers, byte for byte those of the wheel setup.sh installed here (same version)
    here = next(Path(p) / "include" for p in sys.path if (Path(p) / "include" / "cudnn_frontend.h").is_file())
    carried = sorted(p.relative_to(kit / "cudnn-frontend" / "include")
                     for p in (kit / "cudnn-frontend" / "include").rglob("*") if p.is_file())
    assert Path("cudnn_frontend.h") in carried and len(carried) > 50
    for rel in carried:
        assert (kit / "cudnn-frontend" / "include" / rel).read_bytes() == (here / rel).read_bytes(), rel
    assert (kit / "cudnn-frontend" / "LICENSE.txt").is_file()
    assert not list(kit.rglob("*.so")), "the frontend's compiled Python module must not travel"

    # Google Benchmark's source, of the version the manifest names
    (tarball,) = (kit / "benchmark").iterdir()
    with tarfile.open(tarball) as t:
        cmake = next(m for m in t.getmembers() if m.name.count("/") == 1 and m.name.endswith("/CMakeLists.txt"))
        text = t.extractfile(cmake).read().decode()
    assert f"VERSION {manifest['benchmark']}" in text

    # what travels, counted here independently of the kit: the tree git would send, plus the kit
    listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=REPO, capture_output=True,
                            check=True).stdout.decode().split("\0")
    tree = sum(os.path.getsize(REPO / n) for n in listed if n and (REPO / n).is_file())
    kit_bytes = sum(p.stat().st_size for p in kit.rglob("*") if p.is_file())
    assert gpukit.travelling_bytes(kit) == (tree, kit_bytes)
    assert tree + kit_bytes < 64 * 2**20
    assert kit_bytes < 16 * 2**20  # headers and sources, not the 12 MB frontend wheel


# The image's versions as KINDS.md's pip list records them (2026-11, Python 3.12.3): an oracle
# apart from the kit, which knows only the image's package names.
IMAGE_PYTHON_VERSION = "3.12.3"
IMAGE_VERSIONS = {"torch": "2.11.0", "onnx": "1.23.1", "onnxruntime": "1.30.0", "numpy": "2.5.2",
                  "onnxscript": "0.7.2", "jax": "0.11.2", "triton": "3.6.0", "transformers": "5.17.0"}


@pytest.mark.slow  # `gpukit.py prepare` downloads wheels and sources (the `kit` fixture)
def test_the_image_versions_meet_every_requirement_the_install_checks(kit):
    """What the install checks on the device, checked here against the versions KINDS.md read on
    the image: a floor the image misses would otherwise first show on the GPU machine."""
    manifest = json.loads((kit / "MANIFEST.json").read_text())
    carried = {gpukit.norm(w.split("-")[0]): w.split("-")[1] for w in manifest["wheels"]}
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert manifest["requires"]["benanza (pyproject.toml)"] == project["dependencies"]
    assert manifest["requires"]["benanza[torch] (pyproject.toml)"] == project["optional-dependencies"]["torch"]
    for req in (Requirement(r) for reqs in manifest["requires"].values() for r in reqs):
        name = gpukit.norm(req.name)
        have = carried.get(name, IMAGE_VERSIONS.get(name))
        if have is not None:
            assert req.specifier.contains(have, prereleases=True), (req, have)
        else:  # on the image, version not recorded: the device's check is the only one
            assert name in gpukit.IMAGE_PACKAGES, req
    for wheel in manifest["wheels"]:
        with zipfile.ZipFile(kit / "wheels" / wheel) as z:
            meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
        python = next((line.split(":", 1)[1].strip() for line in meta.splitlines()
                       if line.startswith("Requires-Python:")), "")
        assert SpecifierSet(python).contains(IMAGE_PYTHON_VERSION), (wheel, python)
    ours = re.search(r'^requires-python = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.MULTILINE)
    assert ours is not None and SpecifierSet(ours[1]).contains(IMAGE_PYTHON_VERSION), ours


@pytest.mark.slow  # `gpukit.py prepare` downloads wheels and sources (the `kit` fixture)
def test_size_check_fails_loudly(kit):
    with pytest.raises(gpukit.KitError, match=r"over the 0\.5 MiB that may travel"):
        gpukit.check_size(kit, 0.5)


def test_commands_name_the_calls_in_order_with_the_carry():
    """One call does it all; a second, only with device time left, continues inside it."""
    done = subprocess.run(kit_cmd("commands"), capture_output=True, text=True, check=True)
    calls = [line for line in done.stdout.splitlines() if " run  command=" in line]
    steps = [line.split("device ")[1].split("'")[0] for line in calls]
    assert steps == ["all", "all --budget B"]
    assert calls[1].startswith("2. ") and "budget_left_s" in calls[1]
    assert all('carry=[".gpukit"]' in line and "timeout_s=600" in line for line in calls)


def _fake_image(root: Path) -> tuple[Path, Path, Path]:
    """A venv shaped like the image's /opt/torch/.venv: its own site-packages with the cu13 wheel
    folders (this machine's, linked), the test environment's packages behind them (a .pth), and
    a CUDA_HOME of its own, a system install of this machine's CUDA 13.0 compiler."""
    from benanza.toolchain import cuda_toolkit, nvcc_version

    real_nvcc = cuda_toolkit()
    assert real_nvcc is not None and nvcc_version(real_nvcc.nvcc) == "13.0", "scripts/setup.sh installs nvcc 13.0"
    venv = root / "opt" / "torch" / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python3"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    ours = Path(sysconfig.get_paths()["purelib"])
    (site / "nvidia").mkdir()
    for wheel_dir in ("cudnn", "cu13"):
        (site / "nvidia" / wheel_dir).symlink_to(ours / "nvidia" / wheel_dir)
    (site / "zz-test-env.pth").write_text(f"{ours}\n")
    cuda = _system_install(real_nvcc, root / "usr" / "local" / "cuda")
    # a system cuDNN beside the wheel's, unversioned as system installs name it: the H200 image has
    # one (9.14, the wheel 9.19), and CMake took it by its name before the wheel's libcudnn.so.9
    (cuda / "lib64" / "libcudnn.so").symlink_to(ours / "nvidia" / "cudnn" / "lib" / "libcudnn.so.9")
    return python, site, cuda


def _system_install(real, cuda: Path) -> Path:
    """A CUDA home laid out as NVIDIA's installer lays it out (the image's /usr/local/cuda), made
    of this machine's toolkit, which may be PyPI's wheels: nvcc finds its tree from its own file's
    folder, so nvcc and its profile are copies here and the rest links; lib64/ holds the libraries
    with the unversioned libcudart.so a system install has (the wheels ship only the soname)."""
    (cuda / "bin").mkdir(parents=True)
    for entry in real.nvcc.parent.iterdir():
        if entry.name in ("nvcc", "nvcc.profile"):
            shutil.copy2(entry, cuda / "bin" / entry.name)
        else:
            (cuda / "bin" / entry.name).symlink_to(entry.resolve())
    for name in ("include", "nvvm"):
        (cuda / name).symlink_to((real.root / name).resolve())
    (cuda / "lib64").mkdir()
    for entry in real.lib.iterdir():
        (cuda / "lib64" / entry.name).symlink_to(entry.resolve())
    if not (cuda / "lib64" / "libcudart.so").exists():
        (cuda / "lib64" / "libcudart.so").symlink_to(real.cudart.resolve())
    return cuda


@pytest.mark.slow
@pytest.mark.gpu
def test_dry_run_on_the_image_layout_passes_every_step_that_needs_no_gpu(kit, tmp_path):
    if shutil.which("nvidia-smi"):
        pytest.skip("this machine has an NVIDIA driver: the GPU steps would run")
    python, site, cuda = _fake_image(tmp_path / "image")
    state, perfdb, docs = tmp_path / "state", tmp_path / "perfdb", tmp_path / "docs"
    common = ["--kit", str(kit), "device"]
    opts = ["--python", str(python), "--state", str(state), "--perfdb", str(perfdb), "--docs", str(docs)]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CMAKE_PREFIX_PATH", "CUDACXX")}
    env["CUDA_HOME"] = str(cuda)

    # `device plan`: install and generate, then what `device all` would do with the time left
    done = subprocess.run(kit_cmd(*common, "plan", *opts), check=False, capture_output=True, text=True,
                          timeout=1500, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    log = done.stderr

    # install: the wheels beside the image's Python, Google Benchmark built from its source
    assert (state / "site" / "sqlite_utils" / "__init__.py").is_file()
    found = subprocess.run([str(python), "-c", "import sqlite_utils; print(sqlite_utils.__file__)"],
                           env=dict(env, PYTHONPATH=str(state / "site")), capture_output=True, text=True, check=True)
    assert found.stdout.strip().startswith(str(state / "site"))
    (config,) = state.joinpath("benchmark").glob("lib*/cmake/benchmark/benchmarkConfig.cmake")
    assert "install: Google Benchmark 1.9.1 built" in log
    assert f"nvcc                               {cuda / 'bin' / 'nvcc'} (13.0)" in done.stdout

    # generate: the models, the sources, and CMake's discovery at the image's paths
    names = json.loads((state / "models.json").read_text())["names"]
    assert names == ["resnet50-v1", "inception-v1", "mobilenet-v2", *EXPORTED]  # made by this machine's torch
    for name in EXPORTED:
        assert f"generate: {name} is processable: in the campaign" in log
    from benanza.generator import read_variants

    variants = read_variants(state / "bench" / "cudnn")
    measured = [v for v in variants if not (v.dtype == "f16" and v.math == "fma")]  # the campaign's filter
    assert (f"generate: {len(variants)} variants of {', '.join(names)}, and of resnet50-v1-b32, inception-v1-b32, "
            f"mobilenet-v2-b32 (batch 32); {len(measured)} in the campaign (f16 on FMA units left out)") in log
    # f32 in both math modes, f16 on Tensor Cores, the three CNNs at batch 32 too
    assert {(v.dtype, v.math) for v in variants if v.api == "cudnnConvolutionForward"} == {
        ("f32", "fma"), ("f32", "tf32_allowed"), ("f16", "tensor_op"), ("f16", "fma")}
    occurrences = {o["model"] for layer in json.loads((state / "bench" / "layers.json").read_text())["layers"]
                   for o in layer["occurrences"]}
    assert occurrences == {*names, "resnet50-v1-b32", "inception-v1-b32", "mobilenet-v2-b32"}
    assert any(v.layer_key.startswith("conv:mb32_") for v in variants)
    assert {v.api for v in variants} >= {"cudnnConvolutionForward", "cudnnPoolingForward", "cudnn_frontend.quant"}
    assert {v.dtype for v in variants if v.api == "cublasLtMatmul"} >= {"f32", "u8"}  # the int8 GEMM too
    assert {v.dtype for v in variants if v.api == "cudnn_frontend.pointwise"} >= {"f32", "b"}  # the mask's booleans

    def cmake_cache(project: str) -> dict[str, str]:
        cache = {}
        for line in (state / project / "cudnn" / "build" / "CMakeCache.txt").read_text().splitlines():
            if "=" in line and ":" in line.split("=", 1)[0]:
                cache[line.split(":", 1)[0]] = line.split("=", 1)[1]
        assert cache["CMAKE_CUDA_COMPILER"] == str(cuda / "bin" / "nvcc")
        assert cache["BENANZA_CUDNN_LIBRARY"].startswith(str(site / "nvidia" / "cudnn" / "lib"))
        assert cache["BENANZA_CUDNN_INCLUDE_DIR"] == str(site / "nvidia" / "cudnn" / "include")
        assert cache["BENANZA_CUBLAS_LIBRARY"].startswith(str(site / "nvidia" / "cu13" / "lib"))
        assert cache["BENANZA_CUDNN_FRONTEND_INCLUDE_DIR"] == str(kit / "cudnn-frontend" / "include")
        assert cache["benchmark_DIR"] == str(config.parent)
        assert cache["CMAKE_GENERATOR"] == "Ninja"
        assert not (state / project / "cudnn" / "build" / "benanza_bench").exists()
        return cache

    cmake_cache("bench")
    assert not (state / "smoke").exists()  # the smoke run's project is its own step's work

    # the plan: the report's reserve in the order its stages run (no GPU here: no campaign log,
    # the defaults) before the campaign's share, and the campaign's order
    plan = json.loads((state / "plan.json").read_text())
    priority = [m for m in ("resnet50-v1", "transformer-encoder") if m in names]
    others = [m for m in names if m not in priority]
    first = [*priority, "resnet50-v1-b32"]  # the priority runs, whose profiles are reserved
    assert [stage for stage, _ in plan["reserve"]] == [
        "stop", *(f"profile {m}" for m in first),
        *_analyses(*first, *others, "inception-v1-b32", "mobilenet-v2-b32"), "fidelity", "kernels", "page"]
    assert [s for _, s in plan["reserve"]] == [gpukit.DEFAULT_SECONDS[stage.split()[0]] for stage, _ in plan["reserve"]]
    assert 0 < plan["left_s"] <= gpukit.ALL_BUDGET_S
    assert plan["campaign_s"] == pytest.approx(plan["left_s"] - sum(s for _, s in plan["reserve"]), abs=0.11)
    assert plan["campaign_s"] > 0  # six models' install, generate and report leave the campaign a share
    assert [set(t["names"]) for t in plan["tiers"]] == _oracle_tiers(state / "bench", names)
    assert sorted(n for t in plan["tiers"] for n in t["names"]) == sorted(v.name for v in measured)
    for stage in ("install", "generate"):
        assert re.search(rf"^gpukit: stage {stage}: \d+ s \(the call at \d+ s of 540\)$", log, re.MULTILINE), stage

    # the smoke step makes its own project (the test suite's every-family model), then needs a GPU
    stop = subprocess.run(kit_cmd(*common, "smoke", *opts), check=False, capture_output=True, text=True,
                          timeout=900, env=env)
    assert stop.returncode == 3, stop.stderr[-2000:]
    smoke = read_variants(state / "smoke" / "cudnn")
    assert {v.api for v in smoke} >= {"cudnnConvolutionForward", "cudnnRNNForward", "cublasSgemv",
                                      "cudnnConvolutionBiasActivationForward", "cudnnSoftmaxForward"}
    cmake_cache("smoke")

    # the one call stops with one line at the first stage that needs a GPU, and writes nothing
    stop = subprocess.run(kit_cmd(*common, "all", *opts), check=False, capture_output=True, text=True,
                          timeout=600, env=env)
    assert stop.returncode == 3, stop.stderr[-2000:]
    lines = stop.stderr.strip().splitlines()
    assert [re.sub(r"\d+ s", "N s", line) for line in lines] == [
        "gpukit: install: done on this machine already",
        "gpukit: stage install: N s (the call at N s of 540)",
        "gpukit: install: done on this machine already",  # each step first runs those before it
        "gpukit: generate: done on this machine already",
        "gpukit: stage generate: N s (the call at N s of 540)",
        ("gpukit: all needs a GPU: nvidia-smi not found (no NVIDIA driver here); the steps before it ran, "
         "run this one on the GPU machine (`scripts/gpukit.py commands`)")]
    assert not perfdb.exists() and not docs.exists()


def test_a_step_without_the_kit_says_how_to_make_it(tmp_path):
    done = subprocess.run(kit_cmd("--kit", str(tmp_path / "none"), "device", "install", "--python", sys.executable,
                                  "--state", str(tmp_path / "state")), check=False, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 4
    assert done.stderr.strip().splitlines() == [
        (f"gpukit: {tmp_path / 'none'}: no kit here (MANIFEST.json missing): run `scripts/gpukit.py prepare` on a "
         f"connected machine and name {tmp_path / 'none'} in the call's carry")]


def test_an_export_that_fails_or_is_not_processable_is_a_note_and_the_others_go_on(tmp_path, monkeypatch):
    """An export whose script fails, one made from it, and one Benanza's processor refuses (a file
    that is no ONNX model): each a line that names the model and why, and the kit goes on to the
    next; the export after them is in the campaign."""
    good = gpukit.EXPORTS[0]
    monkeypatch.setattr(gpukit, "EXPORTS", (
        gpukit.Export("broken", "an exporter that fails", "import sys; sys.exit('no exporter on this image')"),
        gpukit.Export("broken-int8", "its quantization", gpukit._INT8_EXPORT, "broken"),
        gpukit.Export("garbage", "not a model", "import sys; open(sys.argv[1], 'w').write('not onnx')"),
        good))
    d = gpukit.Device(Path(sys.executable), tmp_path / "kit", tmp_path / "state", time.monotonic() + 600,
                      tmp_path / "perfdb", tmp_path / "docs")
    (tmp_path / "models").mkdir()
    names, paths, notes = gpukit.export_models(d, tmp_path / "models")
    assert (names, paths) == ([good.name], [tmp_path / "models" / f"{good.name}.onnx"])
    assert [n.split(": not in the campaign: ")[0] for n in notes] == [
        "broken (an exporter that fails)", "broken-int8 (its quantization)", "garbage (not a model)"]
    assert notes[0].endswith("export of broken failed (exit 1): no exporter on this image")
    assert notes[1].endswith("its source, broken, was not exported")
    assert "benanza generate --backend none garbage.onnx failed (exit 1)" in notes[2]
    assert str(tmp_path / "models" / "garbage.onnx") in notes[2]  # the processor's own line, naming the file


def test_results_page_says_why_the_smoke_run_was_skipped(tmp_path):
    """The line the smoke step writes where compute-sanitizer refuses the device, rendered by
    gpu-results.py from a database the perfdb layer wrote."""
    from benanza.perfdb import PerfDB
    from benanza.records import System

    with PerfDB(tmp_path / "gpu.db") as db:
        db.upsert_system(System("nvidia-h200", "cudnn", "NVIDIA H200", (("cudnn", "9.13"),)))
    log = tmp_path / "nvidia-h200-smoke.log"
    log.write_text(f"{gpukit.SMOKE_SKIPPED}compute-sanitizer refused the device (Device not supported); "
                   "the campaign does not depend on it\n")
    page = tmp_path / "results.md"
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu-results.py"), "--db", str(tmp_path / "gpu.db"),
                           "--system", "nvidia-h200", "--out", str(page), "--campaign-seconds", "0", "--smoke",
                           str(log)], check=False, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.returncode == 0, done.stderr
    text = page.read_text()
    section = text[text.index("## Smoke run under compute-sanitizer"):]
    assert section.splitlines()[2] == ("Skipped: compute-sanitizer refused the device (Device not supported); "
                                       "the campaign does not depend on it.")
    assert "| cudnn | 9.13 |" in text


# --- the one call: its budget, the campaign's order, the report of a stopped campaign -------------

GPU = "nvidia-h100-80gb-hbm3"  # the slug of the H100's nvidia-smi name (KINDS.md)


EXPORTED = ["transformer-encoder", "transformer-encoder-int8", "masked-decoder"]


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> tuple[Path, dict]:
    """What `device generate` writes, made the way it makes it: the zoo's ResNet-50 and
    MobileNet-v2, the kit's own exports (`export_models`: the transformer encoder, its int8
    quantization, the masked decoder block), the cuDNN sources of them all and of the two CNNs at
    batch 32 (`benanza generate` with the kit's math modes and `batched_args`), and models.json."""
    root = tmp_path_factory.mktemp("generated")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    bz = [sys.executable, "-c", "from benanza.cli import main; main(prog_name='benanza')"]
    subprocess.run([*bz, "zoo", "--out", str(root / "models"), "--only", "resnet50-v1", "--only", "mobilenet-v2"],
                   check=True, capture_output=True, env=env, timeout=600)
    d = gpukit.Device(Path(sys.executable), root / "kit", root / "state", time.monotonic() + 900, root / "perfdb",
                      root / "docs")
    exported, paths, notes = gpukit.export_models(d, root / "models")
    assert (exported, notes) == (EXPORTED, [])
    names = ["resnet50-v1", "mobilenet-v2", *exported]
    paths = [str(root / "models" / f"{n}.onnx") for n in names[:2]] + [str(p) for p in paths]
    maths = [a for m in gpukit.GENERATE_MATHS for a in ("--math", m)]
    subprocess.run([*bz, "generate", *paths, *gpukit.batched_args(d, root / "models", names[:2]), *maths,
                    "--out", str(root / "state" / "bench"), "--backend", "cudnn"],
                   check=True, capture_output=True, env=env, timeout=900)
    models = {"names": names, "paths": paths, "notes": []}
    (root / "state" / "models.json").write_text(json.dumps(models) + "\n")
    return root / "state", models


def _oracle_tiers(bench: Path, models: list[str]) -> list[set[str]]:
    """The campaign's tiers recomputed from Benanza's own records: the manifest's unique layers
    with the models they occur in, each variant matched to its layer through the key grammar."""
    from benanza.generator import read_variants
    from benanza.manifest import read_manifest
    from benanza.ops.grammar import layer_key

    manifest = read_manifest(bench)
    variants = read_variants(bench / "cudnn")
    users = {}
    for u in manifest.layers:
        for v in variants:
            if layer_key(u.layer.problem, v.dtype) == v.layer_key:
                users.setdefault(v.name, set()).update(o.model for o in u.occurrences)
    own = {u.layer.key for u in manifest.layers}
    priority = {"resnet50-v1", "transformer-encoder"} & set(models)
    others = set(models) - priority
    big = {f"{m}-b32" for m in ("resnet50-v1", "inception-v1", "mobilenet-v2") if m in models}
    variants = [v for v in variants if not (v.dtype == "f16" and v.math == "fma")]  # never measured
    first = {v.name for v in variants if v.layout == "nchw"
             and v.algo in ("default", "heuristic0", "plan0", "IMPLICIT_PRECOMP_GEMM")}
    exact = {v.name for v in variants if v.name in first and v.layer_key in own and v.math != "tf32_allowed"}
    tf32 = {v.name for v in variants if v.name in first and v.layer_key in own and v.math == "tf32_allowed"}
    rules = [(priority, exact), (others, exact), (priority | others, tf32), (priority, first), (big, exact),
             (big, tf32), (priority, {v.name for v in variants})]
    tiers, taken = [], set()
    for group, names in rules:
        tiers.append({v.name for v in variants if users[v.name] & group and v.name in names} - taken)
        taken |= tiers[-1]
    return [*tiers, {v.name for v in variants} - taken]


def test_campaign_measures_each_layers_first_choice_of_the_priority_models_first(generated, tmp_path):
    state, models = generated
    tiers = gpukit.campaign_tiers(state / "bench", models["names"])
    assert [set(t.names) for t in tiers] == _oracle_tiers(state / "bench", models["names"])
    assert [t.label for t in tiers] == [
        "first choice in the model's dtype: resnet50-v1, transformer-encoder",
        "first choice in the model's dtype: mobilenet-v2, transformer-encoder-int8, masked-decoder",
        f"first choice in TF32: {', '.join(models['names'])}",
        "first choice in other dtypes: resnet50-v1, transformer-encoder",
        "first choice in the model's dtype: resnet50-v1-b32, mobilenet-v2-b32",
        "first choice in TF32: resnet50-v1-b32, mobilenet-v2-b32",
        "every variant: resnet50-v1, transformer-encoder", "every other variant"]
    first = set(tiers[0].names)
    # ResNet-50's convolutions and the transformer's GEMMs and attention are in the first tier,
    # one first-choice variant each (per fusion pattern), before any exhaustive algorithm
    apis = {n.split("/api=")[1].split("/")[0] for n in first}
    assert {"cudnnConvolutionForward", "cublasGemmEx", "cublasLtMatmul", "cublasGemmStridedBatchedEx",
            "cudnn_frontend.layernorm", "cudnnSoftmaxForward"} <= apis
    assert all("/algo=IMPLICIT_PRECOMP_GEMM/" in n for n in first if "/api=cudnnConvolution" in n)
    assert any("/api=cudnn_frontend.sdpa/algo=plan0/" in n for n in tiers[3].names)  # attention: fp16 only
    # every layer of every batch-1 model that has variants has one in the first two tiers (the
    # exact bound), every layer of the batch-32 CNNs one in their first tier
    from benanza.generator import read_variants

    variants = read_variants(state / "bench" / "cudnn")
    layers = json.loads((state / "bench" / "layers.json").read_text())["layers"]
    small = {layer["key"] for layer in layers if {o["model"] for o in layer["occurrences"]} & set(models["names"])}
    big = {layer["key"] for layer in layers} - small
    assert big and all(re.search(r"(mb|in|gemm:m)32", k) for k in big)  # the batch in the key
    early = set(tiers[0].names) | set(tiers[1].names)
    assert {v.layer_key for v in variants if v.layer_key in small} == {v.layer_key for v in variants if v.name in early}
    assert {v.layer_key for v in variants if v.layer_key in big} == {
        v.layer_key for v in variants if v.name in tiers[4].names}
    # TF32: f32 convolutions and GEMMs in both math modes; the exact tiers hold no TF32 variant,
    # the TF32 tiers one first choice of every f32 layer that has TF32 variants, at each batch
    by_name = {v.name: v for v in variants}
    assert {v.math for v in variants if v.dtype == "f32" and v.api == "cudnnConvolutionForward"} == {
        "fma", "tf32_allowed"}
    for exact, tf32, keys in ((early, set(tiers[2].names), small), (tiers[4].names, set(tiers[5].names), big)):
        assert all(by_name[n].math != "tf32_allowed" for n in exact)
        assert {by_name[n].math for n in tf32} == {"tf32_allowed"}
        assert {by_name[n].layer_key for n in tf32} == {
            v.layer_key for v in variants if v.math == "tf32_allowed" and v.layer_key in keys}
    # f16 keeps its Tensor Core variants (the fp16 what-if) beside fma ones (the cost of one --math
    # list for every dtype), which the campaign's filter and its tiers leave out, and only those
    f16_conv = [v for v in variants if v.dtype == "f16" and v.api == "cudnnConvolutionForward"]
    assert {v.math for v in f16_conv} == {"fma", "tensor_op"}
    assert {v.layer_key for v in f16_conv if v.math == "tensor_op"} == {v.layer_key for v in f16_conv}
    skipped = {v.name for v in variants if v.dtype == "f16" and v.math == "fma"}
    assert skipped == {v.name for v in variants if not re.search(gpukit.CAMPAIGN_FILTER, v.name)}
    assert {n for t in tiers for n in t.names} == {v.name for v in variants} - skipped

    # the --first files the campaign gives `benanza run`: every tier but the rest, in order
    d = gpukit.Device(Path(sys.executable), tmp_path / "kit", tmp_path, 0.0, tmp_path / "perfdb", tmp_path / "docs")
    files = gpukit.write_tiers(d, tiers)
    assert [f.read_text().splitlines() for f in files] == [list(t.names) for t in tiers[:-1]]
    from benanza.runner import measurement_order

    everything = [n for t in tiers for n in t.names]
    order = measurement_order(everything, 0, tuple(t.names for t in tiers[:-1]))
    assert order[:len(tiers[0].names)] == measurement_order(list(tiers[0].names), 0)


def _shapes(path: Path) -> tuple[list, dict[str, tuple[int, tuple[int, ...]]]]:
    """The model's nodes and every tensor's (ONNX element type, shape), by ONNX's own shape inference."""
    import onnx

    m = onnx.shape_inference.infer_shapes(onnx.load(str(path)))
    infos = [*m.graph.input, *m.graph.value_info, *m.graph.output]
    known = {v.name: (v.type.tensor_type.elem_type, tuple(d.dim_value for d in v.type.tensor_type.shape.dim))
             for v in infos}
    known.update({t.name: (t.data_type, tuple(t.dims)) for t in m.graph.initializer})
    return list(m.graph.node), known


def test_the_kits_exports_reach_the_int8_quant_boolean_and_tanh_gelu_paths_early(generated):
    """The int8 encoder and the masked decoder give cuDNN/cuBLAS variants on every path added
    after the kit's first models, read from the generated variants.json and recomputed from the
    exported ONNX files: one int8 GEMM layer per distinct (M, K, N) of the MatMulIntegers, quant
    graph nodes for the quantization's DynamicQuantizeLinear, one boolean layer per distinct And
    and Equal of booleans, the tanh GELU of the MLP; and their first-choice variants in the
    campaign's first tier of the non-priority models."""
    from onnx import TensorProto

    state, models = generated
    variants = json.loads((state / "bench" / "cudnn" / "variants.json").read_text())["variants"]
    layers = json.loads((state / "bench" / "layers.json").read_text())["layers"]
    users = {layer["key"]: {o["model"] for o in layer["occurrences"]} for layer in layers}
    paths = dict(zip(models["names"], models["paths"]))
    tiers = gpukit.campaign_tiers(state / "bench", models["names"])
    assert tiers[1].label.endswith("mobilenet-v2, transformer-encoder-int8, masked-decoder")
    early = set(tiers[1].names)

    # int8: cuBLASLt's int8 GEMM, one layer per (M, K, N) of the quantized model's MatMulIntegers
    nodes, known = _shapes(Path(paths["transformer-encoder-int8"]))
    mnk = set()
    for node in (n for n in nodes if n.op_type == "MatMulInteger"):
        (_, a), (_, b) = known[node.input[0]], known[node.input[1]]
        mnk.add((math.prod(a[:-1]), a[-1], b[-1]))
    int8 = [v for v in variants if v["api"] == "cublasLtMatmul" and v["dtype"] in ("u8", "i8")]
    assert mnk and len({v["layer_key"] for v in int8}) == len(mnk)
    assert all(users[v["layer_key"]] == {"transformer-encoder-int8"} for v in int8)
    assert {v["algo"] for v in int8} == {f"heuristic{i}" for i in range(8)}  # one per rank of the heuristic
    assert {v["name"] for v in int8 if v["algo"] == "heuristic0"} <= early  # not empty: every rank is there
    # quant: the graph API's nodes for the activations' quantization (and the Casts around the GEMM)
    assert any(n.op_type == "DynamicQuantizeLinear" for n in nodes)
    quant = [v for v in variants if v["api"] == "cudnn_frontend.quant"]
    assert any(v["layer_key"].startswith("dynquant:") for v in quant), sorted({v["layer_key"] for v in quant})
    assert all("transformer-encoder-int8" in users.get(v["layer_key"], {"transformer-encoder-int8"}) for v in quant)
    assert {v["name"] for v in quant if v["algo"] == "plan0" and v["layer_key"] in users} & early

    # booleans: one layer per distinct And / Equal of one-byte booleans, in their own type only
    nodes, known = _shapes(Path(paths["masked-decoder"]))
    boolean = {}
    for node in nodes:
        if node.op_type in ("And", "Equal") and known[node.input[0]][0] == TensorProto.BOOL:
            boolean.setdefault(node.op_type, set()).add(tuple(sorted(known[i][1] for i in node.input)))
    assert set(boolean) == {"And", "Equal"}
    mask = [v for v in variants if v["dtype"] == "b"]
    assert {v["api"] for v in mask} == {"cudnn_frontend.pointwise"}
    for op, alg in (("And", "binary:and_"), ("Equal", "binary:eq_")):
        assert len({v["layer_key"] for v in mask if v["layer_key"].startswith(alg)}) == len(boolean[op]), op
    assert mask and {v["name"] for v in mask if v["algo"] == "plan0"} <= early
    # the tanh GELU: the MLP's decomposition as one GELU_APPROX_TANH node, on the Tanh's layer
    gelu = [v for v in variants if v["fusion"] == "gelu_tanh"]
    assert {v["layer_key"] for v in gelu} == {"eltwise:tanh_in1x64x1024_f32", "eltwise:tanh_in1x64x1024_f16"}
    first_gelu = {v["name"] for v in gelu if v["algo"] == "plan0" and v["dtype"] == "f32"}
    assert len(first_gelu) == 1 and first_gelu <= early


def test_results_page_counts_each_new_path(generated, tmp_path):
    """gpu-results.py's table of the int8, quant, boolean and tanh-GELU paths, from a database the
    perfdb layer wrote, against counts made here from the variant names."""
    from benanza.generator import read_variants
    from benanza.perfdb import PerfDB
    from benanza.records import Result, Status, System

    state, _ = generated
    variants = read_variants(state / "bench" / "cudnn")
    message = "CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE (graph build)"

    def status(name: str) -> Status:
        return Status.FAILED if "/dtype=b/" in name else Status.UNSUPPORTED if "/algo=plan1/" in name else Status.OK

    system = System(GPU, "cudnn", "NVIDIA H100 80GB HBM3", (("cudnn", "9.13"),))
    with PerfDB(tmp_path / "gpu.db") as db:
        db.upsert_system(system)
        db.insert_results(system, [Result(v, GPU, status(v.name), median_ms=0.01, low_ms=0.01,
                                          message=message if status(v.name) is Status.FAILED else "")
                                   for v in variants])
    page = tmp_path / "results.md"
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu-results.py"), "--db", str(tmp_path / "gpu.db"),
                           "--system", GPU, "--out", str(page), "--campaign-seconds", "0"], check=False,
                          capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.returncode == 0, done.stderr
    text = page.read_text()
    table = text[text.index("| path | results |"):].split("\n\n")[0].splitlines()[2:]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table]
    on_path = [lambda n: "/api=cublasLtMatmul/" in n and ("/dtype=u8/" in n or "/dtype=i8/" in n),
               lambda n: "/api=cudnn_frontend.quant/" in n, lambda n: "/dtype=b/" in n,
               lambda n: n.endswith("/fusion=gelu_tanh") or n.startswith("eltwise:gelutanh_")]
    assert len(rows) == len(on_path)
    for row, rule in zip(rows, on_path):
        mine = [v.name for v in variants if rule(v.name)]
        count = Counter(status(n).value for n in mine)
        assert mine and row[1:5] == [str(len(mine)), str(count["ok"]), str(count["unsupported"]),
                                     str(count["failed"])], row
        assert row[5] == (message if count["failed"] else "—"), row


def _analyses(*runs: str) -> list[str]:
    return [f"analyze {r}{m}" for r in runs for m in ("", " tf32")]


def test_the_report_reserve_comes_first_and_the_campaign_gets_the_rest():
    """Before any call measured a stage: the defaults; once the campaign log holds a stage's
    time (as the Timeline writes it), the latest one, and for a TF32 or batch-32 stage not
    measured yet, that of the model's batch-1 exact one. Profiles are reserved for the priority
    runs (ResNet-50 at batch 1 and 32, the encoder) not yet profiled on this machine, an exact
    and a TF32 analysis for every run, priority runs first, then batch 1 before batch 32."""
    models = ["resnet50-v1", "inception-v1", "mobilenet-v2", "transformer-encoder"]
    plan = gpukit.plan_call(400.0, models, set(), "")
    assert [stage for stage, _ in plan.reserve] == [
        "stop", "profile resnet50-v1", "profile transformer-encoder", "profile resnet50-v1-b32",
        *_analyses("resnet50-v1", "transformer-encoder", "resnet50-v1-b32", "inception-v1", "mobilenet-v2",
                   "inception-v1-b32", "mobilenet-v2-b32"), "page"]
    defaults = gpukit.DEFAULT_SECONDS
    reserve = defaults["stop"] + 3 * defaults["profile"] + 14 * defaults["analyze"] + defaults["page"]
    assert sum(s for _, s in plan.reserve) == reserve
    assert plan.campaign_s == 400.0 - reserve

    # measured: the Timeline's lines, and a later measurement of a stage replaces an earlier one
    tl = gpukit.Timeline(0.0, 540.0)
    tl.record("profile resnet50-v1", 41.2)
    tl.record("page", 3.0)
    tl.record("profile resnet50-v1", 35.0)
    tl.record("analyze mobilenet-v2", 4.0)
    tl.record("analyze mobilenet-v2-b32 tf32", 6.0)
    log = "2026-11-26T03:00:00Z 300 s stopped at the call's time limit: cudnn on NVIDIA H100\n" + "".join(
        line + "\n" for line in tl.pending)
    measured = gpukit.plan_call(400.0, models, {"transformer-encoder"}, log)
    assert dict(measured.reserve) == {
        "stop": defaults["stop"], "profile resnet50-v1": 35.0, "profile resnet50-v1-b32": 35.0,
        **{stage: defaults["analyze"] for stage in _analyses(*models, "resnet50-v1-b32", "inception-v1-b32")},
        **dict.fromkeys(_analyses("mobilenet-v2", "mobilenet-v2-b32"), 4.0), "analyze mobilenet-v2-b32 tf32": 6.0,
        "page": 3.0}
    assert measured.campaign_s == 400.0 - sum(dict(measured.reserve).values())
    # the kit's six models and the three CNNs at batch 32: two analyses each in the reserve,
    # profiles for the priority runs only (the dry run checks that install and generate leave the
    # campaign a share)
    six = [*gpukit.MODELS, *(e.name for e in gpukit.EXPORTS)]
    assert six == ["resnet50-v1", "inception-v1", "mobilenet-v2", *EXPORTED]
    plan = gpukit.plan_call(gpukit.ALL_BUDGET_S, six, set(), "")
    assert [stage for stage, _ in plan.reserve if stage.startswith("profile ")] == [
        "profile resnet50-v1", "profile transformer-encoder", "profile resnet50-v1-b32"]
    assert [stage for stage, _ in plan.reserve if stage.startswith("analyze ")] == _analyses(
        "resnet50-v1", "transformer-encoder", "resnet50-v1-b32", "inception-v1", "mobilenet-v2",
        "transformer-encoder-int8", "masked-decoder", "inception-v1-b32", "mobilenet-v2-b32")
    nine_reserve = defaults["stop"] + 3 * defaults["profile"] + 18 * defaults["analyze"] + defaults["page"]
    assert plan.campaign_s == gpukit.ALL_BUDGET_S - nine_reserve
    # with the H200's first run's log: the reserve it measured, the TF32 and batch-32 stages as
    # their batch-1 exact ones; the campaign keeps most of the call
    shipped = (REPO / "perfdb" / "nvidia-h200-campaign.log").read_text()
    h200 = "".join(line for line in shipped.splitlines(True) if line.startswith("2026-11-27"))
    plan = gpukit.plan_call(gpukit.ALL_BUDGET_S - 14 - 28, six, set(), h200)
    assert dict(plan.reserve)["profile resnet50-v1-b32"] == dict(plan.reserve)["profile resnet50-v1"] == 26
    assert dict(plan.reserve)["analyze inception-v1-b32 tf32"] == 8
    assert plan.campaign_s > 250
    # with its second run's too: each stage as last measured, the batch-32 ones their own
    last = {m[1]: float(m[2]) for m in re.finditer(r"^\S+ stage (.+) (\d+) s$", shipped, re.MULTILINE)}
    assert last["profile resnet50-v1-b32"] != last["profile resnet50-v1"]
    later = dict(gpukit.plan_call(gpukit.ALL_BUDGET_S - 14 - 28, six, set(), shipped).reserve)
    assert {stage: later[stage] for stage in later if stage in last} == {
        stage: last[stage] for stage in later if stage in last}
    assert later["profile resnet50-v1-b32"] == last["profile resnet50-v1-b32"]
    # the comparison with PyTorch, where this machine has not made it: reserved before the page
    # (a campaign that fills the call leaves no spare time), its measured time once there is one
    compared = gpukit.plan_call(gpukit.ALL_BUDGET_S - 14 - 28, six, set(), h200, compare=True)
    assert [stage for stage, _ in compared.reserve][-2:] == ["fidelity", "page"]
    assert dict(compared.reserve)["fidelity"] == gpukit.DEFAULT_SECONDS["fidelity"]
    assert compared.campaign_s == plan.campaign_s - gpukit.DEFAULT_SECONDS["fidelity"]
    both = gpukit.plan_call(gpukit.ALL_BUDGET_S - 14 - 28, six, set(), h200, compare=True, kernels=True)
    assert [stage for stage, _ in both.reserve][-3:] == ["fidelity", "kernels", "page"]
    assert both.campaign_s == compared.campaign_s - gpukit.DEFAULT_SECONDS["kernels"]
    tl = gpukit.Timeline(0.0, 540.0)
    tl.record("fidelity", 41.0)
    assert dict(gpukit.plan_call(400.0, models, set(), tl.pending[0] + "\n", compare=True).reserve)["fidelity"] == 41
    # no time for a campaign: none, never a negative share
    assert gpukit.plan_call(60.0, models, set(), "").campaign_s == 0.0


def test_a_campaign_stopped_by_the_budget_still_gets_its_report_marked_partial(generated, tmp_path):
    """The report of a call whose campaign was stopped after the first tier: written from the
    database as the runner stores it, every model analysed with its missing layers counted, the
    page saying the campaign is partial with each tier's share, and the models not profiled for
    lack of time saying so. With no time left at all the page is still written."""
    from benanza.generator import read_variants
    from benanza.perfdb import PerfDB
    from benanza.records import Result, Status, System

    state, models = generated
    perfdb, docs = tmp_path / "perfdb", tmp_path / "docs"
    perfdb.mkdir()
    tiers = gpukit.campaign_tiers(state / "bench", models["names"])
    by_name = {v.name: v for v in read_variants(state / "bench" / "cudnn")}
    system = System(GPU, "cudnn", "NVIDIA H100 80GB HBM3", (("cudnn", "9.13"),))
    # the first tier, the TF32 first choices faster (as on Tensor Cores), the batch-32 exact ones
    stored = ((tiers[0], 0.01), (tiers[2], 0.004), (tiers[4], 0.02))
    with PerfDB(perfdb / f"{GPU}.db") as db:
        db.upsert_system(system)
        db.insert_results(system, [Result(by_name[n], GPU, Status.OK, median_ms=ms, low_ms=ms)
                                   for tier, ms in stored for n in tier.names])
    # a profile measured at more than this call has: none is attempted
    (perfdb / f"{GPU}-campaign.log").write_text(
        "2026-11-26T03:00:00Z 180 s stopped at the call's time limit: cudnn on NVIDIA H100 80GB HBM3\n"
        + "".join(f"2026-11-26T03:00:00Z stage profile {m} 9999 s\n" for m in models["names"]))
    state = tmp_path / "state"
    shutil.copytree(generated[0], state)
    d = gpukit.Device(Path(sys.executable), tmp_path / "kit", state, time.monotonic() + 400, perfdb, docs)
    page = gpukit._report(d, GPU, gpukit.Timeline(time.monotonic(), 400), "stopped at the call's time limit")
    text = page.read_text()
    total = sum(len(t.names) for t in tiers)
    have = sum(len(tier.names) for tier, _ in stored)
    assert (f"- **Partial campaign** (stopped at the call's time limit): {have} of {total} variants "
            f"have a result") in text
    assert f"{tiers[0].label}: {len(tiers[0].names)}/{len(tiers[0].names)}; {tiers[1].label}: 0/" in text
    for run in [*models["names"], "resnet50-v1-b32", "mobilenet-v2-b32"]:
        assert f"- {run}: not profiled under PyTorch in this call (about 9999 s, " in text
    # every model analysed at batch 1 and the CNNs at 32, each in exact and TF32 math (the bounds
    # table, from the analyzer's JSON): the priority models' exact bounds rest on the first tier
    # alone, their TF32 bounds on the faster TF32 variants; MobileNet's layers have no exact
    # result yet (its tier was not reached), so its bound is partial; the CNNs' batch-32 bounds
    # rest on their own first tier (`analyze --batch-size 32` finds the layers generated for
    # `<model>-b32`)
    head = ("| model | batch | math | dtype | measured ms | sequential bound | parallel bound | BR seq | BR par | "
            "partial | missing layers | not covered | faster than roofline |")
    table = text[text.index(head):].split("\n\n")[0].splitlines()[2:]
    rows = {tuple(cells[:3]): cells for cells in ([c.strip() for c in line.strip("|").split("|")] for line in table)}
    assert set(rows) == {(m, b, mode) for m, b in [*((m, "1") for m in models["names"]), ("resnet50-v1", "32"),
                                                   ("mobilenet-v2", "32")] for mode in ("exact", "tf32")}
    assert rows[("mobilenet-v2", "1", "exact")][9] == "yes" and int(rows[("mobilenet-v2", "1", "exact")][10]) > 0
    for m in ("resnet50-v1", "transformer-encoder"):
        exact, tf32 = rows[(m, "1", "exact")], rows[(m, "1", "tf32")]
        assert exact[9:11] == tf32[9:11] == ["no", "0"], (exact, tf32)
        assert exact[4] == "—"  # not profiled: nothing measured to compare
        assert float(tf32[5]) < float(exact[5])
    for m in ("resnet50-v1", "mobilenet-v2"):
        exact, tf32 = rows[(m, "32", "exact")], rows[(m, "32", "tf32")]
        assert exact[9:11] == tf32[9:11] == ["no", "0"], (exact, tf32)
    assert float(rows[("resnet50-v1", "32", "exact")][5]) > float(rows[("resnet50-v1", "1", "exact")][5])
    assert "the 1x1 ones it runs as `COMPUTE_32F_FAST_TF32` cuBLASLt GEMMs; exact f32 in its other matmuls) are " \
           "what the `tf32` rows bound" in text
    # this database holds no peaks: no roofline to judge by, said as such rather than as none flagged
    assert {cells[12] for cells in rows.values()} == {"—"}
    # the what-ifs of the exact analyses, each figure marked where the analyzer's own JSON calls
    # that bound partial (MobileNet's exact bound, missing its layers, among them)
    head = "| model | batch | f32 | f16 | f16 nhwc | fused (f32) | joint | TC kernels |"
    whatifs = text[text.index(head):].split("\n\n")[0].splitlines()[2:]
    marked = 0
    for line in whatifs:
        model, batch, f32, *_ = [c.strip() for c in line.strip("|").split("|")]
        subject = model if batch == "1" else f"{model}-b{batch}"
        a = json.loads((state / f"analyze-{subject}.json").read_text())["analyses"][0]
        bound = a["tensor_cores"]["bounds"].get("f32")  # none where no layer has an f32 result
        if bound is None:
            assert f32 == "—", line
            continue
        assert f32 == f"{bound['sequential_ms']:.3f}" + (" (partial)" if bound["partial"] else ""), line
        marked += bound["partial"]
    assert marked and len(whatifs) == len(rows) // 2
    # no model has every variant of its layers measured (only first choices were stored): each
    # one's share, recounted from the layers its analysis bounded and the generated variants
    measured = {n for tier, _ in stored for n in tier.names}
    campaign = [v for v in by_name.values() if re.search(gpukit.CAMPAIGN_FILTER, v.name)]
    assert "Every variant of their layers has a result for no model; the other models' bounds are each " \
           "layer's fastest among the variants measured so far (" in text
    for subject in ("resnet50-v1", "resnet50-v1-b32", "transformer-encoder"):
        analysis = json.loads((state / f"analyze-{subject}.json").read_text())["analyses"][0]
        keys = {layer["key"] for layer in analysis["layers"] if layer.get("key")}
        mine = [v.name for v in campaign if v.layer_key in keys]
        assert 0 < sum(n in measured for n in mine) < len(mine)
        assert f"{subject} {sum(n in measured for n in mine)}/{len(mine)}" in text

    # no time left at all: the page all the same, from what there is
    late = gpukit.Device(Path(sys.executable), tmp_path / "kit", state, time.monotonic(), perfdb, docs)
    page.unlink()
    gpukit._report(late, GPU, gpukit.Timeline(time.monotonic(), 0), "stopped at the call's time limit")
    text = page.read_text()
    assert "**Partial campaign** (stopped at the call's time limit)" in text
    for m in models["names"]:  # analysed within the second it gets, or a line that says it was not
        for mode in ("exact", "tf32"):
            subject = m if mode == "exact" else f"{m} tf32"
            assert f"\n| {m} | 1 | {mode} | f32 | " in text or f"\n- {subject}: not analysed: " in text


def test_the_tracked_packed_database_travels_and_never_replaces_a_newer_one(tmp_path, monkeypatch):
    """perfdb/<gpu>.db.gz is what git holds (the database outgrows a device call's 64 MiB): a GPU
    step unpacks it, keeps a database there whose campaign went further (a warm machine's), and
    hands the database back packed, the same rows as the file it read."""
    import gzip
    import io
    import sqlite3
    from contextlib import closing

    gpukit = _load_kit()
    shipped = REPO / "perfdb" / "nvidia-h200.db.gz"
    perfdb = tmp_path / "perfdb"
    perfdb.mkdir()
    packed, db = perfdb / shipped.name, perfdb / "nvidia-h200.db"
    shutil.copy2(shipped, packed)

    def rows(path: Path) -> tuple[int, int]:
        with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
            return conn.execute("select count(*), max(id) from results").fetchone()

    with gzip.open(shipped, "rb") as src:
        (tmp_path / "oracle.db").write_bytes(src.read())
    expected = rows(tmp_path / "oracle.db")
    assert expected[0] > 10_000

    gpukit.unpack_db(db)
    assert rows(db) == expected
    with closing(sqlite3.connect(db)) as conn:  # the campaign continued here after the packed copy travelled
        conn.execute("pragma journal_mode=wal")  # as PerfDB writes, its last rows still in the journal
        conn.execute("insert into results select null, system, stack_id, variant, layer_key, dtype, status, message, "
                     "median_ms, mean_ms, stddev_ms, min_ms, iterations, repetitions, workspace_bytes, implementation, "
                     "metrics, raw, command, timestamp, rsd, unstable, low_ms, sample_median_ms, sample_iqr_ms, "
                     "samples, contention, clean_share, contended, precision, eliminated from results "
                     "order by id desc limit 1")
        conn.commit()
        gpukit.unpack_db(db)
    assert rows(db) == (expected[0] + 1, expected[1] + 1)
    assert not list(perfdb.glob("*.unpacked"))

    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setenv("OUT", str(out))
    d = gpukit.Device(Path(sys.executable), tmp_path / "kit", tmp_path, 0.0, perfdb, tmp_path / "docs")
    d.to_out(db)
    assert [p.name for p in out.iterdir()] == ["nvidia-h200.db.gz"]
    back = tmp_path / "back.db"
    with gzip.open(out / "nvidia-h200.db.gz", "rb") as src:
        back.write_bytes(src.read())
    assert rows(back) == rows(db)

    # packed beyond what one file back from the device may hold: in parts, joined by `cat`
    monkeypatch.setattr(gpukit, "OUT_FILE_LIMIT", 2 * 2**20)
    for f in out.iterdir():
        f.unlink()
    d.to_out(db)
    parts = sorted(out.iterdir())
    assert [p.name for p in parts] == [f"nvidia-h200.db.gz.part{i}" for i in range(len(parts))] and len(parts) > 1
    assert all(p.stat().st_size <= 2 * 2**20 for p in parts)
    with gzip.open(io.BytesIO(b"".join(p.read_bytes() for p in parts)), "rb") as src:
        back.write_bytes(src.read())
    assert rows(back) == rows(db)

    db.unlink()  # a bare machine, or one whose database is older: the packed copy is the database
    gpukit.unpack_db(db)
    assert rows(db) == expected


def test_the_page_counts_only_the_campaign_of_the_stack_it_analyses(h200_db):
    """The H200's database holds two stacks (its first run linked cuDNN 9.14, the second the
    image's 9.19): the page's coverage line and campaign time are the current stack's alone, as
    `benanza analyze` reads only that one."""
    import sqlite3
    from contextlib import closing

    gpukit = _load_kit()
    db = h200_db
    with closing(sqlite3.connect(db)) as conn:
        stacks = {sid: json.loads(stack)["cudnn"] for sid, stack in conn.execute("select stack_id, stack from systems")}
        latest = conn.execute("select stack_id from results order by id desc limit 1").fetchone()[0]
        variants = {v for (v,) in conn.execute("select distinct variant from results where stack_id = ?", (latest,))}
        everything = conn.execute("select count(distinct variant) from results").fetchone()[0]
    assert stacks[latest] == "9.19.0" and len(stacks) == 2
    assert gpukit.current_stack(db, "nvidia-h200") == latest
    statuses = gpukit.latest_statuses(db, "nvidia-h200")
    assert set(statuses) == variants and len(variants) < everything

    log = (REPO / "perfdb" / "nvidia-h200-campaign.log").read_text()
    ours = [line for line in log.splitlines() if f"(stack {latest})" in line]
    assert len(ours) >= 2 and any("(stack " in line and line not in ours for line in log.splitlines())
    assert gpukit.campaign_calls(log, latest) == (len(ours), sum(float(line.split()[1]) for line in ours))
    unnamed = "2026-11-29T00:00:00Z 12 s stopped at the call's time limit: no summary line\n"
    assert gpukit.campaign_calls(log + unnamed, latest) == (len(ours) + 1,
                                                           sum(float(line.split()[1]) for line in ours) + 12)


def test_a_profile_with_time_to_spare_never_takes_the_comparisons_reserved_time(generated, tmp_path, h200_db):
    """The comparisons (with PyTorch: benchmarks/fidelity_cuda.py; with the kernels' own
    durations: kernel_durations.py) are in the call's reserve; a profile of a model outside the
    priority runs only has time to spare. On the H200's second run both calls spent the
    comparison's minute on such profiles and it never ran: here a profile that fits only by taking
    that time is not attempted, and once the comparisons are made on the machine the same profile
    is."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from kernel_durations import compare

    from benanza.generator import read_variants
    from benanza.perfdb import PerfDB
    from benanza.records import Result, Status, System

    state = tmp_path / "state"
    shutil.copytree(generated[0], state)
    models = generated[1]
    perfdb, docs = tmp_path / "perfdb", tmp_path / "docs"
    perfdb.mkdir()
    tiers = gpukit.campaign_tiers(state / "bench", models["names"])
    by_name = {v.name: v for v in read_variants(state / "bench" / "cudnn")}
    system = System(GPU, "cudnn", "NVIDIA H100 80GB HBM3", (("cudnn", "9.13"),))
    with PerfDB(perfdb / f"{GPU}.db") as db:
        db.upsert_system(system)
        db.insert_results(system, [Result(by_name[n], GPU, Status.OK, median_ms=0.01, low_ms=0.01)
                                   for n in tiers[0].names])
    spare = "masked-decoder"  # not a priority run: profiled with time to spare only
    assert spare not in gpukit.PRIORITY_MODELS
    log = "".join(f"2026-11-26T03:00:00Z stage profile {r.label} {20 if r.label == spare else 9999} s\n"
                  for r in gpukit.report_runs(models["names"]))
    log += ("2026-11-26T03:00:00Z stage fidelity 150 s\n2026-11-26T03:00:00Z stage kernels 150 s\n"
            + "".join(f"2026-11-26T03:00:00Z stage {r.stage('analyze', m)} 1 s\n"
                      for r in gpukit.report_runs(models["names"]) for m in gpukit.ANALYSIS_MATHS)
            + "2026-11-26T03:00:00Z stage page 1 s\n")
    (perfdb / f"{GPU}-campaign.log").write_text(log)

    def page(left: float) -> str:
        d = gpukit.Device(Path(sys.executable), tmp_path / "kit", state, time.monotonic() + left, perfdb, docs)
        return gpukit._report(d, GPU, gpukit.Timeline(time.monotonic(), left), None).read_text()

    # 120 s: room for the 20 s profile only by eating into the comparison's 150 s
    text = page(120)
    assert f"- {spare}: not profiled under PyTorch in this call (about 20 s, 0 s left)" in text
    assert "- timing fidelity against PyTorch: not run in this call (about 150 s)" in text
    assert "- kernel durations (CUPTI): not run in this call (about 150 s)" in text
    # the comparison made on this machine already (the first run's own JSON): the profile is
    # attempted (and fails here, with no GPU, saying why)
    shutil.copy2(REPO / "benchmarks" / "results" / "fidelity-cuda-nvidia-h200.json", state / gpukit.FIDELITY_JSON)
    text = page(120)
    assert f"- {spare}: not profiled under PyTorch in this call (about 20 s, 0 s left)" in text  # kernels' time
    (state / gpukit.KERNELS_JSON).write_text(json.dumps(compare(h200_db, "nvidia-h200")))
    text = page(120)
    assert f"- {spare}: not profiled: " in text and f"- {spare}: not profiled under PyTorch" not in text
    assert "timing fidelity against PyTorch: not run" not in text and "kernel durations (CUPTI): not run" not in text
