# ctest driver (cmake -P): runs pagedkv_cuda_head_dim_definitions (cmake/pagedkvHeadDims.cmake) on
# HEAD_DIMS ('|' for ';', which a test's command line cannot carry) and prints the compile
# definitions it gives, space-separated; a bad value ends in its configure-time error.
cmake_minimum_required(VERSION 3.25)
include("${SOURCE_DIR}/cmake/pagedkvHeadDims.cmake")
string(REPLACE "|" ";" head_dims "${HEAD_DIMS}")
pagedkv_cuda_head_dim_definitions("${head_dims}" definitions)
list(JOIN definitions " " text)
message("definitions: [${text}]")
