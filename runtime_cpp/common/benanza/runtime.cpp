#include "benanza/runtime.hpp"

#include <dirent.h>
#include <sched.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <type_traits>

#include "benanza/json.hpp"

namespace benanza {
namespace {

constexpr const char* kUnsupportedPrefix = "unsupported: ";
constexpr const char* kFailedPrefix = "failed: ";

std::map<std::string, std::string>& context_map() {
  static std::map<std::string, std::string> m;
  return m;
}

void emit(const std::string& tag, const std::string& payload) {
  // One write + flush per line: the runner reads it live and must see it even if we crash next.
  std::string line = tag + " " + payload + "\n";
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fflush(stdout);
}

// Test hooks: make one named benchmark crash or hang, to prove the runner survives both.
void inject_fault(const std::string& name) {
  const char* abort_name = std::getenv("BENANZA_FAULT_ABORT");
  if (abort_name && name == abort_name) std::abort();
  const char* hang_name = std::getenv("BENANZA_FAULT_HANG");
  if (hang_name && name == hang_name) {
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
}

std::string& current_name() {
  static std::string current;
  return current;
}

struct CheckSettings {
  std::string dir;  // empty: not in check mode
  uint64_t seed = 0;
  int files = 0;
};

CheckSettings& check_settings() {
  static CheckSettings s;
  return s;
}

std::vector<double>& samples() {
  static std::vector<double> s;
  return s;
}

// This process's scheduler counters as JSON (the runner's measurement.CpuClock): per thread
// its time on a CPU, its time runnable but waiting for one, and how often it was put on one
// (/proc/self/task/*/schedstat), and the steal and total jiffies of the CPUs it may run on
// (/proc/stat). Read when a benchmark starts and when its result is ready, so the contention the
// runner computes from them covers that benchmark alone, however late the runner reads its
// lines. "{}" where the kernel keeps no such counters.
std::string sched_clock() {
  JsonObject threads;
  bool any = false;
  if (DIR* dir = opendir("/proc/self/task")) {
    while (const dirent* e = readdir(dir)) {
      if (!std::isdigit(static_cast<unsigned char>(e->d_name[0]))) continue;
      std::ifstream in(std::string("/proc/self/task/") + e->d_name + "/schedstat");
      unsigned long long run = 0, wait = 0, slices = 0;
      if (!(in >> run >> wait >> slices)) continue;  // the thread ended meanwhile
      threads.raw(e->d_name, "[" + std::to_string(run) + "," + std::to_string(wait) + "," +
                                 std::to_string(slices) + "]");
      any = true;
    }
    closedir(dir);
  }
  if (!any) return "{}";
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  const bool known = sched_getaffinity(0, sizeof allowed, &allowed) == 0;
  unsigned long long steal = 0, total = 0;
  std::ifstream stat("/proc/stat");
  for (std::string line; std::getline(stat, line);) {
    if (line.rfind("cpu", 0) != 0 || line.size() < 4 || !std::isdigit(static_cast<unsigned char>(line[3])))
      continue;
    std::istringstream fields(line.substr(3));
    int cpu = 0;
    fields >> cpu;
    if (known && (cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, &allowed))) continue;
    unsigned long long v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (auto& x : v)
      if (!(fields >> x)) break;
    steal += v[7];
    for (auto x : v) total += x;
  }
  return JsonObject()
      .raw("threads", threads.str())
      .add("steal_ticks", static_cast<int64_t>(steal))
      .add("total_ticks", static_cast<int64_t>(total))
      .str();
}

std::string& start_clock() {
  static std::string clock;
  return clock;
}

// Adaptive sampling's settings (run_main's flags) and the state of the benchmark now sampling.
struct Adaptive {
  double precision = 0;  // 0: off, Google Benchmark's fixed budget
  double percentile = 10;
  size_t min_samples = 20;
  double min_time_s = 0.01, max_time_s = 0.5;
  std::chrono::steady_clock::time_point started;
  size_t next_check = 0;  // sample count at which the rule is judged next
  double reached = std::numeric_limits<double>::infinity();
  bool timed_out = false;  // stopped by max_time_s, not by the precision
};

Adaptive& adaptive() {
  static Adaptive a;
  return a;
}

// The k-th smallest (0-based) of xs, reordering xs.
double order_statistic(std::vector<double>& xs, size_t k) {
  std::nth_element(xs.begin(), xs.begin() + static_cast<std::ptrdiff_t>(k), xs.end());
  return xs[k];
}

// Half-width of the distribution-free 95% confidence interval of the q-th percentile, relative
// to the percentile itself: the count of samples below the true percentile is Binomial(n, q), so
// the order statistics of ranks n·q ∓ 1.96·sqrt(n·q·(1−q)) bracket it. Too few samples for the
// lower rank: the fastest call stands in (the interval is then narrower than 95% below).
double relative_halfwidth(std::vector<double> xs, double q) {
  // One call (a slow kernel that used up --max-time) bounds nothing: unknown, not exact.
  if (xs.size() < 2) return std::numeric_limits<double>::infinity();
  const double n = static_cast<double>(xs.size());
  const double spread = 1.96 * std::sqrt(n * q * (1 - q));
  const double lo_rank = std::max(1.0, std::floor(n * q - spread));
  const double hi_rank = std::min(n, std::ceil(n * q + spread));
  const double at = (n - 1) * q;  // the estimate, interpolated as percentiles_json does
  const size_t below = static_cast<size_t>(at);
  double estimate = order_statistic(xs, below);
  if (below + 1 < xs.size()) estimate += (at - below) * (order_statistic(xs, below + 1) - estimate);
  const double lo = order_statistic(xs, static_cast<size_t>(lo_rank) - 1);
  const double hi = order_statistic(xs, static_cast<size_t>(hi_rank) - 1);
  return estimate > 0 ? 0.5 * (hi - lo) / estimate : std::numeric_limits<double>::infinity();
}

void announce(const std::string& name) {
  // Google Benchmark calls the body several times (iteration estimate, repetitions); the
  // marker goes out once, so a crash is pinned on the benchmark that was running.
  if (name == current_name()) return;
  current_name() = name;
  samples().clear();
  adaptive().next_check = 0;
  adaptive().reached = std::numeric_limits<double>::infinity();
  adaptive().timed_out = false;
  emit("BENANZA_START", name);
  start_clock() = sched_clock();
  inject_fault(name);
}

// Google Benchmark 1.8 replaced Run::error_occurred/error_message by skipped/skip_message.
template <class R>
auto run_skipped(const R& r, int) -> decltype(static_cast<bool>(r.error_occurred)) {
  return r.error_occurred;
}
template <class R>
auto run_skipped(const R& r, long) -> decltype(static_cast<bool>(r.skipped)) {
  return static_cast<bool>(r.skipped);
}
template <class R>
auto run_message(const R& r, int) -> decltype(std::string(r.error_message)) {
  return r.error_message;
}
template <class R>
auto run_message(const R& r, long) -> decltype(std::string(r.skip_message)) {
  return r.skip_message;
}

double to_ms(double value, benchmark::TimeUnit unit) {
  switch (unit) {
    case benchmark::kNanosecond: return value * 1e-6;
    case benchmark::kMicrosecond: return value * 1e-3;
    case benchmark::kMillisecond: return value;
    case benchmark::kSecond: return value * 1e3;
  }
  return value;
}

struct Stats {
  double median, mean, stddev, min;
};

Stats stats_of(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  size_t n = xs.size();
  double mean = std::accumulate(xs.begin(), xs.end(), 0.0) / n;
  double median = n % 2 ? xs[n / 2] : 0.5 * (xs[n / 2 - 1] + xs[n / 2]);
  double ss = 0;
  for (double x : xs) ss += (x - mean) * (x - mean);
  double stddev = n > 1 ? std::sqrt(ss / (n - 1)) : 0.0;
  return {median, mean, stddev, xs.front()};
}

// The 0th, 1st, ..., 100th percentiles of the samples (linear interpolation between order
// statistics): a fixed-size summary from which the runner reads its low estimator, the median
// and the spread, however many calls were timed.
std::string percentiles_json(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  std::string arr = "[";
  const double last = static_cast<double>(xs.size() - 1);
  for (int p = 0; p <= 100; ++p) {
    const double at = last * p / 100.0;
    const size_t lo = static_cast<size_t>(at);
    const size_t hi = std::min(lo + 1, xs.size() - 1);
    arr += (p ? "," : "") + json_number(xs[lo] + (at - static_cast<double>(lo)) * (xs[hi] - xs[lo]));
  }
  return arr + "]";
}

std::string context_json(const benchmark::BenchmarkReporter::Context* ctx) {
  JsonObject o;
  if (ctx) {
    const auto& cpu = ctx->cpu_info;
    o.add("executable", ctx->executable_name ? ctx->executable_name : "");
    o.add("host", ctx->sys_info.name);
    o.add("num_cpus", static_cast<int64_t>(cpu.num_cpus));
    o.add("mhz_per_cpu", cpu.cycles_per_second / 1e6);
    o.add("cpu_scaling_enabled", cpu.scaling == benchmark::CPUInfo::ENABLED);
  }
  o.add("cpu_model", cpu_model());
  o.add("hardware_threads", static_cast<int64_t>(std::thread::hardware_concurrency()));
  o.add("custom", context_map());
  return o.str();
}

// Streams one BENANZA_RESULT line per benchmark as soon as its repetitions are done, with
// the statistics computed over repetitions here (the same way for every backend).
class LineReporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context& context) override {
    emit("BENANZA_CONTEXT", context_json(&context));
    return true;
  }

