"""Stand-ins for the vLLM classes the KV connector touches (vLLM cannot be installed here),
and ``Instance``: one vLLM instance (its scheduler-side connector and one worker-side
connector per TP rank, each with a real paged KV cache) replaying the calls vLLM v0.11.0's
scheduler and GPU model runner make, in their order:

* scheduler, a new request with ``kv_transfer_params``: ``get_num_new_matched_tokens``,
  then, once blocks are allocated, ``update_state_after_alloc``;
* scheduler, each step: ``build_connector_meta``; a finished request: ``request_finished``
  (its blocks are freed only once every worker reported it from ``get_finished``);
* each worker, each step (``KVConnectorModelRunnerMixin``): ``bind_connector_metadata``,
  ``start_load_kv``, per layer ``wait_for_layer_load`` and ``save_kv_layer``,
  ``wait_for_save``, ``get_finished(finished_req_ids)``, ``get_block_ids_with_load_errors``,
  ``clear_connector_metadata``; the scheduler counts a request done when all ranks said so
  (``KVOutputAggregator``).

Used by test_vllm_connector.py, test_vllm_cuda.py and shim/python/bench/vllm_kv.py.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from tensorlane.vllm import _connector
from tensorlane.vllm._connector import KVConnectorRole, TensorlaneConnector


@dataclass
class KVTransferConfig:
    kv_role: str
    engine_id: str
    kv_connector: str = "TensorlaneConnector"
    kv_connector_module_path: str = "tensorlane.vllm"
    kv_connector_extra_config: dict = field(default_factory=dict)


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1
    rank: int = 0


@dataclass
class CacheConfig:
    block_size: int = 16


@dataclass
class VllmConfig:
    kv_transfer_config: KVTransferConfig
    parallel_config: ParallelConfig
    cache_config: CacheConfig


class RequestStatus(enum.Enum):
    RUNNING = 1
    FINISHED_LENGTH_CAPPED = 2
    FINISHED_ABORTED = 3


@dataclass
class Request:
    request_id: str
    prompt_token_ids: list
    kv_transfer_params: Optional[dict] = None
    status: RequestStatus = RequestStatus.RUNNING


class KVCacheBlocks:
    def __init__(self, ids: list):
        self.ids = list(ids)

    def get_block_ids(self) -> tuple:
        return (list(self.ids),)

    def get_unhashed_block_ids(self) -> list:
        return list(self.ids)


class SchedulerOutput:
    pass


class Instance:
    """One vLLM instance: ``tp`` workers, each with ``layers`` KV caches of ``num_blocks``
    blocks. ``hnd``: heads outermost in a block (a permuted view, as vLLM's HND layout)."""

    def __init__(self, role: str, engine_id: str, socket: str, *, tp: int = 1, layers: int = 4,
                 num_blocks: int = 64, block_size: int = 16, heads: int = 4, head_dim: int = 32,
                 dtype: Any = None, device: str = "cpu", hnd: bool = False,
                 extra: Optional[dict] = None):
        import torch

        self.torch = torch
        self.tp, self.block_size, self.num_blocks = tp, block_size, num_blocks
        self.dtype = dtype or torch.bfloat16
        extra_config = {"socket": socket, "transfer_timeout_s": 10, **(extra or {})}

        def config(rank: int) -> VllmConfig:
            return VllmConfig(KVTransferConfig(role, engine_id,
                                               kv_connector_extra_config=extra_config),
                              ParallelConfig(tp, rank), CacheConfig(block_size))

        self.scheduler = TensorlaneConnector(config(0), KVConnectorRole.SCHEDULER)
        self.workers = [TensorlaneConnector(config(r), KVConnectorRole.WORKER)
                        for r in range(tp)]
        self.caches: list[dict] = []
        h = heads // tp
        for w in self.workers:
            caches = {}
            for i in range(layers):
                phys = (2, num_blocks, h, block_size, head_dim) if hnd else \
                    (2, num_blocks, block_size, h, head_dim)
                if device == "cpu":
                    t = w.connect().alloc_host_tensor(phys, self.dtype)
                else:
                    t = torch.zeros(phys, dtype=self.dtype, device=device)
                caches[f"model.layers.{i}.self_attn.attn"] = t.permute(0, 1, 3, 2, 4) if hnd \
                    else t
            w.register_kv_caches(caches)
            self.caches.append(caches)
        self.free = list(range(num_blocks))
        self.finished_sending: set = set()
        self.finished_recving: set = set()
        self.load_errors: set = set()
        self._counts: dict = {}

    def allocate(self, n: int, contiguous: bool = False) -> list:
        if contiguous:
            for i in range(len(self.free) - n + 1):
                run = self.free[i:i + n]
                if run[-1] - run[0] == n - 1 and sorted(run) == run:
                    del self.free[i:i + n]
                    return run
            raise RuntimeError("no contiguous run")
        out, self.free = self.free[-n:], self.free[:-n]
        return out[::-1]

    def release(self, ids: list) -> None:
        self.free.extend(ids)

    def step(self, finished_req_ids: Optional[set] = None) -> None:
        meta = self.scheduler.build_connector_meta(SchedulerOutput())
        for w, caches in zip(self.workers, self.caches):
            w.bind_connector_metadata(meta)
            w.start_load_kv(None)
            for name, t in caches.items():
                w.wait_for_layer_load(name)
                w.save_kv_layer(name, t, None)
            w.wait_for_save()
            sending, recving = w.get_finished(set(finished_req_ids or ()))
            self.load_errors |= w.get_block_ids_with_load_errors()
            w.clear_connector_metadata()
            for kind, ids in (("s", sending), ("r", recving)):
                for rid in ids or ():
                    self._counts[(kind, rid)] = self._counts.get((kind, rid), 0) + 1
                    if self._counts[(kind, rid)] == self.tp:  # every rank said so
                        (self.finished_sending if kind == "s" else
                         self.finished_recving).add(rid)

    def shutdown(self) -> None:
        for w in self.workers:
            w.shutdown()


def fill(inst: Instance, blocks: list, seed: int) -> None:
    """What a prefill's forward pass leaves in ``blocks``: every layer, rank, K and V."""
    torch = inst.torch
    for r, caches in enumerate(inst.caches):
        for i, t in enumerate(caches.values()):
            g = torch.Generator(device=t.device).manual_seed(seed * 7919 + r * 131 + i)
            src = torch.randn((2, len(blocks)) + tuple(t.shape[2:]), generator=g,
                              device=t.device)
            t[:, blocks] = src.to(inst.dtype)


def prefill_request(inst: Instance, rid: str, prompt_tokens: int, seed: int,
                    contiguous: bool = False) -> tuple[Request, list, dict]:
    """A request run through the prefill instance up to ``request_finished``: its blocks
    allocated and filled, its one token produced (length capped); with the
    ``kv_transfer_params`` that a proxy hands the decode instance."""
    req = Request(rid, list(range(prompt_tokens)), {"do_remote_decode": True})
    n = -(-(prompt_tokens + 1) // inst.block_size)
    blocks = inst.allocate(n, contiguous)
    fill(inst, blocks, seed)
    inst.step()
    req.status = RequestStatus.FINISHED_LENGTH_CAPPED
    delay, params = inst.scheduler.request_finished(req, blocks)
    assert delay and params is not None
    return req, blocks, params


def decode_request(inst: Instance, rid: str, prompt_tokens: int, params: dict,
                   contiguous: bool = False) -> tuple[Request, list]:
    """The decode instance's side: the request with the prefill's params, its blocks."""
    req = Request(rid, list(range(prompt_tokens)), dict(params))
    n, is_async = inst.scheduler.get_num_new_matched_tokens(req, 0)
    assert n == prompt_tokens and is_async
    blocks = inst.allocate(-(-n // inst.block_size), contiguous)
    inst.scheduler.update_state_after_alloc(req, KVCacheBlocks(blocks), n)
    return req, blocks


def run_until(instances: list, done, timeout: float = 20.0) -> None:
    """Steps the instances (vLLM's engine loops) until ``done()``."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"not done after {timeout} s")
        for inst in instances:
            inst.step()
        time.sleep(0.002)


def block_view(inst: Instance, rank: int, layer: int, blocks: list) -> Any:
    t = list(inst.caches[rank].values())[layer]
    return t[:, blocks]


__all__ = ["Instance", "Request", "KVCacheBlocks", "prefill_request", "decode_request",
           "run_until", "fill", "block_view", "RequestStatus", "_connector"]
