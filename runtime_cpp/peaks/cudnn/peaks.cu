// `benanza peaks` for the cuDNN backend: what this GPU attains, measured the way the benchmarks
// run (the same cuBLAS, device time from CUDA events), one BENANZA_PEAK line each
// (benanza/peaks.py reads them).
//
//   --gemm=f32,tf32,f16,bf16,s8  GEMM throughput through cublasGemmEx, per data type: the best
//                                of square sizes 2048, 4096, 8192 (f32: FMA units only; tf32:
//                                fp32 data on Tensor Cores; f16/bf16 with fp32 accumulation, as
//                                cuDNN and cuBLAS run them; s8: int8 × int8 → int32)
//   --ladder                     device-memory bandwidth on working sets inside the L2 cache
//                                (a quarter and a half of it) and far beyond it (DRAM: 8× L2,
//                                at least 256 MiB): the better of a copy and a read-only sum
//   --seconds=S                  measuring time per peak (default 0.25)
//
// A data type this GPU or cuBLAS cannot run is reported with its status and cuBLAS's message,
// never assumed. The context line names the device, its SMs, L2 size and the library versions
// (cuDNN's too, though only cuBLAS runs here: they name the stack the peaks belong to).
#include <cublas_v2.h>
#include <cudnn.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "benanza/json.hpp"

namespace {

using Clock = std::chrono::steady_clock;

struct CudaError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct BlasError : std::runtime_error {
  BlasError(cublasStatus_t s, const std::string& what) : std::runtime_error(what), status(s) {}
  cublasStatus_t status;
};

void check(cudaError_t e, const char* call) {
  if (e != cudaSuccess) throw CudaError(std::string(call) + ": " + cudaGetErrorString(e));
}

void check(cublasStatus_t s, const char* call) {
  if (s != CUBLAS_STATUS_SUCCESS) throw BlasError(s, std::string(call) + ": " + cublasGetStatusString(s));
}

#define BZ_CHECK(call) check((call), #call)

void emit(const std::string& tag, const std::string& payload) {
  std::string line = tag + " " + payload + "\n";
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fflush(stdout);
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Device seconds per call of `enqueue(reps)` (reps calls back to back on the default stream),
// from CUDA events around batches: the batch doubles until it lasts 2 ms of device time, then
// batches run for about `budget` seconds and the fastest counts — what the GPU attains when
// nothing else (a clock ramp, another process) slows a batch.
double best_per_call(const std::function<void(int)>& enqueue, double budget) {
  cudaEvent_t start, stop;
  BZ_CHECK(cudaEventCreate(&start));
  BZ_CHECK(cudaEventCreate(&stop));
  auto timed = [&](int reps) {
    BZ_CHECK(cudaEventRecord(start));
    enqueue(reps);
    BZ_CHECK(cudaEventRecord(stop));
    BZ_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    BZ_CHECK(cudaEventElapsedTime(&ms, start, stop));
    return ms * 1e-3;
  };
  timed(1);  // warm-up: cuBLAS heuristics, module loading, first touch
  int reps = 1;
  while (timed(reps) < 0.002 && reps < (1 << 20)) reps *= 2;
  double best = 1e9;
  auto began = Clock::now();
  do {
    best = std::min(best, timed(reps) / reps);
  } while (seconds_since(began) < budget);
  BZ_CHECK(cudaEventDestroy(start));
  BZ_CHECK(cudaEventDestroy(stop));
  return best;
}

struct GemmType {
  std::string name;
  cudaDataType_t ab, c;
  cublasComputeType_t compute;
  size_t ab_size, c_size;
};

bool gemm_type(const std::string& name, GemmType& out) {
  if (name == "f32") out = {name, CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F, 4, 4};
  else if (name == "tf32") out = {name, CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32, 4, 4};
  else if (name == "f16") out = {name, CUDA_R_16F, CUDA_R_16F, CUBLAS_COMPUTE_32F, 2, 2};
  else if (name == "bf16") out = {name, CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F, 2, 2};
  else if (name == "s8") out = {name, CUDA_R_8I, CUDA_R_32I, CUBLAS_COMPUTE_32I, 1, 4};
  else return false;
  return true;
}

cublasHandle_t handle() {
  static cublasHandle_t h = [] {
    cublasHandle_t made;
    BZ_CHECK(cublasCreate(&made));
    return made;
  }();
  return h;
}

// Small integers, exactly representable in every type: no denormals or infinities slow a kernel.
__global__ void fill_bytes(uint8_t* p, size_t n, int kind) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    int v = int(i % 7) - 3;
    switch (kind) {
      case 0: reinterpret_cast<float*>(p)[i] = float(v); break;
      case 1: reinterpret_cast<__half*>(p)[i] = __float2half(float(v)); break;
      case 2: reinterpret_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(float(v)); break;
      case 3: reinterpret_cast<int8_t*>(p)[i] = int8_t(v); break;
      default: reinterpret_cast<int32_t*>(p)[i] = v; break;
    }
  }
}

