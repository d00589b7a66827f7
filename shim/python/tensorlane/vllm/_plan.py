"""The planning core of the vLLM KV connector: which bytes of which blocks go where.

No vLLM import and no tensorlane call: plain data in, plain data out, so every rule here is
tested on its own (tests/python/test_vllm_plan.py) and the adapter (``_connector.py``) stays a
thin layer over vLLM's classes.

* ``LayerLayout``: where block ``b`` of one layer's paged KV cache lives in that layer's
  tensor, for each plane (K and V when they are separate, one plane otherwise) and, when the
  heads of a block are contiguous (the HND layout), where each head's slice is.
* ``head_slice`` / ``source_ranks``: tensor parallelism of different sizes at the two ends,
  as vLLM's NIXL connector does it: each decode rank gets its slice of the KV heads.
* ``coalesce`` and ``plan_entries``: the entries of the grouped writes of one request, runs
  of blocks contiguous at both ends merged into one entry, split into groups of at most
  ``TL_GROUP_MAX_ENTRIES``.
* ``encode_request`` / ``Reassembler`` and ``group_payload`` / ``parse_group_payload``: the
  two messages between the workers (the decode's request, the prefill's group notification).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

__all__ = [
    "LayerLayout", "Run", "Entry", "PlanError", "coalesce", "head_slice", "source_ranks",
    "plan_entries", "split_groups", "encode_request", "Reassembler", "group_payload",
    "parse_group_payload", "runs_of", "blocks_of", "GROUP_MAX_ENTRIES", "MAX_PAYLOAD",
]

#: tl_write_group's limit (TL_GROUP_MAX_ENTRIES in tensorlane.h).
GROUP_MAX_ENTRIES = 16384
#: TL_MAX_PAYLOAD: the bytes a message or a group's notification carries.
MAX_PAYLOAD = 256


class PlanError(ValueError):
    """Two caches that cannot be matched block for block, with the reason."""


@dataclass(frozen=True)
class LayerLayout:
    """One layer's paged KV cache in one TP rank, in bytes from the start of its tensor.

    Block ``b`` of plane ``p`` is ``block_bytes`` bytes at ``planes[p] + b * block_stride``.
    When ``head_bytes`` is not 0 the block holds ``heads`` runs of ``head_bytes`` bytes, one per
    KV head (the HND layout: heads outermost in a block), so a slice of the heads is one
    range; with 0 the heads are interleaved per token (NHD) or there are none (MLA) and only
    whole blocks can be moved.
    """

    num_blocks: int
    block_bytes: int
    block_stride: int
    planes: tuple[int, ...] = (0,)
    heads: int = 0
    head_bytes: int = 0

    def __post_init__(self) -> None:
        if self.num_blocks <= 0 or self.block_bytes <= 0 or self.block_stride < self.block_bytes:
            raise PlanError(f"bad layout: {self}")
        if self.head_bytes and self.heads * self.head_bytes != self.block_bytes:
            raise PlanError(f"bad layout: {self.heads} heads x {self.head_bytes} bytes is not "
                            f"the block's {self.block_bytes} bytes")

    @property
    def nbytes(self) -> int:
        """The bytes the layer's tensor spans."""
        return max(self.planes) + (self.num_blocks - 1) * self.block_stride + self.block_bytes

    def merged(self) -> "LayerLayout":
        """The same memory with planes that tile each block stride merged into one (vLLM's
        FlashInfer layout, ``(blocks, 2, ...)``: K and V of a block are adjacent), so runs of
        blocks are single ranges. Only without a head slice: heads are per plane."""
        n = len(self.planes)
        if n > 1 and self.block_stride == n * self.block_bytes and \
                self.planes == tuple(i * self.block_bytes for i in range(n)):
            return LayerLayout(self.num_blocks, self.block_stride, self.block_stride, (0,))
        return self

    def describe(self) -> dict:
        """A JSON-able form (it travels in the decode's request)."""
        return {"n": self.num_blocks, "bb": self.block_bytes, "stride": self.block_stride,
                "planes": list(self.planes), "heads": self.heads, "hb": self.head_bytes}

    @classmethod
    def from_description(cls, d: dict) -> "LayerLayout":
        return cls(int(d["n"]), int(d["bb"]), int(d["stride"]),
                   tuple(int(p) for p in d["planes"]), int(d["heads"]), int(d["hb"]))


