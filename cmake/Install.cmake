# `cmake --install`: the static libraries, their headers, a CMake package (find_package(flashvk
# CONFIG) gives flashvk::flashvk, the engine, which brings its Vulkan dependency, and beside it
# flashvk::reference, flashvk::trace, flashvk::peak and, where built, flashvk::flex) and flashvk.pc for pkg-config; the
# flashvk command too when it is built.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS flashvk flashvk_reference flashvk_trace flashvk_peak EXPORT flashvkTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY ${flashvk_SOURCE_DIR}/engine/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(FLASHVK_FLEX)  # flashvk::flex, user-written attention: glslang's static libraries beside it
  install(TARGETS flashvk_flex EXPORT flashvkTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
  set_target_properties(flashvk_flex PROPERTIES EXPORT_NAME flex)
  # A glslang of the build's own (build/glslang15, FLASHVK_GLSLANG_ROOT), not the system's: its
  # prefix goes along, in lib/flashvk/glslang, where flashvkConfig.cmake finds it.
  if(FLASHVK_GLSLANG_BUNDLED)
    install(DIRECTORY ${FLASHVK_GLSLANG_PREFIX}/ USE_SOURCE_PERMISSIONS
            DESTINATION ${CMAKE_INSTALL_LIBDIR}/flashvk/glslang)
  endif()
endif()
if(FLASHVK_CLI)
  install(TARGETS flashvk_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

set(FLASHVK_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/flashvk)
# The exported names drop the prefix: flashvk::reference, flashvk::trace, flashvk::peak.
set_target_properties(flashvk_reference PROPERTIES EXPORT_NAME reference)
set_target_properties(flashvk_trace PROPERTIES EXPORT_NAME trace)
set_target_properties(flashvk_peak PROPERTIES EXPORT_NAME peak)
install(EXPORT flashvkTargets NAMESPACE flashvk:: DESTINATION ${FLASHVK_CMAKE_DIR})
configure_package_config_file(${flashvk_SOURCE_DIR}/cmake/flashvkConfig.cmake.in
                              ${flashvk_BINARY_DIR}/flashvkConfig.cmake
                              INSTALL_DESTINATION ${FLASHVK_CMAKE_DIR})
write_basic_package_version_file(${flashvk_BINARY_DIR}/flashvkConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${flashvk_BINARY_DIR}/flashvkConfig.cmake
              ${flashvk_BINARY_DIR}/flashvkConfigVersion.cmake
        DESTINATION ${FLASHVK_CMAKE_DIR})

# pkg-config: a static library, so its link line names what it needs (the Vulkan loader through
# vulkan.pc, and the C++ standard library the application's C++ compiler links anyway). The
# prefix is found from the .pc file's own place, so an install moved elsewhere
# (cmake --install --prefix, a copied tree) still works.
file(RELATIVE_PATH FLASHVK_PC_TO_PREFIX
     "${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "${CMAKE_INSTALL_PREFIX}")
configure_file(${flashvk_SOURCE_DIR}/cmake/flashvk.pc.in ${flashvk_BINARY_DIR}/flashvk.pc @ONLY)
install(FILES ${flashvk_BINARY_DIR}/flashvk.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
