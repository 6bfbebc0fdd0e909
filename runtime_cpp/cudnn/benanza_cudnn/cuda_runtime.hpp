// Internals of the cuDNN/cuBLAS benchmark runtime: status checks, RAII handles, descriptors and
// device buffers, and the Problem every family implements. Generated code never includes this.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include "benanza_cudnn/tables.hpp"

namespace benanza::cudnn {

// The library refused the configuration (status.hpp says which status codes mean that):
// recorded as "unsupported" with the library's status name.
struct Unsupported : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// Anything else (no GPU, out of memory, a harness bug, the environment, an execution failure):
// recorded as "failed". A sticky CUDA error does not throw: it ends the process (core.cpp).
struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void check_cuda(cudaError_t status, const char* call, const char* file, int line);
void check_cudnn(cudnnStatus_t status, const char* call, const char* file, int line);
void check_cublas(cublasStatus_t status, const char* call, const char* file, int line);

#define BZ_CUDA(expr) ::benanza::cudnn::check_cuda((expr), #expr, __FILE__, __LINE__)
#define BZ_CUDNN(expr) ::benanza::cudnn::check_cudnn((expr), #expr, __FILE__, __LINE__)
#define BZ_CUBLAS(expr) ::benanza::cudnn::check_cublas((expr), #expr, __FILE__, __LINE__)

// A configuration the legacy API cannot express at all (reported, never silently changed).
[[noreturn]] void unsupported(const std::string& why);

// The process-wide stream and library handles, created on first use. Without a usable GPU
// the first use throws Failure with the CUDA error (e.g. cudaErrorInsufficientDriver).
cudaStream_t stream();
cudnnHandle_t cudnn_handle();
cublasHandle_t cublas_handle();

// Owns one cuDNN descriptor: D is the descriptor type, Create/Destroy its library functions.
template <class D, cudnnStatus_t (*Create)(D*), cudnnStatus_t (*Destroy)(D)>
class Descriptor {
 public:
  Descriptor() { BZ_CUDNN(Create(&d_)); }
  ~Descriptor() { Destroy(d_); }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  operator D() const { return d_; }

 private:
  D d_{};
};

using TensorDesc = Descriptor<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor,
                              cudnnDestroyTensorDescriptor>;
using FilterDesc = Descriptor<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor,
                              cudnnDestroyFilterDescriptor>;
using ConvDesc = Descriptor<cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor,
                            cudnnDestroyConvolutionDescriptor>;
using ActivationDesc = Descriptor<cudnnActivationDescriptor_t, cudnnCreateActivationDescriptor,
                                  cudnnDestroyActivationDescriptor>;
using PoolingDesc = Descriptor<cudnnPoolingDescriptor_t, cudnnCreatePoolingDescriptor,
                               cudnnDestroyPoolingDescriptor>;
using LrnDesc = Descriptor<cudnnLRNDescriptor_t, cudnnCreateLRNDescriptor, cudnnDestroyLRNDescriptor>;
using OpTensorDesc = Descriptor<cudnnOpTensorDescriptor_t, cudnnCreateOpTensorDescriptor,
                                cudnnDestroyOpTensorDescriptor>;
using DropoutDesc = Descriptor<cudnnDropoutDescriptor_t, cudnnCreateDropoutDescriptor,
                               cudnnDestroyDropoutDescriptor>;
using RnnDesc = Descriptor<cudnnRNNDescriptor_t, cudnnCreateRNNDescriptor, cudnnDestroyRNNDescriptor>;
using ReduceDesc = Descriptor<cudnnReduceTensorDescriptor_t, cudnnCreateReduceTensorDescriptor,
                              cudnnDestroyReduceTensorDescriptor>;
using RnnDataDesc = Descriptor<cudnnRNNDataDescriptor_t, cudnnCreateRNNDataDescriptor,
                               cudnnDestroyRNNDataDescriptor>;
using TransformDesc = Descriptor<cudnnTensorTransformDescriptor_t, cudnnCreateTensorTransformDescriptor,
                                 cudnnDestroyTensorTransformDescriptor>;

// Device memory; a zero-byte buffer holds nullptr.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(o.bytes_) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

size_t dtype_size(DType t);
cudnnDataType_t cudnn_dtype(DType t);
cudaDataType_t cuda_dtype(DType t);
cudnnTensorFormat_t cudnn_format(Layout l);
cudnnMathType_t cudnn_math(Math m);
const char* dtype_name(DType t);

// A buffer of `count` elements of `type`, filled on the device with values in [lo, hi)
// (a hash of the index, so no host copy and no cuRAND).
DeviceBuffer filled(size_t count, DType type, float lo = -1.0f, float hi = 1.0f);

// Holds stream() busy on the device for `microseconds` (a spinning one-thread kernel), so the
// host can enqueue what follows before the GPU reaches it.
void delay_stream(double microseconds);

// 4-d tensor descriptor in the given layout.
void set_tensor4d(cudnnTensorDescriptor_t d, Layout layout, DType type, int n, int c, int h, int w);

// Scaling factors: cuDNN wants float for float/half/bf16 data (double only for double data).
struct Scale {
  float value;
  const void* ptr() const { return &value; }
};

// One prepared benchmark: descriptors and buffers are built in the constructor (never timed);
// enqueue() issues the measured library call(s) on stream().
class Problem {
 public:
  virtual ~Problem() = default;
  virtual void enqueue() = 0;

  std::string implementation;  // what ran (algorithm or API), the result's `implementation`
  uint64_t workspace_bytes = 0;
  std::map<std::string, double> counters;  // flops, bytes and family-specific numbers
};

}  // namespace benanza::cudnn
