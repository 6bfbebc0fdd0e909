// The single-call cuDNN families: pooling, batch normalization (inference), LRN, activation,
// softmax, dropout, the binary tensor ops (cudnnAddTensor, cudnnOpTensor, cudnnScaleTensor),
// data movement as cudnnTransformTensor copies, and reductions (cudnnReduceTensor).
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "benanza_cudnn/harness.hpp"

namespace benanza::cudnn {
namespace {

const Scale kOne{1.0f}, kZero{0.0f};

size_t count4(int n, int c, int h, int w) { return size_t(n) * c * h * w; }

// Shared by the families that read x and write y of one 4-d shape.
class UnaryProblem : public Problem {
 protected:
  UnaryProblem(const Variant& v, int n, int c, int h, int w, const Work& work, const char* api) {
    set_tensor4d(x_, v.layout, v.dtype, n, c, h, w);
    x_buf_ = filled(count4(n, c, h, w), v.dtype);
    implementation = api;
    counters["flops"] = work.flops;
    counters["bytes"] = bytes_of(work, v);
  }
  void set_output(const Variant& v, int n, int c, int h, int w) {
    set_tensor4d(y_, v.layout, v.dtype, n, c, h, w);
    y_buf_ = filled(count4(n, c, h, w), v.dtype);
  }

  TensorDesc x_, y_;
  DeviceBuffer x_buf_, y_buf_;
};

// --- pooling ---------------------------------------------------------------------------

class PoolProblem : public UnaryProblem {
 public:
  PoolProblem(const PoolLayer& L, const Variant& v)
      : UnaryProblem(v, L.n, L.c, L.h, L.w, L.work, "cudnnPoolingForward") {
    if (L.dil_h != 1 || L.dil_w != 1)
      unsupported("cudnnPoolingForward has no dilation (dilations " + std::to_string(L.dil_h) + "x" +
                  std::to_string(L.dil_w) + ")");
    const cudnnPoolingMode_t mode = L.mode == PoolMode::Max             ? CUDNN_POOLING_MAX
                                    : L.mode == PoolMode::AvgIncludePad ? CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING
                                                                        : CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING;
    const int pad_h = std::max(L.pad_t, L.pad_b), pad_w = std::max(L.pad_l, L.pad_r);
    BZ_CUDNN(cudnnSetPooling2dDescriptor(pool_, mode, CUDNN_NOT_PROPAGATE_NAN, L.kh, L.kw, pad_h, pad_w,
                                         L.stride_h, L.stride_w));
    int n, c, h, w;
    BZ_CUDNN(cudnnGetPooling2dForwardOutputDim(pool_, x_, &n, &c, &h, &w));
    set_output(v, n, c, h, w);
    if (L.pad_t != L.pad_b || L.pad_l != L.pad_r)
      counters["pad_added"] = (2 * pad_h - L.pad_t - L.pad_b) + (2 * pad_w - L.pad_l - L.pad_r);
    if (h != L.out_h || w != L.out_w) {
      // ceil_mode or asymmetric pads: cuDNN's floor formula gives another output size
      counters["output_extra_rows"] = h - L.out_h;
      counters["output_extra_cols"] = w - L.out_w;
    }
  }
  void enqueue() override {
    BZ_CUDNN(cudnnPoolingForward(cudnn_handle(), pool_, kOne.ptr(), x_, x_buf_.get(), kZero.ptr(), y_,
                                 y_buf_.get()));
  }

 private:
  PoolingDesc pool_;
};

// --- batch normalization (inference) ---------------------------------------------------

class BnormProblem : public UnaryProblem {
 public:
  BnormProblem(const BnormLayer& L, const Variant& v)
      : UnaryProblem(v, L.n, L.c, L.h, L.w, L.work, "cudnnBatchNormalizationForwardInference"),
        eps_(std::max(L.eps, CUDNN_BN_MIN_EPSILON)) {
    set_output(v, L.n, L.c, L.h, L.w);
    BZ_CUDNN(cudnnDeriveBNTensorDescriptor(param_, x_, CUDNN_BATCHNORM_SPATIAL));
    // The derived descriptor is fp32 for fp32, fp16 and bf16 data alike.
    scale_ = filled(L.c, DType::F32);
    bias_ = filled(L.c, DType::F32);
    mean_ = filled(L.c, DType::F32);
    var_ = filled(L.c, DType::F32, 0.5f, 1.5f);
  }
  void enqueue() override {
    BZ_CUDNN(cudnnBatchNormalizationForwardInference(
        cudnn_handle(), CUDNN_BATCHNORM_SPATIAL, kOne.ptr(), kZero.ptr(), x_, x_buf_.get(), y_, y_buf_.get(),
        param_, scale_.get(), bias_.get(), mean_.get(), var_.get(), eps_));
  }

