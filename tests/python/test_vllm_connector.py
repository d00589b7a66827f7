"""tensorlane.vllm.TensorlaneConnector against real sidecars (node-a: the prefill instance,
node-b: the decode instance) with real CPU paged KV caches in tensorlane memory, driven by
stand-ins that replay vLLM v0.11.0's scheduler and worker calls (vllm_standins.py). vLLM
itself is not installed here: the adapter runs on its stand-in base class, and the
import-time check of vLLM's base class is tested with fake vllm packages in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import tensorlane
from conftest import FAST_TCP
from tensorlane.testing import LocalCluster
from tensorlane.vllm import _connector

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vllm_standins as sv  # noqa: E402


@pytest.fixture
def pd():
    """A prefill and a decode instance (TP 1, 4 layers x 64 blocks x 16 tokens, bf16)."""
    made = []

    def make(cluster=None, *, p_tp=1, d_tp=1, hnd=False, heads=4, extra=None, d_extra=None):
        c = cluster or LocalCluster(("node-a", "node-b"), tcp=FAST_TCP).start()
        if cluster is None:
            made.append(c)
        p = sv.Instance("kv_producer", "prefill-e", c.socket("node-a"), tp=p_tp, hnd=hnd,
                        heads=heads, extra=extra)
        d = sv.Instance("kv_consumer", "decode-e", c.socket("node-b"), tp=d_tp, hnd=hnd,
                        heads=heads, extra={**(extra or {}), **(d_extra or {})})
        made.append(p)
        made.append(d)
        return c, p, d

    yield make
    for m in reversed(made):
        if isinstance(m, sv.Instance):
            m.shutdown()
        else:
            m.stop()


def _transfer(p, d, n_requests, prompt_tokens=100, contiguous=False, tag=""):
    reqs = []
    for i in range(n_requests):
        preq, pblocks, params = sv.prefill_request(p, f"p-{tag}{i}", prompt_tokens, seed=i,
                                                   contiguous=contiguous)
        dreq, dblocks = sv.decode_request(d, f"d-{tag}{i}", prompt_tokens, params,
                                          contiguous=contiguous)
        reqs.append((preq, pblocks, dreq, dblocks))
    sv.run_until([p, d], lambda: {r[2].request_id for r in reqs} <= d.finished_recving
                 and {r[0].request_id for r in reqs} <= p.finished_sending)
    return reqs



def _check_landed(p, d, reqs):
    """Every layer of every rank: each decode block holds its prefill block; every block no
    request was given is still zero."""
    used = set()
    for _, pblocks, _, dblocks in reqs:
        n = len(dblocks)
        used |= set(dblocks)
        for r in range(d.tp):
            for layer in range(len(d.caches[r])):
                assert torch.equal(sv.block_view(d, r, layer, dblocks),
                                   sv.block_view(p, r, layer, pblocks[:n])), (r, layer)
    rest = [b for b in range(d.num_blocks) if b not in used]
    for r in range(d.tp):
        for layer in range(len(d.caches[r])):
            assert not sv.block_view(d, r, layer, rest).any()


def test_a_batch_of_requests_lands_exactly_in_the_decode_blocks(pd):
    _, p, d = pd()
    reqs = _transfer(p, d, 5)
    _check_landed(p, d, reqs)
    assert not d.load_errors
    w = p.workers[0]
    # scattered blocks: one group per request, entries = runs x 2 planes x 4 layers
    for preq, pblocks, dreq, dblocks in reqs:
        runs = len(sv._connector._plan.coalesce(pblocks[:len(dblocks)], dblocks))
        assert w.sent_entries[preq.request_id] == [runs * 2 * 4]
        assert dreq.request_id in d.workers[0].recv_seconds
    # the prefill's blocks were handed back to vLLM once sent, not before
    assert p.finished_sending == {f"p-{i}" for i in range(5)}


def test_contiguous_blocks_coalesce_into_one_entry_per_layer_and_plane(pd):
    _, p, d = pd()
    reqs = _transfer(p, d, 2, prompt_tokens=150, contiguous=True)
    _check_landed(p, d, reqs)
    for preq, *_ in reqs:
        assert p.workers[0].sent_entries[preq.request_id] == [2 * 4]


def test_a_prefix_hit_at_the_decode_moves_only_the_missing_blocks(pd):
    _, p, d = pd()
    preq, pblocks, params = sv.prefill_request(p, "p-0", 100, seed=3)
    dreq = sv.Request("d-0", list(range(100)), dict(params))
    n, is_async = d.scheduler.get_num_new_matched_tokens(dreq, 32)  # 2 blocks cached locally
    assert (n, is_async) == (68, True)
    dblocks = d.allocate(5)
    d.scheduler.update_state_after_alloc(dreq, sv.KVCacheBlocks(dblocks), n)
    assert not dreq.kv_transfer_params["do_remote_prefill"]  # asked once
    sv.run_until([p, d], lambda: "d-0" in d.finished_recving and "p-0" in p.finished_sending)
    for layer in range(4):
        assert torch.equal(sv.block_view(d, 0, layer, dblocks),
                           sv.block_view(p, 0, layer, pblocks[2:7]))


def test_requests_without_a_transfer_are_left_to_vllm(pd):
    _, p, d = pd()
    plain = sv.Request("x", list(range(40)))
    assert d.scheduler.get_num_new_matched_tokens(plain, 0) == (0, False)
    assert p.scheduler.request_finished(plain, [1, 2]) == (False, None)
    aborted = sv.Request("y", list(range(40)), {"do_remote_decode": True},
                         sv.RequestStatus.FINISHED_ABORTED)
    assert p.scheduler.request_finished(aborted, [1, 2, 3]) == (False, None)
    meta = p.scheduler.build_connector_meta(sv.SchedulerOutput())
    assert meta.reqs_to_send == {} and meta.reqs_to_recv == {}


def test_decode_with_more_tp_ranks_gets_its_slice_of_the_heads(pd):
    _, p, d = pd(p_tp=1, d_tp=2, hnd=True)
    preq, pblocks, params = sv.prefill_request(p, "p-0", 60, seed=5)
    dreq, dblocks = sv.decode_request(d, "d-0", 60, params)
    sv.run_until([p, d], lambda: "d-0" in d.finished_recving and "p-0" in p.finished_sending)
    assert not d.load_errors
    for r in range(2):
        for layer in range(4):
            got = sv.block_view(d, r, layer, dblocks)  # (2, n, block, heads 2, dim)
            want = sv.block_view(p, 0, layer, pblocks[:len(dblocks)])[:, :, :, 2 * r:2 * r + 2]
            assert torch.equal(got, want), (r, layer)


def test_prefill_with_more_tp_ranks_fills_the_decode_heads_together(pd):
    _, p, d = pd(p_tp=2, d_tp=1, hnd=True)
    preq, pblocks, params = sv.prefill_request(p, "p-0", 60, seed=6)
    dreq, dblocks = sv.decode_request(d, "d-0", 60, params)
    sv.run_until([p, d], lambda: "d-0" in d.finished_recving and "p-0" in p.finished_sending)
    assert not d.load_errors
    for layer in range(4):
        want = torch.cat([sv.block_view(p, r, layer, pblocks[:len(dblocks)]) for r in range(2)],
                         dim=3)
        assert torch.equal(sv.block_view(d, 0, layer, dblocks), want)


def test_tp_sizes_that_cannot_match_fail_the_request_with_the_reason(pd):
    _, p, d = pd(p_tp=1, d_tp=2, hnd=False)  # NHD: heads interleaved per token
    preq, pblocks, params = sv.prefill_request(p, "p-0", 60, seed=7)
    dreq, dblocks = sv.decode_request(d, "d-0", 60, params)
    t0 = time.monotonic()
    sv.run_until([p, d], lambda: "d-0" in d.finished_recving and "p-0" in p.finished_sending)
    assert time.monotonic() - t0 < 5  # the prefill's refusal, not the 10 s deadline
    assert d.load_errors == set(dblocks)
    for r in range(2):
        assert not sv.block_view(d, r, 0, dblocks).any()


def test_a_dead_prefill_fails_the_request_at_once(pd):
    _, p, d = pd()
    preq, pblocks, params = sv.prefill_request(p, "p-0", 80, seed=8)
    p.shutdown()  # the prefill worker's process is gone: its exposures are revoked
    dreq, dblocks = sv.decode_request(d, "d-0", 80, params)
    t0 = time.monotonic()
    sv.run_until([d], lambda: "d-0" in d.finished_recving)
    assert time.monotonic() - t0 < 3
    assert d.load_errors == set(dblocks)
    assert d.workers[0].generation == 0  # nothing can still be on its way


def test_a_killed_prefill_node_fails_the_request_by_its_deadline(pd):
    c = LocalCluster(("node-a", "node-b"), tcp=FAST_TCP).start()
    try:
        _, p, d = pd(c, extra={"transfer_timeout_s": 2, "grace_s": 0.5})
        preq, pblocks, params = sv.prefill_request(p, "p-0", 80, seed=9)
        c["node-a"].kill()
        dreq, dblocks = sv.decode_request(d, "d-0", 80, params)
        t0 = time.monotonic()
        sv.run_until([d], lambda: "d-0" in d.finished_recving, timeout=10)
        assert time.monotonic() - t0 < 4
        assert d.load_errors == set(dblocks)
        assert not sv.block_view(d, 0, 0, dblocks).any()
    finally:
        c.stop()


def test_a_late_prefill_never_writes_into_reused_blocks(pd):
    """The prefill hears the decode's request but serves it only after the decode's
    deadline: the decode reports the blocks failed and re-exposes its caches (a new
    generation), vLLM reuses the blocks, and the late write lands nowhere: a handle looked up
    before fails NotFoundError at the writer, a late lookup finds no such name."""
    _, p, d = pd(d_extra={"transfer_timeout_s": 1, "grace_s": 0.3})
    preq, pblocks, params = sv.prefill_request(p, "p-0", 80, seed=10)
    dreq, dblocks = sv.decode_request(d, "d-0", 80, params)
    pw, dw = p.workers[0], d.workers[0]
    with tensorlane.Client(pw.socket) as early:  # a writer holding the old generation
        old = early.lookup("node-b", dw._layer_name("decode-e", 0, 0, 0))
        sv.run_until([d], lambda: "d-0" in d.finished_recving, timeout=5)  # prefill not stepped
        assert d.load_errors == set(dblocks) and dw.generation == 1
        assert pw._asked  # the request came; the prefill did not serve it in time
        d.release(dblocks)
        reused = d.allocate(len(dblocks))
        assert set(reused) == set(dblocks)  # vLLM hands them to another request
        src = early.alloc_host(4096)
        src.view()[:] = b"\x7f" * 4096
        with pytest.raises(tensorlane.NotFoundError):
            early.write(src, old, dst_offset=0).wait(5)
        sv.run_until([p], lambda: "p-0" in p.finished_sending)  # now it serves: too late
        assert pw.sent_entries == {}  # its lookup of generation 0 found nothing
        for layer in range(4):
            assert not sv.block_view(d, 0, layer, dblocks).any()
        # the new generation works: the next request lands
        reqs = _transfer(p, d, 1, tag="again-")
        _check_landed(p, d, reqs)
        assert not d.load_errors - set(dblocks)


def _fake_vllm(tmp_path, body):
    pkg = tmp_path / "vllm" / "distributed" / "kv_transfer" / "kv_connector" / "v1"
    pkg.mkdir(parents=True)
    for d in [tmp_path / "vllm", *list(pkg.parents)[:4], pkg]:
        (d / "__init__.py").touch()
    (pkg / "base.py").write_text(textwrap.dedent(body))
    return subprocess.run([sys.executable, "-W", "always", "-c",
                           "import tensorlane.vllm as v; print(v.TensorlaneConnector.__mro__[1])"],
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              [str(tmp_path), os.environ.get("PYTHONPATH", "")])},
                          capture_output=True, text=True)


_BASE = """
    import abc, enum
    class KVConnectorRole(enum.Enum):
        SCHEDULER = 0
        WORKER = 1
    class KVConnectorMetadata:
        pass
    class KVConnectorBase_V1(abc.ABC):
        def __init__(self, vllm_config, role):
            pass
        def get_num_new_matched_tokens(self, request, num_computed_tokens): ...
        def update_state_after_alloc(self, request, blocks, num_external_tokens): ...
        def build_connector_meta(self, scheduler_output): ...
        def request_finished(self, request, block_ids): ...
        def register_kv_caches(self, kv_caches): ...
        def start_load_kv(self, forward_context, **kwargs): ...
        def wait_for_layer_load(self, layer_name): ...
        def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs): ...
        def wait_for_save(self): ...
        def get_block_ids_with_load_errors(self): ...
        def shutdown(self): ...
