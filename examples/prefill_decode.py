#!/usr/bin/env python3
"""Disaggregated prefill/decode: a prefill worker writes KV blocks into a decode worker's
registered KV cache, the block id in the immediate; the decode worker waits for exactly the
blocks of each request and verifies them. A prefill worker that dies mid-transfer leaves the
decode worker with a clear error naming the blocks that did not come, never a hang.

One command (from the repository root, after ``cmake --build build/release``)::

    python3 examples/prefill_decode.py                                  # 4 requests, verified
    python3 examples/prefill_decode.py --kill-prefill-after-blocks 24   # prefill SIGKILLed

starts two sidecars on loopback (tensorlane.testing.LocalCluster), the prefill worker on
node-a and the decode worker on node-b.

The protocol, all through tensorlane:

* the decode worker exposes its KV cache (``num_blocks`` blocks of ``layers x 2 x
  block_tokens x kv_heads x head_dim`` float16) as ``pd/<decode>/kv``; the prefill worker
  exposes an inbox ``pd/<prefill>/inbox`` (request slots and a ping word);
* for each request the decode worker picks free cache blocks (not contiguous), writes a
  request descriptor (request id, seed, its node and cache name, the block ids) into the
  prefill's inbox, immediate = request id;
* the prefill worker computes each block's K/V (deterministic from the seed: the decode side
  recomputes it to verify) into a staging buffer and writes block j of the request into
  cache block ``block_ids[j]``, immediate = that block id;
* the decode worker takes notifications until every block of the request has arrived:
  each must be one of the request's blocks (a stray one is an error), land at
  ``block_id * block_bytes`` with ``block_bytes`` bytes from the prefill's node, and hold
  exactly the expected K/V.

Never a hang, by two mechanisms. The **deadline**: a request that is not complete after
``--request-timeout`` seconds fails with the list of missing blocks (exit 4), whatever the
cause (a prefill that is alive but stuck, a partitioned network). The **writer's liveness**,
much sooner: while it waits, the decode worker writes 8 bytes into the prefill's inbox ping
word every ``--liveness-interval`` seconds (immediate PING, which the prefill ignores). When
the prefill process dies its sidecar revokes its exposed regions at once, so the next ping
fails with NotFoundError (or PeerError if its whole node is gone); the decode worker then
collects what was still in flight for ``--grace`` seconds and fails the request naming the
blocks that did not come (exit 3). No heartbeat timing has to be guessed: the signal is the
sidecar's own record that the process is gone.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import struct
import subprocess
import sys
import time
from typing import Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

try:
    import tensorlane
except ImportError:  # running from a source checkout
    sys.path.insert(0, os.path.join(ROOT, "shim", "python"))
    import tensorlane

PING = 0xFFFFFFFF  # decode → prefill liveness probe (ignored by the prefill)
SHUTDOWN = 0xFFFFFFFE  # decode → prefill: no more requests
SLOTS = 8  # request slots in the prefill's inbox
SLOT_BYTES = 8192
PING_OFFSET = SLOTS * SLOT_BYTES
INBOX_BYTES = PING_OFFSET + 64
MAGIC = 0x4B56424C  # "KVBL"
# magic, request id, n blocks, reserved, seed, decode node (64), cache name (64), block ids
HEADER = struct.Struct("<IIIIQ64s64s")
MAX_BLOCKS = (SLOT_BYTES - HEADER.size) // 4

EXIT_WRITER_GONE, EXIT_DEADLINE, EXIT_BAD_DATA = 3, 4, 5


def _defaults() -> None:
    build = os.environ.get("TENSORLANE_BUILD_DIR", os.path.join(ROOT, "build", "release"))
    if "TENSORLANE_LIBRARY" not in os.environ:
        try:
            tensorlane._lib.library()
        except tensorlane.LibraryError:
            lib = os.path.join(build, "shim", "libtensorlane.so")
            if os.path.exists(lib):
                os.environ["TENSORLANE_LIBRARY"] = lib
    sidecar = os.path.join(build, "sidecar", "tensorlane-sidecar")
    if "TENSORLANE_SIDECAR" not in os.environ and os.access(sidecar, os.X_OK):
        os.environ["TENSORLANE_SIDECAR"] = sidecar


def block_shape(args) -> tuple:
    return (args.layers, 2, args.block_tokens, args.kv_heads, args.head_dim)


def kv_block(torch, args, seed: int, j: int):
    """K and V of block j of a request: what a model's prefill would compute, deterministic."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + j)
    return torch.randn(block_shape(args), generator=g).to(torch.float16)


