#!/usr/bin/env python3
"""The GPU kit: turns a short lease of this workplace's H100/H200 machine into a GPU database.

That machine (docs/gpu.md) has Python 3.12 at /opt/torch/.venv/bin/python3 with torch
2.11+cu130, onnx, onnxruntime and the cu13 cuDNN/cuBLAS wheels, nvcc 13.0, CMake and ninja, but
no network, no Google Benchmark, no sqlite-utils and no cuDNN frontend headers; only the
repository's working tree travels to it, plus git-ignored folders named in `carry`, 64 MiB in
all; one command runs at most 10 minutes, and a session lent one has 15 minutes of device time
in all, the machine's start (minutes) and every idle wait included.

  scripts/gpukit.py prepare [--kit .gpukit]     on a connected machine: the one folder that
                                                travels, holding only what the image lacks
  scripts/gpukit.py commands                    the device calls to make, in order
  scripts/gpukit.py device STEP [--python PY]   on the GPU machine; STEP is one of
        all        THE call: install, generate, then (GPU) build and measure the campaign in
                   priority order until the report's reserve, then the report; ends before 570 s
        install    carried wheels → out/gpukit/site (beside the image's Python, on PYTHONPATH),
                   Google Benchmark built from its carried source, the toolchain checked
        generate   the zoo's three CNNs (also at batch 32) and the kit's three exports, their cuDNN/cuBLAS
                   sources (f32 in FMA and TF32 math), CMake configured
        plan       install and generate, then what `all` would do with the time left: the budget
                   split and the campaign's order (out/gpukit/plan.json); needs no GPU
        campaign   GPU: `benanza run` into perfdb/<gpu>.db for the whole budget
        smoke      GPU: every family under compute-sanitizer (skipped where it refuses the device)
        report     GPU: PyTorch-on-CUDA profiles, exact and TF32 analyses, the timing comparisons
                   with PyTorch and with the kernels' own CUPTI durations, docs/results-<gpu>.md

A step first runs the steps before it that this machine has not done (stamps in out/gpukit), so
every call also works on a fresh machine; each stops before the 10-minute limit and a second
call continues where it stopped. Every stage's time is printed as it ends and kept in
perfdb/<gpu>-campaign.log, whose measured times the next call's budget split uses. The
deliverables (perfdb/<gpu>.db packed as the tracked <gpu>.db.gz, its -campaign.log and -smoke.log,
docs/results-<gpu>.md) are also copied to $OUT, to be copied back into the tree.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
LIMIT_MIB = 64  # the device tool's limit on everything that travels: tree and carried folders
OUT_FILE_LIMIT = 15 * 2**20  # a file the tool brings back from $OUT may have 16 MiB
IMAGE_PYTHON = Path("/opt/torch/.venv/bin/python3")
MODELS = ("resnet50-v1", "inception-v1", "mobilenet-v2")
TRANSFORMER = "transformer-encoder"
# The second batch size, for the zoo's CNNs. One `benanza generate` call has one
# --batch-size and the campaign's project must hold both, so each CNN also enters it under a
# second name, `<model>-b32` (the same file, linked), with --input-shape setting its batch; its
# layers' occurrences carry that name, which is how the campaign's tiers tell the batches apart.
BATCH = 32
# f32 layers in both math modes PyTorch may run: fma (exact f32) and tf32_allowed (PyTorch's
# default: TF32 cuDNN convolutions, COMPUTE_32F_FAST_TF32 GEMMs), for `analyze --math exact` and
# `--math tf32`. One --math list covers every dtype and a dtype gets the listed modes valid for it,
# so tensor_op must be listed too, or f16 would get fma alone and the fp16 what-if would lose its
# Tensor Core variants. f16 on FMA units is then generated too: no bound the report gives needs it
# (a quarter of the variants), so `benanza run --filter CAMPAIGN_FILTER` leaves it out, and so do
# the campaign's tiers.
GENERATE_MATHS = ("fma", "tf32_allowed", "tensor_op")
CAMPAIGN_FILTER = r"^(?!.*/dtype=f16/layout=[a-z]+/math=fma/)"
# `benanza analyze --math`: each model's bound without and with TF32.
ANALYSIS_MATHS = ("exact", "tf32")
# Python packages the image holds: .library/device/KINDS.md, "Python packages already there"
# (read on 2026-11-17). Versions are not listed, so a requirement with a version floor on one of
# them is carried too.
IMAGE_PACKAGES = frozenset("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx
huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt
jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities
linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes
mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba
numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse
nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx
onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client
propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions
pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil
pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six
sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl
tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics
torchvision tqdm transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop
wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp""".split())  # noqa: SIM905 (pasted from KINDS.md)
# The image's Python, for the wheels' environment markers and platform tags.
IMAGE_MARKERS = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
                 "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
                 "implementation_name": "cpython", "platform_python_implementation": "CPython"}
PIP_PLATFORM = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
                *[a for tag in ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
                                "manylinux2014_x86_64", "manylinux1_x86_64") for a in ("--platform", tag)]]
# Google Benchmark from Debian's source package, built on the device by the image's own compiler
# (a binary .deb would tie it to the glibc and libstdc++ of the release that built it).
BENCHMARK_SUITE = "trixie"


# A call's budget: what a step may spend before it hands back; the device kills a command at
# 600 s. A single step stops its last command at the budget, and a stopped `benanza run` may take
# 30 s more to hand back, then the copies into $OUT. `device all` stops its campaign for the
# report's reserve inside the budget; the page may run PAGE_GRACE_S past it. Either way the
# call ends before about 570 s.
STEP_BUDGET_S = 520.0
ALL_BUDGET_S = 540.0


class KitError(Exception):
    """One line for the user; the kit exits with `code`."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def say(msg: str) -> None:
    print(f"gpukit: {msg}", file=sys.stderr, flush=True)


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# --- prepare (connected machine) --------------------------------------------------------------

def _requires(wheel: Path) -> list[str]:
    """Requires-Dist lines of a wheel that apply on the image (extras and other platforms dropped)."""
    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    out = []
    for line in lines:
        if line.startswith("Requires-Dist:"):
            req = Requirement(line.split(":", 1)[1].strip())
            if req.marker is None or req.marker.evaluate({**IMAGE_MARKERS, "extra": ""}):
                out.append(str(req))
    return out


def _pin(requirement: str) -> str:
    """The version this machine's environment runs (what the test suite passed with) when it
    satisfies the requirement; else the requirement as written."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.requirements import Requirement

    req = Requirement(requirement)
    try:
        have = version(req.name)
    except PackageNotFoundError:
        return f"{req.name}{req.specifier}"
    return f"{req.name}=={have}" if req.specifier.contains(have, prereleases=True) else f"{req.name}{req.specifier}"


def _requirements(key: str) -> list[str]:
    """The requirement strings of pyproject.toml's `key = [...]` list: `dependencies`, or an
    optional group. The list ends at the first line ending in `]`, so one-line groups
    (`torch = ["torch>=2.1"]`) end where they start."""
    text = (REPO / "pyproject.toml").read_text()
    block = re.search(rf"^{re.escape(key)} = \[(.*?)\]$", text, re.DOTALL | re.MULTILINE)
    if block is None:
        raise KitError(f"pyproject.toml: no `{key} = [...]` requirement list")
    return re.findall(r'"([^"]+)"', block[1])


def _download(requirement: str, dest: Path) -> Path:
    before = set(dest.glob("*.whl"))
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", *PIP_PLATFORM, "-d", str(dest), requirement]
    done = subprocess.run(cmd, check=False, capture_output=True, text=True)
    new = sorted(set(dest.glob("*.whl")) - before)
    if done.returncode != 0 or len(new) != 1:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        raise KitError(f"pip download {requirement} failed:\n{tail}")
    return new[0]


def carried_wheels(dest: Path) -> list[Path]:
    """Benanza's dependencies the image lacks, and theirs, as --no-deps wheels for Python 3.12."""
    from packaging.requirements import Requirement

    queue = [r for r in _requirements("dependencies") if norm(Requirement(r).name) not in IMAGE_PACKAGES]
    done: dict[str, Path] = {}
    while queue:
        req = Requirement(queue.pop(0))
        if norm(req.name) in done:
            continue
        wheel = _download(_pin(str(req)), dest)
        done[norm(req.name)] = wheel
        for dep in map(Requirement, _requires(wheel)):
            # carried: missing from the image, or there with a version floor the image's may not meet
            if norm(dep.name) not in IMAGE_PACKAGES or str(dep.specifier):
                queue.append(str(dep))
    return sorted(done.values())


def _frontend(kit: Path, scratch: Path) -> str:
    """The cuDNN frontend's headers (its wheel's include/ tree and licences), without the wheel's
    compiled Python module: headers fit any interpreter and are a quarter of the wheel."""
    from packaging.requirements import Requirement

    spec = next(r for r in _requirements("cuda") if norm(Requirement(r).name) == "nvidia-cudnn-frontend")
    wheel = _download(_pin(spec), scratch)
    out = kit / "cudnn-frontend"
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if name.endswith("/"):
                continue
            if name.startswith("include/"):
                z.extract(name, out)
            elif ".dist-info/licenses/" in name:
                (out / Path(name).name).write_bytes(z.read(name))
    if not (out / "include" / "cudnn_frontend.h").is_file():
        raise KitError(f"{wheel.name}: no include/cudnn_frontend.h in the wheel")
    return wheel.name.split("-")[1]


