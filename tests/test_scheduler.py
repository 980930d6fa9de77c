"""Scheduler and block manager behaviour, without a model."""
from infragent.engine.block_manager import BlockManager
from infragent.engine.sampling import SamplingParams
from infragent.engine.scheduler import Scheduler
from infragent.engine.sequence import Sequence, SequenceStatus


def make_seq(n: int, first: int = 0) -> Sequence:
    return Sequence(list(range(first, first + n)), SamplingParams(max_tokens=8))


def complete(batch, sampled_token: int = 7) -> None:
    """Pretend the runner computed the batch: advance progress, append a token where one is due."""
    for seq, n in zip(batch.seqs, batch.num_new_tokens):
        seq.num_computed_tokens += n
        if seq.num_computed_tokens == len(seq):
            seq.output_token_ids.append(sampled_token)


def test_chunked_prefill_shares_budget_with_decodes():
    sched = Scheduler(max_num_seqs=8, max_num_batched_tokens=10, blocks=BlockManager(64, 4, False), slots=None)
    a, b = make_seq(6), make_seq(25, 100)
    sched.add(a)
    batch = sched.schedule()
    assert batch.num_new_tokens == [6]
    complete(batch)
    sched.add(b)
    batch = sched.schedule()
    # a decodes one token, b's prompt is chunked into the 9 tokens left of the budget.
    assert batch.seqs == [a, b] and batch.num_new_tokens == [1, 9]
    complete(batch)
    batch = sched.schedule()
    assert batch.num_new_tokens == [1, 9]
    complete(batch)
    batch = sched.schedule()
    assert batch.num_new_tokens == [1, 7]  # b's remaining 7 prompt tokens
    complete(batch)
    assert len(b.output_token_ids) == 1


def test_max_num_seqs_and_fcfs():
    sched = Scheduler(max_num_seqs=2, max_num_batched_tokens=100, blocks=BlockManager(64, 4, False), slots=None)
    seqs = [make_seq(3, 10 * i) for i in range(4)]
    for s in seqs:
        sched.add(s)
    batch = sched.schedule()
    assert batch.seqs == seqs[:2]
    assert [s.status for s in seqs] == [SequenceStatus.RUNNING] * 2 + [SequenceStatus.WAITING] * 2
    complete(batch)
    sched.finish(seqs[0])
    batch = sched.schedule()
    assert batch.seqs == [seqs[1], seqs[2]]  # the oldest waiting request is admitted first


def test_preemption_by_recompute_when_blocks_run_out():
    blocks = BlockManager(num_blocks=4, block_size=4, enable_prefix_caching=False)
    sched = Scheduler(max_num_seqs=4, max_num_batched_tokens=100, blocks=blocks, slots=None)
    a, b = make_seq(8), make_seq(8, 50)
    sched.add(a)
    sched.add(b)
    complete(sched.schedule())  # both prompts fill all 4 blocks; each sampled one token
    assert blocks.num_free_blocks == 0
    batch = sched.schedule()  # a needs a 3rd block: b (the newest) is preempted
    assert batch.seqs == [a] and batch.num_preempted == 1
    assert b.status is SequenceStatus.WAITING and b.num_computed_tokens == 0 and b.block_table == []
    assert sched.waiting[0] is b and b.num_preemptions == 1
    complete(batch)
    sched.finish(a)
    batch = sched.schedule()
    # b recomputes its prompt and its generated token in one go.
    assert batch.seqs == [b] and batch.num_new_tokens == [9]


def test_prefix_cache_hits_share_blocks_and_skip_compute():
    blocks = BlockManager(num_blocks=16, block_size=4, enable_prefix_caching=True)
    sched = Scheduler(max_num_seqs=4, max_num_batched_tokens=100, blocks=blocks, slots=None)
    a = make_seq(10)
    sched.add(a)
    complete(sched.schedule())
    blocks.register_full_blocks(a)
    b = Sequence(list(range(9)) + [999, 998], SamplingParams())
    sched.add(b)
    batch = sched.schedule()
    # b shares a's first two full blocks (8 tokens) and computes only the rest.
    assert b.num_cached_tokens == 8 and b.block_table[:2] == a.block_table[:2]
    assert batch.num_new_tokens[-1] == len(b) - 8
    assert blocks.ref_counts[a.block_table[0]] == 2
    sched.finish(a)
    sched.finish(b)
    assert blocks.num_free_blocks == 16


def test_prefix_cache_survives_free_until_block_reused():
    blocks = BlockManager(num_blocks=4, block_size=4, enable_prefix_caching=True)
    a = make_seq(8)
    blocks.allocate(a, 8)
    a.num_computed_tokens = 8
    blocks.register_full_blocks(a)
    blocks.free_seq(a)
    again = make_seq(9)
    blocks.reuse_cached_prefix(again)
    assert again.num_cached_tokens == 8
    # A fully cached prompt still computes its last token (logits are needed).
    exact = make_seq(8)
    blocks.reuse_cached_prefix(exact)
    assert exact.num_cached_tokens == 4


def test_freed_blocks_are_reused_before_a_never_used_one_so_memory_follows_the_peak():
    blocks = BlockManager(num_blocks=64, block_size=4, enable_prefix_caching=False)
    for i in range(20):  # one request after another: the pool's pages touched stay at one request's worth
        seq = make_seq(10 + i % 3, first=100 * i)
        blocks.allocate(seq, len(seq))
        blocks.free_seq(seq)
    assert blocks.num_used_ever == 3 and blocks.num_free_blocks == 64  # without prefix caching
    both = [make_seq(8), make_seq(8, first=50)]
    for seq in both:
        blocks.allocate(seq, 8)
    assert blocks.num_used_ever == 4  # the peak of two requests at once


def test_a_cached_prefix_is_evicted_oldest_first_and_only_after_plain_and_unused_blocks():
    blocks = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=True)
    old, new = make_seq(9), make_seq(9, first=40)
    for seq in (old, new):
        blocks.allocate(seq, 9)
        seq.num_computed_tokens = 9
        blocks.register_full_blocks(seq)  # two full blocks each are findable; the third is partly filled
    old_blocks, new_blocks = list(old.block_table), list(new.block_table)
    blocks.free_seq(old)
    blocks.free_seq(new)
    plain = make_seq(16, first=80)
    blocks.allocate(plain, 16)  # the two partly filled blocks first, then the two never used
    assert sorted(plain.block_table) == sorted([old_blocks[2], new_blocks[2], 6, 7])
    probe = make_seq(9)
    blocks.reuse_cached_prefix(probe)
    assert probe.num_cached_tokens == 8  # old's prefix is still findable; used now, it is the newest
    blocks.free_seq(probe)
    evicting = make_seq(4, first=120)
    blocks.allocate(evicting, 4)
    assert evicting.block_table == [new_blocks[1]]  # no unused block left: the least recently freed cached one
    again, kept = make_seq(9, first=40), make_seq(9)
    blocks.reuse_cached_prefix(again)
    blocks.reuse_cached_prefix(kept)
    assert again.num_cached_tokens == 4 and kept.num_cached_tokens == 8  # new's chain lost its second block
