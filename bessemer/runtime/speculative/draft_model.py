"""Draft-engine drafting: a second, cheaper Bessemer engine with the same tokenizer (a
w4a16 build of the target, or a smaller model of its family) proposes k tokens per step.

The draft engine keeps its own executor, KV pool and block manager, and one mirror
Sequence per target sequence. Before drafting, a mirror is synced to its target: the KV
of tokens the target rejected is dropped (the mirror's computed prefix is cut back to
what both sequences share); then it catches up on the tokens it has not seen (the whole
prompt the first time, chunked by the draft's token budget) and drafts k tokens, one
decode step of the draft engine each, all drafting sequences batched. Greedy targets get
the draft's argmax; sampled ones a draw from the draft's distribution q (temperature,
top-k/p, min-p; no penalties), which the rejection rule needs.
"""

from __future__ import annotations

import hashlib

import numpy as np

from bessemer.errors import EngineLoadError
from bessemer.runtime.engine import Engine
from bessemer.runtime.kv_cache import BlockManager
from bessemer.runtime.model_runner import run_step
from bessemer.runtime.sampler import distribution
from bessemer.runtime.scheduler import ScheduledChunk
from bessemer.runtime.sequence import Sequence


def _tokenizer_digest(engine: Engine) -> str | None:
    path = engine.dir / "tokenizer.json"
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


class DraftModelProposer:
    def __init__(self, engine_dir, target, num_threads: int | None = None, kv_cache_gib: float | None = None,
                 isa: str = "auto", verify_checksum: bool = True):
        """`target`: the LLMEngine whose tokens the drafts continue."""
        self.engine = Engine.load(engine_dir, verify_checksum=verify_checksum)
        if int(self.engine.config.get("mapping", {}).get("tp_size", 1)) != 1:
            raise EngineLoadError(f"draft engine {engine_dir} is tensor-parallel; build the draft with --tp 1")
        vocab = int(self.engine.header["plan"]["vocab_size"])
        if vocab != target.vocab_size or _tokenizer_digest(self.engine) != _tokenizer_digest(target.engine):
            raise EngineLoadError(
                f"draft engine {engine_dir} does not share the target's tokenizer (vocabulary {vocab} vs "
                f"{target.vocab_size}, or another tokenizer.json); build the draft from the same model family")
        build = self.engine.build
        self.block_size = int(build["kv_block_size"])
        self.max_seq_len = int(build["max_seq_len"])
        self.max_num_tokens = int(build["max_num_tokens"])
        self.max_batch_size = int(build["max_batch_size"])
        num_blocks = self.engine.kv_pool_blocks(kv_cache_gib)
        self.executor = self.engine.create_executor(num_threads or target.num_threads, num_blocks, isa)
        self.blocks = BlockManager(num_blocks, self.block_size, enable_prefix_caching=False)
        self.mirrors: dict[int, Sequence] = {}  # target seq_id -> the draft engine's copy

    def release(self, seq: Sequence) -> None:
        """The target sequence finished or was aborted: free its draft KV."""
        mirror = self.mirrors.pop(seq.seq_id, None)
        if mirror is not None:
            self.blocks.free(mirror.block_table)

    def propose(self, requests: list[tuple[Sequence, int]]) -> list[tuple[list[int], list | None]]:
        """requests: (target sequence, at most k drafts). Returns, per request, the drafts
        and, for a sampled sequence, each draft's distribution (candidates, probs)."""
        results: dict[int, tuple[list[int], list]] = {seq.seq_id: ([], []) for seq, _ in requests}
        want = {}
        for seq, k in requests:
            if len(seq.token_ids) + k <= self.max_seq_len:
                self._sync(seq)
                want[seq.seq_id] = k
        mirrors = [self.mirrors[seq.seq_id] for seq, _ in requests if seq.seq_id in want]
        targets = {seq.seq_id: seq for seq, _ in requests}
        while mirrors:
            batch, budget = [], self.max_num_tokens
            for m in mirrors[:self.max_batch_size]:
                n = min(m.num_pending, budget)
                if n == 0 or not self.blocks.can_allocate(m.block_table, m.num_computed + n):
                    continue
                self.blocks.allocate(m.block_table, m.num_computed + n)
                batch.append(ScheduledChunk(m, n))
                budget -= n
            if not batch:  # the draft pool is full: these sequences go without drafts
                break
            logits = run_step(self.executor, batch)  # (completing chunks, vocab)
            row = 0
            for chunk in batch:
                m = chunk.seq
                completes = chunk.completes
                m.num_computed += chunk.num_tokens
                if not completes:
                    continue
                drafts, dists = results[m.seq_id]
                token, dist = self._draw(targets[m.seq_id], logits[row])
                row += 1
                drafts.append(token)
                dists.append(dist)
                m.token_ids.append(token)
                if len(drafts) == want[m.seq_id]:
                    mirrors.remove(m)
        out = []
        for seq, _ in requests:
            drafts, dists = results[seq.seq_id]
            out.append((drafts, dists if seq.params.temperature > 0 else None))
        return out

    def _sync(self, seq: Sequence) -> None:
        """Points the mirror at the target's tokens, keeping the KV of the shared prefix."""
        mirror = self.mirrors.get(seq.seq_id)
        if mirror is None:
            mirror = Sequence(seq.seq_id, [], 0, seq.params, seq.rng)
            self.mirrors[seq.seq_id] = mirror
        limit = min(mirror.num_computed, len(seq.token_ids))
        differ = np.flatnonzero(np.asarray(mirror.token_ids[:limit]) != np.asarray(seq.token_ids[:limit]))
        mirror.num_computed = int(differ[0]) if len(differ) else limit
        mirror.token_ids = list(seq.token_ids)
        self.blocks.trim(mirror.block_table, mirror.num_computed)

    @staticmethod
    def _draw(seq: Sequence, logits: np.ndarray) -> tuple[int, tuple | None]:
        """logits: (vocab,) of the draft engine -> a draft token and q (None when greedy)."""
        p = seq.params
        if p.temperature <= 0:
            return int(np.argmax(logits)), None
        cands, probs = distribution(logits, p.temperature, p.top_k, p.top_p, p.min_p)
        return int(cands[seq.rng.choice(len(cands), p=probs)]), (cands, probs)

