"""Draft-engine drafting: a second, cheaper Bessemer engine with the same tokenizer (a
w4a16 build of the target, or a smaller model of its family) proposes k tokens per step.

The draft engine keeps its own executor, KV pool and block manager, and one mirror
Sequence per target sequence. Its executor is its target's (cpu or cuda, whatever the
target engine's is), opened through the target interface and stepped through the Executor
protocol alone (runtime/executor.py): draft_run_options says which of the target engine's
run options it shares. Before drafting, a mirror is synced to its target: the KV
of tokens the target rejected is dropped (the mirror's computed prefix is cut back to
what both sequences share); then it catches up on the tokens it has not seen and drafts
k tokens, one decode step of the draft engine each, all drafting sequences batched.
Greedy targets get the draft's argmax; sampled ones a draw from the draft's distribution
(temperature, top-k/p, min-p; no penalties) with the target sequence's own uniform for
that position (runtime/random_stream.py): where the draft's distribution is close to the
target's, the draft is the token the target draws there, which is what it accepts
(acceptance.py).

Catching up is bounded and shared. The draft pool caches prefixes like the target's
(kv_cache.py): full blocks of target tokens are registered, so the n sequences of one
request, or requests with a common prompt, prefill it once; a fresh mirror whose blocks
another mirror is computing in the same draft step waits one step and shares them. One
call computes at most max_num_tokens catch-up tokens in all, so a long prompt cannot
stall every other request's step: a mirror still behind gets no drafts and goes on
catching up in the next steps.
"""

from __future__ import annotations

import hashlib

import numpy as np

from bessemer.errors import BessemerError, EngineLoadError
from bessemer.runtime.engine import Engine
from bessemer.runtime.kv_cache import BlockManager
from bessemer.runtime.model_runner import run_step
from bessemer.runtime.sampler import sample
from bessemer.runtime.scheduler import ScheduledChunk
from bessemer.runtime.sequence import Sequence
from bessemer.targets import RunOptions

# run options a draft shares with its target engine when both have the same target (each
# target refuses the other's: a cpu draft of a cuda target gets its own defaults)
SAME_TARGET_OPTIONS = {"cpu": ("isa",), "cuda": ("device", "enforce_eager", "interpret")}


def _tokenizer_digest(engine: Engine) -> str | None:
    path = engine.dir / "tokenizer.json"
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


def draft_run_options(options: RunOptions, target, draft: Engine) -> RunOptions:
    """How the draft engine runs, from its target's run options (`target`: the LLMEngine).
    Its KV pool holds as many tokens as the target's (a mirror never holds more than its
    target sequence and k drafts), in the draft's own bytes per token, unless --kv-cache-gib
    gives both a budget: on one GPU the target has already taken its share of the memory,
    so the draft cannot size its pool from a share of it. Threads: the target's (a cpu
    target's per rank)."""
    same = draft.target.name == target.engine.target.name
    shared = {name: getattr(options, name) for name in SAME_TARGET_OPTIONS.get(draft.target.name, ()) if same}
    kv_gib = options.kv_cache_gib
    if kv_gib is None:
        kv_gib = target.num_kv_blocks * target.block_size * draft.kv_bytes_per_token() / 2**30
    return RunOptions(num_threads=target.num_threads if same and draft.target.name == "cpu" else None,
                      kv_cache_gib=kv_gib, verify_checksum=options.verify_checksum, **shared)


