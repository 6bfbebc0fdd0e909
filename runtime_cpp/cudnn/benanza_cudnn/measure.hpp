// The arithmetic of a GPU measurement, kept free of CUDA calls so a host-only test checks it:
// how many calls one repetition times, how long the stream is held before them, how much
// memory flushes the L2 cache, and which CUPTI kernel records carry a usable duration.
#pragma once

#include <cstddef>
#include <cstdint>

namespace benanza::cudnn {

// One repetition: `calls` back-to-back calls, each between its own pair of events, after a
// device-side delay of `delay_us` during which the host enqueues them all, so neither API time
// nor launch latency lands between the events (the GPU never waits for the host there).
struct BatchPlan {
  int calls;
  double delay_us;
};

// call_ms: GPU time of one call (with its L2 flush when flushing) timed alone; host_us: host
// time to enqueue one call (with flush and events). Calls fill `target_ms` of GPU time, at least
// one and at most `max_calls`; the delay covers their host time twice over, capped at kMaxDelayUs
// (a host slower than that shows up in the host_bound_reps counter instead).
constexpr double kMaxDelayUs = 20000;
BatchPlan plan_batch(double target_ms, double call_ms, double host_us, int max_calls);

// Bytes written to evict the L2 cache: twice its size (lines of the flush buffer itself stay
// behind, never the benchmark's inputs); 0 when the device reports no L2.
size_t l2_flush_bytes(int l2_cache_bytes);

// A CUPTI kernel record's duration in ns; false for a record that was not complete when the
// buffer was force-flushed (start or end still 0, or end before start): `end - start` on those
// unsigned timestamps would wrap to about 584 years.
bool kernel_duration(uint64_t start, uint64_t end, uint64_t* ns);

}  // namespace benanza::cudnn
