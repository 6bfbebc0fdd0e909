# include() from a generated cuDNN project (after project() with CUDA enabled): defines
# BENANZA_CUDNN_RUNTIME_TARGET, the static library the benchmarks link. It is compiled here,
# once per build folder, unless -DBENANZA_CUDNN_RUNTIME=<folder> names a build of this folder's
# CMakeLists.txt (the runtime alone): then that build's library is linked, and several projects
# built on one machine compile the runtime (most of their build time) once.
include("${CMAKE_CURRENT_LIST_DIR}/../cmake/BenanzaCudaLibs.cmake")

option(BENANZA_CUPTI "Profile kernels with CUPTI (fixed iterations) instead of timing only" OFF)
set(BENANZA_CUDNN_RUNTIME "" CACHE PATH "A build of runtime_cpp/cudnn alone, to link instead of compiling the runtime")

set(BENANZA_CUDNN_RUNTIME_DIR "${CMAKE_CURRENT_LIST_DIR}")
# ON or OFF, however the option was spelled: what a prebuilt runtime records and is compared with
if(BENANZA_CUPTI)
  set(BENANZA_CUPTI_STATE ON)
else()
  set(BENANZA_CUPTI_STATE OFF)
endif()

# What a prebuilt runtime must have been compiled from: these sources, byte for byte.
function(benanza_cudnn_runtime_digest out)
  get_filename_component(root "${BENANZA_CUDNN_RUNTIME_DIR}/.." ABSOLUTE)
  file(GLOB_RECURSE files RELATIVE "${root}" "${root}/common/*" "${root}/cudnn/*" "${root}/cmake/*")
  list(SORT files)
  set(text "")
  foreach(f IN LISTS files)
    file(SHA256 "${root}/${f}" hash)
    string(APPEND text "${f} ${hash}\n")
  endforeach()
  string(SHA256 digest "${text}")
  set(${out} "${digest}" PARENT_SCOPE)
endfunction()

if(BENANZA_CUDNN_RUNTIME)
  set(_prebuilt "${BENANZA_CUDNN_RUNTIME}/BenanzaCudnnRuntime.cmake")
  if(NOT EXISTS "${_prebuilt}")
    message(FATAL_ERROR "BENANZA_CUDNN_RUNTIME=${BENANZA_CUDNN_RUNTIME} holds no BenanzaCudnnRuntime.cmake: "
                        "build runtime_cpp/cudnn there first (cmake -S <runtime>/cudnn -B <folder>)")
  endif()
  include("${_prebuilt}")  # sets BENANZA_CUDNN_RUNTIME_BUILT_CUPTI and _DIGEST, imports the targets
  benanza_cudnn_runtime_digest(_digest)
  if(NOT _digest STREQUAL BENANZA_CUDNN_RUNTIME_BUILT_DIGEST)
    message(FATAL_ERROR "BENANZA_CUDNN_RUNTIME=${BENANZA_CUDNN_RUNTIME} was built from other runtime sources "
                        "than ${BENANZA_CUDNN_RUNTIME_DIR}: rebuild it, or leave the option out")
  endif()
  if(NOT BENANZA_CUPTI_STATE STREQUAL BENANZA_CUDNN_RUNTIME_BUILT_CUPTI)
    message(FATAL_ERROR "BENANZA_CUDNN_RUNTIME=${BENANZA_CUDNN_RUNTIME} was built with "
                        "BENANZA_CUPTI=${BENANZA_CUDNN_RUNTIME_BUILT_CUPTI}, this project wants ${BENANZA_CUPTI_STATE}")
  endif()
  # what the imported targets link
  find_package(benchmark REQUIRED)
  if(BENANZA_CUPTI)
    benanza_find_cupti()
  endif()
  set(BENANZA_CUDNN_RUNTIME_TARGET benanza_prebuilt::benanza_cudnn_runtime)
else()
  # A parent project building several backends may have defined the shared runtime already.
  if(NOT TARGET benanza_runtime)
    include("${CMAKE_CURRENT_LIST_DIR}/../common/benanza_runtime.cmake")
  endif()
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
  set(BENANZA_CUDNN_RUNTIME_TARGET benanza_cudnn_runtime)
endif()

# The executable's main lives here too; generated tables are linked in beside it.
function(benanza_cudnn_executable name)
  add_executable(${name} ${BENANZA_CUDNN_RUNTIME_DIR}/main.cpp ${ARGN})
  target_link_libraries(${name} PRIVATE ${BENANZA_CUDNN_RUNTIME_TARGET})
  # the generated tables use designated initializers
  target_compile_features(${name} PRIVATE cxx_std_20)
endfunction()
