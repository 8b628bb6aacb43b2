// kernels/internal/test_build.hpp: what the test-only broken-kernel library instantiates.
// tests/cuda/broken_kernel_test.cpp links pagedkv_cuda_drop_key: the kernel sources compiled again
// with PAGEDKV_TEST_DROP_KEY (every attention kernel leaves one key position out), to prove that
// the per-row checks reject a broken kernel. Those tests run head_dim 128 only, so that library
// instantiates the attention kernels at head_dim 128 alone: the head_dim dispatch switches leave
// out their 64 and 256 cases under PAGEDKV_ALL_HEAD_DIMS 0 (a call then fails as an unsupported
// head_dim), which saves about two thirds of its compile time. pagedkv::cuda itself builds every
// head_dim. Internal to pagedkv::cuda.
#pragma once

#ifdef PAGEDKV_TEST_DROP_KEY
#define PAGEDKV_ALL_HEAD_DIMS 0
#else
#define PAGEDKV_ALL_HEAD_DIMS 1
#endif
