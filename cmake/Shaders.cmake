# Compiles each GLSL compute shader at build time into SPIR-V embedded as a C++ array.
# A shader may be compiled several times with different -D defines (fp16 storage, tracing);
# each build gets its own name and array (shaders/builds.def lists them all).

set(FLASHVK_SHADER_DIR ${flashvk_SOURCE_DIR}/shaders)
set(FLASHVK_SHADER_OUT ${flashvk_BINARY_DIR}/generated/shaders)
file(MAKE_DIRECTORY ${FLASHVK_SHADER_OUT})  # glslangValidator exits 0 even when it cannot write

# flashvk_add_shader(<list-var> <file.comp> <name> [DEFINES...])
function(flashvk_add_shader out_list file name)
  set(header ${FLASHVK_SHADER_OUT}/${name}.h)
  set(defines)
  foreach(def ${ARGN})
    list(APPEND defines -D${def})
  endforeach()
  # Vulkan 1.1 (SPIR-V 1.3), but 1.3 (SPIR-V 1.6) for NVIDIA's second cooperative-matrix
  # extension, which glslang takes only there (engine/src/flex.cpp chooses alike).
  set(env vulkan1.1)
  if("CM_NV2" IN_LIST ARGN)
    set(env vulkan1.3)
  endif()
  add_custom_command(
    OUTPUT ${header}
    COMMAND ${FLASHVK_GLSLANG_VALIDATOR} -V --target-env ${env} ${defines} --vn ${name}
            --depfile ${header}.d -o ${header} ${FLASHVK_SHADER_DIR}/${file}
    DEPENDS ${FLASHVK_SHADER_DIR}/${file} ${FLASHVK_GLSLANG_VALIDATOR}  # another glslang: again
    DEPFILE ${header}.d
    COMMENT "glslang ${file} -> ${name}"
    VERBATIM)
  set(${out_list} ${${out_list}} ${header} PARENT_SCOPE)
endfunction()

# flashvk_add_builds(<table>): every build of shaders/builds.def (see its header): a line's
# options expanded into one build per combination, each named as engine/src/kernels.cpp names it,
# its header added to FLASHVK_SHADERS_<library> in the caller's scope (engine, trace or peak).
function(flashvk_add_builds table)
  file(STRINGS ${table} lines REGEX "^KERNEL\\(")
  set(option_order Q KVQ TRACE SG F16 QUANT MAT MATHW)
  # Per option, its two values: a name part and a define ("-" for none).
  set(Q_values "_f32:-" "_f16:FP16")
  set(KVQ_values ":-" "_kvq:KV_QUANT")
  set(TRACE_values ":-" "_trace:TRACE")
  set(SG_values "_nosg:-" "_sg:BLOCK_SHUFFLE")
  set(F16_values ":-" "_f16math:BLOCK_F16")
  set(QUANT_values ":-" "_quant:QUANT_OUT")
  set(MAT_values "_khr:CM_KHR" "_nv:CM_NV" "_nv2:CM_NV2" "_emu:CM_EMULATE"
                 "_emunv2:CM_EMULATE_NV2")
  set(MATHW_values "_khr:CM_KHR" "_nv:CM_NV")
  set(FLASHVK_SHADERS_engine)
  set(FLASHVK_SHADERS_trace)
  set(FLASHVK_SHADERS_peak)
  foreach(line ${lines})
    if(NOT line MATCHES "^KERNEL\\( *([a-z0-9_]+), *([a-z0-9_.]+), *([a-z_]+), *([A-Z0-9_| ]+), *([A-Z0-9_ ]+), *([a-z]+)\\)")
      message(FATAL_ERROR "builds.def: cannot read '${line}'")
    endif()
    set(program ${CMAKE_MATCH_1})
    set(source ${CMAKE_MATCH_2})
    set(layout ${CMAKE_MATCH_3})
    string(REPLACE " " "" options "${CMAKE_MATCH_4}")
    string(REPLACE "|" ";" options "${options}")
    string(STRIP "${CMAKE_MATCH_5}" base)
    string(REPLACE " " ";" base "${base}")
    list(REMOVE_ITEM base NONE)
    set(library ${CMAKE_MATCH_6})
    set(prefix ${program})
    if(NOT layout STREQUAL "shared")
      string(APPEND prefix _${layout})
    endif()
    # Builds as "name_suffix|DEF1;DEF2" pairs, grown one option at a time.
    set(builds "${prefix}|")
    foreach(option ${option_order})
      if(NOT option IN_LIST options)
        continue()
      endif()
      set(grown)
      foreach(build ${builds})
        string(REPLACE "|" ";" parts "${build}")
        list(GET parts 0 name)
        string(FIND "${build}" "|" bar)
        math(EXPR after "${bar} + 1")
        string(SUBSTRING "${build}" ${after} -1 defs)
        foreach(value ${${option}_values})
          string(REPLACE ":" ";" pair "${value}")
          list(GET pair 0 part)
          list(GET pair 1 def)
          set(new_defs "${defs}")
          if(NOT def STREQUAL "-")
            set(new_defs "${defs},${def}")
          endif()
          list(APPEND grown "${name}${part}|${new_defs}")
        endforeach()
      endforeach()
      set(builds ${grown})
    endforeach()
    foreach(build ${builds})
      string(FIND "${build}" "|" bar)
      string(SUBSTRING "${build}" 0 ${bar} name)
      math(EXPR after "${bar} + 1")
      string(SUBSTRING "${build}" ${after} -1 defs)
      string(REPLACE "," ";" defs "${defs}")
      list(REMOVE_ITEM defs "")
      set(into ${library})
      if("TRACE" IN_LIST defs)
        set(into trace)
      endif()
      flashvk_add_shader(FLASHVK_SHADERS_${into} ${source} ${name} ${base} ${defs})
      set_property(GLOBAL APPEND PROPERTY FLASHVK_SHADER_NAMES_${into} ${name})
      # For flashvk::flex, which compiles the same builds at run time with user functions.
      set(all_defs ${base} ${defs})
      string(REPLACE ";" " " all_defs "${all_defs}")
      set_property(GLOBAL APPEND PROPERTY FLASHVK_BUILD_TABLE "${name}|${source}|${all_defs}")
    endforeach()
  endforeach()
  foreach(library engine trace peak)
    set(FLASHVK_SHADERS_${library} ${FLASHVK_SHADERS_${library}} PARENT_SCOPE)
  endforeach()
