// GEMM and GEMV through cuBLAS for ONNX Gemm/MatMul (row-major), timed like the cuDNN calls, and
// the fused MatMul→Add(bias)[→Gelu|→Relu] as one cublasLtMatmul with a bias epilogue, and ONNX
// MatMulInteger as cublasLtMatmul's int8 GEMM (kLtInt8: s8 operands, CUBLAS_COMPUTE_32I, s32 result),
// QLinearMatMul as that GEMM requantized into s8 by an fp32 alpha (kLtInt8Requant) or, with
// per-column weights' scales, a device vector of alphas (kLtInt8RequantPerColumn); and the QDQ
// float8 MatMul (the qdq_fp8_matmul pattern) as cublasLtMatmul's FP8 GEMM (kLtFp8, below); and a
// 1x1 convolution (stride 1, no padding, one group) as a strided-batched cublasLtMatmul on its own
// NCHW data (kLtGemm, kLtRelu: the row benanza/ops/conv.py gemm_row writes, below).
//
// cuBLASLt's int8 GEMM (the cuBLAS documentation's cublasLtMatmul IMMA requirements, regular data
// ordering) takes CUDA_R_8I A and B only, in the "TN" form (Lt's A transposed: here the weights,
// stored N x K as a framework pre-packs constant weights once), leading dimensions multiples of 4
// and m, k multiples of 4 (here N and K). The heuristic decides what this cuBLASLt runs: a rank it
// does not offer is stored as unsupported, its message naming that requirement where N or K
// breaks it (ONNX Runtime's CUDA MatMulInteger pads K instead, a copy this benchmark does not time).
// An unsigned A is benchmarked as its signed twin of the same bytes (u8 - 128 is s8; the shift
// folds into the zero point): ONNX Runtime's CUDA EP registers MatMulInteger for s8·s8 only, so
// ORT's quantize_dynamic models (u8 activations) run it on the CPU; the zero points' correction
// (zp_A·colsum(B), an M x N int32 subtraction with the column sums of the constant weights
// computed once) is not in the measured call.
//
// cuBLAS is column-major: a row-major M x N matrix is the column-major N x M transpose, so
// Y = op(A) op(B) is computed as Y^T = op(B)^T op(A)^T with the operands swapped.
#include <cublasLt.h>

#include <initializer_list>
#include <map>
#include <string>
#include <tuple>
#include <vector>

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

// Elements between consecutive products' A and B: one matrix each, or 0 where the one stored
// matrix is broadcast over the batch (a_count/b_count, tables.hpp)
long long stride_a(const BlasLayer& L) { return L.a_count > 1 ? static_cast<long long>(L.m) * L.k : 0; }
long long stride_b(const BlasLayer& L) { return L.b_count > 1 ? static_cast<long long>(L.k) * L.n : 0; }

