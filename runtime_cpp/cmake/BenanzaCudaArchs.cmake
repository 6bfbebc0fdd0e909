# Picks the CUDA compiler and CMAKE_CUDA_ARCHITECTURES before the CUDA language is enabled
# (include before project()).
#
# Compiler: an explicit -DCMAKE_CUDA_COMPILER or $CUDACXX wins, then the machine's CUDA
# ($CUDA_HOME, $CUDA_PATH, /usr/local/cuda, PATH), then the toolkit that PyPI's nvidia-cuda-nvcc,
# -crt and -runtime wheels unpack into BENANZA_PYTHON's site-packages (nvidia/cu13), so a
# machine without CUDA still compiles the benchmarks. Those wheels ship versioned sonames only
# (libcudart.so.13), which FindCUDAToolkit does not search for, so the runtime is named for it,
# and nvcc 13.0 looks for its static libraries in lib64/, so that is linked to their lib/.
#
# Architectures: an explicit -DCMAKE_CUDA_ARCHITECTURES or $CUDAARCHS wins. Otherwise: "native"
# when a GPU is visible (nvidia-smi -L succeeds), else every architecture the installed nvcc
# supports that matters for inference GPUs: CUDA 13 dropped Volta (sm_70), so a V100 needs a
# CUDA 12 toolkit, which this also accepts.
include_guard(GLOBAL)
include("${CMAKE_CURRENT_LIST_DIR}/BenanzaPython.cmake")

if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
  find_program(BENANZA_NVCC nvcc HINTS "$ENV{CUDA_HOME}/bin" "$ENV{CUDA_PATH}/bin" /usr/local/cuda/bin)
  if(NOT BENANZA_NVCC)
    benanza_python_site_dirs(_benanza_sites)
    foreach(dir IN LISTS _benanza_sites)
      foreach(sub nvidia/cu13 nvidia/cuda_nvcc)
        if(NOT _benanza_wheel_cuda AND EXISTS "${dir}/${sub}/bin/nvcc")
          set(_benanza_wheel_cuda "${dir}/${sub}")
        endif()
      endforeach()
    endforeach()
    if(_benanza_wheel_cuda)
      # nvcc 13.0's nvcc.profile links from lib64/, the wheels unpack into lib/ (13.5's profile
      # says lib/): a link lets either find libcudadevrt and libcudart_static.
      if(NOT EXISTS "${_benanza_wheel_cuda}/lib64")
        file(CREATE_LINK lib "${_benanza_wheel_cuda}/lib64" SYMBOLIC)
      endif()
      set(BENANZA_NVCC "${_benanza_wheel_cuda}/bin/nvcc" CACHE FILEPATH "nvcc (PyPI wheel)" FORCE)
      set(CUDAToolkit_ROOT "${_benanza_wheel_cuda}" CACHE PATH "CUDA toolkit (PyPI wheels)")
      file(GLOB _benanza_cudart "${_benanza_wheel_cuda}/lib/libcudart.so.*")
      if(_benanza_cudart)
        list(GET _benanza_cudart 0 _benanza_cudart)
        set(CUDA_CUDART "${_benanza_cudart}" CACHE FILEPATH "CUDA runtime (PyPI wheel)")
        set(CUDA_cudart_LIBRARY "${_benanza_cudart}" CACHE FILEPATH "CUDA runtime (PyPI wheel)")
      endif()
      message(STATUS "benanza: CUDA compiler from the PyPI wheels: ${BENANZA_NVCC}")
    endif()
  endif()
  if(BENANZA_NVCC)
    set(CMAKE_CUDA_COMPILER "${BENANZA_NVCC}" CACHE FILEPATH "CUDA compiler")
  endif()
endif()

function(_benanza_nvcc_version out)
  if(CMAKE_CUDA_COMPILER)
    set(compiler "${CMAKE_CUDA_COMPILER}")
  else()
    set(compiler "$ENV{CUDACXX}")
  endif()
  set(${out} "" PARENT_SCOPE)
  if(compiler)
    execute_process(COMMAND "${compiler}" --version OUTPUT_VARIABLE text ERROR_QUIET RESULT_VARIABLE rc)
    if(rc EQUAL 0 AND text MATCHES "release ([0-9]+)\\.([0-9]+)")
      set(${out} "${CMAKE_MATCH_1}.${CMAKE_MATCH_2}" PARENT_SCOPE)
    endif()
  endif()
endfunction()

function(benanza_cuda_archs_for_version version out)
  if(version VERSION_GREATER_EQUAL 13.0)
    set(archs 75-real 80-real 86-real 89-real 90-real 100-real 120)
  elseif(version VERSION_GREATER_EQUAL 12.8)
    set(archs 70-real 75-real 80-real 86-real 89-real 90-real 100-real 120)
  elseif(version VERSION_GREATER_EQUAL 11.8)
    set(archs 60-real 70-real 75-real 80-real 86-real 89-real 90)
  else()
    set(archs 60-real 70-real 75-real 80-real 86)
  endif()
  set(${out} "${archs}" PARENT_SCOPE)
endfunction()

if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES AND NOT DEFINED ENV{CUDAARCHS})
  find_program(BENANZA_NVIDIA_SMI nvidia-smi)
  set(_gpu_rc 1)
  if(BENANZA_NVIDIA_SMI)
    execute_process(COMMAND "${BENANZA_NVIDIA_SMI}" -L RESULT_VARIABLE _gpu_rc OUTPUT_QUIET ERROR_QUIET)
  endif()
  if(_gpu_rc EQUAL 0)
    set(CMAKE_CUDA_ARCHITECTURES native CACHE STRING "CUDA architectures (the local GPU)")
  else()
    _benanza_nvcc_version(_nvcc_version)
    if(_nvcc_version)
      benanza_cuda_archs_for_version(${_nvcc_version} _archs)
      set(CMAKE_CUDA_ARCHITECTURES "${_archs}" CACHE STRING "CUDA architectures (nvcc ${_nvcc_version})")
    endif()
  endif()
endif()