  void ReportRuns(const std::vector<Run>& runs) override {
    std::vector<const Run*> reps;
    for (const auto& r : runs)
      if (r.run_type == Run::RT_Iteration) reps.push_back(&r);
    if (reps.empty()) return;  // the aggregates call that follows the repetitions
    const Run& first = *reps.front();
    JsonObject o;
    o.add("name", first.run_name.function_name);
    o.add("implementation", first.report_label);
    if (run_skipped(first, 0)) {
      std::string msg = run_message(first, 0);
      bool unsupported = msg.rfind(kUnsupportedPrefix, 0) == 0;
      const char* prefix = unsupported ? kUnsupportedPrefix : kFailedPrefix;
      if (msg.rfind(prefix, 0) == 0) msg = msg.substr(std::string(prefix).size());
      o.add("status", unsupported ? "unsupported" : "failed");
      o.add("message", msg);
    } else if (adaptive().precision > 0 && !samples().empty()) {
      // One iteration of many calls: Google Benchmark's time is their sum, so the statistics
      // are the calls' own.
      Stats s = stats_of(samples());
      o.add("status", "ok");
      o.add("median_ms", s.median).add("mean_ms", s.mean).add("stddev_ms", s.stddev).add("min_ms", s.min);
      o.add("iterations", static_cast<int64_t>(samples().size())).add("repetitions", static_cast<int64_t>(1));
      o.raw("times_ms", "[" + json_number(s.mean) + "]");
      o.add("samples", static_cast<int64_t>(samples().size()));
      o.raw("sample_percentiles_ms", percentiles_json(samples()));
      o.add("precision", adaptive().reached);
      o.add("stopped", adaptive().timed_out ? "max_time" : "precision");
    } else {
      std::vector<double> times;
      for (const Run* r : reps) times.push_back(to_ms(r->GetAdjustedRealTime(), r->time_unit));
      Stats s = stats_of(times);
      o.add("status", "ok");
      o.add("median_ms", s.median).add("mean_ms", s.mean).add("stddev_ms", s.stddev).add("min_ms", s.min);
      o.add("iterations", static_cast<int64_t>(first.iterations));
      o.add("repetitions", static_cast<int64_t>(reps.size()));
      std::string arr = "[";
      for (size_t i = 0; i < times.size(); ++i) arr += (i ? "," : "") + json_number(times[i]);
      o.raw("times_ms", arr + "]");
      if (!samples().empty()) {
        o.add("samples", static_cast<int64_t>(samples().size()));
        o.raw("sample_percentiles_ms", percentiles_json(samples()));
      }
    }
    // The last repetition's counters: one a backend accumulates over repetitions is complete there.
    JsonObject counters;
    for (const auto& kv : reps.back()->counters) counters.add(kv.first, static_cast<double>(kv.second.value));
    o.raw("counters", counters.str());
    const std::string before = start_clock().empty() ? "{}" : start_clock();
    o.raw("sched", JsonObject().raw("before", before).raw("after", sched_clock()).str());
    emit("BENANZA_RESULT", o.str());
  }

