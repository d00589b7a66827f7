"""The vLLM connector's planning core (tensorlane.vllm._plan): no vLLM, no sidecar. Each
plan is checked by applying it to real tensors (a byte copy per entry) and comparing with
what the blocks and heads should hold, not by re-deriving offsets."""

from __future__ import annotations

import pytest
import torch

from tensorlane.vllm import _plan
from tensorlane.vllm._plan import LayerLayout, PlanError


def _layout_2n(num_blocks, block_size, heads, head_dim, elt=2, hnd=False):
    """(2, blocks, block_size, heads, head_dim): FlashAttention's shape; HND when each
    block's heads are outermost in memory."""
    bb = block_size * heads * head_dim * elt
    return LayerLayout(num_blocks, bb, bb, (0, num_blocks * bb), heads if hnd else 0,
                       block_size * head_dim * elt if hnd else 0)


def _apply(entries, src_layers, dst_layers):
    for e in entries:
        s = src_layers[e.layer].view(-1).view(torch.uint8)
        d = dst_layers[e.layer].view(-1).view(torch.uint8)
        d[e.dst_offset:e.dst_offset + e.nbytes] = s[e.src_offset:e.src_offset + e.nbytes]


def test_coalesce_merges_runs_contiguous_at_both_ends():
    runs = _plan.coalesce([4, 5, 6, 9, 10, 11, 12], [20, 21, 22, 23, 30, 31, 33])
    assert runs == [_plan.Run(4, 20, 3), _plan.Run(9, 23, 1), _plan.Run(10, 30, 2),
                    _plan.Run(12, 33, 1)]
    assert _plan.coalesce([], []) == []
    with pytest.raises(PlanError):
        _plan.coalesce([1, 2], [3])
    assert _plan.blocks_of(_plan.runs_of([7, 8, 9, 2, 3, 40])) == [7, 8, 9, 2, 3, 40]
    assert _plan.runs_of([7, 8, 9, 2, 3, 40]) == [[7, 3], [2, 2], [40, 1]]


def test_whole_blocks_land_in_their_target_blocks_and_nowhere_else():
    torch.manual_seed(1)
    layers, n, bs, h, hd = 3, 12, 4, 2, 8
    src = [torch.randn(2, n, bs, h, hd).to(torch.bfloat16) for _ in range(layers)]
    dst = [torch.zeros(2, n, bs, h, hd, dtype=torch.bfloat16) for _ in range(layers)]
    lay = [_layout_2n(n, bs, h, hd)] * layers
    src_blocks, dst_blocks = [0, 1, 2, 3, 7, 8], [5, 6, 7, 8, 0, 10]
    entries = _plan.plan_entries(lay, lay, src_blocks, dst_blocks)
    # runs (0..3 -> 5..8), (7 -> 0), (8 -> 10): 3 runs x 2 planes x 3 layers
    assert len(entries) == 3 * 2 * layers
    assert entries[0].nbytes == 4 * bs * h * hd * 2
    _apply(entries, src, dst)
    for layer in range(layers):
        for s, d in zip(src_blocks, dst_blocks):
            assert torch.equal(dst[layer][:, d], src[layer][:, s])
        untouched = [b for b in range(n) if b not in dst_blocks]
        assert not dst[layer][:, untouched].any()


def test_block_major_planes_merge_into_one_range_per_run():
    # (blocks, 2, block_size, heads, head_dim): K and V of a block adjacent.
    n, bs, h, hd = 6, 2, 2, 4
    bb = bs * h * hd * 2
    lay = LayerLayout(n, bb, 2 * bb, (0, bb))
    src = [torch.arange(n * 2 * bs * h * hd, dtype=torch.float16).view(n, 2, bs, h, hd)]
    dst = [torch.zeros_like(src[0])]
    entries = _plan.plan_entries([lay], [lay], [1, 2, 3], [2, 3, 4])
    assert entries == [_plan.Entry(0, 2 * bb, 4 * bb, 6 * bb)]
    _apply(entries, src, dst)
    assert torch.equal(dst[0][2:5], src[0][1:4]) and not dst[0][[0, 1, 5]].any()


