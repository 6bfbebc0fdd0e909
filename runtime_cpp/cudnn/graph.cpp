// The cuDNN graph API through the header-only cuDNN frontend (cudnn_frontend), for what the
// legacy API has no call for: layer normalization (inference), scaled dot-product attention
// (flash attention forward, inference), single pointwise nodes (Div, Pow, comparisons, Erf,
// GELU ...), resampling (ONNX Resize by 2), quantization's element-wise layers and int8
// convolutions (ConvInteger, QLinearConv); and float convolutions, as PyTorch runs them.
//
// One graph per layer and data type, built, validated and lowered once and shared by that
// layer's variants: the heuristics (mode A, then fallback) list engine configs, and each
// variant builds and times the plan of one of them (its `algo` is the slot), with the workspace
// that plan asks for; the result's implementation names the engine config, its `engine_id`
// counter the engine.
#include <cudnn_frontend.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "benanza/json.hpp"
#include "benanza_cudnn/graph.hpp"
#include "benanza_cudnn/harness.hpp"

namespace benanza::cudnn {
namespace {

namespace fe = cudnn_frontend;
using Graph = fe::graph::Graph;
using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

fe::DataType_t fe_dtype(DType t) {
  switch (t) {
    case DType::F32: return fe::DataType_t::FLOAT;
    case DType::F16: return fe::DataType_t::HALF;
    case DType::BF16: return fe::DataType_t::BFLOAT16;
    case DType::I8: return fe::DataType_t::INT8;
    case DType::U8: return fe::DataType_t::UINT8;
    case DType::I32: return fe::DataType_t::INT32;
    case DType::I64: return fe::DataType_t::INT64;
    // one byte per element as ONNX's bool (the frontend's BOOLEAN is one bit); a cuDNN before 9.25
    // does not know it (plan: unsupported)
    case DType::Bool: return fe::DataType_t::BYTE_BOOLEAN;
    case DType::F8E4M3: return fe::DataType_t::FP8_E4M3;
  }
  return fe::DataType_t::FLOAT;
}

int64_t type_bytes(DType t) {
  switch (t) {
    case DType::I64: return 8;
    case DType::F32: case DType::I32: return 4;
    case DType::F16: case DType::BF16: return 2;
    case DType::I8: case DType::U8: case DType::Bool: case DType::F8E4M3: return 1;
  }
  return 4;
}

std::vector<int64_t> packed(const std::vector<int64_t>& dims) {
  std::vector<int64_t> strides(dims.size());
  int64_t stride = 1;
  for (size_t d = dims.size(); d-- > 0;) {
    strides[d] = stride;
    stride *= dims[d];
  }
  return strides;
}

int64_t volume(const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

// The frontend's graph with each engine config's numerical notes readable: its
// deselect_numeric_notes bars configs for check_support and build_plans only, not for the
// build_plan_at_index each variant uses, so the planning reads the notes itself.
class NotedGraph : public Graph {
 public:
  // whether the engine config at `index` (after create_execution_plans) has any of `notes`
  bool noted(int64_t index, const std::vector<fe::NumericalNote_t>& notes) const {
    const auto& has = plans.numeric_notes.at(static_cast<size_t>(index));
    return std::any_of(notes.begin(), notes.end(),
                       [&has](fe::NumericalNote_t n) { return std::find(has.begin(), has.end(), n) != has.end(); });
  }
};

// A graph ready to plan, with the device tensors its variant pack needs (uid → elements, type).
struct Spec {
  std::shared_ptr<NotedGraph> graph;
  std::string what;  // the node, for the implementation string
  struct Buffer {
    int64_t uid, elements;
    DType type;
    bool boolean;  // a comparison's output: one byte per element, ONNX's bool (BYTE_BOOLEAN)
    // a view: no memory of its own, `offset` elements into buffer `base` (a strided part of a
    // tensor, as RoPE's halves); 0 for a buffer
    int64_t base = 0, offset = 0;
    // false: memory that only views read and write, in no variant pack
    bool bound = true;
  };
  std::vector<Buffer> buffers;
  int64_t result = 0;  // the uid of the last output
  std::vector<fe::NumericalNote_t> barred = {};  // engine configs with any of these notes are not planned

  // memory for views only: its uid
  int64_t storage(int64_t elements, DType type) {
    const int64_t uid = static_cast<int64_t>(buffers.size()) + 1;
    buffers.push_back({uid, elements, type, false, 0, 0, false});
    return uid;
  }
  // a strided view of `base` from element `offset` on: an input tensor, or (`out`) a node's
  // output `t` marked as a graph output
  TensorPtr view(const char* name, std::vector<int64_t> dims, std::vector<int64_t> strides, DType type,
                 int64_t base, int64_t offset, const TensorPtr& out = nullptr) {
    const int64_t uid = static_cast<int64_t>(buffers.size()) + 1;
    buffers.push_back({uid, 0, type, false, base, offset, true});
    TensorPtr t = out ? out : graph->tensor(fe::graph::Tensor_attributes().set_name(name));
    if (out) t->set_output(true);
    t->set_uid(uid).set_dim(dims).set_stride(strides).set_data_type(fe_dtype(type));
    return t;
  }

  TensorPtr tensor(const char* name, std::vector<int64_t> dims, DType type, bool boolean = false,
                   std::vector<int64_t> strides = {}) {
    const int64_t uid = static_cast<int64_t>(buffers.size()) + 1;
    if (strides.empty()) strides = packed(dims);
    buffers.push_back({uid, volume(dims), type, boolean});
    return graph->tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dims).set_stride(
        strides).set_data_type(fe_dtype(boolean ? DType::Bool : type)));
  }
  // marks a node's output as a graph output backed by its own buffer
  void output(const TensorPtr& t, std::vector<int64_t> dims, DType type, bool boolean = false,
              std::vector<int64_t> strides = {}) {
    const int64_t uid = static_cast<int64_t>(buffers.size()) + 1;
    buffers.push_back({uid, volume(dims), type, boolean});
    result = uid;
    if (strides.empty()) strides = packed(dims);
    t->set_output(true).set_uid(uid).set_dim(dims).set_stride(strides).set_data_type(
        fe_dtype(boolean ? DType::Bool : type));
  }
};

// `sm` > 0: the compute capability to validate for without a device (nodes copy the graph's
// context when added, so it is set first); 0: the device's, read when needed.
Spec new_spec(DType io, const std::string& what, int sm) {
  Spec s{std::make_shared<NotedGraph>(), what, {}};
  if (sm > 0) s.graph->set_sm_version(sm);
  s.graph->set_io_data_type(fe_dtype(io))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return s;
}

// a pointwise node computing in fp32, as every builder's are but the boolean ones
fe::graph::Pointwise_attributes with(fe::PointwiseMode_t mode) {
  return fe::graph::Pointwise_attributes().set_mode(mode).set_compute_data_type(fe::DataType_t::FLOAT);
}

// --- the graphs, one builder per family ---------------------------------------------------

Spec build(const LnormLayer& L, DType t, uint8_t, int sm) {
  Spec s = new_spec(t, L.rms ? "rmsnorm" : "layernorm", sm);
  const int64_t rows = L.rows, cols = L.cols;
  // the frontend's layout for a layer norm over the trailing axes: rows x cols x 1 x 1
  auto x = s.tensor("X", {rows, cols, 1, 1}, t, false, {cols, 1, cols, cols});
  auto scale = s.tensor("scale", {1, cols, 1, 1}, DType::F32, false, {cols, 1, cols, cols});
  TensorPtr bias = L.bias ? s.tensor("bias", {1, cols, 1, 1}, DType::F32, false, {cols, 1, cols, cols}) : nullptr;
  TensorPtr eps = s.graph->tensor(static_cast<float>(L.eps));  // passed by value
  std::array<TensorPtr, 3> outs;
  if (L.rms) {
    auto options = fe::graph::Rmsnorm_attributes().set_forward_phase(fe::NormFwdPhase_t::INFERENCE).set_epsilon(eps);
    auto rms = s.graph->rmsnorm(x, scale, options);
    outs = {rms[0], rms[1], nullptr};
  } else {
    auto options =
        fe::graph::Layernorm_attributes().set_forward_phase(fe::NormFwdPhase_t::INFERENCE).set_epsilon(eps);
    outs = s.graph->layernorm(x, scale, bias, options);
  }
  const int64_t uid = static_cast<int64_t>(s.buffers.size()) + 1;
  s.buffers.push_back({uid, rows * cols, t, false});
  outs[0]->set_output(true).set_uid(uid).set_data_type(fe_dtype(t));
  return s;
}

Spec build(const SdpaLayer& L, DType t, uint8_t call, int sm) {
  Spec s = new_spec(t, "sdpa", sm);
  const bool masked = L.mask || (call & kSdpaMasked);
  const double scale = (call & kSdpaUnscaled) ? 1.0 : L.scale;
  const int64_t b = L.b, h = L.h, hkv = L.h_kv, sq = L.s_q, skv = L.s_kv, dqk = L.d_qk, dv = L.d_v;
  auto q = s.tensor("Q", {b, h, sq, dqk}, t);
  auto k = s.tensor("K", {b, hkv, skv, dqk}, t);
  auto v = s.tensor("V", {b, hkv, skv, dv}, t);
  auto options = fe::graph::SDPA_attributes().set_name("sdpa").set_generate_stats(false).set_attn_scale(
      static_cast<float>(scale));
  if (L.causal) options.set_causal_mask(true);
  if (masked) options.set_bias(s.tensor("mask", {1, 1, sq, skv}, t));
  auto outs = s.graph->sdpa(q, k, v, options);
  s.output(outs[0], {b, h, sq, dv}, t);
  return s;
}

struct PointwiseMode {
  fe::PointwiseMode_t mode;
  const char* name;
};

PointwiseMode pointwise_mode(PointwiseOp op) {
  switch (op) {
    case PointwiseOp::Div: return {fe::PointwiseMode_t::DIV, "DIV"};
    case PointwiseOp::Pow: return {fe::PointwiseMode_t::POW, "POW"};
    case PointwiseOp::CmpEq: return {fe::PointwiseMode_t::CMP_EQ, "CMP_EQ"};
    case PointwiseOp::CmpGt: return {fe::PointwiseMode_t::CMP_GT, "CMP_GT"};
    case PointwiseOp::CmpLt: return {fe::PointwiseMode_t::CMP_LT, "CMP_LT"};
    case PointwiseOp::Erf: return {fe::PointwiseMode_t::ERF, "ERF"};
    case PointwiseOp::Gelu: return {fe::PointwiseMode_t::GELU_FWD, "GELU_FWD"};
    case PointwiseOp::GeluTanh: return {fe::PointwiseMode_t::GELU_APPROX_TANH_FWD, "GELU_APPROX_TANH_FWD"};
    case PointwiseOp::Exp: return {fe::PointwiseMode_t::EXP, "EXP"};
    case PointwiseOp::Log: return {fe::PointwiseMode_t::LOG, "LOG"};
    case PointwiseOp::Abs: return {fe::PointwiseMode_t::ABS, "ABS"};
    case PointwiseOp::Neg: return {fe::PointwiseMode_t::NEG, "NEG"};
    case PointwiseOp::Softplus: return {fe::PointwiseMode_t::SOFTPLUS_FWD, "SOFTPLUS_FWD"};
    case PointwiseOp::Reciprocal: return {fe::PointwiseMode_t::RECIPROCAL, "RECIPROCAL"};
    case PointwiseOp::Cos: return {fe::PointwiseMode_t::COS, "COS"};
    case PointwiseOp::Sin: return {fe::PointwiseMode_t::SIN, "SIN"};
    case PointwiseOp::HardSigmoid: return {fe::PointwiseMode_t::RELU_FWD, "MUL ADD RELU_FWD[0,1]"};
    case PointwiseOp::And: return {fe::PointwiseMode_t::LOGICAL_AND, "LOGICAL_AND"};
    case PointwiseOp::Or: return {fe::PointwiseMode_t::LOGICAL_OR, "LOGICAL_OR"};
    case PointwiseOp::IsNan: return {fe::PointwiseMode_t::CMP_NEQ, "CMP_NEQ(x, x) (isnan)"};
  }
  return {fe::PointwiseMode_t::IDENTITY, "IDENTITY"};
}

Spec build(const PointwiseLayer& L, DType t, uint8_t call, int sm) {
  // the gelu_erf pattern, anchored on its Div(x, √2): one GELU node of x
  const bool gelu = call == kGeluOfA;
  const PointwiseMode m = pointwise_mode(gelu ? PointwiseOp::Gelu : L.op);
  Spec s = new_spec(t, std::string("pointwise ") + m.name, sm);
  const bool isnan = L.op == PointwiseOp::IsNan;
  const bool compare =
      L.op == PointwiseOp::CmpEq || L.op == PointwiseOp::CmpGt || L.op == PointwiseOp::CmpLt || isnan;
  // And, Or compute in booleans, as the frontend's own SDPA builds its padding mask
  // (scaled_dot_product_flash_attention.h: LOGICAL_AND with a BOOLEAN compute type)
  const bool logical = L.op == PointwiseOp::And || L.op == PointwiseOp::Or;
  auto options = fe::graph::Pointwise_attributes().set_mode(m.mode).set_compute_data_type(
      logical ? fe::DataType_t::BOOLEAN : fe::DataType_t::FLOAT);
  auto a = s.tensor("A", {L.a, L.a + L.rank}, t);
  if (L.op == PointwiseOp::HardSigmoid) {  // alpha·x + beta (scalars by value), clipped to [0, 1]
    auto scaled = s.graph->pointwise(a, s.graph->tensor(static_cast<float>(L.alpha)), with(fe::PointwiseMode_t::MUL));
    a = s.graph->pointwise(scaled, s.graph->tensor(static_cast<float>(L.beta)), with(fe::PointwiseMode_t::ADD));
    options.set_relu_lower_clip(0.0f).set_relu_upper_clip(1.0f);
  }
  // IsNaN: the same tensor (one uid, one buffer) as both operands of CMP_NEQ
  TensorPtr y = isnan                ? s.graph->pointwise(a, a, options)
                : L.binary && !gelu ? s.graph->pointwise(a, s.tensor("B", {L.b, L.b + L.rank}, t), options)
                                    : s.graph->pointwise(a, options);
  s.output(y, {L.out, L.out + L.rank}, t, compare);
  return s;
}

// RoPE (tables.hpp RopeLayer): per half, two products and their difference or sum, reading
// and writing strided views of x and y; cos and sin split the same way where each half has its
// own values.
Spec build(const RopeLayer& L, DType t, uint8_t, int sm) {
  Spec s = new_spec(t, "pointwise MUL SUB MUL ADD (rope)", sm);
  const std::vector<int64_t> x(L.x, L.x + L.rank), cs(L.cs, L.cs + L.rank);
  const int64_t d = x.back(), half = L.rot / 2;
  auto part = [&](const std::vector<int64_t>& dims, int64_t width) {
    std::vector<int64_t> out(dims);
    out.back() = width;
    return out;
  };
  auto steps = [&](const std::vector<int64_t>& dims, int64_t step) {
    std::vector<int64_t> out = packed(dims);
    out.back() = step;
    return out;
  };
  // the second of a pair: the next feature (interleaved) or the one half a rotation on
  const int64_t step = L.interleaved ? 2 : 1, second = L.interleaved ? 1 : half;
  const int64_t xs = s.storage(volume(x), t), ys = s.storage(volume(x), t);
  auto xa = s.view("Xa", part(x, half), steps(x, step), t, xs, 0);
  auto xb = s.view("Xb", part(x, half), steps(x, step), t, xs, second);
  TensorPtr ca, cb, sa, sb;
  if (cs.back() == L.rot) {
    const int64_t cosines = s.storage(volume(cs), t), sines = s.storage(volume(cs), t);
    ca = s.view("cos_a", part(cs, half), steps(cs, step), t, cosines, 0);
    cb = s.view("cos_b", part(cs, half), steps(cs, step), t, cosines, second);
    sa = s.view("sin_a", part(cs, half), steps(cs, step), t, sines, 0);
    sb = s.view("sin_b", part(cs, half), steps(cs, step), t, sines, second);
  } else {
    ca = cb = s.tensor("cos", cs, t);
    sa = sb = s.tensor("sin", cs, t);
  }
  auto mul = [&](const TensorPtr& a, const TensorPtr& b) {
    return s.graph->pointwise(a, b, with(fe::PointwiseMode_t::MUL));
  };
  auto ya = s.graph->pointwise(mul(xa, ca), mul(xb, sa), with(fe::PointwiseMode_t::SUB));
  auto yb = s.graph->pointwise(mul(xb, cb), mul(xa, sb), with(fe::PointwiseMode_t::ADD));
  s.view("Ya", part(x, half), steps(x, step), t, ys, 0, ya);
  s.view("Yb", part(x, half), steps(x, step), t, ys, second, yb);
  if (L.rot < d) {  // the features past the rotation, copied
    auto rest = s.view("Xrest", part(x, d - L.rot), packed(x), t, xs, L.rot);
    s.view("Yrest", part(x, d - L.rot), packed(x), t, ys, L.rot,
           s.graph->pointwise(rest, with(fe::PointwiseMode_t::IDENTITY)));
  }
  return s;
}

// N x C x H x W in NHWC order, the layout the resample node's engines take
std::vector<int64_t> nhwc_strides(int64_t c, int64_t h, int64_t w) { return {c * h * w, 1, c * w, c}; }

// Resize by 2 (tables.hpp ResampleLayer): the resample node with window 2, strides 1/2, pre-padding
// 1/2 and post-padding 1, edge-value padding, in NHWC. The output size is cuDNN's pooling formula
// with these fractions, 1 + (H + 1/2 + 1 - 2) / (1/2) = 2H; output i samples the input at
// i·stride - pre + window/2 - 1/2 = i/2, clamped to the input (BILINEAR as a third party measured
// it on one GPU; not checked here, and NEAREST's rounding of the half-way samples is undocumented).
// Which input pixels an output reads changes no work: the timing stands for ONNX's coordinate
// modes alike.
Spec build(const ResampleLayer& L, DType t, uint8_t, int sm) {
  Spec s = new_spec(t, L.linear ? "resample BILINEAR" : "resample NEAREST", sm);
  const int64_t n = L.n, c = L.c, h = L.h, w = L.w, oh = L.out_h, ow = L.out_w;
  auto x = s.tensor("X", {n, c, h, w}, t, false, nhwc_strides(c, h, w));
  const cudnnFraction_t half{1, 2}, one{1, 1}, two{2, 1};
  auto options = fe::graph::Resample_attributes()
                     .set_generate_index(false)
                     .set_resampling_mode(L.linear ? fe::ResampleMode_t::BILINEAR : fe::ResampleMode_t::NEAREST)
                     .set_padding_mode(fe::PaddingMode_t::EDGE_VAL_PAD)
                     .set_window(std::vector<cudnnFraction_t>{two, two})
                     .set_stride(std::vector<cudnnFraction_t>{half, half})
                     .set_pre_padding(std::vector<cudnnFraction_t>{half, half})
                     .set_post_padding(std::vector<cudnnFraction_t>{one, one});
  auto outs = s.graph->resample(x, options);
  s.output(outs[0], {n, c, oh, ow}, t, false, nhwc_strides(c, oh, ow));
  return s;
}

// The layer's geometry (its exact pads, strides, dilations) as a conv_fprop node takes it.
fe::graph::Conv_fprop_attributes conv_attributes(const QconvLayer& L, fe::DataType_t compute) {
  return fe::graph::Conv_fprop_attributes()
      .set_pre_padding({L.pad_t, L.pad_l})
      .set_post_padding({L.pad_b, L.pad_r})
      .set_stride({L.stride_h, L.stride_w})
      .set_dilation({L.dil_h, L.dil_w})
      .set_compute_data_type(compute);
}

// A float convolution (calls kConvGraph*): conv_fprop alone, in the variant's type with fp32
// compute, as PyTorch's cuDNN convolutions execute it (it adds the bias in a kernel of its own:
// a graph with the add would run other engines than the ones its log names).
Spec conv_graph(const QconvLayer& L, DType t, uint8_t call, int sm) {
  const bool nhwc = (call & kConvGraphNhwc) == kConvGraphNhwc, fma = (call & kConvGraphFma) == kConvGraphFma;
  Spec s = new_spec(t, std::string("conv_fprop ") + (nhwc ? "NHWC" : "NCHW") + (fma ? " FMA" : ""), sm);
  if (fma) s.barred = {fe::NumericalNote_t::TENSOR_CORE, fe::NumericalNote_t::DOWN_CONVERT_INPUTS};
  auto strides = [nhwc](int64_t n, int64_t c, int64_t h, int64_t w) {
    return nhwc ? nhwc_strides(c, h, w) : packed({n, c, h, w});
  };
  const int64_t per_group = L.c / L.groups;
  auto x = s.tensor("X", {L.n, L.c, L.h, L.w}, t, false, strides(L.n, L.c, L.h, L.w));
  auto w = s.tensor("W", {L.k, per_group, L.r, L.s}, t, false, strides(L.k, per_group, L.r, L.s));
  s.output(s.graph->conv_fprop(x, w, conv_attributes(L, fe::DataType_t::FLOAT)), {L.n, L.k, L.out_h, L.out_w}, t, false,
           strides(L.n, L.k, L.out_h, L.out_w));
  return s;
}

// ConvInteger and QLinearConv (tables.hpp QconvLayer) as NVIDIA's int8 convolution samples build
// them (cudnn-frontend samples/cpp/convolution/int8_fprop.cpp; the legacy samples'
// ConvScaleBiasAct_int8): INT8 X and W with channels-last strides (W as K x C/groups x R x S: the
// graph API takes the group count from X's channels over W's), INT32 compute. ConvInteger: an
// IDENTITY node writes the s32 accumulator, as the sample's graph does (whether an engine takes
// the convolution with no node after it is not known here). QLinearConv: a MUL by the scale
// (sa·sb/sy, per tensor or per output channel), then an ADD of one offset per output channel,
// written as INT8; the offset is what a framework folds at load time from constants: the int32
// bias times the scale (ONNX adds the bias to the accumulator before scaling; this is the same
// sum, rounded in fp32), the output's zero point, and -128 for a u8 output, written as the s8
// data of the same bytes. A u8 input is read as the s8 data of the same bytes (u8 - 128): the
// per-channel part of its zero point's correction (a constant times each output channel's weight
// sum) belongs in the offset too; its part at the borders (taps on the padding) and all of
// ConvInteger's correction are not in the graph.
Spec build(const QconvLayer& L, DType t, uint8_t call, int sm) {
  if (call != kCall) return conv_graph(L, t, call, sm);
  const char* what = L.requant ? "conv_fprop INT8 MUL ADD (QLinearConv)" : "conv_fprop INT8 IDENTITY (ConvInteger)";
  Spec s = new_spec(DType::I8, what, sm);
  s.graph->set_intermediate_data_type(L.requant ? fe::DataType_t::FLOAT : fe::DataType_t::INT32)
      .set_compute_data_type(fe::DataType_t::INT32);
  const int64_t k = L.k, per_group = L.c / L.groups;
  auto x = s.tensor("X", {L.n, L.c, L.h, L.w}, DType::I8, false, nhwc_strides(L.c, L.h, L.w));
  auto w = s.tensor("W", {k, per_group, L.r, L.s}, DType::I8, false, nhwc_strides(per_group, L.r, L.s));
  auto acc = s.graph->conv_fprop(x, w, conv_attributes(L, fe::DataType_t::INT32));
  acc->set_data_type(fe::DataType_t::INT32);
  const std::vector<int64_t> out{L.n, k, L.out_h, L.out_w};
  const std::vector<int64_t> strides = nhwc_strides(k, L.out_h, L.out_w);
  if (!L.requant) {
    s.output(s.graph->pointwise(acc, fe::graph::Pointwise_attributes().set_mode(fe::PointwiseMode_t::IDENTITY)), out,
             DType::I32, false, strides);
    return s;
  }
  auto scale = s.tensor("scale", {1, L.bscales, 1, 1}, DType::F32, false, nhwc_strides(L.bscales, 1, 1));
  auto offset = s.tensor("offset", {1, k, 1, 1}, DType::F32, false, nhwc_strides(k, 1, 1));
  auto scaled = s.graph->pointwise(acc, scale, with(fe::PointwiseMode_t::MUL));
  s.output(s.graph->pointwise(scaled, offset, with(fe::PointwiseMode_t::ADD)), out, DType::I8, false, strides);
  return s;
}

// Quantization's layers (tables.hpp QuantLayer). `part` picks one of DynamicQuantize's three
// graphs (0: MAX reduction, 1: MIN reduction, 2: the quantization); the others have one.
constexpr uint8_t kQuantParts = 3;

Spec build(const QuantLayer& L, DType t, uint8_t part, int sm) {
  const std::vector<int64_t> in(L.in, L.in + L.rank), scale(L.scale, L.scale + L.rank);
  const std::vector<int64_t> one(L.rank, 1);
  if (L.op == QuantOp::Convert) {  // a Cast: the identity from the source type into the variant's
    Spec s = new_spec(t, "pointwise IDENTITY (cast)", sm);
    s.output(s.graph->pointwise(s.tensor("X", in, L.source), with(fe::PointwiseMode_t::IDENTITY)), in, t);
    return s;
  }
  if (L.op == QuantOp::NonZero) {  // a Cast into bool: x ≠ 0, one byte per element
    Spec s = new_spec(t, "pointwise CMP_NEQ 0 (cast to bool)", sm);
    auto zero = s.graph->tensor(0.0f);  // passed by value
    s.output(s.graph->pointwise(s.tensor("X", in, L.source), zero, with(fe::PointwiseMode_t::CMP_NEQ)), in, t,
             true);
    return s;
  }
  if (L.op == QuantOp::Quantize) {  // x / scale + zero point, converted into the integer type
    Spec s = new_spec(t, L.zp ? "pointwise DIV ADD (quantize)" : "pointwise DIV (quantize)", sm);
    TensorPtr y = s.graph->pointwise(s.tensor("X", in, t), s.tensor("scale", scale, DType::F32),
                                     with(fe::PointwiseMode_t::DIV));
    if (L.zp) y = s.graph->pointwise(y, s.tensor("zero_point", scale, L.source), with(fe::PointwiseMode_t::ADD));
    s.output(y, in, L.source);
    return s;
  }
  if (L.op == QuantOp::Dequantize) {  // (x - zero point) · scale
    Spec s = new_spec(t, L.zp ? "pointwise SUB MUL (dequantize)" : "pointwise MUL (dequantize)", sm);
    TensorPtr x = s.tensor("X", in, L.source);
    if (L.zp) x = s.graph->pointwise(x, s.tensor("zero_point", scale, L.source), with(fe::PointwiseMode_t::SUB));
    s.output(s.graph->pointwise(x, s.tensor("scale", scale, DType::F32), with(fe::PointwiseMode_t::MUL)), in, t);
    return s;
  }
  if (part < 2) {  // DynamicQuantize's range: one reduction of x to a single value
    const bool max = part == 0;
    Spec s = new_spec(t, max ? "reduction MAX (dynamic quantize)" : "reduction MIN (dynamic quantize)", sm);
    auto options = fe::graph::Reduction_attributes()
                       .set_mode(max ? fe::ReductionMode_t::MAX : fe::ReductionMode_t::MIN)
                       .set_compute_data_type(fe::DataType_t::FLOAT);
    s.output(s.graph->reduction(s.tensor("X", in, t), options), one, DType::F32);
    return s;
  }
  // the quantization with the range's scale and zero point (ONNX's round half to even; cuDNN's
  // float→uint8 conversion saturates)
  Spec s = new_spec(t, "pointwise DIV ADD (dynamic quantize)", sm);
  auto scaled = s.graph->pointwise(s.tensor("X", in, t), s.tensor("scale", one, DType::F32),
                                   with(fe::PointwiseMode_t::DIV));
  auto shifted = s.graph->pointwise(scaled, s.tensor("zero_point", one, DType::F32), with(fe::PointwiseMode_t::ADD));
  s.output(shifted, in, DType::U8);
  return s;
}

// --- planning: heuristics once per graph, one plan per variant -----------------------------

bool refused(fe::error_code_t code) {
  // what the library says it cannot run, as opposed to a failure of the call or the harness
  return code == fe::error_code_t::GRAPH_NOT_SUPPORTED || code == fe::error_code_t::HEURISTIC_QUERY_FAILED ||
         code == fe::error_code_t::GRAPH_EXECUTION_PLAN_CREATION_FAILED;
}

void check(fe::error_t status, const char* step) {
  if (status.is_good()) return;
  const std::string msg = std::string("cudnn_frontend ") + step + ": " + status.get_message();
  if (refused(status.get_code())) throw Unsupported(msg);
  throw Failure(msg);
}

// The engine configs of one graph: plan indices of the distinct configs, modes A then fallback.
struct Planned {
  Spec spec;
  std::vector<int64_t> plans;
  std::vector<std::string> names;
  std::string error;  // why the graph could not be planned (then `refused` says how to file it)
  bool refused = false;
};

// ONNX's one-byte bool is the graph API's BYTE_BOOLEAN, a type cuDNN knows from 9.25 on: an older
// one refuses it at the tensor descriptor (SetAttribute CUDNN_ATTR_TENSOR_DATA_TYPE:
// CUDNN_STATUS_INVALID_VALUE, seen on the H200 with 9.14 and 9.19), which is no harness failure
constexpr size_t kByteBooleanSince = 92500;

Planned plan(Spec spec) {
  Planned p{std::move(spec), {}, {}, "", false};
  try {
    Graph& g = *p.spec.graph;
    cudnnHandle_t handle = cudnn_handle();  // without a usable GPU this fails first, with the CUDA error
    const size_t version = cudnnGetVersion();
    for (const auto& b : p.spec.buffers) {
      if ((b.type == DType::Bool || b.boolean) && version < kByteBooleanSince)
        throw Unsupported("cudnn_frontend: a one-byte bool tensor (BYTE_BOOLEAN) needs cuDNN 9.25 or newer; this is " +
                          std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100));
    }
    check(g.validate(), "validate");
    check(g.build_operation_graph(handle), "build_operation_graph");
    check(g.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}), "create_execution_plans");
    for (int64_t i = 0; i < g.get_execution_plan_count(); ++i) {
      if (p.spec.graph->noted(i, p.spec.barred)) continue;  // a math mode's exclusion (conv_graph)
      std::string name;
      check(g.get_plan_name_at_index(i, name), "get_plan_name_at_index");
      bool seen = false;
      for (const auto& n : p.names) seen = seen || n == name;
      if (!seen) {  // fallback repeats configs mode A listed
        p.plans.push_back(i);
        p.names.push_back(name);
      }
    }
  } catch (const Unsupported& e) {
    p.error = e.what();
    p.refused = true;
  } catch (const std::exception& e) {
    p.error = e.what();
  }
  return p;
}

