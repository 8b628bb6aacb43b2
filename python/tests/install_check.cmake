# Installs the "python" component into a scratch prefix and imports pagedkv from there, with the
# build tree out of sight (run by ctest: python_install).
file(REMOVE_RECURSE "${PREFIX}")
execute_process(COMMAND "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${PREFIX}"
                        --component python
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake --install --component python failed")
endif()
execute_process(
  COMMAND "${CMAKE_COMMAND}" -E env "PYTHONPATH=${PREFIX}/${SITE}" "${PYTHON}" -c
          "import pagedkv, os; assert os.path.dirname(pagedkv.__file__).startswith('${PREFIX}'), pagedkv.__file__; kv = pagedkv.KVCacheManager(8); print('installed pagedkv', pagedkv.__version__, kv.num_free_blocks)"
  WORKING_DIRECTORY "${PREFIX}"  # python -c puts the working directory first on sys.path
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "importing the installed pagedkv failed")
endif()
foreach(f py.typed _pagedkv.pyi __init__.py)
  if(NOT EXISTS "${PREFIX}/${SITE}/pagedkv/${f}")
    message(FATAL_ERROR "not installed: ${SITE}/pagedkv/${f}")
  endif()
endforeach()
