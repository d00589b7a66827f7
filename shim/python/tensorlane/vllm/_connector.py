"""The adapter: ``TensorlaneConnector``, a vLLM ``KVConnectorBase_V1`` over tensorlane.

Push, in the shape of vLLM's Mooncake connector (docs/vllm.md has the sequence):

1. prefill scheduler, ``request_finished``: the request stopped at its one token; its blocks
   stay allocated (``delay_free``) and ``kv_transfer_params`` name this node, the engine, the
   request and the TP size for the decode instance;
2. decode scheduler: ``get_num_new_matched_tokens`` claims the prompt, ``update_state_after_
   alloc`` takes the blocks vLLM allocated for it, ``build_connector_meta`` hands them to the
   workers;
3. decode worker, ``start_load_kv``: sends each serving prefill rank a message (its request
   id, the target blocks as runs, its cache layout and generation), through that rank's inbox;
4. prefill worker (receiver thread): one grouped write per request (more only past
   ``TL_GROUP_MAX_ENTRIES`` entries) from its blocks into the decode's exposed layer caches,
   with a deadline; the group's one notification ends the transfer at the decode;
5. ``get_finished`` reports the sends and receives that ended; a failed or late transfer's
   blocks go to ``get_block_ids_with_load_errors``. After a transfer that may still be
   writing failed (a deadline), the decode re-exposes its caches: a new generation, so a late
   write through the old handles fails ``TL_ENOENT`` at the writer and never lands in blocks
   vLLM has given to another request.
"""

from __future__ import annotations

import inspect
import logging
import math
import secrets
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Optional

import tensorlane

from . import _plan
from ._plan import LayerLayout, PlanError

__all__ = ["TensorlaneConnector", "TensorlaneConnectorMetadata", "check_base", "HAVE_VLLM",
           "BASE_DIFFERENCES", "layout_of", "EXPECTED_SIGNATURES"]

log = logging.getLogger("tensorlane.vllm")

#: The methods the adapter implements, with their parameters after ``self`` as vLLM v0.11.0's
#: KVConnectorBase_V1 declares them (and its main branch still does, docs/vllm.md).
EXPECTED_SIGNATURES: dict[str, list[str]] = {
    "get_num_new_matched_tokens": ["request", "num_computed_tokens"],
    "update_state_after_alloc": ["request", "blocks", "num_external_tokens"],
    "build_connector_meta": ["scheduler_output"],
    "request_finished": ["request", "block_ids"],
    "register_kv_caches": ["kv_caches"],
    "start_load_kv": ["forward_context", "kwargs"],
    "wait_for_layer_load": ["layer_name"],
    "save_kv_layer": ["layer_name", "kv_layer", "attn_metadata", "kwargs"],
    "wait_for_save": [],
    "get_finished": ["finished_req_ids"],
    "get_block_ids_with_load_errors": [],
    "shutdown": [],
}


class _StandInBase:
    """What the adapter uses of KVConnectorBase_V1 when vLLM is not installed (tests)."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        self._connector_metadata: Any = None
        self._vllm_config = vllm_config
        self._role = role

    @property
    def role(self) -> Any:
        return self._role

    def bind_connector_metadata(self, connector_metadata: Any) -> None:
        self._connector_metadata = connector_metadata

    def clear_connector_metadata(self) -> None:
        self._connector_metadata = None

    def _get_connector_metadata(self) -> Any:
        assert self._connector_metadata is not None
        return self._connector_metadata


class _StandInMetadata:
    pass


class KVConnectorRoleStandIn:
    """vLLM's KVConnectorRole when vLLM is not installed."""

    SCHEDULER = "SCHEDULER"
    WORKER = "WORKER"


def check_base(base: type) -> list[str]:
    """What differs between ``base`` (vLLM's KVConnectorBase_V1) and what the adapter was
    written for: a method missing or with other parameters, an abstract method it does not
    implement. Empty when they match."""
    out = []
    for name, params in EXPECTED_SIGNATURES.items():
        fn = getattr(base, name, None)
        if fn is None:
            out.append(f"{name}: not in {base.__name__} (the adapter implements it)")
            continue
        got = [p for p in inspect.signature(fn).parameters if p != "self"]
        if got != params:
            out.append(f"{name}({', '.join(got)}): the adapter implements "
                       f"{name}({', '.join(params)})")
    for name in sorted(getattr(base, "__abstractmethods__", ())):
        if name not in EXPECTED_SIGNATURES:
            out.append(f"{name}: abstract in {base.__name__}, not implemented by the adapter")
    return out


