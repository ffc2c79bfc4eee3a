# One named module per file (modules/), implementation units and Highway kernels (src/).
set(RINGKV_MODULES
  modules/ringkv.cppm
  modules/trace.cppm
  modules/tensor.cppm
  modules/window.cppm
  modules/generator.cppm
  modules/store.cppm
)
set(RINGKV_SOURCES
  src/trace.cpp
  src/tensor.cpp
  src/window.cpp
  src/store.cpp
  src/store_default.cpp
)
