// Status checks, handles, buffers and type mappings of the cuDNN/cuBLAS runtime.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "benanza_cudnn/cuda_runtime.hpp"
#include "benanza_cudnn/status.hpp"

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

// A sticky error leaves the context unusable: every later call of this process fails with
// it, so every later benchmark would be stored as failed. End the process instead; `benanza
// run` stores the running benchmark as failed with this line and restarts the binary after it.
[[noreturn]] void abort_sticky(cudaError_t status, const std::string& context) {
  std::fflush(stdout);
  std::fprintf(stderr,
               "benanza: fatal: %s: %s: %s: a sticky CUDA error (the context is unusable); aborting so "
               "the runner records this benchmark as failed and restarts for the rest\n",
               context.c_str(), cudaGetErrorName(status), cudaGetErrorString(status));
  std::fflush(stderr);
  std::abort();
}

// After a library call failed: if a kernel fault poisoned the context, stop here, where the
// fault belongs, instead of at the next benchmark's first CUDA call.
void probe_context(const std::string& context) {
  const cudaError_t status = cudaDeviceSynchronize();
  if (is_sticky(status)) abort_sticky(status, context);
  cudaGetLastError();
}

}  // namespace

void check_cuda(cudaError_t status, const char* call, const char* file, int line) {
  if (status == cudaSuccess) return;
  if (is_sticky(status)) abort_sticky(status, call_name(call) + where(file, line));
  cudaGetLastError();  // clear the non-sticky error so the next benchmark starts clean
  throw Failure(call_name(call) + ": " + cudaGetErrorName(status) + ": " + cudaGetErrorString(status) +
                where(file, line));
}

void check_cudnn(cudnnStatus_t status, const char* call, const char* file, int line) {
  if (status == CUDNN_STATUS_SUCCESS) return;
  const StatusRule rule = cudnn_rule(status);
  std::string msg = call_name(call) + ": " + rule.name;
  const std::string text = cudnnGetErrorString(status);
  if (text != rule.name) msg += ": " + text;
#if CUDNN_MAJOR >= 9
  char detail[512] = {0};
  cudnnGetLastErrorString(detail, sizeof detail);
  if (detail[0]) msg += std::string(" (") + detail + ")";
#endif
  msg += where(file, line);
  if (rule.verdict == Verdict::Unsupported) throw Unsupported(msg);
  probe_context(call_name(call) + where(file, line));
  throw Failure(msg);
}

void check_cublas(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  const StatusRule rule = cublas_rule(status);
  std::string msg = call_name(call) + ": " + rule.name + ": " + cublasGetStatusString(status) + where(file, line);
  if (rule.verdict == Verdict::Unsupported) throw Unsupported(msg);
  probe_context(call_name(call) + where(file, line));
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

size_t dtype_size(DType t) {
  switch (t) {
    case DType::I64: return 8;
    case DType::F32: case DType::I32: return 4;
    case DType::F16: case DType::BF16: return 2;
    case DType::I8: case DType::U8: case DType::Bool: case DType::F8E4M3: return 1;
  }
  return 4;
}

cudnnDataType_t cudnn_dtype(DType t) {
  switch (t) {
    case DType::F32: return CUDNN_DATA_FLOAT;
    case DType::F16: return CUDNN_DATA_HALF;
    case DType::BF16: return CUDNN_DATA_BFLOAT16;
    case DType::I8: return CUDNN_DATA_INT8;
    case DType::U8: return CUDNN_DATA_UINT8;
    case DType::I32: return CUDNN_DATA_INT32;
    case DType::I64: return CUDNN_DATA_INT64;
    case DType::Bool: unsupported("booleans run as graph-API nodes only (graph.cpp)");
    case DType::F8E4M3: return CUDNN_DATA_FP8_E4M3;
  }
  return CUDNN_DATA_FLOAT;
}

cudaDataType_t cuda_dtype(DType t) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::F16: return CUDA_R_16F;
    case DType::BF16: return CUDA_R_16BF;
    case DType::I8: return CUDA_R_8I;
    case DType::U8: return CUDA_R_8U;
    case DType::I32: return CUDA_R_32I;
    case DType::I64: return CUDA_R_64I;
    case DType::Bool: return CUDA_R_8U;
    case DType::F8E4M3: return CUDA_R_8F_E4M3;
  }
  return CUDA_R_32F;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::I8: return "i8";
    case DType::U8: return "u8";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::Bool: return "b";
    case DType::F8E4M3: return "f8e4m3fn";
  }
  return "?";
}

cudnnTensorFormat_t cudnn_format(Layout l) { return l == Layout::NHWC ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW; }

cudnnMathType_t cudnn_math(Math m) {
  switch (m) {
    case Math::Fma: return CUDNN_FMA_MATH;
    case Math::Tf32Allowed: return CUDNN_DEFAULT_MATH;  // on fp32 data: TF32 Tensor Cores allowed
    case Math::TensorOp: return CUDNN_TENSOR_OP_MATH;
    case Math::Default: break;
  }
  throw Failure("a variant without a math mode reached a call that takes one: regenerate the tables");
}

void set_tensor4d(cudnnTensorDescriptor_t d, Layout layout, DType type, int n, int c, int h, int w) {
  BZ_CUDNN(cudnnSetTensor4dDescriptor(d, cudnn_format(layout), cudnn_dtype(type), n, c, h, w));
}

}  // namespace benanza::cudnn