int fill_kind(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_32F: return 0;
    case CUDA_R_16F: return 1;
    case CUDA_R_16BF: return 2;
    case CUDA_R_8I: return 3;
    default: return 4;
  }
}

struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(size_t bytes) { BZ_CHECK(cudaMalloc(&p, bytes)); }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

void fill(DeviceBuffer& b, size_t n, cudaDataType_t t) {
  fill_bytes<<<1024, 256>>>(static_cast<uint8_t*>(b.p), n, fill_kind(t));
  BZ_CHECK(cudaGetLastError());
}

void measure_gemm(const std::string& name, double budget, size_t free_bytes) {
  benanza::JsonObject o;
  o.add("name", "gemm_" + name).add("kind", "gemm").add("dtype", name);
  GemmType t;
  if (!gemm_type(name, t)) {
    emit("BENANZA_PEAK", o.add("status", "failed").add("message", "unknown GEMM data type " + name).str());
    return;
  }
  try {
    double best_rate = 0, per_call = 0;
    int64_t best_n = 0;
    for (int64_t n = 2048; n <= 8192; n *= 2) {
      size_t elems = size_t(n) * n;
      if ((2 * t.ab_size + t.c_size) * elems > free_bytes / 2) break;  // leave room: a shared GPU
      DeviceBuffer a(elems * t.ab_size), b(elems * t.ab_size), c(elems * t.c_size);
      fill(a, elems, t.ab);
      fill(b, elems, t.ab);
      fill(c, elems, t.c);
      // alpha/beta in the compute type's scalar type: float, or int32 for s8
      float alpha_f = 1.0f, beta_f = 0.0f;
      int32_t alpha_i = 1, beta_i = 0;
      const void* alpha = t.compute == CUBLAS_COMPUTE_32I ? static_cast<const void*>(&alpha_i) : &alpha_f;
      const void* beta = t.compute == CUBLAS_COMPUTE_32I ? static_cast<const void*>(&beta_i) : &beta_f;
      // int8 Tensor Core GEMMs want A transposed (the "TN" layout cuBLAS documents for IMMA)
      cublasOperation_t op_a = t.ab == CUDA_R_8I ? CUBLAS_OP_T : CUBLAS_OP_N;
      int ni = static_cast<int>(n);
      auto calls = [&](int reps) {
        for (int i = 0; i < reps; ++i)
          BZ_CHECK(cublasGemmEx(handle(), op_a, CUBLAS_OP_N, ni, ni, ni, alpha, a.p, t.ab, ni, b.p, t.ab, ni, beta,
                                c.p, t.c, ni, t.compute, CUBLAS_GEMM_DEFAULT));
      };
      double took = best_per_call(calls, budget);
      double rate = 2.0 * n * n * n / took;
      if (rate > best_rate) best_rate = rate, per_call = took, best_n = n;
    }
    if (best_n == 0) throw CudaError("not enough free device memory for a 2048x2048 GEMM");
    o.add("status", "ok").add("value", best_rate).add("unit", "flop/s").add("size", best_n)
        .add("seconds_per_call", per_call).add("implementation", std::string("cublasGemmEx"));
  } catch (const BlasError& e) {
    bool unsupported = e.status == CUBLAS_STATUS_NOT_SUPPORTED || e.status == CUBLAS_STATUS_ARCH_MISMATCH;
    o.add("status", unsupported ? "unsupported" : "failed").add("message", std::string("cuBLAS: ") + e.what());
  } catch (const CudaError& e) {
    o.add("status", "failed").add("message", std::string("CUDA: ") + e.what());
  }
  cudaGetLastError();  // a failed launch must not fail the next peak
  emit("BENANZA_PEAK", o.str());
}

// dst[i] = src[i] over float4s: 8 bytes moved per 4 read.
__global__ void copy_kernel(const float4* __restrict__ src, float4* __restrict__ dst, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    dst[i] = src[i];
}

// Σ src over float4s, one atomic per thread: reads only.
__global__ void read_kernel(const float4* __restrict__ src, size_t n, float* out) {
  float4 acc = make_float4(0, 0, 0, 0);
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    float4 v = src[i];
    acc.x += v.x, acc.y += v.y, acc.z += v.z, acc.w += v.w;
  }
  float s = acc.x + acc.y + acc.z + acc.w;
  if (s == 12345.678f) atomicAdd(out, s);  // never true for the data written; keeps the loads
}