 private:
  double eps_;
  TensorDesc param_;
  DeviceBuffer scale_, bias_, mean_, var_;
};

// --- LRN -------------------------------------------------------------------------------

class LrnProblem : public UnaryProblem {
 public:
  LrnProblem(const LrnLayer& L, const Variant& v)
      : UnaryProblem(v, L.n, L.c, L.h, L.w, L.work, "cudnnLRNCrossChannelForward") {
    set_output(v, L.n, L.c, L.h, L.w);
    // ONNX and cuDNN share the formula x / (k + alpha/size * sum(x^2))^beta.
    BZ_CUDNN(cudnnSetLRNDescriptor(lrn_, static_cast<unsigned>(L.size), L.alpha, L.beta, L.k));
  }
  void enqueue() override {
    BZ_CUDNN(cudnnLRNCrossChannelForward(cudnn_handle(), lrn_, CUDNN_LRN_CROSS_CHANNEL_DIM1, kOne.ptr(), x_,
                                         x_buf_.get(), kZero.ptr(), y_, y_buf_.get()));
  }

 private:
  LrnDesc lrn_;
};

// --- activation ------------------------------------------------------------------------

cudnnActivationMode_t activation_mode(ActMode m) {
  switch (m) {
    case ActMode::Relu: return CUDNN_ACTIVATION_RELU;
    case ActMode::Sigmoid: return CUDNN_ACTIVATION_SIGMOID;
    case ActMode::Tanh: return CUDNN_ACTIVATION_TANH;
    case ActMode::Elu: return CUDNN_ACTIVATION_ELU;
    case ActMode::ClippedRelu: return CUDNN_ACTIVATION_CLIPPED_RELU;
    case ActMode::Swish: return CUDNN_ACTIVATION_SWISH;
  }
  return CUDNN_ACTIVATION_RELU;
}

class ActivationProblem : public UnaryProblem {
 public:
  ActivationProblem(const ActLayer& L, const Variant& v)
      : UnaryProblem(v, L.n, L.c, L.h, L.w, L.work, "cudnnActivationForward") {
    set_output(v, L.n, L.c, L.h, L.w);
    BZ_CUDNN(cudnnSetActivationDescriptor(act_, activation_mode(L.mode), CUDNN_NOT_PROPAGATE_NAN, L.coef));
    if (L.mode == ActMode::Swish) BZ_CUDNN(cudnnSetActivationDescriptorSwishBeta(act_, L.coef));
  }
  void enqueue() override {
    BZ_CUDNN(cudnnActivationForward(cudnn_handle(), act_, kOne.ptr(), x_, x_buf_.get(), kZero.ptr(), y_,
                                    y_buf_.get()));
  }

 private:
  ActivationDesc act_;
};

// --- softmax ---------------------------------------------------------------------------

class SoftmaxProblem : public UnaryProblem {
 public:
  SoftmaxProblem(const SoftmaxLayer& L, const Variant& v)
      : UnaryProblem(v, L.n, L.c, L.h, 1, L.work, "cudnnSoftmaxForward"),
        algo_(L.log ? CUDNN_SOFTMAX_LOG : CUDNN_SOFTMAX_ACCURATE) {
    set_output(v, L.n, L.c, L.h, 1);
  }
  void enqueue() override {
    BZ_CUDNN(cudnnSoftmaxForward(cudnn_handle(), algo_, CUDNN_SOFTMAX_MODE_CHANNEL, kOne.ptr(), x_, x_buf_.get(),
                                 kZero.ptr(), y_, y_buf_.get()));
  }

