// Host-only checks of the cuDNN runtime pieces that need no device (tests/backends/test_cudnn.py):
//   host_checks tables              every status rule and the sticky CUDA errors, as JSON lines
//   host_checks cudnn|cublas|cuda N  what check_cudnn / check_cublas / check_cuda do with status N
//   host_checks duration START END  the CUPTI record guard
//   host_checks plan TARGET_MS CALL_MS HOST_US MAX_CALLS
#include <cstdio>
#include <cstdlib>
#include <string>

#include "benanza_cudnn/cuda_runtime.hpp"
#include "benanza_cudnn/measure.hpp"
#include "benanza_cudnn/status.hpp"

using namespace benanza::cudnn;

namespace {

void print_rules(const char* library, const StatusRule* rules, size_t count) {
  for (size_t i = 0; i < count; ++i)
    std::printf("{\"library\": \"%s\", \"code\": %d, \"name\": \"%s\", \"verdict\": \"%s\"}\n", library,
                rules[i].code, rules[i].name, rules[i].verdict == Verdict::Unsupported ? "unsupported" : "failed");
}

template <class F>
int outcome(F check) {
  try {
    check();
    std::printf("ok\n");
  } catch (const Unsupported& e) {
    std::printf("unsupported: %s\n", e.what());
  } catch (const Failure& e) {
    std::printf("failed: %s\n", e.what());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "tables") {
    print_rules("cudnn", kCudnnRules, kCudnnRuleCount);
    print_rules("cublas", kCublasRules, kCublasRuleCount);
    for (size_t i = 0; i < kStickyCudaErrorCount; ++i)
      std::printf("{\"library\": \"cuda\", \"code\": %d, \"sticky\": true}\n", kStickyCudaErrors[i]);
    return 0;
  }
  if (argc == 3 && mode == "cudnn")
    return outcome([&] { BZ_CUDNN(static_cast<cudnnStatus_t>(std::atoi(argv[2]))); });
  if (argc == 3 && mode == "cublas")
    return outcome([&] { BZ_CUBLAS(static_cast<cublasStatus_t>(std::atoi(argv[2]))); });
  if (argc == 3 && mode == "cuda")
    return outcome([&] { BZ_CUDA(static_cast<cudaError_t>(std::atoi(argv[2]))); });
  if (argc == 4 && mode == "duration") {
    uint64_t ns = 0;
    const bool ok = kernel_duration(std::strtoull(argv[2], nullptr, 10), std::strtoull(argv[3], nullptr, 10), &ns);
    std::printf(ok ? "%llu\n" : "incomplete\n", static_cast<unsigned long long>(ns));
    return 0;
  }
  if (argc == 6 && mode == "plan") {
    const BatchPlan p = plan_batch(std::atof(argv[2]), std::atof(argv[3]), std::atof(argv[4]), std::atoi(argv[5]));
    std::printf("%d %.3f\n", p.calls, p.delay_us);
    return 0;
  }
  std::fprintf(stderr, "usage: host_checks tables | cudnn|cublas|cuda N | duration START END | plan ...\n");
  return 2;
}
