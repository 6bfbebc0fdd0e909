#include "benanza_cudnn/measure.hpp"

#include <algorithm>
#include <cmath>

namespace benanza::cudnn {

BatchPlan plan_batch(double target_ms, double call_ms, double host_us, int max_calls) {
  int calls = 1;
  if (call_ms > 0 && target_ms > call_ms)
    calls = static_cast<int>(std::min<double>(max_calls, std::floor(target_ms / call_ms)));
  calls = std::max(1, std::min(calls, max_calls));
  const double delay = std::min(kMaxDelayUs, 2.0 * calls * std::max(0.0, host_us) + 20.0);
  return {calls, delay};
}

size_t l2_flush_bytes(int l2_cache_bytes) { return l2_cache_bytes > 0 ? 2 * static_cast<size_t>(l2_cache_bytes) : 0; }

bool kernel_duration(uint64_t start, uint64_t end, uint64_t* ns) {
  if (start == 0 || end == 0 || end < start) return false;
  *ns = end - start;
  return true;
}

}  // namespace benanza::cudnn
