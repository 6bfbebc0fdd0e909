// Convolution: cudnnConvolutionForward for every forward algorithm, and the fused
// cudnnConvolutionBiasActivationForward (Conv→Bias→Activation, Conv→Bias with IDENTITY);
// transposed convolution: cudnnConvolutionBackwardData for every backward-data algorithm.
#include <algorithm>
#include <map>
#include <tuple>

#include "benanza_cudnn/harness.hpp"
#include "benanza_cudnn/status.hpp"

namespace benanza::cudnn {
namespace {

static_assert(CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM == 0 && CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED == 7,
              "the generator numbers algorithms in cudnnConvolutionFwdAlgo_t order");
constexpr const char* kAlgoNames[] = {"IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT",
                                      "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
static_assert(CUDNN_CONVOLUTION_BWD_DATA_ALGO_0 == 0 && CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED == 5,
              "the generator numbers backward-data algorithms in cudnnConvolutionBwdDataAlgo_t order");
constexpr const char* kBwdDataAlgoNames[] = {"ALGO_0", "ALGO_1", "FFT", "FFT_TILING", "WINOGRAD",
                                             "WINOGRAD_NONFUSED"};

// What cuDNN would choose for a problem: the heuristic's first and cudnnFind's fastest
// supported algorithm (-1 where it found none) with the math type and workspace each chose,
// and every algorithm's status as Find reported it. Computed once per layer/dtype/layout/math
// and shared by all that problem's variants.
struct Pick {
  int algo = -1;
  int math = -1;  // cudnnMathType_t
  double workspace_bytes = -1;
};

struct Choice {
  Pick heuristic, found;
  float found_ms = -1;
  std::map<int, cudnnStatus_t> find_status;  // algo → status; absent: Find did not report it
};

// a convolution's and a transposed convolution's rows live in different tables: their
// addresses never collide
using ChoiceKey = std::tuple<const ConvLayer*, DType, Layout, Math>;

template <class Perf>
Pick first_supported(const Perf* perf, int returned) {
  for (int i = 0; i < returned; ++i)
    if (perf[i].status == CUDNN_STATUS_SUCCESS)
      return {perf[i].algo, perf[i].mathType, static_cast<double>(perf[i].memory)};
  return {};
}

// `get` and `find` are one call's cudnnGet…Algorithm_v7 and cudnnFind…Algorithm with its
// descriptors bound: (requested count, returned count, perf array) → status.
template <class Perf, int kCount, class Get, class Find>
Choice choose(Get get, Find find) {
  Choice c;
  Perf perf[kCount];
  int returned = 0;
  if (get(kCount, &returned, perf) == CUDNN_STATUS_SUCCESS) c.heuristic = first_supported(perf, returned);
  if (find(kCount, &returned, perf) == CUDNN_STATUS_SUCCESS) {
    c.found = first_supported(perf, returned);
    for (int i = 0; i < returned; ++i) {
      if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].algo == c.found.algo && c.found_ms < 0)
        c.found_ms = perf[i].time;
      c.find_status.emplace(perf[i].algo, perf[i].status);  // first entry per algo: its best math
    }
  }
  cudaGetLastError();  // Find may leave an allocation failure behind; it is not this benchmark's
  return c;
}

template <class Choose>
const Choice& choice_for(const ConvLayer& L, const Variant& v, Choose choose_now) {
  static std::map<ChoiceKey, Choice> choices;
  const ChoiceKey key{&L, v.dtype, v.layout, v.math};
  auto it = choices.find(key);
  if (it == choices.end()) it = choices.emplace(key, choose_now()).first;
  return it->second;
}

// The counters every convolution-like benchmark reports: its algorithm, what the heuristic and
// Find chose, its work.
void choice_counters(Problem& p, const Choice& choice, const ConvLayer& L, const Variant& v) {
  p.counters["algo"] = v.algo;
  p.counters["heuristic_algo"] = choice.heuristic.algo;
  p.counters["heuristic_math"] = choice.heuristic.math;
  p.counters["heuristic_workspace_bytes"] = choice.heuristic.workspace_bytes;
  p.counters["find_algo"] = choice.found.algo;
  p.counters["find_math"] = choice.found.math;
  p.counters["find_workspace_bytes"] = choice.found.workspace_bytes;
  p.counters["find_ms"] = choice.found_ms;
  p.counters["flops"] = L.work.flops;
  p.counters["bytes"] = bytes_of(L.work, v);
}

// Find ran the variant's algorithm on this very problem: a refusal there is final, so the
// variant is stored without allocating or timing anything.
void refused_by_find(const Choice& choice, const Variant& v, const char* find, const char* algo) {
  auto status = choice.find_status.find(v.algo);
  if (status != choice.find_status.end() && cudnn_rule(status->second).verdict == Verdict::Unsupported)
    unsupported(std::string(find) + ": " + cudnn_rule(status->second).name + " for " + algo);
}

class ConvProblem : public Problem {
 public:
  ConvProblem(const ConvLayer& L, const Variant& v)
      : algo_(static_cast<cudnnConvolutionFwdAlgo_t>(v.algo)), call_(v.call), bias_(L.bias) {
    const int pad_h = std::max(L.pad_t, L.pad_b), pad_w = std::max(L.pad_l, L.pad_r);
    set_tensor4d(x_, v.layout, v.dtype, L.n, L.c, L.h, L.w);
    BZ_CUDNN(cudnnSetFilter4dDescriptor(w_, cudnn_dtype(v.dtype), cudnn_format(v.layout), L.k, L.c / L.groups,
                                        L.r, L.s));
    // fp16/bf16 data accumulate in fp32 (cuDNN's PSEUDO_HALF / PSEUDO_BFLOAT16 configurations),
    // which is what inference frameworks ask for.
    BZ_CUDNN(cudnnSetConvolution2dDescriptor(conv_, pad_h, pad_w, L.stride_h, L.stride_w, L.dil_h, L.dil_w,
                                             CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    BZ_CUDNN(cudnnSetConvolutionGroupCount(conv_, L.groups));
    BZ_CUDNN(cudnnSetConvolutionMathType(conv_, cudnn_math(v.math)));
    int n, c, h, w;
    BZ_CUDNN(cudnnGetConvolution2dForwardOutputDim(conv_, x_, w_, &n, &c, &h, &w));
    set_tensor4d(y_, v.layout, v.dtype, n, c, h, w);
    set_tensor4d(bias_desc_, Layout::NCHW, v.dtype, 1, L.k, 1, 1);
    if (L.pad_t != L.pad_b || L.pad_l != L.pad_r) {
      // Symmetric max padding computes a superset of the asymmetric output: report how much.
      counters["pad_added"] = (2 * pad_h - L.pad_t - L.pad_b) + (2 * pad_w - L.pad_l - L.pad_r);
      counters["output_extra_rows"] = h - L.out_h;
      counters["output_extra_cols"] = w - L.out_w;
    }

    const Choice& choice = choice_for(L, v, [&] {
      return choose<cudnnConvolutionFwdAlgoPerf_t, CUDNN_CONVOLUTION_FWD_ALGO_COUNT>(
          [&](int count, int* returned, cudnnConvolutionFwdAlgoPerf_t* perf) {
            return cudnnGetConvolutionForwardAlgorithm_v7(cudnn_handle(), x_, w_, conv_, y_, count, returned, perf);
          },
          [&](int count, int* returned, cudnnConvolutionFwdAlgoPerf_t* perf) {
            return cudnnFindConvolutionForwardAlgorithm(cudnn_handle(), x_, w_, conv_, y_, count, returned, perf);
          });
    });
    // the fused call is checked by its own first call: Find does not cover it
    if (call_ == kConvForward)
      refused_by_find(choice, v, "cudnnFindConvolutionForwardAlgorithm", kAlgoNames[v.algo]);
    size_t ws = 0;
    BZ_CUDNN(cudnnGetConvolutionForwardWorkspaceSize(cudnn_handle(), x_, w_, conv_, y_, algo_, &ws));
    workspace_bytes = ws;
    choice_counters(*this, choice, L, v);

    x_buf_ = filled(size_t(L.n) * L.c * L.h * L.w, v.dtype);
    w_buf_ = filled(size_t(L.k) * (L.c / L.groups) * L.r * L.s, v.dtype, -0.1f, 0.1f);
    y_buf_ = filled(size_t(n) * c * h * w, v.dtype);
    ws_buf_ = DeviceBuffer(ws);
    implementation = kAlgoNames[v.algo];
    if (call_ != kConvForward || bias_) bias_buf_ = filled(L.k, v.dtype);
    if (call_ != kConvForward) {
      BZ_CUDNN(cudnnSetActivationDescriptor(
          act_, call_ == kConvBiasRelu ? CUDNN_ACTIVATION_RELU : CUDNN_ACTIVATION_IDENTITY,
          CUDNN_NOT_PROPAGATE_NAN, 0.0));
    } else if (bias_) {
      implementation += "+cudnnAddTensor";  // the unfused Conv→Bias a framework runs
    }
  }

  void enqueue() override {
    const Scale one{1.0f}, zero{0.0f};
    if (call_ == kConvForward) {
      BZ_CUDNN(cudnnConvolutionForward(cudnn_handle(), one.ptr(), x_, x_buf_.get(), w_, w_buf_.get(), conv_,
                                       algo_, ws_buf_.get(), ws_buf_.bytes(), zero.ptr(), y_, y_buf_.get()));
      if (bias_)
        BZ_CUDNN(cudnnAddTensor(cudnn_handle(), one.ptr(), bias_desc_, bias_buf_.get(), one.ptr(), y_,
                                y_buf_.get()));
      return;
    }
    // y = act(conv(x) + 0 * z + bias) with z aliasing y, as cuDNN allows.
    BZ_CUDNN(cudnnConvolutionBiasActivationForward(
        cudnn_handle(), one.ptr(), x_, x_buf_.get(), w_, w_buf_.get(), conv_, algo_, ws_buf_.get(),
        ws_buf_.bytes(), zero.ptr(), y_, y_buf_.get(), bias_desc_, bias_buf_.get(), act_, y_, y_buf_.get()));
  }

 private:
  cudnnConvolutionFwdAlgo_t algo_;
  uint8_t call_;
  bool bias_;
  TensorDesc x_, y_, bias_desc_;
  FilterDesc w_;
  ConvDesc conv_;
  ActivationDesc act_;
  DeviceBuffer x_buf_, w_buf_, y_buf_, ws_buf_, bias_buf_;
};

// A transposed convolution (ONNX ConvTranspose) as the backward-data convolution it is: the
// row's input (n, c, h, w) is cuDNN's dy, its output (n, k, out_h, out_w) is dx, and the ONNX
// weight (c, k / groups, r, s) is the forward filter as it lies. The descriptor pads both ends
// by the row's begin pads; the generator covers only rows where that computes the layer (an
// end pad short of the begin by less than the stride, as output_padding makes, is exact), and
// the forward output of dx must give back dy here.
class DeconvProblem : public Problem {
 public:
  DeconvProblem(const ConvLayer& L, const Variant& v)
      : algo_(static_cast<cudnnConvolutionBwdDataAlgo_t>(v.algo)), bias_(L.bias) {
    set_tensor4d(dy_, v.layout, v.dtype, L.n, L.c, L.h, L.w);
    set_tensor4d(dx_, v.layout, v.dtype, L.n, L.k, L.out_h, L.out_w);
    BZ_CUDNN(cudnnSetFilter4dDescriptor(w_, cudnn_dtype(v.dtype), cudnn_format(v.layout), L.c, L.k / L.groups,
                                        L.r, L.s));
    BZ_CUDNN(cudnnSetConvolution2dDescriptor(conv_, L.pad_t, L.pad_l, L.stride_h, L.stride_w, L.dil_h, L.dil_w,
                                             CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    BZ_CUDNN(cudnnSetConvolutionGroupCount(conv_, L.groups));
    BZ_CUDNN(cudnnSetConvolutionMathType(conv_, cudnn_math(v.math)));
    int n, c, h, w;
    BZ_CUDNN(cudnnGetConvolution2dForwardOutputDim(conv_, dx_, w_, &n, &c, &h, &w));
    if (n != L.n || c != L.c || h != L.h || w != L.w)
      unsupported("the forward convolution of the " + std::to_string(L.out_h) + "x" + std::to_string(L.out_w) +
                  " output gives " + std::to_string(h) + "x" + std::to_string(w) + ", not the " +
                  std::to_string(L.h) + "x" + std::to_string(L.w) + " input");
    set_tensor4d(bias_desc_, Layout::NCHW, v.dtype, 1, L.k, 1, 1);

    const Choice& choice = choice_for(L, v, [&] {
      return choose<cudnnConvolutionBwdDataAlgoPerf_t, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT>(
          [&](int count, int* returned, cudnnConvolutionBwdDataAlgoPerf_t* perf) {
            return cudnnGetConvolutionBackwardDataAlgorithm_v7(cudnn_handle(), w_, dy_, conv_, dx_, count, returned,
                                                               perf);
          },
          [&](int count, int* returned, cudnnConvolutionBwdDataAlgoPerf_t* perf) {
            return cudnnFindConvolutionBackwardDataAlgorithm(cudnn_handle(), w_, dy_, conv_, dx_, count, returned,
                                                             perf);
          });
    });
    refused_by_find(choice, v, "cudnnFindConvolutionBackwardDataAlgorithm", kBwdDataAlgoNames[v.algo]);
    size_t ws = 0;
    BZ_CUDNN(cudnnGetConvolutionBackwardDataWorkspaceSize(cudnn_handle(), w_, dy_, conv_, dx_, algo_, &ws));
    workspace_bytes = ws;
    choice_counters(*this, choice, L, v);

    dy_buf_ = filled(size_t(L.n) * L.c * L.h * L.w, v.dtype);
    w_buf_ = filled(size_t(L.c) * (L.k / L.groups) * L.r * L.s, v.dtype, -0.1f, 0.1f);
    dx_buf_ = filled(size_t(L.n) * L.k * L.out_h * L.out_w, v.dtype);
    ws_buf_ = DeviceBuffer(ws);
    implementation = kBwdDataAlgoNames[v.algo];
    if (bias_) {
      bias_buf_ = filled(L.k, v.dtype);
      implementation += "+cudnnAddTensor";
    }
  }

  void enqueue() override {
    const Scale one{1.0f}, zero{0.0f};
    BZ_CUDNN(cudnnConvolutionBackwardData(cudnn_handle(), one.ptr(), w_, w_buf_.get(), dy_, dy_buf_.get(), conv_,
                                          algo_, ws_buf_.get(), ws_buf_.bytes(), zero.ptr(), dx_, dx_buf_.get()));
    if (bias_)
      BZ_CUDNN(cudnnAddTensor(cudnn_handle(), one.ptr(), bias_desc_, bias_buf_.get(), one.ptr(), dx_,
                              dx_buf_.get()));
  }

 private:
  cudnnConvolutionBwdDataAlgo_t algo_;
  bool bias_;
  TensorDesc dy_, dx_, bias_desc_;
  FilterDesc w_;
  ConvDesc conv_;
  DeviceBuffer dy_buf_, w_buf_, dx_buf_, ws_buf_, bias_buf_;
};

std::unique_ptr<Problem> make_conv(const ConvLayer& L, const Variant& v) {
  return std::make_unique<ConvProblem>(L, v);
}

std::unique_ptr<Problem> make_deconv(const ConvLayer& L, const Variant& v) {
  return std::make_unique<DeconvProblem>(L, v);
}

}  // namespace

void add_conv(Registry& r, const ConvLayer* layers, const Variant* variants, size_t count) {
  add_family(r, layers, variants, count, make_conv);
}

void add_deconv(Registry& r, const ConvLayer* layers, const Variant* variants, size_t count) {
  add_family(r, layers, variants, count, make_deconv);
}

}  // namespace benanza::cudnn