template <class Layer>
Planned& planned_for(const Layer& L, const Variant& v) {
  // keyed by the table row and form: a layer's variants (its slots) share one graph and one
  // heuristics query
  using Key = std::tuple<const Layer*, DType, uint8_t>;
  static std::map<Key, Planned> graphs;
  const Key key{&L, v.dtype, v.call};
  auto it = graphs.find(key);
  if (it == graphs.end()) it = graphs.emplace(key, plan(build(L, v.dtype, v.call, 0))).first;
  return it->second;
}

class GraphProblem : public Problem {
 public:
  template <class Layer>
  GraphProblem(const Layer& L, const Variant& v) : planned_(planned_for(L, v)) {
    counters["flops"] = L.work.flops;
    counters["bytes"] = bytes_of(L.work, v);
    if (!planned_.error.empty()) {
      if (planned_.refused) unsupported(planned_.error);
      throw Failure(planned_.error);
    }
    const size_t slot = v.algo;
    counters["engine_configs"] = static_cast<double>(planned_.plans.size());
    if (slot >= planned_.plans.size())
      unsupported("cudnn_frontend heuristics (modes A, fallback) returned " + std::to_string(planned_.plans.size()) +
                  " distinct engine configs for this graph: none in slot " + std::to_string(slot));
    index_ = planned_.plans[slot];
    Graph& g = *planned_.spec.graph;
    // the engine's global index, the number cuDNN's log prints as engine_id for a framework's
    // execute (Q3 compares the two); the implementation string names its knobs too
    int64_t engine = -1;
    std::unordered_map<fe::KnobType_t, int64_t> knobs;
    check(g.get_engine_and_knobs_at_index(index_, engine, knobs), "get_engine_and_knobs_at_index");
    counters["engine_id"] = static_cast<double>(engine);
    check(g.build_plan_at_index(index_), "build_plan_at_index");
    int64_t ws = 0;
    check(g.get_workspace_size_plan_at_index(index_, ws), "get_workspace_size_plan_at_index");
    workspace_bytes = static_cast<uint64_t>(ws);
    workspace_ = DeviceBuffer(static_cast<size_t>(ws));
    std::unordered_map<int64_t, void*> memory;  // every buffer's and view's address, by uid
    for (const auto& b : planned_.spec.buffers) {
      if (b.base) {
        memory[b.uid] = static_cast<char*>(memory.at(b.base)) + b.offset * type_bytes(b.type);
      } else {
        buffers_.push_back(b.boolean ? DeviceBuffer(static_cast<size_t>(b.elements))
                                     : filled(static_cast<size_t>(b.elements), b.type));
        memory[b.uid] = buffers_.back().get();
      }
      if (b.bound) pack_[b.uid] = memory[b.uid];
    }
    implementation = "cudnn_frontend " + planned_.spec.what + " " + planned_.names[slot];
  }
  void enqueue() override {
    check(planned_.spec.graph->execute_plan_at_index(cudnn_handle(), pack_, workspace_.get(), index_),
          "execute_plan_at_index");
  }
  // the device memory of the graph's last output
  void* output() const { return pack_.at(planned_.spec.result); }

