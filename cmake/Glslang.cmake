# The shader compiler and the Vulkan headers the kernels need: glslang 15 or later
# (GL_KHR_cooperative_matrix, GL_NV_cooperative_matrix2) and Vulkan headers 1.4.
#
# One glslang serves both the SPIR-V embedded at build time (FLASHVK_GLSLANG_VALIDATOR, cmake/
# Shaders.cmake) and flashvk::flex's run-time compiler (the glslang:: targets, where its
# libraries are there). Taken from, in this order: FLASHVK_GLSLANG_ROOT where it is set (a prefix
# with bin/glslangValidator and lib/cmake/glslang), the system's where its glslangValidator is 15
# or later (the Vulkan SDK's is fine), or build/glslang15, which scripts/setup.sh builds from
# Debian trixie's source where the system's is older (Debian 12 has 12.0).
#
# Vulkan headers: the system's where they are 1.4 or later, else FLASHVK_VULKAN_HEADERS (default
# build/vulkan-headers/include, unpacked by scripts/setup.sh), put before the system's on the
# targets that link the engine within this build (FLASHVK_VULKAN_INCLUDE; an installed flashvk's
# public headers compile against the application's own).
#
# Sets FLASHVK_GLSLANG_VALIDATOR, FLASHVK_GLSLANG_PREFIX (empty: the system's glslang),
# FLASHVK_GLSLANG_BUNDLED (ON where it is build/glslang15: installed beside flashvk for
# flashvk::flex's users, cmake/Install.cmake),
# FLASHVK_GLSLANG_KHR_COOPMAT (1 where glslang compiles GL_KHR_cooperative_matrix) and
# FLASHVK_VULKAN_INCLUDE (empty: the system's headers).

set(FLASHVK_GLSLANG_ROOT "" CACHE PATH
    "a glslang 15 or later installed there, used before the system's (empty: the system's when 15 or later, else build/glslang15 from scripts/setup.sh)")
set(FLASHVK_VULKAN_HEADERS "${flashvk_SOURCE_DIR}/build/vulkan-headers/include" CACHE PATH
    "Vulkan headers 1.4 or later (the folder with vulkan/vulkan_core.h), used where the system's are older")
set(FLASHVK_GLSLANG_MIN 15)

# flashvk_glslang_major(<glslangValidator> <out>): its major version, 0 where it does not run.
function(flashvk_glslang_major exe out)
  set(major 0)
  if(exe AND EXISTS "${exe}")
    execute_process(COMMAND "${exe}" --version OUTPUT_VARIABLE text ERROR_QUIET
                    RESULT_VARIABLE failed)
    if(NOT failed AND text MATCHES "Glslang Version: [0-9]+:([0-9]+)\\.")
      set(major ${CMAKE_MATCH_1})
    endif()
  endif()
  set(${out} ${major} PARENT_SCOPE)
endfunction()

# The glslang to use: a prefix (FLASHVK_GLSLANG_ROOT or build/glslang15) or the system's.
unset(FLASHVK_GLSLANG_VALIDATOR CACHE)  # an older configure's find_program
set(_flashvk_glslang_root "")
find_program(_flashvk_system_glslang glslangValidator NO_CACHE)
flashvk_glslang_major("${_flashvk_system_glslang}" _flashvk_system_major)
set(_flashvk_own_glslang "${flashvk_SOURCE_DIR}/build/glslang15")
if(FLASHVK_GLSLANG_ROOT)
  set(_flashvk_glslang_root "${FLASHVK_GLSLANG_ROOT}")
elseif(_flashvk_system_major LESS FLASHVK_GLSLANG_MIN)
  set(_flashvk_glslang_root "${_flashvk_own_glslang}")
endif()
# Only setup.sh's glslang goes along with an installed flashvk (a prefix given by the user may
# be a whole SDK): the installed package looks for another one where it was.
set(FLASHVK_GLSLANG_BUNDLED OFF)
set(FLASHVK_GLSLANG_PREFIX "${_flashvk_glslang_root}")
if(_flashvk_glslang_root)
  set(FLASHVK_GLSLANG_VALIDATOR "${_flashvk_glslang_root}/bin/glslangValidator")
  if(_flashvk_glslang_root STREQUAL _flashvk_own_glslang)
    set(FLASHVK_GLSLANG_BUNDLED ON)
  endif()
else()
  set(FLASHVK_GLSLANG_VALIDATOR "${_flashvk_system_glslang}")
