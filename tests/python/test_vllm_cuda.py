"""tensorlane.vllm.TensorlaneConnector with CUDA KV caches (label gpu): a paged KV cache of
32 layers x 1,000 blocks x 16 tokens (8 KV heads x 128, bf16; 2 GiB an instance), a batch of
requests moved from the prefill instance (node-a) to the decode instance (node-b) through real
sidecars, every block of every layer checked and the blocks no request was given still zero.
Skips, with the reason, without CUDA or where the library refuses CUDA memory. Two GPUs: the
prefill on cuda:0, the decode on cuda:1; one: both on cuda:0."""

from __future__ import annotations

import os
import sys

import pytest

import tensorlane
from conftest import FAST_TCP
from tensorlane.testing import LocalCluster

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="CUDA unavailable: torch.cuda.is_available() is False (Debian's torch is CPU-only; "
           "run it on the device: scripts/device-run.sh run)")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vllm_standins as sv  # noqa: E402

PROMPTS = [2000, 1500, 1000, 800, 500, 300, 100, 33]  # 395 blocks of each 1,000


def _instance(role, engine, socket, device):
    try:
        return sv.Instance(role, engine, socket, layers=32, num_blocks=1000, block_size=16,
                           heads=8, head_dim=128, dtype=torch.bfloat16, device=device,
                           extra={"transfer_timeout_s": 120})
    except tensorlane.CudaError as e:
        pytest.skip(f"the C ABI refuses CUDA memory (TL_ECUDA): {e.detail}")


def test_a_batch_of_requests_between_32_layer_cuda_caches():
    devices = ("cuda:0", "cuda:1") if torch.cuda.device_count() > 1 else ("cuda:0", "cuda:0")
    with LocalCluster(("node-a", "node-b"), tcp=FAST_TCP) as c:
        p = _instance("kv_producer", "prefill-e", c.socket("node-a"), devices[0])
        d = _instance("kv_consumer", "decode-e", c.socket("node-b"), devices[1])
        try:
            reqs = []
            for i, n in enumerate(PROMPTS):
                preq, pblocks, params = sv.prefill_request(p, f"p-{i}", n, seed=i,
                                                           contiguous=i % 2 == 0)
                dreq, dblocks = sv.decode_request(d, f"d-{i}", n, params)
                reqs.append((pblocks, dblocks))
            torch.cuda.synchronize()
            sv.run_until([p, d], lambda: len(d.finished_recving) == len(PROMPTS) and
                         len(p.finished_sending) == len(PROMPTS), timeout=240)
            assert not d.load_errors
            used = set()
            for pblocks, dblocks in reqs:
                used |= set(dblocks)
                for layer in range(32):
                    assert torch.equal(sv.block_view(d, 0, layer, dblocks).cpu(),
                                       sv.block_view(p, 0, layer, pblocks[:len(dblocks)]).cpu())
            rest = [b for b in range(1000) if b not in used]
            for layer in range(32):
                assert not sv.block_view(d, 0, layer, rest).any()
            times = sorted(d.workers[0].recv_seconds.values())
            print(f"\nper-request KV transfer: median {times[len(times) // 2] * 1e3:.1f} ms, "
                  f"max {times[-1] * 1e3:.1f} ms ({len(times)} requests, {devices})")
        finally:
            p.shutdown()
            d.shutdown()
