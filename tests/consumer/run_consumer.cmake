# ctest driver: install pagedkv from the build tree into a private prefix (MODE=package) or point
# at the source tree (MODE=subdirectory), then configure, build and run tests/consumer.
cmake_minimum_required(VERSION 3.25)
file(REMOVE_RECURSE "${WORK_DIR}")
set(args -S "${PAGEDKV_SOURCE_DIR}/tests/consumer" -B "${WORK_DIR}/build"
         -DPAGEDKV_CONSUMER_MODE=${MODE}
         "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}"
         "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}"
         "-DCMAKE_EXE_LINKER_FLAGS=${LINKER_FLAGS}")
# The package consumer is built as the tree was. The subdirectory consumer compiles the library
# again, without a build type (CMake's default: no optimization flags), as a consumer may configure
# it: the tree that runs this test compiles every source with its own flags, and the build type
# changes no target's wiring (the CMake files use no $<CONFIG> expression). 176 s of CPU instead
# of 225 s in a Release tree with CUDA (the kernels' device code is optimized either way).
if(BUILD_TYPE AND MODE STREQUAL "package")
  list(APPEND args -DCMAKE_BUILD_TYPE=${BUILD_TYPE})
endif()

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer (${MODE}): command failed (${rc}): ${ARGN}")
  endif()
endfunction()

if(MODE STREQUAL "package")
  run(${CMAKE_COMMAND} --install "${PAGEDKV_BINARY_DIR}" --prefix "${WORK_DIR}/prefix")
  # The CUDA entry points are installed exactly when pagedkv::cuda is.
  foreach(header cuda/device.hpp cuda.hpp)
    if(HAS_CUDA AND NOT EXISTS "${WORK_DIR}/prefix/include/pagedkv/${header}")
      message(FATAL_ERROR "consumer (package): pagedkv/${header} not installed with CUDA")
    elseif(NOT HAS_CUDA AND EXISTS "${WORK_DIR}/prefix/include/pagedkv/${header}")
      message(FATAL_ERROR "consumer (package): pagedkv/${header} installed without CUDA")
    endif()
  endforeach()
  if(EXISTS "${WORK_DIR}/prefix/include/pagedkv/extend_attention_tiles.hpp" OR
     EXISTS "${WORK_DIR}/prefix/include/pagedkv/cuda/internal")
    message(FATAL_ERROR "consumer (package): a private CUDA header was installed")
  endif()
  list(APPEND args "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix")
else()
  # The library is compiled again here as a unity build (CMAKE_UNITY_BUILD, as a consumer may
  # configure it and CI's sanitizer build does): this test is about add_subdirectory, and the tree
  # that runs it compiles every source on its own. 201 s of CPU instead of 262 s (measured with the
  # Release build type, CUDA on).
  # CUDA code as PTX only (CMAKE_CUDA_ARCHITECTURES=90-virtual, which pagedkv keeps when a
  # consumer sets it): no ptxas run for pagedkv_cuda's kernels, whose SASS the tree running this
  # test builds. 143 s of CPU instead of 181 s (2026-12-05, CUDA on); the sm_90a objects are still
  # compiled to SASS (their own --generate-code).
  # And for head_dim 128 alone (PAGEDKV_CUDA_HEAD_DIMS, as an engine serving models of one head
  # dimension builds it; the consumer checks the library says so): the whole test (configure,
  # build, run; user + sys of `ctest -R consumer_subdirectory`, a measure the figures above did
  # not use) 185 s of CPU instead of 200 s, 106 s instead of 111 s of wall time (2026-12-05).
  list(APPEND args "-DPAGEDKV_SOURCE_DIR=${PAGEDKV_SOURCE_DIR}" "-DPAGEDKV_ENABLE_CUDA=${ENABLE_CUDA}"
       -DCMAKE_UNITY_BUILD=ON -DCMAKE_CUDA_ARCHITECTURES=90-virtual -DPAGEDKV_CUDA_HEAD_DIMS=128)
endif()
run(${CMAKE_COMMAND} ${args})
run(${CMAKE_COMMAND} --build "${WORK_DIR}/build" --parallel 2)
run("${WORK_DIR}/build/consumer")
run("${WORK_DIR}/build/consumer_hash_only")
