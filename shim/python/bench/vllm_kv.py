#!/usr/bin/env python3
"""KV transfer time per request: tensorlane.vllm.TensorlaneConnector against the same blocks
moved by torch.distributed send/recv (NCCL on CUDA, gloo on the CPU).

tensorlane: two sidecars on loopback (tensorlane.testing.LocalCluster), a prefill and a decode
instance driven by tests/python/vllm_standins.py (vLLM v0.11.0's calls, real paged caches); a
request's time is the decode worker's, from sending its request to the prefill until the last
group's notification (``TensorlaneConnector.recv_seconds``), so it holds the message, the
prefill's planning and the grouped write. Each request is checked block by block.

torch.distributed: two processes, the same cache shapes and the same block lists; a request's
time is the receiver's, from a barrier until its blocks are in place: the sender gathers the
request's blocks of every layer into one tensor and sends it, the receiver receives it and
scatters it into its blocks (what a connector built on send/recv does).

    python3 shim/python/bench/vllm_kv.py                    # CUDA when there is one, else CPU
    python3 shim/python/bench/vllm_kv.py --device cpu --layers 4 --blocks 128 --requests 4

With two GPUs the prefill is on cuda:0 and the decode on cuda:1 (``--devices``); with one, both
sides of both are on it (an NCCL that refuses two ranks on one GPU is reported, not hidden).
On the device:
``scripts/device-run.sh run --no-rest --vllm-bench`` (a two-GPU kind for the NCCL side).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
try:
    import tensorlane
except ImportError:  # a source checkout
    sys.path.insert(0, os.path.join(ROOT, "shim", "python"))
    import tensorlane


def _defaults() -> None:
    build = os.environ.get("TENSORLANE_BUILD_DIR", os.path.join(ROOT, "build", "release"))
    if "TENSORLANE_LIBRARY" not in os.environ:
        try:
            tensorlane._lib.library()
        except tensorlane.LibraryError:
            os.environ["TENSORLANE_LIBRARY"] = os.path.join(build, "shim", "libtensorlane.so")
    sidecar = os.path.join(build, "sidecar", "tensorlane-sidecar")
    if "TENSORLANE_SIDECAR" not in os.environ and os.access(sidecar, os.X_OK):
        os.environ["TENSORLANE_SIDECAR"] = sidecar


def _requests(args) -> list:
    """(prompt tokens, source blocks, target blocks) per request, the same for both sides."""
    rng = random.Random(args.seed)
    n = -(-args.prompt // args.block_size)
    out = []
    for i in range(args.requests):
        if i % 2 == 0:  # contiguous at both ends (a fresh cache), then scattered
            start_s, start_d = rng.randrange(args.blocks - n), rng.randrange(args.blocks - n)
            out.append((args.prompt, list(range(start_s, start_s + n)),
                        list(range(start_d, start_d + n))))
        else:
            out.append((args.prompt, rng.sample(range(args.blocks), n),
                        rng.sample(range(args.blocks), n)))
    return out


def _ms(xs: list) -> str:
    return f"median {statistics.median(xs) * 1e3:.2f} ms, min {min(xs) * 1e3:.2f}, " \
           f"max {max(xs) * 1e3:.2f} ({len(xs)})"


def bench_tensorlane(args, torch, reqs) -> list:
    import vllm_standins as sv
    from tensorlane.testing import LocalCluster

    shape = dict(layers=args.layers, num_blocks=args.blocks, block_size=args.block_size,
                 heads=args.heads, head_dim=args.head_dim, dtype=torch.bfloat16,
                 extra={"transfer_timeout_s": 120})
    times = []
    with LocalCluster(("node-a", "node-b")) as c:
        p = sv.Instance("kv_producer", "prefill-e", c.socket("node-a"),
                        device=args.devices[0], **shape)
        d = sv.Instance("kv_consumer", "decode-e", c.socket("node-b"),
                        device=args.devices[1], **shape)
        try:
            for rep in range(args.repeat):
                for i, (prompt, src, dst) in enumerate(reqs):
                    rid = f"{rep}-{i}"
                    sv.fill(p, src, seed=i)
                    preq = sv.Request("p-" + rid, list(range(prompt)), {"do_remote_decode": True},
                                      sv.RequestStatus.FINISHED_LENGTH_CAPPED)
                    delay, params = p.scheduler.request_finished(preq, src)
                    dreq = sv.Request("d-" + rid, list(range(prompt)), dict(params))
                    n, _ = d.scheduler.get_num_new_matched_tokens(dreq, 0)
                    d.scheduler.update_state_after_alloc(dreq, sv.KVCacheBlocks(dst), n)
                    if args.devices[0].startswith("cuda"):
                        torch.cuda.synchronize()
                    p.step()  # the prefill's worker learns of the request
                    sv.run_until([d, p], lambda: dreq.request_id in d.finished_recving and
                                 preq.request_id in p.finished_sending, timeout=120)
                    if d.load_errors:
                        raise SystemExit(f"request {rid}: load errors {sorted(d.load_errors)}")
                    times.append(d.workers[0].recv_seconds[dreq.request_id])
                    if not args.no_check:
                        for layer in range(args.layers):
                            if not torch.equal(sv.block_view(d, 0, layer, dst).cpu(),
                                               sv.block_view(p, 0, layer, src).cpu()):
                                raise SystemExit(f"request {rid}: layer {layer} differs")
        finally:
            p.shutdown()
            d.shutdown()
    return times


def _dist_worker(rank: int, args, reqs, port: int, queue) -> None:
    import torch
    import torch.distributed as dist

    device = args.devices[rank]
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
        if args.devices[0] == args.devices[1]:
            # Two ranks on one GPU: NCCL refuses that within one host ("Duplicate GPU"), so each
            # is a host of its own and the data goes through NCCL's network transport (Socket
            # here: no RDMA device), as tensorlane's goes through its tcp transport.
            os.environ["NCCL_HOSTID"] = f"vllm-kv-host-{rank}"
            os.environ.setdefault("NCCL_NET", "Socket")
    dist.init_process_group(args.backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    shape = (2, args.blocks, args.block_size, args.heads, args.head_dim)
    caches = [torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(args.layers)]
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    times = []
    for _ in range(args.repeat):
        for prompt, src, dst in reqs:
            n = len(src)
            buf = torch.empty((args.layers, 2, n) + shape[2:], dtype=torch.bfloat16,
                              device=device)
            idx = torch.tensor(src if rank == 0 else dst, device=device)
            sync()
            dist.barrier()
            t0 = time.perf_counter()
            if rank == 0:
                torch.stack([c.index_select(1, idx) for c in caches], out=buf)
                dist.send(buf, 1)
            else:
                dist.recv(buf, 0)
                for layer, c in enumerate(caches):
                    c.index_copy_(1, idx, buf[layer])
            sync()
            times.append(time.perf_counter() - t0)
    dist.barrier()
    if rank == 1:
        queue.put(times)
    dist.destroy_process_group()


def bench_dist(args, reqs) -> list:
    import torch.multiprocessing as mp
    from tensorlane.testing import free_port

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_dist_worker, args=(r, args, reqs, port, queue))
             for r in range(2)]
    for pr in procs:
        pr.start()
    import queue as queuelib

    while True:
        try:
            times = queue.get(timeout=1)
            break
        except queuelib.Empty:
            if any(pr.exitcode not in (None, 0) for pr in procs):
                for pr in procs:
                    pr.kill()
                raise RuntimeError("a send/recv process failed: exit codes "
                                   f"{[pr.exitcode for pr in procs]} (its error is above)")
    for pr in procs:
        pr.join(60)
    return times


def main() -> int:
    import torch

    cuda = torch.cuda.is_available()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if cuda else "cpu")
    ap.add_argument("--devices", help="prefill,decode devices (default cuda:0,cuda:1 with two "
                    "GPUs, else the one device twice)")
    ap.add_argument("--layers", type=int)
    ap.add_argument("--blocks", type=int)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--prompt", type=int, help="tokens per request")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--backend", help="torch.distributed backend (default nccl on CUDA, gloo)")
    ap.add_argument("--no-dist", action="store_true", help="tensorlane only")
    ap.add_argument("--no-check", action="store_true", help="skip the block checks")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    gpu = args.device == "cuda"
    # The cache on the GPU (2 GiB per instance); a small one on the CPU.
    args.layers = args.layers or (32 if gpu else 4)
    args.blocks = args.blocks or (1000 if gpu else 128)
    args.prompt = args.prompt or (2048 if gpu else 512)
    args.backend = args.backend or ("nccl" if gpu else "gloo")
    if args.devices:
        args.devices = args.devices.split(",")
    elif gpu:
        args.devices = ["cuda:0", "cuda:1"] if torch.cuda.device_count() > 1 else ["cuda:0"] * 2
    else:
        args.devices = ["cpu", "cpu"]
    _defaults()
    reqs = _requests(args)
    n = len(reqs[0][1])
    nbytes = args.layers * 2 * n * args.block_size * args.heads * args.head_dim * 2
    print(f"{args.requests} requests x {args.repeat}: {n} blocks each of {args.layers} layers "
          f"({nbytes / 2**20:.1f} MiB a request), {args.devices[0]} -> {args.devices[1]}")
    result = {"args": vars(args), "bytes_per_request": nbytes}
    tl = bench_tensorlane(args, torch, reqs)
    result["tensorlane_s"] = tl
    print(f"tensorlane (tcp transport on loopback): {_ms(tl)}, "
          f"{nbytes / statistics.median(tl) / 1e9:.2f} GB/s")
    td: list = []
    if not args.no_dist:
        try:
            td = bench_dist(args, reqs)
        except RuntimeError as e:  # e.g. an NCCL that refuses two ranks on one GPU
            print(f"torch.distributed {args.backend} send/recv: {e}")
            result["dist_error"] = str(e)
            td = []
    if td:
        result["dist_s"] = td
        print(f"torch.distributed {args.backend} send/recv: {_ms(td)}, "
              f"{nbytes / statistics.median(td) / 1e9:.2f} GB/s; tensorlane / send-recv: "
              f"{statistics.median(tl) / statistics.median(td):.2f}x")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
