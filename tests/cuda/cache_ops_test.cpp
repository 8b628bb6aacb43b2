// CUDA kv_append, copy_blocks and swap_blocks against their CPU references, bit for bit.
// Without a GPU the device tests skip; the host-side argument checks still run.
#include "pagedkv/cuda/cache_ops.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.hpp"
#include "expect_error.hpp"
#include "kv_test_util.hpp"
#include "pagedkv/base/error.hpp"
#include "pagedkv/device/block_table.hpp"

namespace pagedkv {
namespace {

using testing::DeviceBuffer;
using testing::LayoutKind;

// Elements of one plane's buffer for a layout kind (kInterleaved keeps K and V in one buffer).
std::size_t buffer_elements(LayoutKind kind, const KVLayout& layout) {
  return kind == LayoutKind::kInterleaved
             ? static_cast<std::size_t>(layout.num_blocks * 2 * layout.block_elements())
             : static_cast<std::size_t>(layout.plane_elements());
}

class CudaCacheOps : public testing::GpuTest {};

TEST_F(CudaCacheOps, KVAppendMatchesReference) {
  std::mt19937_64 rng(1);
  for (const KVDtype dtype : {KVDtype::kFloat16, KVDtype::kBFloat16}) {
    for (const LayoutKind kind :
         {LayoutKind::kNhd, LayoutKind::kHnd, LayoutKind::kInterleaved, LayoutKind::kPadded}) {
      for (const std::int32_t head_dim : {8, 64, 128, 256}) {
        for (const std::int32_t block_size : {1, 3, 16, 64}) {
          const std::int32_t heads = kind == LayoutKind::kHnd ? 4 : 8;
          // At least 64 slots: the 50 tokens below take distinct slots (block size 1 included).
          const KVLayout layout =
              testing::make_layout(kind, 64 / block_size + 40, block_size, heads, head_dim);
          const std::size_t elements = buffer_elements(kind, layout);
          auto k_cache = testing::random_values(dtype, elements, rng);
          auto v_cache = kind == LayoutKind::kInterleaved
                             ? std::vector<std::uint16_t>()
                             : testing::random_values(dtype, elements, rng);
          const std::size_t v_offset = kind == LayoutKind::kInterleaved
                                           ? static_cast<std::size_t>(layout.block_elements())
                                           : 0;
          // 50 tokens, key rows padded to a token stride of heads * head_dim + 8.
          const std::int64_t n = 50;
          const std::int64_t key_token_stride = static_cast<std::int64_t>(heads) * head_dim + 8;
          const auto key =
              testing::random_values(dtype, static_cast<std::size_t>(n * key_token_stride), rng);
          const auto value =
              testing::random_values(dtype, static_cast<std::size_t>(n * heads * head_dim), rng);
          std::vector<std::int64_t> all(static_cast<std::size_t>(layout.num_slots()));
          std::iota(all.begin(), all.end(), 0);
          std::shuffle(all.begin(), all.end(), rng);
          std::vector<std::int64_t> slots(all.begin(), all.begin() + n);
          slots[3] = kSkipSlot;
          slots[10] = -7;

          const DeviceBuffer k_dev = testing::upload(k_cache);
          const DeviceBuffer v_dev = testing::upload(v_cache);
          const DeviceBuffer key_dev = testing::upload(key);
          const DeviceBuffer value_dev = testing::upload(value);
          const DeviceBuffer slots_dev = testing::upload(slots);

          KVAppendParams p;
          p.dtype = dtype;
          p.num_tokens = n;
          p.key_stride_token = key_token_stride;
          p.layout = layout;
          // Host run (reference).
          p.key = key.data();
          p.value = value.data();
          p.slot_mapping = slots.data();
          p.k_cache = k_cache.data();
          p.v_cache =
              (kind == LayoutKind::kInterleaved ? k_cache.data() : v_cache.data()) + v_offset;
          reference_kv_append(p);
          // Device run.
          p.key = key_dev.get();
          p.value = value_dev.get();
          p.slot_mapping = slots_dev.get<std::int64_t>();
          p.k_cache = k_dev.get();
          p.v_cache = (kind == LayoutKind::kInterleaved ? k_dev.get<std::uint16_t>()
                                                        : v_dev.get<std::uint16_t>()) +
                      v_offset;
          PAGEDKV_CUDA_CHECK(kv_append(p, nullptr));
          ASSERT_EQ(testing::download<std::uint16_t>(k_dev.get(), k_cache.size()), k_cache)
              << testing::to_string(kind) << " dim " << head_dim << " block " << block_size;
          ASSERT_EQ(testing::download<std::uint16_t>(v_dev.get(), v_cache.size()), v_cache)
              << testing::to_string(kind) << " dim " << head_dim << " block " << block_size;
        }
      }
    }
  }
}

TEST_F(CudaCacheOps, KVAppendSkipsSlotsOutsideThePool) {
  const KVLayout layout = KVLayout::nhd(2, 16, 1, 8);
  std::vector<std::uint16_t> cache(static_cast<std::size_t>(layout.plane_elements()), 0x1111);
  const DeviceBuffer k_dev = testing::upload(cache);
  const DeviceBuffer v_dev = testing::upload(cache);
  const std::vector<std::uint16_t> rows(16, 0x2222);
  const DeviceBuffer rows_dev = testing::upload(rows);
  const std::vector<std::int64_t> slots = {32, 1000};  // both past the 32 slots
  const DeviceBuffer slots_dev = testing::upload(slots);
  KVAppendParams p;
  p.dtype = KVDtype::kFloat16;
  p.num_tokens = 2;
  p.key = rows_dev.get();
  p.value = rows_dev.get();
  p.slot_mapping = slots_dev.get<std::int64_t>();
  p.k_cache = k_dev.get();
  p.v_cache = v_dev.get();
  p.layout = layout;
  PAGEDKV_CUDA_CHECK(kv_append(p, nullptr));
  EXPECT_EQ(testing::download<std::uint16_t>(k_dev.get(), cache.size()), cache);
}

TEST_F(CudaCacheOps, CopyBlocksMatchesReference) {
  std::mt19937_64 rng(2);
  for (const LayoutKind kind : {LayoutKind::kNhd, LayoutKind::kHnd, LayoutKind::kPadded}) {
    for (const std::int32_t block_size : {1, 16, 64}) {
      for (const std::size_t num_planes : {std::size_t{2}, std::size_t{64}, std::size_t{300}}) {
        const KVLayout layout = testing::make_layout(kind, 12, block_size, 2, 64);
        const std::size_t elements = static_cast<std::size_t>(layout.plane_elements());
        std::vector<std::vector<std::uint16_t>> host;
        std::vector<DeviceBuffer> dev;
        std::vector<void*> host_planes;
        std::vector<void*> dev_planes;
        for (std::size_t i = 0; i < num_planes; ++i) {
          host.push_back(testing::random_values(KVDtype::kBFloat16, elements, rng));
          dev.push_back(testing::upload(host.back()));
        }
        for (std::size_t i = 0; i < num_planes; ++i) {
          host_planes.push_back(host[i].data());
          dev_planes.push_back(dev[i].get());
        }
        // Forks of blocks 1 and 2 into 5..9, and 0 -> 11.
        const std::vector<BlockPair> pairs = {{1, 5}, {1, 6}, {2, 7}, {2, 8}, {2, 9}, {0, 11}};
        const DeviceBuffer pairs_dev = testing::upload(pairs);
        reference_copy_blocks(host_planes, layout, KVDtype::kBFloat16, pairs);
        PAGEDKV_CUDA_CHECK(copy_blocks(dev_planes, layout, KVDtype::kBFloat16,
                                       pairs_dev.get<BlockPair>(),
                                       static_cast<std::int64_t>(pairs.size()), nullptr));
        for (std::size_t i = 0; i < num_planes; ++i) {
          ASSERT_EQ(testing::download<std::uint16_t>(dev[i].get(), elements), host[i])
              << testing::to_string(kind) << " block " << block_size << " plane " << i;
        }
      }
    }
  }
}

// The interleaved layout (one buffer per layer, [blocks, 2, block_size, heads, dim]: the V plane
// starts one block's elements after the K plane and both have a block stride of two blocks),
// with pairs naming blocks outside the pool: those pairs are skipped (device data is trusted,
// never followed out of bounds), every valid pair is copied, and nothing else changes, bit for
// bit. Run under compute-sanitizer memcheck by scripts/gpu-check.
TEST_F(CudaCacheOps, CopyBlocksInterleavedLayoutAndOutOfRangePairs) {
  std::mt19937_64 rng(4);
  for (const std::int32_t block_size : {1, 16}) {
    const std::int64_t num_blocks = 12;
    const KVLayout layout =
        testing::make_layout(LayoutKind::kInterleaved, num_blocks, block_size, 2, 128);
    const std::size_t elements = buffer_elements(LayoutKind::kInterleaved, layout);
    const auto v_offset = static_cast<std::size_t>(layout.block_elements());
    // Three layers, one interleaved buffer each: planes K0, V0, K1, V1, K2, V2.
    std::vector<std::vector<std::uint16_t>> host;
    std::vector<DeviceBuffer> dev;
    std::vector<void*> host_planes;
    std::vector<void*> dev_planes;
    for (int layer = 0; layer < 3; ++layer) {
      host.push_back(testing::random_values(KVDtype::kFloat16, elements, rng));
      dev.push_back(testing::upload(host.back()));
    }
    for (int layer = 0; layer < 3; ++layer) {
      for (const std::size_t offset : {std::size_t{0}, v_offset}) {
        host_planes.push_back(host[static_cast<std::size_t>(layer)].data() + offset);
        dev_planes.push_back(dev[static_cast<std::size_t>(layer)].get<std::uint16_t>() + offset);
      }
    }
    const std::vector<BlockPair> valid = {{1, 5}, {1, 6}, {2, 7}, {11, 0}, {3, 10}};
    std::vector<BlockPair> pairs = {{1, 5},  {num_blocks, 8},
                                    {1, 6},  {2, -1},
                                    {2, 7},  {-4, 9},
                                    {11, 0}, {3, num_blocks + 100},
                                    {3, 10}, {std::int64_t{1} << 40, 4}};
    const DeviceBuffer pairs_dev = testing::upload(pairs);
    reference_copy_blocks(host_planes, layout, KVDtype::kFloat16, valid);
    PAGEDKV_CUDA_CHECK(copy_blocks(dev_planes, layout, KVDtype::kFloat16,
                                   pairs_dev.get<BlockPair>(),
                                   static_cast<std::int64_t>(pairs.size()), nullptr));
    PAGEDKV_CUDA_CHECK(cudaDeviceSynchronize());
    for (std::size_t layer = 0; layer < 3; ++layer) {
      ASSERT_EQ(testing::download<std::uint16_t>(dev[layer].get(), elements), host[layer])
          << "block " << block_size << " layer " << layer;
    }
  }
}

TEST_F(CudaCacheOps, SwapBlocksToPinnedHostAndBack) {
  std::mt19937_64 rng(3);
  for (const LayoutKind device_kind : {LayoutKind::kNhd, LayoutKind::kInterleaved}) {
    const KVLayout dev_layout = testing::make_layout(device_kind, 64, 16, 4, 128);
    const KVLayout host_layout = KVLayout::nhd(20, 16, 4, 128);
    const std::size_t dev_elems = buffer_elements(device_kind, dev_layout);
    const std::size_t v_offset = device_kind == LayoutKind::kInterleaved
                                     ? static_cast<std::size_t>(dev_layout.block_elements())
                                     : 0;
    // Two layers on the device: K0, V0, K1, V1 (interleaved: one buffer per layer).
    const std::size_t buffers = device_kind == LayoutKind::kInterleaved ? 2 : 4;
    std::vector<std::vector<std::uint16_t>> dev_host_copy;
    std::vector<DeviceBuffer> dev;
    for (std::size_t i = 0; i < buffers; ++i) {
      dev_host_copy.push_back(testing::random_values(KVDtype::kFloat16, dev_elems, rng));
      dev.push_back(testing::upload(dev_host_copy.back()));
    }
    std::vector<const void*> dev_planes_c;
    std::vector<void*> dev_planes;
    std::vector<const void*> ref_src;
    for (std::size_t layer = 0; layer < 2; ++layer) {
      for (std::size_t is_v = 0; is_v < 2; ++is_v) {
        const std::size_t b = device_kind == LayoutKind::kInterleaved ? layer : layer * 2 + is_v;
        const std::size_t off = device_kind == LayoutKind::kInterleaved ? is_v * v_offset : 0;
        dev_planes.push_back(dev[b].get<std::uint16_t>() + off);
        dev_planes_c.push_back(dev[b].get<std::uint16_t>() + off);
        ref_src.push_back(dev_host_copy[b].data() + off);
      }
    }
    const std::size_t host_elems = static_cast<std::size_t>(host_layout.plane_elements());
    std::vector<std::uint16_t*> pinned(4, nullptr);
    for (auto& ptr : pinned) {
      PAGEDKV_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&ptr), host_elems * 2));
      std::fill(ptr, ptr + host_elems, std::uint16_t{0x5555});
    }
    std::vector<std::vector<std::uint16_t>> expected(
        4, std::vector<std::uint16_t>(host_elems, 0x5555));
    std::vector<void*> pinned_planes(pinned.begin(), pinned.end());
    std::vector<const void*> pinned_planes_c(pinned.begin(), pinned.end());
    std::vector<void*> expected_planes;
    for (auto& e : expected) expected_planes.push_back(e.data());