endfunction()

# flashvk_write_registry(<library> <out.cpp> <function>): a table from build name to the
# embedded words of the builds of <library> (flashvk_add_builds), returned by
# flashvk::detail::<function>() (engine/src/shader_registry.hpp).
function(flashvk_write_registry library out_cpp function)
  get_property(names GLOBAL PROPERTY FLASHVK_SHADER_NAMES_${library})
  set(body "// Generated by cmake/Shaders.cmake from shaders/builds.def. Do not edit.\n#include <cstdint>\n#include \"shader_registry.hpp\"\n")
  foreach(n ${names})
    string(APPEND body "#include \"shaders/${n}.h\"\n")
  endforeach()
  string(APPEND body "namespace flashvk::detail {\nconst std::vector<ShaderBlob>& ${function}() {\n  static const std::vector<ShaderBlob> blobs = {\n")
  foreach(n ${names})
    string(APPEND body "      {\"${n}\", ${n}, sizeof(${n})},\n")
  endforeach()
  string(APPEND body "  };\n  return blobs;\n}\n}  // namespace flashvk::detail\n")
  file(GENERATE OUTPUT ${out_cpp} CONTENT "${body}")
endfunction()

# flashvk_write_flex_sources(<out.cpp>): what flashvk::flex compiles at run time (engine/src/
# flex.cpp): the text of every shader source and include, and every build of shaders/builds.def
# with its source and defines (flashvk_add_builds), as tables returned by flex_sources() and
# flex_builds().
function(flashvk_write_flex_sources out_cpp)
  file(GLOB files ${FLASHVK_SHADER_DIR}/*.comp ${FLASHVK_SHADER_DIR}/*.glsl)
  set(body "// Generated by cmake/Shaders.cmake from shaders/. Do not edit.\n#include \"flex_tables.hpp\"\nnamespace flashvk::detail {\nconst std::vector<FlexSource>& flex_sources() {\n  static const std::vector<FlexSource> sources = {\n")
  foreach(f ${files})
    get_filename_component(n ${f} NAME)
    file(READ ${f} text)
    string(APPEND body "      {\"${n}\", R\"flexsrc(${text})flexsrc\"},\n")
    set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${f})
  endforeach()
  string(APPEND body "  };\n  return sources;\n}\nconst std::vector<FlexBuild>& flex_builds() {\n  static const std::vector<FlexBuild> builds = {\n")
  get_property(table GLOBAL PROPERTY FLASHVK_BUILD_TABLE)
  foreach(entry ${table})
    string(REPLACE "|" ";" parts "${entry}")
    list(GET parts 0 name)
    list(GET parts 1 source)
    list(LENGTH parts count)
    set(defs "")
    if(count GREATER 2)
      list(GET parts 2 defs)
    endif()
    string(APPEND body "      {\"${name}\", \"${source}\", \"${defs}\"},\n")
  endforeach()
  string(APPEND body "  };\n  return builds;\n}\n}  // namespace flashvk::detail\n")
  file(GENERATE OUTPUT ${out_cpp} CONTENT "${body}")
endfunction()