def test_different_tp_moves_each_decode_rank_its_heads():
    torch.manual_seed(2)
    n, bs, hd, heads = 5, 4, 8, 4

    def hnd_cache(nheads):  # physical (2, blocks, heads, block_size, head_dim)
        return torch.randn(2, n, nheads, bs, hd).to(torch.bfloat16)

    # prefill TP 1 (4 heads), decode TP 2 (2 heads each)
    src = [hnd_cache(heads)]
    src_lay = [_layout_2n(n, bs, heads, hd, hnd=True)]
    dst_lay = [_layout_2n(n, bs, heads // 2, hd, hnd=True)]
    assert _plan.source_ranks(1, 1, 2) == [0]
    for rank in range(2):
        dst = [torch.zeros(2, n, heads // 2, bs, hd, dtype=torch.bfloat16)]
        sl = _plan.head_slice(0, rank, 1, 2, src_lay[0], dst_lay[0])
        assert sl == (2 * rank, 0, 2)
        _apply(_plan.plan_entries(src_lay, dst_lay, [1, 2], [3, 0], sl), src, dst)
        assert torch.equal(dst[0][:, 3], src[0][:, 1, 2 * rank:2 * rank + 2])
        assert torch.equal(dst[0][:, 0], src[0][:, 2, 2 * rank:2 * rank + 2])
        assert not dst[0][:, [1, 2, 4]].any()
    # prefill TP 2, decode TP 1: both prefill ranks write their heads into one decode block
    assert _plan.source_ranks(0, 2, 1) == [0, 1]
    halves = [hnd_cache(2), hnd_cache(2)]
    dst = [torch.zeros(2, n, heads, bs, hd, dtype=torch.bfloat16)]
    for p in range(2):
        sl = _plan.head_slice(p, 0, 2, 1, _layout_2n(n, bs, 2, hd, hnd=True),
                              _layout_2n(n, bs, heads, hd, hnd=True))
        assert sl == (0, 2 * p, 2)
        _apply(_plan.plan_entries([_layout_2n(n, bs, 2, hd, hnd=True)],
                                  [_layout_2n(n, bs, heads, hd, hnd=True)], [4], [1], sl),
               [halves[p]], dst)
    assert torch.equal(dst[0][:, 1], torch.cat([halves[0][:, 4], halves[1][:, 4]], dim=1))


def test_mismatches_are_refused_with_the_reason():
    nhd = _layout_2n(4, 16, 8, 64)
    with pytest.raises(PlanError, match="HND"):
        _plan.head_slice(0, 0, 1, 2, nhd, _layout_2n(4, 16, 4, 64))
    with pytest.raises(PlanError, match="multiple"):
        _plan.source_ranks(0, 2, 3)
    with pytest.raises(PlanError, match="replicated"):
        _plan.head_slice(0, 1, 1, 2, _layout_2n(4, 16, 2, 64, hnd=True),
                         _layout_2n(4, 16, 2, 64, hnd=True))
    with pytest.raises(PlanError, match="differ"):
        _plan.head_slice(0, 0, 1, 1, nhd, _layout_2n(4, 16, 8, 128))
    with pytest.raises(PlanError, match="does not serve"):
        _plan.head_slice(1, 0, 2, 2, nhd, nhd)
    with pytest.raises(PlanError, match="out of range"):
        _plan.plan_entries([nhd], [nhd], [0], [4])


def test_groups_are_split_at_the_entry_limit():
    lay = [_layout_2n(1000, 16, 8, 128)] * 32
    blocks = list(range(0, 1000, 2))[:300]  # nothing contiguous: 300 runs
    entries = _plan.plan_entries(lay, lay, blocks, blocks)
    assert len(entries) == 32 * 2 * 300
    groups = _plan.split_groups(entries)
    assert [len(g) for g in groups] == [16384, 2816]
    assert _plan.plan_entries(lay, lay, list(range(300)), list(range(300)))[0].nbytes == \
        300 * 16 * 8 * 128 * 2  # contiguous: one entry per layer and plane


def test_request_messages_round_trip_in_parts():
    body = {"req": "cmpl-" + "x" * 60, "blocks": _plan.runs_of(list(range(0, 2000, 3)))}
    parts = _plan.encode_request(0x1234, body)
    assert len(parts) > 1 and all(len(p) <= _plan.MAX_PAYLOAD for p in parts)
    r = _plan.Reassembler()
    assert r.feed("node-b", b"something else") is None
    for p in parts[:-1]:
        assert r.feed("node-b", p) is None
        assert r.feed("node-c", _plan.encode_request(7, {"x": 1})[0]) == (7, {"x": 1})
    assert r.feed("node-b", parts[-1]) == (0x1234, body)
    assert len(r) == 0
    with pytest.raises(PlanError, match="part 1 after 0"):
        r.feed("node-b", parts[1])
    payload = _plan.group_payload(0xABCDEF, 1, 2, 3, "req-9")
    assert len(payload) <= _plan.MAX_PAYLOAD
    assert _plan.parse_group_payload(payload) == (0xABCDEF, 1, 2, 3, "req-9")
    assert _plan.parse_group_payload(parts[0]) is None


def test_a_flood_of_first_parts_keeps_the_reassembler_bounded():
    # A peer's messages are input: half-sent requests are capped, the oldest dropped; a request
    # claiming more parts than any real one is refused.
    r = _plan.Reassembler()
    first = [_plan.encode_request(t, {"blocks": list(range(200))})[0]
             for t in range(_plan.MAX_PENDING_REQUESTS + 10)]
    for p in first:
        assert r.feed("node-b", p) is None
    assert len(r) == _plan.MAX_PENDING_REQUESTS and r.dropped == 10
    parts = _plan.encode_request(99999, {"blocks": list(range(200))})
    got = None
    for p in parts:
        got = r.feed("node-c", p)
    assert got == (99999, {"blocks": list(range(200))})  # a new request still goes through
    huge = bytearray(parts[0])
    huge[8:10] = (_plan.MAX_REQUEST_PARTS + 1).to_bytes(2, "little")  # parts
    with pytest.raises(PlanError, match="request part 0/257"):
        r.feed("node-b", bytes(huge))
