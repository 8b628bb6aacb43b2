// The CUDA FP8 KV paths (issue 36) against the CPU references: kv_append writes the reference's
// bytes (codes and per-(token, head) scales), copy_blocks and swap_blocks move FP8 blocks
// byte-exact, decode and extend rows (and extend's lse) agree with the reference computed over
// the same FP8 cache. Without a GPU the tests skip.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.hpp"
#include "pagedkv/cuda/cache_ops.hpp"
#include "pagedkv/cuda/decode_attention.hpp"
#include "pagedkv/cuda/extend_attention.hpp"
#include "pagedkv/device/fp8.hpp"
#include "pagedkv/reference/cache_ops.hpp"
#include "pagedkv/reference/decode_attention.hpp"
#include "pagedkv/reference/extend_attention.hpp"

namespace pagedkv {
namespace {

using testing::DeviceBuffer;

struct Case {
  KVDtype fp8;
  KVScaleMode mode;
  bool hnd;
  std::int32_t head_dim;
};

std::string name(const Case& c) {
  return std::string(to_string(c.fp8)) + "/" + std::string(to_string(c.mode)) +
         (c.hnd ? "/hnd/" : "/nhd/") + std::to_string(c.head_dim);
}

const Case kCases[] = {
    {KVDtype::kFp8E4M3, KVScaleMode::kPerTokenHead, false, 128},
    {KVDtype::kFp8E4M3, KVScaleMode::kPerTokenHead, true, 64},
    {KVDtype::kFp8E5M2, KVScaleMode::kPerTokenHead, false, 256},
    {KVDtype::kFp8E4M3, KVScaleMode::kPerTensor, false, 64},
    {KVDtype::kFp8E5M2, KVScaleMode::kPerTensor, true, 128},
};

// A pool holding `lens` sequences (shuffled blocks), its FP8 K/V written by the CPU reference
// (host planes) and by the CUDA kv_append (device planes) from the same bf16 rows; a few rows
// carry NaN, +-inf and huge values.
struct Pool {
  Case c;
  KVQuant quant;
  KVLayout layout;
  std::int32_t q_heads = 8, kv_heads = 2, block_size = 16, max_blocks = 0;
  std::vector<std::int32_t> lens, table;
  std::vector<std::uint8_t> host_k, host_v;
  DeviceBuffer k, v;
};

Pool make_pool(const Case& c, std::vector<std::int32_t> lens, std::uint64_t seed) {
  Pool p;
  p.c = c;
  p.quant.mode = c.mode;
  p.quant.dtype = c.fp8;
  p.quant.k_scale = 0.02f;
  p.quant.v_scale = 0.03f;
  p.lens = std::move(lens);
  std::int64_t blocks = 2;
  for (const std::int32_t len : p.lens) {
    p.max_blocks = std::max(p.max_blocks, (len + p.block_size - 1) / p.block_size);
    blocks += (len + p.block_size - 1) / p.block_size;
  }
  const bool scaled = c.mode == KVScaleMode::kPerTokenHead;
  p.layout = scaled ? (c.hnd ? KVLayout::hnd_scaled(blocks, p.block_size, p.kv_heads, c.head_dim)
                             : KVLayout::nhd_scaled(blocks, p.block_size, p.kv_heads, c.head_dim))
                    : (c.hnd ? KVLayout::hnd(blocks, p.block_size, p.kv_heads, c.head_dim)
                             : KVLayout::nhd(blocks, p.block_size, p.kv_heads, c.head_dim));
  std::mt19937_64 rng(seed);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  p.table.assign(p.lens.size() * static_cast<std::size_t>(p.max_blocks), 0);
  std::vector<std::int64_t> slots;
  std::size_t next = 0;
  for (std::size_t s = 0; s < p.lens.size(); ++s) {
    for (std::int32_t t = 0; t < p.lens[s]; ++t) {
      auto& cell = p.table[s * static_cast<std::size_t>(p.max_blocks) +
                           static_cast<std::size_t>(t / p.block_size)];
      if (t % p.block_size == 0) cell = ids[next++];
      slots.push_back(std::int64_t{cell} * p.block_size + t % p.block_size);
    }
  }
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_int_distribution<int> octave(-5, 3);
  const std::size_t row = static_cast<std::size_t>(c.head_dim);
  std::vector<std::uint16_t> key, value;
  for (std::size_t r = 0; r < slots.size() * static_cast<std::size_t>(p.kv_heads); ++r) {
    const float km = std::ldexp(1.0f, octave(rng)), vm = std::ldexp(1.0f, octave(rng));
    for (std::size_t d = 0; d < row; ++d) {
      key.push_back(float_to_bf16_bits(km * unit(rng)));
      value.push_back(float_to_bf16_bits(vm * unit(rng)));
    }
  }
  // Special values in the first token's first K row (an inf K row would poison attention, so
  // only the kv_append byte check sees it: the attention tests use the second pool).
  if (p.lens.size() == 1) {
    key[0] = 0x7fc0;  // NaN
    key[1] = 0x7f80;  // +inf
    key[2] = 0xff80;  // -inf
    key[3] = float_to_bf16_bits(3e38f);
  }
  const auto plane = static_cast<std::size_t>(p.layout.plane_elements());
  p.host_k.assign(plane, 0xff);
  p.host_v.assign(plane, 0xff);
  KVAppendParams a;
  a.dtype = KVDtype::kBFloat16;
  a.quant = p.quant;
  a.num_tokens = static_cast<std::int64_t>(slots.size());
  a.key = key.data();
  a.value = value.data();
  a.slot_mapping = slots.data();
  a.k_cache = p.host_k.data();
  a.v_cache = p.host_v.data();
  a.layout = p.layout;
  reference_kv_append(a);
  p.k = DeviceBuffer(plane);  // filled with 0xff, as the host planes
  p.v = DeviceBuffer(plane);
  const DeviceBuffer dk = testing::upload(key), dv = testing::upload(value),
                     ds = testing::upload(slots);
  a.key = dk.get();
  a.value = dv.get();
  a.slot_mapping = ds.get<std::int64_t>();
  a.k_cache = p.k.get();
  a.v_cache = p.v.get();
  PAGEDKV_CUDA_CHECK(kv_append(a, nullptr));
  PAGEDKV_CUDA_CHECK(cudaDeviceSynchronize());
  return p;
}

PagedKVParams kv_params(const Pool& p, const void* k, const void* v, const std::int32_t* table,
                        const std::int32_t* lens) {
  PagedKVParams kv;
  kv.dtype = KVDtype::kBFloat16;
  kv.quant = p.quant;
  kv.num_seqs = static_cast<std::int32_t>(p.lens.size());
  kv.num_q_heads = p.q_heads;
  kv.k_cache = k;
  kv.v_cache = v;
  kv.layout = p.layout;
  kv.block_table = table;
  kv.max_blocks_per_seq = p.max_blocks;
  kv.seq_lens = lens;
  kv.sm_scale = 1.0f / std::sqrt(static_cast<float>(p.c.head_dim));
  return kv;
}

double worst_row_error(const std::vector<std::uint16_t>& got, const std::vector<double>& ref,
                       std::size_t row) {
  double worst = 0;
  for (std::size_t r = 0; r + row <= ref.size(); r += row) {
    double diff = 0, norm = 0;
    for (std::size_t i = r; i < r + row; ++i) {
      const double x = bf16_bits_to_float(got[i]);
      if (!std::isfinite(x)) return INFINITY;
      diff += (x - ref[i]) * (x - ref[i]);
      norm += ref[i] * ref[i];
    }
    worst = std::max(worst, std::sqrt(norm > 0 ? diff / norm : diff));
  }
  return worst;
}

class CudaFp8 : public testing::GpuTest {};

TEST_F(CudaFp8, KvAppendWritesTheReferenceBytes) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(name(c));
    const Pool p = make_pool(c, {45}, 1);
    const auto n = p.host_k.size();
    EXPECT_EQ(testing::download<std::uint8_t>(p.k.get(), n), p.host_k);
    EXPECT_EQ(testing::download<std::uint8_t>(p.v.get(), n), p.host_v);
  }
}

