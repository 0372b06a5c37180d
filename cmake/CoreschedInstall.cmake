# Installs the library, its headers, a CMake package (find_package(coresched)
# gives coresched::coresched) and a pkg-config file (pkg-config coresched).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(CORESCHED_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/coresched)

install(TARGETS coresched EXPORT coreschedTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/coresched DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.hpp")
install(FILES ${PROJECT_BINARY_DIR}/include/coresched/version.hpp
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/coresched)

# A static library carries its private dependencies into every link, so the
# package config finds them again (coreschedConfig.cmake.in).
install(EXPORT coreschedTargets NAMESPACE coresched:: DESTINATION ${CORESCHED_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/coreschedConfig.cmake.in
  ${PROJECT_BINARY_DIR}/coreschedConfig.cmake INSTALL_DESTINATION ${CORESCHED_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/coreschedConfigVersion.cmake
  COMPATIBILITY SameMinorVersion) # 0.x: a minor bump may break the API
install(FILES ${PROJECT_BINARY_DIR}/coreschedConfig.cmake ${PROJECT_BINARY_DIR}/coreschedConfigVersion.cmake
  DESTINATION ${CORESCHED_CMAKE_DIR})

# The prefix is found relative to the .pc file, so `cmake --install --prefix`
# anywhere gives a working file.
file(RELATIVE_PATH CORESCHED_PC_TO_PREFIX /${CMAKE_INSTALL_LIBDIR}/pkgconfig /)
configure_file(${PROJECT_SOURCE_DIR}/cmake/coresched.pc.in ${PROJECT_BINARY_DIR}/coresched.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/coresched.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# The gdb extension (`source <prefix>/share/coresched/gdb/coresched.py`; see the README).
install(FILES ${PROJECT_SOURCE_DIR}/tools/gdb/coresched.py ${PROJECT_SOURCE_DIR}/tools/gdb/coresched_gdb_snapshot.py DESTINATION ${CMAKE_INSTALL_DATADIR}/coresched/gdb)
