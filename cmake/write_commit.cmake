# Writes commit.hpp with the source tree's current commit, at build time (not configure time, so
# bench JSON names the commit that was built). Rewrites the file only when the commit changed.
execute_process(COMMAND git -C ${SOURCE_DIR} rev-parse --short HEAD
                OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT commit)
  set(commit unknown)
endif()
set(text "#pragma once\n#define FLASHVK_COMMIT \"${commit}\"\n")
if(EXISTS ${OUT})
  file(READ ${OUT} old)
endif()
if(NOT "${old}" STREQUAL "${text}")
  file(WRITE ${OUT} "${text}")
endif()
