"""Counter-based random numbers for sampling: the uniform a sequence draws its token at a
position with is a pure function of (stream key, position, purpose), never of how many
numbers were drawn before. So a seed gives the same tokens whatever else shares the batch,
whether its prefix came from the cache, after a restart, and with or without speculative
decoding (which draws each position's token with that position's own number).

    key      = seed + i        sequence i of a request's n (completion i of n draws as a
                               request with seed + i and n = 1); a request without a seed:
                               the engine's seed + the sequence's arrival order
    bits     = mix(mix(mix(key) ^ position) ^ purpose)      64-bit unsigned arithmetic
    uniform  = (bits >> 11) * 2**-53                        in [0, 1), 53 random bits

`mix` is SplitMix64's output function applied to z + 0x9E3779B97F4A7C15 (Steele, Lea and
Flood 2014): a bijection of 64-bit words whose every output bit depends on every input bit,
so neighbouring keys and positions give unrelated numbers. `position` is the index in the
sequence's token_ids (prompt first) of the token the number draws.
"""

from __future__ import annotations

from dataclasses import dataclass

MASK64 = (1 << 64) - 1
GOLDEN_GAMMA = 0x9E3779B97F4A7C15

# Purposes: what a number is for, so that two uses at one position never share a number by
# accident. The target's token draw and a draft engine's draft at the same position share
# TOKEN on purpose: the draft then equals the target's own draw whenever the two
# distributions agree there (speculative/acceptance.py).
TOKEN = 0


def mix64(z: int) -> int:
    """SplitMix64's step and output function on a 64-bit word."""
    z = (z + GOLDEN_GAMMA) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


@dataclass(frozen=True)
class RandomStream:
    """One sequence's numbers; `key` as the module docstring says (any int, taken mod 2^64)."""

    key: int

    def uniform(self, position: int, purpose: int = TOKEN) -> float:
        """The number in [0, 1) for the token at `position` (>= 0) and `purpose`."""
        bits = mix64(mix64(mix64(self.key & MASK64) ^ position) ^ purpose)
        return (bits >> 11) * 2.0 ** -53