void measure_bandwidth(const std::string& level, int64_t bytes, double budget, int sms) {
  benanza::JsonObject o;
  o.add("name", "bandwidth_" + level + "_" + std::to_string(bytes)).add("kind", "bandwidth").add("level", level);
  try {
    // the copy's working set is both halves; the read's the source alone, as large as the copy's
    size_t n4 = std::max<int64_t>(bytes / 2 / int64_t(sizeof(float4)), 1024);
    DeviceBuffer src(2 * n4 * sizeof(float4)), dst(n4 * sizeof(float4)), out(sizeof(float));
    fill(src, 2 * n4 * 4, CUDA_R_32F);
    BZ_CHECK(cudaMemset(dst.p, 0, n4 * sizeof(float4)));
    int blocks = sms * 8, threads = 256;
    auto* s4 = static_cast<const float4*>(src.p);
    double copy = best_per_call([&](int reps) {
      for (int i = 0; i < reps; ++i) copy_kernel<<<blocks, threads>>>(s4, static_cast<float4*>(dst.p), n4);
      BZ_CHECK(cudaGetLastError());
    }, budget / 2);
    double read = best_per_call([&](int reps) {
      for (int i = 0; i < reps; ++i) read_kernel<<<blocks, threads>>>(s4, 2 * n4, static_cast<float*>(out.p));
      BZ_CHECK(cudaGetLastError());
    }, budget / 2);
    double ws = double(2 * n4 * sizeof(float4));
    double copy_bw = ws / copy, read_bw = ws / read;
    o.add("status", "ok").add("value", std::max(copy_bw, read_bw)).add("unit", "byte/s")
        .add("size", static_cast<int64_t>(ws)).add("copy", copy_bw).add("read", read_bw);
  } catch (const CudaError& e) {
    o.add("status", "failed").add("message", std::string("CUDA: ") + e.what());
  }
  cudaGetLastError();
  emit("BENANZA_PEAK", o.str());
}

// The version strings the cuDNN benchmarks' context reports (runtime_cpp/cudnn/context.cpp), so
// the peaks are stored with the same stack as their results.
std::string dotted(int v, int major_div, int minor_div) {
  return std::to_string(v / major_div) + "." + std::to_string(v % major_div / minor_div) + "." +
         std::to_string(v % minor_div);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string part; std::getline(in, part, sep);)
    if (!part.empty()) out.push_back(part);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> gemms;
  bool ladder = false;
  double budget = 0.25;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    try {
      if (arg.rfind("--gemm=", 0) == 0) gemms = split(arg.substr(7), ',');
      else if (arg == "--ladder") ladder = true;
      else if (arg.rfind("--seconds=", 0) == 0) budget = std::stod(arg.substr(10));
      else throw std::invalid_argument(arg);
    } catch (const std::exception&) {
      std::fprintf(stderr, "benanza_peaks: bad argument %s\n", arg.c_str());
      return 2;
    }
  }
  int device = 0, runtime = 0, driver = 0;
  cudaDeviceProp prop{};
  size_t free_bytes = 0, total_bytes = 0;
  try {
    BZ_CHECK(cudaGetDevice(&device));
    BZ_CHECK(cudaGetDeviceProperties(&prop, device));
    BZ_CHECK(cudaRuntimeGetVersion(&runtime));
    BZ_CHECK(cudaDriverGetVersion(&driver));
    BZ_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  } catch (const CudaError& e) {
    std::fprintf(stderr, "benanza_peaks: no usable CUDA device: %s\n", e.what());
    return 3;
  }
  int major = 0, minor = 0, patch = 0;
  cublasGetProperty(MAJOR_VERSION, &major);
  cublasGetProperty(MINOR_VERSION, &minor);
  cublasGetProperty(PATCH_LEVEL, &patch);
  std::map<std::string, std::string> custom{
      {"backend", "cudnn"}, {"device", prop.name}, {"sms", std::to_string(prop.multiProcessorCount)},
      {"l2_bytes", std::to_string(prop.l2CacheSize)}, {"memory_bytes", std::to_string(total_bytes)},
      {"compute_capability", std::to_string(prop.major) + "." + std::to_string(prop.minor)},
      {"cuda_runtime", dotted(runtime, 1000, 10)}, {"cuda_driver_api", dotted(driver, 1000, 10)},
      {"cudnn_version", dotted(static_cast<int>(cudnnGetVersion()), 10000, 100)},
      {"cublas_version", std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch)}};
  emit("BENANZA_CONTEXT", benanza::JsonObject().add("custom", custom).str());
  for (const auto& g : gemms) measure_gemm(g, budget, free_bytes);
  if (ladder) {
    int64_t l2 = prop.l2CacheSize;
    int64_t dram = std::max<int64_t>(8 * l2, int64_t(256) << 20);
    dram = std::min<int64_t>(dram, int64_t(free_bytes / 4));
    for (int64_t ws : {l2 / 4, l2 / 2}) measure_bandwidth("L2", ws, budget, prop.multiProcessorCount);
    measure_bandwidth("DRAM", dram, budget, prop.multiProcessorCount);
  }
  return 0;
}
