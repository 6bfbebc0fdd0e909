// Entry point of a generated cuDNN/cuBLAS benchmark binary (benanza_bench).
#include <cstdlib>
#include <string>
#include <vector>

#include "benanza/runtime.hpp"
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

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> args = take_cupti_flags(argc, argv);
  benanza::Registry registry;
  benanza::cudnn::register_generated(registry);
  benanza::cudnn::add_cuda_context(kCupti);
  // CUPTI mode: the kernels were profiled over a fixed count in setup; time that same count.
  const int64_t fixed = kCupti ? benanza::cudnn::cupti_settings().iterations : 0;
  return benanza::run_main(static_cast<int>(args.size()), args.data(), registry, benanza::Timing::Manual,
                           fixed);
}