 private:
  cudnnSoftmaxAlgorithm_t algo_;
};

// --- dropout ---------------------------------------------------------------------------

class DropoutProblem : public UnaryProblem {
 public:
  DropoutProblem(const DropoutLayer& L, const Variant& v)
      : UnaryProblem(v, L.n, L.c, L.h, L.w, L.work, "cudnnDropoutForward") {
    set_output(v, L.n, L.c, L.h, L.w);
    size_t states = 0, reserve = 0;
    BZ_CUDNN(cudnnDropoutGetStatesSize(cudnn_handle(), &states));
    states_ = DeviceBuffer(states);
    BZ_CUDNN(cudnnSetDropoutDescriptor(dropout_, cudnn_handle(), static_cast<float>(L.ratio), states_.get(),
                                       states, 1234ULL));
    BZ_CUDNN(cudnnDropoutGetReserveSpaceSize(x_, &reserve));
    reserve_ = DeviceBuffer(reserve);
    workspace_bytes = reserve;
  }
  void enqueue() override {
    BZ_CUDNN(cudnnDropoutForward(cudnn_handle(), dropout_, x_, x_buf_.get(), y_, y_buf_.get(), reserve_.get(),
                                 reserve_.bytes()));
  }

 private:
  DropoutDesc dropout_;
  DeviceBuffer states_, reserve_;
};

// --- binary tensor ops -----------------------------------------------------------------

void set_tensor_nd(cudnnTensorDescriptor_t d, DType type, int rank, const int* dims) {
  int strides[5];
  int stride = 1;
  for (int i = rank - 1; i >= 0; --i) {
    strides[i] = stride;
    stride *= dims[i];
  }
  BZ_CUDNN(cudnnSetTensorNdDescriptor(d, cudnn_dtype(type), rank, dims, strides));
}

size_t numel(int rank, const int* dims) {
  size_t n = 1;
  for (int i = 0; i < rank; ++i) n *= dims[i];
  return n;
}

class BinaryProblem : public Problem {
 public:
  BinaryProblem(const BinaryLayer& L, const Variant& v) : op_(L.op), swapped_(L.swapped) {
    if (!std::equal(L.a, L.a + L.rank, L.out))
      unsupported("cuDNN tensor ops need one operand in the output's shape; both inputs broadcast here");
    set_tensor_nd(a_, v.dtype, L.rank, L.a);
    set_tensor_nd(b_, v.dtype, L.rank, L.b);
    a_buf_ = filled(numel(L.rank, L.a), v.dtype);
    b_buf_ = filled(numel(L.rank, L.b), v.dtype);
    c_buf_ = filled(numel(L.rank, L.a), v.dtype);
    counters["flops"] = L.work.flops;
    counters["bytes"] = bytes_of(L.work, v);
    if (op_ == BinaryOp::AddTensor) {
      implementation = "cudnnAddTensor";
    } else if (op_ == BinaryOp::Scale) {
      implementation = "cudnnScaleTensor";
    } else {
      implementation = "cudnnOpTensor";
      const cudnnOpTensorOp_t op = op_ == BinaryOp::Mul   ? CUDNN_OP_TENSOR_MUL
                                   : op_ == BinaryOp::Min ? CUDNN_OP_TENSOR_MIN
                                   : op_ == BinaryOp::Max ? CUDNN_OP_TENSOR_MAX
                                   : op_ == BinaryOp::Sqrt ? CUDNN_OP_TENSOR_SQRT
                                                          : CUDNN_OP_TENSOR_ADD;  // Sub: ADD, one side negated
      BZ_CUDNN(cudnnSetOpTensorDescriptor(optensor_, op, CUDNN_DATA_FLOAT, CUDNN_NOT_PROPAGATE_NAN));
    }
  }
  void enqueue() override {
    switch (op_) {
      case BinaryOp::AddTensor:
        // a += b in place, b broadcast: how frameworks add a bias
        BZ_CUDNN(cudnnAddTensor(cudnn_handle(), kOne.ptr(), b_, b_buf_.get(), kOne.ptr(), a_, a_buf_.get()));
        return;
      case BinaryOp::Scale: {
        // The scalar's value is not part of the layer; -1 keeps the data from drifting.
        const Scale minus_one{-1.0f};
        BZ_CUDNN(cudnnScaleTensor(cudnn_handle(), a_, a_buf_.get(), minus_one.ptr()));
        return;
      }
      default: {
        const bool sub = op_ == BinaryOp::Sub;
        const Scale alpha1{sub && swapped_ ? -1.0f : 1.0f}, alpha2{sub && !swapped_ ? -1.0f : 1.0f};
        BZ_CUDNN(cudnnOpTensor(cudnn_handle(), optensor_, alpha1.ptr(), a_, a_buf_.get(), alpha2.ptr(), b_,
                               b_buf_.get(), kZero.ptr(), a_, c_buf_.get()));
      }
    }
  }

