// GEMM and GEMV through cuBLAS for ONNX Gemm/MatMul (row-major), timed like the cuDNN calls.
//
// cuBLAS is column-major: a row-major M x N matrix is the column-major N x M transpose, so
// Y = op(A) op(B) is computed as Y^T = op(B)^T op(A)^T with the operands swapped.
#include <initializer_list>
#include <string>

#include "benanza_cudnn/harness.hpp"

namespace benanza::cudnn {
namespace {

// The math mode's cuBLAS compute type (tables.hpp): all accumulate in fp32.
cublasComputeType_t compute_type(const Variant& v) {
  switch (v.math) {
    case Math::Tf32Allowed: return CUBLAS_COMPUTE_32F_FAST_TF32;
    // fp32 data never meets Tensor Cores under COMPUTE_32F; 16-bit data needs PEDANTIC for that
    case Math::Fma: return v.dtype == DType::F32 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_PEDANTIC;
    case Math::TensorOp: return CUBLAS_COMPUTE_32F;
    case Math::Default: break;
  }
  throw Failure("a cuBLAS variant without a math mode: regenerate the tables");
}

const char* compute_name(cublasComputeType_t t) {
  switch (t) {
    case CUBLAS_COMPUTE_32F_FAST_TF32: return "CUBLAS_COMPUTE_32F_FAST_TF32";
    case CUBLAS_COMPUTE_32F_PEDANTIC: return "CUBLAS_COMPUTE_32F_PEDANTIC";
    default: return "CUBLAS_COMPUTE_32F";
  }
}

class BlasProblem : public Problem {
 public:
  BlasProblem(const BlasLayer& L, const Variant& v)
      : L_(L), call_(v.call), type_(cuda_dtype(v.dtype)), compute_(compute_type(v)),
        alpha_{static_cast<float>(L.alpha)}, beta_{static_cast<float>(L.beta)} {
    if (call_ == kSgemv && v.dtype != DType::F32) unsupported("cublasSgemv takes fp32 data only");
    for (int count : {L.a_count, L.b_count})
      if (count != 1 && count != L.batch)
        unsupported("cublasGemmStridedBatchedEx cannot broadcast " + std::to_string(count) + " matrices over " +
                    std::to_string(L.batch) + " products");
    cublas_handle();  // no GPU: fail here, before allocating
    a_ = filled(size_t(L.a_count) * L.m * L.k, v.dtype);
    b_ = filled(size_t(L.b_count) * L.k * L.n, v.dtype);
    c_ = filled(size_t(L.batch) * L.m * L.n, v.dtype);
    implementation = call_ == kSgemv ? std::string("cublasSgemv")
                     : call_ == kGemmEx ? std::string("cublasGemmEx/") + compute_name(compute_)
                                        : std::string("cublasGemmStridedBatchedEx/") + compute_name(compute_);
    counters["flops"] = L.work.flops;
    counters["bytes"] = bytes_of(L.work, v);
  }

  void enqueue() override {
    cublasHandle_t h = cublas_handle();
    const cublasOperation_t op_a = L_.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = L_.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const int lda = L_.trans_a ? L_.m : L_.k;  // leading dimension = row length of the stored matrix
    const int ldb = L_.trans_b ? L_.k : L_.n;
    if (call_ == kSgemv) {
      enqueue_gemv(h, lda, ldb);
    } else if (call_ == kGemmEx) {
      BZ_CUBLAS(cublasGemmEx(h, op_b, op_a, L_.n, L_.m, L_.k, &alpha_, b_.get(), type_, ldb, a_.get(), type_, lda,
                             &beta_, c_.get(), type_, L_.n, compute_, CUBLAS_GEMM_DEFAULT));
    } else {
      const long long stride_a = L_.a_count > 1 ? static_cast<long long>(L_.m) * L_.k : 0;
      const long long stride_b = L_.b_count > 1 ? static_cast<long long>(L_.k) * L_.n : 0;
      BZ_CUBLAS(cublasGemmStridedBatchedEx(h, op_b, op_a, L_.n, L_.m, L_.k, &alpha_, b_.get(), type_, ldb, stride_b,
                                           a_.get(), type_, lda, stride_a, &beta_, c_.get(), type_, L_.n,
                                           static_cast<long long>(L_.m) * L_.n, L_.batch, compute_,
                                           CUBLAS_GEMM_DEFAULT));
    }
  }

 private:
  // A vector-matrix (m == 1) or matrix-vector (n == 1) product: the matrix operand is the
  // other one, seen column-major; its transpose flag decides CUBLAS_OP_N or CUBLAS_OP_T.
  void enqueue_gemv(cublasHandle_t h, int lda, int ldb) {
    const float* a = static_cast<const float*>(a_.get());
    const float* b = static_cast<const float*>(b_.get());
    float* y = static_cast<float*>(c_.get());
    if (L_.m == 1) {
      // y[n] = B^T-view * a: B stored row-major k x n is column-major n x k.
      if (L_.trans_b)
        BZ_CUBLAS(cublasSgemv(h, CUBLAS_OP_T, L_.k, L_.n, &alpha_, b, ldb, a, 1, &beta_, y, 1));
      else
        BZ_CUBLAS(cublasSgemv(h, CUBLAS_OP_N, L_.n, L_.k, &alpha_, b, ldb, a, 1, &beta_, y, 1));
    } else {
      // y[m] = op(A) * b: A stored row-major m x k is column-major k x m.
      if (L_.trans_a)
        BZ_CUBLAS(cublasSgemv(h, CUBLAS_OP_N, L_.m, L_.k, &alpha_, a, lda, b, 1, &beta_, y, 1));
      else
        BZ_CUBLAS(cublasSgemv(h, CUBLAS_OP_T, L_.k, L_.m, &alpha_, a, lda, b, 1, &beta_, y, 1));
    }
  }

  BlasLayer L_;
  uint8_t call_;
  cudaDataType_t type_;
  cublasComputeType_t compute_;
  float alpha_, beta_;
  DeviceBuffer a_, b_, c_;
};

std::unique_ptr<Problem> make_blas(const BlasLayer& L, const Variant& v) {
  return std::make_unique<BlasProblem>(L, v);
}

}  // namespace

void add_blas(Registry& r, const BlasLayer* layers, const Variant* variants, size_t count) {
  add_family(r, layers, variants, count, make_blas);
}

}  // namespace benanza::cudnn
