// Status checks, handles, buffers and type mappings of the cuDNN/cuBLAS runtime.
#include <cstdio>
#include <string>

#include "benanza_cudnn/cuda_runtime.hpp"

namespace benanza::cudnn {
namespace {

// "cudnnFoo(handle, ...)" → "cudnnFoo": the message names the call, not its arguments.
std::string call_name(const char* call) {
  std::string s(call);
  auto paren = s.find('(');
  return paren == std::string::npos ? s : s.substr(0, paren);
}

std::string where(const char* file, int line) {
  std::string f(file);
  auto slash = f.find_last_of('/');
  return " (" + (slash == std::string::npos ? f : f.substr(slash + 1)) + ":" + std::to_string(line) + ")";
}

}  // namespace

void check_cuda(cudaError_t status, const char* call, const char* file, int line) {
  if (status == cudaSuccess) return;
  cudaGetLastError();  // clear the sticky non-fatal error so the next benchmark starts clean
  throw Failure(call_name(call) + ": " + cudaGetErrorName(status) + ": " + cudaGetErrorString(status) +
                where(file, line));
}

void check_cudnn(cudnnStatus_t status, const char* call, const char* file, int line) {
  if (status == CUDNN_STATUS_SUCCESS) return;
  std::string msg = call_name(call) + ": " + cudnnGetErrorString(status);
#if CUDNN_MAJOR >= 9
  char detail[512] = {0};
  cudnnGetLastErrorString(detail, sizeof detail);
  if (detail[0]) msg += std::string(" (") + detail + ")";
  const int category = CUDNN_STATUS_CATEGORY(status);
  const bool refused = category == CUDNN_STATUS_BAD_PARAM || category == CUDNN_STATUS_NOT_SUPPORTED;
#else
  const bool refused = status == CUDNN_STATUS_BAD_PARAM || status == CUDNN_STATUS_NOT_SUPPORTED;
#endif
  msg += where(file, line);
  if (refused) throw Unsupported(msg);
  throw Failure(msg);
}

void check_cublas(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  std::string msg = call_name(call) + ": " + cublasGetStatusName(status) + ": " +
                    cublasGetStatusString(status) + where(file, line);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_INVALID_VALUE ||
      status == CUBLAS_STATUS_ARCH_MISMATCH)
    throw Unsupported(msg);
  throw Failure(msg);
}

void unsupported(const std::string& why) { throw Unsupported(why); }

// Handles live for the whole process and are never destroyed: tearing them down in static
// destructors races the CUDA runtime's own shutdown.
cudaStream_t stream() {
  static cudaStream_t s = [] {
    cudaStream_t created;
    BZ_CUDA(cudaStreamCreateWithFlags(&created, cudaStreamNonBlocking));
    return created;
  }();
  return s;
}

cudnnHandle_t cudnn_handle() {
  static cudnnHandle_t h = [] {
    cudnnHandle_t created;
    cudaStream_t s = stream();  // fails first, with the CUDA error, when there is no GPU
    BZ_CUDNN(cudnnCreate(&created));
    BZ_CUDNN(cudnnSetStream(created, s));
    return created;
  }();
  return h;
}

cublasHandle_t cublas_handle() {
  static cublasHandle_t h = [] {
    cublasHandle_t created;
    cudaStream_t s = stream();
    BZ_CUBLAS(cublasCreate(&created));
    BZ_CUBLAS(cublasSetStream(created, s));
    return created;
  }();
  return h;
}

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes) BZ_CUDA(cudaMalloc(&ptr_, bytes));
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) cudaFree(ptr_);
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = o.bytes_;
  }
  return *this;
}

size_t dtype_size(DType t) { return t == DType::F32 ? 4 : 2; }

cudnnDataType_t cudnn_dtype(DType t) {
  switch (t) {
    case DType::F32: return CUDNN_DATA_FLOAT;
    case DType::F16: return CUDNN_DATA_HALF;
    case DType::BF16: return CUDNN_DATA_BFLOAT16;
  }
  return CUDNN_DATA_FLOAT;
}

cudaDataType_t cuda_dtype(DType t) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::F16: return CUDA_R_16F;
    case DType::BF16: return CUDA_R_16BF;
  }
  return CUDA_R_32F;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
  }
  return "?";
}

cudnnTensorFormat_t cudnn_format(Layout l) { return l == Layout::NHWC ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW; }

cudnnMathType_t cudnn_math(Math m) {
  switch (m) {
    // FMA: no Tensor Cores and no TF32, so "f32" numbers are true fp32 on Ampere and newer,
    // where CUDNN_DEFAULT_MATH would silently allow TF32.
    case Math::Default: return CUDNN_FMA_MATH;
    case Math::TensorOp: return CUDNN_TENSOR_OP_MATH;
    case Math::TF32: return CUDNN_DEFAULT_MATH;
  }
  return CUDNN_DEFAULT_MATH;
}

void set_tensor4d(cudnnTensorDescriptor_t d, Layout layout, DType type, int n, int c, int h, int w) {
  BZ_CUDNN(cudnnSetTensor4dDescriptor(d, cudnn_format(layout), cudnn_dtype(type), n, c, h, w));
}

}  // namespace benanza::cudnn
