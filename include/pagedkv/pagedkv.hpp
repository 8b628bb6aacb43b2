// pagedkv/pagedkv.hpp: everything host-side in one include (link pagedkv::pagedkv).
//
// Layers, bottom up (docs/architecture.md, "Layers"): base, hash, pool, manager, tier, sched;
// device, reference.
// The CUDA kernels are in pagedkv/cuda.hpp (link pagedkv::cuda).
#pragma once

#include "pagedkv/base/error.hpp"
#include "pagedkv/base/transfer_plan.hpp"
#include "pagedkv/base/version.hpp"
#include "pagedkv/hash/block_hash.hpp"
#include "pagedkv/hash/block_hasher.hpp"
#include "pagedkv/hash/block_sequence.hpp"
#include "pagedkv/hash/request_hasher.hpp"
#include "pagedkv/pool/block_hash_map.hpp"
#include "pagedkv/pool/block_pool.hpp"
#include "pagedkv/pool/free_block_queue.hpp"
#include "pagedkv/pool/kv_cache_block.hpp"
#include "pagedkv/pool/kv_events.hpp"
#include "pagedkv/manager/attention_spec.hpp"
#include "pagedkv/manager/coordinator.hpp"
#include "pagedkv/manager/full_attention.hpp"
#include "pagedkv/manager/kv_cache_manager.hpp"
#include "pagedkv/manager/prefix_cache_stats.hpp"
#include "pagedkv/manager/request.hpp"
#include "pagedkv/manager/sliding_window.hpp"
#include "pagedkv/tier/host_tier_config.hpp"
#include "pagedkv/tier/tiered_kv_cache_manager.hpp"
#include "pagedkv/sched/admission_scheduler.hpp"
#include "pagedkv/sched/prefix_probe.hpp"
#include "pagedkv/device/block_table.hpp"
#include "pagedkv/device/decode_plan.hpp"
#include "pagedkv/device/kv_dtype.hpp"
#include "pagedkv/device/kv_layout.hpp"
#include "pagedkv/device/paged_kv.hpp"
#include "pagedkv/reference/cache_ops.hpp"
#include "pagedkv/reference/decode_attention.hpp"
#include "pagedkv/reference/extend_attention.hpp"
#include "pagedkv/reference/transfer.hpp"