"""


def test_the_installed_vllm_base_class_is_checked_at_import(tmp_path):
    same = _fake_vllm(tmp_path / "a",
                      _BASE + "        def get_finished(self, finished_req_ids): ...\n")
    assert same.returncode == 0, same.stderr
    assert "KVConnectorBase_V1" in same.stdout and "RuntimeWarning" not in same.stderr
    renamed = _fake_vllm(tmp_path / "b", _BASE + "        def get_finished(self, done, x): ...\n")
    assert renamed.returncode == 0, renamed.stderr
    assert "RuntimeWarning" in renamed.stderr
    assert "get_finished(done, x): the adapter implements get_finished(finished_req_ids)" \
        in renamed.stderr
    new = _fake_vllm(tmp_path / "c", _BASE + """
        def get_finished(self, finished_req_ids): ...
        @abc.abstractmethod
        def take_everything(self): ...
    """)
    assert new.returncode != 0
    assert "take_everything: abstract in KVConnectorBase_V1, not implemented" in new.stderr


def test_without_vllm_the_stand_in_base_is_used_and_nothing_is_imported():
    out = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import sys, tensorlane, tensorlane.vllm
        assert "torch" not in sys.modules and "tensorlane.vllm._connector" not in sys.modules
        from tensorlane.vllm import TensorlaneConnector, HAVE_VLLM
        print(HAVE_VLLM, TensorlaneConnector.__mro__[1].__name__, "vllm" in sys.modules)
    """)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "_StandInBase", "False"]
    assert _connector.check_base(_connector._StandInBase)  # it is not vLLM's: it differs
