"""Block manager and scheduler behaviour: allocation, freeing, chunking, preemption."""

from bessemer.runtime.kv_cache import BlockManager
from bessemer.runtime.llm import LLM, SamplingParams


def test_block_manager_allocates_on_demand_and_frees():
    bm = BlockManager(num_blocks=4, block_size=16)
    table: list[int] = []
    assert bm.can_allocate(table, 33)
    bm.allocate(table, 33)
    assert len(table) == 3 and bm.num_free == 1
    bm.allocate(table, 40)  # still fits in 3 blocks
    assert len(table) == 3
    assert not bm.can_allocate(table, 65)
    bm.free(table)
    assert table == [] and bm.num_free == 4


def test_small_kv_pool_preempts_and_outputs_are_unchanged(tiny_engine):
    engine = tiny_engine("llama-untied", kv_block_size=4, max_seq_len=64)
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    prompts = [[i + 1] * (10 + i) for i in range(6)]
    roomy = LLM(engine, num_threads=2)
    expected = [o.token_ids for o in roomy.generate(prompts, params)]
    # 16 blocks of 4 tokens = one 64-token sequence: six 30-token sequences cannot all fit
    tight = LLM(engine, num_threads=2, kv_cache_gib=0)
    assert tight.num_kv_blocks == 16
    assert [o.token_ids for o in tight.generate(prompts, params)] == expected
    assert tight.num_preemptions > 0
    assert tight.blocks.num_free == tight.num_kv_blocks  # nothing leaked


def test_chunked_prefill_matches_single_prefill(tiny_engine):
    whole = LLM(tiny_engine("qwen2", max_num_tokens=256), num_threads=2)
    chunked = LLM(tiny_engine("qwen2", max_num_tokens=7), num_threads=2)
    prompt = list(range(1, 60))
    params = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
    assert whole.generate([prompt], params)[0].token_ids == chunked.generate([prompt], params)[0].token_ids


def test_prefix_blocks_are_shared_verified_and_evicted_lru():
    bm = BlockManager(num_blocks=4, block_size=4)
    tokens = list(range(10))
    table, keys = [], []
    bm.allocate(table, 10)
    bm.register(tokens, table, 10, keys)  # two full blocks get keys; the partial third none
    assert len(keys) == 2
    hits, hit_keys = bm.match_prefix(tokens, 8)
    assert hits == table[:2] and hit_keys == keys and bm.ref_counts[table[0]] == 2
    other, _ = bm.match_prefix([0, 1, 2, 3, 99, 5, 6, 7], 8)  # diverges in block 2
    assert other == table[:1]
    bm.free(other)
    bm.free(hits)
    first = table[0]
    bm.free(table)
    assert bm.num_free == 4 and len(bm.evictable) == 2  # cached blocks stay, unreferenced
    fresh: list[int] = []
    bm.allocate(fresh, 12)  # 2 never-hashed blocks + the LRU cached one (block 0 was freed last)
    assert bm.num_free == 1 and len(bm.cached) == 1
    assert first in bm.evictable or first in fresh


def test_prefix_cache_hit_gives_the_same_output(tiny_engine):
    engine = tiny_engine("llama-untied", kv_block_size=4)
    system = list(range(3, 43))  # a 40-token shared prefix
    prompts = [system + [100, 101, 102], system + [7, 8]]
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    cold = LLM(engine, num_threads=2, enable_prefix_caching=False)
    expected = [cold.generate([p], params)[0].token_ids for p in prompts]
    warm = LLM(engine, num_threads=2)
    first = warm.generate([prompts[0]], params)[0].token_ids
    assert warm.blocks.num_hit_tokens == 0
    second = warm.generate([prompts[1]], params)[0].token_ids
    assert warm.blocks.num_hit_tokens == 40  # ten full blocks of the prefix reused
    assert [first, second] == expected
    # the whole first request (prompt and generated tokens) is cached for a follow-up turn
    follow = prompts[0] + first + [9]
    before = warm.blocks.num_hit_tokens
    again = warm.generate([follow], params)[0].token_ids
    # 43 prompt + 7 computed generated tokens = 12 full blocks; the follow-up may use all 48
    assert warm.blocks.num_hit_tokens - before == 48
    assert again == cold.generate([follow], params)[0].token_ids