    // Out: unsorted pairs with two coalescible runs (10..13 -> 2..5, 40..41 -> 7..8) and singles.
    const std::vector<BlockPair> out = {{12, 4}, {40, 7}, {10, 2}, {63, 19},
                                        {11, 3}, {41, 8}, {13, 5}, {0, 0}};
    reference_swap_blocks(ref_src, dev_layout, expected_planes, host_layout, KVDtype::kFloat16,
                          out);
    cudaStream_t stream = nullptr;
    PAGEDKV_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    PAGEDKV_CUDA_CHECK(swap_blocks(dev_planes_c, dev_layout, pinned_planes, host_layout,
                                   KVDtype::kFloat16, out, stream));
    PAGEDKV_CUDA_CHECK(cudaStreamSynchronize(stream));
    for (std::size_t i = 0; i < 4; ++i) {
      ASSERT_TRUE(std::equal(expected[i].begin(), expected[i].end(), pinned[i]))
          << testing::to_string(device_kind) << " plane " << i;
    }

    // In: host blocks 2..5 -> device 30..33, host 19 -> device 1.
    const std::vector<BlockPair> in = {{2, 30}, {3, 31}, {4, 32}, {5, 33}, {19, 1}};
    std::vector<void*> ref_dst;
    for (std::size_t i = 0; i < 4; ++i) ref_dst.push_back(const_cast<void*>(ref_src[i]));
    reference_swap_blocks(pinned_planes_c, host_layout, ref_dst, dev_layout, KVDtype::kFloat16, in);
    PAGEDKV_CUDA_CHECK(swap_blocks(pinned_planes_c, host_layout, dev_planes, dev_layout,
                                   KVDtype::kFloat16, in, stream));
    PAGEDKV_CUDA_CHECK(cudaStreamSynchronize(stream));
    for (std::size_t b = 0; b < buffers; ++b) {
      ASSERT_EQ(testing::download<std::uint16_t>(dev[b].get(), dev_elems), dev_host_copy[b])
          << testing::to_string(device_kind) << " buffer " << b;
    }
    PAGEDKV_CUDA_CHECK(cudaStreamDestroy(stream));
    for (auto* ptr : pinned) PAGEDKV_CUDA_CHECK(cudaFreeHost(ptr));
  }
}

