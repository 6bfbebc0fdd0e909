// A benchmark binary for the runner's restart path: the real line-protocol runtime and the real
// check_cuda, with benchmarks named by STANDIN_NAMES (comma-separated). The one named by
// STANDIN_STICKY meets cudaErrorIllegalAddress, as a kernel that faulted would leave behind.
#include <cstdlib>
#include <sstream>
#include <string>

#include "benanza/runtime.hpp"
#include "benanza_cudnn/cuda_runtime.hpp"

int main(int argc, char** argv) {
  benanza::Registry registry;
  const char* sticky = std::getenv("STANDIN_STICKY");
  std::stringstream names(std::getenv("STANDIN_NAMES") ? std::getenv("STANDIN_NAMES") : "");
  for (std::string name; std::getline(names, name, ',');) {
    const bool faults = sticky && name == sticky;
    registry.add(name, [faults](benchmark::State& state) {
      if (faults) BZ_CUDA(cudaErrorIllegalAddress);
      for (auto _ : state) state.SetIterationTime(1e-6);
    });
  }
  return benanza::run_main(argc, argv, registry, benanza::Timing::Manual, 1);
}
