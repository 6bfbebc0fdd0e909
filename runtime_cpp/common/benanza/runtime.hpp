// The benchmark runtime shared by every backend (oneDNN, cuDNN): registration of generated
// variants, the status conventions, and the line protocol `benanza run` reads.
//
// It depends on Google Benchmark only; backends add their library on top. See README.md in
// this folder for the protocol and the fault-injection hooks used by the tests.
#pragma once

#include <benchmark/benchmark.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace benanza {

using BenchFn = std::function<void(benchmark::State&)>;

// How a backend's benchmarks are timed: wall clock around each iteration (CPU libraries that
// block until done), or time the body measures itself and reports with SetIterationTime (GPU
// events).
enum class Timing { Real, Manual };

// The generated variants of one binary, in registration order. Names are Variant.name.
class Registry {
 public:
  void add(std::string name, BenchFn fn) { entries_.emplace_back(std::move(name), std::move(fn)); }
  const std::vector<std::pair<std::string, BenchFn>>& entries() const { return entries_; }

 private:
  std::vector<std::pair<std::string, BenchFn>> entries_;
};

// A `key: value` line of the context block (library versions, ISA, threads, device ...).
void set_context(const std::string& key, const std::string& value);

// The library refused this combination (e.g. oneDNN unimplemented, cuDNN NOT_SUPPORTED).
// Call before the timing loop and return; the message is the library's own text.
void mark_unsupported(benchmark::State& state, const std::string& message);
// The library accepted the problem but failed while setting it up or running it.
void mark_failed(benchmark::State& state, const std::string& message);

// Which implementation actually ran (oneDNN impl_info_str, cuDNN algorithm/kernel name).
void set_implementation(benchmark::State& state, const std::string& impl);
// Scratch memory the call needed, reported as the `workspace_bytes` counter.
void set_workspace(benchmark::State& state, uint64_t bytes);

// Untimed calls before measuring so JIT, first-touch page faults and caches are settled.
constexpr int kWarmupCalls = 3;

// "model name" of /proc/cpuinfo (or an empty string where there is none).
std::string cpu_model();

// Parses the runtime's own flags, registers the variants and runs them, printing the line
// protocol on stdout. Flags:
//   --benanza_names=FILE   run only the names listed in FILE (one per line), in that order
//   --benanza_list         print every registered name and exit
//   --benanza_context      print the context line and exit
// Everything else goes to Google Benchmark (--benchmark_min_time, --benchmark_repetitions ...).
// `fixed_iterations` > 0 runs every benchmark exactly that many timed iterations instead of
// until --benchmark_min_time: CUPTI mode profiles a fixed, small count (paper §III-B5).
int run_main(int argc, char** argv, const Registry& registry, Timing timing, int64_t fixed_iterations = 0);

}  // namespace benanza
