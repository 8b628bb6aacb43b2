// FP8 KV cache on the CPU references (issue 36): kv_append quantizes exactly as fp8.hpp says and
// stores per-(token, head) scales where the layout says; decode and extend read FP8 exactly as the
// kernels dequantize (checked against an independent dequantize-then-attend computation) and stay
// within a stated FP8 error bound of the exact (fp64) attention on the unquantized values;
// copy_blocks, swap_blocks and the transfer executor move FP8 blocks, scales included, byte-exact.
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

#include "pagedkv/base/error.hpp"
#include "pagedkv/base/transfer_plan.hpp"
#include "pagedkv/device/fp8.hpp"
#include "pagedkv/device/kv_dtype.hpp"
#include "pagedkv/device/kv_layout.hpp"
#include "pagedkv/device/kv_quant.hpp"
#include "pagedkv/reference/cache_ops.hpp"
#include "pagedkv/reference/decode_attention.hpp"
#include "pagedkv/reference/extend_attention.hpp"
#include "pagedkv/reference/transfer.hpp"

namespace pagedkv {
namespace {

constexpr std::uint8_t kPoison = 0xa5;  // untouched cache bytes

struct Format {
  KVDtype dtype;
  KVScaleMode mode;
  bool hnd = false;
};

std::string name(const Format& f) {
  return std::string(to_string(f.dtype)) + "/" + std::string(to_string(f.mode)) +
         (f.hnd ? "/hnd" : "/nhd");
}

// Per-element bound on |dequantized - x| for the stored scale s (fp8.hpp's error bound).
double element_bound(KVDtype dtype, double x, double s) {
  const bool e4m3 = dtype == KVDtype::kFp8E4M3;
  const double rel = e4m3 ? 0x1p-4 : 0x1p-3;
  const double sub = (e4m3 ? 0x1p-10 : 0x1p-17) * s * (1 + 0x1p-18);
  return std::max(rel * std::abs(x), sub) + (s < 0x1p-100 ? 0x1p-149 : 0.0);
}

// A pool of `num_blocks` blocks holding `lens` sequences whose K / V rows are random bf16 values,
// written through reference_kv_append twice: into a bf16 cache (the exact values) and into the
// FP8 cache under test. Unused bytes of the FP8 planes hold kPoison.
struct Pools {
  Format format;
  std::int32_t heads = 2, q_heads = 4, dim = 64, block_size = 16;
  std::int64_t num_blocks = 0;
  std::vector<std::int32_t> lens;
  KVLayout layout16, layout8;
  std::vector<std::uint16_t> k16, v16;
  std::vector<std::uint8_t> k8, v8;
  std::vector<std::vector<std::int32_t>> blocks;  // per sequence
  std::vector<std::int32_t> table;
  std::int32_t max_blocks = 0;
  std::vector<std::uint16_t> key, value;  // [tokens, heads, dim] bf16, all sequences' tokens
  std::vector<std::int64_t> slots;
  float k_scale = 0.05f, v_scale = 0.02f;  // per tensor

