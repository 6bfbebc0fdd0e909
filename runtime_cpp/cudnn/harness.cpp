#include "benanza_cudnn/harness.hpp"

#include <chrono>
#include <cstdio>
#include <vector>

#include "benanza/json.hpp"
#include "benanza_cudnn/measure.hpp"

namespace benanza::cudnn {
namespace {

using Clock = std::chrono::steady_clock;

double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

// Timing events for the i-th call of a repetition, created on first need and kept for the
// process (like the handles): a repetition of a thousand calls needs two thousand of them.
class Events {
 public:
  cudaEvent_t start(int i) { return at(2 * i); }
  cudaEvent_t stop(int i) { return at(2 * i + 1); }

 private:
  cudaEvent_t at(int i) {
    while (static_cast<int>(events_.size()) <= i) {
      cudaEvent_t e;
      BZ_CUDA(cudaEventCreate(&e));
      events_.push_back(e);
    }
    return events_[i];
  }
  std::vector<cudaEvent_t> events_;
};

Events& events() {
  static Events e;
  return e;
}

// The buffer whose writing evicts the L2 cache, sized from the device's L2, and what one
// flush costs on the GPU (measured once; it is part of each call's share of the target time).
struct L2Flush {
  DeviceBuffer buffer;
  double ms = 0;
  unsigned char value = 0;

  L2Flush() {
    int device = 0, l2 = 0;
    BZ_CUDA(cudaGetDevice(&device));
    BZ_CUDA(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
    buffer = DeviceBuffer(l2_flush_bytes(l2));
    run();  // first touch outside the measurement
    BZ_CUDA(cudaEventRecord(events().start(0), stream()));
    run();
    BZ_CUDA(cudaEventRecord(events().stop(0), stream()));
    BZ_CUDA(cudaEventSynchronize(events().stop(0)));
    float elapsed = 0;
    BZ_CUDA(cudaEventElapsedTime(&elapsed, events().start(0), events().stop(0)));
    ms = elapsed;
  }
  void run() {
    if (buffer.bytes()) BZ_CUDA(cudaMemsetAsync(buffer.get(), ++value, buffer.bytes(), stream()));
  }
};

L2Flush& l2_flush() {
  static L2Flush f;
  return f;
}

// One timed call: [flush L2] start event, the library call(s), stop event. With the flush
// before the start event its cost is outside the window, and the call starts on a cold L2.
void enqueue_timed(Problem& p, int i, bool flush) {
  if (flush) l2_flush().run();
  BZ_CUDA(cudaEventRecord(events().start(i), stream()));
  p.enqueue();
  BZ_CUDA(cudaEventRecord(events().stop(i), stream()));
}

double elapsed_ms(int i) {
  float ms = 0;
  BZ_CUDA(cudaEventElapsedTime(&ms, events().start(i), events().stop(i)));
  return ms;
}

// The benchmark being run: its prepared problem and plan, or why it could not be prepared.
struct Current {
  std::string name;
  std::unique_ptr<Problem> problem;
  BatchPlan plan{1, 0};
  int host_bound_reps = 0;
  bool refused = false;
  std::string error;
};

Current& current() {
  static Current c;
  return c;
}

void emit_line(const std::string& tag, const std::string& payload) {
  std::string line = tag + " " + payload + "\n";
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fflush(stdout);
}

// Sizes the repetitions of this variant once: one call timed alone (an over-estimate, it
// includes the launch) and the host time to enqueue it.
BatchPlan calibrate(Problem& p, const TimingSettings& t) {
  const bool flush = t.flush_l2;
  if (flush) l2_flush();  // allocated and measured on first use, not inside the host time below
  BZ_CUDA(cudaStreamSynchronize(stream()));
  const auto t0 = Clock::now();
  enqueue_timed(p, 0, flush);
  const double host_us = us_since(t0);
  BZ_CUDA(cudaEventSynchronize(events().stop(0)));
  const double call_ms = elapsed_ms(0) + (flush ? l2_flush().ms : 0.0);
  const BatchPlan plan = plan_batch(t.target_ms, call_ms, host_us, t.max_calls);
  events().stop(plan.calls - 1);  // create the batch's events now, not while enqueuing it
  return plan;
}

void prepare(Current& c, const Variant& v, const Factory& make) {
  c.problem = make();
  for (int i = 0; i < kWarmupCalls; ++i) c.problem->enqueue();
  BZ_CUDA(cudaStreamSynchronize(stream()));  // kernel faults surface here, not in the timing
#ifdef BENANZA_CUPTI
  JsonObject line;
  line.add("name", v.name);
  line.raw("profile", profile_kernels(*c.problem, cupti_settings()));
  emit_line("BENANZA_METRICS", line.str());
#else
  (void)v;
#endif
  c.plan = calibrate(*c.problem, timing_settings());
}

// One repetition: hold the stream, enqueue every call with its events, then read the GPU time
// of the calls alone. If the host took longer than the hold, the GPU may have waited for it
// inside a window: counted in host_bound_reps, so such a number is never mistaken for clean.
double time_repetition(Current& c, bool flush) {
  Problem& p = *c.problem;
  delay_stream(c.plan.delay_us);
  const auto t0 = Clock::now();
  for (int i = 0; i < c.plan.calls; ++i) enqueue_timed(p, i, flush);
  if (us_since(t0) > c.plan.delay_us) ++c.host_bound_reps;
  BZ_CUDA(cudaEventSynchronize(events().stop(c.plan.calls - 1)));
  double total = 0;
  for (int i = 0; i < c.plan.calls; ++i) total += elapsed_ms(i);
  return total / c.plan.calls;
}

}  // namespace

double bytes_of(const Work& work, const Variant& v) { return work.elements * dtype_size(v.dtype); }

void run_variant(benchmark::State& state, const Variant& v, const Factory& make) {
  Current& c = current();
  if (c.name != v.name) {
    c = Current{};  // frees the previous benchmark's device memory before allocating more
    c.name = v.name;
    try {
      prepare(c, v, make);
    } catch (const Unsupported& e) {
      c.refused = true;
      c.error = e.what();
    } catch (const std::exception& e) {
      c.error = e.what();
    }
    if (!c.error.empty()) c.problem.reset();
  }
  if (!c.problem) {
    if (c.refused) mark_unsupported(state, c.error); else mark_failed(state, c.error);
    return;
  }
  const TimingSettings& t = timing_settings();
  Problem& p = *c.problem;
  set_implementation(state, p.implementation);
  set_workspace(state, p.workspace_bytes);
  for (const auto& kv : p.counters) state.counters[kv.first] = benchmark::Counter(kv.second);
  try {
    for (auto _ : state) state.SetIterationTime(time_repetition(c, t.flush_l2) * 1e-3);
  } catch (const Unsupported& e) {
    mark_unsupported(state, e.what());
  } catch (const std::exception& e) {
    mark_failed(state, e.what());
  }
  state.counters["calls"] = benchmark::Counter(c.plan.calls);
  state.counters["delay_us"] = benchmark::Counter(c.plan.delay_us);
  state.counters["l2_flushed"] = benchmark::Counter(t.flush_l2 ? 1 : 0);
  state.counters["host_bound_reps"] = benchmark::Counter(c.host_bound_reps);
}

CuptiSettings& cupti_settings() {
  static CuptiSettings s;
  return s;
}

TimingSettings& timing_settings() {
  static TimingSettings s;
  return s;
}

}  // namespace benanza::cudnn
