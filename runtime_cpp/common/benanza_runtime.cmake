# include() this from a generated backend project: defines the static library
# `benanza_runtime` (the line protocol, registration, status conventions) over Google Benchmark.
find_package(benchmark REQUIRED)
add_library(benanza_runtime STATIC ${CMAKE_CURRENT_LIST_DIR}/benanza/runtime.cpp)
target_include_directories(benanza_runtime PUBLIC ${CMAKE_CURRENT_LIST_DIR})
target_compile_features(benanza_runtime PUBLIC cxx_std_17)
target_link_libraries(benanza_runtime PUBLIC benchmark::benchmark)
