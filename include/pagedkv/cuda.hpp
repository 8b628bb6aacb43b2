// pagedkv/cuda.hpp: the CUDA kernels' entry points in one include (link pagedkv::cuda; installed
// only when the library is built with CUDA). Host-side types come with them.
#pragma once

#include "pagedkv/cuda/cache_ops.hpp"
#include "pagedkv/cuda/decode_attention.hpp"
#include "pagedkv/cuda/device.hpp"
#include "pagedkv/cuda/extend_attention.hpp"
#include "pagedkv/cuda/head_dims.hpp"