def _benchmark_source(kit: Path, scratch: Path) -> str:
    """Debian's Google Benchmark source package, through apt with a private deb-src list (no root)."""
    if shutil.which("apt-get") is None:
        raise KitError("apt-get not found: the kit takes Google Benchmark's source from Debian (apt-get source)")
    apt = scratch / "apt"
    for sub in ("lists/partial", "cache/archives/partial"):
        (apt / sub).mkdir(parents=True, exist_ok=True)
    (apt / "sources.list").write_text(f"deb-src http://deb.debian.org/debian {BENCHMARK_SUITE} main\n")
    opts = [f"-oDir::Etc::SourceList={apt / 'sources.list'}", "-oDir::Etc::SourceParts=/dev/null",
            f"-oDir::State::Lists={apt / 'lists'}", f"-oDir::Cache={apt / 'cache'}", "-oAPT::Sandbox::User=root",
            "-qq"]
    src = scratch / "src"
    src.mkdir()
    for cmd in (["apt-get", *opts, "update"], ["apt-get", *opts, "source", "--download-only", "benchmark"]):
        done = subprocess.run(cmd, cwd=src, check=False, capture_output=True, text=True)
        if done.returncode != 0:
            raise KitError(f"{' '.join(cmd[:1] + cmd[-2:])} failed: {done.stderr.strip()[-300:]}")
    orig = sorted(src.glob("benchmark_*.orig.tar.*"))
    if len(orig) != 1:
        raise KitError(f"apt-get source benchmark: expected one orig tarball, got {[p.name for p in orig]}")
    (kit / "benchmark").mkdir()
    shutil.copy2(orig[0], kit / "benchmark" / orig[0].name)
    return orig[0].name.split("_")[1].rsplit(".orig", 1)[0]


def travelling_bytes(kit: Path) -> tuple[int, int]:
    """(bytes of the working tree that travels: tracked and untracked-not-ignored files, bytes of
    the kit folder)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True).stdout.split(b"\0")
    tree = sum((REPO / os.fsdecode(n)).stat().st_size for n in listed if n and (REPO / os.fsdecode(n)).is_file())
    kit_bytes = sum(p.stat().st_size for p in kit.rglob("*") if p.is_file())
    return tree, kit_bytes


def check_size(kit: Path, limit_mib: float) -> int:
    tree, kit_bytes = travelling_bytes(kit)
    total = tree + kit_bytes
    if total >= limit_mib * 2**20:
        raise KitError(f"{kit}: the tree ({tree / 2**20:.1f} MiB) and the kit ({kit_bytes / 2**20:.1f} MiB) "
                       f"together are {total / 2**20:.1f} MiB, over the {limit_mib:g} MiB that may travel")
    return total


def prepare(kit: Path, limit_mib: float) -> None:
    if kit.exists():
        shutil.rmtree(kit)
    kit.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="gpukit-") as tmp:
        scratch = Path(tmp)
        (kit / "wheels").mkdir()
        wheels = carried_wheels(kit / "wheels")
        say(f"wheels: {', '.join(w.name for w in wheels)}")
        frontend = _frontend(kit, scratch)
        say(f"cuDNN frontend {frontend}: headers only")
        benchmark = _benchmark_source(kit, scratch)
        say(f"Google Benchmark {benchmark}: Debian {BENCHMARK_SUITE}'s source, built on the device")
    # checked on the device after the install: Benanza's own floors on the image's packages too
    # the torch group too: the report step's `benanza profile --framework torch` runs on the image's torch
    requires = {"benanza (pyproject.toml)": _requirements("dependencies"),
                "benanza[torch] (pyproject.toml)": _requirements("torch"),
                **{w.name: _requires(w) for w in wheels}}
    manifest = {"wheels": [w.name for w in wheels], "requires": requires,
                "cudnn_frontend": frontend, "benchmark": benchmark}
    (kit / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    total = check_size(kit, limit_mib)
    say(f"{kit}: ready; {total / 2**20:.1f} MiB travel with it (limit {limit_mib:g} MiB)")


# --- the device calls ---------------------------------------------------------------------------

def _kit_rel(kit: Path) -> str:
    try:
        return str(kit.resolve().relative_to(REPO))
    except ValueError:
        return str(kit)


def commands(kit: Path) -> list[str]:
    carry = json.dumps([_kit_rel(kit)])
    back = ("then here: cp FILES_AT/*.db.gz FILES_AT/*-campaign.log FILES_AT/*-smoke.log perfdb/ 2>/dev/null; "
            "cp FILES_AT/results-*.md docs/ 2>/dev/null; for j in fidelity kernels; do cp FILES_AT/$j-cuda.json "
            "benchmarks/results/$j-cuda-<gpu>.json 2>/dev/null; done; gunzip -kf perfdb/<gpu>.db.gz  "
            "(FILES_AT: the reply's "
            "files_at; the packed database is the tracked one, perfdb/*.db is ignored; one over 15 MiB comes back "
            "as <gpu>.db.gz.part0, .part1, ...: cat FILES_AT/<gpu>.db.gz.part? > perfdb/<gpu>.db.gz)")
    step = "python3 scripts/gpukit.py device {}"
    # One call does everything: the session has 15 minutes of device time in all, a machine's
    # start takes minutes of it, and the machine is given back 30 s after a call (KINDS.md), so a
    # later call mostly finds a bare one and redoes install and generate.
    return [
        f"1. run  command={step.format('all')!r}  carry={carry}  timeout_s=600",
        ("     installs the kit, generates and builds the benchmarks, measures the most valuable variants first "
         "(each layer's first-choice algorithm, ResNet-50 and the transformer encoder before the other models) "
         "until the report's reserve, then writes the report from what was measured; ends before about 570 s "
         "and prints each stage's time"),
        f"     {back}",
        ("2. at once (the machine stays warm 30 s after the reply, and a new one would cost minutes of a start): "
         "copy the files back as above, then `status`; only if budget_left_s - 60 >= 180: run  "
         f"command={step.format('all --budget B')!r}  carry={carry}  timeout_s=600, with B = budget_left_s - 60 "
         f"(at most {ALL_BUDGET_S:g}), so the call ends inside the session's device time"),
        ("     continues the campaign where the database left it (a warm machine skips install and generate, a "
         "bare one redoes them), budgets with the stage times call 1 measured, and refreshes the report"),
        f"     {back}",
        "   else: give_back at once",
        "then commit perfdb/<gpu>.db.gz, perfdb/<gpu>-campaign.log and docs/results-<gpu>.md",
        (f"(`{step.format('smoke')}`, every family under compute-sanitizer, is its own call of a later session: "
         f"this one has no device time for it)"),
    ]


# --- device steps -------------------------------------------------------------------------------

@dataclass
class Device:
    python: Path
    kit: Path
    state: Path
    deadline: float  # time.monotonic() by which a step must have handed back
    perfdb: Path
    docs: Path

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ, PYTHONUNBUFFERED="1", CUDNN_FRONTEND_ROOT=str(self.kit / "cudnn-frontend"))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(self.state / "site"), str(REPO),
                                                          os.environ.get("PYTHONPATH")]))
        env["CMAKE_PREFIX_PATH"] = os.pathsep.join(filter(None, [str(self.state / "benchmark"),
                                                                 os.environ.get("CMAKE_PREFIX_PATH")]))
        nvcc = self.state / "nvcc"
        if nvcc.is_file():  # the compiler benanza.toolchain found, for CMake too
            env["CUDACXX"] = nvcc.read_text().strip()
        return env

    def bz(self, *args: str) -> list[str]:
        # the `benanza` command of an install; this one is only on PYTHONPATH
        return [str(self.python), "-c", "from benanza.cli import main; main(prog_name='benanza')", *args]

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def call(self, cmd: list[str], what: str, log: Path | None = None, timeout: float | None = None,
             grace: float = 0.0) -> str:
        """Runs cmd (stdout to `log` when given) for at most `timeout` s and never past the deadline
        (plus `grace` s); a failure raises with the output's tail."""
        end = self.left() + grace
        limit = max(1.0, min(end if timeout is None else timeout, end))
        try:
            done = subprocess.run(cmd, env=self.env, check=False, capture_output=True, text=True, timeout=limit,
                                  cwd=REPO)
        except subprocess.TimeoutExpired:
            raise KitError(f"{what}: not finished within the {limit:.0f} s left to this call; call again", 75) from None
        if log is not None:
            log.write_text(done.stdout + done.stderr)
        if done.returncode != 0:
            tail = "\n".join((done.stderr + done.stdout).strip().splitlines()[-12:])
            raise KitError(f"{what} failed (exit {done.returncode}):\n{tail}")
        return done.stdout

    def stamp(self, step: str) -> Path:
        return self.state / "stamps" / step

    def to_out(self, *paths: Path) -> None:
        """Deliverables into $OUT (the device tool brings that folder back)."""
        out = os.environ.get("OUT")
        if not out:
            return
        for p in paths:
            if not p.is_file():
                continue
            copied = Path(out) / p.name
            if p.suffix == ".db":  # one consistent file, whatever the journal holds, packed as it is tracked
                with closing(sqlite3.connect(p)) as src, closing(sqlite3.connect(copied)) as dst:
                    src.backup(dst)
                with copied.open("rb") as raw, gzip.open(f"{copied}.gz", "wb") as packed:
                    shutil.copyfileobj(raw, packed)
                copied.unlink()
                copied = Path(f"{copied}.gz")
            else:
                shutil.copy2(p, copied)
            if copied.stat().st_size > OUT_FILE_LIMIT:  # the tool brings back files of up to 16 MiB
                parts = _split(copied)
                say(f"{copied.name} is over {OUT_FILE_LIMIT / 2**20:g} MiB: it comes back in {len(parts)} parts "
                    f"({copied.name}.part0, ...): cat them, in order, into {copied.name}")