 private:
  BinaryOp op_;
  bool swapped_;
  TensorDesc a_, b_;
  OpTensorDesc optensor_;
  DeviceBuffer a_buf_, b_buf_, c_buf_;
};

// --- data movement: cudnnTransformTensor copies of the same bytes ----------------------------

std::vector<int> packed_strides(const int* dims, int rank) {
  std::vector<int> s(rank);
  int stride = 1;
  for (int d = rank; d-- > 0;) {
    s[d] = stride;
    stride *= dims[d];
  }
  return s;
}

bool permuted(const CopyLayer& L) {
  for (int d = 0; d < L.rank; ++d)
    if (L.perm[d] != d) return true;
  return false;
}

class CopyProblem : public Problem {
 public:
  CopyProblem(const CopyLayer& L, const Variant& v) {
    implementation = permuted(L) ? "cudnnTransformTensor (data-movement copy, transposed)"
                                 : "cudnnTransformTensor (data-movement copy)";
    counters["flops"] = L.work.flops;
    counters["bytes"] = bytes_of(L.work, v);
    const size_t elt = dtype_size(v.dtype);
    std::vector<int> src_strides = packed_strides(L.src, L.rank);
    if (L.region) src_buf_ = filled(numel(L.rank, L.src), v.dtype);
    for (int i = 0; i < L.count; ++i) {
      std::vector<int> out_strides = packed_strides(L.outs[i], L.rank);
      auto from = std::make_unique<TensorDesc>();
      auto to = std::make_unique<TensorDesc>();
      if (L.into) {  // Concat: a packed input written into its box of the output, through its strides
        size_t offset = 0;
        for (int d = 0; d < L.rank; ++d) offset += size_t(L.at[i][d]) * src_strides[d];
        BZ_CUDNN(cudnnSetTensorNdDescriptor(*from, cudnn_dtype(v.dtype), L.rank, L.outs[i], out_strides.data()));
        BZ_CUDNN(cudnnSetTensorNdDescriptor(*to, cudnn_dtype(v.dtype), L.rank, L.outs[i], src_strides.data()));
        dense_src_.push_back(filled(numel(L.rank, L.outs[i]), v.dtype));
        sources_.push_back(dense_src_.back().get());
        dests_.push_back(static_cast<char*>(src_buf_.get()) + offset * elt);
        from_.push_back(std::move(from));
        to_.push_back(std::move(to));
        continue;
      }
      BZ_CUDNN(cudnnSetTensorNdDescriptor(*to, cudnn_dtype(v.dtype), L.rank, L.outs[i], out_strides.data()));
      const char* source;
      if (L.region) {  // the box at its offset, read through the input's (permuted) strides
        std::vector<int> read(L.rank);
        for (int d = 0; d < L.rank; ++d) read[d] = src_strides[L.perm[d]];
        BZ_CUDNN(cudnnSetTensorNdDescriptor(*from, cudnn_dtype(v.dtype), L.rank, L.outs[i], read.data()));
        size_t offset = 0;
        for (int d = 0; d < L.rank; ++d) offset += size_t(L.at[i][d]) * src_strides[d];
        source = static_cast<const char*>(src_buf_.get()) + offset * elt;
      } else {
        BZ_CUDNN(cudnnSetTensorNdDescriptor(*from, cudnn_dtype(v.dtype), L.rank, L.outs[i], out_strides.data()));
        dense_src_.push_back(filled(numel(L.rank, L.outs[i]), v.dtype));
        source = static_cast<const char*>(dense_src_.back().get());
      }
      dst_buf_.push_back(filled(numel(L.rank, L.outs[i]), v.dtype));
      dests_.push_back(dst_buf_.back().get());
      sources_.push_back(source);
      from_.push_back(std::move(from));
      to_.push_back(std::move(to));
    }
  }
  void enqueue() override {
    for (size_t i = 0; i < to_.size(); ++i)
      BZ_CUDNN(cudnnTransformTensor(cudnn_handle(), kOne.ptr(), *from_[i], sources_[i], kZero.ptr(), *to_[i],
                                    dests_[i]));
  }

