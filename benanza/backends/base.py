"""The one base every backend implements (docs/backends.md), as Polygraphy has one runner base.

A backend says three things, and the generator, runner, database and analyzer ask nothing else:

- **which variants a layer has** (``covers``, ``variants``): the choices its library or framework
  offers for that layer (algorithm, dtype, layout, math, fusion), as ``Variant`` records;
- **how they are built** (``render``, then ``prepare``): the generated project under
  ``<bench-dir>/<backend>/``, and what turns it into a program that measures: a CMake build of a
  C++ binary (``CMakeBackend``), or nothing beyond the generated files for a backend that measures
  in a Python child process;
- **how one batch of variants is measured** (``prepare``'s ``Command``): the argv of a child that
  speaks the runtime's line protocol (``runtime_cpp/common/README.md``: ``--benanza_names``,
  ``--benanza_context``, ``BENANZA_START`` / ``BENANZA_RESULT`` lines with per-call samples), so the
  runner's crash isolation, ``--timeout``, resume, re-measurement and contention checks hold for
  every backend alike; plus the child's environment and the versions its context reports.
"""

from __future__ import annotations

import fcntl
import importlib
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import BenanzaError

if TYPE_CHECKING:
    import jinja2

    from ..generator import GenOptions
    from ..layers import Layer, Model, UniqueLayer
    from ..manifest import Manifest
    from ..records import Variant
    from ..runner import RunOptions

log = logging.getLogger(__name__)

BINARY = "benanza_bench"


class Device(Enum):
    """Where a backend's benchmarks run: CPU ones take threads, and their results are judged for
    contention; GPU ones need a CUDA device and are timed by device events."""

    CPU = "cpu"
    GPU = "gpu"


@dataclass(frozen=True)
class Command:
    """A program that measures a batch: the runner appends the protocol's flags to ``argv``."""

    argv: tuple[str, ...]

    def __str__(self) -> str:
        return shlex.join(self.argv)


class Backend(ABC):
    name: ClassVar[str]
    dtypes: ClassVar[tuple[str, ...]]  # what its benchmarks can compute in
    layouts: ClassVar[tuple[str, ...]]  # what --layout takes
    maths: ClassVar[tuple[str, ...]] = ()  # what --math takes
    device: ClassVar[Device]
    # a framework's own backend: the vendor library whose bound its kernels are held to (the
    # across-stack split); None for a vendor library's backend
    vendor: ClassVar[str | None] = None
    # whether its benchmarks sample until --precision (the runtime's time_each_call); the others
    # keep a fixed budget (cuDNN: GPU events around sized batches; the in-process frameworks)
    samples_adaptively: ClassVar[bool] = False
    # whether `run --cold-cache`/`--cold-weights` can evict the CPU's caches before each timed call (the in-process
    # frameworks: inprocess.timed_calls)
    reads_cold: ClassVar[bool] = False
    # whether its child reads the machine's speed itself before its benchmarks (benanza.machine_speed);
    # else the runner reads it before starting the child
    reads_speed: ClassVar[bool] = False
    # the step of the framework profiler's clock that times a framework backend's benchmarks (ORT's:
    # whole microseconds): two readings one step apart are not told apart
    profiler_resolution_ms: ClassVar[float] = 0.0

    @abstractmethod
    def covers(self, layer: Layer) -> bool:
        """Whether this backend benchmarks the layer; a layer it does not is "not covered"."""

    @abstractmethod
    def variants(self, unique: UniqueLayer, fusions: tuple[str, ...], options: GenOptions) -> list[Variant]:
        """Every variant of one layer; ``fusions`` are the pattern names the models use on it."""

    @abstractmethod
    def render(self, manifest: Manifest, variants: list[Variant], env: jinja2.Environment,
               out_dir: Path, options: GenOptions, models: Sequence[Model] = ()) -> list[Path]:
        """Write the backend's project into ``out_dir``; return the files. ``models`` are the
        processed models the manifest came from (a backend that benchmarks their own subgraphs
        needs them; the others ignore them)."""

    @abstractmethod
    def prepare(self, project: Path, options: RunOptions) -> Command:
        """Whatever building the project takes; the command that measures its variants."""

    def unavailable(self) -> str | None:
        """Why this machine cannot run the backend (None: it can), checked before anything is built."""
        return None

    def bench_env(self, threads: int, options: RunOptions) -> dict[str, str]:
        """The measuring child's environment beyond the runner's own (``threads``: CPU threads)."""
        return {}

    def stack_overrides(self, context: dict[str, Any] | None) -> dict[str, str]:
        """Stack entries from the child's context line: the versions it actually loaded (None: a
        dry run, which builds and starts nothing: what is known without the program)."""
        return {}

    def ran(self, variant: Variant, op: str) -> bool:
        """A framework's own backend: whether the op named ``op`` in that framework's profile ran
        this variant of its layer (the layout and kernel choice the framework made), so Q3 can
        hold what it ran against its fastest variant."""
        return True