TEST_F(CudaFp8, CopyAndSwapMoveBlocksByteExact) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(name(c));
    Pool p = make_pool(c, {40, 20}, 2);
    const std::size_t plane = p.host_k.size();
    // copy_blocks: sequence 1's first block onto sequence 0's second.
    const std::vector<BlockPair> pairs = {
        {p.table[static_cast<std::size_t>(p.max_blocks)], p.table[1]}};
    const DeviceBuffer dpairs = testing::upload(pairs);
    std::vector<void*> planes = {p.k.get(), p.v.get()};
    PAGEDKV_CUDA_CHECK(copy_blocks(planes, p.layout, c.fp8, dpairs.get<BlockPair>(), 1, nullptr));
    PAGEDKV_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<void*> host_planes = {p.host_k.data(), p.host_v.data()};
    reference_copy_blocks(host_planes, p.layout, c.fp8, pairs);
    EXPECT_EQ(testing::download<std::uint8_t>(p.k.get(), plane), p.host_k);
    EXPECT_EQ(testing::download<std::uint8_t>(p.v.get(), plane), p.host_v);
    // swap_blocks to host memory (the pool's own layout, two blocks) and compare with the
    // reference swap of the host planes.
    KVLayout small = p.layout;
    small.num_blocks = 2;
    const auto small_plane = static_cast<std::size_t>(small.plane_elements());
    std::vector<std::uint8_t> out_k(small_plane, 0), out_v(small_plane, 0);
    std::vector<std::uint8_t> ref_k(small_plane, 0), ref_v(small_plane, 0);
    const std::vector<BlockPair> swap = {{p.table[0], 1}, {p.table[1], 0}};
    std::vector<const void*> src = {p.k.get(), p.v.get()};
    std::vector<void*> dst = {out_k.data(), out_v.data()};
    PAGEDKV_CUDA_CHECK(swap_blocks(src, p.layout, dst, small, c.fp8, swap, nullptr));
    PAGEDKV_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<const void*> host_src = {p.host_k.data(), p.host_v.data()};
    std::vector<void*> host_dst = {ref_k.data(), ref_v.data()};
    reference_swap_blocks(host_src, p.layout, host_dst, small, c.fp8, swap);
    EXPECT_EQ(out_k, ref_k);
    EXPECT_EQ(out_v, ref_v);
  }
}

