// Warp-specialized warpgroup-MMA paged extend attention (ExtendKernel::kWgmmaWarpSpecialized and,
// with ping-pong, kWgmmaWarpSpecializedPingPong; contract in
// include/pagedkv/cuda/extend_attention.hpp). Issue 35, step B: FlashAttention-3's
// structure on the tile geometry of kWgmma (kernels/extend_attention_wgmma.cu), with the paged K/V
// gathered by a producer warpgroup instead of by every thread between CTA barriers. Compiled for
// sm_90a only (the CMake object library pagedkv_cuda_sm90a); paged_extend_attention runs it only
// on compute capability 9.0, for 16-bit caches at head_dim 128, and falls back to kFa2 elsewhere.
// Not yet run on a GPU.
//
// CTA = three warpgroups (384 threads) = 128 query rows of one (sequence, KV head, query tile,
// split), as kWgmma:
//   producer  warpgroup 0, its registers cut to kProducerRegs (setmaxnreg.dec): for each 64-key
//             tile, waits until the consumers have freed its stage (empty[s]), gathers K (K-major)
//             and V (N-major) through the block table with cp.async, and has each copy's
//             completion counted on full[s] (cp.async.mbarrier.arrive.noinc: 128 arrivals, one
//             per producer thread). Page offsets come from a 2-slot table in shared memory,
//             written one tile ahead between producer-only barriers (bar.sync 1, 128), from block
//             ids loaded from the block table two tiles ahead into registers, so the table's
//             latency is off the copies' path.
//   consumers warpgroups 1 and 2 (rows 0-63 and 64-127), registers raised to kConsumerRegs
//             (setmaxnreg.inc): each loads its Q rows, then runs kWgmmaPipelined's loop on its
//             own, synchronized only through the stages' barriers: wait full[s] for tile t; issue
//             tile t's S GEMM and tile t - 1's PV GEMM; softmax of tile t while the PV GEMM runs;
//             wait; free tile t - 1's stage (empty[s], 256 arrivals: every consumer thread);
//             rescale O; pack P. No CTA-wide barrier after the prologue. Ping-pong
//             (kPingPong): the two take turns issuing their GEMMs on two more mbarriers
//             (turn[c]: wait for mine, issue, arrive on the other's), consumer 0 first, so one's
//             softmax runs under the other's GEMMs (kernels/internal/wgmma_ws_ring.hpp).
//   ring      kStages stages of K + V (32 KiB each), full[s] / empty[s] mbarriers, phases by round;
//             every mbarrier wait traps after PAGEDKV_CUDA_WAIT_LIMIT_MS (a deadlock is an error).
//   split     over keys as kFa2 and kWgmma (same plan, workspace and merge kernel).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "internal/cp_async.cuh"
#include "internal/decode_tc_host.hpp"
#include "internal/extend_fa2_params.cuh"
#include "internal/extend_persistent_schedule.hpp"
#include "internal/extend_wgmma_grid.cuh"
#include "internal/extend_wgmma_launch.hpp"
#include "internal/mbarrier.cuh"
#include "internal/wgmma.cuh"
#include "internal/wgmma_extend_rows.cuh"
#include "internal/wgmma_layout.hpp"
#include "internal/wgmma_ws_ring.hpp"

