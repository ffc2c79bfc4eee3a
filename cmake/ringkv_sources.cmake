# One named module per file (modules/), implementation units and Highway kernels (src/).
set(RINGKV_MODULES
  modules/ringkv.cppm
  modules/trace.cppm
  modules/tensor.cppm
  modules/window.cppm
  modules/generator.cppm
  modules/store.cppm
  modules/kernels.cppm
  modules/attention.cppm
  modules/decode.cppm
  modules/quant.cppm
)
set(RINGKV_SOURCES
  src/trace.cpp
  src/tensor.cpp
  src/window.cpp
  src/store.cpp
  src/store_slotted.cpp
  src/store_default.cpp
  src/simd.cpp
  src/kernels.cpp
  src/attention.cpp
  src/decode.cpp
  src/quant_codebook.cpp
  src/quant_rotation.cpp
  src/quant_window.cpp
  src/quant_turbo.cpp
  src/quant_int8.cpp
)
# The quantizers' inner loops (rotations, codebook search, QJL projections) are optimised in
# every configuration: at -O0 the tests' 10^4-vector distortion checks would dominate the suite.
set(RINGKV_OPTIMISED_SOURCES
  src/quant_codebook.cpp
  src/quant_rotation.cpp
  src/quant_window.cpp
  src/quant_turbo.cpp
)
