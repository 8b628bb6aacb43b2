// The CUDA FP8 KV paths (issue 36) against the CPU references: kv_append writes the reference's
// bytes (codes and per-(token, head) scales), copy_blocks and swap_blocks move FP8 blocks
// byte-exact, decode and extend rows (and extend's lse) agree with the reference computed over
// the same FP8 cache. Without a GPU the tests skip.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.hpp"
#include "pagedkv/base/error.hpp"
#include "pagedkv/cuda/cache_ops.hpp"
#include "pagedkv/cuda/decode_attention.hpp"
#include "pagedkv/cuda/extend_attention.hpp"
#include "pagedkv/device/decode_plan.hpp"
#include "pagedkv/device/fp8.hpp"
#include "pagedkv/device/kv_dtype.hpp"
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

// growing_v: each V row's magnitude is 2^(-6 + 10 t / len) at token t of a sequence of len
// tokens (instead of a random octave in [-5, 3]), so the largest V scale a kernel has seen grows
// along every sequence, tile after tile.
// negative_scales (per-row scales only): every V scale and the K scales of odd slots negated
// after kv_append (which writes none below zero; a cache filled elsewhere may hold them), in the
// host and the device planes alike: a value is decode(code) x s, the sign included.
Pool make_pool(const Case& c, std::vector<std::int32_t> lens, std::uint64_t seed,
               std::int32_t block_size = 16, std::int32_t q_heads = 8, std::int32_t kv_heads = 2,
               bool growing_v = false, bool negative_scales = false) {
  Pool p;
  p.c = c;
  p.block_size = block_size;
  p.q_heads = q_heads;
  p.kv_heads = kv_heads;
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
  std::vector<int> v_octave;  // growing_v: slot i's V octave
  std::size_t next = 0;
  for (std::size_t s = 0; s < p.lens.size(); ++s) {
    for (std::int32_t t = 0; t < p.lens[s]; ++t) {
      auto& cell = p.table[s * static_cast<std::size_t>(p.max_blocks) +
                           static_cast<std::size_t>(t / p.block_size)];
      if (t % p.block_size == 0) cell = ids[next++];
      slots.push_back(std::int64_t{cell} * p.block_size + t % p.block_size);
      v_octave.push_back(-6 + 10 * t / p.lens[s]);
    }
  }
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_int_distribution<int> octave(-5, 3);
  const std::size_t row = static_cast<std::size_t>(c.head_dim);
  std::vector<std::uint16_t> key, value;
  for (std::size_t r = 0; r < slots.size() * static_cast<std::size_t>(p.kv_heads); ++r) {
    const float km = std::ldexp(1.0f, octave(rng));
    const int vo = octave(rng);  // drawn either way: the other rows' values stay the same
    const float vm =
        std::ldexp(1.0f, growing_v ? v_octave[r / static_cast<std::size_t>(p.kv_heads)] : vo);
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
  if (negative_scales) {
    EXPECT_EQ(c.mode, KVScaleMode::kPerTokenHead);
    const auto negate = [](std::vector<std::uint8_t>& bytes, std::int64_t at) {
      float s;
      std::memcpy(&s, bytes.data() + at, sizeof s);
      s = -s;
      std::memcpy(bytes.data() + at, &s, sizeof s);
    };
    for (std::size_t i = 0; i < slots.size(); ++i) {
      for (std::int32_t h = 0; h < p.kv_heads; ++h) {
        const std::int64_t at =
            p.layout.scale_byte_offset(slots[i] / p.block_size, slots[i] % p.block_size, h);
        negate(p.host_v, at);
        if (i % 2 == 1) negate(p.host_k, at);
      }
    }
    // kv_append wrote the host planes' bytes (KvAppendWritesTheReferenceBytes): the same again.
    PAGEDKV_CUDA_CHECK(cudaMemcpy(p.k.get(), p.host_k.data(), plane, cudaMemcpyHostToDevice));
    PAGEDKV_CUDA_CHECK(cudaMemcpy(p.v.get(), p.host_v.data(), plane, cudaMemcpyHostToDevice));
  }
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
                       std::size_t row, KVDtype dtype = KVDtype::kBFloat16) {
  double worst = 0;
  for (std::size_t r = 0; r + row <= ref.size(); r += row) {
    double diff = 0, norm = 0;
    for (std::size_t i = r; i < r + row; ++i) {
      const double x = dtype_bits_to_float(dtype, got[i]);
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

// DecodeKernel::kTensorCoreFp8 and kTensorCoreFp8Direct (kernels/decode_attention_tc_fp8.cu)
// beside the default path (the FP8 CUDA-core kernel, which ignores the plan), each without
// split-KV, with a forced plan of 5 chunks of 37 tokens (chunks that start mid-tile and mid-block;
// long sequences put the rest in the last chunk) and with 40 chunks of 64 tokens (many active
// splits for the 700-token sequence, few for the short ones, direct writes for 1-chunk sequences),
// over both FP8 types, both scale modes, NHD / HND, fp16 / bf16 q and out, head_dim 64 / 128 / 256,
// GQA groups 1 to 16, block sizes 1 to 256 (powers of two and not), soft-cap and sliding window.
// Every output row is compared with the CPU reference over the same FP8 cache. What a broken piece
// does: a wrong conversion, swizzle or fragment map, a dropped K or V scale, a V scale applied to
// the softmax sum, or a missed R rescale (decode_attention_tc_fp8.cu's top) moves whole rows far
// past 1e-2; a wrong split range or merge breaks the split plans only; rows of the wrong query head
// show at group > 1; a wrong page offset shows at the block sizes that are not powers of two
// (the kernel's division path) or in HND; a key not skipped in a block outside the pool breaks
// the bad-block rows. For kTensorCoreFp8Direct also: q's A fragments not permuted as the K
// fragments are, a V register not byte-permuted, an accumulator written to the wrong dims or a
// staging swizzle that the reads do not invert (each caught on the host too:
// tests/device/decode_tc_fp8_layout_test.cpp). (The sanitizer runs of scripts/gpu-check look for
// races.)
struct TcCase {
  Case c;
  KVDtype dtype;  // q / out
  std::int32_t group;
  std::int32_t kv_heads;
  std::int32_t block_size;
  float soft_cap;
  std::int32_t window;
  // The last sequence's last block gets an id outside the pool (bad_id): the FP8 kernels skip
  // those keys, so its row equals the reference over the sequence cut at that block's start.
  bool bad_last_block;
  std::int32_t bad_id;  // < 0: that id; > 0: the id num_blocks + bad_id - 1 (past the pool)
};

std::string name(const TcCase& t) {
  return name(t.c) + "/" + std::string(to_string(t.dtype)) + "/g" + std::to_string(t.group) +
         "/kv" + std::to_string(t.kv_heads) + "/bs" + std::to_string(t.block_size) +
         (t.soft_cap > 0 ? "/cap" : "") + (t.window > 0 ? "/window" : "") +
         (t.bad_last_block ? "/bad-block" : "");
}

const TcCase kTcCases[] = {
    {.c = {KVDtype::kFp8E4M3, KVScaleMode::kPerTokenHead, false, 128},
     .dtype = KVDtype::kBFloat16,
     .group = 4,
     .kv_heads = 2,
     .block_size = 16,
     .soft_cap = 0,
     .window = 0,
     .bad_last_block = false,
     .bad_id = 0},
    {.c = {KVDtype::kFp8E4M3, KVScaleMode::kPerTokenHead, true, 64},
     .dtype = KVDtype::kFloat16,
     .group = 8,
     .kv_heads = 2,
     .block_size = 1,
     .soft_cap = 0,
     .window = 0,
     .bad_last_block = false,
     .bad_id = 0},
    {.c = {KVDtype::kFp8E5M2, KVScaleMode::kPerTokenHead, false, 256},
     .dtype = KVDtype::kBFloat16,
     .group = 1,
     .kv_heads = 3,
     .block_size = 7,
     .soft_cap = 0,
     .window = 0,
     .bad_last_block = false,
     .bad_id = 0},
    {.c = {KVDtype::kFp8E4M3, KVScaleMode::kPerTensor, false, 64},
     .dtype = KVDtype::kFloat16,
     .group = 16,
     .kv_heads = 1,
     .block_size = 16,
     .soft_cap = 5.0f,
     .window = 0,
     .bad_last_block = false,
     .bad_id = 0},
    {.c = {KVDtype::kFp8E5M2, KVScaleMode::kPerTensor, true, 128},
     .dtype = KVDtype::kFloat16,
     .group = 4,
     .kv_heads = 2,
     .block_size = 24,
     .soft_cap = 0,
     .window = 50,
     .bad_last_block = false,
     .bad_id = 0},
    {.c = {KVDtype::kFp8E4M3, KVScaleMode::kPerTokenHead, true, 256},
     .dtype = KVDtype::kFloat16,
     .group = 8,
     .kv_heads = 2,
     .block_size = 16,
     .soft_cap = 5.0f,
     .window = 70,
     .bad_last_block = false,
     .bad_id = 0},
    {.c = {KVDtype::kFp8E5M2, KVScaleMode::kPerTokenHead, false, 128},
     .dtype = KVDtype::kFloat16,
     .group = 1,
     .kv_heads = 2,
     .block_size = 256,
     .soft_cap = 0,
     .window = 0,
     .bad_last_block = true,
     .bad_id = 3},
    {.c = {KVDtype::kFp8E4M3, KVScaleMode::kPerTensor, false, 256},
     .dtype = KVDtype::kBFloat16,
     .group = 16,
     .kv_heads = 1,
     .block_size = 5,
     .soft_cap = 0,
     .window = 0,
     .bad_last_block = true,
     .bad_id = -1},
    {.c = {KVDtype::kFp8E4M3, KVScaleMode::kPerTokenHead, false, 64},
     .dtype = KVDtype::kBFloat16,
     .group = 4,
     .kv_heads = 2,
     .block_size = 1,
     .soft_cap = 0,
     .window = 0,
     .bad_last_block = true,
     .bad_id = 1},
    {.c = {KVDtype::kFp8E5M2, KVScaleMode::kPerTensor, true, 64},
     .dtype = KVDtype::kBFloat16,
     .group = 8,
     .kv_heads = 2,
     .block_size = 32,
     .soft_cap = 5.0f,
     .window = 100,
     .bad_last_block = false,
     .bad_id = 0},
};

// One case of TensorCoreDecodeMatchesTheReference (pool seed `seed`, queries seed + 1).
void check_tc_decode(const TcCase& t, std::uint64_t seed, bool negative_scales = false) {
  const std::vector<std::int32_t> lens = {1, 33, 130, 16, 700};
  const DecodePlan plans[] = {DecodePlan{}, DecodePlan{5, 37}, DecodePlan{40, 64}};
  {
    SCOPED_TRACE(name(t) + (negative_scales ? "/negative-scales" : ""));
    Pool p = make_pool(t.c, lens, seed++, t.block_size, t.kv_heads * t.group, t.kv_heads, false,
                       negative_scales);
    // The reference's view: with a bad last block, the last sequence ends where that block starts.
    std::vector<std::int32_t> ref_lens = p.lens;
    std::vector<std::int32_t> table = p.table;
    if (t.bad_last_block) {
      const std::int32_t len = p.lens.back();
      const std::int32_t last = (len - 1) / t.block_size;
      ASSERT_GT(last, 0);
      table[(p.lens.size() - 1) * static_cast<std::size_t>(p.max_blocks) +
            static_cast<std::size_t>(last)] =
          t.bad_id < 0 ? t.bad_id : static_cast<std::int32_t>(p.layout.num_blocks) + t.bad_id - 1;
      ref_lens.back() = last * t.block_size;
    }
    const DeviceBuffer dtable = testing::upload(table), dlens = testing::upload(p.lens);
    std::mt19937_64 rng(seed++);
    std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
    const auto dim = static_cast<std::size_t>(t.c.head_dim);
    std::vector<std::uint16_t> q(p.lens.size() * static_cast<std::size_t>(p.q_heads) * dim);
    for (auto& x : q) x = float_to_dtype_bits(t.dtype, unit(rng));
    const DeviceBuffer dq = testing::upload(q);

    PagedDecodeParams d;
    static_cast<PagedKVParams&>(d) =
        kv_params(p, p.k.get(), p.v.get(), dtable.get<std::int32_t>(), dlens.get<std::int32_t>());
    d.dtype = t.dtype;
    d.logits_soft_cap = t.soft_cap;
    d.window_size = t.window;
    d.q = dq.get();
    PagedDecodeParams hd = d;
    static_cast<PagedKVParams&>(hd) =
        kv_params(p, p.host_k.data(), p.host_v.data(), p.table.data(), ref_lens.data());
    hd.dtype = t.dtype;
    hd.logits_soft_cap = t.soft_cap;
    hd.window_size = t.window;
    hd.q = q.data();
    const std::vector<double> ref = reference_paged_decode_attention_f64(hd);

    EXPECT_TRUE(decode_kernel_runs(d, DecodeKernel::kTensorCoreFp8));
    EXPECT_TRUE(decode_kernel_runs(d, DecodeKernel::kTensorCoreFp8Direct));
    EXPECT_FALSE(decode_kernel_runs(d, DecodeKernel::kTensorCore));
    for (const DecodeKernel kernel : {DecodeKernel::kTensorCore, DecodeKernel::kTensorCoreFp8,
                                      DecodeKernel::kTensorCoreFp8Direct}) {
      for (const DecodePlan& plan : plans) {
        SCOPED_TRACE(std::string(kernel == DecodeKernel::kTensorCoreFp8         ? "tc-fp8"
                                 : kernel == DecodeKernel::kTensorCoreFp8Direct ? "tc-fp8-direct"
                                                                                : "default") +
                     " plan " + std::to_string(plan.num_splits) + "x" +
                     std::to_string(plan.kv_chunk_size));
        const std::size_t ws_bytes =
            plan.split_kv() ? decode_workspace_bytes(plan, d.num_seqs, d.num_q_heads, t.c.head_dim)
                            : 0;
        DeviceBuffer ws(std::max<std::size_t>(ws_bytes, 16));  // poisoned: NaN partials
        DeviceBuffer dout(q.size() * 2);                       // poisoned: NaN outputs
        d.out = dout.get();
        PAGEDKV_CUDA_CHECK(paged_decode_attention(d, plan, plan.split_kv() ? ws.get() : nullptr,
                                                  ws_bytes, nullptr, kernel));
        PAGEDKV_CUDA_CHECK(cudaDeviceSynchronize());
        const auto got = testing::download<std::uint16_t>(dout.get(), q.size());
        EXPECT_LE(worst_row_error(got, ref, dim, t.dtype), 1e-2);
      }
    }
  }
}

TEST_F(CudaFp8, TensorCoreDecodeMatchesTheReference) {
  std::uint64_t seed = 10;
  for (const TcCase& t : kTcCases) {
    check_tc_decode(t, seed);
    seed += 2;
  }
}

// Negative per-row scales (every V scale, the K scales of odd slots): the tensor-core kernels
// divide the V scales by R, the largest seen so far; taken as the largest signed scale, R stayed
// 0 while every V scale was negative and the rows came out 0 (or lost those keys' values).
TEST_F(CudaFp8, TensorCoreDecodeNegativeScales) {
  std::uint64_t seed = 90;
  for (const TcCase& t : kTcCases) {
    if (t.c.mode != KVScaleMode::kPerTokenHead) continue;
    check_tc_decode(t, seed, true);
    seed += 2;
  }
}

// ExtendKernel::kFa2Fp8 (kernels/extend_attention_fa2_fp8.cu) beside the default path (the FP8
// CUDA-core kernel, which ignores the plan), each without a split over keys, with 3 forced splits
// and with the planner's plan, over kTcCases (both FP8 types and scale modes, NHD / HND, fp16 /
// bf16 q and out, head_dim 64 / 128 / 256, GQA groups 1 to 16, block sizes 1 to 256, soft-cap,
// sliding window, block ids outside the pool). New tokens per sequence: 1 (decode-like), 20 of 33,
// all 130 (no prefix), 5 of 16 and 300 of 700 (several query tiles, a long prefix). Every output
// row is compared with the CPU reference over the same FP8 cache (1e-2), and the log-sum-exp too.
// With a bad last block the FP8 kernels skip its keys: the last sequence's new tokens before that
// block keep the reference's rows; those in it see exactly the keys before it, i.e. decode
// attention over the sequence cut at the block's start (these cases have no window or soft-cap).
// What a broken piece does: a wrong conversion, swizzle or copy map, a dropped K or V scale, a V
// scale applied to the softmax sum, or a missed R rescale moves whole rows far past 1e-2; a wrong
// split or merge breaks the split plans only; a key mask not applied breaks the bad-block rows.
// kFa2Fp8's log-sum-exp: absolute, on natural-log values of order 1..10. Its scores are exact
// FP8 values times fp32 scales (no 16-bit rounding before the softmax), so it agrees with the
// reference far more closely than its output rows do; tight enough that one key left unmasked
// among 700 (a sum larger by about 1 / 700) fails. The CUDA-core FP8 kernel keeps the FP8 tests'
// relative 1e-3.
constexpr double kTcLseTolerance = 2e-4;

// One case: kFa2 and kFa2Fp8 with 1 and 3 splits and, with `planned_too`, the planner's plan.
// The V rows grow along each sequence (make_pool's growing_v), so the R of kFa2Fp8 (the largest
// V scale seen) grows tile after tile: an accumulator not rescaled when it grows is off by up
// to 2^10.
// q_lens: the new tokens of the five sequences (of 1, 33, 130, 16 and 700 tokens).
void check_tc_extend(const TcCase& t, std::uint64_t seed, bool planned_too,
                     const std::vector<std::int32_t>& q_lens = {1, 20, 130, 5, 300},
                     bool negative_scales = false) {
  SCOPED_TRACE(name(t) + (negative_scales ? "/negative-scales" : ""));
  const std::vector<std::int32_t> lens = {1, 33, 130, 16, 700};
  std::vector<std::int32_t> indptr = {0};
  for (const std::int32_t n : q_lens) indptr.push_back(indptr.back() + n);
  const std::int32_t max_q_len = *std::max_element(q_lens.begin(), q_lens.end());
  Pool p = make_pool(t.c, lens, seed++, t.block_size, t.kv_heads * t.group, t.kv_heads, true,
                     negative_scales);
  std::vector<std::int32_t> table = p.table;
  std::int32_t cut = lens.back();  // keys the last sequence's tokens can see at most
  if (t.bad_last_block) {
    ASSERT_EQ(t.window, 0);
    ASSERT_EQ(t.soft_cap, 0.0f);
    const std::int32_t last = (lens.back() - 1) / t.block_size;
    ASSERT_GT(last, 0);
    table[(lens.size() - 1) * static_cast<std::size_t>(p.max_blocks) +
          static_cast<std::size_t>(last)] =
        t.bad_id < 0 ? t.bad_id : static_cast<std::int32_t>(p.layout.num_blocks) + t.bad_id - 1;
    cut = last * t.block_size;
  }
  const DeviceBuffer dtable = testing::upload(table), dlens = testing::upload(p.lens),
                     dindptr = testing::upload(indptr);
  std::mt19937_64 rng(seed++);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  const auto dim = static_cast<std::size_t>(t.c.head_dim);
  const std::size_t row = static_cast<std::size_t>(p.q_heads) * dim;  // one token's heads
  std::vector<std::uint16_t> q(static_cast<std::size_t>(indptr.back()) * row);
  for (auto& x : q) x = float_to_dtype_bits(t.dtype, unit(rng));
  const DeviceBuffer dq = testing::upload(q);

  PagedExtendParams he;
  static_cast<PagedKVParams&>(he) =
      kv_params(p, p.host_k.data(), p.host_v.data(), p.table.data(), p.lens.data());
  he.dtype = t.dtype;
  he.logits_soft_cap = t.soft_cap;
  he.window_size = t.window;
  he.q_indptr = indptr.data();
  he.max_q_len = max_q_len;
  he.q = q.data();
  ExtendReference ref = reference_paged_extend_attention_f64(he);
  if (t.bad_last_block) {
    // The last sequence's tokens at positions >= cut see exactly keys [0, cut): each is the one
    // new token of a sequence of `cut` tokens (the last one's table row), output and lse.
    const std::int32_t seq = static_cast<std::int32_t>(lens.size()) - 1;
    const std::int32_t n = lens.back() - std::max(cut, lens.back() - q_lens.back());
    const auto row0 = static_cast<std::size_t>(indptr[static_cast<std::size_t>(seq) + 1] - n);
    std::vector<std::int32_t> cut_table, cut_lens(static_cast<std::size_t>(n), cut), cut_indptr;
    for (std::int32_t i = 0; i < n; ++i) {
      cut_table.insert(cut_table.end(),
                       p.table.begin() + static_cast<std::ptrdiff_t>(seq) * p.max_blocks,
                       p.table.begin() + static_cast<std::ptrdiff_t>(seq + 1) * p.max_blocks);
      cut_indptr.push_back(i);
    }
    cut_indptr.push_back(n);
    PagedExtendParams cut_params = he;
    cut_params.num_seqs = n;
    cut_params.block_table = cut_table.data();
    cut_params.seq_lens = cut_lens.data();
    cut_params.q_indptr = cut_indptr.data();
    cut_params.max_q_len = 1;
    cut_params.q = q.data() + row0 * row;
    const ExtendReference cut_ref = reference_paged_extend_attention_f64(cut_params);
    std::copy(cut_ref.out.begin(), cut_ref.out.end(),
              ref.out.begin() + static_cast<std::ptrdiff_t>(row0 * row));
    std::copy(
        cut_ref.lse.begin(), cut_ref.lse.end(),
        ref.lse.begin() + static_cast<std::ptrdiff_t>(row0 * static_cast<std::size_t>(p.q_heads)));
  }

  PagedExtendParams e;
  static_cast<PagedKVParams&>(e) =
      kv_params(p, p.k.get(), p.v.get(), dtable.get<std::int32_t>(), dlens.get<std::int32_t>());
  e.dtype = t.dtype;
  e.logits_soft_cap = t.soft_cap;
  e.window_size = t.window;
  e.q_indptr = dindptr.get<std::int32_t>();
  e.max_q_len = max_q_len;
  e.q = dq.get();
  DeviceBuffer dout(q.size() * 2);
  DeviceBuffer dlse(ref.lse.size() * sizeof(float));
  e.out = dout.get();  // (the planner validates the parameters: out must be set)
  e.lse = dlse.get<float>();
  ExtendSplitPlan planned;
  PAGEDKV_CUDA_CHECK(extend_split_plan_for_current_device(e, ExtendKernel::kFa2Fp8, &planned));
  EXPECT_TRUE(extend_kernel_runs(e, ExtendKernel::kFa2Fp8));
  EXPECT_FALSE(extend_kernel_runs(e, ExtendKernel::kFa2));
  std::vector<std::int32_t> split_counts = {1, 3};
  if (planned_too) split_counts.push_back(planned.num_splits);
  for (const ExtendKernel kernel : {ExtendKernel::kFa2, ExtendKernel::kFa2Fp8}) {
    const bool tc = kernel == ExtendKernel::kFa2Fp8;
    for (const std::int32_t splits : split_counts) {
      SCOPED_TRACE(std::string(tc ? "tc-fp8" : "default") + " splits " + std::to_string(splits));
      ExtendSplitPlan plan;
      plan.num_splits = splits;
      const std::size_t ws_bytes = tc ? extend_workspace_bytes(e, plan) : 0;
      DeviceBuffer ws(std::max<std::size_t>(ws_bytes, 16));            // poisoned: NaN partials
      PAGEDKV_CUDA_CHECK(cudaMemset(dout.get(), 0xff, dout.bytes()));  // NaN outputs
      PAGEDKV_CUDA_CHECK(cudaMemset(dlse.get(), 0xff, dlse.bytes()));
      PAGEDKV_CUDA_CHECK(paged_extend_attention(e, nullptr, kernel, plan,
                                                ws_bytes > 0 ? ws.get() : nullptr, ws_bytes));
      PAGEDKV_CUDA_CHECK(cudaDeviceSynchronize());
      const auto got = testing::download<std::uint16_t>(dout.get(), q.size());
      EXPECT_LE(worst_row_error(got, ref.out, dim, t.dtype), 1e-2);
      const auto lse = testing::download<float>(dlse.get(), ref.lse.size());
      for (std::size_t i = 0; i < lse.size(); ++i) {
        ASSERT_NEAR(lse[i], ref.lse[i], tc ? kTcLseTolerance : 1e-3 * (1 + std::abs(ref.lse[i])))
            << i;
      }
    }
  }
}

TEST_F(CudaFp8, TensorCoreExtendMatchesTheReference) {
  std::uint64_t seed = 50;
  for (const TcCase& t : kTcCases) {
    check_tc_extend(t, seed, true);
    seed += 2;
  }
}

// kFa2Fp8 over negative per-row scales (TensorCoreDecodeNegativeScales' cache), 1 and 3 splits.
TEST_F(CudaFp8, TensorCoreExtendNegativeScales) {
  std::uint64_t seed = 120;
  for (const TcCase& t : kTcCases) {
    if (t.c.mode != KVScaleMode::kPerTokenHead) continue;
    check_tc_extend(t, seed, false, {1, 20, 130, 5, 300}, true);
    seed += 2;
  }
}

// Three of those cases, 1 and 3 splits: for the racecheck and synccheck runs of scripts/gpu-check
// (per-row E4M3 bf16 at head_dim 128, per-tensor E5M2 HND with a window, per-row with a bad block
// at block size 1 and head_dim 64).
TEST_F(CudaFp8, TensorCoreExtendFewCases) {
  check_tc_extend(kTcCases[0], 80, false);
  check_tc_extend(kTcCases[4], 82, false);
  check_tc_extend(kTcCases[8], 84, false);
}

// Short prompts (a few draft tokens per sequence, as speculative decoding over an FP8 cache leaves
// to extend attention: the FP8 decode kernels take one query token): at most 64 rows, so one
// query tile of 128 (64 at head_dim 256) rows mostly padding; every case of kTcCases (group up to
// 16: at most 4 new tokens), 1 and 3 splits and the planner's (for such small grids, the cap of
// 16).
TEST_F(CudaFp8, TensorCoreExtendShortPrompts) {
  std::uint64_t seed = 90;
  for (const TcCase& t : kTcCases) {
    const std::int32_t n = std::min(4, 64 / t.group);
    check_tc_extend(t, seed, true, {1, n, n, 1, n});
    seed += 2;
  }
}

// kFa2Fp8 where its kernel does not run: a 16-bit cache runs kFa2 (same rows as kFa2, and a plan
// for kFa2's tiles), an FP8 layout with 8-byte strides runs the CUDA-core FP8 kernel (no
// workspace needed, whatever the plan); and on an FP8 cache the split plan's workspace is checked.
TEST_F(CudaFp8, TensorCoreExtendFallbacksAndWorkspace) {
  const Case c{KVDtype::kFp8E4M3, KVScaleMode::kPerTokenHead, false, 128};
  Pool p = make_pool(c, {300, 40}, 61, 16, 8, 2);
  const DeviceBuffer table = testing::upload(p.table), lens = testing::upload(p.lens);
  const std::vector<std::int32_t> indptr = {0, 100, 140};
  const DeviceBuffer dindptr = testing::upload(indptr);
  std::mt19937_64 rng(62);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::vector<std::uint16_t> q(140 * 8 * 128);
  for (auto& x : q) x = float_to_bf16_bits(unit(rng));
  const DeviceBuffer dq = testing::upload(q);
  DeviceBuffer dout(q.size() * 2);
  PagedExtendParams e;
  static_cast<PagedKVParams&>(e) =
      kv_params(p, p.k.get(), p.v.get(), table.get<std::int32_t>(), lens.get<std::int32_t>());
  e.q_indptr = dindptr.get<std::int32_t>();
  e.max_q_len = 100;
  e.q = dq.get();
  e.out = dout.get();
  ExtendSplitPlan three;
  three.num_splits = 3;
  const std::size_t ws_bytes = extend_workspace_bytes(e, three);
  ASSERT_GT(ws_bytes, 0u);
  // The FP8 kernel with a split needs its workspace; the default FP8 path does not.
  EXPECT_THROW((void)paged_extend_attention(e, nullptr, ExtendKernel::kFa2Fp8, three, nullptr, 0),
               Error);
  DeviceBuffer ws(ws_bytes);
  EXPECT_THROW((void)paged_extend_attention(e, nullptr, ExtendKernel::kFa2Fp8, three, ws.get(),
                                            ws_bytes - 16),
               Error);
  PAGEDKV_CUDA_CHECK(paged_extend_attention(e, nullptr, ExtendKernel::kFa2, three, nullptr, 0));
  PAGEDKV_CUDA_CHECK(cudaDeviceSynchronize());

  // A 16-bit cache with kFa2Fp8: kFa2's rows exactly (the same kernel and plan).
  std::vector<std::uint16_t> k16(static_cast<std::size_t>(p.layout.plane_elements()));
  std::vector<std::uint16_t> v16(k16.size());
  for (auto& x : k16) x = float_to_bf16_bits(unit(rng));
  for (auto& x : v16) x = float_to_bf16_bits(unit(rng));
  const KVLayout dense = KVLayout::nhd(p.layout.num_blocks, 16, 2, 128);
  const DeviceBuffer dk16 = testing::upload(k16), dv16 = testing::upload(v16);
  PagedExtendParams b = e;
  b.quant = KVQuant{};
  b.layout = dense;
  b.k_cache = dk16.get();
  b.v_cache = dv16.get();
  EXPECT_FALSE(extend_kernel_runs(b, ExtendKernel::kFa2Fp8));
  ExtendSplitPlan fa2_plan, fp8_plan;
  PAGEDKV_CUDA_CHECK(extend_split_plan_for_current_device(b, ExtendKernel::kFa2, &fa2_plan));
  PAGEDKV_CUDA_CHECK(extend_split_plan_for_current_device(b, ExtendKernel::kFa2Fp8, &fp8_plan));
  EXPECT_EQ(fa2_plan.num_splits, fp8_plan.num_splits);
  DeviceBuffer out_a(q.size() * 2), out_b(q.size() * 2);
  b.out = out_a.get();
  PAGEDKV_CUDA_CHECK(paged_extend_attention(b, nullptr, ExtendKernel::kFa2, three, ws.get(),
                                            extend_workspace_bytes(b, three)));
  b.out = out_b.get();
  PAGEDKV_CUDA_CHECK(paged_extend_attention(b, nullptr, ExtendKernel::kFa2Fp8, three, ws.get(),
                                            extend_workspace_bytes(b, three)));
  PAGEDKV_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(testing::download<std::uint16_t>(out_a.get(), q.size()),
            testing::download<std::uint16_t>(out_b.get(), q.size()));

  // An FP8 layout with 8-byte strides: the CUDA-core FP8 kernel, which ignores the plan.
  PagedExtendParams padded = e;
  padded.quant.mode = KVScaleMode::kPerTensor;
  padded.layout = KVLayout::nhd(p.layout.num_blocks, 16, 2, 128);
  padded.layout.stride_head = 136;
  padded.layout.stride_token = 272;
  padded.layout.stride_block = 16 * 272;
  ASSERT_NO_THROW(padded.layout.validate());
  EXPECT_FALSE(extend_kernel_runs(padded, ExtendKernel::kFa2Fp8));
  ExtendSplitPlan padded_plan;
  PAGEDKV_CUDA_CHECK(
      extend_split_plan_for_current_device(padded, ExtendKernel::kFa2Fp8, &padded_plan));
  EXPECT_EQ(padded_plan.num_splits, 1);
}

// The plan the bench and an engine would use: plan_paged_decode with the options for
// kTensorCoreFp8 and kTensorCoreFp8Direct (each kernel's occupancy), on a batch of long sequences,
// one per KV-head count; and a layout the kernels do not take (8-byte strides) falls back to the
// FP8 CUDA-core kernel and still matches (asked of either).
TEST_F(CudaFp8, TensorCoreDecodeWithThePlannerAndFallback) {
  const Case c{KVDtype::kFp8E4M3, KVScaleMode::kPerTokenHead, false, 128};
  Pool p = make_pool(c, {3000, 5, 257}, 31, 16, 8, 2);
  const DeviceBuffer table = testing::upload(p.table), lens = testing::upload(p.lens);
  std::mt19937_64 rng(32);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  const auto dim = static_cast<std::size_t>(c.head_dim);
  std::vector<std::uint16_t> q(p.lens.size() * static_cast<std::size_t>(p.q_heads) * dim);
  for (auto& x : q) x = float_to_bf16_bits(unit(rng));
  const DeviceBuffer dq = testing::upload(q);
  PagedDecodeParams d;
  static_cast<PagedKVParams&>(d) =
      kv_params(p, p.k.get(), p.v.get(), table.get<std::int32_t>(), lens.get<std::int32_t>());
  d.q = dq.get();
  PagedDecodeParams hd = d;
  static_cast<PagedKVParams&>(hd) =
      kv_params(p, p.host_k.data(), p.host_v.data(), p.table.data(), p.lens.data());
  hd.q = q.data();
  const std::vector<double> ref = reference_paged_decode_attention_f64(hd);

  for (const DecodeKernel kernel :
       {DecodeKernel::kTensorCoreFp8, DecodeKernel::kTensorCoreFp8Direct}) {
    SCOPED_TRACE(static_cast<int>(kernel));
    DecodePlanOptions options;
    PAGEDKV_CUDA_CHECK(
        decode_plan_options_for_current_device(d.dtype, c.head_dim, &options, kernel));
    EXPECT_GT(options.ctas_per_sm, 0);
    const DecodePlan plan = plan_paged_decode(p.lens, p.kv_heads, options);
    EXPECT_TRUE(plan.split_kv()) << "a 3,000-token sequence on " << options.num_sms << " SMs";
    const std::size_t ws_bytes =
        plan.split_kv() ? decode_workspace_bytes(plan, d.num_seqs, d.num_q_heads, c.head_dim) : 0;
    DeviceBuffer ws(std::max<std::size_t>(ws_bytes, 16));
    DeviceBuffer dout(q.size() * 2);
    d.out = dout.get();
    PAGEDKV_CUDA_CHECK(paged_decode_attention(d, plan, ws.get(), ws_bytes, nullptr, kernel));
    PAGEDKV_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_LE(worst_row_error(testing::download<std::uint16_t>(dout.get(), q.size()), ref, dim),
              1e-2);
  }

  // The same cache seen through a layout with 8-byte-multiple strides: a second pool built in
  // that layout (NHD with each token row padded by 8 bytes is not expressible with scales, so
  // per-tensor codes with stride_head = head_dim + 8).
  const Case pc{KVDtype::kFp8E4M3, KVScaleMode::kPerTensor, false, 64};
  Pool pp = make_pool(pc, {200, 9}, 33, 16, 4, 2);
  // Re-lay the host planes with stride_head = 72, stride_token = 144, stride_block = 16 x 144.
  KVLayout padded = pp.layout;
  padded.stride_head = 72;
  padded.stride_token = 144;
  padded.stride_block = 16 * 144;
  ASSERT_NO_THROW(padded.validate());
  std::vector<std::uint8_t> hk(static_cast<std::size_t>(padded.plane_elements()), 0),
      hv(hk.size(), 0);
  for (std::int64_t b = 0; b < pp.layout.num_blocks; ++b) {
    for (std::int32_t tok = 0; tok < pp.layout.block_size; ++tok) {
      for (std::int32_t h = 0; h < pp.layout.num_kv_heads; ++h) {
        for (std::int32_t i = 0; i < pc.head_dim; ++i) {
          hk[static_cast<std::size_t>(padded.offset(b, tok, h) + i)] =
              pp.host_k[static_cast<std::size_t>(pp.layout.offset(b, tok, h) + i)];
          hv[static_cast<std::size_t>(padded.offset(b, tok, h) + i)] =
              pp.host_v[static_cast<std::size_t>(pp.layout.offset(b, tok, h) + i)];
        }
      }
    }
  }
  const DeviceBuffer dk = testing::upload(hk), dv = testing::upload(hv);
  const DeviceBuffer ptable = testing::upload(pp.table), plens = testing::upload(pp.lens);
  std::vector<std::uint16_t> pq(pp.lens.size() * static_cast<std::size_t>(pp.q_heads) * 64);
  for (auto& x : pq) x = float_to_bf16_bits(unit(rng));
  const DeviceBuffer dpq = testing::upload(pq);
  PagedDecodeParams pd;
  static_cast<PagedKVParams&>(pd) =
      kv_params(pp, dk.get(), dv.get(), ptable.get<std::int32_t>(), plens.get<std::int32_t>());
  pd.layout = padded;
  pd.q = dpq.get();
  EXPECT_FALSE(decode_kernel_runs(pd, DecodeKernel::kTensorCoreFp8));
  EXPECT_FALSE(decode_kernel_runs(pd, DecodeKernel::kTensorCoreFp8Direct));
  PagedDecodeParams phd = pd;
  static_cast<PagedKVParams&>(phd) =
      kv_params(pp, hk.data(), hv.data(), pp.table.data(), pp.lens.data());
  phd.layout = padded;
  phd.q = pq.data();
  const std::vector<double> pref = reference_paged_decode_attention_f64(phd);
  for (const DecodeKernel kernel :
       {DecodeKernel::kTensorCoreFp8, DecodeKernel::kTensorCoreFp8Direct}) {
    SCOPED_TRACE(static_cast<int>(kernel));
    DeviceBuffer pout(pq.size() * 2);  // poisoned: NaN outputs
    pd.out = pout.get();
    const DecodePlan split{4, 64};
    const std::size_t pws_bytes = decode_workspace_bytes(split, pd.num_seqs, pd.num_q_heads, 64);
    DeviceBuffer pws(pws_bytes);
    PAGEDKV_CUDA_CHECK(paged_decode_attention(pd, split, pws.get(), pws_bytes, nullptr, kernel));
    PAGEDKV_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_LE(worst_row_error(testing::download<std::uint16_t>(pout.get(), pq.size()), pref, 64),
              1e-2);
  }
}

}  // namespace
}  // namespace pagedkv