 private:
  DeviceBuffer src_buf_;
  std::vector<DeviceBuffer> dense_src_, dst_buf_;
  std::vector<const void*> sources_;
  std::vector<void*> dests_;
  std::vector<std::unique_ptr<TensorDesc>> from_, to_;
};

// --- constant padding: cudnnTransformTensorEx ----------------------------------------------

// ONNX Pad in constant mode with value 0 (the generator covers no other): the transform
// descriptor's pads before and after each dim, the output descriptor the one cuDNN derives
// from it, which must have the padded dims.
class PadProblem : public Problem {
 public:
  PadProblem(const PadLayer& L, const Variant& v) {
    implementation = "cudnnTransformTensorEx";
    counters["flops"] = L.work.flops;
    counters["bytes"] = bytes_of(L.work, v);
    // the device first: without one, the transform descriptor's sublibrary does not even load
    x_buf_ = filled(numel(L.rank, L.src), v.dtype);
    std::vector<int> strides = packed_strides(L.src, L.rank);
    BZ_CUDNN(cudnnSetTensorNdDescriptor(x_, cudnn_dtype(v.dtype), L.rank, L.src, strides.data()));
    BZ_CUDNN(cudnnSetTensorTransformDescriptor(transform_, static_cast<uint32_t>(L.rank), CUDNN_TENSOR_NCHW,
                                               L.before, L.after, nullptr, CUDNN_TRANSFORM_FOLD));
    size_t bytes = 0;
    BZ_CUDNN(cudnnInitTransformDest(transform_, x_, y_, &bytes));
    cudnnDataType_t type;
    int rank = 0, dims[8], out_strides[8];
    BZ_CUDNN(cudnnGetTensorNdDescriptor(y_, 8, &type, &rank, dims, out_strides));
    for (int d = 0; d < L.rank; ++d)
      if (rank != L.rank || dims[d] != L.src[d] + L.before[d] + L.after[d])
        unsupported("cudnnInitTransformDest gives dim " + std::to_string(d) + " of " + std::to_string(dims[d]) +
                    ", not the padded " + std::to_string(L.src[d] + L.before[d] + L.after[d]));
    y_buf_ = DeviceBuffer(bytes);
  }
  void enqueue() override {
    BZ_CUDNN(cudnnTransformTensorEx(cudnn_handle(), transform_, kOne.ptr(), x_, x_buf_.get(), kZero.ptr(), y_,
                                    y_buf_.get()));
  }

 private:
  TensorDesc x_, y_;
  TransformDesc transform_;
  DeviceBuffer x_buf_, y_buf_;
};

// --- reductions: cudnnReduceTensor ----------------------------------------------------------

cudnnReduceTensorOp_t reduce_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Add: return CUDNN_REDUCE_TENSOR_ADD;
    case ReduceOp::Avg: return CUDNN_REDUCE_TENSOR_AVG;
    case ReduceOp::Max: return CUDNN_REDUCE_TENSOR_MAX;
    case ReduceOp::Min: return CUDNN_REDUCE_TENSOR_MIN;
    case ReduceOp::Mul: return CUDNN_REDUCE_TENSOR_MUL;
    case ReduceOp::Norm1: return CUDNN_REDUCE_TENSOR_NORM1;  // sum of |x|: ONNX's ReduceL1
    case ReduceOp::Norm2: return CUDNN_REDUCE_TENSOR_NORM2;  // sqrt of the sum of squares: ReduceL2
  }
  return CUDNN_REDUCE_TENSOR_ADD;
}

