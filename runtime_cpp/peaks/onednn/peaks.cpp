// `benanza peaks` for the oneDNN backend: what this CPU attains, measured the way the benchmarks
// run (same library, same threads), one BENANZA_PEAK line each (benanza/peaks.py reads them).
//
//   --gemm=f32,bf16,s8      GEMM throughput through oneDNN's matmul, per data type: the best
//                           of square sizes 512, 1024, 2048 on all threads together, or
//                           of every thread's own 512³ GEMM at once (summed)
//   --fma=f32               the core's own FMA throughput: every thread runs a register-only loop
//                           of independent vector FMAs at the widest width this build targets
//                           (summed): a ceiling no kernel of the library passes
//   --level=NAME:BYTES      streaming bandwidth with a working set of BYTES (repeatable): the
//                           better of a triad (a = b + s·c) and a read-only sum, all threads
//   --seconds=S             measuring time per peak (default 0.25)
//
// A data type oneDNN cannot run here is reported with its status and the library's message,
// never assumed.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <dnnl.hpp>
#include <omp.h>
#if defined(__AVX512F__) || defined(__FMA__)
#include <immintrin.h>
#endif

#include "benanza/json.hpp"

#define BENANZA_DNNL3 (DNNL_VERSION_MAJOR >= 3)

namespace {

using Clock = std::chrono::steady_clock;
using dnnl::memory;
using dt = memory::data_type;
using tag = memory::format_tag;

void emit(const std::string& tag, const std::string& payload) {
  std::string line = tag + " " + payload + "\n";
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fflush(stdout);
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Runs `fn(reps)` (reps calls back to back) in batches for about `budget` seconds; the
// fastest batch's time per call. The batch grows by doubling until it lasts 10 ms and doubling
// it about doubles its time: until then the start-up of a parallel region (a whole scheduler
// quantum when a thread waits for a core on a busy machine) is most of it. The best batch,
// not the mean: on a shared machine what the hardware attains is what an undisturbed batch shows.
double best_per_call(const std::function<void(int)>& fn, double budget) {
  fn(1);  // warm-up: JIT, first touch, caches
  int reps = 1;
  double previous = 0;
  auto start = Clock::now();
  for (;;) {
    auto t = Clock::now();
    fn(reps);
    double took = seconds_since(t);
    bool overhead = took < 0.01 || reps == 1 || took < 1.5 * previous;
    if (!overhead || reps >= (1 << 24) || seconds_since(start) > 4 * budget) break;
    previous = took;
    reps *= 2;
  }
  double best = 1e9;
  start = Clock::now();
  do {
    auto t = Clock::now();
    fn(reps);
    best = std::min(best, seconds_since(t) / reps);
  } while (seconds_since(start) < budget);
  return best;
}

// The calling thread's fastest time per unit of `batch(reps)` (reps units back to back) over
// `budget` seconds: the batch doubles until it lasts 0.5 ms (shorter than a time slice, so an
// undisturbed batch is likely on a busy machine), then every batch counts. Each thread of a
// parallel region times its own: no barrier, so a thread waiting for a core never stalls the
// others' measurement.
double own_best(const std::function<void(int64_t)>& batch, double budget) {
  batch(1);  // warm-up: first touch, caches, clocks
  int64_t reps = 1;
  double best = 1e9;
  auto start = Clock::now();
  while (seconds_since(start) < budget) {
    auto t = Clock::now();
    batch(reps);
    double took = seconds_since(t);
    if (took < 0.0005 && reps < (int64_t(1) << 40)) {
      reps *= 2;
      continue;
    }
    best = std::min(best, took / reps);
  }
  return best;
}

dnnl::engine& engine() {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

std::string version() {
  const auto* v = dnnl::version();
  return std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
}

struct GemmType {
  std::string name;
  dt src, wei, dst;
};

bool gemm_type(const std::string& name, GemmType& out) {
  if (name == "f32") out = {name, dt::f32, dt::f32, dt::f32};
  else if (name == "bf16") out = {name, dt::bf16, dt::bf16, dt::bf16};
  else if (name == "s8") out = {name, dt::u8, dt::s8, dt::s32};  // oneDNN's int8 GEMM: u8 × s8 → s32
  else return false;
  return true;
}

// Fills a memory with small values through a reorder from f32 (any layout, any type).
void fill(memory& m, dnnl::stream& s) {
  auto d = m.get_desc();
#if BENANZA_DNNL3
  memory::dims dims = d.get_dims();
#else
  memory::dims dims = d.dims();
#endif
  memory::desc plain(dims, dt::f32, dims.size() == 2 ? tag::ab : tag::a);
  memory src(plain, engine());
  auto* p = static_cast<float*>(src.get_data_handle());
  size_t n = plain.get_size() / sizeof(float);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<float>(static_cast<int>(i % 7) - 3);
  dnnl::reorder(src, m).execute(s, src, m);
  s.wait();
}

struct Gemm {
  dnnl::matmul prim;
  std::vector<memory> mems;  // src, weights, dst, scratchpad
  std::string impl;
};

Gemm make_gemm(const GemmType& t, int64_t n, dnnl::stream& s) {
  memory::desc a({n, n}, t.src, tag::ab);
  memory::desc b({n, n}, t.wei, tag::any);  // weights in the layout oneDNN prefers, as frameworks prepack them
  memory::desc c({n, n}, t.dst, tag::ab);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
#if BENANZA_DNNL3
  dnnl::matmul::primitive_desc pd(engine(), a, b, c, attr);
#else
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attr, engine());
#endif
  Gemm g{dnnl::matmul(pd), {}, pd.impl_info_str()};
  g.mems = {memory(pd.src_desc(), engine()), memory(pd.weights_desc(), engine()), memory(pd.dst_desc(), engine()),
            memory(pd.scratchpad_desc(), engine())};
  fill(g.mems[0], s);
  fill(g.mems[1], s);
  return g;
}

// FLOP/s of every thread running its own single-threaded n³ GEMM at once (oneDNN runs a
// primitive inline when called inside a parallel region), each timing its own batches of at
// least 0.5 ms; the sum of their fastest. What the cores attain without the library's
// barriers: on a busy machine a multi-threaded call waits for its slowest thread's core, so
// this is the peak a result measured at a quiet moment can approach.
double per_thread_gemm(const GemmType& t, int64_t n, double budget) {
  int nt = omp_get_max_threads();
  std::vector<Gemm> gemms;
  std::vector<dnnl::stream> streams;
  for (int i = 0; i < nt; ++i) {
    streams.emplace_back(engine());
    gemms.push_back(make_gemm(t, n, streams.back()));
  }
  double total = 0;
#pragma omp parallel num_threads(nt) reduction(+ : total)
  {
    int id = omp_get_thread_num();
    Gemm& g = gemms[id];
    dnnl::stream& s = streams[id];
    auto call = [&] {
      g.prim.execute(s, {{DNNL_ARG_SRC, g.mems[0]}, {DNNL_ARG_WEIGHTS, g.mems[1]}, {DNNL_ARG_DST, g.mems[2]},
                         {DNNL_ARG_SCRATCHPAD, g.mems[3]}});
      s.wait();
    };
    double best = own_best([&](int64_t reps) {
      for (int64_t r = 0; r < reps; ++r) call();
    }, budget);
    if (best < 1e9) total += 2.0 * n * n * n / best;
  }
  return total;
}

void measure_gemm(const std::string& name, double budget) {
  benanza::JsonObject o;
  o.add("name", "gemm_" + name).add("kind", "gemm").add("dtype", name);
  GemmType t;
  if (!gemm_type(name, t)) {
    emit("BENANZA_PEAK", o.add("status", "failed").add("message", "unknown GEMM data type " + name).str());
    return;
  }
  try {
    dnnl::stream s(engine());
    // Sizes from 512 up, the best of them: big enough to keep every core busy well past the
    // start-up of a parallel region; a size past 20 ms a call changes nothing but the time.
    int64_t best_n = 0;
    double best_rate = 0, per_call = 0;
    std::string impl;
    for (int64_t n = 512; n <= 2048; n *= 2) {
      Gemm g = make_gemm(t, n, s);
      auto calls = [&](int reps) {
        for (int i = 0; i < reps; ++i)
          g.prim.execute(s, {{DNNL_ARG_SRC, g.mems[0]}, {DNNL_ARG_WEIGHTS, g.mems[1]}, {DNNL_ARG_DST, g.mems[2]},
                             {DNNL_ARG_SCRATCHPAD, g.mems[3]}});
        s.wait();
      };
      double took = best_per_call(calls, budget);
      double rate = 2.0 * n * n * n / took;
      if (rate > best_rate) best_n = n, best_rate = rate, per_call = took, impl = g.impl;
      if (took > 0.02) break;
    }
    const int64_t own = 512;
    double per_thread = per_thread_gemm(t, own, budget);
    bool separate = per_thread > best_rate;
    if (separate) impl += " (" + std::to_string(omp_get_max_threads()) + " threads, one GEMM each)";
    o.add("status", "ok").add("value", std::max(best_rate, per_thread)).add("unit", "flop/s")
        .add("size", separate ? own : best_n).add("together", best_rate).add("per_thread", per_thread)
        .add("seconds_per_call", per_call).add("implementation", impl);
  } catch (const dnnl::error& e) {
    bool unimplemented = e.status == dnnl_unimplemented;
    o.add("status", unimplemented ? "unsupported" : "failed").add("message", std::string("oneDNN: ") + e.what());
  }
  emit("BENANZA_PEAK", o.str());
}

// The core's f32 FMA throughput, the compute ceiling of every f32 kernel: independent vector
// FMAs on registers only, at the widest width this build targets (-march=native), through
// intrinsics so that each is one fused instruction whatever the compiler's contraction
// settings. kAccumulators independent chains cover FMA latency × FMA ports (4–5 cycles × 2 on
// current x86 cores) while fitting with the two operands in AVX2's 16 vector registers.
#if defined(__AVX512F__)
using FmaVec = __m512;
constexpr int kLanes = 16;
constexpr const char* kFmaIsa = "avx512f";
inline FmaVec fma_splat(float x) { return _mm512_set1_ps(x); }
inline FmaVec fma_step(FmaVec acc, FmaVec m, FmaVec a) { return _mm512_fmadd_ps(acc, m, a); }
inline float fma_sum(FmaVec v) { return _mm512_reduce_add_ps(v); }
#elif defined(__FMA__)
using FmaVec = __m256;
constexpr int kLanes = 8;
constexpr const char* kFmaIsa = "avx2 fma";
inline FmaVec fma_splat(float x) { return _mm256_set1_ps(x); }
inline FmaVec fma_step(FmaVec acc, FmaVec m, FmaVec a) { return _mm256_fmadd_ps(acc, m, a); }
inline float fma_sum(FmaVec v) {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, v);
  float s = 0;
  for (float x : lanes) s += x;
  return s;
}
#else
// No vector FMA this program knows: a scalar multiply-add, far below what the library's
// vector kernels reach, so the GEMM peak stays the roof (benanza/peaks.py takes the faster).
using FmaVec = float;
constexpr int kLanes = 1;
constexpr const char* kFmaIsa = "scalar";
inline FmaVec fma_splat(float x) { return x; }
inline FmaVec fma_step(FmaVec acc, FmaVec m, FmaVec a) { return acc * m + a; }
inline float fma_sum(FmaVec v) { return v; }
#endif
constexpr int kAccumulators = 12;

// `iterations` rounds of kAccumulators FMAs; acc ← acc·m + a converges to a / (1 − m) = 1, so
// the values stay normal (no denormal slow path). The sum is returned so that no FMA is dead.
float fma_loop(int64_t iterations) {
  const FmaVec m = fma_splat(0.999f), a = fma_splat(0.001f);
  FmaVec acc[kAccumulators];
  for (int k = 0; k < kAccumulators; ++k) acc[k] = fma_splat(0.5f + 0.01f * k);
  for (int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 12  // every accumulator its own register: no store/load between FMAs
    for (int k = 0; k < kAccumulators; ++k) acc[k] = fma_step(acc[k], m, a);
  }
  float s = 0;
  for (int k = 0; k < kAccumulators; ++k) s += fma_sum(acc[k]);
  return s;
}

// FLOP/s of every thread running its own FMA loop at once, each timing its own batches
// (`own_best`), summed: 2 FLOP per lane per FMA. A unit of a batch is 1024 rounds, so that the
// loop, not the timer, is what a short batch measures. Two hyperthreads of one core may each
// have their best batch while the other waits: the sum can then exceed the core, which only
// raises the roof (a lower bound stays one).
void measure_fma(const std::string& name, double budget) {
  benanza::JsonObject o;
  o.add("name", "fma_" + name).add("kind", "fma").add("dtype", name);
  if (name != "f32") {
    emit("BENANZA_PEAK", o.add("status", "failed").add("message", "no FMA loop for data type " + name).str());
    return;
  }
  constexpr int64_t kRounds = 1024;
  double total = 0, sink = 0;
#pragma omp parallel reduction(+ : total, sink)
  {
    float s = 0;
    double best = own_best([&](int64_t reps) { s += fma_loop(reps * kRounds); }, budget);
    if (best < 1e9) total += 2.0 * kLanes * kAccumulators * kRounds / best;
    sink += s;
  }
  std::string impl = std::string(kFmaIsa) + " " + std::to_string(8 * sizeof(FmaVec)) + "-bit, " +
                     std::to_string(kAccumulators) + " accumulators";
  o.add("status", "ok").add("value", total).add("unit", "flop/s")
      .add("size", static_cast<int64_t>(8 * sizeof(FmaVec))).add("isa", kFmaIsa)
      .add("lanes", static_cast<int64_t>(kLanes)).add("accumulators", static_cast<int64_t>(kAccumulators))
      .add("implementation", impl).add("checksum", sink);
  emit("BENANZA_PEAK", o.str());
}

// Σ b[i] + c[i] in eight independent partial sums, so the loads, not the latency of one
// chain of additions, limit it.
double sum(const double* b, const double* c, size_t lo, size_t hi) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  size_t i = lo;
  for (; i + 8 <= hi; i += 8) {
#pragma omp simd
    for (int k = 0; k < 8; ++k) acc[k] += b[i + k] + c[i + k];
  }
  double s = 0;
  for (; i < hi; ++i) s += b[i] + c[i];
  for (double x : acc) s += x;
  return s;
}

