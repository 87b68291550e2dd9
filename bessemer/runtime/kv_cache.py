"""KV block manager: which blocks of the executor's paged KV pool each sequence owns.

A free list and reference counts; checks come paired with actions (`can_allocate` /
`allocate`). The pool itself lives in C++.

Automatic prefix caching: every full block is keyed by a chained hash of its tokens
(hash of the previous block's key and this block's token ids), so equal prefixes map to
equal keys. A request whose prompt starts with cached blocks shares them (reference
counted) and computes only the rest. Blocks nobody holds keep their contents and key and
are evicted least recently used when a fresh block is needed. A hit is verified against
the stored tokens, so a hash collision can never serve wrong KV.
"""

from __future__ import annotations

from collections import OrderedDict

from bessemer.format.kv import blocks_needed

DEFAULT_KV_CACHE_GIB = 1.0


def pool_size(bytes_per_token: int, block_size: int, max_seq_len: int, max_batch_size: int,
              kv_cache_gib: float | None) -> int:
    """Blocks of the KV pool: enough for a full batch of full-length sequences, capped by
    the memory budget, but never fewer than one full-length sequence needs."""
    budget = int((kv_cache_gib if kv_cache_gib is not None else DEFAULT_KV_CACHE_GIB) * 2**30)
    one_seq = blocks_needed(max_seq_len, block_size)
    return max(one_seq, min(one_seq * max_batch_size, budget // (bytes_per_token * block_size)))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.enable_prefix_caching = enable_prefix_caching
        self.free_blocks = list(range(num_blocks - 1, -1, -1))  # never hashed; pop() gives block 0 first
        self.evictable: OrderedDict[int, None] = OrderedDict()  # unreferenced but cached, LRU first
        self.ref_counts = [0] * num_blocks
        self.block_key: list[int | None] = [None] * num_blocks
        self.block_tokens: list[tuple[int, ...] | None] = [None] * num_blocks
        self.cached: dict[int, int] = {}  # key -> block
        self.num_queried_tokens = 0
        self.num_hit_tokens = 0

    @property
    def num_free(self) -> int:
        """Blocks a new allocation may take (free, or cached but unreferenced)."""
        return len(self.free_blocks) + len(self.evictable)

    def can_allocate(self, block_table: list[int], num_tokens: int) -> bool:
        """Whether `block_table` can grow to hold `num_tokens` tokens."""
        return blocks_needed(num_tokens, self.block_size) - len(block_table) <= self.num_free

    def allocate(self, block_table: list[int], num_tokens: int) -> None:
        """Grows `block_table` in place to hold `num_tokens` tokens."""
        need = blocks_needed(num_tokens, self.block_size) - len(block_table)
        if need > self.num_free:
            raise RuntimeError("KV cache out of blocks (check can_allocate first)")
        for _ in range(max(need, 0)):
            block_table.append(self._take_block())

    def trim(self, block_table: list[int], num_tokens: int) -> None:
        """Shrinks `block_table` in place to the blocks `num_tokens` tokens need (the KV of
        rejected draft tokens is dropped). The dropped tail blocks were never shared or
        cached: only full blocks of verified tokens are."""
        keep = blocks_needed(num_tokens, self.block_size)
        if keep < len(block_table):
            tail = block_table[keep:]
            del block_table[keep:]
            self.free(tail)

    def _take_block(self) -> int:
        if self.free_blocks:
            block = self.free_blocks.pop()
        else:  # evict the least recently used cached block
            block, _ = self.evictable.popitem(last=False)
            del self.cached[self.block_key[block]]
            self.block_key[block] = self.block_tokens[block] = None
        self.ref_counts[block] = 1
        return block

    def free(self, block_table: list[int]) -> None:
        for block in reversed(block_table):
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                if self.block_key[block] is not None:
                    self.evictable[block] = None  # most recently used at the end
                else:
                    self.free_blocks.append(block)
        block_table.clear()

    # ---- prefix caching ----
    @staticmethod
    def chain_key(previous: int | None, tokens: tuple[int, ...]) -> int:
        return hash((previous, tokens))

    def match_prefix(self, token_ids: list[int], max_tokens: int) -> tuple[list[int], list[int]]:
        """Shares the cached full blocks that begin `token_ids` (at most `max_tokens`
        tokens' worth); returns them, referenced, as the start of a block table, and
        their chain keys."""
        if not self.enable_prefix_caching:
            return [], []
        bs = self.block_size
        hits: list[int] = []
        keys: list[int] = []
        key = None
        for start in range(0, max_tokens - bs + 1, bs):
            tokens = tuple(token_ids[start:start + bs])
            key = self.chain_key(key, tokens)
            block = self.cached.get(key)
            if block is None or self.block_tokens[block] != tokens:
                break
            if self.ref_counts[block] == 0:
                self.evictable.pop(block)
            self.ref_counts[block] += 1
            hits.append(block)
            keys.append(key)
        self.num_queried_tokens += max_tokens
        self.num_hit_tokens += len(hits) * bs
        return hits, keys

    def register(self, token_ids: list[int], block_table: list[int], num_computed: int,
                 keys: list[int]) -> None:
        """Records the keys of the blocks of one sequence that became full of computed KV.
        `keys` is the sequence's chain so far, extended in place."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        for b in range(len(keys), num_computed // bs):
            tokens = tuple(token_ids[b * bs:(b + 1) * bs])
            key = self.chain_key(keys[-1] if keys else None, tokens)
            keys.append(key)
            block = block_table[b]
            if key not in self.cached and self.block_key[block] is None:
                self.cached[key] = block
                self.block_key[block], self.block_tokens[block] = key, tokens