def _split(path: Path) -> list[Path]:
    """``path`` as ``<name>.part0``, ``.part1``, ... of OUT_FILE_LIMIT bytes at most, in place of it."""
    parts = []
    with path.open("rb") as src:
        while chunk := src.read(OUT_FILE_LIMIT):
            part = path.with_name(f"{path.name}.part{len(parts)}")
            part.write_bytes(chunk)
            parts.append(part)
    path.unlink()
    return parts


def _manifest_digest(kit: Path) -> str:
    path = kit / "MANIFEST.json"
    if not path.is_file():
        raise KitError(f"{kit}: no kit here (MANIFEST.json missing): run `scripts/gpukit.py prepare` on a "
                       f"connected machine and name {_kit_rel(kit)} in the call's carry", 4)
    return hashlib.sha256(path.read_bytes()).hexdigest()


_CHECK_REQUIREMENTS = """
import json, sys
from importlib.metadata import version, PackageNotFoundError
from packaging.requirements import Requirement
bad = []
for wheel, reqs in json.load(open(sys.argv[1]))["requires"].items():
    for r in map(Requirement, reqs):
        try:
            have = version(r.name)
        except PackageNotFoundError:
            bad.append(f"{wheel} needs {r}: not installed"); continue
        if not r.specifier.contains(have, prereleases=True):
            bad.append(f"{wheel} needs {r}: {have} is installed")
import benanza.cli, sqlite_utils
print("\\n".join(bad))
"""


def _extract(archive: tarfile.TarFile, dest: Path) -> None:
    """Unpacks the kit's source archive into ``dest``, nothing outside it: tarfile's "data" filter
    where this Python has it (3.11.4+; the image's 3.12 does), else the same rule checked here
    (Debian bookworm's 3.11.2, where the tests run)."""
    if hasattr(tarfile, "data_filter"):
        archive.extractall(dest, filter="data")
        return
    root = dest.resolve()
    for m in archive.getmembers():
        target = (root / m.name).resolve()
        link = (target.parent / m.linkname).resolve() if m.issym() or m.islnk() else root
        if not (target.is_relative_to(root) and link.is_relative_to(root)) or m.isdev():
            raise KitError(f"{archive.name}: member {m.name!r} would land outside {dest}")
    archive.extractall(dest)


def step_install(d: Device) -> None:
    digest = _manifest_digest(d.kit)
    if d.stamp("install").is_file() and d.stamp("install").read_text() == digest:
        say("install: done on this machine already")
        return
    manifest = json.loads((d.kit / "MANIFEST.json").read_text())
    site = d.state / "site"
    shutil.rmtree(site, ignore_errors=True)
    wheels = [str(d.kit / "wheels" / w) for w in manifest["wheels"]]
    d.call([str(d.python), "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
            "--no-cache-dir", "--disable-pip-version-check", "--target", str(site), *wheels], "pip install")
    bad = d.call([str(d.python), "-c", _CHECK_REQUIREMENTS, str(d.kit / "MANIFEST.json")], "requirement check")
    if bad.strip():
        raise KitError("requirements the image and the kit do not meet (MANIFEST.json):\n" + bad.strip())
    say(f"install: {len(wheels)} wheels into {site} (PYTHONPATH beside {d.python})")

    tarball = next((d.kit / "benchmark").glob("benchmark_*.orig.tar.*"))
    src, build, prefix = d.state / "benchmark-src", d.state / "benchmark-build", d.state / "benchmark"
    for p in (src, build, prefix):
        shutil.rmtree(p, ignore_errors=True)
    src.mkdir(parents=True)
    with tarfile.open(tarball) as t:
        _extract(t, src)
    top = next(p for p in src.iterdir() if (p / "CMakeLists.txt").is_file())
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    d.call(["cmake", "-S", str(top), "-B", str(build), *gen, "-DCMAKE_BUILD_TYPE=Release",
            f"-DCMAKE_INSTALL_PREFIX={prefix}", "-DBENCHMARK_ENABLE_TESTING=OFF", "-DBENCHMARK_ENABLE_GTEST_TESTS=OFF",
            "-DBENCHMARK_ENABLE_WERROR=OFF", "-DBENCHMARK_INSTALL_DOCS=OFF"], "Google Benchmark: cmake")
    d.call(["cmake", "--build", str(build), "-j", str(os.cpu_count() or 1)], "Google Benchmark: build")
    d.call(["cmake", "--install", str(build)], "Google Benchmark: install")
    say(f"install: Google Benchmark {manifest['benchmark']} built with this machine's compiler into {prefix}")

    nvcc = d.call([str(d.python), "-c", ("from benanza.toolchain import cuda_toolkit as c, nvcc_version as v; "
                                         "t = c(); print(t.nvcc, v(t.nvcc), t.cudart) if t else print()")],
                  "nvcc discovery").split()
    if len(nvcc) != 3 or nvcc[1].split(".")[0] != "13":
        raise KitError(f"nvcc: {' '.join(nvcc) or 'not found'}; the image's cuDNN/cuBLAS wheels are CUDA 13 "
                       f"builds and need a CUDA 13 nvcc ($CUDA_HOME, /usr/local/cuda or PATH)", 3)
    (d.state / "nvcc").write_text(nvcc[0] + "\n")
    (d.state / "cudart").write_text(nvcc[2] + "\n")
    print(d.call([str(d.python), "-m", "benanza.toolchain", "--cudnn", "--check"], "toolchain check"), end="")
    d.stamp("install").parent.mkdir(parents=True, exist_ok=True)
    d.stamp("install").write_text(digest)


_TRANSFORMER_EXPORT = """
import sys, warnings
import torch
warnings.simplefilter("ignore")
torch.manual_seed(0)
layer = torch.nn.TransformerEncoderLayer(d_model=256, nhead=4, dim_feedforward=1024, batch_first=True)
encoder = torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).eval()
torch.onnx.export(encoder, (torch.randn(1, 64, 256),), sys.argv[1], input_names=["x"], output_names=["y"],
                  opset_version=17, dynamo=False)
"""

# What CPU deployments of the encoder run: ONNX Runtime's dynamic int8 quantization (the image has
# onnxruntime), its MatMuls as DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul.
_INT8_EXPORT = """
import sys
from onnxruntime.quantization import QuantType, quantize_dynamic
quantize_dynamic(sys.argv[2], sys.argv[1], weight_type=QuantType.QInt8)
"""

# One pre-LN decoder block in plain torch (the image has no transformers package), at the encoder's
# sizes so that the layers they share are benchmarked once: causal attention over the tokens of the
# same packed document that are not padding (a mask of And and Equal of booleans) and a tanh-GELU MLP.
_DECODER_EXPORT = """
import sys, warnings
import torch
from torch import nn
warnings.simplefilter("ignore")
torch.manual_seed(0)
D, H, S = 256, 4, 64


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(approximate="tanh"), nn.Linear(4 * D, D))
        self.register_buffer("causal", torch.ones(S, S, dtype=torch.bool).tril()[None, None])

    def forward(self, x, pad, doc):
        q, k, v = (t.view(1, S, H, D // H).transpose(1, 2) for t in self.qkv(self.ln1(x)).split(D, dim=2))
        same_doc = doc[:, None, :, None] == doc[:, None, None, :]
        keep = self.causal & pad[:, None, None, :] & same_doc
        scores = torch.where(keep, (q @ k.transpose(-1, -2)) / (D // H) ** 0.5, torch.finfo(x.dtype).min)
        x = x + self.proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(1, S, D))
        return x + self.mlp(self.ln2(x))


pad, doc = torch.ones(1, S, dtype=torch.bool), torch.arange(S)[None] >= S // 2
torch.onnx.export(Block().eval(), (torch.randn(1, S, D), pad, doc), sys.argv[1], input_names=["x", "pad", "doc"],
                  output_names=["y"], opset_version=17, dynamo=False)
"""


@dataclass(frozen=True)
class Export:
    """A model the kit makes on the device with the image's torch and onnxruntime, for the GPU
    paths the zoo's CNNs do not reach; ``source``: the export it is made from (the script's second
    argument)."""

    name: str
    what: str
    script: str
    source: str | None = None


EXPORTS = (
    Export(TRANSFORMER, "PyTorch nn.TransformerEncoder export: GEMMs, layer norms, softmax", _TRANSFORMER_EXPORT),
    Export(f"{TRANSFORMER}-int8", ("ONNX Runtime's quantize_dynamic of the transformer encoder: cuBLASLt's int8 "
                                   "GEMM, Cast and (Dynamic)QuantizeLinear graph nodes"), _INT8_EXPORT, TRANSFORMER),
    Export("masked-decoder", ("a decoder block in plain torch: its causal, padding and same-document mask as "
                              "And and Equal of booleans, a tanh-GELU MLP"), _DECODER_EXPORT),
)


_SMOKE_MODEL = """
import sys
sys.path[:0] = [".", "tests"]  # the tests package (cwd: the repository), and the helpers it imports
import onnx
from tests.backends.test_cudnn import every_family_model
onnx.save(every_family_model(), sys.argv[1])
"""

