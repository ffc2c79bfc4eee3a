# xxHash (Debian: libxxhash-dev) as the imported target ringkv::xxhash: the snapshot checksum.
# Used by the build and by the installed package config: ringkv is a static library, so its
# PRIVATE dependency still reaches a consumer's link line. pkg-config first, else a plain search.
if(NOT TARGET ringkv::xxhash)
  find_package(PkgConfig QUIET)
  if(PKG_CONFIG_FOUND)
    pkg_check_modules(RINGKV_XXHASH QUIET IMPORTED_TARGET GLOBAL libxxhash)
  endif()
  if(TARGET PkgConfig::RINGKV_XXHASH)
    add_library(ringkv::xxhash INTERFACE IMPORTED GLOBAL)
    target_link_libraries(ringkv::xxhash INTERFACE PkgConfig::RINGKV_XXHASH)
  else()
    find_path(RINGKV_XXHASH_INCLUDE_DIR xxhash.h)
    find_library(RINGKV_XXHASH_LIBRARY NAMES xxhash)
    if(NOT RINGKV_XXHASH_INCLUDE_DIR OR NOT RINGKV_XXHASH_LIBRARY)
      message(FATAL_ERROR "ringkv needs xxHash (Debian/Ubuntu: libxxhash-dev; scripts/bootstrap "
                          "installs it): xxhash.h or libxxhash not found")
    endif()
    add_library(ringkv::xxhash UNKNOWN IMPORTED GLOBAL)
    set_target_properties(ringkv::xxhash PROPERTIES
      IMPORTED_LOCATION "${RINGKV_XXHASH_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${RINGKV_XXHASH_INCLUDE_DIR}")
  endif()
endif()
