#include "benanza_cudnn/harness.hpp"

#include <cstdio>

#include "benanza/json.hpp"

namespace benanza::cudnn {
namespace {

class Event {
 public:
  Event() { BZ_CUDA(cudaEventCreate(&e_)); }
  ~Event() { cudaEventDestroy(e_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  operator cudaEvent_t() const { return e_; }

 private:
  cudaEvent_t e_{};
};

// The benchmark being run: its prepared problem, or why it could not be prepared.
struct Current {
  std::string name;
  std::unique_ptr<Problem> problem;
  std::unique_ptr<Event> start, stop;
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

void prepare(Current& c, const Variant& v, const Factory& make) {
  c.problem = make();
  c.start = std::make_unique<Event>();
  c.stop = std::make_unique<Event>();
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
  Problem& p = *c.problem;
  set_implementation(state, p.implementation);
  set_workspace(state, p.workspace_bytes);
  for (const auto& kv : p.counters) state.counters[kv.first] = benchmark::Counter(kv.second);
  try {
    for (auto _ : state) {
      BZ_CUDA(cudaEventRecord(*c.start, stream()));
      p.enqueue();
      BZ_CUDA(cudaEventRecord(*c.stop, stream()));
      BZ_CUDA(cudaEventSynchronize(*c.stop));
      float ms = 0;
      BZ_CUDA(cudaEventElapsedTime(&ms, *c.start, *c.stop));
      state.SetIterationTime(ms * 1e-3);
    }
  } catch (const Unsupported& e) {
    mark_unsupported(state, e.what());
  } catch (const std::exception& e) {
    mark_failed(state, e.what());
  }
}

CuptiSettings& cupti_settings() {
  static CuptiSettings s;
  return s;
}

}  // namespace benanza::cudnn