_CACHE_KEYS = ("CMAKE_CUDA_COMPILER", "CMAKE_CUDA_ARCHITECTURES", "BENANZA_CUDNN_LIBRARY", "BENANZA_CUDNN_INCLUDE_DIR",
               "BENANZA_CUBLAS_LIBRARY", "BENANZA_CUDNN_FRONTEND_INCLUDE_DIR", "BENANZA_NVRTC_LIBRARY", "benchmark_DIR")


def _configure_and_say(d: Device, project: Path) -> None:
    cache = configure(d, project)
    say(f"generate: configured {project}")
    for key in _CACHE_KEYS:
        say(f"  {key} = {cache.get(key, 'MISSING')}")


def configure(d: Device, project: Path) -> dict[str, str]:
    """Configures a generated project where and as `benanza run` builds it (backends.base.build)."""
    build = project / "build"
    gen = ["-G", "Ninja"] if shutil.which("ninja") and not (build / "CMakeCache.txt").exists() else []
    # the CUDA runtime benanza.toolchain found beside that nvcc, named for CMake: FindCUDAToolkit
    # looks beside the compiler's own root, where a toolkit may ship only the versioned soname
    cudart = d.state / "cudart"
    found = Path(cudart.read_text().strip()) if cudart.is_file() else None
    runtime = [f"-DCUDA_cudart_LIBRARY={found}", f"-DCUDA_CUDART={found}"] if found and found.is_file() else []
    d.call(["cmake", "-S", str(project), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release", *gen, *runtime],
           f"cmake configure of {project}", log=d.state / f"configure-{project.parent.name}.log")
    cache = {}
    for line in (build / "CMakeCache.txt").read_text().splitlines():
        key = line.split(":", 1)[0]
        if key in _CACHE_KEYS:
            cache[key] = line.split("=", 1)[1]
    return cache


def export_models(d: Device, models: Path) -> tuple[list[str], list[Path], list[str]]:
    """The kit's exports (EXPORTS) into ``models``: the names and paths of those Benanza processes
    (probed with `generate --backend none`), and for each of the others a line saying why it is
    not in the campaign. One failing export or probe never stops the others or the campaign."""
    names, paths, notes, exported = [], [], [], set()
    for e in EXPORTS:
        path = models / f"{e.name}.onnx"
        try:
            if e.source is not None and e.source not in exported:
                raise KitError(f"its source, {e.source}, was not exported")
            d.call([str(d.python), "-c", e.script, str(path),
                    *([str(models / f"{e.source}.onnx")] if e.source else [])], f"export of {e.name}")
            exported.add(e.name)
            d.call(d.bz("generate", str(path), "--out", str(d.state / "probe"), "--backend", "none"),
                   f"benanza generate --backend none {e.name}.onnx")
        except KitError as err:
            if err.code == 75:  # out of time: the call ends here, as any step's
                raise
            notes.append(f"{e.name} ({e.what}): not in the campaign: {_first_line(err)}")
            say(f"generate: {notes[-1]}")
            continue
        names.append(e.name)
        paths.append(path)
        say(f"generate: {e.name} is processable: in the campaign")
    return names, paths, notes


def batched(model: str) -> str:
    """The name a CNN's batch-32 layers occur under in the campaign's manifest."""
    return f"{model}-b{BATCH}"


_INPUT_SHAPES = """
import json, sys
from benanza.processor import input_shapes_of
print(json.dumps([input_shapes_of(p, int(sys.argv[1])) for p in sys.argv[2:]]))
"""


def batched_args(d: Device, models: Path, cnns: Sequence[str] = MODELS) -> list[str]:
    """`benanza generate` arguments that add the zoo's CNNs at BATCH: each file linked as
    `<model>-b32.onnx`, and its inputs' shapes at that batch (as `analyze --batch-size` makes
    them: processor.input_shapes_of) given to that name alone."""
    paths = [models / f"{m}.onnx" for m in cnns]
    shapes = json.loads(d.call([str(d.python), "-c", _INPUT_SHAPES, str(BATCH), *map(str, paths)],
                               "input shapes at batch 32"))
    args = []
    for m, path, inputs in zip(cnns, paths, shapes):
        link = models / f"{batched(m)}.onnx"
        link.unlink(missing_ok=True)
        link.symlink_to(path.name)
        args += [str(link), *(a for name, dims in inputs.items()
                              for a in ("--input-shape", f"{batched(m)}:{name}={'x'.join(map(str, dims))}"))]
    return args


def step_generate(d: Device) -> None:
    step_install(d)
    if d.stamp("generate").is_file():
        say("generate: done on this machine already")
        return
    models = d.state / "models"
    only = [a for m in MODELS for a in ("--only", m)]
    d.call(d.bz("zoo", "--out", str(models), *only), "benanza zoo")
    names, paths, notes = export_models(d, models)
    names, paths = [*MODELS, *names], [*(models / f"{m}.onnx" for m in MODELS), *paths]
    (d.state / "models.json").write_text(json.dumps({"names": names, "paths": [str(p) for p in paths],
                                                     "notes": notes}) + "\n")
    maths = [a for m in GENERATE_MATHS for a in ("--math", m)]
    d.call(d.bz("generate", *map(str, paths), *batched_args(d, models), "--out", str(d.state / "bench"),
                "--backend", "cudnn", *maths), "benanza generate (campaign)")
    _configure_and_say(d, d.state / "bench" / "cudnn")
    count = d.call([str(d.python), "-c", ("import sys; from benanza.generator import read_variants; "
                                          "print(len(read_variants(sys.argv[1])))"), str(d.state / "bench" / "cudnn")],
                   "variant count")
    measured = sum(len(t.names) for t in campaign_tiers(d.state / "bench", names))
    say(f"generate: {count.strip()} variants of {', '.join(names)}, and of {', '.join(map(batched, MODELS))} "
        f"(batch {BATCH}); {measured} in the campaign (f16 on FMA units left out)")
    d.stamp("generate").write_text("\n".join(names) + "\n")


def gpu_name(step: str) -> str:
    """The device's name, or KitError: this step needs a GPU (the steps before it ran)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        raise KitError(f"{step} needs a GPU: nvidia-smi not found (no NVIDIA driver here); the steps before "
                       f"it ran, run this one on the GPU machine (`scripts/gpukit.py commands`)", 3)
    done = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], check=False, capture_output=True,
                          text=True)
    name = done.stdout.strip().splitlines()[0].strip() if done.returncode == 0 and done.stdout.strip() else ""
    if not name:
        raise KitError(f"{step} needs a GPU: nvidia-smi lists none ({(done.stderr or done.stdout).strip()[:200]})", 3)
    return name


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def _torch_sees_gpu(d: Device, step: str) -> None:
    ok = subprocess.run([str(d.python), "-c", "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"],
                        env=d.env, check=False, capture_output=True)
    if ok.returncode != 0:
        raise KitError(f"{step} needs a GPU: PyTorch does not see it (torch.cuda.is_available() is False)", 3)


def _gpu_preflight(d: Device, step: str) -> str:
    name = gpu_name(step)
    _torch_sees_gpu(d, step)
    gpu = slug(name)
    unpack_db(d.perfdb / f"{gpu}.db")
    return gpu


def _last_result(db: Path) -> int:
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        return conn.execute("SELECT coalesce(max(id), 0) FROM results").fetchone()[0]


def unpack_db(db: Path) -> None:
    """The tracked ``<gpu>.db.gz`` (the database itself would outgrow what a device call carries)
    into ``<gpu>.db``, unless the database there already holds as many results: on a warm machine
    it is the newer one, its campaign continued since the packed copy travelled."""
    packed = db.with_name(db.name + ".gz")
    if not packed.is_file():
        return
    fresh = db.with_name(db.name + ".unpacked")
    with gzip.open(packed, "rb") as src, fresh.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    if db.is_file() and _last_result(db) >= _last_result(fresh):
        fresh.unlink()
        return
    for journal in (db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
        journal.unlink(missing_ok=True)  # the replaced database's: SQLite would replay it into this one
    fresh.replace(db)
    say(f"{db.name}: unpacked from {packed.name}")


def _run_until_deadline(d: Device, cmd: list[str], log: Path, deadline: float) -> tuple[int, bool]:
    """Runs a resumable command until it ends or ``deadline`` (time.monotonic()) passes; then
    SIGTERM (benanza run keeps what it stored), and SIGKILL if it does not stop. Returns (exit
    status, stopped)."""
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, env=d.env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                                start_new_session=True)
        try:
            return proc.wait(timeout=max(1.0, deadline - time.monotonic())), False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                return proc.wait(timeout=30), True
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                return proc.wait(), True


# --- what each stage costs: printed as it goes, kept in perfdb/<gpu>-campaign.log -----------------

_STAGE_LINE = re.compile(r"^\S+ stage (.+) (\d+) s$", re.MULTILINE)
_CAMPAIGN_LINE = re.compile(r"^\S+ (\d+) s .*$", re.MULTILINE)  # one per call of `benanza run`
_STACK_NAMED = re.compile(r"\(stack (\w+)\)")  # in its summary, where it printed one
# Seconds a stage is assumed to take until a call has measured it on this GPU
# (perfdb/<gpu>-campaign.log): the H200's first run (2026-11-27: profiles 10-28 s, analyses 1-8 s)
# rounded up, the others guesses; the first call on a GPU replaces them. "stop": a stopped
# `benanza run` handing back and its database folded into one file; "page": gpu-results.py and
# the copies (1 s on the H200: the rest is margin).
FIDELITY_JSON = "fidelity-cuda.json"  # benchmarks/fidelity_cuda.py's output in the machine's state
KERNELS_JSON = "kernels-cuda.json"  # benchmarks/kernel_durations.py's comparison, likewise
# "kernels": a CUPTI-mode project of the three CNNs generated (f32), configured, built (the
# campaign's whole project took 49 s on the H200, this one has a sixth of its variants) and the
# bounds' 220 variants run
DEFAULT_SECONDS = {"stop": 15.0, "profile": 30.0, "analyze": 8.0, "fidelity": 60.0, "kernels": 150.0, "page": 15.0}
# How long the page may run past the budget when the estimates before it ran over (ALL_BUDGET_S).
PAGE_GRACE_S = 25.0


def _stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Timeline:
    """The call's stages as they end: one line each on stderr (its time, and where the call
    stands in its budget), and the lines of the campaign log, written once the GPU's name (the
    log's name) is known."""

    def __init__(self, started: float, budget: float) -> None:
        self.started, self.budget = started, budget
        self.pending: list[str] = []

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        began = time.monotonic()
        try:
            yield
        finally:
            self.record(name, time.monotonic() - began)

    def record(self, name: str, seconds: float) -> None:
        say(f"stage {name}: {seconds:.0f} s (the call at {time.monotonic() - self.started:.0f} s of "
            f"{self.budget:.0f})")
        self.pending.append(f"{_stamp()} stage {name} {seconds:.0f} s")

    def flush(self, log: Path) -> None:
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a") as f:
            f.writelines(line + "\n" for line in self.pending)
        self.pending.clear()


