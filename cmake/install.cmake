# SPDX-License-Identifier: Apache-2.0
# The installable C++ library: libfastpersist.so, the public headers and a CMake package, so a
# consumer writes
#
#   find_package(fastpersist CONFIG REQUIRED)
#   target_link_libraries(app PRIVATE fastpersist::fastpersist)
#
# Why one shared library (docs/design.md, "Installing the C++ library"): the layers' static
# libraries are an internal split; installing them would make every consumer re-find liburing,
# libaio, xxHash and the dl library to link statically. libfastpersist.so is built from the
# layers' object files and links those third-party libraries PRIVATE (they are needed only at
# run time, as DT_NEEDED entries), and the public headers include nothing but the standard
# library, so the package's only dependency is Threads.
#
# The Python wheel does not use any of this: scikit-build-core builds with SKBUILD set, where
# FASTPERSIST_INSTALL defaults to OFF, and installs only the component "python" anyway.

include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(fastpersist_layer_objects "")
foreach(layer ${FASTPERSIST_LAYERS})  # src/CMakeLists.txt
  list(APPEND fastpersist_layer_objects "$<TARGET_OBJECTS:fastpersist_${layer}>")
endforeach()

add_library(fastpersist_shared SHARED ${fastpersist_layer_objects})
add_library(fastpersist::fastpersist ALIAS fastpersist_shared)
# The static layers come after their own objects on the link line: every symbol is already
# defined, so no archive member is pulled in twice; what they add is their third-party link
# dependencies (liburing, libaio, xxHash, dl), which stay PRIVATE to the shared library.
target_link_libraries(fastpersist_shared PRIVATE fastpersist PUBLIC Threads::Threads)
target_include_directories(fastpersist_shared PUBLIC
  "$<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>"
  "$<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>")
target_compile_features(fastpersist_shared PUBLIC cxx_std_20)
# Only fastpersist's own symbols are exported (see the map file for why).
set(fastpersist_symbol_map "${CMAKE_CURRENT_LIST_DIR}/libfastpersist.map")
target_link_options(fastpersist_shared PRIVATE "LINKER:--version-script=${fastpersist_symbol_map}")
set_property(TARGET fastpersist_shared APPEND PROPERTY LINK_DEPENDS "${fastpersist_symbol_map}")
# 0.x releases may change the ABI with each minor version, so the soname carries it:
# libfastpersist.so.0.1 (-> libfastpersist.so.0.1.0). Its dependencies are system libraries,
# so neither the build tree nor the install needs an RPATH in the library itself.
set_target_properties(fastpersist_shared PROPERTIES
  OUTPUT_NAME fastpersist
  EXPORT_NAME fastpersist
  VERSION "${PROJECT_VERSION}"
  SOVERSION "${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR}")

set(fastpersist_package_dir "${CMAKE_INSTALL_LIBDIR}/cmake/fastpersist")

install(TARGETS fastpersist_shared EXPORT fastpersistTargets
  LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}" COMPONENT library
          NAMELINK_COMPONENT library)
# Public headers only: include/fastpersist/*.h. Nothing under src/ is installed.
install(DIRECTORY "${PROJECT_SOURCE_DIR}/include/fastpersist"
  DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}" COMPONENT library
  FILES_MATCHING PATTERN "*.h")
install(EXPORT fastpersistTargets NAMESPACE fastpersist::
  DESTINATION "${fastpersist_package_dir}" COMPONENT library)

configure_package_config_file("${CMAKE_CURRENT_LIST_DIR}/fastpersistConfig.cmake.in"
  "${PROJECT_BINARY_DIR}/package/fastpersistConfig.cmake"
  INSTALL_DESTINATION "${fastpersist_package_dir}")
# 0.x: only the same minor version is compatible (see SOVERSION above).
write_basic_package_version_file("${PROJECT_BINARY_DIR}/package/fastpersistConfigVersion.cmake"
  VERSION "${PROJECT_VERSION}" COMPATIBILITY SameMinorVersion)
install(FILES "${PROJECT_BINARY_DIR}/package/fastpersistConfig.cmake"
              "${PROJECT_BINARY_DIR}/package/fastpersistConfigVersion.cmake"
  DESTINATION "${fastpersist_package_dir}" COMPONENT library)