 private:
  Planned& planned_;
  int64_t index_ = 0;
  DeviceBuffer workspace_;
  std::vector<DeviceBuffer> buffers_;
  std::unordered_map<int64_t, void*> pack_;
};

template <class Layer>
std::unique_ptr<Problem> make(const Layer& layer, const Variant& v) {
  return std::make_unique<GraphProblem>(layer, v);
}

// A float convolution graph of a Conv with a bias: the graph, then cudnnAddTensor of the bias
// into its output, as PyTorch adds a cuDNN convolution's bias (and as the legacy variants time it)
class BiasedGraphProblem : public GraphProblem {
 public:
  BiasedGraphProblem(const QconvLayer& L, const Variant& v) : GraphProblem(L, v), bias_(filled(L.k, v.dtype)) {
    set_tensor4d(bias_desc_, Layout::NCHW, v.dtype, 1, L.k, 1, 1);
    set_tensor4d(y_desc_, v.layout, v.dtype, L.n, L.k, L.out_h, L.out_w);
    implementation += "+cudnnAddTensor";
  }
  void enqueue() override {
    GraphProblem::enqueue();
    const Scale one{1.0f};
    BZ_CUDNN(cudnnAddTensor(cudnn_handle(), one.ptr(), bias_desc_, bias_.get(), one.ptr(), y_desc_, output()));
  }

