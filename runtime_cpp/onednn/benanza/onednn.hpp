// oneDNN benchmark runtime: one function per layer family, driven by generated tables.
//
// Generated code holds only data (a params table per family and a row per variant); this
// runtime creates the primitive, allocates and fills memory, warms up, and times
// `execute + wait` with real time. Works with oneDNN 2.x (Debian libdnnl-dev) and 3.x (PyPI
// onednn-devel-cpu-gomp): the API differences stay inside onednn.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "benanza/runtime.hpp"

namespace benanza {
namespace onednn {

using Dims = std::vector<int64_t>;

// u8/s8: the activations of a quantized layer (its weights' type is in its params); boolean:
// ONNX bool (And, Or of a mask), held as u8 0/1 as ONNX stores it
enum class DType { f32, bf16, u8, s8, boolean };
// plain: row-major of any rank; nchw/nhwc: 4-d activations; any: the library's choice
// (blocked nChw8c/nChw16c), which is what oneDNN-native frameworks keep between layers.
// axis_inner: a row-major tensor reordered to put an op's axis innermost and back (softmax)
enum class Layout { plain, nchw, nhwc, any, axis_inner };
enum class ConvAlgo { none, direct, winograd, automatic };

// One variant's configuration. `bias`, `relu` and `gelu` describe the fused computation
// (post-ops; a MatMul's bias Add); for an unfused conv `bias` is the layer's own bias.
struct Config {
  DType dtype;
  Layout layout;
  ConvAlgo algo;
  bool bias;
  bool relu;
  bool gelu;  // GELU (erf) post-op: a MatMul→Add→Gelu epilogue
  // Attention as oneDNN's primitive chain from its first MatMul (scores = Q·Kᵀ): the scores'
  // matmul (with a scale post-op and a mask-add post-op where the pattern has them), a softmax
  // over the keys, and the matmul with V (V's head size is Q's).
  bool attention;
  bool scale;
  bool mask;
};

struct Row {
  const char* name;  // Variant.name
  int index;         // into the family's params table
  Config config;
};

struct ConvParams { int64_t mb, ic, ih, iw, oc, oh, ow, kh, kw, sh, sw, pt, pl, dh, dw, g; };
struct PoolParams { const char* alg; int64_t mb, ic, ih, iw, oh, ow, kh, kw, sh, sw, pt, pl, dh, dw; };
struct BnormParams { int64_t mb, ic, ih, iw; float eps; };
struct LrnParams { int64_t mb, ic, ih, iw, size; float alpha, beta, k; };
struct EltwiseParams { const char* alg; Dims shape; float alpha, beta; };
struct PreluParams { Dims shape, slope; };
// exponent: Pow's constant uniform exponent (NaN for the other algorithms); inputs in the order
// of the primitive's sources, `swapped` when that is not ONNX's (the first ONNX operand broadcasts)
struct BinaryParams { const char* alg; std::vector<Dims> inputs; Dims out; float exponent; bool swapped; };
struct GemmParams { int64_t m, n, k; bool ta, tb; float alpha, beta; bool has_c; Dims c; bool inner_product; };
struct MatmulParams { Dims a, b; };
struct SoftmaxParams { const char* alg; Dims shape; int axis; bool flat; };
struct ConcatParams { int axis; std::vector<Dims> inputs; };
// rms: RMS normalization (no mean subtracted, no shift), layer normalization's RMS mode
struct LnormParams { Dims shape; int axis; float eps; bool bias; bool rms; };
struct ReduceParams { const char* alg; Dims shape; Dims axes; };
struct TransposeParams { Dims shape; Dims perm; };
// Data movement as reorders, one per output: `region` reads each output's box of `src` at its
// offset with src's strides; otherwise each output is copied from a buffer of its own shape.
// `op` is the ONNX op the copy stands for (a label: no oneDNN primitive computes it).
struct CopyParams { const char* op; bool region; Dims src; std::vector<Dims> outs, offsets; };
// A constant zero Pad of `shape` by `before` and `after` elements per dim (none negative).
struct PadParams { Dims shape, before, after; };
struct ResampleParams { const char* alg; Dims in, out; };
// The ONNX Attention op over 4-d Q [B, H, S, D], K [B, Hkv, Skv, D], V [B, Hkv, Skv, Dv] (Hkv
// dividing H: grouped-query attention where less); `mask` empty when there is none; `scale` the
// one the op applies (1/√D by default).
struct AttentionParams { Dims q, k, v, mask; bool causal; float scale; };
// One ONNX LSTM/GRU/RNN layer (`cell` "lstm", "gru", "rnn"), sequence-first unless
// `batch_first` (ONNX layout=1); `dirs` 2: bidirectional, else `reverse` runs right to left;
// `lbr`: a GRU's linear_before_reset; `init_h`, `init_c`: initial states given (else zeros);
// `peephole`: an LSTM's P given (else none).
struct RnnParams {
  const char* cell;
  int64_t seq, mb, ic, hidden, dirs;
  bool bias, lbr, reverse, batch_first, init_h, init_c, peephole;
};
// Type words (benanza/ops/cast.py): "float", "int", "sbyte", "byte", ...
// A Cast: a reorder from `from` into the variant's type.
struct CastParams { const char* from; Dims shape; };
// MatMulInteger (`out` "int": s32 result) and QLinearMatMul (`out` "byte"/"sbyte": requantized
// with the scales of A, B (`bscales`: 1 or per column) and the output, and the output's zero
// point): A in the variant's type (u8/s8), B s8 or u8; zero points (counts: 0 none, 1 per
// tensor, else per column of B) as run-time attributes. `a_type`: A's type word, "" for the
// variant's (a QDQ pattern is benchmarked on its float MatMul's variant).
struct QmatmulParams {
  Dims a, b;
  bool signed_b;
  int64_t azp, bzp;
  const char* out;
  int64_t bscales;
  const char* a_type;
};
// ConvInteger (`out` "int": s32 result) and QLinearConv (`out` "byte"/"sbyte", requantized as
// QmatmulParams; Config.bias: its int32 bias): ConvParams' fields, the source in the variant's
// type, weights s8 or u8, the source's zero points (0 none, 1 per tensor). `a_type`: the
// source's type word, "" for the variant's (a QDQ Conv is benchmarked on its float Conv's variant).
struct QconvParams {
  int64_t mb, ic, ih, iw, oc, oh, ow, kh, kw, sh, sw, pt, pl, dh, dw, g;
  bool signed_b;
  int64_t azp;
  const char* out;
  int64_t bscales;
  const char* a_type;
};
// DynamicQuantizeLinear: max and min reductions, then a u8 reorder with the scale and zero point.
struct DynquantParams { Dims shape; };
// QuantizeLinear / DequantizeLinear: a reorder between the variant's float type and `qtype`,
// run-time scales per tensor (axis -1) or per `axis`, and a run-time zero point where `zp`.
struct QdqParams { const char* qtype; Dims shape; int axis; bool zp; bool dequantize; };
// RoPE over the first `rot` features of x's last dim (pairs: its halves, or adjacent features when
// `interleaved`); cos and sin of dims `cs` (x's rank; last dim `rot`, or rot/2 shared by both halves)
struct RopeParams { Dims x, cs; int64_t rot; bool interleaved; };

void bench_conv(benchmark::State&, const ConvParams&, const Config&);
void bench_pool(benchmark::State&, const PoolParams&, const Config&);
void bench_bnorm(benchmark::State&, const BnormParams&, const Config&);
void bench_lrn(benchmark::State&, const LrnParams&, const Config&);
void bench_eltwise(benchmark::State&, const EltwiseParams&, const Config&);
void bench_prelu(benchmark::State&, const PreluParams&, const Config&);
void bench_binary(benchmark::State&, const BinaryParams&, const Config&);
void bench_gemm(benchmark::State&, const GemmParams&, const Config&);
void bench_matmul(benchmark::State&, const MatmulParams&, const Config&);
void bench_softmax(benchmark::State&, const SoftmaxParams&, const Config&);
void bench_concat(benchmark::State&, const ConcatParams&, const Config&);
void bench_lnorm(benchmark::State&, const LnormParams&, const Config&);
void bench_reduce(benchmark::State&, const ReduceParams&, const Config&);
void bench_transpose(benchmark::State&, const TransposeParams&, const Config&);
void bench_copy(benchmark::State&, const CopyParams&, const Config&);
void bench_pad(benchmark::State&, const PadParams&, const Config&);
void bench_attention(benchmark::State&, const AttentionParams&, const Config&);
// ConvParams of an ONNX ConvTranspose: ih/iw its input, oh/ow its (larger) output.
void bench_deconv(benchmark::State&, const ConvParams&, const Config&);
void bench_resample(benchmark::State&, const ResampleParams&, const Config&);
void bench_rnn(benchmark::State&, const RnnParams&, const Config&);
void bench_cast(benchmark::State&, const CastParams&, const Config&);
void bench_qmatmul(benchmark::State&, const QmatmulParams&, const Config&);
void bench_qconv(benchmark::State&, const QconvParams&, const Config&);
void bench_dynquant(benchmark::State&, const DynquantParams&, const Config&);
void bench_qdq(benchmark::State&, const QdqParams&, const Config&);
void bench_rope(benchmark::State&, const RopeParams&, const Config&);

// Registers every row of one family's table.
template <class P, size_t NP, size_t NR>
void add(Registry& registry, const P (&params)[NP], const Row (&rows)[NR],
         void (*bench)(benchmark::State&, const P&, const Config&)) {
  for (const Row& row : rows) {
    const P* p = &params[row.index];
    const Config cfg = row.config;
    registry.add(row.name, [p, cfg, bench](benchmark::State& st) { bench(st, *p, cfg); });
  }
}

// Library version, effective ISA, CPU runtime and thread count for the context block.
void describe_context();

}  // namespace onednn
}  // namespace benanza
