"""A small pure-Python re-implementation of vLLM v1's block pool, for the benchmark only.

NOT vLLM's code (vLLM cannot be installed here): written by us from vLLM's documented design and
the semantics pagedkv shares with it (docs/semantics.md and docs/hashing.md), in vLLM's Python
style, so that its cost per block is comparable:
  - KVCacheBlock: one Python object per block (id, ref count, hash, prev/next free links);
  - FreeKVCacheBlockQueue: a doubly linked list through the blocks with sentinel head and tail,
    O(1) popleft, append and remove;
  - the cached-block map: {hash + 4-byte group id: {block_id: block}}, first inserted wins;
  - hashing: vLLM's `sha256` hash function, SHA-256 of the pickle of (parent hash, tuple of the
    block's token ids, extra keys), chained from a NONE_HASH;
  - the manager's steps: longest hit capped at num_tokens - 1, touch, allocate with lazy
    eviction, cache full blocks, free the chain tail first (unhashed blocks to the head, hashed
    ones to the tail, as docs/semantics.md states).
The replay checks that it produces the same hit tokens and evictions as pagedkv on the same
requests, so both do the same work.
"""

import hashlib
import pickle


def sha256(obj):
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


NONE_HASH = sha256("vllm-none-hash")


def hash_request(tokens, block_size, extra_keys=None):
    """Block hashes of every full block of `tokens` (a list of ints)."""
    out, parent = [], NONE_HASH
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = sha256((parent, tuple(tokens[start:start + block_size]), extra_keys))
        out.append(parent)
    return out


class KVCacheBlock:
    def __init__(self, block_id):
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash = None
        self.prev_free_block = None
        self.next_free_block = None
        self.is_null = False


class FreeKVCacheBlockQueue:
    def __init__(self, blocks):
        self.num_free_blocks = len(blocks)
        self.fake_head = KVCacheBlock(-1)
        self.fake_tail = KVCacheBlock(-1)
        prev = self.fake_head
        for b in blocks:
            prev.next_free_block = b
            b.prev_free_block = prev
            prev = b
        prev.next_free_block = self.fake_tail
        self.fake_tail.prev_free_block = prev

    def popleft_n(self, n):
        out = []
        cur = self.fake_head.next_free_block
        for _ in range(n):
            out.append(cur)
            nxt = cur.next_free_block
            cur.prev_free_block = cur.next_free_block = None
            cur = nxt
        self.fake_head.next_free_block = cur
        cur.prev_free_block = self.fake_head
        self.num_free_blocks -= n
        return out

    def remove(self, b):
        b.prev_free_block.next_free_block = b.next_free_block
        b.next_free_block.prev_free_block = b.prev_free_block
        b.prev_free_block = b.next_free_block = None
        self.num_free_blocks -= 1

    def append_n(self, blocks):
        last = self.fake_tail.prev_free_block
        for b in blocks:
            b.prev_free_block = last
            last.next_free_block = b
            last = b
        last.next_free_block = self.fake_tail
        self.fake_tail.prev_free_block = last
        self.num_free_blocks += len(blocks)

    def prepend_n(self, blocks):
        if not blocks:
            return
        first = self.fake_head.next_free_block
        prev = self.fake_head
        for b in blocks:
            b.prev_free_block = prev
            prev.next_free_block = b
            prev = b
        prev.next_free_block = first
        first.prev_free_block = prev
        self.num_free_blocks += len(blocks)


class BlockPool:
    def __init__(self, num_blocks, group_id=0):
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.null_block = self.free_block_queue.popleft_n(1)[0]
        self.null_block.is_null = True
        self.cached_block_hash_to_block = {}
        self.group_suffix = group_id.to_bytes(4, "big")
        self.evictions = 0

    def get_cached_block(self, block_hash):
        entry = self.cached_block_hash_to_block.get(block_hash + self.group_suffix)
        if not entry:
            return None
        return next(iter(entry.values()))

    def get_new_blocks(self, n):
        out = self.free_block_queue.popleft_n(n)
        for b in out:
            if b.block_hash is not None:          # lazy eviction
                key = b.block_hash + self.group_suffix
                entry = self.cached_block_hash_to_block[key]
                del entry[b.block_id]
                if not entry:
                    del self.cached_block_hash_to_block[key]
                b.block_hash = None
                self.evictions += 1
            b.ref_cnt += 1
        return out

    def touch(self, blocks):
        for b in blocks:
            if b.ref_cnt == 0 and not b.is_null:
                self.free_block_queue.remove(b)
            b.ref_cnt += 1

    def cache_full_blocks(self, blocks, block_hashes, num_cached, num_full):
        for i in range(num_cached, num_full):
            b = blocks[i]
            b.block_hash = block_hashes[i]
            self.cached_block_hash_to_block.setdefault(
                b.block_hash + self.group_suffix, {})[b.block_id] = b

    def free_blocks(self, ordered_blocks):
        unhashed, hashed = [], []
        for b in ordered_blocks:
            b.ref_cnt -= 1
            if b.ref_cnt == 0 and not b.is_null:
                (hashed if b.block_hash is not None else unhashed).append(b)
        self.free_block_queue.prepend_n(unhashed)
        self.free_block_queue.append_n(hashed)


class Manager:
    """The engine-facing steps, one full-attention group."""

    def __init__(self, num_blocks, block_size):
        self.pool = BlockPool(num_blocks)
        self.block_size = block_size
        self.req_to_blocks = {}

    def get_computed_blocks(self, num_tokens, block_hashes):
        hit = []
        for h in block_hashes[: (num_tokens - 1) // self.block_size]:
            b = self.pool.get_cached_block(h)
            if b is None:
                break
            hit.append(b)
        return hit, len(hit) * self.block_size

    def allocate_slots(self, request_id, num_tokens, block_hashes, num_new_tokens, hit):
        bs = self.block_size
        need = -(-(len(hit) * bs + num_new_tokens) // bs) - len(hit)
        evictable_hits = sum(1 for b in hit if b.ref_cnt == 0)
        if need + evictable_hits > self.pool.free_block_queue.num_free_blocks:
            return None
        self.pool.touch(hit)
        blocks = hit + self.pool.get_new_blocks(need)
        self.req_to_blocks[request_id] = blocks
        self.pool.cache_full_blocks(blocks, block_hashes, len(hit), num_tokens // bs)
        return blocks[len(hit):]

    def free(self, request_id):
        self.pool.free_blocks(reversed(self.req_to_blocks.pop(request_id)))