TEST_F(CudaFp8, DecodeAndExtendMatchTheReference) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(name(c));
    Pool p = make_pool(c, {1, 33, 130, 16}, 3);
    const DeviceBuffer table = testing::upload(p.table), lens = testing::upload(p.lens);
    std::mt19937_64 rng(4);
    std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
    const auto dim = static_cast<std::size_t>(c.head_dim);
    // Decode.
    std::vector<std::uint16_t> q(p.lens.size() * static_cast<std::size_t>(p.q_heads) * dim);
    for (auto& x : q) x = float_to_bf16_bits(unit(rng));
    const DeviceBuffer dq = testing::upload(q);
    DeviceBuffer dout(q.size() * 2);
    PagedDecodeParams d;
    static_cast<PagedKVParams&>(d) =
        kv_params(p, p.k.get(), p.v.get(), table.get<std::int32_t>(), lens.get<std::int32_t>());
    d.q = dq.get();
    d.out = dout.get();
    PAGEDKV_CUDA_CHECK(paged_decode_attention(d, DecodePlan{}, nullptr, 0, nullptr));
    PAGEDKV_CUDA_CHECK(cudaDeviceSynchronize());
    PagedDecodeParams hd = d;
    static_cast<PagedKVParams&>(hd) =
        kv_params(p, p.host_k.data(), p.host_v.data(), p.table.data(), p.lens.data());
    hd.q = q.data();
    EXPECT_LE(worst_row_error(testing::download<std::uint16_t>(dout.get(), q.size()),
                              reference_paged_decode_attention_f64(hd), dim),
              1e-2);
    // Extend: 1, 33, 7 and 16 new tokens.
    const std::vector<std::int32_t> q_lens = {1, 33, 7, 16};
    std::vector<std::int32_t> indptr = {0};
    for (const std::int32_t n : q_lens) indptr.push_back(indptr.back() + n);
    std::vector<std::uint16_t> eq(static_cast<std::size_t>(indptr.back()) *
                                  static_cast<std::size_t>(p.q_heads) * dim);
    for (auto& x : eq) x = float_to_bf16_bits(unit(rng));
    const DeviceBuffer deq = testing::upload(eq), dindptr = testing::upload(indptr);
    DeviceBuffer deout(eq.size() * 2);
    DeviceBuffer dlse(static_cast<std::size_t>(indptr.back() * p.q_heads) * sizeof(float));
    PagedExtendParams e;
    static_cast<PagedKVParams&>(e) =
        kv_params(p, p.k.get(), p.v.get(), table.get<std::int32_t>(), lens.get<std::int32_t>());
    e.q_indptr = dindptr.get<std::int32_t>();
    e.max_q_len = 33;
    e.q = deq.get();
    e.out = deout.get();
    e.lse = dlse.get<float>();
    PAGEDKV_CUDA_CHECK(paged_extend_attention(e, nullptr));
    PAGEDKV_CUDA_CHECK(cudaDeviceSynchronize());
    PagedExtendParams he = e;
    static_cast<PagedKVParams&>(he) =
        kv_params(p, p.host_k.data(), p.host_v.data(), p.table.data(), p.lens.data());
    he.q_indptr = indptr.data();
    he.q = eq.data();
    const ExtendReference ref = reference_paged_extend_attention_f64(he);
    EXPECT_LE(
        worst_row_error(testing::download<std::uint16_t>(deout.get(), eq.size()), ref.out, dim),
        1e-2);
    const auto lse = testing::download<float>(dlse.get(), ref.lse.size());
    for (std::size_t i = 0; i < lse.size(); ++i) {
      ASSERT_NEAR(lse[i], ref.lse[i], 1e-3 * (1 + std::abs(ref.lse[i]))) << i;
    }
  }
}

}  // namespace
}  // namespace pagedkv
