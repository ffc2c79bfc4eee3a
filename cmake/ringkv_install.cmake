include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS ringkv EXPORT ringkvTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  FILE_SET CXX_MODULES DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ringkv/modules)
install(EXPORT ringkvTargets
  NAMESPACE ringkv::
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ringkv
  CXX_MODULES_DIRECTORY modules)

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/ringkvConfig.cmake.in
  ${PROJECT_BINARY_DIR}/ringkvConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ringkv)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/ringkvConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/ringkvConfig.cmake ${PROJECT_BINARY_DIR}/ringkvConfigVersion.cmake
  ${PROJECT_SOURCE_DIR}/cmake/ringkv_xxhash.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ringkv)