@dataclass(frozen=True)
class Run:
    """``count`` blocks from ``src`` on at the source, to ``dst`` on at the target."""

    src: int
    dst: int
    count: int


@dataclass(frozen=True)
class Entry:
    """One entry of a grouped write: ``nbytes`` from ``src_offset`` of layer ``layer``'s
    cache at the source to ``dst_offset`` of the same layer's cache at the target."""

    layer: int
    src_offset: int
    dst_offset: int
    nbytes: int


def coalesce(src_blocks: Sequence[int], dst_blocks: Sequence[int]) -> list[Run]:
    """Block ``src_blocks[i]`` goes to ``dst_blocks[i]``; consecutive pairs that are
    contiguous at both ends become one run."""
    if len(src_blocks) != len(dst_blocks):
        raise PlanError(f"{len(src_blocks)} source blocks for {len(dst_blocks)} target blocks")
    runs: list[Run] = []
    for s, d in zip(src_blocks, dst_blocks):
        if runs and runs[-1].src + runs[-1].count == s and runs[-1].dst + runs[-1].count == d:
            last = runs[-1]
            runs[-1] = Run(last.src, last.dst, last.count + 1)
        else:
            runs.append(Run(int(s), int(d), 1))
    return runs


def runs_of(blocks: Sequence[int]) -> list[list[int]]:
    """``[[first, count], ...]``: a block list compactly (it travels in a message)."""
    return [[r.src, r.count] for r in coalesce(blocks, blocks)]


def blocks_of(runs: Iterable[Sequence[int]]) -> list[int]:
    """The inverse of ``runs_of``."""
    return [first + i for first, count in runs for i in range(count)]