// ---- host-side argument checks: no device needed ----

template <typename Fn>
void expect_error(Fn&& fn, const std::string& fragment) {
  testing::expect_error_containing(fn, fragment);
}

TEST(CudaCacheOpsArguments, RejectedOnTheHostBeforeAnyLaunch) {
  const KVLayout layout = KVLayout::nhd(4, 16, 2, 64);
  alignas(16) static std::uint16_t buffer[4 * 16 * 2 * 64 + 8];
  alignas(16) static std::int64_t slots[4];
  KVAppendParams p;
  p.dtype = KVDtype::kFloat16;
  p.num_tokens = 2;
  p.key = buffer;
  p.value = buffer;
  p.slot_mapping = slots;
  p.k_cache = buffer + 1;  // misaligned
  p.v_cache = buffer;
  p.layout = layout;
  expect_error([&] { (void)kv_append(p, nullptr); }, "16-byte aligned");
  p.k_cache = buffer;
  p.key_stride_head = 68;
  p.key_stride_token = 140;
  expect_error([&] { (void)kv_append(p, nullptr); }, "multiples of 8");
  p.key_stride_head = 0;
  p.key_stride_token = 0;
  p.slot_mapping = nullptr;
  expect_error([&] { (void)kv_append(p, nullptr); }, "slot_mapping is null");

  std::vector<void*> planes = {buffer, buffer + 1};
  alignas(16) static BlockPair pairs[1];
  expect_error([&] { (void)copy_blocks(planes, layout, KVDtype::kFloat16, pairs, 1, nullptr); },
               "plane 1 is null or not 16-byte aligned");
  expect_error([&] { (void)copy_blocks(planes, layout, KVDtype::kFloat16, nullptr, 1, nullptr); },
               "pairs is null");
  expect_error([&] { (void)copy_blocks(planes, layout, KVDtype::kFloat16, pairs, -1, nullptr); },
               "num_pairs");

  const std::vector<const void*> src = {buffer};
  const std::vector<void*> dst = {buffer};
  const std::vector<BlockPair> dup = {{0, 1}, {2, 1}};
  expect_error(
      [&] { (void)swap_blocks(src, layout, dst, layout, KVDtype::kFloat16, dup, nullptr); },
      "appears twice");
  const KVLayout other = KVLayout::hnd(4, 16, 2, 64);
  const std::vector<BlockPair> one = {{0, 1}};
  expect_error([&] { (void)swap_blocks(src, layout, dst, other, KVDtype::kFloat16, one, nullptr); },
               "same blocks");
}

}  // namespace
}  // namespace pagedkv
