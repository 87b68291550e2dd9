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
