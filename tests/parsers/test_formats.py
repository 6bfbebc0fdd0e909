"""Every profile parser against realistic fixtures of its format, plus truncated and malformed files."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from helpers import FIXTURES

from benanza.parsers import (
    ConvSignature,
    GemmSignature,
    ProfileFormatError,
    load_file,
    parse_cublas_log,
    parse_cudnn_log,
    parse_kineto_trace,
    parse_nsys,
    parse_nsys_sqlite,
    parse_onednn_verbose,
    parse_ort_profile,
)

CONV1 = ConvSignature(mb=1, ic=3, ih=8, iw=8, oc=8, kh=3, kw=3, sh=1, sw=1, ph=1, pw=1, dh=1, dw=1, g=1)
CONV2 = ConvSignature(mb=1, ic=8, ih=8, iw=8, oc=8, kh=3, kw=3, sh=1, sw=1, ph=1, pw=1, dh=1, dw=1, g=1)


# --- ONNX Runtime --------------------------------------------------------------------------------

def test_ort_profile_runs_ops_and_shapes():
    t = parse_ort_profile(FIXTURES / "ort_convnet.json")
    assert t.framework == "onnxruntime"
    assert len(t.runs) == 5
    # every run executes the same 7 kernels (ORT fused conv+relu and conv+bn+relu, added a reorder)
    per_run = [len(t.ops_of_run(r)) for r in range(5)]
    assert per_run == [7] * 5
    first = t.ops_of_run(0)
    assert [o.op for o in first] == ["Conv", "Conv", "MaxPool", "ReorderOutput", "Flatten", "Gemm", "Softmax"]
    assert first[0].name == "r1_nchwc"
    assert first[0].input_shapes[:2] == ((1, 3, 8, 8), (8, 3, 3, 3))
    assert first[0].provider == "CPUExecutionProvider"
    assert all(o.span.dur_us >= 0 for o in t.ops)


def test_ort_profile_truncated_names_file(tmp_path):
    with pytest.raises(ProfileFormatError, match="ort_convnet_truncated.json.*truncated"):
        parse_ort_profile(FIXTURES / "ort_convnet_truncated.json")


@pytest.mark.parametrize("text, problem", [
    ("", "empty file"),
    ('{"foo": 1}', "expected a JSON array"),
    ('[{"cat": "Node"}]', "event 0 is not a trace event"),
    ('[{"cat": "Other", "name": "x", "ts": 1}]', "no model_run or node events"),
])
def test_ort_profile_malformed(tmp_path, text, problem):
    p = tmp_path / "bad.json"
    p.write_text(text)
    with pytest.raises(ProfileFormatError) as e:
        parse_ort_profile(p)
    assert str(p) in str(e.value) and problem in str(e.value)


# --- PyTorch / Kineto ------------------------------------------------------------------------------

def test_kineto_cpu_trace_from_torch_profiler():
    t = parse_kineto_trace(FIXTURES / "kineto_cpu.json")
    assert len(t.runs) == 2
    names = [o.name for o in t.ops_of_run(0)]
    # outermost ops only: aten::conv2d, not the aten::convolution it calls
    assert names.count("aten::conv2d") == 2 and "aten::convolution" not in names
    conv = next(o for o in t.ops_of_run(0) if o.name == "aten::conv2d")
    assert conv.input_shapes[:2] == ((1, 3, 8, 8), (8, 3, 3, 3))
    assert t.kernels == []


def test_kineto_cuda_trace_kernels_and_runtime():
    t = parse_kineto_trace(FIXTURES / "kineto_cuda.json")
    assert len(t.runs) == 2 and len(t.kernels) == 8
    launches = {a.correlation for a in t.api_calls if a.name == "cudaLaunchKernel"}
    assert {k.correlation for k in t.kernels} <= launches
    assert [o.name for o in t.ops_of_run(1)] == ["aten::conv2d", "aten::relu", "aten::conv2d", "aten::linear"]


def test_kineto_truncated_and_malformed(tmp_path):
    with pytest.raises(ProfileFormatError, match="kineto_cuda_truncated.json"):
        parse_kineto_trace(FIXTURES / "kineto_cuda_truncated.json")
    p = tmp_path / "t.json"
    p.write_text('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm"}]}')
    with pytest.raises(ProfileFormatError, match="no numeric ts"):
        parse_kineto_trace(p)
    p.write_text('{"schemaVersion": 1}')
    with pytest.raises(ProfileFormatError, match="no traceEvents"):
        parse_kineto_trace(p)


# --- cuDNN -----------------------------------------------------------------------------------------

def test_cudnn_legacy_log():
    calls = parse_cudnn_log(FIXTURES / "cudnn_v7.log")
    assert [c.api for c in calls] == ["cudnnConvolutionForward", "cudnnAddTensor", "cudnnActivationForward",
                                      "cudnnConvolutionForward"] * 2
    conv = calls[0]
    assert conv.conv == CONV1
    assert conv.algo == "IMPLICIT_PRECOMP_GEMM" and conv.math == "CUDNN_DEFAULT_MATH"
    assert conv.dtype == "f32" and conv.thread == "4242"
    assert calls[3].conv == CONV2 and calls[3].algo == "WINOGRAD"
    assert calls[1].conv is None and calls[1].shapes == ((1, 8, 1, 1),)


def test_cudnn_v9_log_with_backend_execute():
    calls = parse_cudnn_log(FIXTURES / "cudnn_v9.log")
    assert [c.api for c in calls] == ["cudnnConvolutionForward", "cudnnBackendExecute"]
    assert calls[0].conv == CONV1 and calls[0].math == "CUDNN_TENSOR_OP_MATH"
    execute = calls[1]
    assert execute.conv == CONV2
    assert execute.algo == "eng3"
    assert execute.dtype == "f16"


def test_cudnn_9_19_log_of_pytorch_on_an_h200():
    """Written by cuDNN 9.19 under PyTorch 2.11 on an H200 (benchmarks/cuda_log_probe.py), blocks
    kept whole: ``F.relu(F.conv2d(x, w, b, stride=2, padding=3))`` on x 1x3x224x224, w 64x3x7x7,
    run twice. The graph API logs each execute twice (arguments, then the status alone), nests the
    convolution's geometry under ``convDesc`` (lowerPadA, strideA, where the tensors have strideA
    too), says TF32 only in the ExecuteInternal block that follows, and its warnings hold a blank
    line or a bare second line inside a block."""
    calls = parse_cudnn_log(FIXTURES / "cudnn_v9_19_h200.log")
    conv = ConvSignature(mb=1, ic=3, ih=224, iw=224, oc=64, kh=7, kw=7, sh=2, sw=2, ph=3, pw=3, dh=1, dw=1, g=1)
    assert [(c.api, c.conv, c.algo, c.math, c.dtype) for c in calls] == \
        [("cudnnBackendExecute", conv, "eng28", "tf32_allowed", "f32")] * 2


def test_cudnn_truncated_block_is_an_error_naming_the_file():
    with pytest.raises(ProfileFormatError) as e:
        parse_cudnn_log(FIXTURES / "cudnn_v7_truncated.log")
    assert "cudnn_v7_truncated.log" in str(e.value) and "truncated" in str(e.value)


def test_cudnn_not_a_log(tmp_path):
    p = tmp_path / "x.log"
    p.write_text("hello\nworld\n")
    with pytest.raises(ProfileFormatError, match="not a cuDNN API log"):
        parse_cudnn_log(p)


# --- cuBLAS / cuBLASLt -----------------------------------------------------------------------------

def test_cublas_and_cublaslt():
    calls = parse_cublas_log(FIXTURES / "cublas.log")
    assert [(c.library, c.api) for c in calls] == [
        ("cublas", "cublasSgemm_v2"), ("cublas", "cublasGemmEx"), ("cublaslt", "cublasLtMatmul")]
    assert calls[0].gemm == GemmSignature(10, 1, 128) and calls[0].dtype == "f32"
    assert calls[1].gemm == GemmSignature(1000, 32, 2048)
    assert calls[1].algo == "CUBLAS_GEMM_DEFAULT_TENSOR_OP" and calls[1].dtype == "f16"
    assert calls[2].gemm == GemmSignature(1000, 64, 2048) and calls[2].dtype == "f16"
    assert "algoId=21" in calls[2].algo


def test_cublas_13_blocks_with_c_signatures_and_no_blank_line_between():
    """cuBLAS 13.1 under PyTorch on an H200: ``torch.bmm`` of 4x128x64 by 4x64x128, run twice; the
    header carries the C signature and the next block starts on the line after the last."""
    calls = parse_cublas_log(FIXTURES / "cublas_v13_bmm_h200.log")
    assert [(c.api, c.gemm, c.dtype) for c in calls] == \
        [("cublasSgemmStridedBatched", GemmSignature(128, 128, 64, batch=4), "f32")] * 2


def test_cublaslt_13_descriptors_on_the_trace_line():
    """cuBLASLt 13.1: ``F.linear`` of 1x2048 by 1000x2048 with bias, run twice; the [Api] line holds
    the descriptors' addresses, the [Trace] line after it their contents: one call each."""
    calls = parse_cublas_log(FIXTURES / "cublaslt_v13_linear_h200.log")
    assert [(c.api, c.gemm, c.dtype, c.math) for c in calls] == \
        [("cublasLtMatmul", GemmSignature(1000, 1, 2048), "f32", "COMPUTE_32F")] * 2
    assert all("algoId=" in c.algo for c in calls)