  void Finalize() override {}
};

std::vector<std::string> read_names(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    std::cerr << "benanza: cannot read names file " << path << "\n";
    std::exit(2);
  }
  std::vector<std::string> names;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) names.push_back(line);
  return names;
}

}  // namespace

void set_context(const std::string& key, const std::string& value) { context_map()[key] = value; }

void mark_unsupported(benchmark::State& state, const std::string& message) {
  state.SkipWithError((kUnsupportedPrefix + message).c_str());
}

void mark_failed(benchmark::State& state, const std::string& message) {
  state.SkipWithError((kFailedPrefix + message).c_str());
}

void set_implementation(benchmark::State& state, const std::string& impl) { state.SetLabel(impl); }

void record_sample(double ms) { samples().push_back(ms); }

bool sample_more() {
  Adaptive& a = adaptive();
  if (a.precision <= 0) return false;
  const std::vector<double>& xs = samples();
  const auto now = std::chrono::steady_clock::now();
  if (xs.size() == 1) {  // the first call: sampling started when it did
    a.started = now - std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                          std::chrono::duration<double, std::milli>(xs[0]));
  }
  const double elapsed = std::chrono::duration<double>(now - a.started).count();
  if (elapsed >= a.max_time_s) {
    a.reached = relative_halfwidth(xs, a.percentile / 100.0);
    a.timed_out = true;
    return false;
  }
  if (xs.size() < a.min_samples || elapsed < a.min_time_s || xs.size() < a.next_check) return true;
  // Judged again after an eighth more samples: the cost per call stays constant however many.
  a.next_check = xs.size() + std::max<size_t>(1, xs.size() / 8);
  a.reached = relative_halfwidth(xs, a.percentile / 100.0);
  return a.reached > a.precision;
}

