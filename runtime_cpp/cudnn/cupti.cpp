// CUPTI mode (paper §III-B5): after warm-up, a fixed number of calls run with the Activity API
// recording every kernel (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL): name, launch shape, duration.
//
// Metric values (flops, dram bytes, ...) need the CUPTI range profiler and are not collected by
// this runtime: the requested metric names are echoed under "metrics" with "collected": false,
// so a consumer never mistakes a missing value for a zero.
#include <cupti.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "benanza/json.hpp"
#include "benanza_cudnn/harness.hpp"
#include "benanza_cudnn/measure.hpp"

namespace benanza::cudnn {
namespace {

void check_cupti(CUptiResult status, const char* call) {
  if (status == CUPTI_SUCCESS) return;
  const char* text = nullptr;
  cuptiGetResultString(status, &text);
  throw Failure(std::string(call) + ": " + (text ? text : "unknown CUPTI error"));
}

#define BZ_CUPTI(expr) check_cupti((expr), #expr)

// The kernel record type of the CUPTI this runtime is compiled against (CUDA 13: 10, CUDA 12: 9).
#if CUPTI_API_VERSION >= 130000
using KernelActivity = CUpti_ActivityKernel10;
#else
using KernelActivity = CUpti_ActivityKernel9;
#endif

struct KernelRecord {
  std::string name;
  uint64_t duration_ns;
  int grid[3], block[3];
};

std::mutex records_mutex;
std::vector<KernelRecord> records;
uint64_t incomplete_records = 0;  // skipped: no end timestamp yet at the forced flush

constexpr size_t kBufferBytes = 8 << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  std::lock_guard<std::mutex> lock(records_mutex);
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const auto* k = reinterpret_cast<const KernelActivity*>(record);
    uint64_t ns = 0;
    if (!kernel_duration(k->start, k->end, &ns)) {
      ++incomplete_records;
      continue;
    }
    records.push_back({k->name ? k->name : "", ns, {k->gridX, k->gridY, k->gridZ}, {k->blockX, k->blockY, k->blockZ}});
  }
  std::free(buffer);
}

std::string dims_json(const int d[3]) {
  return "[" + std::to_string(d[0]) + "," + std::to_string(d[1]) + "," + std::to_string(d[2]) + "]";
}

}  // namespace

std::string profile_kernels(Problem& problem, const CuptiSettings& settings) {
  static bool registered = [] {
    BZ_CUPTI(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
    return true;
  }();
  (void)registered;
  for (int i = 0; i < settings.warmup; ++i) problem.enqueue();
  BZ_CUDA(cudaStreamSynchronize(stream()));
  {
    std::lock_guard<std::mutex> lock(records_mutex);
    records.clear();
    incomplete_records = 0;
  }
  BZ_CUPTI(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
  for (int i = 0; i < settings.iterations; ++i) problem.enqueue();
  BZ_CUDA(cudaStreamSynchronize(stream()));
  BZ_CUPTI(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
  BZ_CUPTI(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));

  // Per kernel name: calls, total and mean duration; the launch shape of its first call.
  struct Agg {
    uint64_t calls = 0, total_ns = 0;
    const KernelRecord* first = nullptr;
  };
  std::map<std::string, Agg> by_name;
  std::vector<std::string> order;
  uint64_t total_ns = 0;
  std::lock_guard<std::mutex> lock(records_mutex);
  for (const auto& r : records) {
    Agg& a = by_name[r.name];
    if (!a.first) {
      a.first = &r;
      order.push_back(r.name);
    }
    a.calls += 1;
    a.total_ns += r.duration_ns;
    total_ns += r.duration_ns;
  }
  std::string kernels = "[";
  for (size_t i = 0; i < order.size(); ++i) {
    const Agg& a = by_name[order[i]];
    JsonObject k;
    k.add("name", order[i]);
    k.add("calls_per_iteration", static_cast<double>(a.calls) / settings.iterations);
    k.add("total_ns", static_cast<int64_t>(a.total_ns));
    k.add("mean_ns", static_cast<double>(a.total_ns) / a.calls);
    k.raw("grid", dims_json(a.first->grid)).raw("block", dims_json(a.first->block));
    kernels += (i ? "," : "") + k.str();
  }
  kernels += "]";
  std::string requested = "[";
  for (size_t i = 0; i < settings.metrics.size(); ++i)
    requested += (i ? "," : "") + json_string(settings.metrics[i]);
  requested += "]";

  const double per_iter_ms = total_ns * 1e-6 / settings.iterations;
  problem.counters["kernel_ms"] = per_iter_ms;
  problem.counters["kernels_per_iteration"] = static_cast<double>(records.size()) / settings.iterations;
  problem.counters["cupti_incomplete_records"] = static_cast<double>(incomplete_records);
  JsonObject metrics;
  metrics.raw("requested", requested).add("collected", false);
  JsonObject out;
  out.add("warmup", static_cast<int64_t>(settings.warmup));
  out.add("iterations", static_cast<int64_t>(settings.iterations));
  out.add("kernel_ms_per_iteration", per_iter_ms);
  // Non-zero: kernel_ms_per_iteration misses these kernels, so it is an undercount.
  out.add("incomplete_records", static_cast<int64_t>(incomplete_records));
  out.raw("kernels", kernels);
  out.raw("metrics", metrics.str());
  return out.str();
}

}  // namespace benanza::cudnn