  KVQuant quant() const {
    KVQuant q;
    q.mode = format.mode;
    q.dtype = format.dtype;
    q.k_scale = k_scale;
    q.v_scale = v_scale;
    return q;
  }
};

Pools make_pools(const Format& format, std::vector<std::int32_t> lens, std::uint64_t seed,
                 float amplitude = 4.0f) {
  std::mt19937_64 rng(seed);
  Pools p;
  p.format = format;
  p.lens = std::move(lens);
  for (const std::int32_t len : p.lens) {
    p.max_blocks = std::max(p.max_blocks, (len + p.block_size - 1) / p.block_size);
    p.num_blocks += (len + p.block_size - 1) / p.block_size;
  }
  p.num_blocks += 3;  // unused blocks
  const bool scaled = format.mode == KVScaleMode::kPerTokenHead;
  p.layout16 = format.hnd ? KVLayout::hnd(p.num_blocks, p.block_size, p.heads, p.dim)
                          : KVLayout::nhd(p.num_blocks, p.block_size, p.heads, p.dim);
  p.layout8 = scaled
                  ? (format.hnd ? KVLayout::hnd_scaled(p.num_blocks, p.block_size, p.heads, p.dim)
                                : KVLayout::nhd_scaled(p.num_blocks, p.block_size, p.heads, p.dim))
                  : p.layout16;
  p.k16.assign(static_cast<std::size_t>(p.layout16.plane_elements()), 0x7fc0);
  p.v16 = p.k16;
  p.k8.assign(static_cast<std::size_t>(p.layout8.plane_elements()), kPoison);
  p.v8 = p.k8;
  // Blocks handed out in shuffled order.
  std::vector<std::int32_t> ids(static_cast<std::size_t>(p.num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::size_t next = 0;
  p.table.assign(p.lens.size() * static_cast<std::size_t>(p.max_blocks), 0);
  // Row magnitudes vary over orders of magnitude so per-row scales matter.
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_int_distribution<int> octave(-6, 2);
  for (std::size_t s = 0; s < p.lens.size(); ++s) {
    const std::int32_t nb = (p.lens[s] + p.block_size - 1) / p.block_size;
    p.blocks.emplace_back();
    for (std::int32_t b = 0; b < nb; ++b) {
      p.blocks[s].push_back(ids[next++]);
      p.table[s * static_cast<std::size_t>(p.max_blocks) + static_cast<std::size_t>(b)] =
          p.blocks[s].back();
    }
    for (std::int32_t t = 0; t < p.lens[s]; ++t) {
      p.slots.push_back(std::int64_t{p.blocks[s][static_cast<std::size_t>(t / p.block_size)]} *
                            p.block_size +
                        t % p.block_size);
      for (std::int32_t h = 0; h < p.heads; ++h) {
        const float kmag = amplitude * std::ldexp(1.0f, octave(rng));
        const float vmag = amplitude * std::ldexp(1.0f, octave(rng));
        for (std::int32_t d = 0; d < p.dim; ++d) {
          p.key.push_back(float_to_bf16_bits(kmag * unit(rng)));
          p.value.push_back(float_to_bf16_bits(vmag * unit(rng)));
        }
      }
    }
  }
  KVAppendParams a;
  a.dtype = KVDtype::kBFloat16;
  a.num_tokens = static_cast<std::int64_t>(p.slots.size());
  a.key = p.key.data();
  a.value = p.value.data();
  a.slot_mapping = p.slots.data();
  a.k_cache = p.k16.data();
  a.v_cache = p.v16.data();
  a.layout = p.layout16;
  reference_kv_append(a);
  a.quant = p.quant();
  a.k_cache = p.k8.data();
  a.v_cache = p.v8.data();
  a.layout = p.layout8;
  reference_kv_append(a);
  return p;
}

// Decode parameters over one of the two caches.
PagedDecodeParams decode_params(const Pools& p, bool fp8, const std::vector<std::uint16_t>& q) {
  PagedDecodeParams d;
  d.dtype = KVDtype::kBFloat16;
  d.num_seqs = static_cast<std::int32_t>(p.lens.size());
  d.num_q_heads = p.q_heads;
  d.q = q.data();
  d.k_cache = fp8 ? static_cast<const void*>(p.k8.data()) : p.k16.data();
  d.v_cache = fp8 ? static_cast<const void*>(p.v8.data()) : p.v16.data();
  d.layout = fp8 ? p.layout8 : p.layout16;
  if (fp8) d.quant = p.quant();
  d.block_table = p.table.data();
  d.max_blocks_per_seq = p.max_blocks;
  d.seq_lens = p.lens.data();
  d.sm_scale = 1.0f / std::sqrt(static_cast<float>(p.dim));
  return d;
}

std::vector<std::uint16_t> random_q(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::vector<std::uint16_t> q(n);
  for (auto& x : q) x = float_to_bf16_bits(unit(rng));
  return q;
}

// The row scale the test derives on its own from the exact bf16 row (the same rule as
// fp8.hpp: RZ(amax / max) floored at FLT_MIN).
float own_row_scale(KVDtype dtype, const std::uint16_t* row, std::int32_t n) {
  float amax = 0;
  for (std::int32_t d = 0; d < n; ++d) {
    const float x = std::abs(bf16_bits_to_float(row[d]));
    if (std::isfinite(x)) amax = std::max(amax, x);  // NaN and +-inf do not count
  }
  if (amax == 0) return 1.0f;
  const double max = dtype == KVDtype::kFp8E4M3 ? 448.0 : 57344.0;
  // Largest float s with s * max <= amax (exact in double).
  float s = static_cast<float>(static_cast<double>(amax) / max);
  while (static_cast<double>(s) * max > amax) s = std::nextafter(s, 0.0f);
  return std::max(s, std::numeric_limits<float>::min());
}

TEST(Fp8KvAppend, CodesAndScalesAreExactlyFp8hpp) {
  for (const Format f : {Format{KVDtype::kFp8E4M3, KVScaleMode::kPerTokenHead},
                         Format{KVDtype::kFp8E5M2, KVScaleMode::kPerTokenHead, true},
                         Format{KVDtype::kFp8E4M3, KVScaleMode::kPerTensor, true},
                         Format{KVDtype::kFp8E5M2, KVScaleMode::kPerTensor}}) {
    SCOPED_TRACE(name(f));
    const Pools p = make_pools(f, {37, 16, 1}, 11);
    const Fp8Format format = f.dtype == KVDtype::kFp8E4M3 ? Fp8Format::kE4M3 : Fp8Format::kE5M2;
    std::vector<bool> written(p.k8.size(), false);
    for (std::size_t i = 0; i < p.slots.size(); ++i) {
      const std::int64_t block = p.slots[i] / p.block_size, t = p.slots[i] % p.block_size;
      for (std::int32_t h = 0; h < p.heads; ++h) {
        for (const bool v : {false, true}) {
          const std::uint16_t* row =
              (v ? p.value : p.key).data() + (i * p.heads + static_cast<std::size_t>(h)) * p.dim;
          const auto& plane = v ? p.v8 : p.k8;
          float scale = v ? p.v_scale : p.k_scale;
          if (f.mode == KVScaleMode::kPerTokenHead) {
            const auto at = static_cast<std::size_t>(p.layout8.scale_byte_offset(block, t, h));
            float stored;
            std::memcpy(&stored, plane.data() + at, sizeof stored);
            ASSERT_EQ(stored, own_row_scale(f.dtype, row, p.dim)) << "row " << i << " head " << h;
            scale = stored;
            for (std::size_t b = 0; b < 4; ++b) written[at + b] = true;
          }
          const auto at = static_cast<std::size_t>(p.layout8.offset(block, t, h));
          for (std::int32_t d = 0; d < p.dim; ++d) {
            const float x = bf16_bits_to_float(row[d]);
            ASSERT_EQ(plane[at + static_cast<std::size_t>(d)], float_to_fp8_bits(format, x / scale))
                << "row " << i << " head " << h << " dim " << d;
            written[at + static_cast<std::size_t>(d)] = true;
          }
        }
      }
    }
    // Nothing else was written (K plane; the V plane has the same slots).
    for (std::size_t b = 0; b < p.k8.size(); ++b) {
      if (!written[b]) {
        ASSERT_EQ(p.k8[b], kPoison) << "byte " << b;
      }
    }
  }
}

TEST(Fp8KvAppend, SaturatesKeepsNaNAndHandlesZeroRows) {
  const std::int32_t dim = 8;
  KVLayout layout = KVLayout::nhd_scaled(2, 4, 1, dim);
  std::vector<std::uint8_t> k(static_cast<std::size_t>(layout.plane_elements()), kPoison), v = k;
  const float inf = std::numeric_limits<float>::infinity();
  // Row 0: NaN, +-inf, a huge value and small ones; row 1: all zero (scale 1); row 2: -0 and a
  // value that needs the FLT_MIN floor.
  const std::vector<float> rows = {
      std::nanf(""), inf,    -inf, 3e38f, 1.0f, -2.0f, 0.0f, -0.0f, 0, 0, 0, 0, 0, 0, 0, 0,
      -0.0f,         1e-40f, 0,    0,     0,    0,     0,    0};
  std::vector<std::uint16_t> bits;
  for (const float x : rows) bits.push_back(float_to_bf16_bits(x));
  const std::vector<std::int64_t> slots = {1, 4, 6};
  KVAppendParams a;
  a.dtype = KVDtype::kBFloat16;
  a.quant.mode = KVScaleMode::kPerTokenHead;
  a.quant.dtype = KVDtype::kFp8E4M3;
  a.num_tokens = 3;
  a.key = bits.data();
  a.value = bits.data();
  a.slot_mapping = slots.data();
  a.k_cache = k.data();
  a.v_cache = v.data();
  a.layout = layout;
  reference_kv_append(a);
  const auto scale_at = [&](std::int64_t slot) {
    float s;
    std::memcpy(&s, k.data() + layout.scale_byte_offset(slot / 4, slot % 4, 0), 4);
    return s;
  };
  const auto code = [&](std::int64_t slot, int d) {
    return k[static_cast<std::size_t>(layout.offset(slot / 4, slot % 4, 0) + d)];
  };
  // amax skips NaN and inf: bf16(3e38).
  EXPECT_EQ(scale_at(1), own_row_scale(KVDtype::kFp8E4M3, bits.data(), dim));
  EXPECT_EQ(code(1, 0), kFp8CanonicalNaNCode);
  EXPECT_EQ(code(1, 1), 0x7e);  // +inf saturates
  EXPECT_EQ(code(1, 2), 0xfe);  // -inf saturates
  EXPECT_EQ(code(1, 3), 0x7e);  // the row's amax gets the largest code
  EXPECT_EQ(code(1, 7), 0x80);  // -0 keeps its sign
  EXPECT_EQ(scale_at(4), 1.0f);
  for (int d = 0; d < dim; ++d) EXPECT_EQ(code(4, d), 0x00);
  EXPECT_EQ(scale_at(6), std::numeric_limits<float>::min());
  EXPECT_EQ(code(6, 0), 0x80);
  // Per tensor: a value past max_finite x k_scale saturates.
  KVLayout plain = KVLayout::nhd(2, 4, 1, dim);
  std::vector<std::uint8_t> kp(static_cast<std::size_t>(plain.plane_elements()), kPoison), vp = kp;
  a.quant.mode = KVScaleMode::kPerTensor;
  a.quant.k_scale = 0.5f;
  a.quant.v_scale = 2.0f;
  a.layout = plain;
  a.k_cache = kp.data();
  a.v_cache = vp.data();
  reference_kv_append(a);
  EXPECT_EQ(kp[static_cast<std::size_t>(plain.offset(0, 1, 0) + 3)], 0x7e);  // 3e38 / 0.5
  EXPECT_EQ(kp[static_cast<std::size_t>(plain.offset(0, 1, 0) + 4)],
            float_to_fp8_e4m3_bits(2.0f));  // 1 / 0.5
  EXPECT_EQ(vp[static_cast<std::size_t>(plain.offset(0, 1, 0) + 4)],
            float_to_fp8_e4m3_bits(0.5f));  // 1 / 2
}

TEST(Fp8KvAppend, RejectsBadFormats) {
  KVLayout plain = KVLayout::nhd(2, 4, 1, 8);
  KVLayout scaled = KVLayout::nhd_scaled(2, 4, 1, 8);
  std::vector<std::uint8_t> buf(1024);
  std::vector<std::uint16_t> row(8);
  const std::int64_t slot = 0;
  const auto params = [&](KVScaleMode mode, KVDtype fp8, const KVLayout& layout) {
    KVAppendParams a;
    a.num_tokens = 1;
    a.key = row.data();
    a.value = row.data();
    a.slot_mapping = &slot;
    a.k_cache = buf.data();
    a.v_cache = buf.data() + 512;
    a.layout = layout;
    a.quant.mode = mode;
    a.quant.dtype = fp8;
    return a;
  };
  const auto rejects = [](KVAppendParams a, const char* what) {
    try {
      reference_kv_append(a);
      ADD_FAILURE() << "accepted " << what;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << what;
    }
  };
  rejects(params(KVScaleMode::kPerTokenHead, KVDtype::kBFloat16, scaled), "bf16 codes");
  rejects(params(KVScaleMode::kPerTokenHead, KVDtype::kFp8E4M3, plain), "no scale plane");
  rejects(params(KVScaleMode::kPerTensor, KVDtype::kFp8E4M3, scaled), "per tensor + scales");
  rejects(params(KVScaleMode::kNone, KVDtype::kFp8E4M3, scaled), "bf16 with scales");
  for (const float bad : {0.0f, -1.0f, std::nanf(""), std::numeric_limits<float>::infinity()}) {
    KVAppendParams a = params(KVScaleMode::kPerTensor, KVDtype::kFp8E5M2, plain);
    a.quant.v_scale = bad;
    rejects(a, "bad v_scale");
  }
  KVAppendParams a = params(KVScaleMode::kPerTensor, KVDtype::kFp8E5M2, plain);
  a.dtype = KVDtype::kFp8E4M3;
  rejects(a, "FP8 inputs");
  a = params(static_cast<KVScaleMode>(7), KVDtype::kFp8E5M2, plain);
  rejects(a, "unknown mode");
  reference_kv_append(params(KVScaleMode::kPerTensor, KVDtype::kFp8E4M3, plain));  // fine
}

// Attention over the test's own dequantized values, in double (an independent reader).
std::vector<double> naive_decode(const Pools& p, const std::vector<std::uint16_t>& q, bool fp8,
                                 std::vector<double>* bounds) {
  const std::int32_t group = p.q_heads / p.heads;
  const double sm = 1.0 / std::sqrt(static_cast<double>(static_cast<float>(p.dim)));
  const double sm_f = static_cast<double>(1.0f / std::sqrt(static_cast<float>(p.dim)));
  (void)sm;
  std::vector<double> out;
  const Fp8Format format =
      p.format.dtype == KVDtype::kFp8E4M3 ? Fp8Format::kE4M3 : Fp8Format::kE5M2;
  std::size_t first_token = 0;
  for (std::size_t s = 0; s < p.lens.size(); ++s) {
    const auto len = static_cast<std::size_t>(p.lens[s]);
    for (std::int32_t h = 0; h < p.q_heads; ++h) {
      const std::int32_t kv = h / group;
      std::vector<std::vector<double>> K(len), V(len);
      std::vector<double> kerr(len), vmax_err(len);
      double vmax = 0, max_verr = 0, max_delta = 0;
      const std::uint16_t* qrow = q.data() + (s * p.q_heads + static_cast<std::size_t>(h)) * p.dim;
      for (std::size_t t = 0; t < len; ++t) {
        const std::size_t row =
            ((first_token + t) * p.heads + static_cast<std::size_t>(kv)) * p.dim;
        const std::uint16_t* kr = p.key.data() + row;
        const std::uint16_t* vr = p.value.data() + row;
        const float ks = p.format.mode == KVScaleMode::kPerTokenHead
                             ? own_row_scale(p.format.dtype, kr, p.dim)
                             : p.k_scale;
        const float vs = p.format.mode == KVScaleMode::kPerTokenHead
                             ? own_row_scale(p.format.dtype, vr, p.dim)
                             : p.v_scale;
        double delta = 0;
        for (std::int32_t d = 0; d < p.dim; ++d) {
          const float kx = bf16_bits_to_float(kr[d]), vx = bf16_bits_to_float(vr[d]);
          K[t].push_back(fp8 ? fp8_bits_to_float(format, float_to_fp8_bits(format, kx / ks)) * ks
                             : kx);
          V[t].push_back(fp8 ? fp8_bits_to_float(format, float_to_fp8_bits(format, vx / vs)) * vs
                             : vx);
          delta += std::abs(static_cast<double>(bf16_bits_to_float(qrow[d]))) *
                   element_bound(p.format.dtype, kx, ks);
          vmax = std::max(vmax, std::abs(static_cast<double>(vx)));
          max_verr = std::max(max_verr, element_bound(p.format.dtype, vx, vs));
        }
        max_delta = std::max(max_delta, sm_f * delta);
      }
      std::vector<double> logits(len);
      double m = -std::numeric_limits<double>::infinity();
      for (std::size_t t = 0; t < len; ++t) {
        double dot = 0;
        for (std::int32_t d = 0; d < p.dim; ++d) {
          dot +=
              static_cast<double>(bf16_bits_to_float(qrow[d])) * K[t][static_cast<std::size_t>(d)];
        }
        logits[t] = sm_f * dot;
        m = std::max(m, logits[t]);
      }
      double l = 0;
      std::vector<double> acc(static_cast<std::size_t>(p.dim), 0.0);
      for (std::size_t t = 0; t < len; ++t) {
        const double w = std::exp(logits[t] - m);
        l += w;
        for (std::int32_t d = 0; d < p.dim; ++d)
          acc[static_cast<std::size_t>(d)] += w * V[t][static_cast<std::size_t>(d)];
      }
      for (const double a : acc) out.push_back(a / l);
      // The FP8 error bound of this row: the V error, plus the softmax weights' change from the
      // K error (each logit moves by at most max_delta, so every weight by a factor within
      // exp(+-2 max_delta), and sum |w' - w| <= exp(2 max_delta) - 1) times max |v|.
      if (bounds != nullptr) {
        bounds->push_back(max_verr + std::expm1(2 * max_delta) * (vmax + max_verr) + 1e-12);
      }
    }
    first_token += len;
  }
  return out;
}

struct ErrorFigures {
  double worst_ratio = 0;     // max |fp8 - exact| / bound over rows
  double worst_rel_vmax = 0;  // max |fp8 - exact| / max |v| of the problem
};

ErrorFigures check_rows(const std::vector<double>& fp8, const std::vector<double>& exact,
                        const std::vector<double>& bounds, std::int32_t dim, double vmax) {
  ErrorFigures f;
  for (std::size_t r = 0; r < bounds.size(); ++r) {
    double worst = 0;
    for (std::int32_t d = 0; d < dim; ++d) {
      const std::size_t i = r * static_cast<std::size_t>(dim) + static_cast<std::size_t>(d);
      worst = std::max(worst, std::abs(fp8[i] - exact[i]));
    }
    EXPECT_LE(worst, bounds[r]) << "row " << r;
    f.worst_ratio = std::max(f.worst_ratio, worst / bounds[r]);
    f.worst_rel_vmax = std::max(f.worst_rel_vmax, worst / vmax);
  }
  return f;
}

double max_abs_value(const Pools& p) {
  double m = 0;
  for (const std::uint16_t b : p.value) m = std::max(m, std::abs(double{bf16_bits_to_float(b)}));
  return m;
}

const Format kFormats[] = {
    {KVDtype::kFp8E4M3, KVScaleMode::kPerTokenHead},
    {KVDtype::kFp8E4M3, KVScaleMode::kPerTokenHead, true},
    {KVDtype::kFp8E4M3, KVScaleMode::kPerTensor},
    {KVDtype::kFp8E5M2, KVScaleMode::kPerTokenHead},
    {KVDtype::kFp8E5M2, KVScaleMode::kPerTensor, true},
};

TEST(Fp8Decode, ReadsExactlyTheDequantizedValuesAndStaysWithinTheFp8Bound) {
  for (const Format& f : kFormats) {
    SCOPED_TRACE(name(f));
    // Per tensor: amplitudes the fixed scales cover (448 x 0.05 = 22.4 for K).
    const Pools p =
        make_pools(f, {1, 45, 16, 130}, 21, f.mode == KVScaleMode::kPerTensor ? 2.0f : 4.0f);
    const auto q = random_q(p.lens.size() * static_cast<std::size_t>(p.q_heads * p.dim), 5);
    const std::vector<double> got = reference_paged_decode_attention_f64(decode_params(p, true, q));
    std::vector<double> bounds;
    const std::vector<double> own = naive_decode(p, q, true, &bounds);
    ASSERT_EQ(got.size(), own.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], own[i], 1e-12 * (1 + std::abs(own[i]))) << i;
    }
    const std::vector<double> exact =
        reference_paged_decode_attention_f64(decode_params(p, false, q));
    const ErrorFigures e = check_rows(got, exact, bounds, p.dim, max_abs_value(p));
    std::printf("FP8 decode %s: max |err| / bound %.3f, max |err| / max|v| %.2e\n", name(f).c_str(),
                e.worst_ratio, e.worst_rel_vmax);
    // The 16-bit output rounding of the FP8 path agrees with the f64 one.
    std::vector<std::uint16_t> out(got.size());
    PagedDecodeParams d = decode_params(p, true, q);
    d.out = out.data();
    reference_paged_decode_attention(d);
    for (std::size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(out[i], float_to_bf16_bits(static_cast<float>(got[i])));
    }
  }
}

TEST(Fp8Extend, EqualsDecodeRowByRowAndStaysWithinTheFp8Bound) {
  for (const Format& f : kFormats) {
    SCOPED_TRACE(name(f));
    const Pools p =
        make_pools(f, {40, 17, 64}, 31, f.mode == KVScaleMode::kPerTensor ? 2.0f : 4.0f);
    // New tokens: the last 9, 17 and 1 of each sequence (prefix hit, plain prefill, decode-like).
    const std::vector<std::int32_t> q_lens = {9, 17, 1};
    std::vector<std::int32_t> indptr = {0};
    for (const std::int32_t n : q_lens) indptr.push_back(indptr.back() + n);
    const auto q = random_q(static_cast<std::size_t>(indptr.back() * p.q_heads * p.dim), 7);
    std::vector<double> results[2];
    for (const bool fp8 : {false, true}) {
      PagedExtendParams e;
      static_cast<PagedKVParams&>(e) = decode_params(p, fp8, q);
      e.q_indptr = indptr.data();
      e.max_q_len = 17;
      e.q = q.data();
      results[fp8 ? 1 : 0] = reference_paged_extend_attention_f64(e).out;
    }
    // Each new token is a decode over its causal prefix: compare with the naive reader and the
    // bound through single-token problems.
    std::size_t row = 0;
    double worst_ratio = 0;
    for (std::size_t s = 0; s < p.lens.size(); ++s) {
      for (std::int32_t j = 0; j < q_lens[s]; ++j, ++row) {
        const std::int32_t len = p.lens[s] - q_lens[s] + j + 1;
        Pools one = p;
        std::size_t first = 0;
        for (std::size_t i = 0; i < s; ++i) first += static_cast<std::size_t>(p.lens[i]);
        const std::size_t per_token = static_cast<std::size_t>(p.heads * p.dim);
        one.key.assign(p.key.begin() + static_cast<std::ptrdiff_t>(first * per_token),
                       p.key.begin() + static_cast<std::ptrdiff_t>((first + len) * per_token));
        one.value.assign(p.value.begin() + static_cast<std::ptrdiff_t>(first * per_token),
                         p.value.begin() + static_cast<std::ptrdiff_t>((first + len) * per_token));
        one.lens = {len};
        const std::size_t qrow = row * static_cast<std::size_t>(p.q_heads * p.dim);
        const std::vector<std::uint16_t> q1(
            q.begin() + static_cast<std::ptrdiff_t>(qrow),
            q.begin() + static_cast<std::ptrdiff_t>(qrow) + p.q_heads * p.dim);
        std::vector<double> bounds;
        const std::vector<double> own = naive_decode(one, q1, true, &bounds);
        const std::vector<double> exact = naive_decode(one, q1, false, nullptr);
        for (std::int32_t h = 0; h < p.q_heads; ++h) {
          double worst = 0;
          for (std::int32_t d = 0; d < p.dim; ++d) {
            const std::size_t i =
                (row * static_cast<std::size_t>(p.q_heads) + static_cast<std::size_t>(h)) *
                    static_cast<std::size_t>(p.dim) +
                static_cast<std::size_t>(d);
            const std::size_t o = static_cast<std::size_t>(h * p.dim + d);
            ASSERT_NEAR(results[1][i], own[o], 1e-12 * (1 + std::abs(own[o])));
            ASSERT_NEAR(results[0][i], exact[o], 1e-12 * (1 + std::abs(exact[o])));
            worst = std::max(worst, std::abs(results[1][i] - results[0][i]));
          }
          EXPECT_LE(worst, bounds[static_cast<std::size_t>(h)]) << "row " << row << " head " << h;
          worst_ratio = std::max(worst_ratio, worst / bounds[static_cast<std::size_t>(h)]);
        }
      }
    }
    std::printf("FP8 extend %s: max |err| / bound %.3f\n", name(f).c_str(), worst_ratio);
  }
}

std::vector<std::uint8_t> block_bytes(const std::vector<std::uint8_t>& plane, const KVLayout& l,
                                      std::int64_t block) {
  const auto begin = plane.begin() + static_cast<std::ptrdiff_t>(block * l.stride_block);
  return {begin, begin + static_cast<std::ptrdiff_t>(l.block_span())};
}

TEST(Fp8Blocks, CopySwapAndTransferAreByteExactWithScales) {
  for (const Format& f : kFormats) {
    SCOPED_TRACE(name(f));
    Pools p = make_pools(f, {40, 17}, 41);
    const KVLayout& l = p.layout8;
    // copy_blocks: sequence 0's blocks onto the three unused ones... plus one of sequence 1.
    std::vector<std::int32_t> used;
    for (const auto& b : p.blocks) used.insert(used.end(), b.begin(), b.end());
    std::vector<std::int32_t> unused;
    for (std::int32_t b = 0; b < l.num_blocks; ++b) {
      if (std::find(used.begin(), used.end(), b) == used.end()) unused.push_back(b);
    }
    ASSERT_EQ(unused.size(), 3u);
    std::vector<BlockPair> pairs;
    for (std::size_t i = 0; i < 3; ++i) pairs.push_back({p.blocks[0][i], unused[i]});
    std::vector<void*> planes = {p.k8.data(), p.v8.data()};
    const auto before_k = p.k8;
    reference_copy_blocks(planes, l, f.dtype, pairs);
    for (const BlockPair& pair : pairs) {
      EXPECT_EQ(block_bytes(p.k8, l, pair.dst), block_bytes(p.k8, l, pair.src));
      EXPECT_EQ(block_bytes(p.v8, l, pair.dst), block_bytes(p.v8, l, pair.src));
      EXPECT_NE(block_bytes(before_k, l, pair.dst), block_bytes(p.k8, l, pair.dst));
    }
    // A 16-bit dtype over a scaled layout is refused.
    if (l.has_scales()) {
      EXPECT_THROW(reference_copy_blocks(planes, l, KVDtype::kBFloat16, pairs), Error);
    }
    // swap_blocks to a host pool of the same layout and back.
    KVLayout host_layout = l;
    host_layout.num_blocks = 4;
    std::vector<std::uint8_t> hk(static_cast<std::size_t>(host_layout.plane_elements()), 0),
        hv = hk;
    std::vector<const void*> src = {p.k8.data(), p.v8.data()};
    std::vector<void*> dst = {hk.data(), hv.data()};
    const std::vector<BlockPair> out = {{p.blocks[1][0], 2}, {p.blocks[1][1], 3}};
    reference_swap_blocks(src, l, dst, host_layout, f.dtype, out);
    for (const BlockPair& pair : out) {
      EXPECT_EQ(block_bytes(hk, host_layout, pair.dst), block_bytes(p.k8, l, pair.src));
      EXPECT_EQ(block_bytes(hv, host_layout, pair.dst), block_bytes(p.v8, l, pair.src));
    }
    // A swap between layouts whose scales lie elsewhere is refused.
    if (l.has_scales()) {
      KVLayout moved = host_layout;
      moved.stride_block += 16;
      moved.scale_offset += 16;
      std::vector<std::uint8_t> mk(static_cast<std::size_t>(moved.plane_elements())), mv = mk;
      std::vector<void*> mdst = {mk.data(), mv.data()};
      EXPECT_THROW(reference_swap_blocks(src, l, mdst, moved, f.dtype, out), Error);
    }
  }
}

TEST(Fp8Blocks, TransferPlanRoundTripKeepsDecodeBitIdentical) {
  const Format f{KVDtype::kFp8E4M3, KVScaleMode::kPerTokenHead};
  Pools p = make_pools(f, {40, 17}, 51);
  const KVLayout& l = p.layout8;
  // One buffer, layer-first: K then V plane (as the tiny engine lays them), chunk = stride_block.
  const auto plane = static_cast<std::size_t>(l.plane_elements());
  std::vector<std::byte> device(2 * plane);
  std::memcpy(device.data(), p.k8.data(), plane);
  std::memcpy(device.data() + plane, p.v8.data(), plane);
  const auto chunk = static_cast<std::size_t>(l.stride_block);
  const TransferLayout layout{2, chunk, chunk, plane};
  std::vector<std::byte> host(3 * layout.block_bytes());
  const auto q = random_q(p.lens.size() * static_cast<std::size_t>(p.q_heads * p.dim), 9);
  std::vector<std::uint16_t> before(p.lens.size() * static_cast<std::size_t>(p.q_heads * p.dim));
  PagedDecodeParams d = decode_params(p, true, q);
  d.out = before.data();
  reference_paged_decode_attention(d);
  // Evict sequence 0's blocks to the host, scribble over them on the device, load them back.
  TransferPlan out;
  for (std::size_t i = 0; i < 3; ++i) {
    out.evictions.push_back({p.blocks[0][i], static_cast<std::int32_t>(i)});
  }
  reference::execute_transfer_plan(out, TransferStage::kBeforeForward, layout, device,
                                   static_cast<std::size_t>(l.num_blocks), host, 3);
  for (const std::int32_t b : p.blocks[0]) {
    for (std::size_t c = 0; c < 2; ++c) {
      std::memset(device.data() + c * plane + static_cast<std::size_t>(b) * chunk, 0x3c, chunk);
    }
  }
  TransferPlan in;
  for (std::size_t i = 0; i < 3; ++i) {
    in.loads.push_back({static_cast<std::int32_t>(i), p.blocks[0][i]});
  }
  reference::execute_transfer_plan(in, TransferStage::kBeforeForward, layout, device,
                                   static_cast<std::size_t>(l.num_blocks), host, 3);
  for (const std::int32_t b : p.blocks[0]) {
    EXPECT_EQ(std::memcmp(device.data() + static_cast<std::size_t>(b) * chunk,
                          p.k8.data() + static_cast<std::size_t>(b) * chunk, chunk),
              0);
    EXPECT_EQ(std::memcmp(device.data() + plane + static_cast<std::size_t>(b) * chunk,
                          p.v8.data() + static_cast<std::size_t>(b) * chunk, chunk),
              0);
  }
  std::vector<std::uint16_t> after(before.size());
  d.k_cache = device.data();
  d.v_cache = device.data() + plane;
  d.out = after.data();
  reference_paged_decode_attention(d);
  EXPECT_EQ(after, before);
}

}  // namespace
}  // namespace pagedkv
