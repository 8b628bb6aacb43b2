// kernels/internal/wgmma_layout.hpp: what an sm_90a kernel needs to feed Hopper's warpgroup MMA
// (wgmma.mma_async, PTX ISA 9.7.15) from the 128-byte-swizzled shared layouts, as plain
// host/device functions (issue 35, step B: the groundwork, checked on a GPU by the probe of
// kernels/wgmma_probe.cu before any attention kernel is built on it):
//   - the 64-bit shared-memory matrix descriptor (start address, leading and stride dimension byte
//     offsets, swizzle mode), each field in 16-byte units;
//   - where our tiles put element (row, k) of a K-major operand (Q for QK^T, K as its B operand)
//     and element (k, n) of an MN-major one (V as the B operand of PV, imm-trans-b = 1), 16-bit
//     elements, 64 of them (128 bytes) per swizzle row, chunk c of row r at c ^ (r mod 8);
//   - a model of how the tensor core finds an element through a descriptor (the ISA's canonical
//     layouts: core matrices of 8 rows x 16 bytes, 8-row groups SBO apart for K-major; for
//     MN-major 64-element atoms along N LBO apart and 8-row groups along K SBO apart; the
//     128-byte swizzle XORing address bits 4-6 with bits 7-9 of the shared address, which needs
//     1,024-byte-aligned tiles; k steps of 16 advance the start address by 32 bytes), so the
//     host tests check that the descriptors the probe and the kernel issue address our layouts;
//   - the register fragments of wgmma.m64nNk16: the accumulator D (thread t, element j) and the
//     A operand from registers (thread t, half e), each warp w of the warpgroup holding rows
//     16 w .. 16 w + 15 in mma.sync m16n8k16's fragment layout.
// The MN-major descriptor's LBO / SBO follow the ISA's canonical layouts (PTX ISA 9.7.15.5.1.2.1):
// LBO is the stride between 64-element atoms along N, SBO the stride between 8-row groups along K
// (kMnMajorKGroupsInLbo = false); the probe runs the other reading too and requires it to fail.
//
// Pure O(1) functions, no errors (callers pass consistent values); usable from any thread.
// Internal to pagedkv::cuda, not a stable API.
#pragma once

#include <cstdint>

#include "internal/decode_tc_layout.hpp"
#include "internal/host_device.hpp"

