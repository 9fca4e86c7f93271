# The layering rule of src/ (see cmake/layers.cmake). Input:
#   MX2NV_LAYER_SPEC   "folder:dep,dep" entries, separated by ';' or '|'
#   MX2NV_SOURCE_ROOT  the src/ directory
# A library folder may include itself and the closure of its DEPS; the front
# ends may include every library folder (python never includes cli), each
# through its face header <folder>/<folder>.hpp. A folder
# must also use each of its DEPS: some file of it includes that folder, so the
# declared graph (the diagram of docs/architecture.md, drawn from it by
# scripts/layer_diagram.py) says what the code does. Fails with every
# violation listed.
string(REPLACE "|" ";" spec "${MX2NV_LAYER_SPEC}")
set(folders "")
foreach(entry IN LISTS spec)
  string(REPLACE ":" ";" parts "${entry}")
  list(GET parts 0 folder)
  list(LENGTH parts n)
  set(deps "")
  if(n GREATER 1)
    list(GET parts 1 deps)
    string(REPLACE "," ";" deps "${deps}")
  endif()
  set(direct_${folder} "${deps}")
  list(APPEND folders ${folder})
endforeach()

# Closure of each folder's DEPS (folders are listed lowest first, so a
# folder's dependencies already have theirs).
foreach(folder IN LISTS folders)
  set(closure "")
  foreach(dep IN LISTS direct_${folder})
    if(NOT DEFINED closure_${dep})
      message(FATAL_ERROR "layer ${folder} builds on ${dep}, which is not a layer defined before it")
    endif()
    list(APPEND closure ${dep} ${closure_${dep}})
  endforeach()
  list(REMOVE_DUPLICATES closure)
  set(closure_${folder} "${closure}")
endforeach()
set(closure_cli ${folders})
set(closure_python ${folders})
set(front_ends cli python)

set(violations "")
file(GLOB children RELATIVE ${MX2NV_SOURCE_ROOT} ${MX2NV_SOURCE_ROOT}/*)
foreach(folder IN LISTS children)
  if(NOT IS_DIRECTORY ${MX2NV_SOURCE_ROOT}/${folder})
    continue()
  endif()
  if(NOT DEFINED closure_${folder})
    list(APPEND violations "src/${folder}/ is neither a layer nor a front end")
    continue()
  endif()
  file(GLOB files ${MX2NV_SOURCE_ROOT}/${folder}/*.cpp ${MX2NV_SOURCE_ROOT}/${folder}/*.hpp)
  set(used_${folder} "")
  foreach(file IN LISTS files)
    file(STRINGS ${file} includes REGEX "^#include \"[a-z_]+/")
    foreach(line IN LISTS includes)
      string(REGEX REPLACE "^#include \"([a-z_]+)/.*" "\\1" used "${line}")
      list(APPEND used_${folder} ${used})
      if(NOT used STREQUAL folder AND NOT used IN_LIST closure_${folder})
        file(RELATIVE_PATH shown ${MX2NV_SOURCE_ROOT}/.. ${file})
        list(APPEND violations "${shown}: ${line} (src/${folder} builds on: ${direct_${folder}})")
      endif()
      # A front end sees each library through its face, <folder>/<folder>.hpp
      # (common/ is the vocabulary every layer shares).
      if(folder IN_LIST front_ends AND NOT used STREQUAL folder AND NOT used STREQUAL "common"
         AND NOT line MATCHES "^#include \"${used}/${used}\\.hpp\"")
        file(RELATIVE_PATH shown ${MX2NV_SOURCE_ROOT}/.. ${file})
        list(APPEND violations "${shown}: ${line} (a front end includes src/${used}/${used}.hpp only)")
      endif()
    endforeach()
  endforeach()
  foreach(dep IN LISTS direct_${folder})
    if(NOT dep IN_LIST used_${folder})
      list(APPEND violations "src/${folder}/ declares DEPS ${dep} and includes nothing of src/${dep}/")
    endif()
  endforeach()
endforeach()
if(violations)
  list(JOIN violations "\n  " text)
  message(FATAL_ERROR "src/ layering violated:\n  ${text}")
endif()
