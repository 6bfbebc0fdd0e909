// Runs one generated variant: prepare once, warm up, (CUPTI mode: profile), then time.
#pragma once

#include <benchmark/benchmark.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "benanza/runtime.hpp"
#include "benanza_cudnn/cuda_runtime.hpp"

namespace benanza::cudnn {

using Factory = std::function<std::unique_ptr<Problem>()>;

// Google Benchmark calls a benchmark's body once per repetition (the binary fixes one
// iteration per repetition); the Problem is built once per benchmark and kept until the next
// benchmark starts, so setup, heuristics and cudnnFind never repeat and never land in the timed
// region. After warm-up, one call sizes the repetitions (measure.hpp plan_batch): each times a
// batch of back-to-back calls, every call between its own CUDA events, after a device-side delay
// that lets the host enqueue the batch first, and by default on a freshly flushed L2 cache. The
// repetition's time is the mean GPU time per call (manual time).
void run_variant(benchmark::State& state, const Variant& v, const Factory& make);

// How calls are timed: set from the environment by main.cpp (BENANZA_L2, BENANZA_TARGET_MS).
struct TimingSettings {
  bool flush_l2 = true;    // false: hot-cache timing, labelled by the l2_flushed counter
  double target_ms = 1.0;  // GPU time one repetition fills; 0: one call per repetition
  int max_calls = 1000;
};
TimingSettings& timing_settings();

// Registers `count` variants of one family, each calling `bench(state, layer, variant)`.
template <class Layer>
void add_family(Registry& r, const Layer* layers, const Variant* variants, size_t count,
                std::unique_ptr<Problem> (*make)(const Layer&, const Variant&)) {
  for (size_t i = 0; i < count; ++i) {
    const Variant* v = &variants[i];
    const Layer* layer = &layers[v->layer];
    r.add(v->name, [v, layer, make](benchmark::State& state) {
      run_variant(state, *v, [&] { return make(*layer, *v); });
    });
  }
}

// Bytes a layer moves in the variant's data type.
double bytes_of(const Work& work, const Variant& v);

// The CUPTI mode's settings: fixed warm-up and profiled iteration counts, requested metrics.
struct CuptiSettings {
  int warmup = 5;
  int iterations = 20;
  std::vector<std::string> metrics;
};
CuptiSettings& cupti_settings();

// Records what the GPU ran for `iterations` calls of the problem (CUPTI Activity API) and
// returns the JSON object printed on the BENANZA_METRICS line; adds kernel counters.
std::string profile_kernels(Problem& problem, const CuptiSettings& settings);

// Library versions and the GPU, for the context block (set_context and Google Benchmark's).
void add_cuda_context(bool cupti);

}  // namespace benanza::cudnn