namespace pagedkv::detail {

// Descriptor swizzle modes (bits 62-63).
enum class WgmmaSwizzle : std::uint32_t { kNone = 0, k128B = 1, k64B = 2, k32B = 3 };

// The shared-memory matrix descriptor: start address bits 0-13, leading dimension byte offset
// bits 16-29, stride dimension byte offset bits 32-45 (each in 16-byte units: the 4 low bits are
// dropped), base offset bits 49-51 (0: tiles aligned to the swizzle pattern), swizzle bits 62-63.
PAGEDKV_HOST_DEVICE constexpr std::uint64_t wgmma_descriptor(std::uint32_t smem_addr,
                                                             std::uint32_t lbo_bytes,
                                                             std::uint32_t sbo_bytes,
                                                             WgmmaSwizzle swizzle) {
  return static_cast<std::uint64_t>((smem_addr & 0x3ffffu) >> 4) |
         (static_cast<std::uint64_t>((lbo_bytes >> 4) & 0x3fffu) << 16) |
         (static_cast<std::uint64_t>((sbo_bytes >> 4) & 0x3fffu) << 32) |
         (static_cast<std::uint64_t>(swizzle) << 62);
}

struct WgmmaDescriptorFields {
  std::uint32_t start_bytes, lbo_bytes, sbo_bytes, base_offset, swizzle;
};
PAGEDKV_HOST_DEVICE constexpr WgmmaDescriptorFields wgmma_descriptor_fields(std::uint64_t d) {
  return {static_cast<std::uint32_t>(d & 0x3fffu) << 4,
          static_cast<std::uint32_t>((d >> 16) & 0x3fffu) << 4,
          static_cast<std::uint32_t>((d >> 32) & 0x3fffu) << 4,
          static_cast<std::uint32_t>((d >> 49) & 0x7u), static_cast<std::uint32_t>(d >> 62)};
}

// 128-byte swizzle rows hold 64 16-bit elements; 8 rows make a 1,024-byte atom.
inline constexpr std::uint32_t kSw128RowBytes = 128;
inline constexpr std::uint32_t kSw128AtomBytes = 1024;
inline constexpr int kSw128RowElems = 64;

// The 128-byte swizzle applied to a shared address: the 16-byte chunk (bits 4-6) XOR the row
// within the atom (bits 7-9).
PAGEDKV_HOST_DEVICE constexpr std::uint32_t sw128(std::uint32_t addr) {
  return addr ^ (((addr >> 7) & 7u) << 4);
}

// K-major tile of `rows` x 64 16-bit elements (rows a multiple of 8), 1,024-byte aligned: byte
// offset of element (row, k), k < 64. Rows are 128 bytes apart, so 8-row groups are one atom
// (SBO = 1,024) apart.
PAGEDKV_HOST_DEVICE constexpr std::uint32_t sw128_k_major_offset(int row, int k) {
  const auto r = static_cast<std::uint32_t>(row);
  const auto c = static_cast<std::uint32_t>(k) >> 3;
  return (r >> 3) * kSw128AtomBytes + (r & 7u) * kSw128RowBytes + ((c ^ (r & 7u)) << 4) +
         (static_cast<std::uint32_t>(k) & 7u) * 2u;
}
inline constexpr std::uint32_t kKMajorSbo = kSw128AtomBytes;  // LBO unused when swizzled (1)

// MN-major tile of `keys` (K, a multiple of 8) x n_total (N, a multiple of 64) 16-bit elements,
// n contiguous: each 64-wide column block of N is an atom column of keys / 8 atoms (8 keys x 128
// bytes each, 1,024 bytes apart), and the atom columns follow each other, keys / 8 x 1,024 bytes
// apart. Byte offset of element (k, n).
PAGEDKV_HOST_DEVICE constexpr std::uint32_t sw128_mn_major_offset(int k, int n, int keys) {
  const auto kk = static_cast<std::uint32_t>(k);
  const auto nn = static_cast<std::uint32_t>(n);
  const std::uint32_t column = nn / kSw128RowElems;
  const std::uint32_t c = (nn % kSw128RowElems) >> 3;
  return column * (static_cast<std::uint32_t>(keys) / 8u) * kSw128AtomBytes +
         (kk >> 3) * kSw128AtomBytes + (kk & 7u) * kSw128RowBytes + ((c ^ (kk & 7u)) << 4) +
         (nn & 7u) * 2u;
}
// The two strides of that layout: between 8-key groups (along K) and between atom columns
// (along N).
PAGEDKV_HOST_DEVICE constexpr std::uint32_t mn_major_k_group_stride() {
  return kSw128AtomBytes;
}
PAGEDKV_HOST_DEVICE constexpr std::uint32_t mn_major_n_atom_stride(int keys) {
  return static_cast<std::uint32_t>(keys) / 8u * kSw128AtomBytes;
}
// Which offset carries which stride, as the ISA defines them for an MN-major swizzled operand
// (PTX ISA 9.7.15.5.1.2.1: LBO "offset from the first (swizzle-byte-size/16) rows to the next
// (swizzle-byte-size/16) rows", SBO "offset from the first 8 columns to the next 8 columns", rows
// of the 128-bit-normalized matrix running along MN and columns along K; canonical layout of the
// 128-byte swizzle ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO)), T = 8 16-bit elements): the N-direction
// stride (between 64-element atom columns) goes in LBO and the K-direction stride (between 8-key
// groups) in SBO, as CuTe's make_gmma_desc<Major::MN> encodes it. false: K groups in SBO. The
// probe runs both readings; this one must match the hardware and the other must not.
inline constexpr bool kMnMajorKGroupsInLbo = false;
PAGEDKV_HOST_DEVICE constexpr std::uint64_t mn_major_descriptor(std::uint32_t smem_addr, int keys,
                                                                bool k_groups_in_lbo) {
  const std::uint32_t kg = mn_major_k_group_stride();
  const std::uint32_t na = mn_major_n_atom_stride(keys);
  return k_groups_in_lbo ? wgmma_descriptor(smem_addr, kg, na, WgmmaSwizzle::k128B)
                         : wgmma_descriptor(smem_addr, na, kg, WgmmaSwizzle::k128B);
}

// The model of the hardware's address for element (m, k) of a K-major operand of one
// wgmma.m64nNk16 (m < 64 or N, k < 16) from its descriptor (128-byte swizzle).
PAGEDKV_HOST_DEVICE constexpr std::uint32_t model_k_major_address(std::uint64_t desc, int m,
                                                                  int k) {
  const WgmmaDescriptorFields f = wgmma_descriptor_fields(desc);
  const auto mm = static_cast<std::uint32_t>(m);
  const auto kk = static_cast<std::uint32_t>(k);
  return sw128(f.start_bytes + (mm >> 3) * f.sbo_bytes + (mm & 7u) * kSw128RowBytes +
               (kk >> 3) * 16u + (kk & 7u) * 2u);
}
// The same for element (k, n) of an MN-major B operand (k < 16, n < N), as the ISA's canonical
// layout reads the descriptor: 64-element atoms along N LBO apart, 8-row groups along K SBO apart.
PAGEDKV_HOST_DEVICE constexpr std::uint32_t model_mn_major_address(std::uint64_t desc, int k,
                                                                   int n) {
  const WgmmaDescriptorFields f = wgmma_descriptor_fields(desc);
  const auto kk = static_cast<std::uint32_t>(k);
  const auto nn = static_cast<std::uint32_t>(n);
  return sw128(f.start_bytes + (kk >> 3) * f.sbo_bytes + (kk & 7u) * kSw128RowBytes +
               (nn / kSw128RowElems) * f.lbo_bytes + ((nn % kSw128RowElems) >> 3) * 16u +
               (nn & 7u) * 2u);
}

// Descriptor start address of k step `step` (16 elements) of a K-major tile at `tile` (1,024-byte
// aligned): 32 bytes further per step within the 128-byte rows (the swizzle is applied by the
// hardware to the sum).
PAGEDKV_HOST_DEVICE constexpr std::uint32_t k_major_step_start(std::uint32_t tile, int step) {
  return tile + static_cast<std::uint32_t>(step) * 32u;
}
// Of an MN-major tile: 16 keys are two 8-key groups, two atoms further per step.
PAGEDKV_HOST_DEVICE constexpr std::uint32_t mn_major_step_start(std::uint32_t tile, int step) {
  return tile + static_cast<std::uint32_t>(step) * 2u * kSw128AtomBytes;
}

// ---- the tiles of ExtendKernel::kWgmma (kernels/extend_attention_wgmma.cu), head_dim 128 ----
// Q (rows x 128) and K (keys x 128) K-major as two 64-column blocks (block b holds columns
// 64 b .. 64 b + 63, rows x 128 bytes); V (keys x 128) N-major as two atom columns. Byte offset of
// 16-byte chunk c (columns 8 c .. 8 c + 7) of row / key r.
PAGEDKV_HOST_DEVICE constexpr std::uint32_t wgmma_kmajor_chunk_offset(int r, int c, int rows) {
  return static_cast<std::uint32_t>(c / 8) * static_cast<std::uint32_t>(rows) * kSw128RowBytes +
         sw128_k_major_offset(r, (c % 8) * 8);
}
PAGEDKV_HOST_DEVICE constexpr std::uint32_t wgmma_v_chunk_offset(int key, int c, int keys) {
  return sw128_mn_major_offset(key, c * 8, keys);
}
// Start of k step ks (16 columns of head_dim) relative to step 0's in a K-major tile of `rows`
// rows: the 64-column block ks / 4, then k_major_step_start's 32 bytes per step within its
// 128-byte rows.
PAGEDKV_HOST_DEVICE constexpr std::uint32_t wgmma_kmajor_step_offset(int rows, int ks) {
  return k_major_step_start(
      static_cast<std::uint32_t>(ks / 4) * static_cast<std::uint32_t>(rows) * kSw128RowBytes,
      ks % 4);
}
// Descriptors of k step ks for rows 64 g .. 64 g + 63 of such a tile (Q: g = the warpgroup; K:
// g = 0, rows = keys).
PAGEDKV_HOST_DEVICE constexpr std::uint64_t wgmma_kmajor_step_desc(std::uint32_t tile, int rows,
                                                                   int g, int ks) {
  return wgmma_descriptor(tile + static_cast<std::uint32_t>(g) * 64u * kSw128RowBytes +
                              wgmma_kmajor_step_offset(rows, ks),
                          16, kKMajorSbo, WgmmaSwizzle::k128B);
}
// Descriptor of k step kk (keys 16 kk .. 16 kk + 15) of the V tile.
PAGEDKV_HOST_DEVICE constexpr std::uint64_t wgmma_v_step_desc(std::uint32_t tile, int keys,
                                                              int kk) {
  return mn_major_descriptor(mn_major_step_start(tile, kk), keys, kMnMajorKGroupsInLbo);
}

// Step kk's start relative to step 0's in the V tile.
PAGEDKV_HOST_DEVICE constexpr std::uint32_t wgmma_v_step_offset(int kk) {
  return mn_major_step_start(0, kk);
}

// A descriptor `bytes` (a multiple of 16) further in shared memory: only the start-address field
// (address bits 4-17) changes, and while the new address stays below 2^18 (every shared address
// does: 228 KiB per SM) the 32-bit sum of the low word cannot carry out of that field. One
// 32-bit add per step from step 0's descriptor, where building each step's descriptor takes an
// add, a mask, a shift and an OR, and a move for its high word (the wgmma kernels' loops issue
// 20 of them per tile). Equal to building it for every tile address and step the kernels use
// (tests/device/wgmma_layout_test.cpp).
PAGEDKV_HOST_DEVICE constexpr std::uint64_t wgmma_descriptor_advance(std::uint64_t desc,
                                                                     std::uint32_t bytes) {
  return (desc & 0xffffffff00000000ull) |
         static_cast<std::uint32_t>(static_cast<std::uint32_t>(desc) + (bytes >> 4));
}

// Step ks's (kk's) descriptor from step 0's, as the kernels' loops issue them.
PAGEDKV_HOST_DEVICE constexpr std::uint64_t wgmma_kmajor_step_desc_from(std::uint64_t step0,
                                                                        int rows, int ks) {
  return wgmma_descriptor_advance(step0, wgmma_kmajor_step_offset(rows, ks));
}
PAGEDKV_HOST_DEVICE constexpr std::uint64_t wgmma_v_step_desc_from(std::uint64_t step0, int kk) {
  return wgmma_descriptor_advance(step0, wgmma_v_step_offset(kk));
}

// Accumulator D of wgmma.m64nNk16 with fp32 accumulators: thread t (0..127) element j
// (0..N/2-1).
PAGEDKV_HOST_DEVICE constexpr MmaCoord wgmma_d_coord(int t, int j) {
  const int lane = t & 31;
  return {16 * (t >> 5) + (lane >> 2) + (((j >> 1) & 1) != 0 ? 8 : 0),
          8 * (j >> 2) + 2 * (lane & 3) + (j & 1)};
}
// A from registers (16-bit): thread t's half e (0..7: register e / 2, low half first), 64 x 16.
PAGEDKV_HOST_DEVICE constexpr MmaCoord wgmma_a_coord(int t, int e) {
  const MmaCoord c = mma_a_coord(t & 31, e);
  return {16 * (t >> 5) + c.row, c.col};
}

// P as the A operand of O += P V: half e (0, 1) of A register r (0..3) at k step kk (keys
// 16 kk .. 16 kk + 15) is the score accumulator element wgmma_p_source(kk, r, e) of the same thread
// (the same row and key: checked in tests/device/wgmma_layout_test.cpp).
PAGEDKV_HOST_DEVICE constexpr int wgmma_p_source(int kk, int r, int e) {
  return 8 * kk + 2 * r + e;
}

}  // namespace pagedkv::detail
