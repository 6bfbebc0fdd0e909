// The context block: which GPU, driver and library versions produced the numbers. Keys follow
// benanza/system.py and runner.py (cudnn_version, cublas_version, cuda_runtime, cuda_driver_api).
#include <benchmark/benchmark.h>

#include <string>

#include "benanza_cudnn/harness.hpp"

namespace benanza::cudnn {
namespace {

std::string dotted(int v, int major_div, int minor_div) {
  return std::to_string(v / major_div) + "." + std::to_string(v % major_div / minor_div) + "." +
         std::to_string(v % minor_div);
}

void put(const std::string& key, const std::string& value) {
  set_context(key, value);
  benchmark::AddCustomContext(key, value);
}

}  // namespace

void add_cuda_context(bool cupti) {
  put("backend", "cudnn");
  put("mode", cupti ? "cupti" : "timing");
  const TimingSettings& t = timing_settings();
  put("l2_cache", t.flush_l2 ? "flushed before every timed call" : "hot (not flushed)");
  put("target_ms_per_repetition", std::to_string(t.target_ms));
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);  // 0 when no driver is installed
  put("cuda_runtime", dotted(runtime, 1000, 10));
  put("cuda_driver_api", driver ? dotted(driver, 1000, 10) : "none");
  put("cudnn_version", dotted(static_cast<int>(cudnnGetVersion()), 10000, 100));
  put("cudnn_header_version", dotted(CUDNN_VERSION, 10000, 100));
  int major = 0, minor = 0, patch = 0;
  cublasGetProperty(MAJOR_VERSION, &major);
  cublasGetProperty(MINOR_VERSION, &minor);
  cublasGetProperty(PATCH_LEVEL, &patch);
  put("cublas_version", std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch));
  int device = 0;
  cudaDeviceProp prop{};
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaGetDeviceProperties(&prop, device);
  if (err != cudaSuccess) {
    cudaGetLastError();
    put("gpu", std::string("unavailable: ") + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
    return;
  }
  put("gpu", prop.name);
  put("compute_capability", std::to_string(prop.major) + "." + std::to_string(prop.minor));
  put("gpu_memory_bytes", std::to_string(prop.totalGlobalMem));
  put("multiprocessors", std::to_string(prop.multiProcessorCount));
}

}  // namespace benanza::cudnn