void set_workspace(benchmark::State& state, uint64_t bytes) {
  state.counters["workspace_bytes"] = benchmark::Counter(static_cast<double>(bytes));
}

bool check_mode() { return !check_settings().dir.empty(); }

float fill_value(uint64_t stream, uint64_t index) {
  uint64_t z = ((check_settings().seed * 256 + stream) << 32) + index + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(static_cast<int>(z >> 56) - 128) / 128.0f;
}

bool perturb_input() {
  const char* name = std::getenv("BENANZA_FAULT_PERTURB");
  return name && current_name() == name;
}

void write_check(const std::vector<CheckOutput>& outputs) {
  CheckSettings& s = check_settings();
  std::string path = s.dir + "/" + std::to_string(s.files++) + ".bin";
  std::ofstream out(path, std::ios::binary);
  std::string list = "[";
  for (size_t i = 0; i < outputs.size(); ++i) {
    const CheckOutput& o = outputs[i];
    out.write(static_cast<const char*>(o.data), static_cast<std::streamsize>(o.bytes));
    std::string dims = "[";
    for (size_t d = 0; d < o.dims.size(); ++d) dims += (d ? "," : "") + std::to_string(o.dims[d]);
    list += (i ? "," : "") + JsonObject().add("dtype", o.dtype).raw("dims", dims + "]")
                                 .add("bytes", static_cast<int64_t>(o.bytes)).str();
  }
  out.close();
  if (!out) throw std::runtime_error("cannot write " + path);
  emit("BENANZA_CHECK", JsonObject().add("name", current_name()).add("file", path).raw("outputs", list + "]").str());
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) {
      auto pos = line.find(':');
      if (pos != std::string::npos) return line.substr(line.find_first_not_of(" \t", pos + 1));
    }
  }
  return "";
}

