// The benchmark runtime shared by every backend (oneDNN, cuDNN): registration of generated
// variants, the status conventions, and the line protocol `benanza run` reads.
//
// It depends on Google Benchmark only; backends add their library on top. See README.md in
// this folder for the protocol and the fault-injection hooks used by the tests.
#pragma once

#include <benchmark/benchmark.h>

#include <chrono>
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

// One timed call of the benchmark now running, in milliseconds. Its result line carries the
// percentiles of all the samples it recorded (every repetition pooled): the bound's estimator
// is a low percentile of them (docs/measurement.md).
void record_sample(double ms);

// Adaptive sampling (--benanza_precision=P, Timing::Real only): whether the benchmark now
// running wants another timed call. It stops once the order-statistic 95% confidence interval
// of the --benanza_percentile-th percentile of its samples has a half-width of at most P times
// that percentile, after at least --benanza_min_samples calls and --benanza_min_time seconds,
// or at --benanza_max_time seconds of sampling whatever the precision. Without
// --benanza_precision: always false (Google Benchmark sizes the loop; one call per iteration).
bool sample_more();

// The timing loop of a benchmark that blocks until its work is done (CPU libraries): each call
// is timed on its own, so a call a descheduled thread stalled for a scheduler quantum is one slow
// sample among many clean ones instead of raising the repetition's average.
//
// With --benanza_precision (adaptive sampling) the benchmark runs one iteration in which calls
// are timed until sample_more() says the estimator is known well enough (or time is up).
template <class F>
void time_each_call(benchmark::State& state, F&& call) {
  using Clock = std::chrono::steady_clock;
  for (auto _ : state) {
    do {
      const auto t0 = Clock::now();
      call();
      record_sample(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    } while (sample_more());
  }
}

// Untimed calls before measuring so JIT, first-touch page faults and caches are settled.
constexpr int kWarmupCalls = 3;
// A blocking call this long has settled all of that in its first run (it streams more than any
// cache holds): further warm-up calls of a 100 ms convolution cost 0.2 s each and teach nothing,
// and were most of a 30-model campaign's time outside its timed loops.
constexpr double kWarmupSeconds = 0.05;

// The warm-up of a benchmark that blocks until its work is done (CPU libraries): kWarmupCalls
// untimed calls, or fewer once kWarmupSeconds have passed, never fewer than one.
template <class F>
void warm_up(F&& call) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  for (int i = 0; i < kWarmupCalls; ++i) {
    call();
    if (std::chrono::duration<double>(Clock::now() - t0).count() >= kWarmupSeconds) break;
  }
}

// "model name" of /proc/cpuinfo (or an empty string where there is none).
std::string cpu_model();

// --- check mode (`--benanza_check=DIR`, read by `benanza check`) ---------------------------
// Every benchmark runs its computation once, untimed, on inputs from the generator below, and
// writes its outputs to a file under DIR, announced by one line
//   BENANZA_CHECK {"name": ..., "file": ..., "outputs": [{"dtype": "f32"|"bf16"|"u8", "dims": [...],
//                  "bytes": n}, ...]}
// (the outputs' raw bytes, concatenated, each in the row-major order of its dims).
bool check_mode();

// The input generator both sides reproduce. Element i (in the row-major order of the dims the
// benchmark gives its library) of the k-th tensor a benchmark fills (k = 0, 1, ...) is
//   z = (((seed · 256 + k) << 32) + i + 0x9E3779B97F4A7C15) mod 2^64, then splitmix64's mix:
//   z = (z ^ z >> 30) · 0xBF58476D1CE4E5B9; z = (z ^ z >> 27) · 0x94D049BB133111EB; z ^= z >> 31
//   value = ((z >> 56) − 128) / 128
// i.e. multiples of 1/128 in [−1, 1): exact in f32, bf16 and f16, and their products and sums
// of up to 2^8 terms are exact in f32. `seed` is --benanza_seed=N (default 0).
float fill_value(uint64_t stream, uint64_t index);

// One output of the benchmark being checked: its data in row-major order of `dims`.
struct CheckOutput {
  std::string dtype;
  std::vector<int64_t> dims;
  const void* data;
  size_t bytes;
};
// Writes the outputs of the benchmark now running and prints its BENANZA_CHECK line.
void write_check(const std::vector<CheckOutput>& outputs);
// Test hook: BENANZA_FAULT_PERTURB=<name> — whether that benchmark is running now, so that the
// backend adds an error to its first input (proving `benanza check` catches a wrong input).
bool perturb_input();

// Parses the runtime's own flags, registers the variants and runs them, printing the line
// protocol on stdout. Flags:
//   --benanza_names=FILE   run only the names listed in FILE (one per line), in that order
//   --benanza_list         print every registered name and exit
//   --benanza_context      print the context line and exit
//   --benanza_check=DIR    check mode (above): one untimed run each, outputs written under DIR
//   --benanza_seed=N       the input generator's seed (default 0)
//   --benanza_precision=P, --benanza_percentile=Q, --benanza_min_samples=N, --benanza_min_time=S,
//   --benanza_max_time=S   adaptive sampling (sample_more above): each benchmark runs one
//                          iteration of as many calls as the rule needs, and its result line
//                          carries the statistics of the calls and the `precision` reached
// Everything else goes to Google Benchmark (--benchmark_min_time, --benchmark_repetitions ...).
// `fixed_iterations` > 0 runs every benchmark exactly that many timed iterations instead of
// until --benchmark_min_time: CUPTI mode profiles a fixed, small count (paper §III-B5).
int run_main(int argc, char** argv, const Registry& registry, Timing timing, int64_t fixed_iterations = 0);

}  // namespace benanza
