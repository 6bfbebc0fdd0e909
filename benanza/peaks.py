"""``benanza peaks``: what this machine's stack attains — GEMM throughput per data type through
the backend's own library, the CPU cores' own f32 FMA throughput, and streaming bandwidth from
the L1 cache out to main memory.

The measurement is a small C++ program (``runtime_cpp/peaks/<backend>``) built with CMake
against the same library as the benchmarks and run with the same threads, so a result of the
stack can be compared with its roofs (``analysis/roofline.py``). The build is cached per source
and library, so `benanza run` can measure a new stack's peaks in a few seconds.

Bandwidth is measured on a ladder of working sets, a quarter of the L1 cache (all threads'
L1s together) growing ×4 up to several times the last-level cache: a layer's memory roof is
the bandwidth of the largest working set not above its own bytes, so a layer that fits in a
cache is held to that cache's bandwidth, not to DRAM's (which it would seem to beat).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shlex
import subprocess
import sys
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from .errors import BenanzaError
from .measurement import contention, cpu_clock
from .system import CacheLevel, cache_levels

log = logging.getLogger(__name__)

BINARY = "benanza_peaks"
# what each backend's program can ask its library for (cuDNN's: cuBLAS, "tf32" being fp32 data
# on Tensor Cores)
GEMM_TYPES = {"onednn": ("f32", "bf16", "s8"), "cudnn": ("f32", "tf32", "f16", "bf16", "s8")}
# dtypes whose compute ceiling the program measures with a register-only FMA loop of the cores
# (bf16 and int8 have none yet: their roof stays the library's GEMM, docs/speed-of-light.md)
FMA_TYPES = {"onednn": ("f32",)}
SECONDS = 0.15  # measuring time per peak: the whole run stays within a few seconds
_DRAM_FACTOR = 4  # the largest working set, in last-level caches
_MIN_DRAM = 64 << 20
_TIMEOUT = 300.0


class PeaksError(BenanzaError):
    """The peaks program could not be built or run, or printed something else than peaks."""


@dataclass(frozen=True)
class Peak:
    """One attained peak: FLOP/s of a GEMM in ``dtype`` or of the cores' FMA loop (``fma``), or
    bytes/s over a working set of ``size`` bytes in cache ``level`` (L1, L2, L3 or DRAM beyond)."""

    kind: str  # "gemm" | "fma" | "bandwidth"
    value: float  # flop/s or byte/s
    size: int  # the GEMM's M = N = K, the FMA loop's vector width in bits, or the working set in bytes
    dtype: str = ""  # gemm, fma: f32, bf16, s8
    level: str = ""  # bandwidth: the cache level the working set fits in
    implementation: str = ""  # the library's kernel (gemm), the FMA loop's ISA and accumulators (fma)

    @property
    def name(self) -> str:
        return f"bandwidth_{self.size}" if self.kind == "bandwidth" else f"{self.kind}_{self.dtype}"

    @property
    def label(self) -> str:
        """How a report names a compute peak: "f32 FMA" (the cores' ceiling) or "f32 GEMM"."""
        return f"{self.dtype} {'FMA' if self.kind == 'fma' else 'GEMM'}"


# A quantized layer is analysed in its activations' type; the peaks program measures the int8
# GEMM (u8 x s8 -> s32 in oneDNN, s8 x s8 in cuBLAS) under the weights' type, s8. u8 and s8
# activations run the same int8 units, so one peak is the roof of both.
_INT8_ACTIVATIONS = {"u8": "s8", "i8": "s8"}

# Peaks measured with more of their time lost to other work than this are not used as roofs.
MAX_CONTENDED = 0.1


@dataclass(frozen=True)
class Peaks:
    """The peaks of one system+stack, as measured (or a datasheet's, ``source``)."""

    peaks: tuple[Peak, ...]
    unsupported: tuple[tuple[str, str], ...] = ()  # (dtype, the library's message)
    threads: int | None = None
    measured_at: str = ""
    command: str = ""
    source: str = "measured"
    levels: tuple[tuple[str, int], ...] = ()  # (cache level, capacity in bytes across the threads)
    # Share of the program's runnable time its threads waited for a CPU or had stolen while
    # measuring (measurement.contention): peaks measured on a busy machine are low, so the roofs are.
    contended: float = 0.0

    @property
    def trusted(self) -> bool:
        """Whether the roofs may judge results: peaks measured while other work took more than
        ``MAX_CONTENDED`` of the program's time are too low, and would flag real kernels."""
        return self.contended <= MAX_CONTENDED

    def gemm(self, dtype: str) -> Peak | None:
        return next((p for p in self.peaks if p.kind == "gemm" and p.dtype == dtype), None)

    def fma(self, dtype: str) -> Peak | None:
        return next((p for p in self.peaks if p.kind == "fma" and p.dtype == dtype), None)

    def compute_peak(self, dtype: str, math: str = "default") -> Peak | None:
        """The compute roof of a kernel of ``dtype`` under ``math``: the fastest of the peaks it
        can reach. On a CPU that is the cores' FMA loop where measured (f32): a ceiling, where the
        library's GEMM at one size is not (oneDNN's direct convolutions outran it by up to 23% on
        an idle AVX2 core); the GEMM stays the roof where the loop measured slower (a CPU the
        loop has no vector FMA for). fp32 data whose math allows TF32 (cuDNN/cuBLAS
        ``tf32_allowed``) may run on Tensor Cores, so its roof is the faster of the f32 and tf32
        peaks; a kernel held to the f32 one would look impossible. A quantized layer's dtype is
        its activations' (u8 or i8): the int8 GEMM peak is its roof."""
        dtype = _INT8_ACTIVATIONS.get(dtype, dtype)
        found = [p for d in ((dtype, "tf32") if dtype == "f32" and math == "tf32_allowed" else (dtype,))
                 for p in (self.gemm(d), self.fma(d)) if p is not None]
        return max(found, key=lambda p: p.value) if found else None

    @property
    def ladder(self) -> list[Peak]:
        return sorted((p for p in self.peaks if p.kind == "bandwidth"), key=lambda p: p.size)

    def bandwidth_for(self, nbytes: int) -> Peak | None:
        """The memory roof of a kernel that moves ``nbytes``: the best bandwidth measured on a
        working set no smaller than the largest one not above ``nbytes`` (bandwidth only falls
        as the set grows, so a lower value there is noise of a busy machine)."""
        ladder = self.ladder
        if not ladder:
            return None
        below = [i for i, p in enumerate(ladder) if p.size <= nbytes]
        start = below[-1] if below else 0
        return max(ladder[start:], key=lambda p: p.value)

    @property
    def dram(self) -> Peak | None:
        ladder = self.ladder
        return ladder[-1] if ladder else None

    @property
    def llc(self) -> Peak | None:
        """The bandwidth inside the last-level cache: at its largest working set below DRAM that
        fills at most half of its cache. A set as large as the cache does not stay in it (other
        data and processes share it): seen on a 32 MiB L3, 14 GB/s at 32 MiB against 79 at 8 MiB,
        nearer main memory's 6 than the cache's."""
        capacity = dict(self.levels)
        inside = [p for p in self.ladder if p.level not in ("DRAM", "")
                  and 2 * p.size <= capacity.get(p.level, 2 * p.size)]
        return self.bandwidth_for(inside[-1].size) if inside else None

    def to_json(self) -> dict:
        return {"source": self.source, "threads": self.threads, "measured_at": self.measured_at,
                "command": self.command, "contended": self.contended,
                "gemm": {p.dtype: {"flops_per_s": p.value, "size": p.size, "implementation": p.implementation}
                         for p in self.peaks if p.kind == "gemm"},
                "fma": {p.dtype: {"flops_per_s": p.value, "vector_bits": p.size, "implementation": p.implementation}
                        for p in self.peaks if p.kind == "fma"},
                "unsupported": dict(self.unsupported),
                "bandwidth": [{"bytes": p.size, "level": p.level, "bytes_per_s": p.value} for p in self.ladder],
                "dram_bytes_per_s": self.dram.value if self.dram else None,
                "llc_bytes_per_s": self.llc.value if self.llc else None,
                "caches": {name: size for name, size in self.levels}}


# --- datasheets --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Datasheet:
    """A GPU's published peaks (dense, no structured sparsity; boost clocks): a reference beside
    what was measured, never a roof (a datasheet figure is not what a given board attains)."""

    name: str
    match: tuple[str, ...]  # lower-case words that all appear in the device name CUDA reports
    tflops: tuple[tuple[str, float], ...]  # (GEMM type as in GEMM_TYPES, TFLOP/s or TOP/s)
    memory_gb_s: float
    l2_mb: float
    source: str

    def gemm(self, dtype: str) -> float | None:
        return dict(self.tflops).get(dtype)


# NVIDIA's product datasheets; more specific names first (an "H100 PCIe" also says "H100").
DATASHEETS = (
    Datasheet("H100 PCIe", ("h100", "pcie"), (("f32", 51.2), ("tf32", 378.0), ("f16", 756.0), ("bf16", 756.0),
                                              ("s8", 1513.0)), 2000.0, 50, "NVIDIA H100 Tensor Core GPU datasheet"),
    Datasheet("H100 NVL", ("h100", "nvl"), (("f32", 60.0), ("tf32", 417.5), ("f16", 835.5), ("bf16", 835.5),
                                            ("s8", 1670.5)), 3900.0, 50, "NVIDIA H100 Tensor Core GPU datasheet"),
    Datasheet("H100 SXM", ("h100",), (("f32", 66.9), ("tf32", 494.7), ("f16", 989.4), ("bf16", 989.4),
                                      ("s8", 1978.9)), 3350.0, 50, "NVIDIA H100 Tensor Core GPU datasheet"),
    Datasheet("H200 SXM", ("h200",), (("f32", 66.9), ("tf32", 494.7), ("f16", 989.4), ("bf16", 989.4),
                                      ("s8", 1978.9)), 4800.0, 50, "NVIDIA H200 Tensor Core GPU datasheet"),
    Datasheet("A100 PCIe 80GB", ("a100", "pcie", "80gb"), (("f32", 19.5), ("tf32", 156.0), ("f16", 312.0),
                                                           ("bf16", 312.0), ("s8", 624.0)), 1935.0, 40,
              "NVIDIA A100 Tensor Core GPU datasheet"),
    Datasheet("A100 SXM 80GB", ("a100", "80gb"), (("f32", 19.5), ("tf32", 156.0), ("f16", 312.0), ("bf16", 312.0),
                                                  ("s8", 624.0)), 2039.0, 40, "NVIDIA A100 Tensor Core GPU datasheet"),
    Datasheet("A100 40GB", ("a100",), (("f32", 19.5), ("tf32", 156.0), ("f16", 312.0), ("bf16", 312.0),
                                       ("s8", 624.0)), 1555.0, 40, "NVIDIA A100 Tensor Core GPU datasheet"),
    Datasheet("L40S", ("l40s",), (("f32", 91.6), ("tf32", 183.0), ("f16", 362.05), ("bf16", 362.05),
                                  ("s8", 733.0)), 864.0, 96, "NVIDIA L40S datasheet"),
    Datasheet("V100 SXM2", ("v100",), (("f32", 15.7), ("f16", 125.0)), 900.0, 6, "NVIDIA Tesla V100 datasheet"),
    Datasheet("T4", ("tesla t4",), (("f32", 8.1), ("f16", 65.0), ("s8", 130.0)), 320.0, 4,
              "NVIDIA T4 datasheet"),
)


def datasheet_for(device: str) -> Datasheet | None:
    """The datasheet of the GPU CUDA names ``device`` (e.g. "NVIDIA H100 80GB HBM3"), if known."""
    words = device.lower()
    return next((d for d in DATASHEETS if all(w in words for w in d.match)), None)


# --- what the CPU has ---------------------------------------------------------------------------

def _mem_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def working_sets(levels: list[CacheLevel], mem_available: int | None) -> list[tuple[str, int]]:
    """The bandwidth ladder: (level it fits in, bytes), from a quarter of the L1s ×4 up to
    ``_DRAM_FACTOR`` last-level caches (at least 64 MiB, at most a quarter of free memory)."""
    llc = levels[-1].total if levels else 0
    top = max(_DRAM_FACTOR * llc, _MIN_DRAM)
    if mem_available:
        top = max(min(top, mem_available // 4), 1 << 20)
    size = max(levels[0].total // 4 if levels else 8192, 8192)
    out = []
    while size < top // 2:
        out.append(size)
        size *= 4
    out.append(top)

    def level(n: int) -> str:
        return next((c.name for c in levels if n <= c.total), "DRAM")

    return [(level(n), n) for n in out]


# --- building and running the program -----------------------------------------------------------

def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "benanza" / "peaks"


def _build(backend: str, cmake_args: tuple[str, ...]) -> Path:
    """The built program, from a build folder keyed by its sources and CMake arguments;
    concurrent callers wait for one build (a file lock) instead of racing it."""
    from .backends.base import build
    from .resources import runtime_dir

    src = runtime_dir() / "peaks" / backend
    if not (src / "CMakeLists.txt").is_file():
        raise PeaksError(f"{src}: no peaks program for the {backend} backend")
    digest = hashlib.sha256()
    shared = [runtime_dir() / "common/benanza/json.hpp", *sorted((runtime_dir() / "cmake").glob("*.cmake"))]
    for path in sorted(p for p in src.rglob("*") if p.is_file()) + shared:
        digest.update(path.read_bytes())
    digest.update(json.dumps(cmake_args).encode())
    folder = _cache_root() / f"{backend}-{digest.hexdigest()[:12]}"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        binary = folder / "build" / BINARY
        if binary.is_file():
            return binary
        return build(src, cmake_args=cmake_args, build_dir=folder / "build", binary=BINARY)


def _run(binary: Path, args: list[str], env: dict[str, str]) -> tuple[str, float]:
    """The program's output, and the share of its threads' runnable time they waited for a CPU
    (or had stolen) while it measured: other work there lowers every peak."""
    try:
        proc = subprocess.Popen([str(binary), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env)
    except OSError as exc:
        raise PeaksError(f"{binary}: cannot run ({exc})") from None
    first = last = cpu_clock(proc.pid)
    stop = threading.Event()

    def sample() -> None:  # the clock of a process that exited cannot be read: keep the latest
        nonlocal last
        while not stop.wait(0.05):
            last = cpu_clock(proc.pid) or last

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        out, err = proc.communicate(timeout=_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise PeaksError(f"{binary}: did not finish in {_TIMEOUT:g}s") from None
    finally:
        stop.set()
        sampler.join()
    if proc.returncode != 0:
        raise PeaksError(f"{binary}: exited with status {proc.returncode}: {err.strip()[-400:]}")
    lost = contention(first, last)
    return out, lost.share if lost is not None else 0.0


def parse_output(text: str, source: str) -> tuple[dict, list[Peak], list[tuple[str, str]]]:
    """The context, the peaks and the unsupported GEMM types of the program's output."""
    context: dict = {}
    peaks: list[Peak] = []
    unsupported: list[tuple[str, str]] = []
    for line in text.splitlines():
        tag, _, payload = line.partition(" ")
        if tag not in ("BENANZA_CONTEXT", "BENANZA_PEAK"):
            continue
        try:
            data = json.loads(payload)
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            if tag == "BENANZA_CONTEXT":
                context = data
            elif data["status"] == "ok":
                value = float(data["value"])
                if not value > 0:
                    raise ValueError(f"value {value!r}")
                peaks.append(Peak(data["kind"], value, int(data["size"]), data.get("dtype", ""),
                                  data.get("level", ""), data.get("implementation", "")))
            elif data["status"] == "unsupported":
                unsupported.append((data["dtype"], data.get("message", "")))
            else:
                raise ValueError(f"{data.get('name')} failed: {data.get('message', '')}")
        except (ValueError, KeyError, TypeError) as exc:
            raise PeaksError(f"{source}: malformed peaks line ({exc}): {line[:300]}") from None
    if not any(p.kind == "bandwidth" for p in peaks) or not any(p.kind == "gemm" for p in peaks):
        raise PeaksError(f"{source}: printed no GEMM or no bandwidth peak:\n{text[-500:]}")
    return context, peaks, unsupported


def measure(backend: str = "onednn", threads: int | None = None, cmake_args: tuple[str, ...] = (),
            command: str = "") -> tuple[dict, Peaks]:
    """Builds (once) and runs the peaks program; its context line (the library it linked) and
    the peaks."""
    from .runner import check_device
    from .system import default_threads

    check_device(backend)
    if backend not in GEMM_TYPES:
        raise PeaksError(f"peaks of the {backend} backend are not measured by this version (only "
                         f"{', '.join(GEMM_TYPES)}); see docs/speed-of-light.md")
    if backend == "cudnn":
        return _measure_gpu(cmake_args, command)
    threads = threads or default_threads()
    levels = cache_levels(threads)
    sets = working_sets(levels, _mem_available())
    label = {n: lvl for lvl, n in sets}
    binary = _build(backend, cmake_args)
    args = [f"--gemm={','.join(GEMM_TYPES[backend])}", f"--fma={','.join(FMA_TYPES[backend])}",
            f"--seconds={SECONDS:g}", *(f"--level={lvl}:{n}" for lvl, n in sets)]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    log.info("measuring peaks: %s", shlex.join([str(binary), *args]))
    output, contended = _run(binary, args, env)
    context, peaks, unsupported = parse_output(output, str(binary))
    # the program's working set is the requested one rounded to whole doubles: label by nearest
    peaks = [p if p.kind != "bandwidth"
             else Peak(p.kind, p.value, p.size, level=label[min(label, key=lambda n: abs(n - p.size))])
             for p in peaks]
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return context, Peaks(tuple(peaks), tuple(unsupported), threads, stamp, command,
                         levels=tuple((c.name, c.total) for c in levels), contended=contended)


def _measure_gpu(cmake_args: tuple[str, ...], command: str) -> tuple[dict, Peaks]:
    """The GPU's peaks: the program sizes its bandwidth ladder from the device's own L2 size and
    labels each working set itself (L2, or DRAM for device memory beyond it). Times are the
    device's (CUDA events), so the host's load does not enter them: ``contended`` stays 0."""
    if not any(a.startswith("-DBENANZA_PYTHON=") for a in cmake_args):
        cmake_args = (*cmake_args, f"-DBENANZA_PYTHON={sys.executable}")
    binary = _build("cudnn", cmake_args)
    args = [f"--gemm={','.join(GEMM_TYPES['cudnn'])}", f"--seconds={SECONDS:g}", "--ladder"]
    log.info("measuring peaks: %s", shlex.join([str(binary), *args]))
    output, _ = _run(binary, args, dict(os.environ))
    context, peaks, unsupported = parse_output(output, str(binary))
    l2 = context.get("custom", {}).get("l2_bytes", "")
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return context, Peaks(tuple(peaks), tuple(unsupported), None, stamp, command,
                          levels=(("L2", int(l2)),) if l2.isdigit() else ())
