"""pagedkv: paged KV cache with automatic prefix caching, in vLLM v1's semantics.

A Python engine's scheduler step::

    import numpy as np, pagedkv

    kv = pagedkv.KVCacheManager(num_blocks=1 + kv_bytes // block_bytes, block_size=16,
                                hash_seed="my-cluster")
    req = kv.make_request(0, np.asarray(prompt, dtype=np.int32), cache_salt="tenant-42")
    hit = kv.get_computed_blocks(req)            # blocks, num_hit_tokens = hit
    new = kv.allocate_slots(req, req.num_tokens - hit.num_tokens, hit)
    if new is None: ...                          # does not fit: nothing changed
    table = kv.block_table([req])                # int32 [1, n] for the attention kernel
    req.num_computed_tokens = req.num_tokens
    req.append_token(sampled)
    kv.allocate_slots(req, 1)
    kv.free(req)

Errors: misuse raises pagedkv.Error (a RuntimeError; .code is a pagedkv.ErrorCode) with the C++
library's message, before any state changes. Running out of blocks is a return value (None).

Arrays and lifetimes:
  - token inputs: any 1-D integer sequence; a C-contiguous int32 numpy array is read in place,
    anything else is converted once (out-of-range values raise, never wrap).
  - CacheHit.blocks / CacheHit.group(g): zero-copy, read-only views of the hit, which nothing
    mutates; a view keeps its CacheHit alive.
  - KVCacheManager.block_ids / allocate_slots / block_table / slot_mapping, Request.all_token_ids:
    new arrays (copies). A request's row grows and is freed by later calls, so a view of it
    could dangle; block_table(out=...) fills a preallocated array instead (e.g. for a CUDA graph).
  - make_block_table / slot_mapping (module level): arrays that own the library's output
    vectors (no copy).

Threads: calls whose work grows with tokens or blocks (make_request, get_computed_blocks,
allocate_slots, free, preempt, append_tokens) release the GIL when their input is 4096 tokens or
more (releasing and re-taking it costs more than a short call saves); hash_blocks and
check_invariants always do. A
manager and its requests belong to one scheduler thread; touching one from a second thread while
a call is in flight raises pagedkv.Error (INVALID_STATE) instead of racing. BlockHasher is
immutable and may be shared.

Events (KVCacheManager(enable_kv_events=True).take_events()): BlockStored, BlockRemoved and
AllBlocksCleared with vLLM's field names; block_hashes / parent_block_hash are vLLM's 64-bit int
form (event_id of the digest), block_digests / parent_block_digest the full digests, seq the
gap-free sequence number.

Host tier (TieredKVCacheManager): get_computed_blocks -> TieredCacheHit (GPU blocks, then host
slots); allocate_slots -> TierAllocation whose .transfers (a TierPlan) holds each stage as a
read-only int32 [n, 2] view of (src, dst) rows (evictions and stores: GPU block -> host slot;
loads: host slot -> GPU block) and uint64 ids to commit(); finish_loads -> LoadResult. Views keep
their plan alive. Events carry medium "GPU" or "CPU".

KV sizing and FP8 (docs/fp8.md): KVCacheSpec(num_layers, num_kv_heads, head_dim, dtype,
scale_mode) with KVDtype / KVScaleMode (or their names, "fp8_e4m3", "per_token_head");
kv_bytes_per_token / kv_bytes_per_block / num_blocks_for_budget size a pool from memory, scales
included. float_to_fp8_bits / fp8_bits_to_float, quantize_fp8 / dequantize_fp8 (per-tensor scale)
and quantize_fp8_rows (per-(token, head) scales over the last axis) compute the library's exact
bytes on numpy arrays (values are rounded to float32 first), e.g. to check an engine's own kernels.

KVEventPublisher (when HAS_EVENTS): vLLM's ZmqEventPublisher; publish(events) takes event objects,
publish_from(manager) takes a manager's pending events without making Python objects.
"""

from ._pagedkv import (
    Admission,
    AdmissionScheduler,
    AllBlocksCleared,
    BlockRetention,
    DEFAULT_RETENTION_PRIORITY,
    EVICTION_POLICIES,
    KvCacheRetentionConfig,
    MAX_RETENTION_PRIORITY,
    RetentionClassStats,
    RetentionStats,
    TokenRangeRetentionConfig,
    AttentionKind,
    AttentionSpec,
    BlockHasher,
    BlockRemoved,
    BlockStored,
    CacheHit,
    CachedPrefix,
    Error,
    ErrorCode,
    FullAttentionSpec,
    HAS_EVENTS,
    HashScheme,
    HostPolicy,
    KVCacheManager,
    KVCacheManagerSnapshot,
    KVCacheSpec,
    KVDtype,
    KVScaleMode,
    LoadResult,
    PrefixCacheStats,
    Proposal,
    Request,
    SKIP_SLOT,
    SlidingWindowSpec,
    TierAllocation,
    TierGroupStats,
    TierPlan,
    TierStats,
    TieredCacheHit,
    TieredKVCacheManager,
    TieredSnapshot,
    WindowStoreRule,
    __version__,
    digest_size,
    event_id,
    make_block_table,
    dequantize_fp8,
    float_to_fp8_bits,
    fp8_bits_to_float,
    kv_bytes_per_block,
    kv_bytes_per_token,
    num_blocks_for_budget,
    quantize_fp8,
    quantize_fp8_rows,
    raw_digest,
    slot_mapping,
    slot_of,
    validate_block_table,
)

__all__ = [
    "BlockRetention",
    "DEFAULT_RETENTION_PRIORITY",
    "EVICTION_POLICIES",
    "KvCacheRetentionConfig",
    "MAX_RETENTION_PRIORITY",
    "RetentionClassStats",
    "RetentionStats",
    "TokenRangeRetentionConfig",
    "Admission",
    "AdmissionScheduler",
    "AllBlocksCleared",
    "AttentionKind",
    "AttentionSpec",
    "BlockHasher",
    "BlockRemoved",
    "BlockStored",
    "CacheHit",
    "CachedPrefix",
    "Error",
    "ErrorCode",
    "FullAttentionSpec",
    "HAS_EVENTS",
    "HashScheme",
    "HostPolicy",
    "KVCacheManager",
    "KVCacheManagerSnapshot",
    "KVCacheSpec",
    "KVDtype",
    "KVScaleMode",
    "LoadResult",
    "PrefixCacheStats",
    "Proposal",
    "Request",
    "SKIP_SLOT",
    "SlidingWindowSpec",
    "TierAllocation",
    "TierGroupStats",
    "TierPlan",
    "TierStats",
    "TieredCacheHit",
    "TieredKVCacheManager",
    "TieredSnapshot",
    "WindowStoreRule",
    "__version__",
    "digest_size",
    "event_id",
    "make_block_table",
    "dequantize_fp8",
    "float_to_fp8_bits",
    "fp8_bits_to_float",
    "kv_bytes_per_block",
    "kv_bytes_per_token",
    "num_blocks_for_budget",
    "quantize_fp8",
    "quantize_fp8_rows",
    "raw_digest",
    "slot_mapping",
    "slot_of",
    "validate_block_table",
]

if HAS_EVENTS:  # built with the events layer (ZeroMQ, msgpack)
    from ._pagedkv import KVEventPublisher, KVEventPublisherStats  # noqa: F401

    __all__ += ["KVEventPublisher", "KVEventPublisherStats"]
