// The status tables of status.hpp. "Unsupported" is only the library refusing a configuration
// (shape, data type, layout, padding, algorithm, this GPU's architecture); null or misaligned
// pointers, mismatched shapes and unfinalized descriptors are harness bugs, and an incompatible
// driver, a missing NVRTC or sub-library is the environment: those are failures, stored with the
// status name so they are read and retried, never mistaken for a property of the layer.
#include "benanza_cudnn/status.hpp"

#define BZ_RULE(code, verdict) {static_cast<int>(code), #code, Verdict::verdict}

namespace benanza::cudnn {

#if CUDNN_MAJOR >= 9
const StatusRule kCudnnRules[] = {
    // 1xxx: the library or its environment is not usable
    BZ_RULE(CUDNN_STATUS_NOT_INITIALIZED, Failed),
    BZ_RULE(CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH, Failed),
    BZ_RULE(CUDNN_STATUS_SERIALIZATION_VERSION_MISMATCH, Failed),
    BZ_RULE(CUDNN_STATUS_DEPRECATED, Failed),
    BZ_RULE(CUDNN_STATUS_LICENSE_ERROR, Failed),
    BZ_RULE(CUDNN_STATUS_RUNTIME_IN_PROGRESS, Failed),
    BZ_RULE(CUDNN_STATUS_RUNTIME_FP_OVERFLOW, Failed),
#if CUDNN_VERSION >= 90200
    BZ_RULE(CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED, Failed),
#endif
    // 2xxx: the plain code and OUT_OF_BOUND are a parameter value the call does not accept
    // (the layer's configuration, e.g. an LRN window over CUDNN_LRN_MAX_N); the sub-codes
    // that name a pointer, descriptor or stream are the harness's mistakes.
    BZ_RULE(CUDNN_STATUS_BAD_PARAM, Unsupported),
    {2001, "CUDNN_STATUS_INVALID_VALUE", Verdict::Unsupported},  // deprecated alias of BAD_PARAM
    BZ_RULE(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, Failed),
    BZ_RULE(CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER, Failed),
    BZ_RULE(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED, Failed),
    BZ_RULE(CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND, Unsupported),
    BZ_RULE(CUDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT, Failed),
    BZ_RULE(CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH, Failed),
    BZ_RULE(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH, Failed),
    BZ_RULE(CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES, Failed),
    BZ_RULE(CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE, Failed),
#if CUDNN_VERSION >= 90500
    BZ_RULE(CUDNN_STATUS_BAD_PARAM_CUDA_GRAPH_MISMATCH, Failed),
#endif
#if CUDNN_VERSION >= 90600
    BZ_RULE(CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE, Failed),
#endif
    // 3xxx: refusals of the configuration (on this GPU) ...
    BZ_RULE(CUDNN_STATUS_NOT_SUPPORTED, Unsupported),
    BZ_RULE(CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN, Unsupported),
    BZ_RULE(CUDNN_STATUS_NOT_SUPPORTED_SHAPE, Unsupported),
    BZ_RULE(CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE, Unsupported),
    BZ_RULE(CUDNN_STATUS_NOT_SUPPORTED_LAYOUT, Unsupported),
    BZ_RULE(CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH, Unsupported),
    BZ_RULE(CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT, Unsupported),
    BZ_RULE(CUDNN_STATUS_NOT_SUPPORTED_PADDING, Unsupported),
    BZ_RULE(CUDNN_STATUS_NOT_SUPPORTED_BAD_LAUNCH_PARAM, Unsupported),
#if CUDNN_VERSION >= 90500
    BZ_RULE(CUDNN_STATUS_NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API, Unsupported),
#endif
#if CUDNN_VERSION >= 91800
    BZ_RULE(CUDNN_STATUS_NOT_SUPPORTED_INVALID_DYNAMIC_SHAPE, Unsupported),
#endif
    // ... and the environment: another driver, runtime, NVRTC or sub-library would run it
    BZ_RULE(CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER, Failed),
    BZ_RULE(CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDART, Failed),
    BZ_RULE(CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING, Failed),
    BZ_RULE(CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE, Failed),
    // 4xxx, 5xxx: internal and execution failures
    BZ_RULE(CUDNN_STATUS_INTERNAL_ERROR, Failed),
    BZ_RULE(CUDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED, Failed),
    BZ_RULE(CUDNN_STATUS_INTERNAL_ERROR_UNEXPECTED_VALUE, Failed),
    BZ_RULE(CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED, Failed),
    BZ_RULE(CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED, Failed),
    BZ_RULE(CUDNN_STATUS_INTERNAL_ERROR_BAD_LAUNCH_PARAM, Failed),
    BZ_RULE(CUDNN_STATUS_INTERNAL_ERROR_TEXTURE_CREATION_FAILED, Failed),
    BZ_RULE(CUDNN_STATUS_EXECUTION_FAILED, Failed),
    BZ_RULE(CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER, Failed),
    BZ_RULE(CUDNN_STATUS_EXECUTION_FAILED_CUBLAS, Failed),
    BZ_RULE(CUDNN_STATUS_EXECUTION_FAILED_CUDART, Failed),
    BZ_RULE(CUDNN_STATUS_EXECUTION_FAILED_CURAND, Failed),
};
#else
// cuDNN 8 has one flat enum and no sub-codes.
const StatusRule kCudnnRules[] = {
    BZ_RULE(CUDNN_STATUS_NOT_INITIALIZED, Failed),      BZ_RULE(CUDNN_STATUS_ALLOC_FAILED, Failed),
    BZ_RULE(CUDNN_STATUS_BAD_PARAM, Unsupported),       BZ_RULE(CUDNN_STATUS_INTERNAL_ERROR, Failed),
    BZ_RULE(CUDNN_STATUS_INVALID_VALUE, Unsupported),   BZ_RULE(CUDNN_STATUS_ARCH_MISMATCH, Unsupported),
    BZ_RULE(CUDNN_STATUS_MAPPING_ERROR, Failed),        BZ_RULE(CUDNN_STATUS_EXECUTION_FAILED, Failed),
    BZ_RULE(CUDNN_STATUS_NOT_SUPPORTED, Unsupported),   BZ_RULE(CUDNN_STATUS_LICENSE_ERROR, Failed),
    BZ_RULE(CUDNN_STATUS_RUNTIME_PREREQUISITE_MISSING, Failed),
    BZ_RULE(CUDNN_STATUS_RUNTIME_IN_PROGRESS, Failed),  BZ_RULE(CUDNN_STATUS_RUNTIME_FP_OVERFLOW, Failed),
    BZ_RULE(CUDNN_STATUS_VERSION_MISMATCH, Failed),
};
#endif
const size_t kCudnnRuleCount = sizeof kCudnnRules / sizeof kCudnnRules[0];

// cuBLAS: INVALID_VALUE is a negative size or a leading dimension the harness computed wrong
// (the Ex calls answer NOT_SUPPORTED for type/compute combinations they lack).
const StatusRule kCublasRules[] = {
    BZ_RULE(CUBLAS_STATUS_NOT_INITIALIZED, Failed),
    BZ_RULE(CUBLAS_STATUS_ALLOC_FAILED, Failed),
    BZ_RULE(CUBLAS_STATUS_INVALID_VALUE, Failed),
    BZ_RULE(CUBLAS_STATUS_ARCH_MISMATCH, Unsupported),
    BZ_RULE(CUBLAS_STATUS_MAPPING_ERROR, Failed),
    BZ_RULE(CUBLAS_STATUS_EXECUTION_FAILED, Failed),
    BZ_RULE(CUBLAS_STATUS_INTERNAL_ERROR, Failed),
    BZ_RULE(CUBLAS_STATUS_NOT_SUPPORTED, Unsupported),
    BZ_RULE(CUBLAS_STATUS_LICENSE_ERROR, Failed),
};
const size_t kCublasRuleCount = sizeof kCublasRules / sizeof kCublasRules[0];

namespace {

StatusRule find(const StatusRule* rules, size_t count, int code) {
  for (size_t i = 0; i < count; ++i)
    if (rules[i].code == code) return rules[i];
  return {code, "unknown status", Verdict::Failed};
}

}  // namespace

StatusRule cudnn_rule(cudnnStatus_t status) { return find(kCudnnRules, kCudnnRuleCount, status); }
StatusRule cublas_rule(cublasStatus_t status) { return find(kCublasRules, kCublasRuleCount, status); }

// By number: several are newer than CUDA 12.0, whose headers lack the names.
const int kStickyCudaErrors[] = {
    226,  // cudaErrorContained
    700,  // cudaErrorIllegalAddress
    702,  // cudaErrorLaunchTimeout
    710,  // cudaErrorAssert
    714,  // cudaErrorHardwareStackError
    715,  // cudaErrorIllegalInstruction
    716,  // cudaErrorMisalignedAddress
    717,  // cudaErrorInvalidAddressSpace
    718,  // cudaErrorInvalidPc
    719,  // cudaErrorLaunchFailure
    721,  // cudaErrorTensorMemoryLeak
    810,  // cudaErrorMpsClientTerminated
    911,  // cudaErrorExternalDevice
    214,  // cudaErrorECCUncorrectable: the header does not say so, but the device needs a reset
};
const size_t kStickyCudaErrorCount = sizeof kStickyCudaErrors / sizeof kStickyCudaErrors[0];

bool is_sticky(cudaError_t status) {
  for (size_t i = 0; i < kStickyCudaErrorCount; ++i)
    if (kStickyCudaErrors[i] == static_cast<int>(status)) return true;
  return false;
}

}  // namespace benanza::cudnn
