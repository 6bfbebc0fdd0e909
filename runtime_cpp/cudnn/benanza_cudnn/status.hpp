// How the runtime files every status code the libraries return: "unsupported" (the library
// refused this configuration), "failed" (a harness bug, an environment fault, a run-time
// failure) or, for CUDA, whether the error poisons the context for the rest of the process.
//
// Only headers, no library calls: a host-only test program checks these tables against the
// installed cudnn_graph.h, cublas_api.h and driver_types.h (tests/backends/test_cudnn.py).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstddef>

namespace benanza::cudnn {

enum class Verdict { Unsupported, Failed };

// One row of a status table: the code, its enum name, and how a benchmark that gets it is stored.
struct StatusRule {
  int code;
  const char* name;
  Verdict verdict;
};

// Every non-success cudnnStatus_t of the cuDNN headers this runtime is compiled against.
extern const StatusRule kCudnnRules[];
extern const size_t kCudnnRuleCount;
// Every non-success cublasStatus_t.
extern const StatusRule kCublasRules[];
extern const size_t kCublasRuleCount;

// The rule for a code; a code missing from the table (a newer library) is Failed, never
// Unsupported: a wrong "unsupported" hides a defect, a failure is retried and read.
StatusRule cudnn_rule(cudnnStatus_t status);
StatusRule cublas_rule(cublasStatus_t status);

// CUDA errors after which "any further CUDA work will return the same error" (driver_types.h):
// the process must end for the next benchmark to run on a clean context.
extern const int kStickyCudaErrors[];
extern const size_t kStickyCudaErrorCount;
bool is_sticky(cudaError_t status);

}  // namespace benanza::cudnn
