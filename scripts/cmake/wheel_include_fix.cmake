# The ROS 2 wheels' exported CMake targets name the include directories of the machine that built them
# (/opt/python/cp3XX-cp3XX/...); CMake refuses imported targets whose include directories do not exist.
# This points them at this machine's Python / numpy headers (LOCAL_PYTHON_INCLUDE, LOCAL_NUMPY_INCLUDE).
#
# Two ways in: include() it after the find_package() calls of a CMakeLists.txt (scripts/build_interfaces.sh),
# or pass -DCMAKE_PROJECT_INCLUDE=<this file> to build an unmodified upstream package: then the rewrite is
# deferred to the end of the top-level CMakeLists.txt, after its find_package() calls.
function(livox_infer_fix_wheel_includes)
  get_property(_imported DIRECTORY "${CMAKE_SOURCE_DIR}" PROPERTY IMPORTED_TARGETS)
  foreach(_target IN LISTS _imported)
    get_target_property(_dirs ${_target} INTERFACE_INCLUDE_DIRECTORIES)
    if(_dirs AND "${_dirs}" MATCHES "/opt/python/")
      string(REGEX REPLACE "/opt/python/[^/;]+/include/python[0-9.]+" "${LOCAL_PYTHON_INCLUDE}" _dirs "${_dirs}")
      string(REGEX REPLACE "/opt/python/[^;]+/numpy/_?core/include" "${LOCAL_NUMPY_INCLUDE}" _dirs "${_dirs}")
      set_target_properties(${_target} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${_dirs}")
    endif()
  endforeach()
endfunction()

if(CMAKE_PROJECT_INCLUDE STREQUAL CMAKE_CURRENT_LIST_FILE)
  cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL livox_infer_fix_wheel_includes)
else()
  livox_infer_fix_wheel_includes()
endif()