def nbytes(t) -> int:
    return t.numel() * t.element_size()  # (Tensor.nbytes is newer than Debian's torch 1.13)


def log(who: str, msg: str) -> None:
    print(f"[{who} {time.monotonic():.3f}] {msg}", flush=True)


# ---------------------------------------------------------------------------- the prefill


def prefill(args) -> int:
    import torch

    torch.set_num_threads(1)
    me = f"prefill {args.name}"
    client = tensorlane.Client(args.socket)
    inbox = client.alloc_host(INBOX_BYTES)
    client.expose(inbox, f"pd/{args.name}/inbox")
    block_bytes = nbytes(torch.empty(block_shape(args), dtype=torch.float16))
    staging = client.alloc_host_tensor((args.staging,) + block_shape(args), torch.float16)
    staging_region = client.region_of(staging)
    slot_tickets: list[Optional[tensorlane.Ticket]] = [None] * args.staging
    remotes = {}
    written = 0
    log(me, f"ready on {client.node_name}: inbox exposed, {args.staging} staging blocks")
    while True:
        note = client.wait_notification()
        if note.imm == PING:
            continue
        if note.imm == SHUTDOWN:
            log(me, f"done: {written} blocks written")
            break
        raw = bytes(note.view()[:SLOT_BYTES])
        magic, req, n, _, seed, node, cache = HEADER.unpack_from(raw)
        if magic != MAGIC or n > MAX_BLOCKS:
            log(me, f"bad request descriptor (imm {note.imm})")
            return EXIT_BAD_DATA
        blocks = struct.unpack_from(f"<{n}I", raw, HEADER.size)
        node, cache = node.rstrip(b"\0").decode(), cache.rstrip(b"\0").decode()
        if (node, cache) not in remotes:
            remotes[(node, cache)] = client.lookup(node, cache, timeout=30)
        remote = remotes[(node, cache)]
        t0 = time.perf_counter()
        for j, block in enumerate(blocks):
            slot = j % args.staging
            if slot_tickets[slot] is not None:
                slot_tickets[slot].wait(30)  # the staging slot is free once its write landed
            staging[slot].copy_(kv_block(torch, args, seed, j))
            slot_tickets[slot] = client.write(staging_region, remote, imm=block,
                                              src_offset=slot * block_bytes,
                                              dst_offset=block * block_bytes, nbytes=block_bytes)
            written += 1
            if args.die_after_blocks is not None and written == args.die_after_blocks:
                log(me, f"SIGKILL after submitting {written} blocks (request {req}, "
                    f"{j + 1} of {n}; the last writes still in flight)")
                os.kill(os.getpid(), signal.SIGKILL)
            if args.stall_after_blocks is not None and written == args.stall_after_blocks:
                log(me, f"stalling after {written} blocks (alive, writing nothing more)")
                while True:
                    time.sleep(3600)
        for i, t in enumerate(slot_tickets):
            if t is not None:
                t.wait(30)
                slot_tickets[i] = None
        log(me, f"request {req}: {n} blocks ({n * block_bytes} bytes) written to {node} in "
            f"{(time.perf_counter() - t0) * 1e3:.1f} ms")
    client.close()
    return 0


# ----------------------------------------------------------------------------- the decode