class SubgraphBackend(Backend):
    """A framework's backend that runs each layer as its model's own subgraph (``models/*.onnx``
    and the ``benchmarks.json`` index its ``render`` writes), measured in a Python child: the
    backend's own module run with ``-m``, the threads passed in ``threads_env``."""

    package: ClassVar[str]  # the framework's Python package, which the child imports
    threads_env: ClassVar[str]
    reads_cold = reads_speed = True

    def prepare(self, project: Path, options: RunOptions) -> Command:
        from .inprocess import INDEX_NAME

        if not (project / INDEX_NAME).is_file():
            raise BenanzaError(f"{project}: no {self.name} benchmarks here; run `benanza generate MODELS "
                               f"--backend {self.name} --out {project.parent}` first")
        return Command((sys.executable, "-m", type(self).__module__, f"--benanza_project={project.resolve()}"))

    def unavailable(self) -> str | None:
        try:
            importlib.import_module(self.package)  # only whether it imports
        except ImportError as exc:
            return f"the {self.name} backend needs the {self.package} package ({exc})"
        return None

    def bench_env(self, threads: int, options: RunOptions) -> dict[str, str]:
        from .inprocess import COLD_ENV

        # the child imports this package as the runner did, wherever it is installed
        root = str(Path(__file__).resolve().parents[2])
        path = os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH"))))
        return {self.threads_env: str(threads), "PYTHONPATH": path, COLD_ENV: options.cache}

    @abstractmethod
    def outputs(self, path: Path, entry: dict[str, str], feeds: dict[str, Any], threads: int) -> list[Any]:
        """The subgraph's outputs (numpy arrays) as the variant of index ``entry`` computes them on
        ``feeds`` (``benanza check``); ``inprocess.Refused`` when the framework has no kernel for it."""


class CMakeBackend(Backend):
    """A backend whose project is a CMake project of C++ benchmarks over ``runtime_cpp``."""

    # stack entry → the context's ``custom`` key naming the library version the binary linked
    context_versions: ClassVar[dict[str, str]] = {}

    def prepare(self, project: Path, options: RunOptions) -> Command:
        return Command((str(build(project, options.build_jobs, options.cmake_args).resolve()),))

    def stack_overrides(self, context: dict[str, Any] | None) -> dict[str, str]:
        custom = (context or {}).get("custom", {})
        return {k: custom[v] for k, v in self.context_versions.items() if custom.get(v)}


class BuildError(BenanzaError):
    """CMake could not configure or build the generated project."""


# What CMake and ninja take for syntax inside a path, whatever the quoting: ';' splits lists,
# a backslash starts an escape (CMake then builds in a sibling folder), '"' ends a string, and '$(' /
# '${' / '$<' expand (ninja: "bad $-escape"). A '$' before anything else passes through.
_CMAKE_UNSAFE = re.compile(r'[;"\\]|\$[({<]')


def build(project: Path, jobs: int | None = None, cmake_args: tuple[str, ...] = (),
          build_dir: Path | None = None, binary: str = BINARY) -> Path:
    """Configures (Release) and builds the generated CMake project (in ``project/build`` unless
    ``build_dir`` is given); returns the binary."""
    if not (project / "CMakeLists.txt").is_file():
        raise BuildError(f"{project}: no generated CMake project here; run `benanza generate` first")
    for path in (str(project.absolute()), str(project.resolve())):
        bad = _CMAKE_UNSAFE.search(path)
        if bad:
            raise BuildError(f"{project}: CMake cannot build in a folder whose path contains {bad.group()!r} "
                             f"(CMake and ninja read it as syntax); generate into another folder (--out)")
    build_dir = build_dir or project / "build"
    build_dir.mkdir(exist_ok=True)
    # Runs sharing a bench dir (several on one machine, or Slurm nodes over a shared file
    # system) build one at a time: two CMakes in one folder corrupt each other, and a binary
    # executed while another process links it fails with ETXTBSY. The lock dies with its
    # holder, so a killed build never blocks the next one.
    with (build_dir / "benanza-build.lock").open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.warning("%s: waiting for another `benanza run` to finish building it", project)
            fcntl.flock(lock, fcntl.LOCK_EX)
        return _build_locked(project, build_dir, jobs, cmake_args, binary)


def _build_locked(project: Path, build_dir: Path, jobs: int | None, cmake_args: tuple[str, ...],
                  binary: str) -> Path:
    logfile = build_dir / "benanza-build.log"
    configure = ["cmake", "-S", str(project), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release", *cmake_args]
    if shutil.which("ninja") and not (build_dir / "CMakeCache.txt").exists():
        configure += ["-G", "Ninja"]
    steps = [configure, ["cmake", "--build", str(build_dir), "-j", str(jobs or os.cpu_count() or 1)]]
    with logfile.open("w") as log_out:
        for cmd in steps:
            log.info("%s", " ".join(cmd))
            done = subprocess.run(cmd, stdout=log_out, stderr=subprocess.STDOUT)
            if done.returncode != 0:
                tail = logfile.read_text(errors="replace").strip().splitlines()[-15:]
                raise BuildError(f"{project}: `{' '.join(cmd[:2])}` failed (full log: {logfile}):\n"
                                 + "\n".join(tail))
    built = build_dir / binary
    if not built.is_file():
        raise BuildError(f"{project}: the build produced no {binary} (log: {logfile})")
    return built
