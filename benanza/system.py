"""What machine and software stack this is: CPU/GPU model, driver, CUDA, cuDNN, cuBLAS,
oneDNN and compiler versions (a records.System), and whether a CUDA device is present.

Library versions come from the libraries themselves through ctypes (no build needed); the
runner refines them from the benchmark binary's own context block once it is built.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import logging
import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .records import System
from .toolchain import cuda_toolkit

log = logging.getLogger(__name__)

_CUDA_HOME = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))


@dataclass(frozen=True)
class GpuProbe:
    count: int
    names: tuple[str, ...]
    reason: str  # why none was found (empty when count > 0)

    @property
    def present(self) -> bool:
        return self.count > 0


def _run(cmd: list[str], timeout: float = 10.0) -> str | None:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError) as exc:
        log.debug("%s failed: %s", cmd[0], exc)
        return None
    return out.stdout if out.returncode == 0 else None


def _load(candidates: list[str]) -> ctypes.CDLL | None:
    for name in candidates:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def _site_libs(pattern: str) -> list[str]:
    """Libraries shipped in wheels (nvidia-*-cu13 and friends) under any sys.path entry."""
    out = []
    for base in sys.path:
        out += sorted(glob.glob(os.path.join(base, pattern)))
    return out


def _cudart() -> ctypes.CDLL | None:
    return _load(["libcudart.so"] + sorted(glob.glob(str(_CUDA_HOME / "lib64" / "libcudart.so*")))
                 + _site_libs("nvidia/*/lib/libcudart.so*"))


def probe_gpu() -> GpuProbe:
    """CUDA devices visible here: nvidia-smi first, then cudaGetDeviceCount through ctypes."""
    smi = _run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"])
    if smi:
        names = tuple(line.strip() for line in smi.splitlines() if line.strip())
        if names:
            return GpuProbe(len(names), names, "")
    lib = _cudart()
    if lib is None:
        return GpuProbe(0, (), "no nvidia-smi output and no CUDA runtime library (libcudart) found")
    count = ctypes.c_int(0)
    err = lib.cudaGetDeviceCount(ctypes.byref(count))
    if err != 0:
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        return GpuProbe(0, (), f"cudaGetDeviceCount: {lib.cudaGetErrorString(err).decode()}")
    if count.value == 0:
        return GpuProbe(0, (), "cudaGetDeviceCount returned 0 devices")
    return GpuProbe(count.value, tuple(f"cuda:{i}" for i in range(count.value)), "")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_isa() -> str:
    """The widest vector ISA family the CPU reports (what oneDNN dispatches on)."""
    flags = cpu_flags()
    for isa in ("amx_bf16", "avx512_bf16", "avx512_vnni", "avx512f", "avx2", "avx", "sse4_1"):
        if isa in flags:
            return isa
    return platform.machine()


@dataclass(frozen=True)
class CacheLevel:
    name: str  # L1, L2, L3
    size: int  # bytes of one instance
    instances: int  # distinct instances the measuring threads' CPUs use

    @property
    def total(self) -> int:
        return self.size * self.instances


def _size(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(text.rstrip("KMG")) * scale


def cache_levels(threads: int, sysfs: Path = Path("/sys/devices/system/cpu")) -> list[CacheLevel]:
    """Data caches of the CPUs the measuring threads run on (the first ``threads`` of this
    process's affinity), from sysfs; an empty list where sysfs says nothing."""
    cpus = sorted(os.sched_getaffinity(0))[:threads] if hasattr(os, "sched_getaffinity") else list(range(threads))
    found: dict[int, tuple[int, set[str]]] = {}
    for cpu in cpus:
        for index in sorted((sysfs / f"cpu{cpu}" / "cache").glob("index*")):
            try:
                if (index / "type").read_text().strip() == "Instruction":
                    continue
                level = int((index / "level").read_text())
                size = _size((index / "size").read_text())
                shared = (index / "shared_cpu_list").read_text().strip()
            except (OSError, ValueError):
                continue
            _, groups = found.setdefault(level, (size, set()))
            groups.add(shared)
    return [CacheLevel(f"L{lvl}", size, len(groups)) for lvl, (size, groups) in sorted(found.items())]


def cpu_has_bf16() -> bool:
    return bool({"avx512_bf16", "amx_bf16", "avx_ne_convert"} & cpu_flags())


def onednn_version() -> str | None:
    """oneDNN's version from the shared library the dynamic loader finds."""
    found = ctypes.util.find_library("dnnl")
    lib = _load(([found] if found else []) + ["libdnnl.so.3", "libdnnl.so.2"]
                + _site_libs("../../libdnnl.so*"))
    if lib is None:
        return None

    class Version(ctypes.Structure):
        _fields_ = [("major", ctypes.c_int), ("minor", ctypes.c_int), ("patch", ctypes.c_int),
                    ("hash", ctypes.c_char_p), ("cpu_runtime", ctypes.c_uint), ("gpu_runtime", ctypes.c_uint)]

    lib.dnnl_version.restype = ctypes.POINTER(Version)
    v = lib.dnnl_version().contents
    return f"{v.major}.{v.minor}.{v.patch}"


def _cuda_version(number: int) -> str:
    return f"{number // 1000}.{(number % 1000) // 10}"


def _cuda_stack() -> dict[str, str]:
    out: dict[str, str] = {}
    smi = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    if smi and smi.strip():
        out["driver"] = smi.splitlines()[0].strip()
    lib = _cudart()
    if lib is not None:
        v = ctypes.c_int(0)
        if lib.cudaRuntimeGetVersion(ctypes.byref(v)) == 0:
            out["cuda_runtime"] = _cuda_version(v.value)
        if lib.cudaDriverGetVersion(ctypes.byref(v)) == 0 and v.value:
            out["cuda_driver_api"] = _cuda_version(v.value)
    cudnn = _load(["libcudnn.so", "libcudnn.so.9"] + _site_libs("nvidia/cudnn/lib/libcudnn.so*"))
    if cudnn is not None:
        cudnn.cudnnGetVersion.restype = ctypes.c_size_t
        n = cudnn.cudnnGetVersion()
        out["cudnn"] = f"{n // 10000}.{(n % 10000) // 100}.{n % 100}" if n >= 10000 else str(n)
    cublas = _load(["libcublas.so", "libcublas.so.13", "libcublas.so.12"]
                   + _site_libs("nvidia/cu13/lib/libcublas.so*") + _site_libs("nvidia/cublas/lib/libcublas.so*"))
    if cublas is not None:
        parts = []
        for prop in range(3):  # MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
            v = ctypes.c_int(0)
            if cublas.cublasGetProperty(prop, ctypes.byref(v)) != 0:
                break
            parts.append(str(v.value))
        if len(parts) == 3:
            out["cublas"] = ".".join(parts)
    toolkit = cuda_toolkit()
    nvcc = _run([str(toolkit.nvcc), "--version"]) if toolkit else None
    if nvcc:
        m = re.search(r"release ([\d.]+)", nvcc)
        if m:
            out["nvcc"] = m.group(1)
    return out


def compiler_version() -> str:
    out = _run([os.environ.get("CXX", "c++"), "--version"])
    return out.splitlines()[0].strip() if out else "unknown"


def default_threads() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def detect_system(name: str, backend: str, threads: int | None = None,
                  overrides: dict[str, str] | None = None) -> System:
    """The System record of this machine for ``backend``; ``overrides`` (e.g. versions the
    built binary reported) replace detected stack entries."""
    # Only what changes results: not the kernel or hostname, which vary across identical CI runners.
    stack: dict[str, str] = {"compiler": compiler_version(), "cpu": cpu_model(), "cpu_isa": cpu_isa()}
    if backend != "cudnn":  # a CPU backend: its library versions come from its context (overrides)
        if backend == "onednn":
            stack["onednn"] = onednn_version() or "unknown"
        stack["threads"] = str(threads or default_threads())
        device = cpu_model()
    else:
        stack.update(_cuda_stack())
        gpu = probe_gpu()
        device = gpu.names[0] if gpu.present else "no CUDA device"
    stack.update(overrides or {})
    return System(name=name, backend=backend, device=device, stack=tuple(sorted(stack.items())))