class ReduceProblem : public Problem {
 public:
  ReduceProblem(const ReduceLayer& L, const Variant& v) {
    implementation = "cudnnReduceTensor";
    counters["flops"] = L.work.flops;
    counters["bytes"] = bytes_of(L.work, v);
    std::vector<int> a_strides = packed_strides(L.src, L.rank), c_strides = packed_strides(L.dst, L.rank);
    BZ_CUDNN(cudnnSetTensorNdDescriptor(a_, cudnn_dtype(v.dtype), L.rank, L.src, a_strides.data()));
    BZ_CUDNN(cudnnSetTensorNdDescriptor(c_, cudnn_dtype(v.dtype), L.rank, L.dst, c_strides.data()));
    // fp32 accumulation for every data type; ONNX's reductions return no indices, so
    // Max/Min need no index space (cuDNN ignores it for the other ops).
    BZ_CUDNN(cudnnSetReduceTensorDescriptor(reduce_, reduce_op(L.op), CUDNN_DATA_FLOAT, CUDNN_NOT_PROPAGATE_NAN,
                                            CUDNN_REDUCE_TENSOR_NO_INDICES, CUDNN_32BIT_INDICES));
    size_t work = 0, indices = 0;
    BZ_CUDNN(cudnnGetReductionWorkspaceSize(cudnn_handle(), reduce_, a_, c_, &work));
    BZ_CUDNN(cudnnGetReductionIndicesSize(cudnn_handle(), reduce_, a_, c_, &indices));
    workspace_bytes = work + indices;
    work_buf_ = DeviceBuffer(work);
    indices_buf_ = DeviceBuffer(indices);
    a_buf_ = filled(numel(L.rank, L.src), v.dtype);
    c_buf_ = filled(numel(L.rank, L.dst), v.dtype);
  }
  void enqueue() override {
    BZ_CUDNN(cudnnReduceTensor(cudnn_handle(), reduce_, indices_buf_.get(), indices_buf_.bytes(), work_buf_.get(),
                               work_buf_.bytes(), kOne.ptr(), a_, a_buf_.get(), kZero.ptr(), c_, c_buf_.get()));
  }

 private:
  TensorDesc a_, c_;
  ReduceDesc reduce_;
  DeviceBuffer work_buf_, indices_buf_, a_buf_, c_buf_;
};

template <class P, class L>
std::unique_ptr<Problem> make(const L& layer, const Variant& v) {
  return std::make_unique<P>(layer, v);
}

}  // namespace

void add_pool(Registry& r, const PoolLayer* l, const Variant* v, size_t n) {
  add_family(r, l, v, n, make<PoolProblem, PoolLayer>);
}
void add_bnorm(Registry& r, const BnormLayer* l, const Variant* v, size_t n) {
  add_family(r, l, v, n, make<BnormProblem, BnormLayer>);
}
void add_lrn(Registry& r, const LrnLayer* l, const Variant* v, size_t n) {
  add_family(r, l, v, n, make<LrnProblem, LrnLayer>);
}
void add_activation(Registry& r, const ActLayer* l, const Variant* v, size_t n) {
  add_family(r, l, v, n, make<ActivationProblem, ActLayer>);
}
void add_softmax(Registry& r, const SoftmaxLayer* l, const Variant* v, size_t n) {
  add_family(r, l, v, n, make<SoftmaxProblem, SoftmaxLayer>);
}
void add_dropout(Registry& r, const DropoutLayer* l, const Variant* v, size_t n) {
  add_family(r, l, v, n, make<DropoutProblem, DropoutLayer>);
}
void add_binary(Registry& r, const BinaryLayer* l, const Variant* v, size_t n) {
  add_family(r, l, v, n, make<BinaryProblem, BinaryLayer>);
}
void add_copy(Registry& r, const CopyLayer* l, const Variant* v, size_t n) {
  add_family(r, l, v, n, make<CopyProblem, CopyLayer>);
}
void add_reduce(Registry& r, const ReduceLayer* l, const Variant* v, size_t n) {
  add_family(r, l, v, n, make<ReduceProblem, ReduceLayer>);
}
void add_pad(Registry& r, const PadLayer* l, const Variant* v, size_t n) {
  add_family(r, l, v, n, make<PadProblem, PadLayer>);
}

}  // namespace benanza::cudnn