def estimate(log_text: str, stage: str, like: str | None = None) -> float:
    """The stage's seconds as the latest call measured them; else those of ``like``, the same
    kind of work a call measured for the same model (Run.estimate); else the default for its
    kind (the first word: "profile resnet50-v1" → "profile")."""
    for name in (stage, like):
        measured = [float(m[2]) for m in _STAGE_LINE.finditer(log_text) if m[1] == name]
        if measured:
            return measured[-1]
    return DEFAULT_SECONDS[stage.split()[0]]


# --- the campaign's order ---------------------------------------------------------------------

# The models whose bounds a stopped campaign must already give: ResNet-50 (batch 1, the paper's
# model) and the transformer encoder (GEMMs and attention), when Benanza processes it.
PRIORITY_MODELS = ("resnet50-v1", TRANSFORMER)
# Each layer's first-choice variant, the one that gives its bound before the exhaustive others:
# the call's only algorithm ("default"), the top rank of the library heuristic's answer
# (cublasLtMatmul "heuristic0", the cuDNN frontend's "plan0"), and for the legacy convolution
# calls, whose heuristic pick is known only on the GPU (the heuristic_algo counter),
# IMPLICIT_PRECOMP_GEMM, the one algorithm cuDNN runs with every fusion (cudnn.IDENTITY_ALGOS);
# in the models' own layout.
FIRST_CHOICE = frozenset({"default", "heuristic0", "plan0", "IMPLICIT_PRECOMP_GEMM"})
FIRST_LAYOUT = "nchw"
TF32 = "tf32_allowed"  # the math of the TF32 bound's f32 variants (benanza.backends.cudnn.TF32_MATH)


@dataclass(frozen=True)
class Tier:
    label: str
    names: tuple[str, ...]


def _problem(key: str) -> str:
    """A layer key without its dtype: keys are `<problem>_<dtype>` (benanza.ops.grammar.layer_key),
    so a layer's variants in another dtype share it."""
    return key.rsplit("_", 1)[0]


def campaign_tiers(bench: Path, models: list[str]) -> tuple[Tier, ...]:
    return _tiers(*_campaign_variants(bench), models)


def _tiers(layers: list[dict[str, Any]], variants: list[dict[str, str]], models: list[str]) -> tuple[Tier, ...]:
    """The generated variants that the campaign measures (CAMPAIGN_FILTER), in its
    order, most valuable first: the first-choice variants in the layer's own dtype and exact math (the exact-f32
    bound) of the priority models' layers at batch 1, then of the other models' (every layer of
    every model then has a bound), then in TF32 (the bound of PyTorch's default math), the
    first-choice variants in the other dtypes (the fp16 what-if) of the priority models, the
    CNNs' first choices at batch 32 (exact, then TF32), all the priority models' variants at
    batch 1, and the rest. Each variant is in the first tier it fits."""
    own_dtype = {layer["key"] for layer in layers}
    users: dict[str, set[str]] = {}
    for layer in layers:
        users.setdefault(_problem(layer["key"]), set()).update(o["model"] for o in layer["occurrences"])
    priority = [m for m in PRIORITY_MODELS if m in models]
    others = [m for m in models if m not in priority]
    big = [batched(m) for m in MODELS if m in models]

    def used_by(group: list[str]) -> Callable[[dict[str, str]], bool]:
        return lambda v: bool(users.get(_problem(v["layer_key"]), set()) & set(group))

    def first(v: dict[str, str]) -> bool:
        return v["algo"] in FIRST_CHOICE and v["layout"] == FIRST_LAYOUT

    def own(tf32: bool) -> Callable[[dict[str, str]], bool]:
        return lambda v: first(v) and v["layer_key"] in own_dtype and (v["math"] == TF32) == tf32

    by_priority, by_others, by_all, by_big = used_by(priority), used_by(others), used_by(models), used_by(big)
    exact, tf32 = own(False), own(True)
    rules: list[tuple[str, Callable[[dict[str, str]], bool]]] = [
        (f"first choice in the model's dtype: {', '.join(priority)}", lambda v: by_priority(v) and exact(v)),
        (f"first choice in the model's dtype: {', '.join(others)}", lambda v: by_others(v) and exact(v)),
        (f"first choice in TF32: {', '.join(models)}", lambda v: by_all(v) and tf32(v)),
        (f"first choice in other dtypes: {', '.join(priority)}", lambda v: by_priority(v) and first(v)),
        (f"first choice in the model's dtype: {', '.join(big)}", lambda v: by_big(v) and exact(v)),
        (f"first choice in TF32: {', '.join(big)}", lambda v: by_big(v) and tf32(v)),
        (f"every variant: {', '.join(priority)}", by_priority),
        ("every other variant", lambda v: True),
    ]
    tiers: list[list[str]] = [[] for _ in rules]
    for v in variants:
        tiers[next(i for i, (_, rule) in enumerate(rules) if rule(v))].append(v["name"])
    return tuple(Tier(label, tuple(names)) for (label, _), names in zip(rules, tiers) if names)


def _campaign_variants(bench: Path) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """The generated layers of ``bench`` and the variants of them the campaign measures."""
    layers = json.loads((bench / "layers.json").read_text())["layers"]
    variants = [v for v in json.loads((bench / "cudnn" / "variants.json").read_text())["variants"]
                if re.search(CAMPAIGN_FILTER, v["name"])]
    return layers, variants


def model_variants(layers: list[dict[str, Any]], variants: list[dict[str, str]]) -> dict[str, tuple[str, ...]]:
    """Per model, as its layers' occurrences name it (`<model>-b32` at batch 32): the campaign's
    variants of those layers in their own dtype, among which its bounds take each layer's fastest."""
    users = {layer["key"]: {o["model"] for o in layer["occurrences"]} for layer in layers}
    by_model: dict[str, list[str]] = {}
    for v in variants:
        for model in users.get(v["layer_key"], ()):
            by_model.setdefault(model, []).append(v["name"])
    return {m: tuple(names) for m, names in sorted(by_model.items())}


def write_tiers(d: Device, tiers: tuple[Tier, ...]) -> list[Path]:
    """The `benanza run --first` files: every tier but the last (the rest comes after them anyway)."""
    files = []
    for i, tier in enumerate(tiers[:-1], 1):
        path = d.state / f"first-{i}.txt"
        path.write_text("".join(n + "\n" for n in tier.names))
        files.append(path)
    return files


def _models(d: Device) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((d.state / "models.json").read_text())
    return data


def _report_order(names: list[str]) -> list[str]:
    return [m for m in PRIORITY_MODELS if m in names] + [m for m in names if m not in PRIORITY_MODELS]


@dataclass(frozen=True)
class Run:
    """A model at one batch size in the report: one PyTorch profile, one analysis per math mode
    (ANALYSIS_MATHS)."""

    model: str
    batch: int = 1

    @property
    def label(self) -> str:
        return self.model if self.batch == 1 else batched(self.model)

    @property
    def priority(self) -> bool:
        return self.model in PRIORITY_MODELS

    def subject(self, math: str = "exact") -> str:
        """What its stages and the page's notes name: `resnet50-v1`, `resnet50-v1-b32 tf32`."""
        return self.label + ("" if math == "exact" else f" {math}")

    def stage(self, kind: str, math: str = "exact") -> str:
        """Its stage in the campaign log: `profile resnet50-v1-b32`, `analyze resnet50-v1 tf32`."""
        return f"{kind} {self.subject(math)}"

    def estimate(self, log_text: str, kind: str, math: str = "exact") -> float:
        """Measured, else guessed from the model's batch-1 exact stage: a TF32 analysis reads the
        same database for the same layers, a batch-32 one the same number of layers; a batch-32
        profile runs the same graph, whose start-up dominated at batch 1 (10-28 s on the H200)."""
        return estimate(log_text, self.stage(kind, math), Run(self.model).stage(kind))