try:  # vLLM when installed; the stand-ins otherwise (tests: vLLM cannot be installed here)
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # type: ignore
        KVConnectorBase_V1 as _Base, KVConnectorMetadata as _Metadata, KVConnectorRole)
    HAVE_VLLM = True
except ImportError:
    _Base, _Metadata, KVConnectorRole = _StandInBase, _StandInMetadata, KVConnectorRoleStandIn
    HAVE_VLLM = False

BASE_DIFFERENCES: list[str] = check_base(_Base) if HAVE_VLLM else []
if any("not implemented by the adapter" in d for d in BASE_DIFFERENCES):
    raise ImportError("tensorlane.vllm: the installed vLLM's KVConnectorBase_V1 differs from "
                      "the one the adapter implements (vLLM v0.11.0): "
                      + "; ".join(BASE_DIFFERENCES))
if BASE_DIFFERENCES:
    warnings.warn("tensorlane.vllm: the installed vLLM's KVConnectorBase_V1 differs from the "
                  "one the adapter implements (vLLM v0.11.0): " + "; ".join(BASE_DIFFERENCES),
                  RuntimeWarning, stacklevel=2)


@dataclass
class RecvSpec:
    """What a decode worker needs to ask the prefill for one request's KV."""

    block_ids: list[int]
    remote_node: str
    remote_engine_id: str
    remote_request_id: str
    remote_tp_size: int
    remote_num_blocks: int


class TensorlaneConnectorMetadata(_Metadata):  # type: ignore[misc,valid-type]
    """Scheduler → workers, each step: requests to receive and requests to send."""

    def __init__(self) -> None:
        self.reqs_to_recv: dict[str, RecvSpec] = {}
        self.reqs_to_send: dict[str, list[int]] = {}


def layout_of(tensor: Any) -> tuple[LayerLayout, Any]:
    """The layout of one layer's KV cache tensor and the same memory as a contiguous tensor
    (what is registered). Shapes: ``(2, blocks, block_size, heads, head_dim)`` (FlashAttention),
    ``(blocks, 2, block_size, heads, head_dim)`` (FlashInfer), ``(blocks, block_size, heads,
    head_dim)`` and ``(blocks, block_size, head_dim)`` (MLA); heads before tokens in memory
    (strides of a permuted view, vLLM's HND) make head slices possible."""
    shape, stride, e = list(tensor.shape), list(tensor.stride()), tensor.element_size()
    planes: tuple[int, ...]
    inner: tuple[int, ...]
    order = sorted(range(len(shape)), key=lambda i: -stride[i])
    dense = tensor.permute(*order)
    if not dense.is_contiguous():
        raise PlanError(f"a KV cache of shape {tuple(shape)} and strides {tuple(stride)} is not "
                        "one dense range")
    if len(shape) == 5 and (shape[0] == 2 or shape[1] == 2):
        kv, blk = (0, 1) if shape[0] == 2 and shape[1] != 2 else (1, 0)
        _, _, bs, h, hd = [0, 0] + shape[2:]
        planes = (0, stride[kv] * e)
        inner = (2, 3, 4)
    elif len(shape) in (3, 4):
        blk, bs = 0, shape[1]
        h, hd = (shape[2], shape[3]) if len(shape) == 4 else (0, shape[2])
        planes = (0,)
        inner = (1, 2, 3) if len(shape) == 4 else (1, 2)
    else:
        raise PlanError(f"a KV cache of shape {tuple(shape)}: not a paged layout this connector "
                        "knows")
    block_elems = math.prod(shape[i] for i in inner)
    if sorted(stride[i] for i in inner)[-1] * shape[max(inner, key=lambda i: stride[i])] \
            != block_elems:
        raise PlanError(f"a block of the KV cache (shape {tuple(shape)}, strides "
                        f"{tuple(stride)}) is not dense")
    hnd = len(shape) >= 4 and h > 0 and stride[3 if len(shape) == 5 else 2] == bs * hd
    return (LayerLayout(shape[blk], block_elems * e, stride[blk] * e, planes, h if hnd else 0,
                        bs * hd * e if hnd else 0), dense)


