# benanza_python_site_dirs(<out>): the site-packages folders of BENANZA_PYTHON, where the PyPI
# nvidia-* wheels (cuDNN, cuBLAS, and the CUDA toolkit of nvidia-cuda-nvcc) unpack. Without
# -DBENANZA_PYTHON the python3 on PATH is asked (an activated virtualenv's).
include_guard(GLOBAL)

set(BENANZA_PYTHON "" CACHE FILEPATH "Python whose site-packages hold the nvidia-* wheels")

function(benanza_python_site_dirs out)
  set(python "${BENANZA_PYTHON}")
  if(NOT python OR NOT EXISTS "${python}")
    find_program(BENANZA_PYTHON_ON_PATH NAMES python3 python)
    set(python "${BENANZA_PYTHON_ON_PATH}")
  endif()
  set(dirs "")
  if(python)
    execute_process(
      COMMAND "${python}" -c
              "import site, sysconfig; p = sysconfig.get_paths(); print(';'.join(dict.fromkeys([p['purelib'], p['platlib'], *site.getsitepackages(), site.getusersitepackages()])))"
      OUTPUT_VARIABLE dirs OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  endif()
  set(${out} "${dirs}" PARENT_SCOPE)
endfunction()