 private:
  DeviceBuffer bias_;
  TensorDesc bias_desc_, y_desc_;
};

std::unique_ptr<Problem> make_qconv(const QconvLayer& layer, const Variant& v) {
  if (v.call != kCall && layer.bias) return std::make_unique<BiasedGraphProblem>(layer, v);
  return std::make_unique<GraphProblem>(layer, v);
}

// DynamicQuantizeLinear: its three graphs (each in the variant's plan slot) timed back to back,
// as a GPU framework runs the reductions and then the quantization
class PartsProblem : public Problem {
 public:
  PartsProblem(const QuantLayer& L, const Variant& v) {
    for (uint8_t part = 0; part < kQuantParts; ++part) {
      Variant each = v;
      each.call = part;
      parts_.push_back(std::make_unique<GraphProblem>(L, each));
      implementation += (part ? " + " : "") + parts_.back()->implementation;
      workspace_bytes = std::max(workspace_bytes, parts_.back()->workspace_bytes);
    }
    counters = parts_.front()->counters;  // the layer's work; engine_configs: the first graph's
  }
  void enqueue() override {
    for (auto& p : parts_) p->enqueue();
  }

 private:
  std::vector<std::unique_ptr<GraphProblem>> parts_;
};

std::unique_ptr<Problem> make_quant(const QuantLayer& layer, const Variant& v) {
  if (layer.op == QuantOp::DynamicQuantize) return std::make_unique<PartsProblem>(layer, v);
  return std::make_unique<GraphProblem>(layer, v);
}