void check_broadcast(const BlasLayer& L, const std::string& call) {
  for (int count : {L.a_count, L.b_count})
    if (count != 1 && count != L.batch)
      unsupported(call + " cannot broadcast " + std::to_string(count) + " matrices over " +
                  std::to_string(L.batch) + " products");
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
    check_broadcast(L, "cublasGemmStridedBatchedEx");
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
      BZ_CUBLAS(cublasGemmStridedBatchedEx(h, op_b, op_a, L_.n, L_.m, L_.k, &alpha_, b_.get(), type_, ldb,
                                           stride_b(L_), a_.get(), type_, lda, stride_a(L_), &beta_, c_.get(), type_,
                                           L_.n, static_cast<long long>(L_.m) * L_.n, L_.batch, compute_,
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

// --- cublasLtMatmul with a bias epilogue ---------------------------------------------------

// Heuristic answers a layer's variants can pick from (benanza/backends/cudnn.py LT_ALGOS names
// one variant per rank).
constexpr int kLtAlgos = 8;
// The most workspace the heuristic may plan with (a framework's cuBLASLt workspace is of this
// order: PyTorch's CUBLASLT_WORKSPACE_SIZE); each algorithm is given exactly what it reports.
constexpr uint64_t kLtWorkspaceLimit = uint64_t(32) << 20;

cublasLtHandle_t lt_handle() {
  static cublasLtHandle_t h = [] {
    stream();  // no GPU: the CUDA error is thrown here, as for every other handle
    cublasLtHandle_t created;
    BZ_CUBLAS(cublasLtCreate(&created));
    return created;
  }();
  return h;
}

// Owns one cuBLASLt descriptor; Destroy is its library function.
template <class D, cublasStatus_t (*Destroy)(D)>
class LtDesc {
 public:
  LtDesc() = default;
  ~LtDesc() {
    if (d_) Destroy(d_);
  }
  LtDesc(const LtDesc&) = delete;
  LtDesc& operator=(const LtDesc&) = delete;
  D* out() { return &d_; }
  operator D() const { return d_; }

 private:
  D d_{};
};
using LtMatmulDesc = LtDesc<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy>;
using LtLayout = LtDesc<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>;
using LtPreference = LtDesc<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>;

// The bias is added before the activation, one value per row of the column-major D: per
// column of the row-major output, which is the ONNX bias Add along the last axis. A 1x1
// convolution's bias runs along the other axis of D (its rows are the H*W positions): it is C.
cublasLtEpilogue_t epilogue(uint8_t call) {
  switch (call) {
    case kLtBias: return CUBLASLT_EPILOGUE_BIAS;
    case kLtBiasGelu: return CUBLASLT_EPILOGUE_GELU_BIAS;
    case kLtBiasRelu: return CUBLASLT_EPILOGUE_RELU_BIAS;
    case kLtGemm: return CUBLASLT_EPILOGUE_DEFAULT;
    case kLtRelu: return CUBLASLT_EPILOGUE_RELU;
    default: break;
  }
  throw Failure("call " + std::to_string(call) + " is not a cublasLtMatmul epilogue: regenerate the tables");
}

bool bias_epilogue(uint8_t call) { return call == kLtBias || call == kLtBiasGelu || call == kLtBiasRelu; }

const char* epilogue_name(cublasLtEpilogue_t e) {
  switch (e) {
    case CUBLASLT_EPILOGUE_GELU_BIAS: return "CUBLASLT_EPILOGUE_GELU_BIAS";
    case CUBLASLT_EPILOGUE_RELU_BIAS: return "CUBLASLT_EPILOGUE_RELU_BIAS";
    case CUBLASLT_EPILOGUE_DEFAULT: return "CUBLASLT_EPILOGUE_DEFAULT";
    case CUBLASLT_EPILOGUE_RELU: return "CUBLASLT_EPILOGUE_RELU";
    default: return "CUBLASLT_EPILOGUE_BIAS";
  }
}

// A strided batch of `count` matrices `stride` elements apart; stride 0 reads one matrix for all.
void set_batch(cublasLtMatrixLayout_t layout, int32_t count, int64_t stride) {
  BZ_CUBLAS(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
  BZ_CUBLAS(
      cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
}

template <class T>
void set_attribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const T& value) {
  BZ_CUBLAS(cublasLtMatmulDescSetAttribute(d, a, &value, sizeof(value)));
}

template <class T>
T algo_config(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t a) {
  T value{};
  size_t written = 0;
  BZ_CUBLAS(cublasLtMatmulAlgoConfigGetAttribute(&algo, a, &value, sizeof(value), &written));
  return value;
}

// The heuristic's answer for one layer/dtype/math/epilogue, asked once and shared by the
// variants that each time one of its algorithms.
struct LtChoice {
  cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
  std::vector<cublasLtMatmulHeuristicResult_t> results;  // best first, usable ones only
};

using LtChoiceKey = std::tuple<const BlasLayer*, DType, Math, uint8_t>;

bool int8_gemm(const Variant& v) {
  return v.call == kLtInt8 || v.call == kLtInt8Requant || v.call == kLtInt8RequantPerColumn;
}

// QLinearMatMul's int8 GEMM: the s32 accumulator scaled by an fp32 alpha (sa·sb/sy) into s8 in the
// same call; a u8 output is the s8 data of the same bytes, and the output's zero point (a shift of
// the result) is not in the call
bool requantized(const Variant& v) { return v.call == kLtInt8Requant || v.call == kLtInt8RequantPerColumn; }

// Per-column weights' scales (sa·sb[n]/sy): cublasLt.h documents a device alpha vector's length as
// the output matrix's row count (of CUBLASLT_POINTER_MODE_DEVICE_VECTOR, whose alpha is such a
// vector), which in the column-major view (Y^T, N x M) is N, one scale per
// ONNX output column, as the weights' scales run. Beta is zero (no C), so the mode is
// CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_ZERO, which takes no batch stride: the GEMM is 2-D.
bool alpha_vector(const Variant& v) { return v.call == kLtInt8RequantPerColumn; }

// The QDQ float8 MatMul: DequantizeLinear of e4m3 activations and of constant e4m3 weights, the
// MatMul, QuantizeLinear of its result into e4m3, each with one scale, as one FP8 GEMM: A and B
// CUDA_R_8F_E4M3, CUBLAS_COMPUTE_32F, fp32 scales, the weights' and the activations' scales
// through CUBLASLT_MATMUL_DESC_A/B_SCALE_POINTER and the output's (1/s_y) through D_SCALE_POINTER
// (cublasLt.h: device pointers to one value of the compute type), an e4m3 result. cuBLAS's
// documentation of cublasLtMatmul (as NVIDIA's maintainers quote it in CUDALibrarySamples issues
// 172 and 242) asks FP8 kernels for 16-byte aligned pointers and matrix dimensions (M, N and K
// multiples of 16 for one-byte data), the "TN" form (the weights as Lt's transposed A, as the int8
// GEMM stores them), CUBLAS_COMPUTE_32F and a CUDA_R_32F scale type; for an FP8 D its type table
// lists a 16-bit C (CUDA_R_16BF here; beta is 0, so C is never read), as this project knows that
// table, not re-read here. What this cuBLASLt runs is its heuristic's answer, as for the int8 GEMM.
bool fp8_gemm(const Variant& v) { return v.call == kLtFp8; }

// FP8 Tensor Cores came with compute capability 8.9 (Ada) and 9.0 (Hopper): older GPUs have no
// FP8 GEMM to time, which is stored as unsupported, never as a latency
void require_fp8_gpu() {
  int device = 0, major = 0, minor = 0;
  BZ_CUDA(cudaGetDevice(&device));
  BZ_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  BZ_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  if (major * 10 + minor < 89)
    unsupported("cuBLASLt's FP8 GEMM needs a GPU of compute capability 8.9 or later; this one is " +
                std::to_string(major) + "." + std::to_string(minor));
}

class LtProblem : public Problem {
 public:
  LtProblem(const BlasLayer& L, const Variant& v)
      : int8_(int8_gemm(v)), requant_(requantized(v)), alpha_vector_(alpha_vector(v)), fp8_(fp8_gemm(v)),
        type_(int8_ ? CUDA_R_8I : fp8_ ? CUDA_R_8F_E4M3 : cuda_dtype(v.dtype)),
        out_type_(requant_ ? CUDA_R_8I : int8_ ? CUDA_R_32I : type_),
        alpha_{static_cast<float>(L.alpha)}, beta_{static_cast<float>(L.beta)},
        ialpha_{static_cast<int32_t>(L.alpha)}, ibeta_{static_cast<int32_t>(L.beta)} {
    if (L.batch != 1 && (int8_ || fp8_))
      throw Failure("a batched int8 or FP8 cublasLtMatmul: the generator sends 2-D ones only; regenerate the tables");
    check_broadcast(L, "cublasLtMatmul");
    lt_handle();  // no GPU: fail here, before allocating
    if (fp8_) require_fp8_gpu();
    const cublasComputeType_t compute = int8_ ? CUBLAS_COMPUTE_32I : fp8_ ? CUBLAS_COMPUTE_32F : compute_type(v);
    BZ_CUBLAS(cublasLtMatmulDescCreate(desc_.out(), compute, int8_ && !requant_ ? CUDA_R_32I : CUDA_R_32F));
    // Lt's A is ONNX's B and Lt's B is ONNX's A (the column-major view above); a layout names the
    // stored matrix, before its transpose. The int8 and FP8 GEMMs' weights are stored N x K (TN form).
    const bool trans_b = int8_ || fp8_ || L.trans_b;
    set_attribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N);
    set_attribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, L.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N);
    // the pointer mode is part of what the heuristic matches an algorithm to: set before asking it
    if (alpha_vector_)
      set_attribute(desc_, CUBLASLT_MATMUL_DESC_POINTER_MODE,
                    static_cast<int32_t>(CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_ZERO));
    if (fp8_) {
      // the scales are set before the heuristic is asked: their presence selects the scaled kernels
      scales_buf_ = filled(3, DType::F32, 0.5f, 1.0f);
      const float* scales = static_cast<const float*>(scales_buf_.get());
      set_attribute(desc_, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(scales));
      set_attribute(desc_, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(scales + 1));
      set_attribute(desc_, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, static_cast<const void*>(scales + 2));
      BZ_CUBLAS(cublasLtMatrixLayoutCreate(c_.out(), CUDA_R_16BF, L.n, L.m, L.n));
    }
    const char* what = "";
    if (!int8_ && !fp8_) {
      const cublasLtEpilogue_t ep = epilogue(v.call);
      set_attribute(desc_, CUBLASLT_MATMUL_DESC_EPILOGUE, ep);
      what = epilogue_name(ep);
    }
    BZ_CUBLAS(cublasLtMatrixLayoutCreate(a_.out(), type_, trans_b ? L.k : L.n, trans_b ? L.n : L.k,
                                         trans_b ? L.k : L.n));
    BZ_CUBLAS(cublasLtMatrixLayoutCreate(b_.out(), type_, L.trans_a ? L.m : L.k, L.trans_a ? L.k : L.m,
                                         L.trans_a ? L.m : L.k));
    BZ_CUBLAS(cublasLtMatrixLayoutCreate(d_.out(), out_type_, L.n, L.m, L.n));
    // A 1x1 convolution's images: Lt's A (ONNX's B, the image) advances by one image, Lt's B (the
    // weights) by 0, D (C too: the same layout) by one output image, which makes NCHW batches.
    if (L.batch > 1) {
      set_batch(a_, L.batch, stride_b(L));
      set_batch(b_, L.batch, stride_a(L));
      set_batch(d_, L.batch, static_cast<int64_t>(L.m) * L.n);
    }

    const LtChoice& choice = choice_for(L, v);
    if (choice.status != CUBLAS_STATUS_SUCCESS)
      check_cublas(choice.status, "cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__);
    if (v.algo >= choice.results.size()) {
      std::string why;
      if (int8_ && (L.n % 4 || L.k % 4))
        why = " (cuBLAS documents its int8 IMMA kernels for N and K multiples of 4; N=" + std::to_string(L.n) +
              ", K=" + std::to_string(L.k) + ")";
      if (fp8_ && (L.m % 16 || L.n % 16 || L.k % 16))
        why = " (cuBLAS documents its FP8 kernels for 16-byte aligned dimensions, M, N and K multiples of 16; M=" +
              std::to_string(L.m) + ", N=" + std::to_string(L.n) + ", K=" + std::to_string(L.k) + ")";
      unsupported("cublasLtMatmulAlgoGetHeuristic offered " + std::to_string(choice.results.size()) +
                  " algorithms for this GEMM, none of rank " + std::to_string(v.algo) + why);
    }
    const cublasLtMatmulHeuristicResult_t& picked = choice.results[v.algo];
    algo_ = picked.algo;
    workspace_bytes = picked.workspaceSize;

    const auto id = algo_config<int32_t>(algo_, CUBLASLT_ALGO_CONFIG_ID);
    const auto tile = algo_config<uint32_t>(algo_, CUBLASLT_ALGO_CONFIG_TILE_ID);
    const auto stages = algo_config<uint32_t>(algo_, CUBLASLT_ALGO_CONFIG_STAGES_ID);
    const auto splitk = algo_config<int32_t>(algo_, CUBLASLT_ALGO_CONFIG_SPLITK_NUM);
    implementation = std::string("cublasLtMatmul/") +
                     (int8_ ? "INT8/CUBLAS_COMPUTE_32I" : fp8_ ? "FP8_E4M3/CUBLAS_COMPUTE_32F" : what) + "/" +
                     (requant_ ? "CUDA_R_8I" : int8_ ? "CUDA_R_32I" : fp8_ ? "CUDA_R_8F_E4M3" : compute_name(compute)) +
                     (alpha_vector_ ? "/ALPHA_DEVICE_VECTOR_BETA_ZERO" : "") +
                     "/id=" + std::to_string(id) + ",tile=" + std::to_string(tile) +
                     ",stages=" + std::to_string(stages) + ",splitk=" + std::to_string(splitk);
    counters["algo"] = v.algo;
    counters["heuristic_algos"] = static_cast<double>(choice.results.size());
    counters["lt_algo_id"] = id;
    counters["lt_tile_id"] = tile;
    counters["lt_stages_id"] = stages;
    counters["lt_splitk"] = splitk;
    counters["waves"] = picked.wavesCount;
    counters["flops"] = L.work.flops;
    // the row's work counts the anchor's float elements; the FP8 GEMM moves one byte of each
    counters["bytes"] = fp8_ ? L.work.elements : bytes_of(L.work, v);

    const DType in = int8_ ? DType::I8 : fp8_ ? DType::F8E4M3 : v.dtype;
    a_buf_ = filled(size_t(L.a_count) * L.m * L.k, in);
    b_buf_ = filled(size_t(L.b_count) * L.k * L.n, in);
    y_buf_ = filled(size_t(L.batch) * L.m * L.n, requant_ ? DType::I8 : int8_ ? DType::I32 : in);
    if (fp8_) c_buf_ = filled(size_t(L.m) * L.n, DType::BF16);
    ws_buf_ = DeviceBuffer(picked.workspaceSize);
    if (alpha_vector_) alpha_buf_ = filled(L.n, DType::F32);
    if (bias_epilogue(v.call)) {
      bias_buf_ = filled(L.n, v.dtype);
      set_attribute(desc_, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias_buf_.get());
    }
  }

  void enqueue() override {
    // alpha and beta are of the scale type: int32 for CUBLAS_COMPUTE_32I with an s32 result
    const bool integer_scale = int8_ && !requant_;
    const void* alpha = alpha_vector_    ? alpha_buf_.get()
                        : integer_scale ? static_cast<const void*>(&ialpha_)
                                        : &alpha_;
    const void* beta = integer_scale ? static_cast<const void*>(&ibeta_) : &beta_;
    BZ_CUBLAS(cublasLtMatmul(lt_handle(), desc_, alpha, b_buf_.get(), a_, a_buf_.get(), b_, beta,
                             fp8_ ? c_buf_.get() : y_buf_.get(), c_layout(), y_buf_.get(), d_, &algo_, ws_buf_.get(),
                             ws_buf_.bytes(), stream()));
  }

 private:
  // C is D but for the FP8 GEMM, whose C has a 16-bit type of its own. Beta 0 never reads it; a 1x1
  // convolution's bias (beta 1) reads it in place: the time of reading the bias broadcast over
  // H*W, which a framework would hold as a constant of the model (the values are not the point)
  cublasLtMatrixLayout_t c_layout() const { return fp8_ ? c_ : d_; }

  const LtChoice& choice_for(const BlasLayer& L, const Variant& v) {
    static std::map<LtChoiceKey, LtChoice> choices;
    const LtChoiceKey key{&L, v.dtype, v.math, v.call};
    auto it = choices.find(key);
    if (it != choices.end()) return it->second;
    LtChoice c;
    LtPreference pref;
    BZ_CUBLAS(cublasLtMatmulPreferenceCreate(pref.out()));
    BZ_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                   &kLtWorkspaceLimit, sizeof(kLtWorkspaceLimit)));
    std::vector<cublasLtMatmulHeuristicResult_t> results(kLtAlgos);
    int returned = 0;
    c.status = cublasLtMatmulAlgoGetHeuristic(lt_handle(), desc_, a_, b_, c_layout(), d_, pref, kLtAlgos,
                                              results.data(), &returned);
    for (int i = 0; c.status == CUBLAS_STATUS_SUCCESS && i < returned; ++i)
      if (results[i].state == CUBLAS_STATUS_SUCCESS) c.results.push_back(results[i]);
    return choices.emplace(key, std::move(c)).first->second;
  }

  bool int8_, requant_, alpha_vector_, fp8_;
  cudaDataType_t type_, out_type_;
  float alpha_, beta_;
  int32_t ialpha_, ibeta_;
  LtMatmulDesc desc_;
  LtLayout a_, b_, c_, d_;
  cublasLtMatmulAlgo_t algo_{};
  DeviceBuffer a_buf_, b_buf_, y_buf_, c_buf_, bias_buf_, ws_buf_, alpha_buf_, scales_buf_;
};

std::unique_ptr<Problem> make_blas(const BlasLayer& L, const Variant& v) {
  if (bias_epilogue(v.call) || v.call == kLtGemm || v.call == kLtRelu || int8_gemm(v) || fp8_gemm(v))
    return std::make_unique<LtProblem>(L, v);
  return std::make_unique<BlasProblem>(L, v);
}

}  // namespace

void add_blas(Registry& r, const BlasLayer* layers, const Variant* variants, size_t count) {
  add_family(r, layers, variants, count, make_blas);
}

}  // namespace benanza::cudnn