def test_cublaslt_13_api_line_whose_trace_never_comes(tmp_path):
    lines = (FIXTURES / "cublaslt_v13_linear_h200.log").read_text().splitlines()
    last_trace = max(i for i, line in enumerate(lines) if "[Trace][cublasLtMatmul]" in line)
    p = tmp_path / "lt.log"
    p.write_text("\n".join(lines[:last_trace]) + "\n")
    with pytest.raises(ProfileFormatError, match=r"lt.log: line \d+: cublasLtMatmul whose descriptors never follow"):
        parse_cublas_log(p)


def test_cublaslt_truncated_line(tmp_path):
    p = tmp_path / "lt.log"
    p.write_text("[2023-02-07 09:15:42][cublasLt][1][Api][cublasLtMatmul] A=0X1 Adesc=[type=R_16F rows=20\n")
    with pytest.raises(ProfileFormatError, match=r"lt.log: line 1: cublasLtMatmul"):
        parse_cublas_log(p)


# --- oneDNN ----------------------------------------------------------------------------------------

def test_onednn_v2_verbose():
    calls = parse_onednn_verbose(FIXTURES / "onednn_v2.log")
    assert [c.api for c in calls] == ["reorder", "convolution", "convolution", "pooling", "inner_product", "softmax"]
    assert calls[1].conv == CONV1 and calls[1].algo == "jit:avx512_core"
    assert calls[2].conv == CONV2
    assert calls[1].time_ms == pytest.approx(0.0330811)
    assert calls[4].gemm == GemmSignature(1, 10, 128)
    assert dict(calls[1].detail)["attrs"].startswith("attr-post-ops:eltwise_relu")


