# One named module per file (modules/), implementation units and Highway kernels (src/).
set(RINGKV_MODULES
  modules/ringkv.cppm
  modules/trace.cppm
  modules/tensor.cppm
  modules/window.cppm
  modules/kernels.cppm
  modules/attention.cppm
)
set(RINGKV_SOURCES
  src/trace.cpp
  src/tensor.cpp
  src/window.cpp
  src/simd.cpp
  src/kernels.cpp
  src/attention.cpp
)