// Thread `t` of `nt`'s contiguous part of [0, n).
std::pair<size_t, size_t> chunk(size_t n, int t, int nt) {
  return {n * t / nt, n * (t + 1) / nt};
}

// Bytes/s of all threads together, each timing its own loop over its own part (`kernel(lo,
// hi)` moving `bytes_per_element` per element) with `own_best`. The sum over threads is what
// the private caches (L1, L2) deliver together; for a shared level it can exceed what all
// threads get at once, which only raises the roof.
template <class Kernel>
double threads_bandwidth(size_t n, double bytes_per_element, double budget, Kernel kernel) {
  double total = 0;
#pragma omp parallel reduction(+ : total)
  {
    auto [lo, hi] = chunk(n, omp_get_thread_num(), omp_get_num_threads());
    double best = own_best([&](int64_t reps) {
      for (int64_t r = 0; r < reps; ++r) kernel(lo, hi);
    }, budget);
    if (best < 1e9 && hi > lo) total += bytes_per_element * (hi - lo) / best;
  }
  return total;
}

// Streaming bandwidth over a working set of `bytes`: the better of a triad and a read-only
// sum, each thread on its own contiguous part (first touched by that thread, as a kernel's
// buffers are after its warm-up).
void measure_bandwidth(const std::string& level, int64_t bytes, double budget) {
  size_t n = std::max<int64_t>(bytes / 3 / static_cast<int64_t>(sizeof(double)), 1024);
  std::unique_ptr<double[]> a(new double[n]), b(new double[n]), c(new double[n]);
  double* pa = a.get();
  double* pb = b.get();
  double* pc = c.get();
#pragma omp parallel
  {
    auto [lo, hi] = chunk(n, omp_get_thread_num(), omp_get_num_threads());
    for (size_t i = lo; i < hi; ++i) {
      pa[i] = 0.0;
      pb[i] = 1.0;
      pc[i] = 2.0;
    }
  }
  const double scalar = 0.5;
  double sink = 0;
  double triad_bw = threads_bandwidth(n, 3.0 * sizeof(double), budget / 2, [&](size_t lo, size_t hi) {
#pragma omp simd
    for (size_t i = lo; i < hi; ++i) pa[i] = pb[i] + scalar * pc[i];
  });
  double read_bw = threads_bandwidth(n, 2.0 * sizeof(double), budget / 2, [&](size_t lo, size_t hi) {
    double s = sum(pb, pc, lo, hi);
#pragma omp atomic
    sink += s;
  });
  benanza::JsonObject o;
  o.add("name", "bandwidth_" + level).add("kind", "bandwidth").add("level", level).add("status", "ok")
      .add("value", std::max(triad_bw, read_bw)).add("unit", "byte/s")
      .add("size", static_cast<int64_t>(3 * n * sizeof(double))).add("triad", triad_bw).add("read", read_bw)
      .add("checksum", sink + pa[n / 2]);
  emit("BENANZA_PEAK", o.str());
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string part; std::getline(in, part, sep);)
    if (!part.empty()) out.push_back(part);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> gemms, fmas;
  std::vector<std::pair<std::string, int64_t>> levels;
  double budget = 0.25;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    try {
      if (arg.rfind("--gemm=", 0) == 0) {
        gemms = split(arg.substr(7), ',');
      } else if (arg.rfind("--fma=", 0) == 0) {
        fmas = split(arg.substr(6), ',');
      } else if (arg.rfind("--level=", 0) == 0) {
        auto parts = split(arg.substr(8), ':');
        if (parts.size() != 2) throw std::invalid_argument(arg);
        levels.emplace_back(parts[0], std::stoll(parts[1]));
      } else if (arg.rfind("--seconds=", 0) == 0) {
        budget = std::stod(arg.substr(10));
      } else {
        throw std::invalid_argument(arg);
      }
    } catch (const std::exception&) {
      std::fprintf(stderr, "benanza_peaks: bad argument %s\n", arg.c_str());
      return 2;
    }
  }
  std::map<std::string, std::string> custom{{"backend", "onednn"}, {"onednn_version", version()},
                                            {"threads", std::to_string(omp_get_max_threads())}};
  emit("BENANZA_CONTEXT", benanza::JsonObject().add("custom", custom).str());
  for (const auto& g : gemms) measure_gemm(g, budget);
  for (const auto& f : fmas) measure_fma(f, budget);
  for (const auto& l : levels) measure_bandwidth(l.first, l.second, budget);
  return 0;
}