def test_onednn_v3_verbose_skips_create_lines():
    calls = parse_onednn_verbose(FIXTURES / "onednn_v3.log")
    assert [c.api for c in calls] == ["convolution", "convolution", "convolution", "matmul"]
    assert calls[0].algo == "brg:avx512_core" and calls[0].conv == CONV1
    grouped = calls[2].conv
    assert grouped.g == 32 and grouped.ic == 32 and calls[2].dtype == "bf16"
    assert calls[3].gemm == GemmSignature(1, 10, 128)


def test_onednn_truncated_line_names_file_and_line():
    with pytest.raises(ProfileFormatError) as e:
        parse_onednn_verbose(FIXTURES / "onednn_v3_truncated.log")
    assert "onednn_v3_truncated.log: line" in str(e.value)


def test_onednn_not_verbose(tmp_path):
    p = tmp_path / "x.log"
    p.write_text("some,comma,separated\n")
    with pytest.raises(ProfileFormatError, match="not a oneDNN verbose log"):
        parse_onednn_verbose(p)


# --- Nsight Systems ---------------------------------------------------------------------------------

def make_nsys_sqlite(path: Path) -> Path:
    """An export with the tables and columns `nsys export --type sqlite` (2022.4) writes."""
    con = sqlite3.connect(path)
    con.executescript("""
    CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT NOT NULL, end INT NOT NULL, deviceId INT, contextId INT,
        streamId INT, correlationId INT, globalPid INT, demangledName INT, shortName INT, mangledName INT,
        launchType INT, cacheConfig INT, registersPerThread INT, gridX INT, gridY INT, gridZ INT,
        blockX INT, blockY INT, blockZ INT);
    CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INT NOT NULL, end INT NOT NULL, eventClass INT,
        globalTid INT, correlationId INT, nameId INT, returnValue INT, callchainId INT);
    CREATE TABLE CUDNN_EVENTS (start INT NOT NULL, end INT, eventClass INT, globalTid INT, nameId INT);
    CREATE TABLE NVTX_EVENTS (start INT NOT NULL, end INT, eventType INT NOT NULL, rangeId INT, category INT,
        color INT, text TEXT, globalTid INT, endGlobalTid INT, textId INT, domainId INT);
    CREATE TABLE OSRT_API (start INT NOT NULL, end INT, eventClass INT, globalTid INT, nameId INT,
        returnValue INT, nestingLevel INT, callchainId INT);
    CREATE TABLE OSRT_CALLCHAINS (id INT NOT NULL, symbol INT, module INT, kernelMode INT, thumbCode INT,
        unresolved INT, specialEntry INT, originalIP INT, unwindMethod INT, stackDepth INT NOT NULL);
    """)
    strings = ["cudnnConvolutionForward", "cudaLaunchKernel", "cudaStreamWaitEvent",
               "implicit_convolve_sgemm", "volta_h884cudnn_256x64_ldg8_relu_exp_small_nhwc_tn_v1",
               "benanza_run", "pthread_mutex_lock", "at::native::cudnn_convolution", "libtorch_cuda.so"]
    con.executemany("INSERT INTO StringIds VALUES (?, ?)", list(enumerate(strings)))
    tid = (4242 << 24) | 4242
    # two cuDNN calls with a stream wait (and its backtrace) between them
    con.executemany("INSERT INTO CUDNN_EVENTS VALUES (?,?,?,?,?)",
                    [(1_000_000, 1_050_000, 0, tid, 0), (1_300_000, 1_350_000, 0, tid, 0)])
    con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?,?,?,?,?,?,?,?)", [
        (1_010_000, 1_020_000, 0, tid, 11, 1, 0, None),
        (1_100_000, 1_200_000, 0, tid, 12, 2, 0, 1),
        (1_310_000, 1_320_000, 0, tid, 13, 1, 0, None)])
    con.executemany("INSERT INTO OSRT_CALLCHAINS VALUES (?,?,?,?,?,?,?,?,?,?)", [
        (1, 7, 8, 0, 0, 0, 0, 0, 0, 0), (1, 6, 8, 0, 0, 0, 0, 0, 0, 1)])
    con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, streamId, correlationId, "
                    "demangledName, shortName) VALUES (?,?,?,?,?,?,?)", [
                        (1_030_000, 1_090_000, 0, 7, 11, 3, 3), (1_330_000, 1_380_000, 0, 7, 13, 4, 4)])
    con.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid) VALUES (?,?,?,?,?)",
                (900_000, 1_400_000, 59, "benanza_run", tid))
    con.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, domainId, globalTid) VALUES (?,?,?,?,?)",
                (900_000, None, 75, 1, tid))
    con.commit()
    con.close()
    return path