def source_ranks(dst_rank: int, src_tp: int, dst_tp: int) -> list[int]:
    """The prefill ranks that write into decode rank ``dst_rank``: one when the decode has at
    least as many ranks, ``src_tp // dst_tp`` otherwise (each brings its heads)."""
    _check_tp(src_tp, dst_tp)
    if dst_tp >= src_tp:
        return [dst_rank // (dst_tp // src_tp)]
    k = src_tp // dst_tp
    return list(range(dst_rank * k, dst_rank * k + k))


def head_slice(src_rank: int, dst_rank: int, src_tp: int, dst_tp: int, src: LayerLayout,
               dst: LayerLayout) -> tuple[int, int, int]:
    """``(first source head, first target head, heads)`` that rank ``src_rank`` of the prefill
    moves into rank ``dst_rank`` of the decode; all heads ``(0, 0, heads)`` when the sizes
    match. Raises PlanError with the reason when the two caches cannot be matched."""
    _check_tp(src_tp, dst_tp)
    if dst_rank not in range(dst_tp) or src_rank not in source_ranks(dst_rank, src_tp, dst_tp):
        raise PlanError(f"prefill rank {src_rank} of {src_tp} does not serve decode rank "
                        f"{dst_rank} of {dst_tp}")
    if src_tp == dst_tp:
        if src.block_bytes != dst.block_bytes or len(src.planes) != len(dst.planes):
            raise PlanError(f"the caches differ: a block is {src.block_bytes} bytes in "
                            f"{len(src.planes)} planes at the prefill, {dst.block_bytes} bytes "
                            f"in {len(dst.planes)} at the decode (model, dtype or block size)")
        return 0, 0, max(src.heads, 1)
    if not (src.head_bytes and dst.head_bytes):
        raise PlanError(f"TP {src_tp} at the prefill and {dst_tp} at the decode needs the HND "
                        "KV cache layout at both ends (a block's heads contiguous, "
                        "VLLM_KV_CACHE_LAYOUT=HND); this cache has its heads interleaved per "
                        "token (NHD) or no heads (MLA)")
    if src.head_bytes != dst.head_bytes or len(src.planes) != len(dst.planes):
        raise PlanError(f"the caches differ: a head's block is {src.head_bytes} bytes at the "
                        f"prefill, {dst.head_bytes} at the decode (model, dtype or block size)")
    if dst_tp > src_tp:
        k = dst_tp // src_tp
        if src.heads != k * dst.heads:
            raise PlanError(f"{src.heads} KV heads per prefill rank cannot be split into "
                            f"{k} decode ranks of {dst.heads} (replicated KV heads: TP larger "
                            "than the model's KV heads is not supported)")
        return (dst_rank % k) * dst.heads, 0, dst.heads
    k = src_tp // dst_tp
    if dst.heads != k * src.heads:
        raise PlanError(f"{k} prefill ranks of {src.heads} KV heads do not fill a decode rank "
                        f"of {dst.heads}")
    return 0, (src_rank % k) * src.heads, src.heads


def _check_tp(src_tp: int, dst_tp: int) -> None:
    if src_tp <= 0 or dst_tp <= 0 or (max(src_tp, dst_tp) % min(src_tp, dst_tp)):
        raise PlanError(f"TP {src_tp} at the prefill and {dst_tp} at the decode: one must be "
                        "a multiple of the other")


def plan_entries(src: Sequence[LayerLayout], dst: Sequence[LayerLayout],
                 src_blocks: Sequence[int], dst_blocks: Sequence[int],
                 heads: Optional[tuple[int, int, int]] = None) -> list[Entry]:
    """The entries that move ``src_blocks[i]`` of every layer to ``dst_blocks[i]`` of the same
    layer: whole blocks (runs contiguous at both ends merged) or, with ``heads`` from
    ``head_slice`` naming less than a whole block, one entry per block and plane."""
    if len(src) != len(dst):
        raise PlanError(f"{len(src)} layers at the prefill, {len(dst)} at the decode")
    for b in src_blocks:
        if not 0 <= b < min(s.num_blocks for s in src):
            raise PlanError(f"source block {b} is out of range")
    for b in dst_blocks:
        if not 0 <= b < min(d.num_blocks for d in dst):
            raise PlanError(f"target block {b} is out of range")
    runs = coalesce(src_blocks, dst_blocks)
    out: list[Entry] = []
    for layer, (s, d) in enumerate(zip(src, dst)):
        whole = heads is None or (heads[2] * s.head_bytes == s.block_bytes and
                                  heads[2] * d.head_bytes == d.block_bytes) or \
            not (s.head_bytes and d.head_bytes)
        if whole:
            if s.block_bytes != d.block_bytes or len(s.planes) != len(d.planes):
                raise PlanError(f"layer {layer}: blocks of {s.block_bytes} bytes in "
                                f"{len(s.planes)} planes at the prefill, {d.block_bytes} in "
                                f"{len(d.planes)} at the decode")
            sm, dm = s.merged(), d.merged()
            if len(sm.planes) != len(dm.planes):
                sm, dm = s, d
            for ps, pd in zip(sm.planes, dm.planes):
                for r in runs:
                    if sm.block_stride == sm.block_bytes and dm.block_stride == dm.block_bytes:
                        out.append(Entry(layer, ps + r.src * sm.block_stride,
                                         pd + r.dst * dm.block_stride, r.count * sm.block_bytes))
                    else:
                        out.extend(Entry(layer, ps + (r.src + i) * sm.block_stride,
                                         pd + (r.dst + i) * dm.block_stride, sm.block_bytes)
                                   for i in range(r.count))
            continue
        assert heads is not None
        h_src, h_dst, n = heads
        if h_src + n > s.heads or h_dst + n > d.heads:
            raise PlanError(f"heads {h_src}+{n} / {h_dst}+{n} outside {s.heads} / {d.heads}")
        for ps, pd in zip(s.planes, d.planes):
            for r in runs:
                out.extend(Entry(layer, ps + (r.src + i) * s.block_stride + h_src * s.head_bytes,
                                 pd + (r.dst + i) * d.block_stride + h_dst * d.head_bytes,
                                 n * s.head_bytes) for i in range(r.count))
    return out


def split_groups(entries: Sequence[Entry], limit: int = GROUP_MAX_ENTRIES) -> list[list[Entry]]:
    """Entries in groups of at most ``limit`` (one group per request when they fit)."""
    if limit <= 0:
        raise PlanError("limit must be positive")
    return [list(entries[i:i + limit]) for i in range(0, len(entries), limit)]


# ------------------------------------------------------------------------------- messages

_REQ = struct.Struct("<4sBBHHQ")  # magic, version, 0, part, parts, token
_REQ_MAGIC = b"TLKR"
_GROUP = struct.Struct("<4sQHHiH")  # magic, token, group, groups, source rank, id length
_GROUP_MAGIC = b"TLKG"
_VERSION = 1


def encode_request(token: int, body: dict, max_payload: int = MAX_PAYLOAD) -> list[bytes]:
    """The decode's request (``body``, JSON) as message payloads of at most ``max_payload``
    bytes each, numbered so the prefill can put them back together (one writer's messages to
    one peer arrive in order, docs/abi.md)."""
    data = json.dumps(body, separators=(",", ":")).encode()
    room = max_payload - _REQ.size
    chunks = [data[i:i + room] for i in range(0, len(data), room)] or [b""]
    if len(chunks) > 0xFFFF:
        raise PlanError(f"a request of {len(data)} bytes is too large")
    return [_REQ.pack(_REQ_MAGIC, _VERSION, 0, i, len(chunks), token) + c
            for i, c in enumerate(chunks)]


#: A request of more parts than this (64 KiB: tens of thousands of block ids in runs) is
#: refused, and at most this many requests are put together at once: a peer's messages are
#: input, and a stream of first parts must not grow the prefill worker's memory without bound.
MAX_REQUEST_PARTS = 256
MAX_PENDING_REQUESTS = 1024


class Reassembler:
    """Puts the decode's requests back together at the prefill, per writer and token."""

    def __init__(self) -> None:
        self._parts: dict[tuple[str, int], list[bytes]] = {}
        #: Unfinished requests given up to keep at most MAX_PENDING_REQUESTS.
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._parts)

    def feed(self, peer: str, payload: bytes) -> Optional[tuple[int, dict]]:
        """``(token, body)`` once the last part of a request came; None before, and for a
        payload that is not a request part (PlanError for one that is malformed)."""
        if len(payload) < _REQ.size or payload[:4] != _REQ_MAGIC:
            return None
        magic, version, _, part, parts, token = _REQ.unpack_from(payload)
        if version != _VERSION or parts == 0 or part >= parts or parts > MAX_REQUEST_PARTS:
            raise PlanError(f"request part {part}/{parts} of version {version} from {peer}")
        key = (peer, token)
        if key not in self._parts and len(self._parts) >= MAX_PENDING_REQUESTS:
            # The oldest unfinished one goes (its decode times out and reports the blocks).
            del self._parts[next(iter(self._parts))]
            self.dropped += 1
        got = self._parts.setdefault(key, [])
        if part != len(got):
            del self._parts[key]
            raise PlanError(f"request {token:#x} from {peer}: part {part} after {len(got)}")
        got.append(payload[_REQ.size:])
        if len(got) < parts:
            return None
        del self._parts[key]
        try:
            body = json.loads(b"".join(got))
        except ValueError as e:
            raise PlanError(f"request {token:#x} from {peer}: {e}") from None
        if not isinstance(body, dict):
            raise PlanError(f"request {token:#x} from {peer}: not an object")
        return token, body


def group_payload(token: int, group: int, groups: int, src_rank: int, request_id: str) -> bytes:
    """What a group's notification carries: the transfer's token, which of the request's
    groups it is, the writing rank and the (prefill's) request id, cut to fit."""
    rid = request_id.encode()[:MAX_PAYLOAD - _GROUP.size]
    return _GROUP.pack(_GROUP_MAGIC, token, group, groups, src_rank, len(rid)) + rid


def parse_group_payload(payload: bytes) -> Optional[tuple[int, int, int, int, str]]:
    """``(token, group, groups, source rank, request id)``, or None for another payload."""
    if len(payload) < _GROUP.size or payload[:4] != _GROUP_MAGIC:
        return None
    _, token, group, groups, src_rank, n = _GROUP.unpack_from(payload)
    return token, group, groups, src_rank, payload[_GROUP.size:_GROUP.size + n].decode(
        errors="replace")