namespace pagedkv::kernels {

namespace {

using fa2::Fa2Params;
using wgmma_extend::kHeadDim;
using wgmma_extend::kKeys;

constexpr int kThreads = 384;  // producer warpgroup + two consumer warpgroups
using wgmma_extend::kRows;
constexpr int kStages = detail::kWsStages;
constexpr int kChunks = kHeadDim / 8;                     // 16-byte chunks per row
constexpr std::uint32_t kQBytes = kRows * kHeadDim * 2;   // 32 KiB
constexpr std::uint32_t kKVBytes = kKeys * kHeadDim * 2;  // K or V of one stage, 16 KiB
constexpr std::uint32_t kStageBytes = 2 * kKVBytes;
constexpr std::uint32_t kOffsetBytes = 2 * kKeys * sizeof(std::int64_t);
constexpr std::uint32_t kBarrierBytes = (2 * kStages + 2) * sizeof(std::uint64_t);
constexpr std::uint32_t kSmemBytes =
    kQBytes + kStages * kStageBytes + kOffsetBytes + kBarrierBytes + 1024;
// The persistent kernel's item slots: the item drawn (-1: none left) and what it covers, written
// by the producer's elected thread and read in place by every other thread while it works on the
// item (nothing of it kept in registers across the K/V loop: the consumers have none to spare).
struct WsItem {
  std::int64_t item;
  wgmma_extend::CtaWork work;
};
// The slots and their full / empty barriers after the turn barriers, then a copy of the kernel
// parameters: read from shared memory at each use, they cannot be hoisted out of the item loop
// into registers that would stay live across the K/V loop (nvcc hoisted a dozen of them, and
// ptxas spilled the consumers).
constexpr std::uint32_t kPersistentBytes =
    detail::kWsItemSlots * (2 * sizeof(std::uint64_t) + sizeof(WsItem)) + sizeof(Fa2Params);
static_assert(sizeof(WsItem) % 8 == 0 && alignof(Fa2Params) <= 8, "the copy stays aligned");
constexpr std::uint32_t smem_bytes(bool persistent) {
  return kSmemBytes + (persistent ? kPersistentBytes : 0u);
}
static_assert(128 * 8 == kKeys * kChunks, "K and V: 8 chunks per producer thread each");
static_assert(128 * 8 == 64 * kChunks, "Q: 8 chunks per consumer thread");

// Registers: the launch reserves 65,536 / 384 = 170, allocated per warp in units of 8 per thread
// (168); the producer gives back 168 - kProducerRegs per thread, the consumers take
// kConsumerRegs - 168 each, which must fit in what was given back (or setmaxnreg.inc waits).
// The persistent kernel's producer keeps its item loop's state too and gets 56 (ptxas spilled it
// at 40 and 48), so its consumers get 224 (enough for them: no spill).
constexpr int kLaunchRegs = 168;
template <bool kPersistent>
constexpr int kProducerRegs = kPersistent ? 56 : 40;
template <bool kPersistent>
constexpr int kConsumerRegs = kPersistent ? 224 : 232;
template <bool kPersistent>
constexpr bool register_split_fits() {
  return 128 * (kLaunchRegs - kProducerRegs<kPersistent>) >=
             256 * (kConsumerRegs<kPersistent> - kLaunchRegs) &&
         128 * kProducerRegs<kPersistent> + 256 * kConsumerRegs<kPersistent> <= 65536;
}
static_assert(register_split_fits<false>() && register_split_fits<true>(),
              "the consumers' raise must fit in the producer's cut, and in one SM's registers");
// The split above holds only if the kernel starts at kLaunchRegs: from fewer, the producer's cut
// would not cover the consumers' raise and setmaxnreg.inc would wait forever (a hang, not an
// error). ptxas pins a kernel that uses setmaxnreg at its __launch_bounds__ maximum (168 at -O3,
// with -maxrregcount=128 and with -G, nvcc 13.0); the launch checks it anyway (launch below).

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define PAGEDKV_WGMMA_WS_DEVICE 1  // the device pass with wgmma and setmaxnreg (sm_90a)
#endif

template <bool kBf16, bool kSoftCap, bool kPingPong, bool kPersistent>
__global__ void __launch_bounds__(kThreads, 1)
    wgmma_ws_extend_kernel(const Fa2Params params, const detail::PersistentSchedule sched) {
#ifdef PAGEDKV_WGMMA_WS_DEVICE
  using namespace pagedkv::detail;
  extern __shared__ unsigned char smem_raw[];
  const auto raw_addr = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem_raw));
  const std::uint32_t pad = (1024u - (raw_addr & 1023u)) & 1023u;
  unsigned char* const smem = smem_raw + pad;
  const std::uint32_t q_addr = raw_addr + pad;
  const std::uint32_t ring_addr = q_addr + kQBytes;
  unsigned char* const ring = smem + kQBytes;
  auto* offsets = reinterpret_cast<std::int64_t*>(ring + kStages * kStageBytes);  // [2][kKeys]
  auto* full = reinterpret_cast<std::uint64_t*>(ring + kStages * kStageBytes + kOffsetBytes);
  std::uint64_t* const empty = full + kStages;
  std::uint64_t* const turn = empty + kStages;  // [2]: the consumers' ping-pong
  // Persistent: the item slots and their barriers (kPersistentBytes, after the turn barriers).
  std::uint64_t* const item_full = turn + 2;
  std::uint64_t* const item_empty = item_full + kWsItemSlots;
  auto* const slots = reinterpret_cast<WsItem*>(item_empty + kWsItemSlots);
  auto* const params_copy = reinterpret_cast<Fa2Params*>(slots + kWsItemSlots);
  const Fa2Params& p = kPersistent ? *params_copy : params;