@dataclass
class _Recv:
    """A decode worker's transfer: one request, from one or more prefill ranks."""

    req_id: str
    token: int
    block_ids: list[int]
    deadline: float
    sources: dict[int, Optional[int]]  # prefill rank -> groups it writes (None: not yet known)
    got: dict[int, set] = field(default_factory=dict)
    tickets: list = field(default_factory=list)
    failed: Optional[str] = None
    may_still_land: bool = False
    asked_at: float = field(default_factory=time.monotonic)

    def complete(self) -> bool:
        return all(n is not None and len(self.got.get(r, ())) == n
                   for r, n in self.sources.items())


@dataclass
class _Send:
    """A prefill worker's request whose KV waits for its decode ranks to ask."""

    block_ids: list[int]
    expiry: float
    wanted: Optional[int] = None  # decode ranks that will ask (known from the first request)
    served: int = 0
    tickets: list = field(default_factory=list)


class TensorlaneConnector(_Base):  # type: ignore[misc,valid-type]
    """vLLM's KV connector on tensorlane: the scheduler side plans, the worker side moves
    the blocks with grouped writes (docs/vllm.md). ``kv_connector_extra_config`` keys:
    ``socket`` (the sidecar's; default ``$TENSORLANE_SOCKET``), ``node`` (this node's name in
    ``kv_transfer_params``; default the sidecar's ``[node] name``), ``prefix`` (of exposed
    names, default ``tl``), ``transfer_timeout_s`` (a request's deadline, default 30),
    ``abort_timeout_s`` (a prefill frees blocks nobody asked for after it, default 480),
    ``kv_cache_layout`` (``HND`` to ask vLLM for head-sliceable caches: different TP sizes)."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        if "kv_cache_config" in inspect.signature(_Base.__init__).parameters:
            super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        else:
            super().__init__(vllm_config=vllm_config, role=role)
        ktc = vllm_config.kv_transfer_config
        extra = dict(getattr(ktc, "kv_connector_extra_config", None) or {})
        self.kv_role = str(ktc.kv_role)
        self.engine_id = str(ktc.engine_id)
        self.tp_size = int(vllm_config.parallel_config.tensor_parallel_size)
        self.block_size = int(vllm_config.cache_config.block_size)
        self.socket: Optional[str] = extra.get("socket")
        self.prefix = str(extra.get("prefix", "tl"))
        self.transfer_timeout = float(extra.get("transfer_timeout_s", 30.0))
        self.abort_timeout = float(extra.get("abort_timeout_s", 480.0))
        self.grace = float(extra.get("grace_s", 1.0))
        self._node: Optional[str] = extra.get("node")
        self._is_worker = getattr(role, "name", role) == "WORKER"
        # scheduler side
        self._recv_pending: dict[str, RecvSpec] = {}
        self._send_pending: dict[str, list[int]] = {}
        # worker side
        self.tp_rank = self._tp_rank(vllm_config) if self._is_worker else 0
        self.client: Optional[tensorlane.Client] = None
        self.layer_names: list[str] = []
        self.layouts: list[LayerLayout] = []
        self._dense: list[Any] = []
        self._regions: list[Any] = []
        self._inbox: Any = None
        self.generation = 0
        self._lock = threading.Lock()
        self._recvs: dict[int, _Recv] = {}  # by token (the groups' immediate)
        self._sends: dict[str, _Send] = {}
        self._asked: dict[str, list[tuple[str, int, dict]]] = {}  # asked before the metadata
        self._done_sending: set[str] = set()
        self._done_recving: set[str] = set()
        self._load_errors: set[int] = set()
        self._remotes: dict[tuple, Any] = {}
        self._reassembler = _plan.Reassembler()
        self._nonce = secrets.randbits(32)
        self._next_token = secrets.randbits(32)
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        #: prefill: the entries of each group written per request (coalescing shows here)
        self.sent_entries: dict[str, list[int]] = {}
        #: decode: seconds from asking for a request's KV to its last group's notification
        self.recv_seconds: dict[str, float] = {}

    @staticmethod
    def _tp_rank(vllm_config: Any) -> int:
        try:
            from vllm.distributed.parallel_state import (  # type: ignore
                get_tensor_model_parallel_rank)
            return int(get_tensor_model_parallel_rank())
        except (ImportError, AssertionError, AttributeError):
            pc = vllm_config.parallel_config
            return int(getattr(pc, "rank", 0)) % int(pc.tensor_parallel_size)

    def _layer_name(self, engine: str, rank: int, layer: int, gen: int) -> str:
        # The generation is in the name too: a prefill that looks the cache up only after
        # the decode gave up on the request finds no such name (besides old handles failing).
        return self._name(engine, rank, f"{layer}/g{gen}")

    def _name(self, engine: str, rank: int, what: Any) -> str:
        name = f"{self.prefix}/{engine}/{rank}/{what}"
        if len(name) > 63:
            raise PlanError(f"exposed name {name!r} is longer than 63 characters: a shorter "
                            "engine_id or prefix")
        return name

    @property
    def node(self) -> str:
        """This node's name (``kv_transfer_params``' ``remote_node``)."""
        if self._node is None:
            if self.client is not None:
                self._node = self.client.node_name
            else:
                with tensorlane.Client(self.socket) as c:
                    self._node = c.node_name
        return self._node

    # ===================================================================== scheduler side

    def get_num_new_matched_tokens(self, request: Any,
                                   num_computed_tokens: int) -> tuple[Optional[int], bool]:
        params = getattr(request, "kv_transfer_params", None) or {}
        if params.get("do_remote_prefill"):
            count = len(request.prompt_token_ids) - num_computed_tokens
            if count > 0:
                return count, True  # loaded between steps (asynchronously)
        return 0, False

    def update_state_after_alloc(self, request: Any, blocks: Any,
                                 num_external_tokens: int) -> None:
        params = getattr(request, "kv_transfer_params", None) or {}
        if not params.get("do_remote_prefill"):
            return
        needed = ("remote_node", "remote_engine_id", "remote_request_id", "remote_tp_size",
                  "remote_num_blocks")
        if num_external_tokens > 0 and all(k in params for k in needed):
            get = getattr(blocks, "get_unhashed_block_ids", None)
            ids = list(get()) if get is not None else list(blocks.get_block_ids()[0])
            self._recv_pending[request.request_id] = RecvSpec(
                ids, str(params["remote_node"]), str(params["remote_engine_id"]),
                str(params["remote_request_id"]), int(params["remote_tp_size"]),
                int(params["remote_num_blocks"]))
        elif num_external_tokens > 0:
            log.warning("request %s: kv_transfer_params lack %s", request.request_id,
                        [k for k in needed if k not in params])
        params["do_remote_prefill"] = False  # once: a second call (after the load) is not one

    def build_connector_meta(self, scheduler_output: Any) -> TensorlaneConnectorMetadata:
        meta = TensorlaneConnectorMetadata()
        meta.reqs_to_recv, self._recv_pending = self._recv_pending, {}
        meta.reqs_to_send, self._send_pending = self._send_pending, {}
        return meta

    def request_finished(self, request: Any,
                         block_ids: list[int]) -> tuple[bool, Optional[dict[str, Any]]]:
        params = getattr(request, "kv_transfer_params", None) or {}
        if not params.get("do_remote_decode"):
            return False, None
        status = getattr(getattr(request, "status", None), "name", str(request.status))
        if status != "FINISHED_LENGTH_CAPPED":
            return False, None  # aborted or stopped: nothing to hand over
        prompt_blocks = -(-len(request.prompt_token_ids) // self.block_size)
        ids = list(block_ids)[:prompt_blocks]
        if not ids:
            return False, None
        self._send_pending[request.request_id] = ids
        return True, {"do_remote_prefill": True, "do_remote_decode": False,
                      "remote_node": self.node, "remote_engine_id": self.engine_id,
                      "remote_request_id": request.request_id,
                      "remote_tp_size": self.tp_size, "remote_num_blocks": len(ids)}

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: Any) -> Optional[str]:
        ktc = getattr(vllm_config, "kv_transfer_config", None)
        extra = getattr(ktc, "kv_connector_extra_config", None) or {}
        return extra.get("kv_cache_layout")

    # ======================================================================== worker side

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        """Registers and exposes each layer's cache (``<prefix>/<engine>/<rank>/<layer>/g<n>``,
        ``n`` the generation) and an inbox for requests (``<prefix>/<engine>/<rank>/inbox``),
        and starts the receiver thread. CUDA tensors are registered by address; CPU tensors
        must lie in memory of this connector's client (``connector.connect().alloc_host_tensor``),
        as every CPU tensor tensorlane moves."""
        client = self.connect()
        layouts = []
        for name, t in kv_caches.items():
            layout, dense = layout_of(t)
            layouts.append(layout)
            self.layer_names.append(name)
            self._dense.append(dense)
        if len(set(layouts)) > 1:
            raise PlanError("the layers' KV caches differ in layout (a hybrid model): not "
                            "supported")
        self.layouts = layouts
        for i, dense in enumerate(self._dense):
            self._regions.append(client.expose(client.register(dense), self._layer_name(
                self.engine_id, self.tp_rank, i, 0)))
        self._inbox = client.alloc_host(64)
        client.expose(self._inbox, self._name(self.engine_id, self.tp_rank, "inbox"))
        self._thread = threading.Thread(target=self._receive, name="tensorlane-kv",
                                        daemon=True)
        self._thread.start()

    def connect(self) -> tensorlane.Client:
        """The worker's Client (created on first use)."""
        if self.client is None:
            self.client = tensorlane.Client(self.socket)
        return self.client

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        meta = self._connector_metadata
        if meta is None:
            return
        now = time.monotonic()
        with self._lock:
            for req_id, ids in meta.reqs_to_send.items():
                self._sends[req_id] = _Send(list(ids), now + self.abort_timeout)
                for peer, token, body in self._asked.pop(req_id, []):
                    self._serve(peer, token, body)
        for req_id, spec in meta.reqs_to_recv.items():
            self._ask(req_id, spec)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads end between steps: a request runs once get_finished reported it

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any,
                      **kwargs: Any) -> None:
        return  # pushed when the decode asks, after the request finished (its blocks are kept)

    def wait_for_save(self) -> None:
        return

    def get_finished(self, finished_req_ids: set[str]) -> tuple[Optional[set[str]],
                                                                 Optional[set[str]]]:
        now = time.monotonic()
        bump = False
        with self._lock:
            self._poll_sends(now)
            for r in list(self._recvs.values()):
                self._poll_recv(r, now)
                if r.failed is not None or r.complete():
                    del self._recvs[r.token]
                    self._done_recving.add(r.req_id)
                    if r.failed is not None:
                        log.warning("request %s: KV transfer failed: %s", r.req_id, r.failed)
                        self._load_errors.update(r.block_ids)
                        bump = bump or r.may_still_land
            sending, self._done_sending = self._done_sending, set()
            recving, self._done_recving = self._done_recving, set()
        if bump:
            self._new_generation()
        return sending or None, recving or None

    def get_block_ids_with_load_errors(self) -> set[int]:
        with self._lock:
            out, self._load_errors = self._load_errors, set()
        return out

    def shutdown(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        if self.client is not None:
            self.client.close()

    # --------------------------------------------------------------- decode: asking, waiting

    def _ask(self, req_id: str, spec: RecvSpec) -> None:
        assert self.client is not None, "register_kv_caches first"
        n = min(len(spec.block_ids), spec.remote_num_blocks)
        with self._lock:
            self._next_token = (self._next_token + 1) & 0xFFFFFFFF
            token = self._next_token
            r = _Recv(req_id, token, spec.block_ids[:n],
                      time.monotonic() + self.transfer_timeout + self.grace, {})
            self._recvs[token] = r
            if n < len(spec.block_ids):
                log.warning("request %s: %d blocks allocated, the prefill has %d", req_id,
                            len(spec.block_ids), spec.remote_num_blocks)
        try:
            sources = _plan.source_ranks(self.tp_rank, spec.remote_tp_size, self.tp_size)
            body = {"req": spec.remote_request_id, "engine": self.engine_id,
                    "rank": self.tp_rank, "tp": self.tp_size, "gen": self.generation,
                    "layers": len(self.layouts), "layout": self.layouts[0].describe(),
                    "blocks": _plan.runs_of(r.block_ids),
                    "skip": spec.remote_num_blocks - n,
                    "timeout_ms": int(self.transfer_timeout * 1000)}
            parts = _plan.encode_request((self._nonce << 32) | token, body)
            for src in sources:
                inbox = self._remote(spec.remote_node, spec.remote_engine_id, src, "inbox", 0)
                with self._lock:
                    r.sources[src] = None
                for p in parts:
                    t = self.client.send_message(inbox, p, timeout=self.transfer_timeout)
                    with self._lock:
                        r.tickets.append(t)
        except (tensorlane.TensorlaneError, PlanError) as e:
            with self._lock:
                r.failed = r.failed or f"asking {spec.remote_node} for it: {e}"

    def _poll_recv(self, r: _Recv, now: float) -> None:
        for t in list(r.tickets):
            if t.done():
                r.tickets.remove(t)
                try:
                    t.wait(0)
                except tensorlane.TensorlaneError as e:
                    r.failed = r.failed or f"the request to the prefill failed: {e}"
        if r.failed is None and not r.complete() and now > r.deadline:
            r.failed = (f"no KV after {self.transfer_timeout + self.grace:.1f} s "
                        f"({sum(len(g) for g in r.got.values())} groups of "
                        f"{r.sources} arrived)")
            r.may_still_land = True

    def _on_group(self, m: Any) -> None:
        with self._lock:
            r = self._recvs.get(m.imm)
            if r is None:
                return  # ended already (failed, a deadline): what is late is dropped
            parsed = _plan.parse_group_payload(m.payload)
            if m.status != tensorlane.Status.OK or parsed is None:
                why = m.status.name if m.status != tensorlane.Status.OK else "no payload"
                r.failed = r.failed or f"a group from {m.peer} failed: {why}"
                # past a deadline the writer may still have entries on the way
                r.may_still_land = r.may_still_land or m.status == tensorlane.Status.EDEADLINE
                return
            token, group, groups, src, _ = parsed
            if groups == 0:  # the prefill refused the request
                r.failed = r.failed or f"{m.peer} refused it"
                return
            if (token & 0xFFFFFFFF) != r.token or src not in r.sources:
                r.failed = r.failed or f"a stray group from {m.peer} rank {src}"
                return
            r.sources[src] = groups
            r.got.setdefault(src, set()).add(group)
            if r.complete():
                self.recv_seconds[r.req_id] = time.monotonic() - r.asked_at

    def _new_generation(self) -> None:
        """Re-exposes every layer's cache under its name: writes through handles of the old
        exposure fail TL_ENOENT at their writer (docs/abi.md, region generations)."""
        assert self.client is not None
        with self._lock:
            for i, dense in enumerate(self._dense):
                self._regions[i].close()
                self._regions[i] = self.client.expose(self.client.register(dense),
                                                      self._layer_name(self.engine_id,
                                                                       self.tp_rank, i,
                                                                       self.generation + 1))
            self.generation += 1

    # ------------------------------------------------------------------ prefill: serving

    def _remote(self, node: str, engine: str, rank: int, what: Any, gen: int) -> Any:
        assert self.client is not None
        key = (node, engine, rank, what, gen)
        remote = self._remotes.get(key)
        if remote is None:
            name = self._name(engine, rank, what) if what == "inbox" else \
                self._layer_name(engine, rank, what, gen)
            remote = self.client.lookup(node, name)
            self._remotes[key] = remote
        return remote

    def _on_request(self, peer: str, token: int, body: dict) -> None:
        with self._lock:
            if body.get("req") in self._sends:
                self._serve(peer, token, body)
            else:
                self._asked.setdefault(str(body.get("req")), []).append((peer, token, body))

    def _serve(self, peer: str, token: int, body: dict) -> None:
        """One decode rank's request for a request's KV: its grouped write(s). Under _lock."""
        assert self.client is not None
        req_id = str(body["req"])
        s = self._sends[req_id]
        imm = token & 0xFFFFFFFF
        try:
            dst_tp, dst_rank = int(body["tp"]), int(body["rank"])
            s.wanted = max(1, dst_tp // self.tp_size)
            dst_blocks = _plan.blocks_of(body["blocks"])
            skip = int(body["skip"])
            src_blocks = s.block_ids[skip:skip + len(dst_blocks)]
            if len(src_blocks) != len(dst_blocks) or int(body["layers"]) != len(self.layouts):
                raise PlanError(f"asked for {len(dst_blocks)} blocks from {skip} of "
                                f"{len(s.block_ids)} in {body['layers']} layers; this rank "
                                f"has {len(self.layouts)} layers")
            dst = LayerLayout.from_description(body["layout"])
            heads = _plan.head_slice(self.tp_rank, dst_rank, self.tp_size, dst_tp,
                                     self.layouts[0], dst)
            entries = _plan.plan_entries(self.layouts, [dst] * len(self.layouts), src_blocks,
                                         dst_blocks, heads)
            groups = _plan.split_groups(entries)
            engine, gen = str(body["engine"]), int(body["gen"])
            remotes = [self._remote(peer, engine, dst_rank, i, gen)
                       for i in range(len(self.layouts))]
            timeout = int(body.get("timeout_ms", 0)) / 1000 or None
            for gi, g in enumerate(groups):
                s.tickets.append(self.client.write_group(
                    [tensorlane.Write(self._regions[e.layer], remotes[e.layer], 0, e.src_offset,
                                      e.dst_offset, e.nbytes) for e in g],
                    imm=imm, timeout=timeout,
                    payload=_plan.group_payload(token, gi, len(groups), self.tp_rank, req_id)))
                self.sent_entries.setdefault(req_id, []).append(len(g))
        except (tensorlane.TensorlaneError, PlanError, KeyError, ValueError, TypeError) as e:
            log.warning("request %s from %s: not sent: %s", req_id, peer, e)
            try:  # tell the decode at once (a group count of 0), rather than at its deadline
                inbox = self._remote(peer, str(body.get("engine")), int(body.get("rank", 0)),
                                     "inbox", 0)
                self.client.send_message(inbox, _plan.group_payload(token, 0, 0, self.tp_rank,
                                                                    req_id), imm=imm)
            except tensorlane.TensorlaneError:
                pass
        s.served += 1

    def _poll_sends(self, now: float) -> None:
        """Under _lock: requests whose groups all ended (or nobody asked for in time) are
        done sending; their blocks go back to vLLM."""
        for req_id, s in list(self._sends.items()):
            for t in list(s.tickets):
                if t.done():
                    s.tickets.remove(t)
                    try:
                        t.wait(0)
                    except tensorlane.TensorlaneError as e:
                        log.warning("request %s: a group failed: %s", req_id, e)
            served = s.wanted is not None and s.served >= s.wanted and not s.tickets
            if served or now > s.expiry:
                if not served:
                    log.warning("request %s: no decode asked for its KV in %.0f s: freed",
                                req_id, self.abort_timeout)
                del self._sends[req_id]
                self._done_sending.add(req_id)

    # -------------------------------------------------------------------- receiver thread

    def _receive(self) -> None:
        assert self.client is not None
        while not self._stop.is_set():
            try:
                m = self.client.wait_message(timeout=0.05)
            except TimeoutError:
                continue
            except (tensorlane.ClientClosedError, tensorlane.SidecarGoneError):
                return
            except tensorlane.TensorlaneError as e:  # logged, never the thread's end
                log.warning("waiting for messages: %s", e)
                time.sleep(0.05)
                continue
            try:
                if m.kind == tensorlane.NOTIFY_GROUP:
                    self._on_group(m)
                elif m.kind == tensorlane.NOTIFY_MESSAGE:
                    if _plan.parse_group_payload(m.payload) is not None:
                        self._on_group(m)  # a refusal
                        continue
                    got = self._reassembler.feed(m.peer, m.payload)
                    if got is not None:
                        self._on_request(m.peer, got[0], got[1])
            except PlanError as e:
                log.warning("a malformed message from %s: %s", m.peer, e)
