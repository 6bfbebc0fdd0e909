// Entry point of a generated cuDNN/cuBLAS benchmark binary (benanza_bench).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "benanza/runtime.hpp"
#include "benanza_cudnn/graph.hpp"
#include "benanza_cudnn/harness.hpp"

namespace {

#ifdef BENANZA_CUPTI
constexpr bool kCupti = true;

// CUPTI-mode flags (consumed here; the rest goes to the shared runtime and Google Benchmark):
//   --benanza_cupti_warmup=N       untimed calls before profiling (default 5)
//   --benanza_cupti_iterations=N   profiled calls (default 20)
//   --benanza_cupti_metric=NAME    a metric to request (repeatable; adds to the generated list)
std::vector<char*> take_cupti_flags(int argc, char** argv) {
  auto& s = benanza::cudnn::cupti_settings();
  for (size_t i = 0; i < benanza::cudnn::kCuptiMetricCount; ++i)
    s.metrics.emplace_back(benanza::cudnn::kCuptiMetrics[i]);
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--benanza_cupti_warmup=", 0) == 0) {
      s.warmup = std::atoi(a.c_str() + 23);
    } else if (a.rfind("--benanza_cupti_iterations=", 0) == 0) {
      s.iterations = std::atoi(a.c_str() + 27);
    } else if (a.rfind("--benanza_cupti_metric=", 0) == 0) {
      s.metrics.push_back(a.substr(23));
    } else {
      rest.push_back(argv[i]);
    }
  }
  return rest;
}
#else
constexpr bool kCupti = false;

std::vector<char*> take_cupti_flags(int argc, char** argv) { return {argv, argv + argc}; }
#endif

// Timing settings from the environment (`benanza run` passes its options that way):
//   BENANZA_L2=flush|hot      flush the L2 cache before every timed call (default) or not
//   BENANZA_TARGET_MS=X       GPU time one repetition's calls fill (default 1)
// CUPTI mode times one call per iteration, over the profiled count.
bool read_timing_settings() {
  auto& t = benanza::cudnn::timing_settings();
  if (const char* l2 = std::getenv("BENANZA_L2")) {
    const std::string value = l2;
    if (value != "flush" && value != "hot") {
      std::fprintf(stderr, "benanza: BENANZA_L2=%s: expected flush or hot\n", l2);
      return false;
    }
    t.flush_l2 = value == "flush";
  }
  if (const char* target = std::getenv("BENANZA_TARGET_MS")) {
    char* end = nullptr;
    const double ms = std::strtod(target, &end);
    if (end == target || *end || !(ms > 0 && ms <= 10000)) {
      std::fprintf(stderr, "benanza: BENANZA_TARGET_MS=%s: expected milliseconds in (0, 10000]\n", target);
      return false;
    }
    t.target_ms = ms;
  }
  if (kCupti) t.target_ms = 0;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> args = take_cupti_flags(argc, argv);
  if (!read_timing_settings()) return 2;
  benanza::Registry registry;
  benanza::cudnn::register_generated(registry);
  for (char* a : args) {
    const std::string arg = a;
    if (arg.rfind("--benanza_check_graphs=", 0) == 0) return benanza::cudnn::check_graphs(std::atoi(a + 23));
  }
  benanza::cudnn::add_cuda_context(kCupti);
  // One iteration per repetition: the harness sizes each repetition by GPU time itself
  // (Google Benchmark's --benchmark_min_time does not apply). CUPTI mode: the kernels were
  // profiled over a fixed count in setup; time that same count.
  const int64_t fixed = kCupti ? benanza::cudnn::cupti_settings().iterations : 1;
  return benanza::run_main(static_cast<int>(args.size()), args.data(), registry, benanza::Timing::Manual,
                           fixed);
}
