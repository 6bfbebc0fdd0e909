// The data the generator emits for the cuDNN/cuBLAS backend: one table of layer parameters per
// family and one table of variants (benchmarks) over it.
//
// This header is all a generated table includes: no CUDA, cuDNN, cuBLAS or Google Benchmark
// headers, so the thousands of table rows compile in seconds. The Python side
// (benanza/backends/cudnn.py) writes the rows with designated initializers in declaration
// order, so a field added here without the generator following fails to compile.
#pragma once

#include <cstddef>
#include <cstdint>

namespace benanza {
class Registry;
}

namespace benanza::cudnn {

// I8, U8: an int8 layer's own type (MatMulInteger on cuBLASLt); I32, I64 only as a tensor's type
// in a quantized layer's row (QuantLayer.source), never a variant's. Bool: ONNX bool, one byte 0/1
// (the graph API's BYTE_BOOLEAN, cuDNN 9.25+): a mask's And, Or, a Cast into bool. F8E4M3: ONNX's
// FLOAT8E4M3FN, only as the FP8 GEMM's operands inside the runtime (blas.cpp), never a variant's
enum class DType : uint8_t { F32, F16, BF16, I8, U8, I32, Bool, I64, F8E4M3 };
enum class Layout : uint8_t { NCHW, NHWC };
// One vocabulary for cuDNN and cuBLAS (benanza/backends/cudnn.py MATHS):
//   Default      the call has no math setting (pooling, activations, ...)
//   Fma          no Tensor Cores, no TF32: CUDNN_FMA_MATH; cuBLAS CUBLAS_COMPUTE_32F for fp32
//                data, CUBLAS_COMPUTE_32F_PEDANTIC for 16-bit data
//   Tf32Allowed  fp32 data, the library may use TF32 Tensor Cores (PyTorch's default for cuDNN
//                convolutions): CUDNN_DEFAULT_MATH; cuBLAS CUBLAS_COMPUTE_32F_FAST_TF32
//   TensorOp     16-bit data on Tensor Cores, fp32 accumulation: CUDNN_TENSOR_OP_MATH;
//                cuBLAS CUBLAS_COMPUTE_32F
enum class Math : uint8_t { Default, Fma, Tf32Allowed, TensorOp };

// Which library call a variant times, per family (the `call` field of Variant).
constexpr uint8_t kCall = 0;  // the family's only call
constexpr uint8_t kConvForward = 0;         // cudnnConvolutionForward (+ cudnnAddTensor if bias)
constexpr uint8_t kConvBiasIdentity = 1;    // cudnnConvolutionBiasActivationForward, IDENTITY
constexpr uint8_t kConvBiasRelu = 2;        // cudnnConvolutionBiasActivationForward, RELU
constexpr uint8_t kGemmEx = 0;              // cublasGemmEx
constexpr uint8_t kGemmStridedBatchedEx = 1;  // cublasGemmStridedBatchedEx
constexpr uint8_t kSgemv = 2;               // cublasSgemv
constexpr uint8_t kLtBias = 3;              // cublasLtMatmul, CUBLASLT_EPILOGUE_BIAS
constexpr uint8_t kLtBiasGelu = 4;          // cublasLtMatmul, CUBLASLT_EPILOGUE_GELU_BIAS
constexpr uint8_t kLtBiasRelu = 5;          // cublasLtMatmul, CUBLASLT_EPILOGUE_RELU_BIAS
constexpr uint8_t kLtInt8 = 6;              // cublasLtMatmul, s8 operands, CUBLAS_COMPUTE_32I, s32 result
// cublasLtMatmul, s8 operands, CUBLAS_COMPUTE_32I, an fp32 alpha (the requantization scale), s8 result
constexpr uint8_t kLtInt8Requant = 7;
// kLtInt8Requant with per-column weights' scales: alpha a device vector of N fp32 values
// (CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_ZERO)
constexpr uint8_t kLtInt8RequantPerColumn = 8;
// cublasLtMatmul, FP8 (CUDA_R_8F_E4M3) operands and result, CUBLAS_COMPUTE_32F, per-tensor scales
// through the A/B/D scale pointers (the qdq_fp8_matmul pattern; GPUs of compute capability 8.9+)
constexpr uint8_t kLtFp8 = 9;
// cublasLtMatmul of a 1x1 convolution on its NCHW data (benanza/ops/conv.py gemm_row), its bias, if
// any, as C (beta 1): CUBLASLT_EPILOGUE_DEFAULT, or CUBLASLT_EPILOGUE_RELU for a fused ReLU
constexpr uint8_t kLtGemm = 10;
constexpr uint8_t kLtRelu = 11;
// graph families: a fusion pattern's form of the row (see graph.cpp)
constexpr uint8_t kGeluOfA = 1;             // pointwise: the erf GELU of operand a (gelu_erf pattern)
constexpr uint8_t kSdpaMasked = 1;          // sdpa: add an [s_q, s_kv] mask (an attention pattern's Add)
constexpr uint8_t kSdpaUnscaled = 2;        // sdpa: scale 1 (a pattern without the scale's Mul/Div)
constexpr uint8_t kSdpaUnscaledMasked = 3;  // both
// qconv: a float convolution (a Conv's graph-API variants) instead of the int8 graph; bit 1
// puts its tensors channels-last, bit 2 deselects the engines with Tensor Cores or
// down-converted inputs (math fma, as PyTorch does with TF32 off)
constexpr uint8_t kConvGraph = 1;
constexpr uint8_t kConvGraphNhwc = kConvGraph | 2;
constexpr uint8_t kConvGraphFma = kConvGraph | 4;
constexpr uint8_t kConvGraphNhwcFma = kConvGraph | 2 | 4;

// One benchmark. `layer` indexes the family's layer table; `algo` is the cudnnConvolutionFwdAlgo_t
// value for convolutions, the rank of the algorithm in cublasLtMatmulAlgoGetHeuristic's answer
// (0 = its first choice) for cublasLtMatmul, and 0 elsewhere.
struct Variant {
  const char* name;  // exactly records.Variant.name
  uint32_t layer;
  uint8_t call;
  uint8_t algo;
  DType dtype;
  Layout layout;
  Math math;
};

// Every layer row carries the work it does, for the flops/bytes counters. `elements` is the
// number of tensor elements read and written; bytes follow from the variant's data type.
struct Work {
  double flops;
  double elements;
};

// Pads are ONNX's [top, left, bottom, right]; cuDNN's legacy API is symmetric, so the runtime
// uses max(top, bottom) x max(left, right) and reports the rows/columns it added. A transposed
// convolution's row (add_deconv) reads from its output's side: (n, c, h, w) is its input,
// (k, out_h, out_w) its output, (c, k / groups, r, s) its weight, and its begin pads are cuDNN's.
struct ConvLayer {
  int n, c, h, w, k, r, s;
  int pad_t, pad_l, pad_b, pad_r;
  int stride_h, stride_w, dil_h, dil_w, groups;
  int out_h, out_w;
  bool bias;
  Work work;
};

enum class PoolMode : uint8_t { Max, AvgIncludePad, AvgExcludePad };

struct PoolLayer {
  PoolMode mode;
  int n, c, h, w, out_h, out_w, kh, kw, stride_h, stride_w;
  int pad_t, pad_l, pad_b, pad_r, dil_h, dil_w;
  Work work;
};

struct BnormLayer {
  int n, c, h, w;
  double eps;
  Work work;
};

struct LrnLayer {
  int n, c, h, w, size;
  double alpha, beta, k;
  Work work;
};

enum class ActMode : uint8_t { Relu, Sigmoid, Tanh, Elu, ClippedRelu, Swish };

// Element-wise tensors are folded to 4-d NCHW; the shape does not change the work.
struct ActLayer {
  ActMode mode;
  int n, c, h, w;
  double coef;  // ELU alpha, clipped-ReLU ceiling, swish beta
  Work work;
};

// Softmax over the C axis of an N x C x H x 1 view (cuDNN's CHANNEL mode).
struct SoftmaxLayer {
  bool log;
  int n, c, h;
  Work work;
};

struct DropoutLayer {
  int n, c, h, w;
  double ratio;
  Work work;
};

// Binary element-wise ops. Shapes are right-aligned to `rank` (4 or 5) dims with leading 1s.
// cuDNN wants `a` in the output's shape and `b` broadcasting into it (the generator swaps the
// operands for that); a layer where neither operand has the output's shape is refused at run time.
// Sqrt is cudnnOpTensor's unary op: a, b and out share one shape and b is ignored.
enum class BinaryOp : uint8_t { AddTensor, Add, Sub, Mul, Min, Max, Scale, Sqrt };

struct BinaryLayer {
  BinaryOp op;
  bool swapped;  // operands were swapped: a subtraction then negates the other side
  int rank;
  int a[5], b[5], out[5];
  Work work;
};

enum class Cell : uint8_t { Lstm, Gru, RnnTanh, RnnRelu };

struct RnnLayer {
  Cell cell;
  int seq, batch, input, hidden, dirs;
  bool bias;
  Work work;
};

// Row-major ONNX matrices: Y[m x n] = alpha * op(A)[m x k] * op(B)[k x n] + beta * C, over
// `batch` matrices. a_count/b_count are how many A/B matrices are stored: `batch` (one per
// product) or 1 (broadcast); anything else is a broadcast strided-batched GEMM cannot express.
struct BlasLayer {
  int m, n, k;
  bool trans_a, trans_b;
  int batch, a_count, b_count;
  double alpha, beta;
  Work work;
};

// Data movement with no cuDNN op of its own (Slice, Split, Gather, Expand, Where, Trilu, Concat), timed
// as cudnnTransformTensor copies of the same bytes, one per output, and Transpose, one copy of
// the input into the permuted layout. Dims are right-aligned to `rank` (4..8) with leading 1s.
// `region`: output i is the box outs[i] of a `src` tensor at offset at[i] (in src's dims), its
// dim d read through src's stride of dim perm[d] (the identity but for a Transpose); otherwise
// each output is copied from a packed tensor of its own shape. `into` (Concat) turns a region
// around: box i of the `src`-shaped output is written from a packed tensor of its own shape.
struct CopyLayer {
  bool region, into;
  int rank, count;
  int src[8];
  int outs[8][8], at[8][8];
  int perm[8];
  Work work;
};

// A reduction: C = op(A) over the axes where dst has 1 and src does not (cudnnReduceTensor,
// fp32 accumulation, no indices). Dims are right-aligned to `rank` (4..8) with leading 1s.
enum class ReduceOp : uint8_t { Add, Avg, Max, Min, Mul, Norm1, Norm2 };

struct ReduceLayer {
  ReduceOp op;
  int rank;
  int src[8], dst[8];
  Work work;
};

// ONNX Pad, constant 0: `before` and `after` elements added to each of `rank` (4 or 5) dims of
// `src`, right-aligned with leading 1s (pads 0); cudnnTransformTensorEx writes the zeros.
struct PadLayer {
  int rank;
  int src[8], before[8], after[8];
  Work work;
};

// --- the cuDNN graph API (cudnn_frontend) families ------------------------------------------
// A graph variant's `algo` is a plan slot: the slot-th distinct engine config that the
// heuristics (mode A, then fallback) return for the graph of its layer and data type. A slot
// past their count is refused ("unsupported") before anything is allocated.

// Layer normalization, inference (no statistics written): each of `rows` rows of `cols`
// elements normalised, scaled and (if `bias`) shifted by fp32 parameters of `cols`.
// `rms`: RMS normalization (the graph API's RMS norm node: no mean, no bias).
struct LnormLayer {
  int rows, cols;
  double eps;
  bool bias;
  bool rms;
  Work work;
};

// Scaled dot-product attention, forward inference (flash attention): O = softmax(scale * Q Kᵀ
// [+ mask] [causal]) V over b x h heads; `mask` adds one [s_q, s_kv] tensor to every head.
// h_kv: K's and V's heads, dividing h (fewer: grouped-query attention, which the frontend's SDPA
// takes as it is)
struct SdpaLayer {
  int b, h, h_kv, s_q, s_kv, d_qk, d_v;
  double scale;
  bool mask, causal;
  Work work;
};

// One pointwise node. Shapes are right-aligned to `rank` (3..8) dims with leading 1s; `b`
// broadcasts into `out` (a unary op has rank-0 `b`, all zeros). Comparisons write booleans; And,
// Or read and write them (the variant's type is Bool).
// HardSigmoid, max(0, min(1, alpha·x + beta)), is a chain: no single pointwise mode computes it.
// IsNan (unary, writes booleans): no pointwise mode either; CMP_NEQ of A with itself (x ≠ x only
// for NaN), one tensor bound to both operands.
enum class PointwiseOp : uint8_t {
  Div, Pow, CmpEq, CmpGt, CmpLt, Erf, Gelu, GeluTanh, Exp, Log, Abs, Neg, Softplus, Reciprocal, Cos, Sin,
  HardSigmoid, And, Or, IsNan
};

struct PointwiseLayer {
  PointwiseOp op;
  bool binary;
  int rank;
  int a[8], b[8], out[8];
  double alpha, beta;  // HardSigmoid's; 0 for the other ops
  Work work;
};

// Rotary position embedding (RoPE) as graph-API pointwise nodes: x (dims right-aligned to `rank`,
// padded with 0s to 8) rotated over the first `rot` features of its last dim, the pairs (a, b)
// being its two halves or (`interleaved`) adjacent features: (a·cos − b·sin, b·cos + a·sin), the
// features past `rot` copied (an IDENTITY node). cos and sin have dims `cs` each, broadcast into
// x's, last dim `rot` (each half its own values) or rot/2 (both halves share them). The halves
// are strided views of one x and one y buffer, as the tensors lie in a model.
struct RopeLayer {
  int rank;
  int x[8], cs[8];
  int rot;
  bool interleaved;
  Work work;
};

// Quantization's element-wise layers as graph-API nodes (graph.cpp), in the variant's float type:
//   Convert          Cast from `source` into the variant's type: a pointwise IDENTITY node
//   NonZero          Cast from `source` into bool (the variant's type): CMP_NEQ with 0 (by value)
//   Dequantize       (x - zero point) · scale, x of `source` (int8/uint8/int32), the scale (and
//                    zero point, `zp`) of shape `scale` broadcast into `in`: pointwise SUB, MUL
//   Quantize         ONNX QuantizeLinear: x / scale (+ zero point), x of the variant's float type
//                    written as `source` (int8/uint8/int32), scale and zero point as Dequantize's:
//                    pointwise DIV (, ADD)
//   DynamicQuantize  ONNX DynamicQuantizeLinear of a float `in` into uint8: two graphs timed back
//                    to back, the MAX and MIN reductions to [1], then the quantization pointwise
//                    (x / scale + zero point, rounded and clipped into [0, 255], written as uint8)
//                    with the scale and zero point as [1] tensors
enum class QuantOp : uint8_t { Convert, Dequantize, DynamicQuantize, NonZero, Quantize };

struct QuantLayer {
  QuantOp op;
  DType source;
  bool zp;
  int rank;
  int in[8], scale[8];
  Work work;
};

// ConvInteger and QLinearConv as one graph: cuDNN's int8 convolution (graph.cpp). ConvLayer's
// fields (the graph API pads each end on its own: the pads are exact), then `requant`:
// QLinearConv's epilogue, the s32 accumulator scaled by the `bscales` weights' scales (1, or one
// per output channel) and offset per output channel into s8, instead of ConvInteger's s32
// result. `bias` (QLinearConv's int32 bias) has no node of its own: it is part of the offset.
// A float Conv's row (calls kConvGraph*) has requant false and adds `bias` after the graph.
struct QconvLayer {
  int n, c, h, w, k, r, s;
  int pad_t, pad_l, pad_b, pad_r;
  int stride_h, stride_w, dil_h, dil_w, groups;
  int out_h, out_w;
  bool bias;
  bool requant;
  int bscales;
  Work work;
};

// ONNX Resize (nearest or linear) by 2 on both spatial dims of N x C x H x W, as one resample node
// in NHWC: the graph API's resample, which defines an output by a window, strides and pads; the
// runtime uses the one configuration cuDNN's engines are reported to take for upsampling by 2
// (graph.cpp). `linear`: BILINEAR, else NEAREST.
struct ResampleLayer {
  bool linear;
  int n, c, h, w, out_h, out_w;
  Work work;
};

// Registration entry points the generated tables call, one per family (defined in the runtime).
void add_conv(Registry& r, const ConvLayer* layers, const Variant* variants, size_t count);
void add_deconv(Registry& r, const ConvLayer* layers, const Variant* variants, size_t count);
void add_pool(Registry& r, const PoolLayer* layers, const Variant* variants, size_t count);
void add_bnorm(Registry& r, const BnormLayer* layers, const Variant* variants, size_t count);
void add_lrn(Registry& r, const LrnLayer* layers, const Variant* variants, size_t count);
void add_activation(Registry& r, const ActLayer* layers, const Variant* variants, size_t count);
void add_softmax(Registry& r, const SoftmaxLayer* layers, const Variant* variants, size_t count);
void add_dropout(Registry& r, const DropoutLayer* layers, const Variant* variants, size_t count);
void add_binary(Registry& r, const BinaryLayer* layers, const Variant* variants, size_t count);
void add_rnn(Registry& r, const RnnLayer* layers, const Variant* variants, size_t count);
void add_blas(Registry& r, const BlasLayer* layers, const Variant* variants, size_t count);
void add_copy(Registry& r, const CopyLayer* layers, const Variant* variants, size_t count);
void add_reduce(Registry& r, const ReduceLayer* layers, const Variant* variants, size_t count);
void add_pad(Registry& r, const PadLayer* layers, const Variant* variants, size_t count);
void add_lnorm(Registry& r, const LnormLayer* layers, const Variant* variants, size_t count);
void add_sdpa(Registry& r, const SdpaLayer* layers, const Variant* variants, size_t count);
void add_pointwise(Registry& r, const PointwiseLayer* layers, const Variant* variants, size_t count);
void add_quant(Registry& r, const QuantLayer* layers, const Variant* variants, size_t count);
void add_rope(Registry& r, const RopeLayer* layers, const Variant* variants, size_t count);
void add_resample(Registry& r, const ResampleLayer* layers, const Variant* variants, size_t count);
void add_qconv(Registry& r, const QconvLayer* layers, const Variant* variants, size_t count);

// Defined by the generated registry.cpp: registers every family table of this build.
void register_generated(Registry& r);

// Defined by the generated registry.cpp: metrics asked for with `generate --cupti-metric`
// (the list always ends with nullptr, which kCuptiMetricCount does not count).
extern const char* const kCuptiMetrics[];
extern const size_t kCuptiMetricCount;

}  // namespace benanza::cudnn
