# Imported targets for the libraries the cuDNN backend links (include after project()):
#   benanza::cudnn   libcudnn    (PyPI nvidia-cudnn-cu13/-cu12 wheel, $CUDNN_ROOT, or a system install)
#   benanza::cublas  libcublas and libcublasLt (PyPI nvidia-cublas / nvidia-cublas-cu12 wheel, or the
#                    CUDA toolkit; cublasLtMatmul runs the GEMMs with bias epilogues)
#   benanza::cupti   libcupti    (the CUDA toolkit: lib64 or extras/CUPTI)
# and BENANZA_CUDNN_FRONTEND_INCLUDE_DIR, the header-only cuDNN frontend (cudnn_frontend.h: the
# PyPI nvidia-cudnn-frontend wheel unpacks it into site-packages/include, or $CUDNN_FRONTEND_ROOT).
# The wheels ship versioned sonames only (libcudnn.so.9, libcublas.so.13), so the libraries are
# found and linked by full path. BENANZA_PYTHON names the interpreter whose site-packages hold
# the wheels (the generator records the one it ran under).
include_guard(GLOBAL)

find_package(CUDAToolkit REQUIRED)

include("${CMAKE_CURRENT_LIST_DIR}/BenanzaPython.cmake")
benanza_python_site_dirs(_benanza_site_dirs)

set(_cudnn_roots ${CUDNN_ROOT} $ENV{CUDNN_ROOT})
set(_wheel_cudnn "")
set(_wheel_cublas "")
foreach(dir IN LISTS _benanza_site_dirs)
  list(APPEND _wheel_cudnn "${dir}/nvidia/cudnn")
  list(APPEND _wheel_cublas "${dir}/nvidia/cu13" "${dir}/nvidia/cublas")
endforeach()

find_path(BENANZA_CUDNN_INCLUDE_DIR cudnn.h
  HINTS ${_cudnn_roots} ${_wheel_cudnn} ${CUDAToolkit_INCLUDE_DIRS}
  PATH_SUFFIXES include)
# NAMES_PER_DIR: a folder earlier in the hints (the wheel, whose cudnn.h was taken above) wins with
# any of the names; by name first, a system libcudnn.so of another version would be linked against
# the wheel's headers, and not the cuDNN the framework beside it loads (seen on the H200 image:
# /usr/lib/x86_64-linux-gnu/libcudnn.so 9.14 under the nvidia-cudnn-cu13 wheel's 9.19 headers).
find_library(BENANZA_CUDNN_LIBRARY NAMES cudnn libcudnn.so.9 libcudnn.so.8 NAMES_PER_DIR
  HINTS ${_cudnn_roots} ${_wheel_cudnn} ${CUDAToolkit_LIBRARY_DIR}
  PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu)
find_path(BENANZA_CUBLAS_INCLUDE_DIR cublas_v2.h
  HINTS ${_wheel_cublas} ${CUDAToolkit_INCLUDE_DIRS}
  PATH_SUFFIXES include)
find_path(BENANZA_CUDNN_FRONTEND_INCLUDE_DIR cudnn_frontend.h
  HINTS ${CUDNN_FRONTEND_ROOT} $ENV{CUDNN_FRONTEND_ROOT} ${_benanza_site_dirs}
  PATH_SUFFIXES include)
# NVRTC: the frontend's headers compile its open-source engines (runtime-compiled kernels) into
# every user; the nvidia-cublas wheel pulls in nvidia-cuda-nvrtc, which unpacks beside cuBLAS.
find_library(BENANZA_NVRTC_LIBRARY NAMES nvrtc libnvrtc.so.13 libnvrtc.so.12 NAMES_PER_DIR
  HINTS ${_wheel_cublas} ${CUDAToolkit_LIBRARY_DIR}
  PATH_SUFFIXES lib lib64)
find_library(BENANZA_CUBLAS_LIBRARY NAMES cublas libcublas.so.13 libcublas.so.12 NAMES_PER_DIR
  HINTS ${_wheel_cublas} ${CUDAToolkit_LIBRARY_DIR}
  PATH_SUFFIXES lib lib64)
get_filename_component(_cublas_dir "${BENANZA_CUBLAS_LIBRARY}" DIRECTORY)
find_library(BENANZA_CUBLASLT_LIBRARY NAMES cublasLt libcublasLt.so.13 libcublasLt.so.12
  HINTS "${_cublas_dir}" NO_DEFAULT_PATH)

