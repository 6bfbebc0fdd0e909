"""Where the build and profiling tools Benanza drives are, and whether setup installed them.

The CUDA compiler comes from the machine (``$CUDA_HOME``, ``/usr/local/cuda``, ``nvcc`` on
PATH, the newest ``/usr/local/cuda-X.Y``) or, on a machine without CUDA, from the PyPI wheels
``scripts/setup.sh`` installs into the virtualenv (``nvidia-cuda-nvcc`` and friends unpack a
toolkit tree under ``site-packages/nvidia/cu13``). ``python -m benanza.toolchain --check`` lists every tool and
fails when one is missing, so a setup that silently left something out stops there instead of
turning into skipped tests.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

# Wheel folders that hold a CUDA toolkit tree (bin/nvcc, include, lib): CUDA 13, then 12.
_WHEEL_TOOLKITS = ("nvidia/cu13", "nvidia/cuda_nvcc")


@dataclass(frozen=True)
class CudaToolkit:
    nvcc: Path
    root: Path  # holds include/ and lib64/ (a system install) or lib/ (the wheels)
    from_wheel: bool  # PyPI's nvidia-cuda-nvcc; runtime_cpp/cmake/BenanzaCudaArchs.cmake finds it too

    @property
    def include(self) -> Path:
        return self.root / "include"

    @property
    def lib(self) -> Path:
        return self.root / "lib64" if (self.root / "lib64").is_dir() else self.root / "lib"

    @property
    def cudart(self) -> Path:
        """The CUDA runtime library (the wheels ship only the versioned soname)."""
        found = sorted(self.lib.glob("libcudart.so*"))
        return found[0] if found else self.lib / "libcudart.so"


def _site_dirs() -> list[Path]:
    return [Path(p) for p in dict.fromkeys(sys.path) if p and Path(p).is_dir()]


def cuda_toolkit() -> CudaToolkit | None:
    """The CUDA toolkit builds use: the machine's own first, else the PyPI wheels'."""
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    for home in filter(None, homes):
        nvcc = Path(home) / "bin" / "nvcc"
        if nvcc.is_file():
            return CudaToolkit(nvcc, Path(home), False)
    on_path = shutil.which("nvcc")
    if on_path:
        nvcc = Path(on_path).resolve()
        return CudaToolkit(nvcc, nvcc.parent.parent, False)
    # an image may install only the versioned folder, without the /usr/local/cuda link: the newest
    versioned = sorted(Path("/usr/local").glob("cuda-*/bin/nvcc"),
                       key=lambda p: [int(n) for n in re.findall(r"\d+", p.parent.parent.name)])
    if versioned:
        return CudaToolkit(versioned[-1], versioned[-1].parent.parent, False)
    for site in _site_dirs():
        for sub in _WHEEL_TOOLKITS:
            nvcc = site / sub / "bin" / "nvcc"
            if nvcc.is_file():
                return CudaToolkit(nvcc, nvcc.parent.parent, True)
    return None


def nvcc_version(nvcc: Path) -> str | None:
    """``X.Y`` from ``nvcc --version`` ("Cuda compilation tools, release 13.0, V13.0.88")."""
    try:
        text = subprocess.run([str(nvcc), "--version"], check=False, capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"release (\d+)\.(\d+)", text)
    return f"{found[1]}.{found[2]}" if found else None


def cudnn_frontend_include() -> Path | None:
    """The header-only cuDNN frontend (the graph API's C++ layer): ``$CUDNN_FRONTEND_ROOT/include``
    (headers carried without their wheel, scripts/gpukit.py), else the nvidia-cudnn-frontend
    wheel, which unpacks ``cudnn_frontend.h`` into ``site-packages/include``; the generated
    projects look in the same order (runtime_cpp/cmake/BenanzaCudaLibs.cmake)."""
    root = os.environ.get("CUDNN_FRONTEND_ROOT")
    if root and (Path(root) / "include" / "cudnn_frontend.h").is_file():
        return Path(root) / "include"
    for site in _site_dirs():
        if (site / "include" / "cudnn_frontend.h").is_file():
            return site / "include"
    return None


def benchmark_cmake_config() -> Path | None:
    """Google Benchmark's CMake package config where ``find_package(benchmark)`` looks for it:
    under a ``$CMAKE_PREFIX_PATH`` prefix (one built from source, scripts/gpukit.py) first, then
    Debian's libbenchmark-dev."""
    prefixes = [Path(p) for p in os.environ.get("CMAKE_PREFIX_PATH", "").split(os.pathsep) if p]
    for prefix in prefixes:
        for pattern in ("lib/cmake/benchmark", "lib64/cmake/benchmark", "lib/*/cmake/benchmark"):
            found = sorted(prefix.glob(f"{pattern}/benchmarkConfig.cmake"))
            if found:
                return found[0]
    found = sorted(Path("/usr/lib").glob("*/cmake/benchmark/benchmarkConfig.cmake"))
    return found[0] if found else None


def onednn_cmake_config() -> Path | None:
    """Debian's libdnnl-dev CMake package config (the oneDNN 2.x the CPU backend builds with)."""
    found = sorted(Path("/usr/lib").glob("*/cmake/dnnl/dnnl-config.cmake"))
    return found[0] if found else None


def nsys_importer() -> Path | None:
    """QdstrmImporter beside ``nsys``: without a GPU it turns nsys' raw stream into a report."""
    nsys = shutil.which("nsys")
    if nsys is None:
        return None
    root = Path(os.path.realpath(nsys)).parents[3]  # host-linux-x64 is a sibling of the target dir
    found = sorted(root.rglob("QdstrmImporter"))
    return found[0] if found else None


def _module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def inventory() -> dict[str, str | None]:
    """Every tool the demo and the test suite use → where it is (None: missing)."""
    cuda = cuda_toolkit()
    opencl = sorted(Path("/usr/lib").glob("*/libOpenCL.so"))
    # torch.compile's inductor builds C++ wrappers against this interpreter's headers
    python_h = Path(sysconfig.get_paths()["include"]) / "Python.h"
    return {
        "cmake": shutil.which("cmake"),
        "ninja": shutil.which("ninja"),
        "c++": shutil.which("c++") or shutil.which("g++"),
        "Python.h (torch.compile)": str(python_h) if python_h.exists() else None,
        "google-benchmark": str(benchmark_cmake_config() or "") or None,
        "onednn": str(onednn_cmake_config() or "") or None,
        "opencl (oneDNN's config needs it)": str(opencl[0]) if opencl else None,
        "nvcc": (f"{cuda.nvcc} ({nvcc_version(cuda.nvcc) or 'version unknown'}"
                 f"{', PyPI wheel' if cuda.from_wheel else ''})") if cuda else None,
        "cudnn wheel": "nvidia.cudnn" if _module("nvidia.cudnn") else None,
        "cublas wheel": "nvidia.cu13" if _module("nvidia.cu13") else None,
        "cudnn frontend headers": str(cudnn_frontend_include() or "") or None,
        "chromium": shutil.which("chromium"),
        "nsys": shutil.which("nsys"),
        "QdstrmImporter": str(nsys_importer() or "") or None,
        "torch": "torch" if _module("torch") else None,
        "onnxscript (torch's dynamo exporter)": "onnxscript" if _module("onnxscript") else None,
        "nvtx": "nvtx" if _module("nvtx") else None,
        "datasette": "datasette" if _module("datasette") else None,
        "submitit": "submitit" if _module("submitit") else None,
        **{tool: shutil.which(tool) for tool in ("slurmctld", "slurmd", "sbatch", "munged")},
    }


# What building and running the generated cuDNN/cuBLAS benchmarks needs (the GPU kit checks these).
CUDNN_BENCH_TOOLS = ("cmake", "ninja", "c++", "google-benchmark", "nvcc", "cudnn wheel", "cublas wheel",
                     "cudnn frontend headers", "torch")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benanza.toolchain", description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 when a tool is missing")
    parser.add_argument("--cudnn", action="store_true",
                        help="only what the cuDNN/cuBLAS benchmarks need (a GPU machine's check)")
    args = parser.parse_args(argv)
    tools = inventory()
    if args.cudnn:
        tools = {name: tools[name] for name in CUDNN_BENCH_TOOLS}
    for name, where in tools.items():
        print(f"{name:34} {where or 'MISSING'}")
    missing = [n for n, w in tools.items() if w is None]
    if missing and args.check:
        print(f"toolchain: missing {', '.join(missing)}: run scripts/setup.sh", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
