# Writes commit.hpp with the source tree's current commit, at build time (not configure time, so
# bench JSON names the commit that was built), with "-dirty" when tracked files differ from it (a
# build of uncommitted changes must not pass for the commit). Rewrites the file only when the
# text changed.
execute_process(COMMAND git -C ${SOURCE_DIR} rev-parse --short HEAD
                OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT commit)
  set(commit unknown)
else()
  execute_process(COMMAND git -C ${SOURCE_DIR} status --porcelain --untracked-files=no
                  OUTPUT_VARIABLE changes OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(changes)
    set(commit "${commit}-dirty")
  endif()
endif()
set(text "#pragma once\n#define FLASHVK_COMMIT \"${commit}\"\n")
if(EXISTS ${OUT})
  file(READ ${OUT} old)
endif()
if(NOT "${old}" STREQUAL "${text}")
  file(WRITE ${OUT} "${text}")
endif()