// --- validation without a device (--benanza_check_graphs) ----------------------------------

struct GraphCheck {
  std::string name;
  std::function<Spec(int sm)> build;
};

std::vector<GraphCheck>& graph_checks() {
  static std::vector<GraphCheck> checks;
  return checks;
}

// `parts`: how many graphs a layer's variant builds (DynamicQuantize's three), each checked
template <class Layer>
void add_checks(const Layer* layers, const Variant* variants, size_t count, uint8_t (*parts)(const Layer&)) {
  std::map<std::tuple<uint32_t, DType, uint8_t>, bool> seen;
  for (size_t i = 0; i < count; ++i) {
    const Variant& v = variants[i];
    const Layer* layer = &layers[v.layer];
    const DType t = v.dtype;
    for (uint8_t k = 0, n = parts(*layer); k < n; ++k) {
      const uint8_t call = n > 1 ? k : v.call;
      if (seen.emplace(std::make_tuple(v.layer, v.dtype, call), true).second)
        graph_checks().push_back({std::string(v.name) + (n > 1 ? "#" + std::to_string(k) : ""),
                                  [layer, t, call](int sm) { return build(*layer, t, call, sm); }});
    }
  }
}

template <class Layer>
uint8_t one_graph(const Layer&) { return 1; }

uint8_t quant_graphs(const QuantLayer& L) { return L.op == QuantOp::DynamicQuantize ? kQuantParts : 1; }

