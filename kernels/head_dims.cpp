// pagedkv::cuda_head_dim_compiled (pagedkv/cuda/head_dims.hpp): the answer of
// kernels/internal/head_dims.hpp, compiled with the library's PAGEDKV_CUDA_HEAD_DIM_<d> settings.
#include "pagedkv/cuda/head_dims.hpp"

#include "internal/head_dims.hpp"

namespace pagedkv {

bool cuda_head_dim_compiled(int head_dim) noexcept {
  return kernels::head_dim_compiled(head_dim);
}

}  // namespace pagedkv
