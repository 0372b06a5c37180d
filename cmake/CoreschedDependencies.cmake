# Dependencies, all from Debian packages. hwloc and liburing ship no CMake
# package, so they come through pkg-config as imported targets.
find_package(PkgConfig REQUIRED)
pkg_check_modules(HWLOC REQUIRED IMPORTED_TARGET hwloc)
pkg_check_modules(LIBURING REQUIRED IMPORTED_TARGET liburing)
# elfutils: names the frames of a parked fiber in Runtime::dump.
pkg_check_modules(LIBDW REQUIRED IMPORTED_TARGET libdw)
find_package(Boost 1.74 REQUIRED COMPONENTS context)
find_package(spdlog REQUIRED)
find_package(fmt REQUIRED)
find_package(Threads REQUIRED)