template <class Layer>
void add_graphs(Registry& r, const Layer* layers, const Variant* variants, size_t count) {
  add_family(r, layers, variants, count, make<Layer>);
  add_checks(layers, variants, count, one_graph<Layer>);
}

}  // namespace

int check_graphs(int sm_version) {
  for (const auto& c : graph_checks()) {
    Spec s = c.build(sm_version);
    fe::error_t status = s.graph->validate();
    JsonObject line;
    line.add("name", c.name);
    line.add("ok", status.is_good());
    line.add("message", status.get_message());
    const std::string text = "BENANZA_GRAPH " + line.str() + "\n";
    std::fwrite(text.data(), 1, text.size(), stdout);
  }
  std::fflush(stdout);
  return 0;
}

void add_lnorm(Registry& r, const LnormLayer* l, const Variant* v, size_t n) { add_graphs(r, l, v, n); }
void add_sdpa(Registry& r, const SdpaLayer* l, const Variant* v, size_t n) { add_graphs(r, l, v, n); }
void add_pointwise(Registry& r, const PointwiseLayer* l, const Variant* v, size_t n) { add_graphs(r, l, v, n); }
void add_rope(Registry& r, const RopeLayer* l, const Variant* v, size_t n) { add_graphs(r, l, v, n); }
void add_resample(Registry& r, const ResampleLayer* l, const Variant* v, size_t n) { add_graphs(r, l, v, n); }
void add_qconv(Registry& r, const QconvLayer* l, const Variant* v, size_t n) {
  add_family(r, l, v, n, make_qconv);
  add_checks(l, v, n, one_graph<QconvLayer>);
}
void add_quant(Registry& r, const QuantLayer* l, const Variant* v, size_t n) {
  add_family(r, l, v, n, make_quant);
  add_checks(l, v, n, quant_graphs);
}

}  // namespace benanza::cudnn