def report_runs(names: list[str]) -> list[Run]:
    """The report's order: the priority models (batch 1, then ResNet-50 at batch 32), whose
    profiles the reserve holds, then the others, batch 1 first."""
    runs = [Run(m) for m in _report_order(names)] + [Run(m, BATCH) for m in _report_order(list(MODELS)) if m in names]
    return sorted(runs, key=lambda r: not r.priority)


# --- the call's budget ----------------------------------------------------------------------------

@dataclass(frozen=True)
class CallPlan:
    """How one call spends what is left of its budget once the benchmarks are generated: the
    campaign (the build included) gets all but the report's reserve."""

    left_s: float
    reserve: tuple[tuple[str, float], ...]  # (stage, estimated seconds), in the order they run

    @property
    def campaign_s(self) -> float:
        return max(0.0, self.left_s - sum(s for _, s in self.reserve))

    def to_json(self) -> dict[str, Any]:
        return {"left_s": round(self.left_s, 1),
                "reserve": [[stage, s] for stage, s in self.reserve], "campaign_s": round(self.campaign_s, 1)}


def plan_call(left_s: float, models: list[str], profiled: set[str], log_text: str,
              compare: bool = False, kernels: bool = False) -> CallPlan:
    """The report's reserve: the campaign's stop, a profile of each priority run (report_runs) not
    profiled on this machine yet (``profiled``: run labels; the others are profiled only with
    time to spare), an analysis of every run in every math mode, the timing-fidelity comparison
    against PyTorch and the kernels' own durations where each is still to be made on this machine
    (``compare``, ``kernels``: a campaign that fills the call would leave them no spare time), the
    page; each as the latest call measured it, else as estimated (Run.estimate)."""
    runs = report_runs(models)
    stages = [("stop", estimate(log_text, "stop")),
              *((r.stage("profile"), r.estimate(log_text, "profile")) for r in runs
                if r.priority and r.label not in profiled),
              *((r.stage("analyze", m), r.estimate(log_text, "analyze", m)) for r in runs for m in ANALYSIS_MATHS),
              *([("fidelity", estimate(log_text, "fidelity"))] if compare else []),
              *([("kernels", estimate(log_text, "kernels"))] if kernels else []),
              ("page", estimate(log_text, "page"))]
    return CallPlan(left_s, tuple(stages))


def _log_text(log: Path | None) -> str:
    return log.read_text(errors="replace") if log is not None and log.is_file() else ""


def _profiled(d: Device, models: list[str]) -> set[str]:
    return {r.label for r in report_runs(models) if d.stamp(f"profile-{r.label}").is_file()}


# --- campaign -------------------------------------------------------------------------------------

def current_stack(db: Path, system: str) -> str | None:
    """The stack the system last measured on (what `benanza analyze` reads, PerfDB.system): a new
    cuDNN, cuBLAS or driver is a new stack, whose campaign starts over."""
    if not db.is_file():
        return None
    with closing(sqlite3.connect(db)) as conn:
        row = conn.execute("SELECT stack_id FROM systems WHERE name = ? ORDER BY last_used DESC, rowid DESC LIMIT 1",
                           (system,)).fetchone()
    return row[0] if row else None


def latest_statuses(db: Path, system: str) -> dict[str, str]:
    """Each variant's latest status on the system's current stack (the database's results table)."""
    stack = current_stack(db, system)
    if stack is None:
        return {}
    with closing(sqlite3.connect(db)) as conn:
        rows = conn.execute("SELECT variant, status FROM results WHERE stack_id = ? ORDER BY id", (stack,)).fetchall()
    return dict(rows)


def campaign_calls(log_text: str, stack: str | None) -> tuple[int, float]:
    """The calls of `benanza run` on ``stack`` in the campaign log, and their seconds (a call
    that printed no summary counts: it names no other stack)."""
    seconds = [float(m[1]) for m in _CAMPAIGN_LINE.finditer(log_text)
               if stack is None or (named := _STACK_NAMED.search(m[0])) is None or named[1] == stack]
    return len(seconds), sum(seconds)


def coverage_note(tiers: tuple[Tier, ...], statuses: dict[str, str], stopped: str | None,
                  by_model: dict[str, tuple[str, ...]]) -> str:
    """The results page's line on how far the campaign got: complete, or partial with each tier's
    share of variants that have a result (ok or unsupported; a failed one is retried), and the
    models whose bounds chose among only some of their layers' variants: a layer's fastest so far
    is no bound on it until its every variant has run."""
    done = {n for n, s in statuses.items() if s in ("ok", "unsupported")}
    total = sum(len(t.names) for t in tiers)
    have = sum(n in done for t in tiers for n in t.names)
    if have == total:
        return f"Campaign complete: all {total} variants have a result (ok or unsupported)."
    per_tier = "; ".join(f"{t.label}: {sum(n in done for n in t.names)}/{len(t.names)}" for t in tiers)
    why = stopped or "variants failed or not run yet"
    counts = {m: sum(n in done for n in names) for m, names in by_model.items()}
    whole = [m for m in by_model if counts[m] == len(by_model[m])]
    short = [f"{m} {counts[m]}/{len(by_model[m])}" for m in by_model if m not in whole]
    models = (f"Every variant of their layers has a result for {', '.join(whole) or 'no model'}; "
              f"the other models' bounds are each layer's fastest among the variants measured so far "
              f"({', '.join(short)} of the variants of their layers in their own dtype), and may still fall. "
              if short else "")
    return (f"**Partial campaign** ({why}): {have} of {total} variants have a result, in the order measured: "
            f"{per_tier}. {models}Bounds resting on a layer without a result are partial (below); "
            f"`python3 scripts/gpukit.py device all` on the GPU machine continues the campaign.")


def _campaign(d: Device, gpu: str, tl: Timeline, deadline: float) -> str | None:
    """Builds, then measures in the tiers' order until ``deadline``; returns why it stopped
    early (None: the pass ended by itself)."""
    bench = d.state / "bench"
    db = d.perfdb / f"{gpu}.db"
    campaign_log = d.perfdb / f"{gpu}-campaign.log"
    tiers = campaign_tiers(bench, _models(d)["names"])
    first = [a for f in write_tiers(d, tiers) for a in ("--first", str(f))]
    for tier in tiers:
        say(f"campaign: {len(tier.names):5d} {tier.label}")
    try:
        with tl.stage("build"):
            d.call(["cmake", "--build", str(bench / "cudnn" / "build"), "-j", str(os.cpu_count() or 1)],
                   "campaign build", log=d.state / "build.log", timeout=deadline - time.monotonic())
    except KitError as e:
        if e.code != 75:
            raise
        say(f"campaign: the build did not end within the campaign's share of this call ({d.state / 'build.log'})")
        return "the build did not end within the campaign's share of the call; nothing measured in it"
    output = d.state / "campaign-run.log"
    started = time.monotonic()
    with tl.stage("campaign"):
        rc, stopped = _run_until_deadline(
            d, d.bz("run", "--system", gpu, "--bench-dir", str(bench), "--backend", "cudnn", "--db", str(db),
                    "--repetitions", "3", "--filter", CAMPAIGN_FILTER, *first), output, deadline)
    lines = output.read_text(errors="replace").strip().splitlines()
    summary = next((line for line in reversed(lines) if line.startswith("cudnn on ")), "no summary line")
    outcome = "stopped at the call's time limit" if stopped else f"exit {rc}"
    if stopped:
        if db.is_file():
            with closing(sqlite3.connect(db)) as conn:  # fold a stopped run's journal into the file
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        tl.record("stop", time.monotonic() - deadline)  # SIGTERM to a database that travels
    with campaign_log.open("a") as f:
        f.write(f"{_stamp()} {time.monotonic() - started:.0f} s {outcome}: {summary}\n")
    d.to_out(db, campaign_log, output)
    for line in lines[-3:]:
        say(f"  {line}")
    if stopped:
        say("campaign: stopped at its share of this call with its results stored; the next call continues it")
        return "stopped at the call's time limit"
    if rc != 0:
        raise KitError(f"campaign: `benanza run` failed (exit {rc}); its output: {output}", rc)
    say(f"campaign: complete: {db}")  # one whole pass: a later call only retries what failed
    return None


def step_campaign(d: Device) -> None:
    step_generate(d)
    gpu = _gpu_preflight(d, "campaign")
    d.perfdb.mkdir(parents=True, exist_ok=True)
    if d.left() < 90:
        raise KitError("campaign: under 90 s left in this call after the steps before it; call again", 75)
    tl = Timeline(time.monotonic(), d.left())
    try:
        _campaign(d, gpu, tl, d.deadline)
    finally:
        tl.flush(d.perfdb / f"{gpu}-campaign.log")


def _tool_beside_nvcc(d: Device, tool: str) -> str | None:
    found = shutil.which(tool)
    if found:
        return found
    nvcc = Path(d.env.get("CUDACXX", "/usr/local/cuda/bin/nvcc"))
    return str(nvcc.parent / tool) if (nvcc.parent / tool).is_file() else None


SMOKE_SKIPPED = "gpukit: smoke skipped: "  # scripts/gpu-results.py reads this line