  // ---- what this CTA covers (the non-persistent kernel: all it covers) ----
  wgmma_extend::CtaWork cw;
  if constexpr (!kPersistent) {
    if (!wgmma_extend::cta_work(p, cw)) return;  // uniform over the CTA
  }

  const int tid = static_cast<int>(threadIdx.x);
  if (kPersistent && tid == 0) *params_copy = params;     // published by the barrier below
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);  // warp-uniform, as setmaxnreg needs
  const int wt = tid % 128;

  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      mbar::init(&full[s], kWsFullArrivals);    // a cp.async-completion per producer thread
      mbar::init(&empty[s], kWsEmptyArrivals);  // one arrival per consumer thread
    }
    if (kPingPong) {
      mbar::init(&turn[0], kWsTurnArrivals);  // one arrival per thread of the other consumer
      mbar::init(&turn[1], kWsTurnArrivals);
    }
    if (kPersistent) {
#pragma unroll
      for (int s = 0; s < kWsItemSlots; ++s) {
        mbar::init(&item_full[s], kWsItemFullArrivals);
        mbar::init(&item_empty[s], kWsItemEmptyArrivals);
      }
    }
    mbar::fence_init();
  }
  __syncthreads();  // the barriers initialized before anyone arrives or waits

  if (wg == 0) {
    // ---- producer ----
    mbar::setmaxnreg_dec<kProducerRegs<kPersistent>>();
    // The producer reads the parameters where the launch put them (constant-bank operands, no
    // registers), not the consumers' shared-memory copy.
    const Fa2Params& p = params;
    // One item's tiles: ring tiles base .. base + cw.tiles - 1.
    const auto produce = [&](const wgmma_extend::CtaWork& cw, int base) {
      const ExtendTileGeometry& geo = cw.work.geo;
      const int key_first = cw.key_first;
      const int tiles = cw.tiles;
      const fa2::Fa2KeyPages pages =
          fa2::fa2_key_pages(p, cw.seq, cw.kv_head, key_first, geo.kv_end, tiles);
      // Key wt (< kKeys) of tile t: its block id (loaded ahead), then its offset (-1: zero-fill).
      const auto block_of = [&](int t) -> std::int64_t {
        return t < tiles ? tc_token_block(pages.page, pages.table_row, key_first + t * kKeys + wt,
                                          geo.kv_end)
                         : -1;
      };
      const auto offset_of = [&](int t, std::int64_t block) {
        return tc_token_block_offset(pages.page, key_first + t * kKeys + wt, block);
      };
      std::int64_t next_block = -1;  // tile t + 1's, at iteration t
      if (wt < kKeys) {
        offsets[ws_offset_slot(0) * kKeys + wt] = offset_of(0, block_of(0));
        next_block = block_of(1);
      }
      mbar::named_sync(1, 128);
      for (int t = 0; t < tiles; ++t) {
        const int s = ws_stage(base + t);
        mbar::wait_parity(&empty[s], ws_empty_parity(base + t));
        unsigned char* k_dst = ring + s * kStageBytes;
        unsigned char* v_dst = k_dst + kKVBytes;
        const std::int64_t* slot = offsets + ws_offset_slot(t) * kKeys;
        // Unrolled by 4, not 8: fully unrolled, the hoisted addresses need about 90 registers
        // and spill at kProducerRegs<false> (ptxas; scripts/kernel-resources would fail).
#pragma unroll 4
        for (int i = 0; i < 8; ++i) {
          const int chunk = wt + i * 128;
          const int key = chunk / kChunks;
          const int c = chunk % kChunks;
          const std::int64_t off = slot[key];
          const bool fill = off >= 0;
          cp_async_16(k_dst + wgmma_kmajor_chunk_offset(key, c, kKeys),
                      fill ? p.k_cache + off + c * 8 : p.k_cache, fill);
          cp_async_16(v_dst + wgmma_v_chunk_offset(key, c, kKeys),
                      fill ? p.v_cache + off + c * 8 : p.v_cache, fill);
        }
        mbar::arrive_on_cp_async(&full[s]);
        // Tile t + 1's offsets into the other slot (read last by tile t - 1's copies, before the
        // previous barrier), from the block ids loaded an iteration ago; tile t + 2's loaded now.
        if (wt < kKeys) {
          offsets[ws_offset_slot(t + 1) * kKeys + wt] = offset_of(t + 1, next_block);
          next_block = block_of(t + 2);
        }
        mbar::named_sync(1, 128);
      }
    };
    if constexpr (kPersistent) {
      int base = 0;  // reduced (ws_next_ring_base), as n (ws_next_item)
      for (int n = 0;; n = ws_next_item(n)) {
        WsItem& slot = slots[ws_item_slot(n)];
        if (wt == 0) {
          // The next item with work off the shared counter (-1: none left), into slot n once
          // both consumers are done with the item it held.
          std::int64_t next = -1;
          for (;;) {
            const auto drawn = static_cast<std::int64_t>(atomicAdd(sched.counter, 1ull));
            if (drawn >= sched.items) break;
            const PersistentCell cell = persistent_item_cell(sched.grid, drawn);
            if (wgmma_extend::cell_work(p, cell.x, cell.y, cell.z, cw)) {
              next = drawn;
              break;
            }
          }
          mbar::wait_parity(&item_empty[ws_item_slot(n)], ws_item_empty_parity(n));
          slot.item = next;
          slot.work = cw;
          mbar::arrive(&item_full[ws_item_slot(n)]);  // release: the slot's writes
        }
        // The slot written; this warpgroup reads it until the barrier that starts item n + 1,
        // and its writer rewrites it only after that (for item n + 2).
        mbar::named_sync(1, 128);
        if (slot.item < 0) break;
        produce(slot.work, base);
        base = ws_next_ring_base(base, slot.work.tiles);
      }
    } else {
      produce(cw, 0);
    }
    mbar::cp_async_wait_all();  // nothing in flight when the producer exits
    return;
  }

  // ---- consumers: warpgroup c = wg - 1 owns rows 64 c .. 64 c + 63 ----
  mbar::setmaxnreg_inc<kConsumerRegs<kPersistent>>();
  const int c = wg - 1;
  if (kPingPong && ws_turn_primed(c)) {
    mbar::arrive(&turn[0]);  // ping-pong: consumer 1 hands consumer 0 the first turn
  }
  // Ping-pong turn k: wait until the other consumer has issued its GEMMs of turn k - 1
  // (consumer 1: of turn k), issue ours, hand the turn over. k counts from `base` (the turns of
  // the CTA's earlier items).
  struct Turns {
    std::uint64_t* mine;
    std::uint64_t* other;
    int base;
    __device__ __forceinline__ void begin(int k) const {
      mbar::wait_parity(mine, ws_turn_parity(base + k));
    }
    __device__ __forceinline__ void end(int) const { mbar::arrive(other); }
  };
  static_assert(ws_release_iteration(wgmma_pv_tile(1, true)) == 1,
                "the pipelined loop frees a tile's stage in the iteration the ring expects");

  // One item: ring tiles base .. base + cw.tiles - 1, turns from turn_base.
  const auto consume = [&](const wgmma_extend::CtaWork& cw, int base, int turn_base) {
    const fa2::SeqLens& lens = cw.lens;
    const ExtendTileGeometry& geo = cw.work.geo;
    // Q, unscaled; rows past q_len are zero. (Persistent: this warpgroup's GEMMs of the item
    // before, the only readers of its Q rows, have completed.)
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int chunk = wt + i * 128;
      const int row = 64 * c + chunk / kChunks;
      const int col = chunk % kChunks;
      *reinterpret_cast<uint4*>(smem + wgmma_kmajor_chunk_offset(row, col, kRows)) =
          wgmma_extend::q_chunk(p, lens, geo, cw.kv_head, row, col);
    }
    wgmma::fence_proxy_async_shared();  // the Q stores before the async proxy reads them
    mbar::named_sync(2 + c, 128);       // the warpgroup's Q rows all written

    wgmma_extend::Rows<kBf16, kSoftCap> rows(p, lens, geo, c, wt);
    const auto k_addr_of = [&](int t) {
      return ring_addr + static_cast<std::uint32_t>(ws_stage(base + t)) * kStageBytes;
    };
    // Tile t's K and V have landed (the producer's copies, counted on full[s]).
    const auto wait_full = [&](int t) {
      mbar::wait_parity(&full[ws_stage(base + t)], ws_full_parity(base + t));
      wgmma::fence_proxy_async_shared();  // the landed copies before the async proxy reads them
    };
    // Every read of tile t's stage by this thread's warpgroup is complete (after a wgmma wait).
    const auto release = [&](int t) { mbar::arrive(&empty[ws_stage(base + t)]); };
    const auto turns = [&] {
      if constexpr (kPingPong) {
        return Turns{&turn[c], &turn[1 - c], turn_base};
      } else {
        return wgmma_extend::NoTurns{};
      }
    }();
    rows.run_pipelined(cw.tiles, cw.key_first, q_addr, kRows, kKVBytes, wait_full, k_addr_of,
                       release, turns);
    // Persistent: the item's last stage too, for the producer's next item (its PV GEMM has
    // completed: run_pipelined ends with a wait). The single-item kernel never refills it.
    if (kPersistent && cw.tiles > 0) release(cw.tiles - 1);

    // ---- epilogue: this thread's two rows, directly or as a split partial ----
    rows.epilogue(lens, cw.seq, cw.kv_head, cw.direct, cw.item.split);
  };

  if constexpr (kPersistent) {
    int base = 0;  // reduced (ws_next_ring_base), as turn_base and n
    int turn_base = 0;
    for (int n = 0;; n = ws_next_item(n)) {
      // No time limit: the producer may scan many empty cells (a batch of very unlike sequences)
      // before it finds this item, for longer than any honest wait on the ring; that scan always
      // ends (the counter passes the cells), and a deadlock anywhere else still traps: the
      // producer's own waits keep the limit, and a trap ends the whole grid.
      mbar::wait_parity<0>(&item_full[ws_item_slot(n)], ws_item_full_parity(n));
      const WsItem& slot = slots[ws_item_slot(n)];
      if (slot.item < 0) break;  // none left (nobody waits for this slot's release)
      consume(slot.work, base, turn_base);
      const int tiles = slot.work.tiles;
      mbar::arrive(&item_empty[ws_item_slot(n)]);  // done with the slot: it may be rewritten
      base = ws_next_ring_base(base, tiles);
      turn_base = ws_next_turn_base(turn_base, tiles);
    }
  } else {
    consume(cw, 0, 0);
  }
