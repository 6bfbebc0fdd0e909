# include() from a generated cuDNN project (after project() with CUDA enabled and the common
# runtime included): defines the static library `benanza_cudnn_runtime`, compiled once per build.
include("${CMAKE_CURRENT_LIST_DIR}/../cmake/BenanzaCudaLibs.cmake")

option(BENANZA_CUPTI "Profile kernels with CUPTI (fixed iterations) instead of timing only" OFF)

set(BENANZA_CUDNN_RUNTIME_DIR "${CMAKE_CURRENT_LIST_DIR}")
set(_dir "${BENANZA_CUDNN_RUNTIME_DIR}")
add_library(benanza_cudnn_runtime STATIC
  ${_dir}/core.cpp ${_dir}/status.cpp ${_dir}/measure.cpp ${_dir}/fill.cu ${_dir}/harness.cpp ${_dir}/context.cpp ${_dir}/conv.cpp
  ${_dir}/ops.cpp ${_dir}/rnn.cpp ${_dir}/blas.cpp ${_dir}/graph.cpp)
target_include_directories(benanza_cudnn_runtime PUBLIC ${_dir})
target_compile_features(benanza_cudnn_runtime PUBLIC cxx_std_17)
target_link_libraries(benanza_cudnn_runtime PUBLIC benanza_runtime benanza::cudnn benanza::cublas CUDA::cudart)
# the cuDNN frontend is header-only and only graph.cpp includes it (its headers call NVRTC)
target_include_directories(benanza_cudnn_runtime PRIVATE "${BENANZA_CUDNN_FRONTEND_INCLUDE_DIR}")
target_link_libraries(benanza_cudnn_runtime PUBLIC "${BENANZA_NVRTC_LIBRARY}")
# graph.cpp only builds graphs and plans (the timed kernels are cuDNN's): optimising the
# frontend's templates buys nothing and takes minutes
set_source_files_properties(${_dir}/graph.cpp PROPERTIES COMPILE_OPTIONS "-O1")
if(BENANZA_CUPTI)
  benanza_find_cupti()
  target_sources(benanza_cudnn_runtime PRIVATE ${_dir}/cupti.cpp)
  target_compile_definitions(benanza_cudnn_runtime PUBLIC BENANZA_CUPTI)
  target_link_libraries(benanza_cudnn_runtime PUBLIC benanza::cupti)
endif()

# The executable's main lives here too; generated tables are linked in beside it.
function(benanza_cudnn_executable name)
  add_executable(${name} ${BENANZA_CUDNN_RUNTIME_DIR}/main.cpp ${ARGN})
  target_link_libraries(${name} PRIVATE benanza_cudnn_runtime)
  # the generated tables use designated initializers
  target_compile_features(${name} PRIVATE cxx_std_20)
endfunction()
