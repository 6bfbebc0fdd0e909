// Device-side initialisation of benchmark inputs: no host copies, no cuRAND.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "benanza_cudnn/cuda_runtime.hpp"

namespace benanza::cudnn {
namespace {

// A cheap integer hash (lowbias32) mapped to [lo, hi): values vary so no kernel sees a
// constant or all-zero tensor, and every run fills the same values.
__device__ float uniform(size_t i, float lo, float hi) {
  uint32_t x = static_cast<uint32_t>(i) ^ static_cast<uint32_t>(i >> 32) ^ 0x9e3779b9u;
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return lo + (hi - lo) * (x * (1.0f / 4294967296.0f));
}

template <class T>
__global__ void fill_kernel(T* out, size_t count, float lo, float hi) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x)
    out[i] = static_cast<T>(uniform(i, lo, hi));
}

template <class T>
void launch(void* out, size_t count, float lo, float hi) {
  const int threads = 256;
  const size_t wanted = (count + threads - 1) / threads;
  const int blocks = static_cast<int>(wanted < 4096 ? (wanted ? wanted : 1) : 4096);
  fill_kernel<T><<<blocks, threads, 0, stream()>>>(static_cast<T*>(out), count, lo, hi);
  BZ_CUDA(cudaGetLastError());
}

// Spins one thread until `ns` of the GPU's global timer have passed.
__global__ void delay_kernel(uint64_t ns) {
  uint64_t start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

}  // namespace

void delay_stream(double microseconds) {
  if (microseconds <= 0) return;
  delay_kernel<<<1, 1, 0, stream()>>>(static_cast<uint64_t>(microseconds * 1e3));
  BZ_CUDA(cudaGetLastError());
}

DeviceBuffer filled(size_t count, DType type, float lo, float hi) {
  DeviceBuffer buf(count * dtype_size(type));
  if (!count) return buf;
  switch (type) {
    case DType::F32: launch<float>(buf.get(), count, lo, hi); break;
    case DType::F16: launch<__half>(buf.get(), count, lo, hi); break;
    case DType::BF16: launch<__nv_bfloat16>(buf.get(), count, lo, hi); break;
    // integers: the float range times 64 (int8 in [-64, 64) by default), which alone would truncate to 0
    case DType::I8: launch<int8_t>(buf.get(), count, 64 * lo, 64 * hi); break;
    case DType::U8: launch<uint8_t>(buf.get(), count, 0.0f, 128 * hi); break;
    case DType::I32: launch<int32_t>(buf.get(), count, 64 * lo, 64 * hi); break;
    case DType::I64: launch<int64_t>(buf.get(), count, 64 * lo, 64 * hi); break;
    case DType::Bool: launch<uint8_t>(buf.get(), count, 0.f, 2.f); break;  // 0/1, whatever the range
    case DType::F8E4M3: launch<__nv_fp8_e4m3>(buf.get(), count, lo, hi); break;
  }
  return buf;
}

}  // namespace benanza::cudnn
