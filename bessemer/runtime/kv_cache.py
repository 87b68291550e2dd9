"""KV block manager: which blocks of the executor's paged KV pool each sequence owns.

A free list and reference counts (a block can later be shared by prefix caching); checks
come paired with actions (`can_allocate` / `allocate`). The pool itself lives in C++.
"""

from __future__ import annotations


def blocks_needed(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.free_blocks = list(range(num_blocks - 1, -1, -1))  # pop() hands out block 0 first
        self.ref_counts = [0] * num_blocks

    @property
    def num_free(self) -> int:
        return len(self.free_blocks)

    def can_allocate(self, block_table: list[int], num_tokens: int) -> bool:
        """Whether `block_table` can grow to hold `num_tokens` tokens."""
        return blocks_needed(num_tokens, self.block_size) - len(block_table) <= self.num_free

    def allocate(self, block_table: list[int], num_tokens: int) -> None:
        """Grows `block_table` in place to hold `num_tokens` tokens."""
        need = blocks_needed(num_tokens, self.block_size) - len(block_table)
        if need > self.num_free:
            raise RuntimeError("KV cache out of blocks (check can_allocate first)")
        for _ in range(max(need, 0)):
            block = self.free_blocks.pop()
            self.ref_counts[block] = 1
            block_table.append(block)

    def free(self, block_table: list[int]) -> None:
        for block in reversed(block_table):
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self.free_blocks.append(block)
        block_table.clear()