def generate_smoke(d: Device) -> None:
    """The test suite's every-family model, f32 and f16, as its own configured project (its own
    step's work: the one call of `device all` has no time for it)."""
    step_generate(d)
    if d.stamp("smoke-generate").is_file():
        return
    smoke = d.state / "smoke.onnx"
    d.call([str(d.python), "-c", _SMOKE_MODEL, str(smoke)], "smoke model")
    d.call(d.bz("generate", str(smoke), "--out", str(d.state / "smoke"), "--backend", "cudnn",
                "--dtype", "f32", "--dtype", "f16"), "benanza generate (smoke)")
    _configure_and_say(d, d.state / "smoke" / "cudnn")
    d.stamp("smoke-generate").write_text("")


def step_smoke(d: Device) -> None:
    generate_smoke(d)
    gpu = _gpu_preflight(d, "smoke")
    d.perfdb.mkdir(parents=True, exist_ok=True)
    smoke_log = d.perfdb / f"{gpu}-smoke.log"
    sanitizer = _tool_beside_nvcc(d, "compute-sanitizer")
    if sanitizer is None:
        smoke_log.write_text(f"{SMOKE_SKIPPED}compute-sanitizer not found beside nvcc or on PATH\n")
        d.to_out(smoke_log)
        say("smoke: skipped: no compute-sanitizer (the campaign does not depend on it)")
        return
    project = d.state / "smoke" / "cudnn"
    d.call(["cmake", "--build", str(project / "build"), "-j", str(os.cpu_count() or 1)], "smoke build")
    binary = project / "build" / "benanza_bench"
    raw, san = d.state / "smoke-run.log", d.state / "smoke-sanitizer.log"
    # One call per repetition (BENANZA_TARGET_MS tiny): the sanitizer checks every call, it need not time them.
    env_cmd = ["env", "BENANZA_TARGET_MS=0.001", sanitizer, "--tool", "memcheck", "--error-exitcode", "99",
               "--print-limit", "50", "--log-file", str(san), str(binary), "--benchmark_repetitions=1"]
    rc, _ = _run_until_deadline(d, env_cmd, raw, d.deadline)
    text = raw.read_text(errors="replace") + (san.read_text(errors="replace") if san.is_file() else "")
    if "Device not supported" in text:
        smoke_log.write_text(f"{SMOKE_SKIPPED}compute-sanitizer refused the device (Device not supported); "
                             "the campaign does not depend on it\n")
        d.to_out(smoke_log)
        say("smoke: skipped: compute-sanitizer refused the device (Device not supported)")
        return
    smoke_log.write_text(text)
    d.to_out(smoke_log)
    want = len(d.call([str(binary), "--benanza_list"], "smoke --benanza_list").splitlines())
    got = sum(1 for line in text.splitlines() if line.startswith("BENANZA_RESULT "))
    if rc != 0 or got != want:
        raise KitError(f"smoke: compute-sanitizer exit {rc}, {got} of {want} benchmarks reported ({smoke_log})", 5)
    say(f"smoke: {got} benchmarks reported, compute-sanitizer clean ({smoke_log})")


# --- report ---------------------------------------------------------------------------------------

def _first_line(e: KitError) -> str:
    lines = str(e).splitlines()
    return f"{lines[0]} {lines[-1].strip()}" if len(lines) > 1 else lines[0]


def _profile(d: Device, run: Run, model: str, tl: Timeline, log_text: str, room: float) -> list[str]:
    """The run's PyTorch-on-CUDA profile where its estimate fits ``room`` (once per machine: a
    second call on a warm machine has it); the page's notes when there is none."""
    if d.stamp(f"profile-{run.label}").is_file():
        return []
    need = run.estimate(log_text, "profile")
    if need > room:
        say(f"report: {run.label}: not profiled (about {need:.0f} s estimated, {max(0.0, room):.0f} s left)")
        return ["--note", (f"{run.label}: not profiled under PyTorch in this call (about {need:.0f} s, "
                           f"{max(0.0, room):.0f} s left): its bounds have no measured time to compare")]
    nsys = ["--nsys"] if shutil.which("nsys") else []
    try:
        with tl.stage(run.stage("profile")):
            d.call(d.bz("profile", model, "--framework", "torch", "--device", "cuda", "--batch-size", str(run.batch),
                        "--out", str(d.state / f"profile-{run.label}"), *nsys), f"profile {run.label}", timeout=room)
    except KitError as e:  # the analysis goes on without it; the page says so
        say(f"report: {run.label}: {e}")
        return ["--note", f"{run.label}: not profiled: {_first_line(e)}"]
    d.stamp(f"profile-{run.label}").write_text("")
    return []


def _analyze(d: Device, run: Run, math: str, model: str, gpu: str, db: Path, tl: Timeline, page_s: float) -> str:
    """`benanza analyze --json` of the run in one math mode, with its profile where there is one;
    the JSON file's path (KitError where the analysis failed)."""
    name = run.subject(math).replace(" ", "-")
    profile = d.state / f"profile-{run.label}"
    with_profile = ["--profile", str(profile)] if d.stamp(f"profile-{run.label}").is_file() else []
    analysis = d.state / f"analyze-{name}.json"
    with tl.stage(run.stage("analyze", math)):
        analysis.write_text(d.call(d.bz("analyze", model, "--system", gpu, "--db", str(db), "--batch-size",
                                        str(run.batch), "--math", math, *with_profile, "--json", "--report",
                                        str(d.state / f"{name}.html")),
                                   f"analyze {name}", timeout=d.left() - page_s))
    say(f"report: analysed {run.label} ({math})" + (" with its PyTorch profile" if with_profile else ""))
    return str(analysis)


def _report(d: Device, gpu: str, tl: Timeline, stopped: str | None) -> Path:
    """docs/results-<gpu>.md from what the database holds, always: each model analysed (priority
    models first), profiled under PyTorch first where its estimate fits what is left before the
    page's reserve; what is missing (a model not profiled, a failed analysis, a partial
    campaign) is a line on the page."""
    db = d.perfdb / f"{gpu}.db"
    campaign_log = d.perfdb / f"{gpu}-campaign.log"
    log_text = _log_text(campaign_log) + "".join(line + "\n" for line in tl.pending)
    models = _models(d)
    named = dict(zip(models["names"], models["paths"]))
    runs = report_runs(models["names"])
    page_s = estimate(log_text, "page")
    # the comparison with PyTorch is reserved (plan_call), a profile of a model not in the
    # priority runs is not: it may take only what both leave
    compare_s = sum(0.0 if (d.state / done).is_file() else estimate(log_text, stage)
                    for done, stage in ((FIDELITY_JSON, "fidelity"), (KERNELS_JSON, "kernels")))
    analyses, notes = [], []
    for i, run in enumerate(runs):
        later = sum(r.estimate(log_text, "analyze", m) for r in runs[i:] for m in ANALYSIS_MATHS)
        notes += _profile(d, run, named[run.model], tl, log_text, d.left() - page_s - compare_s - later)
        for math in ANALYSIS_MATHS:
            try:
                analyses.append(_analyze(d, run, math, named[run.model], gpu, db, tl, page_s))
            except KitError as e:  # one model's failure must not cost the others' results
                notes += ["--note", f"{run.subject(math)}: not analysed: {_first_line(e)}"]
                say(f"report: {run.label} ({math}): {e}")
    notes += _fidelity(d, gpu, db, tl, log_text, page_s)
    notes += _kernels(d, gpu, db, tl, log_text, page_s)
    with tl.stage("page"):
        calls, seconds = campaign_calls(_log_text(campaign_log), current_stack(db, gpu))
        layers, variants = _campaign_variants(d.state / "bench")
        notes += ["--note", coverage_note(_tiers(layers, variants, models["names"]), latest_statuses(db, gpu),
                                          stopped, model_variants(layers, variants))]
        notes += ["--note", (f"campaign: {calls} call(s) of `benanza run`, L2 flushed before every timed call, "
                             f"3 repetitions (perfdb/{gpu}-campaign.log)")]
        notes += [a for note in models["notes"] for a in ("--note", note)]
        smoke_log = d.perfdb / f"{gpu}-smoke.log"
        smoke = ["--smoke", str(smoke_log)] if smoke_log.is_file() else []
        d.docs.mkdir(parents=True, exist_ok=True)
        results = d.docs / f"results-{gpu}.md"
        # the page is written even where the estimates ran over: past the budget, inside the device's limit
        compared = [a for flag, done in (("--fidelity", FIDELITY_JSON), ("--kernels", KERNELS_JSON))
                    if (d.state / done).is_file() for a in (flag, str(d.state / done))]
        d.call([str(d.python), str(REPO / "scripts" / "gpu-results.py"), "--db", str(db), "--system", gpu,
                "--out", str(results), "--campaign-seconds", f"{seconds:.0f}", *smoke, *compared, *notes,
                *analyses],
               "gpu-results.py", grace=PAGE_GRACE_S)
        reports = d.state / "reports.tar.gz"
        with tarfile.open(reports, "w:gz") as t:
            for p in sorted(d.state.glob("*.html")) + sorted(d.state.glob("analyze-*.json")):
                t.add(p, arcname=p.name)
    say(f"report: wrote {results}")
    return results


def _comparison(d: Device, stage: str, what: str, out: Path, tl: Timeline, log_text: str, page_s: float,
                work: Callable[[float], object]) -> list[str]:
    """One of the report's comparisons (``work``, given the seconds it may take, writes ``out``),
    with time to spare only: once per machine; the page's notes when it did not run."""
    if out.is_file():
        return []
    need, room = estimate(log_text, stage), d.left() - page_s
    if need > room:
        say(f"report: {stage}: not run (about {need:.0f} s estimated, {max(0.0, room):.0f} s left)")
        return ["--note", f"{what}: not run in this call (about {need:.0f} s)"]
    try:
        with tl.stage(stage):
            work(room)
    except KitError as e:
        out.unlink(missing_ok=True)
        say(f"report: {e}")
        return ["--note", f"{what}: {_first_line(e)}"]
    return []