class RequestFailed(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def decode(args) -> int:
    import torch

    torch.set_num_threads(1)
    me = f"decode {args.name}"
    client = tensorlane.Client(args.socket)
    cache = client.alloc_host_tensor((args.num_blocks,) + block_shape(args), torch.float16)
    cache_name = f"pd/{args.name}/kv"
    client.expose(cache, cache_name)
    block_bytes = nbytes(cache[0])
    inbox = client.lookup(args.prefill_node, f"pd/{args.prefill}/inbox", timeout=30)
    outbox = client.alloc_host(SLOT_BYTES)  # request descriptors are written from here
    ping_src = client.alloc_host(8)
    rng = random.Random(args.seed)
    free = list(range(args.num_blocks))
    log(me, f"ready on {client.node_name}: {args.num_blocks} x {block_bytes} B KV cache "
        f"exposed as {cache_name}")

    def fail(code: int, message: str) -> int:
        log(me, "ERROR " + message)
        return code

    for req in range(args.requests):
        n = args.blocks_per_request
        rng.shuffle(free)
        blocks, free = free[:n], free[n:]
        seed = args.seed * 7919 + req
        slot = req % SLOTS
        HEADER.pack_into(outbox.view(), 0, MAGIC, req, n, 0, seed, client.node_name.encode(),
                         cache_name.encode())
        struct.pack_into(f"<{n}I", outbox.view(), HEADER.size, *blocks)
        t0 = time.perf_counter()
        try:
            client.write(outbox, inbox, imm=req, dst_offset=slot * SLOT_BYTES,
                         nbytes=HEADER.size + 4 * n).wait(args.request_timeout)
            wait_blocks(client, args, torch, req, seed, blocks, cache, block_bytes, inbox,
                        ping_src)
        except RequestFailed as e:
            return fail(e.code, f"request {req}: {e}")
        except (tensorlane.NotFoundError, tensorlane.PeerError) as e:
            return fail(EXIT_WRITER_GONE, f"request {req}: could not send it to the prefill "
                        f"worker: {e}; none of its {n} blocks came")
        took = time.perf_counter() - t0
        log(me, f"request {req}: all {n} blocks arrived and verified in {took * 1e3:.1f} ms "
            f"(request sent to last block verified, the prefill computing them included: "
            f"{n * block_bytes / took / 1e6:.0f} MB/s end to end), blocks {sorted(blocks)}")
        free += blocks  # the request finished decoding: its blocks are free again
    try:
        client.write(ping_src, inbox, imm=SHUTDOWN, dst_offset=PING_OFFSET).wait(5)
    except tensorlane.TensorlaneError:
        pass
    log(me, f"all {args.requests} requests verified")
    client.close()
    return 0


def wait_blocks(client, args, torch, req, seed, blocks, cache, block_bytes, inbox,
                ping_src) -> None:
    """Returns when every block of the request has arrived and verified; raises
    RequestFailed otherwise (deadline, writer gone, wrong data). Never blocks longer than the
    request's deadline."""
    want = {b: j for j, b in enumerate(blocks)}  # cache block -> index in the request
    pending = set(blocks)
    start = time.monotonic()
    deadline = start + args.request_timeout
    next_ping = start + args.liveness_interval
    ping = None
    last_answered: Optional[float] = None  # when a ping last completed
    gone = None  # (when it was seen, why)
    while pending:
        now = time.monotonic()
        try:
            if gone is None and ping is not None and ping.done():
                ping.wait(0)  # raises what the ping ended with
                ping, last_answered = None, now
            if gone is None and ping is None and now >= next_ping:
                ping = client.write(ping_src, inbox, imm=PING, dst_offset=PING_OFFSET)
                next_ping = now + args.liveness_interval
        except (tensorlane.NotFoundError, tensorlane.PeerError) as e:
            gone = (now, e)
        if gone is not None and now >= gone[0] + args.grace:
            missing = sorted(pending)
            why = ("its inbox was revoked, so its process has exited"
                   if isinstance(gone[1], tensorlane.NotFoundError) else
                   "its node is unreachable")
            raise RequestFailed(
                EXIT_WRITER_GONE,
                f"the prefill worker is gone: a ping into its inbox failed with "
                f"{type(gone[1]).__name__} ({why}); "
                f"{len(missing)} of {len(blocks)} blocks did not come: {missing} "
                f"({len(blocks) - len(missing)} arrived and verified)")
        if now >= deadline:
            missing = sorted(pending)
            raise RequestFailed(
                EXIT_DEADLINE,
                f"deadline of {args.request_timeout:g} s passed; {len(missing)} of "
                f"{len(blocks)} blocks did not come: {missing} (" + (
                    f"the prefill worker answered a ping {now - last_answered:.2f} s ago: "
                    "alive but not writing)" if last_answered is not None else
                    "no ping of the prefill worker was answered)"))
        # While a ping is out, look at it often: its failure is the news that matters.
        stop = min(deadline, (now + args.liveness_interval / 10 if ping is not None else
                              next_ping) if gone is None else gone[0] + args.grace)
        try:
            note = client.wait_notification(timeout=max(0.0, stop - now))
        except TimeoutError:
            continue
        b = note.imm
        if b not in pending:
            raise RequestFailed(EXIT_BAD_DATA, f"block {b} arrived but the request "
                                f"{'already had it' if b in want else 'does not use it'}")
        if (note.offset, note.bytes, note.peer) != (b * block_bytes, block_bytes,
                                                    args.prefill_node):
            raise RequestFailed(EXIT_BAD_DATA, f"block {b} landed at {note.offset}+{note.bytes}"
                                f" from {note.peer}, expected {b * block_bytes}+{block_bytes}"
                                f" from {args.prefill_node}")
        if not torch.equal(cache[b], kv_block(torch, args, seed, want[b])):
            raise RequestFailed(EXIT_BAD_DATA, f"block {b} does not hold the K/V of block "
                                f"{want[b]} of the request")
        pending.discard(b)


# ---------------------------------------------------------------------------- the launcher


def launch(args) -> int:
    from tensorlane.testing import LocalCluster

    cpus = os.cpu_count() or 1
    mode = args.poll_mode if args.poll_mode != "auto" else ("event" if 4 > cpus else "adaptive")
    print(f"sidecars: poll_mode = {mode} (2 workers and 2 sidecars on {cpus} CPUs)", flush=True)
    with LocalCluster(("node-a", "node-b"), log_level="warn", poll_mode=mode) as cluster:
        common = [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in
                  ("layers", "block_tokens", "kv_heads", "head_dim", "seed")]
        me = os.path.abspath(__file__)
        pre_cmd = [sys.executable, me, "prefill", "--socket", cluster.socket("node-a"),
                   "--name", "prefill-0", *common]
        if args.kill_prefill_after_blocks is not None:
            pre_cmd.append(f"--die-after-blocks={args.kill_prefill_after_blocks}")
        if args.stall_prefill_after_blocks is not None:
            pre_cmd.append(f"--stall-after-blocks={args.stall_prefill_after_blocks}")
        dec_cmd = [sys.executable, me, "decode", "--socket", cluster.socket("node-b"),
                   "--name", "decode-0", "--prefill", "prefill-0", "--prefill-node", "node-a",
                   f"--requests={args.requests}", f"--blocks-per-request={args.blocks_per_request}",
                   f"--num-blocks={args.num_blocks}", f"--request-timeout={args.request_timeout}",
                   f"--liveness-interval={args.liveness_interval}", f"--grace={args.grace}",
                   *common]
        pre = subprocess.Popen(pre_cmd)
        dec = subprocess.Popen(dec_cmd)
        died_at = None
        try:
            limit = time.monotonic() + args.request_timeout * (args.requests + 2) + 60
            while dec.poll() is None:
                if died_at is None and pre.poll() is not None:
                    died_at = time.monotonic()
                if time.monotonic() > limit:
                    print("launcher: the decode worker did not finish: killing it",
                          file=sys.stderr)
                    dec.kill()
                    dec.wait()
                    return 124
                time.sleep(0.01)
            ended = time.monotonic()
            if died_at is None and pre.poll() is not None and pre.returncode < 0:
                died_at = ended
            rc = dec.returncode
        finally:
            for p in (pre, dec):
                if p.poll() is None:
                    p.terminate()
                    try:
                        p.wait(10)
                    except subprocess.TimeoutExpired:
                        p.kill()
                        p.wait()
        if died_at is not None and pre.returncode is not None and pre.returncode < 0:
            print(f"launcher: prefill worker killed by signal {-pre.returncode}; the decode "
                  f"worker reported it {(ended - died_at) * 1e3:.0f} ms later (exit {rc})",
                  flush=True)
        else:
            print(f"launcher: decode worker exit {rc}", flush=True)
        return rc


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command")

    def model(q):
        q.add_argument("--layers", type=int, default=4)
        q.add_argument("--block-tokens", type=int, default=16)
        q.add_argument("--kv-heads", type=int, default=8)
        q.add_argument("--head-dim", type=int, default=64)
        q.add_argument("--seed", type=int, default=1)

    def decoding(q):
        q.add_argument("--requests", type=int, default=4)
        q.add_argument("--blocks-per-request", type=int, default=16)
        q.add_argument("--num-blocks", type=int, default=256, help="KV cache blocks")
        q.add_argument("--request-timeout", type=float, default=10.0,
                       help="deadline of one request in seconds (default 10)")
        q.add_argument("--liveness-interval", type=float, default=0.1,
                       help="seconds between pings of the prefill worker (default 0.1)")
        q.add_argument("--grace", type=float, default=0.3,
                       help="seconds to collect writes still in flight after the prefill "
                       "worker is seen gone (default 0.3)")

    model(p)
    decoding(p)
    p.add_argument("--kill-prefill-after-blocks", type=int, default=None,
                   help="the prefill worker SIGKILLs itself after submitting this many blocks")
    p.add_argument("--stall-prefill-after-blocks", type=int, default=None,
                   help="the prefill worker stops writing (alive) after this many blocks")
    p.add_argument("--poll-mode", choices=("auto", "busy", "adaptive", "event"), default="auto",
                   help="the sidecars' [ipc] poll_mode; auto: event when the processes "
                   "outnumber the CPUs, else adaptive (tensor_parallel.py says why)")
    pre = sub.add_parser("prefill", help="the prefill worker")
    model(pre)
    pre.add_argument("--socket", default=None)
    pre.add_argument("--name", default="prefill-0")
    pre.add_argument("--staging", type=int, default=8, help="staging blocks (default 8)")
    pre.add_argument("--die-after-blocks", type=int, default=None)
    pre.add_argument("--stall-after-blocks", type=int, default=None)
    dec = sub.add_parser("decode", help="the decode worker")
    model(dec)
    decoding(dec)
    dec.add_argument("--socket", default=None)
    dec.add_argument("--name", default="decode-0")
    dec.add_argument("--prefill", default="prefill-0", help="the prefill worker's name")
    dec.add_argument("--prefill-node", required=True, help="the prefill worker's node")
    args = p.parse_args(argv)
    if getattr(args, "blocks_per_request", 1) > MAX_BLOCKS:
        p.error(f"--blocks-per-request is at most {MAX_BLOCKS}")
    if getattr(args, "requests", 0) and args.blocks_per_request > args.num_blocks:
        p.error("--blocks-per-request must not exceed --num-blocks")
    try:
        import torch  # noqa: F401
    except ImportError:
        p.error(f"needs PyTorch, which {sys.executable} lacks (Debian: apt-get install "
                "python3-torch, then run it with /usr/bin/python3)")
    _defaults()
    if args.command == "prefill":
        return prefill(args)
    if args.command == "decode":
        return decode(args)
    return launch(args)


if __name__ == "__main__":
    sys.exit(main())
