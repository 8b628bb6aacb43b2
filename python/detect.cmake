# python/detect.cmake: finds what the Python bindings need (included by the root CMakeLists.txt).
# Sets PAGEDKV_PYTHON_FOUND and PAGEDKV_PYTHON_MISSING (a reason when not found).
#
# The bindings are built for the interpreter that will import them, which must have numpy. The
# first python3 on PATH may be a pyenv or virtualenv interpreter without it, while Debian's
# python3-numpy, python3-pytest and python3-pybind11 belong to /usr/bin/python3: unless
# Python3_EXECUTABLE is given, take the first python3 on PATH (then /usr/bin/python3) that imports
# numpy.
set(PAGEDKV_PYTHON_FOUND OFF)
set(PAGEDKV_PYTHON_MISSING "")
if(NOT DEFINED Python3_EXECUTABLE)
  string(REPLACE ":" ";" _pagedkv_path_dirs "$ENV{PATH}")
  list(APPEND _pagedkv_path_dirs /usr/bin)
  foreach(_dir IN LISTS _pagedkv_path_dirs)
    if(EXISTS "${_dir}/python3")
      execute_process(COMMAND "${_dir}/python3" -c "import numpy"
                      RESULT_VARIABLE _rc OUTPUT_QUIET ERROR_QUIET)
      if(_rc EQUAL 0)
        set(Python3_EXECUTABLE "${_dir}/python3" CACHE FILEPATH "Python 3 interpreter")
        break()
      endif()
    endif()
  endforeach()
endif()
find_package(Python3 3.8 COMPONENTS Interpreter Development.Module QUIET)
if(NOT Python3_Interpreter_FOUND OR NOT Python3_Development.Module_FOUND)
  set(PAGEDKV_PYTHON_MISSING "Python 3 interpreter and headers (Debian: python3-dev)")
else()
  find_package(pybind11 2.6 CONFIG QUIET)
  execute_process(COMMAND "${Python3_EXECUTABLE}" -c "import numpy"
                  RESULT_VARIABLE _rc OUTPUT_QUIET ERROR_QUIET)
  if(NOT pybind11_FOUND)
    set(PAGEDKV_PYTHON_MISSING "pybind11 (Debian: pybind11-dev python3-pybind11)")
  elseif(NOT _rc EQUAL 0)
    set(PAGEDKV_PYTHON_MISSING "numpy for ${Python3_EXECUTABLE} (Debian: python3-numpy)")
  else()
    set(PAGEDKV_PYTHON_FOUND ON)
  endif()
endif()