endif()
flashvk_glslang_major("${FLASHVK_GLSLANG_VALIDATOR}" _flashvk_major)
if(_flashvk_major LESS FLASHVK_GLSLANG_MIN)
  if(_flashvk_system_glslang)
    set(_flashvk_found "the system's is ${_flashvk_system_major} (${_flashvk_system_glslang})")
  else()
    set(_flashvk_found "the system has none")
  endif()
  message(FATAL_ERROR "flashvk needs glslang ${FLASHVK_GLSLANG_MIN} or later and ${_flashvk_found}, "
          "nor is there one in ${_flashvk_glslang_root}: run scripts/setup.sh (on Debian 12 it "
          "builds one into build/glslang15), install glslang ${FLASHVK_GLSLANG_MIN} or later (the "
          "Vulkan SDK's is fine), or set FLASHVK_GLSLANG_ROOT to the prefix of one")
endif()
message(STATUS "flashvk: glslang ${_flashvk_major} (${FLASHVK_GLSLANG_VALIDATOR})")

# Its libraries, for flashvk::flex: found in the same prefix (glslang_DIR is set rather than
# searched, so that a build folder configured before keeps no older glslang), or the system's,
# of the same major version.
find_package(Threads)  # glslang's targets name Threads::Threads
if(_flashvk_glslang_root)
  set(glslang_DIR "${_flashvk_glslang_root}/lib/cmake/glslang" CACHE PATH "" FORCE)
elseif(glslang_DIR)
  string(FIND "${glslang_DIR}" "${_flashvk_own_glslang}/" _flashvk_at)
  if(_flashvk_at EQUAL 0)  # set so by an earlier configure: the system's now
    unset(glslang_DIR CACHE)
  endif()
endif()
find_package(glslang ${_flashvk_major} CONFIG QUIET)

# Whether it compiles GL_KHR_cooperative_matrix (glslang 14 and later), as the kernels will.
set(_flashvk_probe ${flashvk_BINARY_DIR}/glslang_probe)
file(WRITE ${_flashvk_probe}/khr_coopmat.comp [=[
#version 450
#pragma use_vulkan_memory_model
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
layout(local_size_x = 32) in;
layout(std430, binding = 0) buffer Out { float16_t o[]; };
void main() {
  coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> a =
      coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>(1.0);
  coopMatStore(a, o, 0, 16, gl_CooperativeMatrixLayoutRowMajor);
}
]=])
execute_process(COMMAND "${FLASHVK_GLSLANG_VALIDATOR}" -V --target-env vulkan1.1
                        -o ${_flashvk_probe}/khr_coopmat.spv ${_flashvk_probe}/khr_coopmat.comp
                RESULT_VARIABLE _flashvk_failed OUTPUT_QUIET ERROR_QUIET)
if(_flashvk_failed)
  set(FLASHVK_GLSLANG_KHR_COOPMAT 0)
else()
  set(FLASHVK_GLSLANG_KHR_COOPMAT 1)
endif()

# The Vulkan headers: the system's version from vulkan_core.h (FindVulkan gives it only from
# CMake 3.23 on).
# flashvk_vulkan_headers_version(<include dir> <out>): "1.3.239", or "0" where there are none.
function(flashvk_vulkan_headers_version dir out)
  set(version 0)
  if(EXISTS "${dir}/vulkan/vulkan_core.h")
    file(STRINGS "${dir}/vulkan/vulkan_core.h" lines
         REGEX "^#define VK_HEADER_VERSION(_COMPLETE)? ")
    if(lines MATCHES "VK_HEADER_VERSION ([0-9]+)" )
      set(patch ${CMAKE_MATCH_1})
      if(lines MATCHES "VK_MAKE_API_VERSION\\(0, *([0-9]+), *([0-9]+),")
        set(version "${CMAKE_MATCH_1}.${CMAKE_MATCH_2}.${patch}")
      endif()
    endif()
  endif()
  set(${out} ${version} PARENT_SCOPE)
endfunction()
flashvk_vulkan_headers_version("${Vulkan_INCLUDE_DIR}" _flashvk_vk_system)
set(FLASHVK_VULKAN_INCLUDE "")
if(_flashvk_vk_system VERSION_LESS 1.4)
  flashvk_vulkan_headers_version("${FLASHVK_VULKAN_HEADERS}" _flashvk_vk)
  if(_flashvk_vk VERSION_LESS 1.4)
    message(FATAL_ERROR "flashvk needs Vulkan headers 1.4 or later; the system's are "
            "${_flashvk_vk_system} (${Vulkan_INCLUDE_DIR}) and FLASHVK_VULKAN_HEADERS "
            "(${FLASHVK_VULKAN_HEADERS}) has none: run scripts/setup.sh (on Debian 12 it unpacks "
            "them into build/vulkan-headers), install Vulkan headers 1.4 or later (the Vulkan "
            "SDK's are fine), or set FLASHVK_VULKAN_HEADERS to their include folder")
  endif()
  set(FLASHVK_VULKAN_INCLUDE "${FLASHVK_VULKAN_HEADERS}")
  message(STATUS "flashvk: Vulkan headers ${_flashvk_vk} (${FLASHVK_VULKAN_INCLUDE})")
endif()
