# pagedkv_cuda_head_dim_definitions(<list> <out-var>): checks a PAGEDKV_CUDA_HEAD_DIMS value
# (distinct head dimensions out of 64, 128 and 256, at least one) and sets <out-var> to the
# compile definitions kernels/internal/head_dims.hpp reads: PAGEDKV_CUDA_HEAD_DIM_<d>=0 for each
# one left out. A bad value stops the configure with a message naming it. Used by the top
# CMakeLists.txt; tests/util/head_dims_option.cmake runs it on good and bad values (ctest
# cuda_head_dims_option_*).
function(pagedkv_cuda_head_dim_definitions head_dims out_var)
  set(seen "")
  foreach(d IN LISTS head_dims)
    if(NOT d MATCHES "^(64|128|256)$" OR d IN_LIST seen)
      message(FATAL_ERROR "pagedkv: PAGEDKV_CUDA_HEAD_DIMS must list distinct head dimensions "
                          "out of 64, 128 and 256, not '${head_dims}' ('${d}')")
    endif()
    list(APPEND seen ${d})
  endforeach()
  if(seen STREQUAL "")
    message(FATAL_ERROR "pagedkv: PAGEDKV_CUDA_HEAD_DIMS lists no head dimension (64, 128, 256)")
  endif()
  set(definitions "")
  foreach(d 64 128 256)
    if(NOT d IN_LIST seen)
      list(APPEND definitions PAGEDKV_CUDA_HEAD_DIM_${d}=0)
    endif()
  endforeach()
  set(${out_var} "${definitions}" PARENT_SCOPE)
endfunction()
