#include "benanza/onednn.hpp"

#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include <dnnl.hpp>
#ifdef BENANZA_HAVE_OPENMP
#include <omp.h>
#endif

#define BENANZA_DNNL3 (DNNL_VERSION_MAJOR >= 3)

namespace benanza {
namespace onednn {
namespace {

using dnnl::algorithm;
using dnnl::memory;
using dnnl::prop_kind;
using tag = memory::format_tag;
using dt = memory::data_type;

dnnl::engine& engine() {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

dnnl::stream& stream() {
  static dnnl::stream s(engine());
  return s;
}

// A problem oneDNN cannot run as asked, found before oneDNN is called (e.g. an ONNX
// broadcast oneDNN's binary primitive does not accept): recorded as unsupported.
struct Unsupported : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string isa_name() {
  switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "isa_" + std::to_string(static_cast<int>(dnnl_get_effective_cpu_isa()));
  }
}

bool has_avx512() {
  auto isa = dnnl_get_effective_cpu_isa();
  return isa == dnnl_cpu_isa_avx512_core || isa == dnnl_cpu_isa_avx512_core_vnni ||
         isa == dnnl_cpu_isa_avx512_core_bf16 || isa == dnnl_cpu_isa_avx512_core_amx;
}

dt data_type(DType d) {
  switch (d) {
    case DType::bf16: return dt::bf16;
    case DType::u8:
    case DType::boolean: return dt::u8;
    case DType::s8: return dt::s8;
    default: return dt::f32;
  }
}

tag plain_tag(size_t rank) {
  switch (rank) {
    case 1: return tag::a;
    case 2: return tag::ab;
    case 3: return tag::abc;
    case 4: return tag::abcd;
    case 5: return tag::abcde;
    case 6: return tag::abcdef;
  }
  throw Unsupported("tensor rank " + std::to_string(rank) + " (oneDNN plain layouts go up to 6)");
}

// 4-d activation layout for the non-convolution ops; `any` means the blocked layout a
// oneDNN conv chain would hand them (8 channels per block on AVX2, 16 on AVX-512).
tag activation_tag(Layout l) {
  switch (l) {
    case Layout::nchw: return tag::nchw;
    case Layout::nhwc: return tag::nhwc;
    case Layout::any: return has_avx512() ? tag::nChw16c : tag::nChw8c;
    case Layout::plain:
    case Layout::axis_inner: return tag::nchw;  // never asked for: only softmax uses it
  }
  return tag::nchw;
}

memory::desc md(const Dims& dims, DType d, tag t) { return memory::desc(dims, data_type(d), t); }
memory::desc plain_md(const Dims& dims, DType d) { return md(dims, d, plain_tag(dims.size())); }

Dims dims_of(const memory::desc& d) {
#if BENANZA_DNNL3
  return d.get_dims();
#else
  return d.dims();
#endif
}

dt dtype_of(const memory::desc& d) {
#if BENANZA_DNNL3
  return d.get_data_type();
#else
  return d.data_type();
#endif
}

// The k-th tensor a benchmark fills is the generator's stream k (runtime.hpp: fill_value), so
// `benanza check` can rebuild every input; measure() restarts the count for each benchmark.
uint64_t& fill_stream() {
  static uint64_t next = 0;
  return next;
}

// How a stream's values v (multiples of 1/128 in [-1, 1)) become a tensor's: as they are for
// float data; integers 128·v for signed data; for unsigned data (quantized activations and
// their zero points) floor(64·v + 64), in [0, 127]: an int8 kernel without VNNI multiplies
// u8 by s8 with an instruction that saturates each pair of products at int16, which 7-bit
// activations never reach (|2·127·128| < 32767), so a check compares the computation on every
// ISA rather than one CPU's saturation; scales 2^floor(4·v) (positive, exact reciprocals), or
// their reciprocals where oneDNN 2.x wants 1/s.
// Booleans (u8 0/1): v ≥ 0, so a mask has both values in about equal shares.
enum class Fill { value, signed_int, unsigned_int, scale, inverse_scale, boolean };

Fill fill_of(dt t) {
  if (t == dt::u8) return Fill::unsigned_int;
  if (t == dt::s8 || t == dt::s32) return Fill::signed_int;
  return Fill::value;
}

float fill_as(Fill f, float v) {
  switch (f) {
    case Fill::signed_int: return 128.f * v;
    case Fill::unsigned_int: return std::floor(64.f * v + 64.f);
    case Fill::scale: return std::exp2(std::floor(4.f * v));
    case Fill::inverse_scale: return std::exp2(-std::floor(4.f * v));
    case Fill::boolean: return v >= 0.f ? 1.f : 0.f;
    default: return v;
  }
}

// The next stream's n values as `how` makes them (stream 0 with the test hook's one wrong
// element), in the row-major order of the tensor the generator fills.
std::vector<float> next_stream(size_t n, Fill how) {
  uint64_t k = fill_stream()++;
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = fill_as(how, fill_value(k, i));
  if (k == 0 && n > 0 && perturb_input()) v[n / 2] += how == Fill::value ? 0.5f : 64.f;  // the test hook: one wrong input element
  return v;
}

// `values`, laid out as `order` over the target's logical dims, written plainly in f32, then
// reordered into the target layout and type (blocked layouts get correct zero padding, strided
// ones their strides).
memory from_values(const memory::desc& target, tag order, const std::vector<float>& values) {
  memory out(target, engine());
  memory src(memory::desc(dims_of(target), dt::f32, order), engine());
  std::copy(values.begin(), values.end(), static_cast<float*>(src.get_data_handle()));
  dnnl::reorder(src, out).execute(stream(), src, out);
  stream().wait();
  return out;
}

// The generator's values in the row-major order of the target's logical dims.
memory filled(const memory::desc& target, Fill how) {
  Dims dims = dims_of(target);
  if (dims.empty()) {
    ++fill_stream();
    return memory(target, engine());
  }
  size_t n = static_cast<size_t>(std::accumulate(dims.begin(), dims.end(), int64_t{1}, std::multiplies<int64_t>()));
  return from_values(target, plain_tag(dims.size()), next_stream(n, how));
}

memory filled(const memory::desc& target) { return filled(target, fill_of(dtype_of(target))); }

// The attribute every benchmark uses: scratchpad owned by us, so its size is the workspace.
dnnl::primitive_attr base_attr() {
  dnnl::primitive_attr a;
  a.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return a;
}

void append_eltwise(dnnl::post_ops& po, algorithm alg, float alpha, float beta) {
#if BENANZA_DNNL3
  po.append_eltwise(alg, alpha, beta);
#else
  po.append_eltwise(1.f, alg, alpha, beta);
#endif
}

void append_relu(dnnl::primitive_attr& attr) {
  dnnl::post_ops po;
  append_eltwise(po, algorithm::eltwise_relu, 0.f, 0.f);
  attr.set_post_ops(po);
}

// One primitive call and its memories; a benchmark times all its steps in order.
struct Step {
  dnnl::primitive prim;
  std::unordered_map<int, memory> args;
  // host work between two calls instead of a primitive (a dynamic quantization's scale from
  // the range its reductions found), run after the calls before it have finished
  std::function<void()> host;
};

void run_step(Step& s) {
  if (s.host) {
    stream().wait();
    s.host();
  } else {
    s.prim.execute(stream(), s.args);
  }
}

// What check mode writes of a benchmark: a memory read in the row-major order of its logical
// dims, or (`raw`) its buffer as it lies, under `dims` (a Transpose's destination, whose
// strides already lay it out in the output's order).
struct Output {
  memory mem;
  bool raw;
  Dims dims;
};

struct Prepared {
  std::vector<Step> steps;
  std::string impl;
  size_t scratchpad = 0;
  std::vector<memory> owners;  // buffers the steps' memories only view (a region's source)
  std::vector<Output> outputs;  // check mode; empty: the last step's destination