def _fidelity(d: Device, gpu: str, db: Path, tl: Timeline, log_text: str, page_s: float) -> list[str]:
    """benchmarks/fidelity_cuda.py: our convolutions against PyTorch's, same GPU."""
    out = d.state / FIDELITY_JSON
    return _comparison(d, "fidelity", "timing fidelity against PyTorch", out, tl, log_text, page_s, lambda room: d.call(
        [str(d.python), str(REPO / "benchmarks" / "fidelity_cuda.py"), "--db", str(db), "--system", gpu,
         "--out", str(out)], "fidelity_cuda.py", timeout=room))


def _kernels(d: Device, gpu: str, db: Path, tl: Timeline, log_text: str, page_s: float) -> list[str]:
    """benchmarks/kernel_durations.py: our event times against the kernels' own CUPTI durations,
    for the variants the CNNs' exact bounds take."""
    out = d.state / KERNELS_JSON
    return _comparison(d, "kernels", "kernel durations (CUPTI)", out, tl, log_text, page_s,
                       lambda room: _kernel_durations(d, gpu, db, out, time.monotonic() + room))


def _kernel_durations(d: Device, gpu: str, db: Path, out: Path, deadline: float) -> None:
    """The variants the three CNNs' exact bounds take (batch 1), from their own CUPTI-mode project
    (f32, generated once per machine), run with the L2 hot into a database of their own (a CUPTI
    build is another stack: its results never mix with the campaign's), then compared."""
    script = [str(d.python), str(REPO / "benchmarks" / "kernel_durations.py")]
    names = d.call([*script, "select", "--db", str(db), "--system", gpu, "--models", *MODELS],
                   "kernel_durations.py select").split()
    project = d.state / "kernels"
    if not d.stamp("kernels-generate").is_file():
        models = _models(d)
        named = dict(zip(models["names"], models["paths"]))
        d.call(d.bz("generate", *(named[m] for m in MODELS), "--out", str(project), "--backend", "cudnn",
                    "--dtype", "f32", "--cupti"), "benanza generate (kernels)")
        configure(d, project / "cudnn")
        d.stamp("kernels-generate").write_text("")
    chosen = "^(?:" + "|".join(re.escape(n) for n in names) + ")$"
    d.call(d.bz("run", "--system", gpu, "--bench-dir", str(project), "--backend", "cudnn",
                "--db", str(d.state / "kernels.db"), "--l2", "hot", "--no-peaks", "--repetitions", "3",
                "--filter", chosen),
           "benanza run (kernels)", log=d.state / "kernels-run.log", timeout=deadline - time.monotonic())
    say("report: kernels: " + d.call([*script, "compare", "--db", str(d.state / "kernels.db"), "--system", gpu,
                                      "--out", str(out)], "kernel_durations.py compare").strip())


def step_report(d: Device) -> None:
    step_generate(d)
    gpu = _gpu_preflight(d, "report")
    db = d.perfdb / f"{gpu}.db"
    campaign_log = d.perfdb / f"{gpu}-campaign.log"
    if not db.is_file() or not campaign_log.is_file():
        raise KitError(f"report: no {db} with its campaign log: run `device all` first (and copy its "
                       f"files back into perfdb/ when the machine was given back between calls)", 4)
    tl = Timeline(time.monotonic(), d.left())
    try:
        results = _report(d, gpu, tl, None)
    finally:
        tl.flush(campaign_log)
    d.to_out(db, results, campaign_log, d.state / "reports.tar.gz", d.state / FIDELITY_JSON, d.state / KERNELS_JSON)


# --- the one call ---------------------------------------------------------------------------------

def _plan(d: Device, log: Path | None) -> tuple[CallPlan, tuple[Tier, ...]]:
    names = _models(d)["names"]
    plan = plan_call(d.left(), names, _profiled(d, names), _log_text(log),
                     compare=not (d.state / FIDELITY_JSON).is_file(), kernels=not (d.state / KERNELS_JSON).is_file())
    tiers = campaign_tiers(d.state / "bench", names)
    (d.state / "plan.json").write_text(json.dumps(
        {**plan.to_json(), "tiers": [{"label": t.label, "names": list(t.names)} for t in tiers]}, indent=1) + "\n")
    say(f"plan: {plan.left_s:.0f} s left: campaign (build included) {plan.campaign_s:.0f} s, then the report's "
        f"reserve: " + ", ".join(f"{stage} {s:.0f} s" for stage, s in plan.reserve))
    for tier in tiers:
        say(f"plan: {len(tier.names):5d} {tier.label}")
    return plan, tiers


def step_plan(d: Device) -> None:
    """What `device all` would do with this call's time after install and generate, without a
    GPU: the budget split and the campaign's order (out/gpukit/plan.json)."""
    tl = Timeline(time.monotonic(), d.left())
    with tl.stage("install"):
        step_install(d)
    with tl.stage("generate"):
        step_generate(d)
    try:
        log: Path | None = d.perfdb / f"{slug(gpu_name('plan'))}-campaign.log"
    except KitError:  # no GPU here: the defaults
        log = None
    _plan(d, log)


def step_all(d: Device) -> None:
    """install → generate → build and campaign → report in one call: the campaign gets what the
    report's reserve leaves and is stopped for it; the report is written from what was measured."""
    tl = Timeline(time.monotonic(), d.left())
    with tl.stage("install"):
        step_install(d)
    with tl.stage("generate"):
        step_generate(d)
    gpu = _gpu_preflight(d, "all")
    d.perfdb.mkdir(parents=True, exist_ok=True)
    campaign_log, db = d.perfdb / f"{gpu}-campaign.log", d.perfdb / f"{gpu}.db"
    failure = None
    try:
        plan, _ = _plan(d, campaign_log)
        stopped: str | None = "no time left for it in this call"
        if plan.campaign_s > 0:
            try:
                stopped = _campaign(d, gpu, tl, time.monotonic() + plan.campaign_s)
            except KitError as e:  # the report still says what was measured before it
                failure, stopped = e, f"the campaign failed: {_first_line(e)}"
        if db.is_file():
            d.to_out(_report(d, gpu, tl, stopped), d.state / "reports.tar.gz", d.state / FIDELITY_JSON,
                     d.state / KERNELS_JSON)
        else:  # `benanza run` never started measuring: no system, nothing a page could say
            say(f"report: nothing measured on this GPU yet ({stopped}): no results page")
    finally:
        tl.flush(campaign_log)
    d.to_out(db, campaign_log)
    if failure is not None:
        raise failure


STEPS = {"install": step_install, "generate": step_generate, "plan": step_plan, "all": step_all,
         "campaign": step_campaign, "smoke": step_smoke, "report": step_report}


def image_python(given: str | None) -> Path:
    if given:
        return Path(given)
    if IMAGE_PYTHON.is_file():
        return IMAGE_PYTHON
    found = shutil.which("python3")
    if found is None:
        raise KitError("no python3: pass --python", 3)
    return Path(found)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/gpukit.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kit", type=Path, default=REPO / ".gpukit", help="the travelling folder [.gpukit]")
    sub = parser.add_subparsers(dest="command", required=True)
    p_prep = sub.add_parser("prepare", help="build the travelling folder (connected machine)")
    p_prep.add_argument("--limit-mib", type=float, default=LIMIT_MIB, help="what may travel, tree and kit [64]")
    sub.add_parser("commands", help="print the device calls, in order")
    p_dev = sub.add_parser("device", help="one step on the GPU machine")
    p_dev.add_argument("step", choices=list(STEPS))
    p_dev.add_argument("--python", help="the image's Python [/opt/torch/.venv/bin/python3, else python3]")
    p_dev.add_argument("--state", type=Path, default=REPO / "out" / "gpukit",
                       help="this machine's work folder, kept between calls while it stays warm [out/gpukit]")
    p_dev.add_argument("--perfdb", type=Path, default=REPO / "perfdb", help="where <gpu>.db goes [perfdb]")
    p_dev.add_argument("--docs", type=Path, default=REPO / "docs", help="where results-<gpu>.md goes [docs]")
    p_dev.add_argument("--budget", type=float,
                       help="seconds this call may work before it hands back; the device kills at 600 "
                            f"[all and plan: {ALL_BUDGET_S:g}, the others: {STEP_BUDGET_S:g}]")
    args = parser.parse_args(argv)
    kit = args.kit.absolute()
    try:
        if args.command == "prepare":
            prepare(kit, args.limit_mib)
            print("\n".join(commands(kit)))
        elif args.command == "commands":
            print("\n".join(commands(kit)))
        else:
            state = args.state.absolute()
            state.mkdir(parents=True, exist_ok=True)
            # plan: what `all` would do, so with its budget
            budget = args.budget or (ALL_BUDGET_S if args.step in ("all", "plan") else STEP_BUDGET_S)
            d = Device(image_python(args.python), kit, state, time.monotonic() + budget,
                       args.perfdb.absolute(), args.docs.absolute())
            STEPS[args.step](d)
    except KitError as e:
        say(str(e))
        return e.code
    return 0


if __name__ == "__main__":
    sys.exit(main())