class DraftModelProposer:
    def __init__(self, engine_dir, target, options: RunOptions = RunOptions()):
        """`target`: the LLMEngine whose tokens the drafts continue; `options`: its run options."""
        self.engine = Engine.load(engine_dir, verify_checksum=options.verify_checksum)
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
        try:
            opened = self.engine.target.open_executor(self.engine, draft_run_options(options, target, self.engine))
        except BessemerError as e:  # name the engine: the target engine loaded fine
            raise type(e)(f"draft engine {engine_dir}: {e}") from None
        self.executor = opened.executor
        self.blocks = BlockManager(opened.num_kv_blocks, self.block_size, enable_prefix_caching=True)
        # target seq_id -> the draft engine's copy; a mirror's "prompt" (num_prompt_tokens) is
        # its target's tokens at the last sync, its "output" the drafts it made since
        self.mirrors: dict[int, Sequence] = {}
        self.num_prefill_tokens = 0  # tokens computed to catch mirrors up (all but those drafts come from)

    def close(self) -> None:
        self.executor.close()

    def release(self, seq: Sequence) -> None:
        """The target sequence finished or was aborted: free its draft KV."""
        mirror = self.mirrors.pop(seq.seq_id, None)
        if mirror is not None:
            self.blocks.free(mirror.block_table)

    def propose(self, requests: list[tuple[Sequence, int]]) -> list[list[int]]:
        """requests: (target sequence, at most k drafts). Returns each one's drafts."""
        results: dict[int, list[int]] = {seq.seq_id: [] for seq, _ in requests}
        want = {}
        for seq, k in requests:
            if len(seq.token_ids) + k <= self.max_seq_len:
                self._sync(seq)
                want[seq.seq_id] = k
        drafting = [self.mirrors[seq_id] for seq_id in want]
        catch_up = self.max_num_tokens
        while drafting:
            batch, catch_up = self._schedule(drafting, catch_up)
            if not batch:  # every mirror left was dropped (catch-up budget or draft KV spent)
                break
            logits = run_step(self.executor, batch)  # (completing chunks, vocab)
            row = 0
            for chunk in batch:
                m = chunk.seq
                completes = chunk.completes
                self.num_prefill_tokens += chunk.num_tokens - int(completes)
                m.num_computed += chunk.num_tokens
                self.blocks.register(m.token_ids, m.block_table, min(m.num_computed, m.num_prompt_tokens),
                                     m.block_keys)
                if not completes:
                    continue
                drafts = results[m.seq_id]
                token = self._draw(m, logits[row])
                row += 1
                drafts.append(token)
                m.token_ids.append(token)
                if len(drafts) == want[m.seq_id]:
                    drafting.remove(m)
        return [results[seq.seq_id] for seq, _ in requests]

    def _schedule(self, drafting: list[Sequence], catch_up: int) -> tuple[list[ScheduledChunk], int]:
        """One draft step: each drafting mirror's pending tokens, within the step's token and
        sequence budgets. Every pending token but the last (the one the next draft is decoded
        from) spends `catch_up`, the call's budget; a mirror it cannot serve, or the draft KV
        pool cannot hold, leaves `drafting` (no drafts in this step). Returns the chunks and
        the catch-up budget left."""
        batch: list[ScheduledChunk] = []
        budget, in_flight = self.max_num_tokens, set()
        # mirrors under way before fresh ones, which may then share the blocks they compute;
        # the least behind first, so that one long catch-up does not cost the others their drafts
        for m in sorted(drafting, key=lambda m: (not m.block_table, m.num_pending)):
            if len(batch) == self.max_batch_size or budget == 0:
                break
            if not m.block_table:
                if catch_up == 0:  # it would hold its cached prefix while another mirror extends it
                    drafting.remove(m)
                    continue
                if not self._start(m, in_flight):
                    continue  # waits for the blocks another mirror computes in this step
            n = min(m.num_pending if m.num_pending - 1 <= catch_up else catch_up, budget)
            if n == 0 or not self.blocks.can_allocate(m.block_table, m.num_computed + n):
                drafting.remove(m)
                continue
            self.blocks.allocate(m.block_table, m.num_computed + n)
            in_flight.update(self._chain_keys(m, m.num_computed + n))
            batch.append(ScheduledChunk(m, n))
            budget -= n
            catch_up -= n - int(n == m.num_pending)
        return batch, catch_up

    def _start(self, m: Sequence, in_flight: set[int]) -> bool:
        """Starts a fresh mirror after the cached blocks its tokens begin with. False, taking
        nothing, when a mirror in this step computes one of its blocks (the n sequences of a
        request all start in the same step): computing it twice is what sharing saves."""
        if in_flight and in_flight.intersection(self._chain_keys(m, m.num_prompt_tokens)):
            return False
        bs = self.block_size
        # at least one token is computed: the first draft is decoded from the last
        m.block_table, m.block_keys = self.blocks.match_prefix(m.token_ids, (m.num_prompt_tokens - 1) // bs * bs)
        m.num_computed = len(m.block_table) * bs
        return True

    def _chain_keys(self, m: Sequence, end: int) -> list[int]:
        """Prefix-cache keys of m's full blocks of target tokens before position `end`, past
        those it registered. Drafts are never keyed: their KV is cut back when rejected."""
        bs, keys = self.block_size, []
        key = m.block_keys[-1] if m.block_keys else None
        for b in range(len(m.block_keys), min(end, m.num_prompt_tokens) // bs):
            key = BlockManager.chain_key(key, tuple(m.token_ids[b * bs:(b + 1) * bs]))
            keys.append(key)
        return keys

    def _sync(self, seq: Sequence) -> None:
        """Points the mirror at the target's tokens, keeping the KV of the shared prefix.
        A target's tokens only grow, and a mirror's prompt is a copy of them, so only its
        drafts can differ: syncing costs O(k), not O(sequence length). Registered blocks
        hold prompt tokens only, so the cut never reaches them."""
        mirror = self.mirrors.get(seq.seq_id)
        if mirror is None:
            mirror = self.mirrors[seq.seq_id] = Sequence(seq.seq_id, [], 0, seq.params, seq.stream)
        seen = mirror.num_prompt_tokens
        limit = min(mirror.num_computed, len(seq.token_ids))
        same = min(seen, limit)
        while same < limit and mirror.token_ids[same] == seq.token_ids[same]:
            same += 1
        mirror.num_computed = same
        mirror.token_ids[seen:] = seq.token_ids[seen:]
        mirror.num_prompt_tokens = len(seq.token_ids)
        self.blocks.trim(mirror.block_table, mirror.num_computed)

    @staticmethod
    def _draw(mirror: Sequence, logits: np.ndarray) -> int:
        """logits: (vocab,) of the draft engine -> the draft for the mirror's next position,
        drawn with the target's uniform for it (the mirror shares its target's stream and
        positions)."""
        p = mirror.params
        return sample(logits, p.temperature, p.top_k, p.top_p, mirror.stream.uniform(len(mirror.token_ids)), p.min_p)