foreach(var BENANZA_CUDNN_INCLUDE_DIR BENANZA_CUDNN_LIBRARY BENANZA_CUBLAS_INCLUDE_DIR BENANZA_CUBLAS_LIBRARY
            BENANZA_CUBLASLT_LIBRARY BENANZA_CUDNN_FRONTEND_INCLUDE_DIR BENANZA_NVRTC_LIBRARY)
  if(NOT ${var})
    message(FATAL_ERROR
      "${var} not found. Install the wheels (pip install nvidia-cudnn-cu13 nvidia-cublas nvidia-cudnn-frontend) into the "
      "Python given by -DBENANZA_PYTHON=..., or point -DCUDNN_ROOT=... at a cuDNN install. "
      "Searched site-packages: ${_benanza_site_dirs}")
  endif()
endforeach()
message(STATUS "benanza: cuDNN ${BENANZA_CUDNN_LIBRARY}")
message(STATUS "benanza: cuBLAS ${BENANZA_CUBLAS_LIBRARY}")
message(STATUS "benanza: cuDNN frontend ${BENANZA_CUDNN_FRONTEND_INCLUDE_DIR}")

function(_benanza_imported name library include_dir)
  if(NOT TARGET ${name})
    add_library(${name} SHARED IMPORTED GLOBAL)
    set_target_properties(${name} PROPERTIES IMPORTED_LOCATION "${library}"
                                             INTERFACE_INCLUDE_DIRECTORIES "${include_dir}")
  endif()
endfunction()

_benanza_imported(benanza::cudnn "${BENANZA_CUDNN_LIBRARY}" "${BENANZA_CUDNN_INCLUDE_DIR}")
_benanza_imported(benanza::cublas "${BENANZA_CUBLAS_LIBRARY}" "${BENANZA_CUBLAS_INCLUDE_DIR}")
_benanza_imported(benanza::cublaslt "${BENANZA_CUBLASLT_LIBRARY}" "${BENANZA_CUBLAS_INCLUDE_DIR}")
# libcublasLt sits beside libcublas (which needs it at link time too): the one folder both come from.
set_property(TARGET benanza::cublas PROPERTY INTERFACE_LINK_OPTIONS "LINKER:-rpath-link,${_cublas_dir}")
set_property(TARGET benanza::cublas PROPERTY INTERFACE_LINK_LIBRARIES benanza::cublaslt)

# The toolkit's CUPTI first (the one its nvcc and driver were released with), else the PyPI wheel's
# (nvidia-cuda-cupti: nvidia/cu13 for CUDA 13, nvidia/cuda_cupti for 12), which an image holding
# PyTorch has beside cuBLAS.
function(benanza_find_cupti)
  set(_wheel_cupti "")
  foreach(dir IN LISTS _benanza_site_dirs)
    list(APPEND _wheel_cupti "${dir}/nvidia/cu13" "${dir}/nvidia/cuda_cupti")
  endforeach()
  find_library(BENANZA_CUPTI_LIBRARY NAMES cupti libcupti.so.13 libcupti.so.12
    HINTS ${CUDAToolkit_LIBRARY_DIR} "${CUDAToolkit_LIBRARY_ROOT}/extras/CUPTI/lib64" ${_wheel_cupti}
    PATH_SUFFIXES lib64 lib)
  find_path(BENANZA_CUPTI_INCLUDE_DIR cupti.h
    HINTS ${CUDAToolkit_INCLUDE_DIRS} "${CUDAToolkit_LIBRARY_ROOT}/extras/CUPTI/include" ${_wheel_cupti}
    PATH_SUFFIXES include)
  if(NOT BENANZA_CUPTI_LIBRARY OR NOT BENANZA_CUPTI_INCLUDE_DIR)
    message(FATAL_ERROR "BENANZA_CUPTI=ON but CUPTI (libcupti, cupti.h) is neither in the CUDA toolkit "
                        "${CUDAToolkit_LIBRARY_ROOT} nor in a nvidia-cuda-cupti wheel (searched: ${_wheel_cupti})")
  endif()
  _benanza_imported(benanza::cupti "${BENANZA_CUPTI_LIBRARY}" "${BENANZA_CUPTI_INCLUDE_DIR}")
endfunction()