#else
  (void)params;
  (void)sched;
  __trap();  // built for sm_90a only; the host checks the device before launching
#endif
}

}  // namespace

cudaError_t wgmma_ws_extend_ctas_per_sm(bool persistent, int* ctas) {
  return persistent ? resident_ctas_per_sm(wgmma_ws_extend_kernel<true, false, true, true>,
                                           kThreads, smem_bytes(true), ctas)
                    : resident_ctas_per_sm(wgmma_ws_extend_kernel<true, false, false, false>,
                                           kThreads, smem_bytes(false), ctas);
}

cudaError_t wgmma_ws_paged_extend(const PagedExtendParams& params, WsSchedule schedule,
                                  int num_splits, void* workspace, std::int64_t persistent_ctas,
                                  cudaStream_t stream) {
  const int heads = params.layout.num_kv_heads;
  const bool persistent = schedule == WsSchedule::kPingPongPersistent;
  // Persistent: the counter first, the split partials after it.
  void* const partials =
      persistent && workspace != nullptr
          ? static_cast<unsigned char*>(workspace) + detail::kPersistentCounterBytes
          : workspace;
  return wgmma_extend::dispatch(
      params, num_splits, partials, [&]<bool kBf16, bool kSoftCap>(const Fa2Params& kp) {
        const auto kernel = schedule == WsSchedule::kPlain
                                ? wgmma_ws_extend_kernel<kBf16, kSoftCap, false, false>
                            : schedule == WsSchedule::kPingPong
                                ? wgmma_ws_extend_kernel<kBf16, kSoftCap, true, false>
                                : wgmma_ws_extend_kernel<kBf16, kSoftCap, true, true>;
        cudaFuncAttributes attr{};
        const cudaError_t err = cudaFuncGetAttributes(&attr, kernel);
        if (err != cudaSuccess) return err;
        // Started at another per-thread count than the register split assumes, the consumers'
        // setmaxnreg could never be satisfied: refuse rather than hang.
        if (attr.numRegs != kLaunchRegs) return cudaErrorLaunchOutOfResources;
        if (persistent) {
          return wgmma_extend::launch_persistent(kernel, kThreads, smem_bytes(true), kp, kBf16,
                                                 heads, params.num_seqs, persistent_ctas, workspace,
                                                 stream);
        }
        return wgmma_extend::launch_grid(kernel, kThreads, smem_bytes(false), kp, kBf16, heads,
                                         params.num_seqs, stream, detail::PersistentSchedule{});
      });
}

}  // namespace pagedkv::kernels