def test_nsys_sqlite_tables(tmp_path):
    t = parse_nsys_sqlite(make_nsys_sqlite(tmp_path / "r.sqlite"))
    assert [k.name for k in t.kernels] == ["implicit_convolve_sgemm",
                                           "volta_h884cudnn_256x64_ldg8_relu_exp_small_nhwc_tn_v1"]
    assert t.kernels[0].correlation == 11 and t.kernels[0].span.dur_us == pytest.approx(60.0)
    kinds = [a.kind for a in t.api_calls]
    assert kinds.count("cudnn") == 2 and kinds.count("cuda_runtime") == 3 and kinds.count("nvtx") == 1
    wait = next(a for a in t.api_calls if a.name == "cudaStreamWaitEvent")
    assert wait.backtrace == ("at::native::cudnn_convolution (libtorch_cuda.so)",
                              "pthread_mutex_lock (libtorch_cuda.so)")
    assert wait.thread == 4242
    assert len(t.runs) == 1 and t.runs[0].dur_us == pytest.approx(500.0)


def test_nsys_not_sqlite_and_truncated(tmp_path):
    p = tmp_path / "x.sqlite"
    p.write_text("not a database")
    with pytest.raises(ProfileFormatError, match="not an SQLite file"):
        parse_nsys_sqlite(p)
    good = make_nsys_sqlite(tmp_path / "g.sqlite").read_bytes()
    cut = tmp_path / "cut.sqlite"
    cut.write_bytes(good[: len(good) // 3])
    with pytest.raises(ProfileFormatError, match="cut.sqlite"):
        parse_nsys_sqlite(cut)
    empty = tmp_path / "e.sqlite"
    sqlite3.connect(empty).execute("CREATE TABLE t (a)").connection.close()
    with pytest.raises(ProfileFormatError, match="no StringIds table"):
        parse_nsys_sqlite(empty)


def test_nsys_rep_without_nsys_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    rep = tmp_path / "r.nsys-rep"
    rep.write_bytes(b"\0" * 16)
    with pytest.raises(ProfileFormatError, match="needs Nsight Systems' `nsys` on PATH"):
        parse_nsys(rep)


# --- sniffing ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, attr", [
    ("ort_convnet.json", "trace"), ("kineto_cuda.json", "trace"), ("cudnn_v7.log", "cudnn"),
    ("cublas.log", "cublas"), ("onednn_v2.log", "onednn")])
def test_load_file_sniffs_format(name, attr):
    prof = load_file(FIXTURES / name)
    if attr == "trace":
        assert prof.trace is not None and prof.trace.ops
    else:
        assert prof.library_calls[attr]


def test_load_file_unknown_format(tmp_path):
    p = tmp_path / "notes.txt"
    p.write_text("just some text\n")
    with pytest.raises(ProfileFormatError, match="unknown profile format"):
        load_file(p)
