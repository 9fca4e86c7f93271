# One static library per folder of src/ (mx2nv_<folder>), and the rule that
# keeps them layered: a folder includes only itself and the folders it builds
# on (DEPS, transitively). The front ends (src/cli, src/python) sit on top.

set_property(GLOBAL PROPERTY MX2NV_LAYER_SPEC "")

# mx2nv_layer(NAME DEPS folder... SOURCES file.cpp...): sources are relative
# to src/NAME, and every .cpp there must be listed.
function(mx2nv_layer name)
  cmake_parse_arguments(PARSE_ARGV 1 ARG "" "" "DEPS;SOURCES")
  set(sources "")
  foreach(file IN LISTS ARG_SOURCES)
    list(APPEND sources ${CMAKE_CURRENT_SOURCE_DIR}/src/${name}/${file})
  endforeach()
  file(GLOB present RELATIVE ${CMAKE_CURRENT_SOURCE_DIR}/src/${name} ${CMAKE_CURRENT_SOURCE_DIR}/src/${name}/*.cpp)
  foreach(file IN LISTS present)
    if(NOT file IN_LIST ARG_SOURCES)
      message(FATAL_ERROR "src/${name}/${file} is not listed in mx2nv_layer(${name})")
    endif()
  endforeach()
  add_library(mx2nv_${name} STATIC ${sources})
  target_include_directories(mx2nv_${name} PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/src)
  target_compile_options(mx2nv_${name} PRIVATE ${MX2NV_WARNINGS})
  if(MX2NV_PYTHON)
    target_compile_definitions(mx2nv_${name} PRIVATE XXH_INLINE_ALL)
  endif()
  foreach(dep IN LISTS ARG_DEPS)
    target_link_libraries(mx2nv_${name} PUBLIC mx2nv_${dep})
  endforeach()
  string(REPLACE ";" "," deps "${ARG_DEPS}")
  set_property(GLOBAL APPEND PROPERTY MX2NV_LAYER_SPEC "${name}:${deps}")
endfunction()

# Checks the layering now (configure fails on a violation) and registers the
# same check as a test, so a change is caught by the build and by ctest.
function(mx2nv_check_layers)
  get_property(spec GLOBAL PROPERTY MX2NV_LAYER_SPEC)
  set(MX2NV_LAYER_SPEC "${spec}")
  set(MX2NV_SOURCE_ROOT ${CMAKE_CURRENT_SOURCE_DIR}/src)
  include(${CMAKE_CURRENT_SOURCE_DIR}/cmake/check_layers.cmake)
  string(REPLACE ";" "|" spec_arg "${spec}")
  set_property(GLOBAL PROPERTY MX2NV_LAYER_TEST_ARGS
               -DMX2NV_LAYER_SPEC=${spec_arg} -DMX2NV_SOURCE_ROOT=${CMAKE_CURRENT_SOURCE_DIR}/src
               -P ${CMAKE_CURRENT_SOURCE_DIR}/cmake/check_layers.cmake)
endfunction()