int run_main(int argc, char** argv, const Registry& registry, Timing timing, int64_t fixed_iterations) {
  std::vector<char*> rest;
  std::string names_file;
  bool list = false, context_only = false;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--benanza_names=", 0) == 0) {
      names_file = a.substr(16);
    } else if (a == "--benanza_list") {
      list = true;
    } else if (a == "--benanza_context") {
      context_only = true;
    } else if (a.rfind("--benanza_check=", 0) == 0) {
      check_settings().dir = a.substr(16);
    } else if (a.rfind("--benanza_seed=", 0) == 0) {
      check_settings().seed = std::stoull(a.substr(15));
    } else if (a.rfind("--benanza_precision=", 0) == 0) {
      adaptive().precision = std::stod(a.substr(20));
    } else if (a.rfind("--benanza_percentile=", 0) == 0) {
      adaptive().percentile = std::stod(a.substr(21));
    } else if (a.rfind("--benanza_min_samples=", 0) == 0) {
      adaptive().min_samples = std::stoull(a.substr(22));
    } else if (a.rfind("--benanza_min_time=", 0) == 0) {
      adaptive().min_time_s = std::stod(a.substr(19));
    } else if (a.rfind("--benanza_max_time=", 0) == 0) {
      adaptive().max_time_s = std::stod(a.substr(19));
    } else {
      rest.push_back(argv[i]);
    }
  }
  if (list) {
    for (const auto& e : registry.entries()) std::cout << e.first << "\n";
    return 0;
  }
  if (context_only) {
    emit("BENANZA_CONTEXT", context_json(nullptr));
    return 0;
  }
  // GPU timing (Manual) sizes its own batches: the fixed budget applies.
  if (timing != Timing::Real || check_mode() || fixed_iterations > 0) adaptive().precision = 0;
  int n = static_cast<int>(rest.size());
  benchmark::Initialize(&n, rest.data());
  if (benchmark::ReportUnrecognizedArguments(n, rest.data())) return 2;

  std::map<std::string, const BenchFn*> by_name;
  for (const auto& e : registry.entries()) by_name[e.first] = &e.second;
  std::vector<std::string> order;
  if (names_file.empty()) {
    for (const auto& e : registry.entries()) order.push_back(e.first);
  } else {
    order = read_names(names_file);
  }
  for (const auto& name : order) {
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      emit("BENANZA_RESULT", JsonObject()
                                 .add("name", name)
                                 .add("status", "failed")
                                 .add("message", "not in this binary: regenerate and rebuild")
                                 .str());
      continue;
    }
    const BenchFn* fn = it->second;
    auto* b = benchmark::RegisterBenchmark(name.c_str(), [name, fn](benchmark::State& st) {
      announce(name);
      (*fn)(st);
    });
    b->Unit(benchmark::kMillisecond);
    if (timing == Timing::Manual) b->UseManualTime(); else b->UseRealTime();
    if (fixed_iterations > 0) b->Iterations(fixed_iterations);
    if (adaptive().precision > 0) b->Iterations(1)->Repetitions(1);  // the calls inside it: sample_more
    if (check_mode()) b->Iterations(1)->Repetitions(1);  // one run: what is checked, not timed
  }
  LineReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}

}  // namespace benanza