  memory& dst() { return steps.back().args.at(DNNL_ARG_DST); }
  // Appends another prepared call: a chain (attention) or several copies (Split).
  void then(Prepared&& next) {
    for (auto& s : next.steps) steps.push_back(std::move(s));
    impl += (impl.empty() ? "" : " + ") + next.impl;
    scratchpad = std::max(scratchpad, next.scratchpad);
  }
};

const char* dtype_name(dt d) {
  switch (d) {
    case dt::f32: return "f32";
    case dt::bf16: return "bf16";
    case dt::u8: return "u8";
    case dt::s8: return "s8";
    case dt::s32: return "s32";
    default: throw std::runtime_error("check mode: an output of an unexpected data type");
  }
}

// Check mode: the benchmark's outputs, each in plain row-major order, to the check file.
void write_outputs(Prepared& p) {
  if (p.outputs.empty()) p.outputs.push_back({p.dst(), false, {}});
  std::vector<memory> plain;  // keeps the reordered copies alive until they are written
  std::vector<CheckOutput> out;
  for (Output& o : p.outputs) {
    memory::desc d = o.mem.get_desc();
    memory m = o.mem;
    Dims dims = o.raw ? o.dims : dims_of(d);
    if (!o.raw) {
      m = memory(memory::desc(dims, dtype_of(d), plain_tag(dims.size())), engine());
      dnnl::reorder(o.mem, m).execute(stream(), o.mem, m);
      stream().wait();
    }
    plain.push_back(m);
    out.push_back({dtype_name(dtype_of(d)), dims, m.get_data_handle(), m.get_desc().get_size()});
  }
  write_check(out);
}

// Binds the memories a primitive needs: `inputs` by argument id (filled from the pd's
// descriptors) unless `bound` gives the memory (a previous step's output), the destination
// and the scratchpad.
template <class Prim, class PD>
Prepared prepare(const PD& pd, const std::vector<std::pair<int, memory::desc>>& inputs,
                 const std::vector<std::pair<int, memory>>& bound = {}) {
  Step s;
  s.prim = Prim(pd);
  for (const auto& in : bound) s.args[in.first] = in.second;
  for (const auto& in : inputs)
    if (!s.args.count(in.first)) s.args[in.first] = filled(in.second);
  if (!s.args.count(DNNL_ARG_DST)) s.args[DNNL_ARG_DST] = memory(pd.dst_desc(), engine());
  memory::desc sp = pd.scratchpad_desc();
  s.args[DNNL_ARG_SCRATCHPAD] = memory(sp, engine());
  Prepared p;
  p.scratchpad = sp.get_size();
  p.impl = pd.impl_info_str();
  p.steps.push_back(std::move(s));
  return p;
}

// Creation errors are the library refusing the problem (unimplemented → unsupported);
// anything thrown later is a failure of a problem it accepted.
void measure(benchmark::State& st, const Config& cfg, const std::function<Prepared()>& make) {
  Prepared p;
  fill_stream() = 0;
  try {
    p = make();
  } catch (const dnnl::error& e) {
    std::string msg = std::string("oneDNN: ") + e.what();
    if (e.status == dnnl_unimplemented) {
      if (cfg.dtype == DType::bf16) msg += " (bf16 on effective ISA " + isa_name() + ")";
      mark_unsupported(st, msg);
    } else {
      mark_failed(st, msg + " (status " + std::to_string(static_cast<int>(e.status)) + ")");
    }
    return;
  } catch (const Unsupported& e) {
    mark_unsupported(st, std::string("benanza: ") + e.what());
    return;
  } catch (const std::exception& e) {
    mark_failed(st, e.what());
    return;
  }
  auto run = [&p] {
    for (auto& s : p.steps) run_step(s);
    stream().wait();
  };
  if (check_mode()) {  // one untimed run (the loop's single iteration), its outputs written
    try {
      for (auto _ : st) run();
      write_outputs(p);
    } catch (const std::exception& e) {
      mark_failed(st, std::string("check: ") + e.what());
      return;
    }
    set_implementation(st, p.impl);
    return;
  }
  try {
    warm_up(run);
  } catch (const std::exception& e) {
    mark_failed(st, std::string("execute: ") + e.what());
    return;
  }
  time_each_call(st, run);
  set_implementation(st, p.impl);
  set_workspace(st, p.scratchpad);
}

#if BENANZA_DNNL3
using Pooling = dnnl::pooling_forward;
using Softmax = dnnl::softmax_forward;
#else
using Pooling = dnnl::pooling_v2_forward;
using Softmax = dnnl::softmax_v2_forward;
#endif

Dims pad_rank(const Dims& d, size_t rank) {
  Dims out(rank - std::min(rank, d.size()), 1);
  out.insert(out.end(), d.begin(), d.end());
  return out;
}

// oneDNN wants the right/bottom padding that makes the output size come out exactly
// (ONNX ceil_mode and SAME padding are expressed through it).
int64_t end_pad(int64_t in, int64_t out, int64_t k, int64_t s, int64_t d, int64_t begin) {
  return (out - 1) * s + (k - 1) * d + 1 - in - begin;
}

// --- convolution -------------------------------------------------------------------------

algorithm conv_alg(ConvAlgo a) {
  switch (a) {
    case ConvAlgo::winograd: return algorithm::convolution_winograd;
    case ConvAlgo::automatic: return algorithm::convolution_auto;
    default: return algorithm::convolution_direct;
  }
}

// Convolution and deconvolution take the same descriptors; the primitive, its algorithm, its
// post-ops and the end padding (read from the output's side for a deconvolution) differ.
template <typename Primitive>
Prepared make_conv_like(const ConvParams& c, const Config& cfg, algorithm alg, const memory::dims& pr,
                        const dnnl::primitive_attr& attr) {
  tag t = cfg.layout == Layout::nhwc ? tag::nhwc : cfg.layout == Layout::any ? tag::any : tag::nchw;
  auto src = md({c.mb, c.ic, c.ih, c.iw}, cfg.dtype, t);
  auto dst = md({c.mb, c.oc, c.oh, c.ow}, cfg.dtype, t);
  // Weights are constants a framework reorders once at load time: let oneDNN pick their layout.
  Dims wdims = c.g > 1 ? Dims{c.g, c.oc / c.g, c.ic / c.g, c.kh, c.kw} : Dims{c.oc, c.ic, c.kh, c.kw};
  auto wei = md(wdims, cfg.dtype, tag::any);
  auto bias = memory::desc({c.oc}, dt::f32, tag::x);
  memory::dims strides{c.sh, c.sw}, dil{c.dh - 1, c.dw - 1}, pl{c.pt, c.pl};
  auto pk = prop_kind::forward_inference;
#if BENANZA_DNNL3
  auto pd = cfg.bias
      ? typename Primitive::primitive_desc(engine(), pk, alg, src, wei, bias, dst, strides, dil, pl, pr, attr)
      : typename Primitive::primitive_desc(engine(), pk, alg, src, wei, dst, strides, dil, pl, pr, attr);
#else
  auto d = cfg.bias ? typename Primitive::desc(pk, alg, src, wei, bias, dst, strides, dil, pl, pr)
                    : typename Primitive::desc(pk, alg, src, wei, dst, strides, dil, pl, pr);
  typename Primitive::primitive_desc pd(d, attr, engine());
#endif
  std::vector<std::pair<int, memory::desc>> in{{DNNL_ARG_SRC, pd.src_desc()}, {DNNL_ARG_WEIGHTS, pd.weights_desc()}};
  if (cfg.bias) in.push_back({DNNL_ARG_BIAS, pd.bias_desc()});
  return prepare<Primitive>(pd, in);
}

Prepared make_conv(const ConvParams& c, const Config& cfg) {
  memory::dims pr{end_pad(c.ih, c.oh, c.kh, c.sh, c.dh, c.pt), end_pad(c.iw, c.ow, c.kw, c.sw, c.dw, c.pl)};
  auto attr = base_attr();
  if (cfg.relu) append_relu(attr);
  return make_conv_like<dnnl::convolution_forward>(c, cfg, conv_alg(cfg.algo), pr, attr);
}

// --- transposed convolution (deconvolution) -----------------------------------------------

Prepared make_deconv(const ConvParams& c, const Config& cfg) {
  memory::dims pr{end_pad(c.oh, c.ih, c.kh, c.sh, c.dh, c.pt), end_pad(c.ow, c.iw, c.kw, c.sw, c.dw, c.pl)};
  return make_conv_like<dnnl::deconvolution_forward>(c, cfg, algorithm::deconvolution_direct, pr, base_attr());
}

// --- resampling (ONNX Resize of the spatial dims) ---------------------------------------------

Prepared make_resample(const ResampleParams& r, const Config& cfg) {
  std::string a = r.alg;
  auto alg = a == "linear" ? algorithm::resampling_linear : algorithm::resampling_nearest;
  auto src = plain_md(r.in, cfg.dtype), dst = plain_md(r.out, cfg.dtype);
  auto attr = base_attr();
  auto pk = prop_kind::forward_inference;
#if BENANZA_DNNL3
  dnnl::resampling_forward::primitive_desc pd(engine(), pk, alg, src, dst, attr);
#else
  dnnl::resampling_forward::desc d(pk, alg, src, dst);
  dnnl::resampling_forward::primitive_desc pd(d, attr, engine());
#endif
  return prepare<dnnl::resampling_forward>(pd, {{DNNL_ARG_SRC, pd.src_desc()}});
}

// --- recurrent layers (ONNX LSTM, GRU, RNN) ------------------------------------------------

// The ONNX gate that oneDNN's gate g of a cell is: LSTM i,f,c,o from ONNX's i,o,f,c; GRU u,r,o
// are ONNX's z,r,h in order; a vanilla RNN has one gate.
int onnx_gate(const std::string& cell, int64_t g) {
  static const int lstm[] = {0, 2, 3, 1};
  return cell == "lstm" ? lstm[g] : static_cast<int>(g);
}

// ONNX's W [D, G·H, I] (or R, I = H), gates in ONNX's order, as oneDNN's weights [1, D, I, G, H]
// (ldigo) in its gate order, reordered into the layout the primitive picked (frameworks do that
// once at load time).
memory rnn_weights(const memory::desc& target, const std::string& cell, int64_t dirs, int64_t in, int64_t gates,
                   int64_t hidden) {
  std::vector<float> onnx = next_stream(static_cast<size_t>(dirs * gates * hidden * in), Fill::value);
  std::vector<float> v(onnx.size());
  size_t k = 0;
  for (int64_t d = 0; d < dirs; ++d)
    for (int64_t i = 0; i < in; ++i)
      for (int64_t g = 0; g < gates; ++g)
        for (int64_t h = 0; h < hidden; ++h)
          v[k++] = onnx[static_cast<size_t>(((d * gates + onnx_gate(cell, g)) * hidden + h) * in + i)];
  return from_values(target, tag::ldigo, v);
}

// ONNX's B [D, 2·G·H] (the input's biases Wb, then the recurrence's Rb) as oneDNN's bias
// [1, D, G, H]: Wb + Rb per gate; a linear-before-reset GRU keeps them apart for its candidate
// (gate 2: Wbh) and has a fourth row (Rbh, added inside the reset gate's product).
memory rnn_bias(const memory::desc& target, const RnnParams& r, int64_t gates) {
  const std::string cell = r.cell;
  const int64_t h_ = r.hidden, rows = r.lbr ? gates + 1 : gates;
  std::vector<float> onnx = next_stream(static_cast<size_t>(r.dirs * 2 * gates * h_), Fill::value);
  std::vector<float> v;
  for (int64_t d = 0; d < r.dirs; ++d)
    for (int64_t g = 0; g < rows; ++g)
      for (int64_t h = 0; h < h_; ++h) {
        auto wb = [&](int64_t og) { return onnx[static_cast<size_t>((d * 2 * gates + og) * h_ + h)]; };
        auto rb = [&](int64_t og) { return onnx[static_cast<size_t>((d * 2 * gates + gates + og) * h_ + h)]; };
        if (r.lbr && g == gates) v.push_back(rb(gates - 1));
        else if (r.lbr && g == gates - 1) v.push_back(wb(g));
        else v.push_back(wb(onnx_gate(cell, g)) + rb(onnx_gate(cell, g)));
      }
  return from_values(target, tag::ldgo, v);
}

// ONNX's P [D, 3·H] (gates i, o, f) as oneDNN's peephole weights [1, D, 3, H] (gates i, f, o:
// its LSTM cell adds row 0 to the input gate, 1 to the forget gate, 2 to the output gate).
memory lstm_peephole(const memory::desc& target, int64_t dirs, int64_t hidden) {
  static const int onnx_of[] = {0, 2, 1};
  std::vector<float> onnx = next_stream(static_cast<size_t>(dirs * 3 * hidden), Fill::value);
  std::vector<float> v;
  for (int64_t d = 0; d < dirs; ++d)
    for (int64_t g = 0; g < 3; ++g)
      for (int64_t h = 0; h < hidden; ++h) v.push_back(onnx[static_cast<size_t>((d * 3 + onnx_of[g]) * hidden + h)]);
  return from_values(target, tag::ldgo, v);
}

// One ONNX LSTM/GRU/RNN node as one oneDNN RNN primitive (one layer, ONNX's direction, every
// sequence full length: the Python side covers only those). Fills X, W, R, then B, initial_h,
// initial_c and an LSTM's peepholes P where the node has them, in ONNX's layouts; the check
// output is ONNX's Y [T, D, N, H] (batch first: [N, T, D, H]), a strided view of oneDNN's
// [T, N, D·H] destination.
Prepared make_rnn(const RnnParams& r, const Config& cfg) {
  const std::string cell = r.cell;
  const int64_t gates = cell == "lstm" ? 4 : cell == "gru" ? 3 : 1;
  const int64_t t = r.seq, n = r.mb, h = r.hidden, d = r.dirs;
  auto dir = d == 2 ? dnnl::rnn_direction::bidirectional_concat
             : r.reverse ? dnnl::rnn_direction::unidirectional_right2left
                         : dnnl::rnn_direction::unidirectional_left2right;
  tag seq_tag = r.batch_first ? tag::ntc : tag::tnc;
  auto src = md({t, n, r.ic}, cfg.dtype, seq_tag);
  auto dst = md({t, n, d * h}, cfg.dtype, tag::tnc);
  auto wl = md({1, d, r.ic, gates, h}, cfg.dtype, tag::any), wi = md({1, d, h, gates, h}, cfg.dtype, tag::any);
  const int64_t bias_rows = r.lbr ? gates + 1 : gates;
  // oneDNN 2.6 refused a vanilla RNN without a bias descriptor ("could not create a primitive
  // descriptor iterator"): a layer without B gets zeros, as ONNX defines it
  auto bias = memory::desc({1, d, bias_rows, h}, dt::f32, tag::any);
  const memory::desc none;
  // ONNX's initial_h and initial_c [D, N, H] are oneDNN's [1, D, N, H] (ldnc) as they lie
  auto h0 = r.init_h ? md({1, d, n, h}, cfg.dtype, tag::ldnc) : none;
  auto c0 = r.init_c ? md({1, d, n, h}, cfg.dtype, tag::ldnc) : none;
  // f32 whatever the variant's type: oneDNN's cell reads peepholes as floats
  auto peep = r.peephole ? memory::desc({1, d, 3, h}, dt::f32, tag::ldgo) : none;
  auto attr = base_attr();
  auto pk = prop_kind::forward_inference;
  Prepared p;
  auto finish = [&](const auto& pd, auto prim) {
    std::vector<std::pair<int, memory>> bound;
    bound.push_back({DNNL_ARG_SRC_LAYER, r.batch_first
                                            ? from_values(pd.src_layer_desc(), tag::ntc,
                                                          next_stream(static_cast<size_t>(t * n * r.ic), Fill::value))
                                            : filled(pd.src_layer_desc())});
    bound.push_back({DNNL_ARG_WEIGHTS_LAYER, rnn_weights(pd.weights_layer_desc(), cell, d, r.ic, gates, h)});
    bound.push_back({DNNL_ARG_WEIGHTS_ITER, rnn_weights(pd.weights_iter_desc(), cell, d, h, gates, h)});
    bound.push_back({DNNL_ARG_BIAS, r.bias ? rnn_bias(pd.bias_desc(), r, gates)
                                           : from_values(pd.bias_desc(), tag::ldgo,
                                                         std::vector<float>(static_cast<size_t>(d * bias_rows * h)))});
    for (int arg : {DNNL_ARG_SRC_ITER, DNNL_ARG_SRC_ITER_C}) {
      memory::desc state = pd.query_md(dnnl::query::exec_arg_md, arg);
      if (!dims_of(state).empty()) bound.push_back({arg, filled(state)});
    }
    if (r.peephole) bound.push_back({DNNL_ARG_WEIGHTS_PEEPHOLE, lstm_peephole(pd.weights_peephole_desc(), d, h)});
    memory y(pd.dst_layer_desc(), engine());
    bound.push_back({DNNL_ARG_DST_LAYER, y});
    p = prepare<decltype(prim)>(pd, {}, bound);
    Dims dims = r.batch_first ? Dims{n, t, d, h} : Dims{t, d, n, h};
    Dims strides = r.batch_first ? Dims{d * h, n * d * h, h, 1} : Dims{n * d * h, h, d * h, 1};
    p.outputs.push_back({memory(memory::desc(dims, dtype_of(pd.dst_layer_desc()), strides), engine(),
                                y.get_data_handle()), false, {}});
  };
#if BENANZA_DNNL3
  if (cell == "lstm") {
    finish(dnnl::lstm_forward::primitive_desc(engine(), pk, dir, src, h0, c0, wl, wi, peep, bias, dst, none, none,
                                              attr),
           dnnl::lstm_forward());
  } else if (cell == "gru" && r.lbr) {
    finish(dnnl::lbr_gru_forward::primitive_desc(engine(), pk, dir, src, h0, wl, wi, bias, dst, none, attr),
           dnnl::lbr_gru_forward());
  } else if (cell == "gru") {
    finish(dnnl::gru_forward::primitive_desc(engine(), pk, dir, src, h0, wl, wi, bias, dst, none, attr),
           dnnl::gru_forward());
  } else {
    finish(dnnl::vanilla_rnn_forward::primitive_desc(engine(), pk, algorithm::eltwise_tanh, dir, src, h0, wl, wi,
                                                     bias, dst, none, attr),
           dnnl::vanilla_rnn_forward());
  }
#else
  if (cell == "lstm") {
    dnnl::lstm_forward::desc desc(pk, dir, src, h0, c0, wl, wi, peep, bias, dst, none, none);
    finish(dnnl::lstm_forward::primitive_desc(desc, attr, engine()), dnnl::lstm_forward());
  } else if (cell == "gru" && r.lbr) {
    dnnl::lbr_gru_forward::desc desc(pk, dir, src, h0, wl, wi, bias, dst, none);
    finish(dnnl::lbr_gru_forward::primitive_desc(desc, attr, engine()), dnnl::lbr_gru_forward());
  } else if (cell == "gru") {
    dnnl::gru_forward::desc desc(pk, dir, src, h0, wl, wi, bias, dst, none);
    finish(dnnl::gru_forward::primitive_desc(desc, attr, engine()), dnnl::gru_forward());
  } else {
    dnnl::vanilla_rnn_forward::desc desc(pk, algorithm::eltwise_tanh, dir, src, h0, wl, wi, bias, dst, none);
    finish(dnnl::vanilla_rnn_forward::primitive_desc(desc, attr, engine()), dnnl::vanilla_rnn_forward());
  }
#endif
  return p;
}

// --- pooling -----------------------------------------------------------------------------

algorithm pool_alg(const std::string& a) {
  if (a == "max" || a == "gmax") return algorithm::pooling_max;
  if (a == "avgi") return algorithm::pooling_avg_include_padding;
  if (a == "avgx" || a == "gavg") return algorithm::pooling_avg_exclude_padding;
  throw Unsupported("pooling algorithm " + a);
}

Prepared make_pool(const PoolParams& p, const Config& cfg) {
  tag t = activation_tag(cfg.layout);
  auto src = md({p.mb, p.ic, p.ih, p.iw}, cfg.dtype, t);
  auto dst = md({p.mb, p.ic, p.oh, p.ow}, cfg.dtype, t);
  memory::dims strides{p.sh, p.sw}, kernel{p.kh, p.kw}, dil{p.dh - 1, p.dw - 1}, pl{p.pt, p.pl};
  memory::dims pr{end_pad(p.ih, p.oh, p.kh, p.sh, p.dh, p.pt), end_pad(p.iw, p.ow, p.kw, p.sw, p.dw, p.pl)};
  auto attr = base_attr();
  auto pk = prop_kind::forward_inference;
#if BENANZA_DNNL3
  dnnl::pooling_forward::primitive_desc pd(engine(), pk, pool_alg(p.alg), src, dst, strides, kernel, dil, pl, pr, attr);
#else
  dnnl::pooling_v2_forward::desc d(pk, pool_alg(p.alg), src, dst, strides, kernel, dil, pl, pr);
  dnnl::pooling_v2_forward::primitive_desc pd(d, attr, engine());
#endif
  return prepare<Pooling>(pd, {{DNNL_ARG_SRC, pd.src_desc()}});
}

// --- batch normalization (inference: global statistics, scale and shift) -----------------

Prepared make_bnorm(const BnormParams& b, const Config& cfg) {
  auto data = md({b.mb, b.ic, b.ih, b.iw}, cfg.dtype, activation_tag(cfg.layout));
  auto flags = dnnl::normalization_flags::use_global_stats | dnnl::normalization_flags::use_scale |
               dnnl::normalization_flags::use_shift;
  auto attr = base_attr();
  if (cfg.relu) append_relu(attr);
  auto pk = prop_kind::forward_inference;
#if BENANZA_DNNL3
  dnnl::batch_normalization_forward::primitive_desc pd(engine(), pk, data, data, b.eps, flags, attr);
#else
  dnnl::batch_normalization_forward::desc d(pk, data, b.eps, flags);
  dnnl::batch_normalization_forward::primitive_desc pd(d, attr, engine());
#endif
  auto channel = memory::desc({b.ic}, dt::f32, tag::x);
  return prepare<dnnl::batch_normalization_forward>(pd, {{DNNL_ARG_SRC, pd.src_desc()}, {DNNL_ARG_MEAN, pd.mean_desc()},
                      {DNNL_ARG_VARIANCE, pd.variance_desc()}, {DNNL_ARG_SCALE, channel},
                      {DNNL_ARG_SHIFT, channel}});
}

// --- LRN ---------------------------------------------------------------------------------

Prepared make_lrn(const LrnParams& l, const Config& cfg) {
  auto data = md({l.mb, l.ic, l.ih, l.iw}, cfg.dtype, activation_tag(cfg.layout));
  auto attr = base_attr();
  auto pk = prop_kind::forward_inference;
  auto alg = algorithm::lrn_across_channels;
#if BENANZA_DNNL3
  dnnl::lrn_forward::primitive_desc pd(engine(), pk, alg, data, data, l.size, l.alpha, l.beta, l.k, attr);
#else
  dnnl::lrn_forward::desc d(pk, alg, data, l.size, l.alpha, l.beta, l.k);
  dnnl::lrn_forward::primitive_desc pd(d, attr, engine());
#endif
  return prepare<dnnl::lrn_forward>(pd, {{DNNL_ARG_SRC, pd.src_desc()}});
}

// --- element-wise ------------------------------------------------------------------------

struct EltAlg {
  algorithm alg;
  float alpha, beta;
};

EltAlg eltwise_alg(const EltwiseParams& e) {
  std::string a = e.alg;
  if (a == "relu") return {algorithm::eltwise_relu, 0.f, 0.f};
  if (a == "leakyrelu") return {algorithm::eltwise_relu, e.alpha, 0.f};
  if (a == "sigmoid") return {algorithm::eltwise_logistic, 0.f, 0.f};
  if (a == "tanh") return {algorithm::eltwise_tanh, 0.f, 0.f};
  if (a == "elu") return {algorithm::eltwise_elu, e.alpha, 0.f};
  // Clip bounds only known at run time (NaN) cost the same as any others: clip to ±FLT_MAX.
  if (a == "clip") {
    float lo = e.alpha == e.alpha ? std::max(e.alpha, -FLT_MAX) : -FLT_MAX;
    float hi = e.beta == e.beta ? std::min(e.beta, FLT_MAX) : FLT_MAX;
    return {algorithm::eltwise_clip, lo, hi};
  }
  if (a == "softplus") return {algorithm::eltwise_soft_relu, 1.f, 0.f};
  if (a == "exp") return {algorithm::eltwise_exp, 0.f, 0.f};
  if (a == "log") return {algorithm::eltwise_log, 0.f, 0.f};
  if (a == "abs") return {algorithm::eltwise_abs, 0.f, 0.f};
  if (a == "sqrt") return {algorithm::eltwise_sqrt, 0.f, 0.f};
  if (a == "reciprocal") return {algorithm::eltwise_pow, 1.f, -1.f};  // 1·x^-1
  if (a == "neg") return {algorithm::eltwise_linear, -1.f, 0.f};
  if (a == "swish") return {algorithm::eltwise_swish, e.alpha, 0.f};
  if (a == "gelu") return {algorithm::eltwise_gelu_erf, 0.f, 0.f};
  if (a == "gelutanh") return {algorithm::eltwise_gelu_tanh, 0.f, 0.f};
  // ONNX HardSwish is x·max(0, min(1, x/6 + 1/2)): oneDNN's hardswish with alpha 1/6, beta 1/2
  // (oneDNN 2.x has no parameters and computes exactly that).
#if BENANZA_DNNL3
  if (a == "hardswish") return {algorithm::eltwise_hardswish, 1.f / 6.f, 0.5f};
#else
  if (a == "hardswish") return {algorithm::eltwise_hardswish, 0.f, 0.f};
#endif
#if BENANZA_DNNL3
  if (a == "hardsigmoid") return {algorithm::eltwise_hardsigmoid, e.alpha, e.beta};
#else
  // oneDNN 2.x has no hardsigmoid: alpha·x + beta (linear) clipped to [0, 1] by a post-op.
  if (a == "hardsigmoid") return {algorithm::eltwise_linear, e.alpha, e.beta};
#endif
  throw Unsupported("element-wise " + a + " has no oneDNN " + std::to_string(DNNL_VERSION_MAJOR) +
                    ".x algorithm");
}

// ONNX IsNaN: oneDNN has no isnan algorithm, but x != x holds exactly for NaN (IEEE, unordered
// compare), so binary_ne with one tensor bound as both sources computes it, writing u8 0/1.
Prepared make_isnan(const EltwiseParams& e, const Config& cfg) {
  Dims shape = pad_rank(e.shape, std::max<size_t>(e.shape.size(), 1));
  auto src = plain_md(shape, cfg.dtype);
  memory::desc dst(shape, dt::u8, plain_tag(shape.size()));
#if BENANZA_DNNL3
  dnnl::binary::primitive_desc pd(engine(), algorithm::binary_ne, src, src, dst, base_attr());
#else
  dnnl::binary::desc d(algorithm::binary_ne, src, src, dst);
  dnnl::binary::primitive_desc pd(d, base_attr(), engine());
#endif
  memory x = filled(pd.src_desc(0));
  return prepare<dnnl::binary>(pd, {}, {{DNNL_ARG_SRC_0, x}, {DNNL_ARG_SRC_1, x}});
}

Prepared make_eltwise(const EltwiseParams& e, const Config& cfg) {
  if (std::string(e.alg) == "isnan") return make_isnan(e, cfg);
  auto data = plain_md(e.shape, cfg.dtype);
  EltAlg a = eltwise_alg(e);
  auto attr = base_attr();
#if !BENANZA_DNNL3
  if (std::string(e.alg) == "hardsigmoid") {
    dnnl::post_ops po;
    po.append_eltwise(1.f, algorithm::eltwise_clip, 0.f, 1.f);
    attr.set_post_ops(po);
  }
#endif
  auto pk = prop_kind::forward_inference;
#if BENANZA_DNNL3
  dnnl::eltwise_forward::primitive_desc pd(engine(), pk, a.alg, data, data, a.alpha, a.beta, attr);
#else
  dnnl::eltwise_forward::desc d(pk, a.alg, data, a.alpha, a.beta);
  dnnl::eltwise_forward::primitive_desc pd(d, attr, engine());
#endif
  return prepare<dnnl::eltwise_forward>(pd, {{DNNL_ARG_SRC, pd.src_desc()}});
}

Prepared make_prelu(const PreluParams& p, const Config& cfg) {
  auto src = plain_md(p.shape, cfg.dtype);
  auto slope = plain_md(pad_rank(p.slope, p.shape.size()), cfg.dtype);
  auto attr = base_attr();
  auto pk = prop_kind::forward_inference;
#if BENANZA_DNNL3
  dnnl::prelu_forward::primitive_desc pd(engine(), pk, src, slope, src, attr);
#else
  dnnl::prelu_forward::desc d(pk, src, slope);
  dnnl::prelu_forward::primitive_desc pd(d, attr, engine());
#endif
  return prepare<dnnl::prelu_forward>(pd, {{DNNL_ARG_SRC, pd.src_desc()}, {DNNL_ARG_WEIGHTS, pd.weights_desc()}});
}

// --- binary and n-ary sums ---------------------------------------------------------------

algorithm binary_alg(const std::string& a) {
  if (a == "add" || a == "sum") return algorithm::binary_add;
  if (a == "sub") return algorithm::binary_sub;
  if (a == "mul") return algorithm::binary_mul;
  if (a == "div") return algorithm::binary_div;
  if (a == "min") return algorithm::binary_min;
  if (a == "max") return algorithm::binary_max;
  if (a == "eq") return algorithm::binary_eq;
  // ONNX And, Or of booleans held as u8 0/1: min(a, b) is 1 only where both are, max where either
  if (a == "and") return algorithm::binary_min;
  if (a == "or") return algorithm::binary_max;
  if (a == "gt") return algorithm::binary_gt;
  if (a == "lt") return algorithm::binary_lt;
  throw Unsupported("binary algorithm " + a);
}

// ONNX's `alg`(a, b) on the sources the generator swapped (src0 = b, src1 = a): commutative
// algorithms as they are, a comparison flipped (a > b is b < a), and a − b = −(b − a),
// a / b = (b / a)^−1 as the swapped operation with an element-wise post-op (`post`, an
// eltwise_alg name), applied in f32 before the result is written. Exact for the subtraction
// and the comparisons; the division rounds twice, a few units in the last place of a / b.
struct Mirror {
  algorithm alg;
  const char* post;
};

Mirror mirrored(const std::string& a) {
  if (a == "add" || a == "sum" || a == "mul" || a == "min" || a == "max" || a == "eq" || a == "and" || a == "or")
    return {binary_alg(a), nullptr};
  if (a == "gt") return {algorithm::binary_lt, nullptr};
  if (a == "lt") return {algorithm::binary_gt, nullptr};
  if (a == "sub") return {algorithm::binary_sub, "neg"};
  if (a == "div") return {algorithm::binary_div, "reciprocal"};
  throw Unsupported("binary " + a + " with its first input broadcast: no mirrored oneDNN form");
}

Prepared make_sum(const BinaryParams& b, const Config& cfg) {
  std::vector<memory::desc> srcs;
  for (const auto& d : b.inputs) srcs.push_back(plain_md(d, cfg.dtype));
  std::vector<float> scales(srcs.size(), 1.f);
  auto dst = plain_md(b.out, cfg.dtype);
  auto attr = base_attr();
#if BENANZA_DNNL3
  dnnl::sum::primitive_desc pd(engine(), dst, scales, srcs, attr);
#else
  dnnl::sum::primitive_desc pd(dst, scales, srcs, engine(), attr);
#endif
  std::vector<std::pair<int, memory::desc>> in;
  for (size_t i = 0; i < srcs.size(); ++i) in.push_back({DNNL_ARG_MULTIPLE_SRC + static_cast<int>(i), srcs[i]});
  return prepare<dnnl::sum>(pd, in);
}

// x^c, c a constant: oneDNN's eltwise pow (alpha·x^beta with alpha 1).
Prepared make_pow(const BinaryParams& b, const Config& cfg) {
  if (b.exponent != b.exponent) throw Unsupported("Pow with a tensor of exponents");
  if (b.inputs.at(0) != b.out) throw Unsupported("Pow broadcasts its base");
  auto data = plain_md(b.out, cfg.dtype);
  auto attr = base_attr();
  auto pk = prop_kind::forward_inference;
#if BENANZA_DNNL3
  dnnl::eltwise_forward::primitive_desc pd(engine(), pk, algorithm::eltwise_pow, data, data, 1.f, b.exponent, attr);
#else
  dnnl::eltwise_forward::desc d(pk, algorithm::eltwise_pow, data, 1.f, b.exponent);
  dnnl::eltwise_forward::primitive_desc pd(d, attr, engine());
#endif
  return prepare<dnnl::eltwise_forward>(pd, {{DNNL_ARG_SRC, pd.src_desc()}});
}

Prepared make_binary(const BinaryParams& b, const Config& cfg) {
  std::string alg = b.alg;
  if (alg == "pow") return make_pow(b, cfg);
  bool equal_shapes = std::all_of(b.inputs.begin(), b.inputs.end(), [&](const Dims& d) { return d == b.out; });
  if (b.inputs.size() > 2) {
    if (alg == "sum" && equal_shapes) return make_sum(b, cfg);
    throw Unsupported(std::to_string(b.inputs.size()) + "-input " + alg +
                      " with broadcasting (oneDNN binary takes two inputs)");
  }
  size_t rank = std::max<size_t>(b.out.size(), 1);
  Dims a0 = pad_rank(b.inputs.at(0), rank), a1 = pad_rank(b.inputs.at(1), rank), out = pad_rank(b.out, rank);
  // oneDNN broadcasts src1 only; the generator already put a broadcast first ONNX operand second
  if (a0 != out) throw Unsupported("binary " + alg + " broadcasts both inputs; oneDNN broadcasts src1 only");
  auto s0 = plain_md(a0, cfg.dtype), s1 = plain_md(a1, cfg.dtype), dst = plain_md(out, cfg.dtype);
  // comparisons write ONNX booleans: one byte each, as u8 0/1
  if (alg == "eq" || alg == "gt" || alg == "lt") dst = memory::desc(out, dt::u8, plain_tag(out.size()));
  Mirror m = b.swapped ? mirrored(alg) : Mirror{binary_alg(alg), nullptr};
  auto attr = base_attr();
  if (m.post) {
    EltAlg e = eltwise_alg(EltwiseParams{m.post, {}, 0.f, 0.f});
    dnnl::post_ops po;
    append_eltwise(po, e.alg, e.alpha, e.beta);
    attr.set_post_ops(po);
  }
#if BENANZA_DNNL3
  dnnl::binary::primitive_desc pd(engine(), m.alg, s0, s1, dst, attr);
#else
  dnnl::binary::desc d(m.alg, s0, s1, dst);
  dnnl::binary::primitive_desc pd(d, attr, engine());
#endif
  std::vector<std::pair<int, memory>> bound;
  if (cfg.dtype == DType::boolean)  // 0/1, not the quantized activations' u8 values
    bound = {{DNNL_ARG_SRC_0, filled(pd.src_desc(0), Fill::boolean)},
             {DNNL_ARG_SRC_1, filled(pd.src_desc(1), Fill::boolean)}};
  return prepare<dnnl::binary>(pd, {{DNNL_ARG_SRC_0, pd.src_desc(0)}, {DNNL_ARG_SRC_1, pd.src_desc(1)}}, bound);
}

// --- GEMM, MatMul ------------------------------------------------------------------------

template <class PD>
PD matmul_pd(const memory::desc& a, const memory::desc& b, const memory::desc* bias, const memory::desc& c,
             const dnnl::primitive_attr& attr) {
#if BENANZA_DNNL3
  return bias ? PD(engine(), a, b, *bias, c, attr) : PD(engine(), a, b, c, attr);
#else
  auto d = bias ? dnnl::matmul::desc(a, b, *bias, c) : dnnl::matmul::desc(a, b, c);
  return PD(d, attr, engine());
#endif
}

Prepared make_gemm(const GemmParams& g, const Config& cfg) {
  if (g.alpha != 1.f)
    throw Unsupported("Gemm alpha=" + std::to_string(g.alpha) + " (only alpha=1 is generated)");
  bool bias = g.has_c && g.beta != 0.f;  // beta scales a constant C: folded into its values
  auto attr = base_attr();
  if (g.inner_product) {
    auto src = md({g.m, g.k}, cfg.dtype, tag::ab);
    auto wei = md({g.n, g.k}, cfg.dtype, tag::any);
    auto b = memory::desc({g.n}, dt::f32, tag::x);
    auto dst = md({g.m, g.n}, cfg.dtype, tag::ab);
    auto pk = prop_kind::forward_inference;
#if BENANZA_DNNL3
    auto pd = bias ? dnnl::inner_product_forward::primitive_desc(engine(), pk, src, wei, b, dst, attr)
                   : dnnl::inner_product_forward::primitive_desc(engine(), pk, src, wei, dst, attr);
#else
    auto d = bias ? dnnl::inner_product_forward::desc(pk, src, wei, b, dst)
                  : dnnl::inner_product_forward::desc(pk, src, wei, dst);
    dnnl::inner_product_forward::primitive_desc pd(d, attr, engine());
#endif
    std::vector<std::pair<int, memory::desc>> in{{DNNL_ARG_SRC, pd.src_desc()}, {DNNL_ARG_WEIGHTS, pd.weights_desc()}};
    if (bias) in.push_back({DNNL_ARG_BIAS, pd.bias_desc()});
    return prepare<dnnl::inner_product_forward>(pd, in);
  }
  // Transposed operands are read through strides, as a framework hands them over.
  memory::desc a({g.m, g.k}, data_type(cfg.dtype), g.ta ? memory::dims{1, g.m} : memory::dims{g.k, 1});
  memory::desc b({g.k, g.n}, data_type(cfg.dtype), g.tb ? memory::dims{1, g.k} : memory::dims{g.n, 1});
  auto c = md({g.m, g.n}, cfg.dtype, tag::ab);
  memory::desc bias_md = plain_md(pad_rank(g.c, 2), cfg.dtype);
  auto pd = matmul_pd<dnnl::matmul::primitive_desc>(a, b, bias ? &bias_md : nullptr, c, attr);
  std::vector<std::pair<int, memory::desc>> in{{DNNL_ARG_SRC, pd.src_desc()}, {DNNL_ARG_WEIGHTS, pd.weights_desc()}};
  if (bias) in.push_back({DNNL_ARG_BIAS, bias_md});
  return prepare<dnnl::matmul>(pd, in);
}

// ONNX MatMul's operands and result: 1-d operands promoted (a → 1×k, b → k×1), batch dims
// broadcast.
struct MatmulDims {
  Dims a, b, c;
};

MatmulDims matmul_dims(const MatmulParams& m) {
  MatmulDims d{m.a.size() == 1 ? Dims{1, m.a[0]} : m.a, m.b.size() == 1 ? Dims{m.b[0], 1} : m.b, {}};
  size_t rank = std::max(d.a.size(), d.b.size());
  d.a = pad_rank(d.a, rank);
  d.b = pad_rank(d.b, rank);
  d.c.resize(rank);
  for (size_t i = 0; i + 2 < rank; ++i) d.c[i] = std::max(d.a[i], d.b[i]);
  d.c[rank - 2] = d.a[rank - 2];
  d.c[rank - 1] = d.b[rank - 1];
  return d;
}

Prepared make_attention(const MatmulParams& m, const Config& cfg);

Prepared make_matmul(const MatmulParams& m, const Config& cfg) {
  if (cfg.attention) return make_attention(m, cfg);
  MatmulDims d = matmul_dims(m);
  size_t rank = d.c.size();
  auto attr = base_attr();
  if (cfg.gelu || cfg.relu) {  // the fused MatMul→Add→Gelu or MatMul→Add→Relu epilogue
    dnnl::post_ops po;
    append_eltwise(po, cfg.gelu ? algorithm::eltwise_gelu_erf : algorithm::eltwise_relu, 0.f, 0.f);
    attr.set_post_ops(po);
  }
  // The fused bias Add: one value per output column, broadcast over the rows.
  memory::desc bias_md = plain_md(pad_rank({d.c[rank - 1]}, rank), cfg.dtype);
  auto pd = matmul_pd<dnnl::matmul::primitive_desc>(plain_md(d.a, cfg.dtype), plain_md(d.b, cfg.dtype),
                                                     cfg.bias ? &bias_md : nullptr, plain_md(d.c, cfg.dtype), attr);
  std::vector<std::pair<int, memory::desc>> in{{DNNL_ARG_SRC, pd.src_desc()}, {DNNL_ARG_WEIGHTS, pd.weights_desc()}};
  if (cfg.bias) in.push_back({DNNL_ARG_BIAS, bias_md});
  return prepare<dnnl::matmul>(pd, in);
}

// --- softmax -----------------------------------------------------------------------------

// The dims of ``shape`` laid out with ``axes`` innermost (in their order), the others in their
// order outside them.
memory::desc axes_inner_md(const Dims& shape, const Dims& axes, DType dtype) {
  Dims strides(shape.size());
  int64_t stride = 1;
  for (size_t k = axes.size(); k-- > 0;) {
    size_t at = static_cast<size_t>(axes[k]);
    strides.at(at) = stride;
    stride *= shape.at(at);
  }
  for (size_t i = shape.size(); i-- > 0;) {
    if (std::find(axes.begin(), axes.end(), static_cast<int64_t>(i)) != axes.end()) continue;
    strides[i] = stride;
    stride *= shape[i];
  }
  return memory::desc(shape, data_type(dtype), strides);
}

Prepared make_softmax(const SoftmaxParams& s, const Config& cfg) {
  Dims shape = s.shape;
  int axis = s.axis;
  if (s.flat) {  // opset < 13: coerced to 2-d at `axis`
    int64_t outer = 1, inner = 1;
    for (int i = 0; i < static_cast<int>(shape.size()); ++i) (i < axis ? outer : inner) *= shape[i];
    shape = {outer, inner};
    axis = 1;
  }
  auto data = plain_md(shape, cfg.dtype);
  auto alg = std::string(s.alg) == "logsoftmax" ? algorithm::softmax_log : algorithm::softmax_accurate;
  auto over = cfg.layout == Layout::axis_inner ? axes_inner_md(shape, {axis}, cfg.dtype) : data;
  auto attr = base_attr();
  auto pk = prop_kind::forward_inference;
#if BENANZA_DNNL3
  dnnl::softmax_forward::primitive_desc pd(engine(), pk, alg, over, over, axis, attr);
#else
  dnnl::softmax_v2_forward::desc d(pk, alg, over, over, axis);
  dnnl::softmax_v2_forward::primitive_desc pd(d, attr, engine());
#endif
  if (cfg.layout != Layout::axis_inner) return prepare<Softmax>(pd, {{DNNL_ARG_SRC, pd.src_desc()}});
  // The tensor arrives and leaves row-major, as the model's neighbours hand it over: the two
  // reorders are part of the cost, the softmax runs in place between them.
  dnnl::reorder::primitive_desc to(engine(), data, engine(), over, base_attr());
  Prepared chain = prepare<dnnl::reorder>(to, {{DNNL_ARG_FROM, data}});
  memory inner = chain.dst();
  chain.then(prepare<Softmax>(pd, {}, {{DNNL_ARG_SRC, inner}, {DNNL_ARG_DST, inner}}));
  dnnl::reorder::primitive_desc back(engine(), over, engine(), data, base_attr());
  chain.then(prepare<dnnl::reorder>(back, {}, {{DNNL_ARG_FROM, inner}}));
  return chain;
}

// --- attention: oneDNN's primitive chain ------------------------------------------------

// scores = Q·Kᵀ (K read through `k_t`, a [.., D, Skv] view), times `scale` and plus `mask`
// (broadcast) as post-ops where given; softmax over the keys in place; then P·V.
Prepared attention_chain(const Dims& q, const memory::desc& k_t, const Dims& v, const Dims* mask, const float* scale,
                         DType dtype) {
  size_t rank = q.size();
  if (rank < 3 || v.size() != rank) throw Unsupported("attention without batch or head dims");
#if BENANZA_DNNL3
  int64_t skv = k_t.get_dims()[rank - 1];
#else
  int64_t skv = k_t.dims()[rank - 1];
#endif
  Dims scores = q;
  scores[rank - 1] = skv;
  auto attr = base_attr();
  dnnl::post_ops po;
  if (scale) append_eltwise(po, algorithm::eltwise_linear, *scale, 0.f);
  memory::desc mask_md = mask ? plain_md(pad_rank(*mask, rank), dtype) : memory::desc();
  if (mask) po.append_binary(algorithm::binary_add, mask_md);
  attr.set_post_ops(po);
  auto scores_pd = matmul_pd<dnnl::matmul::primitive_desc>(plain_md(q, dtype), k_t, nullptr, plain_md(scores, dtype),
                                                           attr);
  std::vector<std::pair<int, memory::desc>> in{{DNNL_ARG_SRC, scores_pd.src_desc()},
                                               {DNNL_ARG_WEIGHTS, scores_pd.weights_desc()}};
  if (mask) in.push_back({DNNL_ARG_ATTR_MULTIPLE_POST_OP(scale ? 1 : 0) | DNNL_ARG_SRC_1, mask_md});
  Prepared chain = prepare<dnnl::matmul>(scores_pd, in);
  memory probs = chain.dst();

  auto probs_md = scores_pd.dst_desc();
  auto pk = prop_kind::forward_inference;
  int axis = static_cast<int>(rank) - 1;
#if BENANZA_DNNL3
  dnnl::softmax_forward::primitive_desc sm_pd(engine(), pk, algorithm::softmax_accurate, probs_md, probs_md, axis,
                                              base_attr());
#else
  dnnl::softmax_v2_forward::desc sm_d(pk, algorithm::softmax_accurate, probs_md, probs_md, axis);
  dnnl::softmax_v2_forward::primitive_desc sm_pd(sm_d, base_attr(), engine());
#endif
  chain.then(prepare<Softmax>(sm_pd, {}, {{DNNL_ARG_SRC, probs}, {DNNL_ARG_DST, probs}}));

  Dims out = scores;
  out[rank - 1] = v[rank - 1];
  auto pv_pd = matmul_pd<dnnl::matmul::primitive_desc>(probs_md, plain_md(v, dtype), nullptr, plain_md(out, dtype),
                                                       base_attr());
  chain.then(prepare<dnnl::matmul>(pv_pd, {{DNNL_ARG_WEIGHTS, pv_pd.weights_desc()}}, {{DNNL_ARG_SRC, probs}}));
  return chain;
}

// The fused pattern from its scores' MatMul (Q [.., S, D] · Kᵀ [.., D, Skv]): the mask is one
// [S, Skv] (the pattern matches no other), V's head size is Q's.
Prepared make_attention(const MatmulParams& m, const Config& cfg) {
  MatmulDims d = matmul_dims(m);
  size_t rank = d.c.size();
  if (rank < 3) throw Unsupported("attention without batch or head dims");
  Dims mask{d.c[rank - 2], d.c[rank - 1]};
  Dims v = d.c;
  v[rank - 2] = d.c[rank - 1];
  v[rank - 1] = d.a[rank - 1];
  float scale = 1.f / std::sqrt(static_cast<float>(d.a[rank - 1]));
  return attention_chain(d.a, plain_md(d.b, cfg.dtype), v, cfg.mask ? &mask : nullptr, cfg.scale ? &scale : nullptr,
                         cfg.dtype);
}

// The ONNX Attention op: K [.., Skv, D] is read transposed through its strides; a causal
// mask is one more additive [S, Skv] mask (a framework merges it with attn_mask). With fewer
// K/V heads than Q's (grouped-query attention) the G = H/Hkv query heads of one KV head are
// one more batch dim: Q [B, Hkv, G, S, D] (Q's own memory) times Kᵀ [B, Hkv, 1, D, Skv], which
// matmul broadcasts over G, so K and V are read as they are, never expanded.
Prepared make_attention_op(const AttentionParams& a, const Config& cfg) {
  size_t rank = a.k.size();
  if (rank != 4 || a.q.size() != 4 || a.k[1] != a.v[1] || a.q[1] % a.k[1] != 0)
    throw Unsupported("attention over other than 4-d Q/K/V with KV heads dividing Q's");
  int64_t group = a.q[1] / a.k[1];
  Dims q = a.q, k = a.k, v = a.v;
  if (group > 1) {
    q = {a.q[0], a.k[1], group, a.q[2], a.q[3]};
    k = {a.k[0], a.k[1], 1, a.k[2], a.k[3]};
    v = {a.v[0], a.v[1], 1, a.v[2], a.v[3]};
    rank = 5;
  }
  Dims kt = k;
  std::swap(kt[rank - 1], kt[rank - 2]);
  Dims strides(rank);
  int64_t stride = 1;
  for (size_t i = rank; i-- > 0;) {  // k's row-major strides, the last two dims swapped
    size_t src = i == rank - 1 ? rank - 2 : i == rank - 2 ? rank - 1 : i;
    strides[src] = stride;
    stride *= k[i];
  }
  memory::desc k_t(kt, data_type(cfg.dtype), strides);
  Dims mask = a.mask.empty() ? Dims{a.q[2], a.k[2]} : a.mask;
  bool masked = !a.mask.empty() || a.causal;
  return attention_chain(q, k_t, v, masked ? &mask : nullptr, &a.scale, cfg.dtype);
}

// --- concat ------------------------------------------------------------------------------

Prepared make_concat(const ConcatParams& c, const Config& cfg) {
  std::vector<memory::desc> srcs;
  for (const auto& d : c.inputs) {
    srcs.push_back(d.size() == 4 && cfg.layout != Layout::plain ? md(d, cfg.dtype, activation_tag(cfg.layout))
                                                                 : plain_md(d, cfg.dtype));
  }
  auto attr = base_attr();
#if BENANZA_DNNL3
  dnnl::concat::primitive_desc pd(engine(), c.axis, srcs, attr);
#else
  dnnl::concat::primitive_desc pd(c.axis, srcs, engine(), attr);
#endif
  std::vector<std::pair<int, memory::desc>> in;
  for (size_t i = 0; i < srcs.size(); ++i) in.push_back({DNNL_ARG_MULTIPLE_SRC + static_cast<int>(i), srcs[i]});
  return prepare<dnnl::concat>(pd, in);
}

// --- layer normalization -----------------------------------------------------------------

Prepared make_lnorm(const LnormParams& l, const Config& cfg) {
  // The dims from `axis` on are contiguous: one normalised axis of their product.
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < static_cast<int>(l.shape.size()); ++i) (i < l.axis ? outer : inner) *= l.shape[i];
  auto data = plain_md({outer, inner}, cfg.dtype);
  auto flags = dnnl::normalization_flags::use_scale;
  if (l.bias) flags = flags | dnnl::normalization_flags::use_shift;
  if (l.rms) {
    // oneDNN's RMS mode of layer normalization came in 3.4 (compiled against 3.12's headers here;
    // the 2.6 and 3.2 this project builds with lack it)
#if DNNL_VERSION_MAJOR > 3 || (DNNL_VERSION_MAJOR == 3 && DNNL_VERSION_MINOR >= 4)
    flags = flags | dnnl::normalization_flags::rms_norm;
#else
    throw Unsupported("RMS normalization: oneDNN " + std::to_string(DNNL_VERSION_MAJOR) + "." +
                      std::to_string(DNNL_VERSION_MINOR) + " has no RMS mode of layer normalization");
#endif
  }
  auto attr = base_attr();
  auto pk = prop_kind::forward_inference;
#if BENANZA_DNNL3
  dnnl::layer_normalization_forward::primitive_desc pd(engine(), pk, data, data, l.eps, flags, attr);
#else
  dnnl::layer_normalization_forward::desc d(pk, data, l.eps, flags);
  dnnl::layer_normalization_forward::primitive_desc pd(d, attr, engine());
#endif
  auto channel = memory::desc({inner}, dt::f32, tag::x);
  std::vector<std::pair<int, memory::desc>> in{{DNNL_ARG_SRC, pd.src_desc()}, {DNNL_ARG_SCALE, channel}};
  if (l.bias) in.push_back({DNNL_ARG_SHIFT, channel});
  return prepare<dnnl::layer_normalization_forward>(pd, in);
}

// --- reductions --------------------------------------------------------------------------

algorithm reduce_alg(const std::string& a) {
  if (a == "mean") return algorithm::reduction_mean;
  if (a == "sum") return algorithm::reduction_sum;
  if (a == "max") return algorithm::reduction_max;
  if (a == "min") return algorithm::reduction_min;
  if (a == "prod") return algorithm::reduction_mul;
  // (sum |x|^p)^(1/p) with eps 0: p = 1 is ONNX's ReduceL1, p = 2 its ReduceL2
  if (a == "sumabs" || a == "sqrtsumsq") return algorithm::reduction_norm_lp_sum;
  throw Unsupported("reduction " + a);
}

// The p of the p-norm sums (ReduceL1, ReduceL2); the other algorithms ignore it.
float reduce_p(const std::string& a) { return a == "sumabs" ? 1.f : a == "sqrtsumsq" ? 2.f : 0.f; }

Prepared make_reduce(const ReduceParams& r, const Config& cfg) {
  Dims shape = r.shape;
  Dims out = r.shape;
  for (int64_t a : r.axes) out.at(static_cast<size_t>(a)) = 1;  // keepdims: the same bytes either way
  auto plain = plain_md(shape, cfg.dtype);
  Prepared chain;
  memory moved;
  if (cfg.layout == Layout::axis_inner) {
    // Reordered with the reduced axes innermost, then reduced as the plain tensor of the permuted
    // dims over its last ones: oneDNN's optimized reductions take those; the output (reduced
    // dims of size 1) has the row-major bytes either way.
    Dims order;
    for (size_t i = 0; i < shape.size(); ++i)
      if (std::find(r.axes.begin(), r.axes.end(), static_cast<int64_t>(i)) == r.axes.end())
        order.push_back(static_cast<int64_t>(i));
    for (int64_t a : r.axes) order.push_back(a);
    dnnl::reorder::primitive_desc to(engine(), plain, engine(), axes_inner_md(shape, r.axes, cfg.dtype),
                                     base_attr());
    chain = prepare<dnnl::reorder>(to, {{DNNL_ARG_FROM, plain}});
    Dims permuted, permuted_out;
    for (int64_t i : order) {
      permuted.push_back(shape.at(static_cast<size_t>(i)));
      permuted_out.push_back(out.at(static_cast<size_t>(i)));
    }
    shape = permuted;
    out = permuted_out;
    moved = memory(plain_md(shape, cfg.dtype), engine(), chain.dst().get_data_handle());
  }
  auto src = plain_md(shape, cfg.dtype), dst = plain_md(out, cfg.dtype);
  const float p = reduce_p(r.alg);
  auto attr = base_attr();
#if BENANZA_DNNL3
  dnnl::reduction::primitive_desc pd(engine(), reduce_alg(r.alg), src, dst, p, 0.f, attr);
#else
  dnnl::reduction::desc d(reduce_alg(r.alg), src, dst, p, 0.f);
  dnnl::reduction::primitive_desc pd(d, attr, engine());
#endif
  if (cfg.layout != Layout::axis_inner) return prepare<dnnl::reduction>(pd, {{DNNL_ARG_SRC, pd.src_desc()}});
  chain.then(prepare<dnnl::reduction>(pd, {}, {{DNNL_ARG_SRC, moved}}));
  return chain;
}

// --- transpose: a reorder into the permuted layout ---------------------------------------

Prepared make_transpose(const TransposeParams& t, const Config& cfg) {
  // The destination keeps the source's logical dims; its strides lay them out in the output's
  // order (output dim i is input dim perm[i]), so the reorder writes the transposed tensor.
  size_t rank = t.shape.size();
  Dims strides(rank);
  int64_t stride = 1;
  for (size_t i = rank; i-- > 0;) {
    strides.at(static_cast<size_t>(t.perm.at(i))) = stride;
    stride *= t.shape.at(static_cast<size_t>(t.perm.at(i)));
  }
  auto src = plain_md(t.shape, cfg.dtype);
  memory::desc dst(t.shape, data_type(cfg.dtype), strides);
  auto attr = base_attr();
  dnnl::reorder::primitive_desc pd(engine(), src, engine(), dst, attr);
  Prepared p = prepare<dnnl::reorder>(pd, {{DNNL_ARG_FROM, src}});
  Dims out(rank);
  for (size_t i = 0; i < rank; ++i) out[i] = t.shape.at(static_cast<size_t>(t.perm[i]));
  p.outputs.push_back({p.dst(), true, out});  // the bytes as written: the transposed tensor
  return p;
}

// --- data movement: reorders copying the same bytes --------------------------------------

Prepared make_copy(const CopyParams& c, const Config& cfg) {
  Prepared all;
  memory src;
  if (c.region) src = filled(plain_md(c.src, cfg.dtype));
  for (size_t i = 0; i < c.outs.size(); ++i) {
    auto dst = plain_md(c.outs[i], cfg.dtype);
    // a box of the input, read through the input's strides (a view of its buffer)
    memory from = c.region ? memory(src.get_desc().submemory_desc(c.outs[i], c.offsets.at(i)), engine(),
                                    src.get_data_handle())
                           : filled(dst);
    dnnl::reorder::primitive_desc pd(engine(), from.get_desc(), engine(), dst, base_attr());
    all.then(prepare<dnnl::reorder>(pd, {}, {{DNNL_ARG_FROM, from}}));
  }
  if (all.steps.empty()) throw Unsupported(std::string(c.op) + " with no outputs");
  if (c.region) all.owners.push_back(src);
  for (auto& s : all.steps) all.outputs.push_back({s.args.at(DNNL_ARG_DST), false, {}});
  return all;
}

// --- Pad: no oneDNN primitive pads; what a framework runs for a constant zero Pad ------------

// PyTorch's constant_pad_nd fills the output, then copies the input into the box of it that the
// leading pads offset: here a zero fill (one memset on the calling thread) and a reorder of the
// input into that box, viewed through the output's strides.
Prepared make_pad(const PadParams& p, const Config& cfg) {
  Dims out(p.shape.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = p.before.at(i) + p.shape[i] + p.after.at(i);
  memory dst(plain_md(out, cfg.dtype), engine());
  memory box(dst.get_desc().submemory_desc(p.shape, p.before), engine(), dst.get_data_handle());
  auto src = plain_md(p.shape, cfg.dtype);
  dnnl::reorder::primitive_desc pd(engine(), src, engine(), box.get_desc(), base_attr());
  Prepared all;
  Step fill;
  const size_t bytes = dst.get_desc().get_size();
  fill.host = [dst, bytes] { std::memset(dst.get_data_handle(), 0, bytes); };
  all.steps.push_back(std::move(fill));
  all.impl = "memset";
  all.then(prepare<dnnl::reorder>(pd, {{DNNL_ARG_FROM, src}}, {{DNNL_ARG_TO, box}}));
  all.owners.push_back(dst);
  all.outputs.push_back({dst, false, {}});  // the whole padded tensor
  return all;
}

// --- casts and quantized layers ------------------------------------------------------------

// A type word of benanza/ops/cast.py as oneDNN's data type.
dt type_of_word(const std::string& w) {
  if (w == "float") return dt::f32;
  if (w == "bfloat") return dt::bf16;
  if (w == "half") return dt::f16;
  if (w == "int") return dt::s32;
  if (w == "sbyte") return dt::s8;
  if (w == "byte") return dt::u8;
  throw Unsupported("data type " + w + " (oneDNN has no such type)");
}

Dims at_least_1d(const Dims& d) { return d.empty() ? Dims{1} : d; }

Prepared make_cast(const CastParams& c, const Config& cfg) {
  Dims shape = at_least_1d(c.shape);
  memory::desc src(shape, type_of_word(c.from), plain_tag(shape.size()));
  auto dst = plain_md(shape, cfg.dtype);
  dnnl::reorder::primitive_desc pd(engine(), src, engine(), dst, base_attr());
  return prepare<dnnl::reorder>(pd, {{DNNL_ARG_FROM, src}});
}

// Run-time zero points of `arg` (mask 0: one per tensor), s32 as oneDNN takes them.
void zero_points(dnnl::primitive_attr& attr, int arg, int mask) {
#if BENANZA_DNNL3
  attr.set_zero_points_mask(arg, mask);
#else
  attr.set_zero_points(arg, mask, {DNNL_RUNTIME_S32_VAL});
#endif
}

// Run-time scales s as ONNX applies them: a dequantization's dst = s·(src − zp) (`on_src`), a
// quantization's dst = src/s + zp. oneDNN 3.x scales the source by s or divides by the
// destination's s; 2.x has one output scale, which multiplies: 1/s for a quantization
// (`*inverse`). Returns the argument the scales' memory binds to.
int scales(dnnl::primitive_attr& attr, bool on_src, int mask, bool* inverse) {
#if BENANZA_DNNL3
  *inverse = false;
  int arg = on_src ? DNNL_ARG_SRC : DNNL_ARG_DST;
  attr.set_scales_mask(arg, mask);
  return DNNL_ARG_ATTR_SCALES | arg;
#else
  *inverse = !on_src;
  attr.set_output_scales(mask, {DNNL_RUNTIME_F32_VAL});
  return DNNL_ARG_ATTR_OUTPUT_SCALES;
#endif
}

memory zero_point_memory(int64_t n, bool is_unsigned) {
  return filled(memory::desc({n}, dt::s32, tag::a), is_unsigned ? Fill::unsigned_int : Fill::signed_int);
}

memory::desc scales_md(int64_t n) { return memory::desc({n}, dt::f32, tag::a); }

// The scales of a QLinear op (its input's, its weights' (`n`: 1 or per output channel), its
// output's), filled in that order and bound as oneDNN takes them: 3.x three scale arguments
// (attributes set by the caller), 2.x one output scale sa·sb/sy (exact: the fills are powers
// of two). Returns the three memories.
std::array<memory, 3> bind_requant_scales(std::vector<std::pair<int, memory>>& bound, int64_t n) {
  memory sa = filled(scales_md(1), Fill::scale), sb = filled(scales_md(n), Fill::scale);
  memory sy = filled(scales_md(1), Fill::scale);
#if BENANZA_DNNL3
  bound.push_back({DNNL_ARG_ATTR_SCALES | DNNL_ARG_SRC, sa});
  bound.push_back({DNNL_ARG_ATTR_SCALES | DNNL_ARG_WEIGHTS, sb});
  bound.push_back({DNNL_ARG_ATTR_SCALES | DNNL_ARG_DST, sy});
#else
  memory combined(scales_md(n), engine());
  const float* pa = static_cast<float*>(sa.get_data_handle());
  const float* pb = static_cast<float*>(sb.get_data_handle());
  const float* py = static_cast<float*>(sy.get_data_handle());
  auto* pc = static_cast<float*>(combined.get_data_handle());
  for (int64_t i = 0; i < n; ++i) pc[i] = pa[0] * pb[i] / py[0];
  bound.push_back({DNNL_ARG_ATTR_OUTPUT_SCALES, combined});
#endif
  return {sa, sb, sy};
}

// MatMulInteger: oneDNN's int8 matmul (s32 result) with the zero points as attributes; fused
// with its Cast→Mul(scale)[→Add(bias)] (`cfg.scale`, `cfg.bias`), an f32 result with one scale
// (oneDNN 3.x: the weights' scale; 2.x: the output scale) and the bias added after it (a binary
// post-op: oneDNN 2.x adds a bias argument before its output scale). QLinearMatMul (`out` a
// byte type): the result requantized with A's, B's and the output's scales (3.x: three scale
// attributes; 2.x: one output scale sa·sb/sy, computed at creation from the same values) and
// the output's zero point. Fills A, B, A's and B's zero points, then the scale and the bias, or
// QLinearMatMul's three scales and its output zero point (streams 0, 1, ... where present).
Prepared make_qmatmul(const QmatmulParams& q, const Config& cfg) {
  MatmulDims d = matmul_dims(MatmulParams{q.a, q.b});
  size_t rank = d.c.size();
  const std::string out = q.out;
  const bool requantized = out != "int";
  const int column = 1 << (rank - 1);
  auto attr = base_attr();
  if (q.azp > 1) throw Unsupported("per-row zero points of A");
  if (q.azp) zero_points(attr, DNNL_ARG_SRC, 0);
  if (q.bzp) zero_points(attr, DNNL_ARG_WEIGHTS, q.bzp > 1 ? column : 0);
  const int bmask = q.bscales > 1 ? column : 0;
  if (cfg.scale || requantized) {
#if BENANZA_DNNL3
    if (requantized) {
      attr.set_scales_mask(DNNL_ARG_SRC, 0);
      attr.set_scales_mask(DNNL_ARG_DST, 0);
    }
    attr.set_scales_mask(DNNL_ARG_WEIGHTS, bmask);
#else
    attr.set_output_scales(requantized ? bmask : 0, {DNNL_RUNTIME_F32_VAL});
#endif
  }
  if (requantized) zero_points(attr, DNNL_ARG_DST, 0);
  Dims bias_dims(rank, 1);
  bias_dims[rank - 1] = d.c[rank - 1];
  memory::desc bias_md(bias_dims, dt::f32, plain_tag(rank));
  if (cfg.bias) {
    dnnl::post_ops po;
    po.append_binary(algorithm::binary_add, bias_md);
    attr.set_post_ops(po);
  }
  const std::string a_type = q.a_type;
  memory::desc a(d.a, a_type.empty() ? data_type(cfg.dtype) : type_of_word(a_type), plain_tag(rank));
  const bool unsigned_a = dtype_of(a) == dt::u8;
  memory::desc b(d.b, q.signed_b ? dt::s8 : dt::u8, plain_tag(rank));
  dt result = requantized ? type_of_word(out) : cfg.scale ? dt::f32 : dt::s32;
  memory::desc c(d.c, result, plain_tag(rank));
  auto pd = matmul_pd<dnnl::matmul::primitive_desc>(a, b, nullptr, c, attr);
  memory ma = filled(pd.src_desc()), mb = filled(pd.weights_desc());
  std::vector<std::pair<int, memory>> bound{{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}};
  if (q.azp) bound.push_back({DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, zero_point_memory(1, unsigned_a)});
  if (q.bzp) bound.push_back({DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_WEIGHTS, zero_point_memory(q.bzp, !q.signed_b)});
  if (requantized) {
    bind_requant_scales(bound, q.bscales);
    bound.push_back({DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_DST, zero_point_memory(1, result == dt::u8)});
  } else if (cfg.scale) {
#if BENANZA_DNNL3
    bound.push_back({DNNL_ARG_ATTR_SCALES | DNNL_ARG_WEIGHTS, filled(scales_md(1), Fill::scale)});
#else
    bound.push_back({DNNL_ARG_ATTR_OUTPUT_SCALES, filled(scales_md(1), Fill::scale)});
#endif
  }
  if (cfg.bias) bound.push_back({DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, filled(bias_md)});
  return prepare<dnnl::matmul>(pd, {}, bound);
}

// ConvInteger and QLinearConv: oneDNN's int8 convolution (layouts and algorithm as a float
// conv's), the source's zero point an attribute (oneDNN has no weights' zero points), the result
// s32 or requantized as QLinearMatMul's. ONNX adds QLinearConv's int32 bias to the accumulator
// before requantizing, as oneDNN 2.x does (its output scale scales accumulator + bias); 3.x adds
// the bias after the source's and weights' scales, so there it is the float sa·sb·B. Fills the
// source, the weights, its zero point, the three scales, the output's zero point, the bias.
Prepared make_qconv(const QconvParams& q, const Config& cfg) {
  const std::string out = q.out;
  const bool requantized = out != "int";
  if (cfg.bias && !requantized) throw Unsupported("ConvInteger with a bias");
  tag t = cfg.layout == Layout::nhwc ? tag::nhwc : cfg.layout == Layout::any ? tag::any : tag::nchw;
  const std::string a_type = q.a_type;
  const dt src_type = a_type.empty() ? data_type(cfg.dtype) : type_of_word(a_type);
  memory::desc src({q.mb, q.ic, q.ih, q.iw}, src_type, t);
  dt result = requantized ? type_of_word(out) : dt::s32;
  memory::desc dst({q.mb, q.oc, q.oh, q.ow}, result, t);
  Dims wdims = q.g > 1 ? Dims{q.g, q.oc / q.g, q.ic / q.g, q.kh, q.kw} : Dims{q.oc, q.ic, q.kh, q.kw};
  memory::desc wei(wdims, q.signed_b ? dt::s8 : dt::u8, tag::any);
#if BENANZA_DNNL3
  memory::desc bias({q.oc}, dt::f32, tag::x);
#else
  memory::desc bias({q.oc}, dt::s32, tag::x);
#endif
  auto attr = base_attr();
  if (q.azp > 1) throw Unsupported("per-channel zero points of the input");
  if (q.azp) zero_points(attr, DNNL_ARG_SRC, 0);
  if (requantized) {
#if BENANZA_DNNL3
    attr.set_scales_mask(DNNL_ARG_SRC, 0);
    attr.set_scales_mask(DNNL_ARG_WEIGHTS, q.bscales > 1 ? (q.g > 1 ? 3 : 1) : 0);  // per output channel
    attr.set_scales_mask(DNNL_ARG_DST, 0);
#else
    // oneDNN 2.x convolutions take no run-time output scales: sa·sb/sy as constants, from the
    // streams the three scales are filled from (after the source, weights and zero point)
    uint64_t k = fill_stream() + 2 + (q.azp ? 1 : 0);
    float sa = fill_as(Fill::scale, fill_value(k, 0)), sy = fill_as(Fill::scale, fill_value(k + 2, 0));
    std::vector<float> combined(static_cast<size_t>(q.bscales));
    for (int64_t i = 0; i < q.bscales; ++i)
      combined[static_cast<size_t>(i)] = sa * fill_as(Fill::scale, fill_value(k + 1, static_cast<uint64_t>(i))) / sy;
    attr.set_output_scales(q.bscales > 1 ? 1 << 1 : 0, combined);
#endif
    zero_points(attr, DNNL_ARG_DST, 0);
  }
  memory::dims strides{q.sh, q.sw}, dil{q.dh - 1, q.dw - 1}, pl{q.pt, q.pl};
  memory::dims pr{end_pad(q.ih, q.oh, q.kh, q.sh, q.dh, q.pt), end_pad(q.iw, q.ow, q.kw, q.sw, q.dw, q.pl)};
  auto pk = prop_kind::forward_inference;
  auto alg = conv_alg(cfg.algo);
  using Conv = dnnl::convolution_forward;
#if BENANZA_DNNL3
  auto pd = cfg.bias ? Conv::primitive_desc(engine(), pk, alg, src, wei, bias, dst, strides, dil, pl, pr, attr)
                     : Conv::primitive_desc(engine(), pk, alg, src, wei, dst, strides, dil, pl, pr, attr);
#else
  auto d = cfg.bias ? Conv::desc(pk, alg, src, wei, bias, dst, strides, dil, pl, pr)
                    : Conv::desc(pk, alg, src, wei, dst, strides, dil, pl, pr);
  Conv::primitive_desc pd(d, attr, engine());
#endif
  memory x = filled(pd.src_desc()), w = filled(pd.weights_desc());
  std::vector<std::pair<int, memory>> bound{{DNNL_ARG_SRC, x}, {DNNL_ARG_WEIGHTS, w}};
  if (q.azp) bound.push_back({DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, zero_point_memory(1, src_type == dt::u8)});
  std::array<memory, 3> s;
  if (requantized) {
#if BENANZA_DNNL3
    s = bind_requant_scales(bound, q.bscales);
#else
    fill_stream() += 3;  // the scales, already constants of the primitive
#endif
    bound.push_back({DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_DST, zero_point_memory(1, result == dt::u8)});
  }
  if (cfg.bias) {
    memory b = filled(memory::desc({q.oc}, dt::s32, tag::x));  // ONNX's int32 bias
#if BENANZA_DNNL3
    memory bf(bias, engine());
    const auto* pb = static_cast<int32_t*>(b.get_data_handle());
    const float* sa = static_cast<float*>(s[0].get_data_handle());
    const float* sb = static_cast<float*>(s[1].get_data_handle());
    auto* pf = static_cast<float*>(bf.get_data_handle());
    for (int64_t i = 0; i < q.oc; ++i) pf[i] = static_cast<float>(pb[i]) * sa[0] * sb[q.bscales > 1 ? i : 0];
    b = bf;
#endif
    bound.push_back({DNNL_ARG_BIAS, b});
  }
  return prepare<Conv>(pd, {}, bound);
}

template <class PD>
PD reduction_pd(algorithm alg, const memory::desc& src, const memory::desc& dst) {
#if BENANZA_DNNL3
  return PD(engine(), alg, src, dst, 0.f, 0.f, base_attr());
#else
  return PD(dnnl::reduction::desc(alg, src, dst, 0.f, 0.f), base_attr(), engine());
#endif
}

// DynamicQuantizeLinear as ONNX Runtime computes it: the range [min(0, min x), max(0, max x)]
// (two reductions), scale = range/255 and zero point round(−min/scale) on the host, then the
// u8 reorder with them as run-time attributes. Outputs: y, its scale and its zero point.
Prepared make_dynquant(const DynquantParams& q, const Config& cfg) {
  Dims shape = at_least_1d(q.shape);
  size_t rank = shape.size();
  auto src = plain_md(shape, cfg.dtype);
  memory::desc one(Dims(rank, 1), dt::f32, plain_tag(rank));
  auto max_pd = reduction_pd<dnnl::reduction::primitive_desc>(algorithm::reduction_max, src, one);
  auto min_pd = reduction_pd<dnnl::reduction::primitive_desc>(algorithm::reduction_min, src, one);
  Prepared chain = prepare<dnnl::reduction>(max_pd, {{DNNL_ARG_SRC, src}});
  memory x = chain.steps[0].args.at(DNNL_ARG_SRC);
  chain.then(prepare<dnnl::reduction>(min_pd, {}, {{DNNL_ARG_SRC, x}}));
  memory hi = chain.steps[0].args.at(DNNL_ARG_DST), lo = chain.steps[1].args.at(DNNL_ARG_DST);

  auto attr = base_attr();
  bool inverse = false;
  int scale_arg = scales(attr, false, 0, &inverse);
  zero_points(attr, DNNL_ARG_DST, 0);
  memory::desc y(shape, dt::u8, plain_tag(rank));
  dnnl::reorder::primitive_desc pd(engine(), src, engine(), y, attr);
  memory scale_attr({{1}, dt::f32, tag::a}, engine()), zp_attr({{1}, dt::s32, tag::a}, engine());
  memory scale_out({{1}, dt::f32, tag::a}, engine()), zp_out({{1}, dt::u8, tag::a}, engine());
  Step host;
  host.host = [=]() mutable {
    float top = std::max(0.f, *static_cast<float*>(hi.get_data_handle()));
    float bottom = std::min(0.f, *static_cast<float*>(lo.get_data_handle()));
    float s = (top - bottom) / 255.f;
    if (s == 0.f) s = 1.f;  // an all-zero tensor: any scale quantizes it to the zero point 0
    float zp = std::nearbyint(std::min(255.f, std::max(0.f, -bottom / s)));
    *static_cast<float*>(scale_attr.get_data_handle()) = inverse ? 1.f / s : s;
    *static_cast<int32_t*>(zp_attr.get_data_handle()) = static_cast<int32_t>(zp);
    *static_cast<float*>(scale_out.get_data_handle()) = s;
    *static_cast<uint8_t*>(zp_out.get_data_handle()) = static_cast<uint8_t>(zp);
  };
  chain.steps.push_back(std::move(host));
  chain.then(prepare<dnnl::reorder>(pd, {}, {{DNNL_ARG_FROM, x}, {scale_arg, scale_attr},
                                             {DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_DST, zp_attr}}));
  chain.outputs = {{chain.dst(), false, {}}, {scale_out, false, {}}, {zp_out, false, {}}};
  return chain;
}

// QuantizeLinear / DequantizeLinear: a reorder with run-time scales (per tensor or per `axis`)
// and zero point. Fills the input, the scales, then the zero points (streams 0, 1, 2).
Prepared make_qdq(const QdqParams& q, const Config& cfg) {
  Dims shape = at_least_1d(q.shape);
  dt it = type_of_word(q.qtype);
  auto fmd = plain_md(shape, cfg.dtype);
  memory::desc imd(shape, it, plain_tag(shape.size()));
  auto attr = base_attr();
  int mask = q.axis < 0 ? 0 : 1 << q.axis;
  bool inverse = false;
  int scale_arg = scales(attr, q.dequantize, mask, &inverse);
  int zp_of = q.dequantize ? DNNL_ARG_SRC : DNNL_ARG_DST;
  if (q.zp) zero_points(attr, zp_of, mask);
  const auto& src = q.dequantize ? imd : fmd;
  const auto& dst = q.dequantize ? fmd : imd;
  dnnl::reorder::primitive_desc pd(engine(), src, engine(), dst, attr);
  int64_t n = q.axis < 0 ? 1 : shape.at(static_cast<size_t>(q.axis));
  memory x = filled(src);
  memory s = filled(memory::desc({n}, dt::f32, tag::a), inverse ? Fill::inverse_scale : Fill::scale);
  std::vector<std::pair<int, memory>> bound{{DNNL_ARG_FROM, x}, {scale_arg, s}};
  if (q.zp) bound.push_back({DNNL_ARG_ATTR_ZERO_POINTS | zp_of, zero_point_memory(n, it == dt::u8)});
  return prepare<dnnl::reorder>(pd, {}, bound);
}

// --- rotary position embedding --------------------------------------------------------------

// oneDNN has no rotary primitive. Per half of the rotated pairs (a, b), two binary primitives:
// t = b·sin_a, then y_a = a·cos_a − t (a mul with a binary sub post-op reading t); t = a·sin_b,
// then y_b = b·cos_b + t. They read and write strided views of x and y (and of cos and sin where
// each half has its own values), as the tensors lie in a model; the features past `rot` are one
// reorder. Fills x, cos, sin (streams 0, 1, 2).
Prepared make_rope(const RopeParams& r, const Config& cfg) {
  const dt type = data_type(cfg.dtype);
  const size_t size = dnnl_data_type_size(static_cast<dnnl_data_type_t>(type));
  const int64_t d = r.x.back(), half = r.rot / 2;
  // the second of a pair: the next feature (interleaved) or the one half a rotation on
  const int64_t step = r.interleaved ? 2 : 1, second = r.interleaved ? 1 : half;
  memory x = filled(plain_md(r.x, cfg.dtype)), cosines = filled(plain_md(r.cs, cfg.dtype));
  memory sines = filled(plain_md(r.cs, cfg.dtype)), y(plain_md(r.x, cfg.dtype), engine());
  Dims part = r.x;
  part.back() = half;
  memory t(plain_md(part, cfg.dtype), engine());
  // `width` features of each row of m from feature `offset` on, `stride` apart
  auto view = [&](const memory& m, int64_t width, int64_t stride, int64_t offset) {
    Dims dims = dims_of(m.get_desc()), strides(dims.size());
    int64_t s = 1;
    for (size_t i = dims.size(); i-- > 0;) {
      strides[i] = s;
      s *= dims[i];
    }
    dims.back() = width;
    strides.back() = stride;
    return memory(memory::desc(dims, type, strides), engine(), static_cast<char*>(m.get_data_handle()) + offset * size);
  };
  auto mul = [&](const memory& src, const memory& by, const memory& dst, const memory* then, algorithm alg) {
    auto attr = base_attr();
    std::vector<std::pair<int, memory>> bound{{DNNL_ARG_SRC_0, src}, {DNNL_ARG_SRC_1, by}, {DNNL_ARG_DST, dst}};
    if (then) {
      dnnl::post_ops po;
      po.append_binary(alg, then->get_desc());
      attr.set_post_ops(po);
      bound.push_back({DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, *then});
    }
#if BENANZA_DNNL3
    dnnl::binary::primitive_desc pd(engine(), algorithm::binary_mul, src.get_desc(), by.get_desc(), dst.get_desc(),
                                    attr);
#else
    dnnl::binary::desc desc(algorithm::binary_mul, src.get_desc(), by.get_desc(), dst.get_desc());
    dnnl::binary::primitive_desc pd(desc, attr, engine());
#endif
    return prepare<dnnl::binary>(pd, {}, bound);
  };
  const bool split = r.cs.back() == r.rot;  // each half its own cos and sin
  memory ca = split ? view(cosines, half, step, 0) : cosines, cb = split ? view(cosines, half, step, second) : cosines;
  memory sa = split ? view(sines, half, step, 0) : sines, sb = split ? view(sines, half, step, second) : sines;
  memory xa = view(x, half, step, 0), xb = view(x, half, step, second);
  memory ya = view(y, half, step, 0), yb = view(y, half, step, second);
  Prepared all;
  all.then(mul(xb, sa, t, nullptr, algorithm::binary_mul));
  all.then(mul(xa, ca, ya, &t, algorithm::binary_sub));
  all.then(mul(xa, sb, t, nullptr, algorithm::binary_mul));
  all.then(mul(xb, cb, yb, &t, algorithm::binary_add));
  if (r.rot < d) {
    memory from = view(x, d - r.rot, 1, r.rot), to = view(y, d - r.rot, 1, r.rot);
    dnnl::reorder::primitive_desc pd(engine(), from.get_desc(), engine(), to.get_desc(), base_attr());
    all.then(prepare<dnnl::reorder>(pd, {}, {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}}));
  }
  all.owners = {x, cosines, sines, y, t};
  all.outputs.push_back({y, false, {}});
  return all;
}

}  // namespace

#define BENANZA_BENCH(family, Params)                                          \
  void bench_##family(benchmark::State& st, const Params& p, const Config& c) { \
    measure(st, c, [&] { return make_##family(p, c); });                      \
  }

BENANZA_BENCH(conv, ConvParams)
BENANZA_BENCH(pool, PoolParams)
BENANZA_BENCH(bnorm, BnormParams)
BENANZA_BENCH(lrn, LrnParams)
BENANZA_BENCH(eltwise, EltwiseParams)
BENANZA_BENCH(prelu, PreluParams)
BENANZA_BENCH(binary, BinaryParams)
BENANZA_BENCH(gemm, GemmParams)
BENANZA_BENCH(matmul, MatmulParams)
BENANZA_BENCH(softmax, SoftmaxParams)
BENANZA_BENCH(concat, ConcatParams)
BENANZA_BENCH(lnorm, LnormParams)
BENANZA_BENCH(reduce, ReduceParams)
BENANZA_BENCH(transpose, TransposeParams)
BENANZA_BENCH(copy, CopyParams)
BENANZA_BENCH(pad, PadParams)
BENANZA_BENCH(deconv, ConvParams)
BENANZA_BENCH(resample, ResampleParams)
BENANZA_BENCH(rnn, RnnParams)
BENANZA_BENCH(cast, CastParams)
BENANZA_BENCH(qmatmul, QmatmulParams)
BENANZA_BENCH(qconv, QconvParams)
BENANZA_BENCH(dynquant, DynquantParams)
BENANZA_BENCH(qdq, QdqParams)
BENANZA_BENCH(rope, RopeParams)

void bench_attention(benchmark::State& st, const AttentionParams& p, const Config& c) {
  measure(st, c, [&] { return make_attention_op(p, c); });
}

void describe_context() {
  const auto* v = dnnl::version();
  set_context("backend", "onednn");
  set_context("onednn_version", std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
                                    std::to_string(v->patch));
  set_context("onednn_hash", v->hash ? v->hash : "");
  set_context("isa", isa_name());
  set_context("onednn_cpu_runtime", DNNL_CPU_RUNTIME == DNNL_RUNTIME_OMP   ? "omp"
                                    : DNNL_CPU_RUNTIME == DNNL_RUNTIME_TBB ? "tbb"
                                    : DNNL_CPU_RUNTIME == DNNL_RUNTIME_SEQ ? "seq"
                                                                           : "other");
#ifdef BENANZA_HAVE_OPENMP
  set_context("threads", std::to_string(omp_get_max_threads()));
#endif
}

}  // namespace onednn
}  // namespace benanza
