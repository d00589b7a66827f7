#!/usr/bin/env python3
"""Tensor parallelism: every rank all-gathers its shard each step through tensorlane, checked
against the reference and timed against torch.distributed's all-gather in the same run.

One command (from the repository root, after ``cmake --build build/release``)::

    python3 examples/tensor_parallel.py --ranks 4

starts two sidecars on loopback (node-a, node-b: tensorlane.testing.LocalCluster) and one
worker process per rank, ranks 0..N/2-1 on node-a and the rest on node-b. Each step, rank r
writes its shard into slot r of every other rank's gather buffer (one ``write_batch``: remote
ranks through the TCP transport, ranks of the same node through the local one, immediate =
step << 8 | rank), waits for the N-1 shards of that step and for its own writes, and checks
the gathered tensor against the reference (the concatenation of every rank's shard). Then
the same steps run through ``torch.distributed.all_gather`` (gloo on CPU; NCCL with
``--device cuda``). Rounds alternate the two so both see the same machine. Rank 0 prints per
step latency (the slowest rank's time for the step) for both and their ratio.

Buffers: two halves (step parity). A rank writes step s+1 only after it has all of step s, so
a peer can be at most one step ahead and never overwrites the half being read.

On real nodes, run the ``worker`` subcommand on each host (``--socket`` of that node's
sidecar, ``--nodes`` naming the node of every rank, ``--dist-init tcp://rank0-host:port``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _import_tensorlane():
    try:
        import tensorlane  # noqa: F401
    except ImportError:  # running from a source checkout
        sys.path.insert(0, os.path.join(ROOT, "shim", "python"))
    import tensorlane

    return tensorlane


tensorlane = _import_tensorlane()


def _default_library() -> None:
    """From a source checkout: the build tree's library and sidecar unless told otherwise."""
    build = os.environ.get("TENSORLANE_BUILD_DIR", os.path.join(ROOT, "build", "release"))
    lib = os.path.join(build, "shim", "libtensorlane.so")
    if "TENSORLANE_LIBRARY" not in os.environ:
        try:
            tensorlane._lib.library()
        except tensorlane.LibraryError:
            if os.path.exists(lib):
                os.environ["TENSORLANE_LIBRARY"] = lib
    sidecar = os.path.join(build, "sidecar", "tensorlane-sidecar")
    if "TENSORLANE_SIDECAR" not in os.environ and os.access(sidecar, os.X_OK):
        os.environ["TENSORLANE_SIDECAR"] = sidecar


# ------------------------------------------------------------------------------ the worker


def shard_of(torch, seed: int, step: int, rank: int, elems: int, device: str):
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + rank)
    return torch.randn(elems, generator=g).to(device)


def imm_of(step: int, rank: int) -> int:
    return ((step & 0xFFFFFF) << 8) | rank


def worker(args) -> int:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # several ranks share the cores
    W, r, device = args.world, args.rank, args.device
    nodes = args.nodes.split(",")
    assert len(nodes) == W and W <= 256
    elems = args.shard_bytes // 4
    shard_bytes = elems * 4

    backend = "nccl" if device == "cuda" else "gloo"
    if device == "cuda":
        torch.cuda.set_device(r % torch.cuda.device_count())
    dist.init_process_group(backend, init_method=args.dist_init, world_size=W, rank=r,
                            timeout=datetime.timedelta(seconds=args.timeout))

    client = tensorlane.Client(args.socket)
    # The gather buffer: [half][rank][shard]; registered memory in both cases.
    if device == "cuda":
        gather = torch.zeros((2, W, elems), dtype=torch.float32, device="cuda")
        try:
            region = client.register(gather)
        except tensorlane.CudaError as e:
            print(f"[rank {r}] CUDA tensors need GPU support in libtensorlane: {e}", flush=True)
            return 77
    else:
        gather = client.alloc_host_tensor((2, W, elems), torch.float32)
        region = client.region_of(gather)
    client.expose(region, f"{args.run_id}/rank{r}")
    remotes = {q: client.lookup(nodes[q], f"{args.run_id}/rank{q}", timeout=args.timeout)
               for q in range(W) if q != r}
    dist.barrier()  # every rank has exposed and looked up: timing starts together

    def tensorlane_step(step: int, shard) -> float:
        half = step % 2
        t0 = time.perf_counter()
        gather[half, r].copy_(shard)
        if device == "cuda":
            torch.cuda.current_stream().synchronize()
        off = (half * W + r) * shard_bytes
        tickets = client.write_batch([
            tensorlane.Write(region, remotes[q], imm_of(step, r), off, off, shard_bytes)
            for q in remotes])
        while arrived.get(step, 0) < W - 1:
            note = client.wait_notification(timeout=args.timeout)
            s, q = note.imm >> 8, note.imm & 0xFF
            expect = ((s % 2) * W + q) * shard_bytes
            if note.offset != expect or note.bytes != shard_bytes:
                raise RuntimeError(f"rank {r}: shard of rank {q} step {s} landed at "
                                   f"{note.offset}+{note.bytes}, not {expect}+{shard_bytes}")
            arrived[s] = arrived.get(s, 0) + 1
        for t in tickets:
            t.wait(args.timeout)
        took = time.perf_counter() - t0
        del arrived[step]
        return took

    outs = torch.empty((W, elems), dtype=torch.float32, device=device)
    out_list = list(outs.unbind(0))

    def dist_step(step: int, shard) -> float:
        t0 = time.perf_counter()
        dist.all_gather(out_list, shard)
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    arrived: dict[int, int] = {}
    times: dict[str, list[float]] = {"tensorlane": [], "torch.distributed": []}
    step = 0
    for rnd in range(args.rounds):
        for method, run in (("tensorlane", tensorlane_step), ("torch.distributed", dist_step)):
            for i in range(args.warmup + args.steps):
                shard = shard_of(torch, args.seed, step, r, elems, device)
                took = run(step, shard)
                got = gather[step % 2] if method == "tensorlane" else outs
                ref = torch.stack([shard_of(torch, args.seed, step, q, elems, device)
                                   for q in range(W)])
                if not torch.equal(got, ref):
                    bad = [q for q in range(W) if not torch.equal(got[q], ref[q])]
                    print(f"[rank {r}] {method} step {step}: shards of ranks {bad} differ "
                          "from the reference", flush=True)
                    return 5
                if i >= args.warmup:
                    times[method].append(took)
                step += 1
            dist.barrier()  # the next method starts together
    verified = step

    everyone = [None] * W
    dist.all_gather_object(everyone, times)
    if r == 0:
        report(args, everyone, verified, client.node_name, nodes)
    client.close()
    dist.destroy_process_group()
    return 0


def report(args, everyone, verified, node, nodes) -> None:
    W = args.world
    summary = {}
    for method in ("tensorlane", "torch.distributed"):
        # A step takes as long as its slowest rank.
        per_step = [max(everyone[q][method][i] for q in range(W))
                    for i in range(len(everyone[0][method]))]
        per_step.sort()
        summary[method] = {
            "p50_us": statistics.median(per_step) * 1e6,
            "p90_us": per_step[int(0.9 * (len(per_step) - 1))] * 1e6,
            "mean_us": statistics.fmean(per_step) * 1e6,
            "steps": len(per_step),
        }
    tl, td = summary["tensorlane"], summary["torch.distributed"]
    ratio = tl["p50_us"] / td["p50_us"]
    backend = "nccl" if args.device == "cuda" else "gloo"
    placement = ", ".join(f"{n}: ranks {[q for q in range(W) if nodes[q] == n]}"
                          for n in dict.fromkeys(nodes))
    print(f"all-gather of {W} x {args.shard_bytes} B shards ({placement}), "
          f"{args.rounds} rounds x {args.steps} steps per method, every step verified "
          f"({verified} in all)")
    print(f"{'method':<22}{'p50':>12}{'p90':>12}{'mean':>12}")
    for method in ("tensorlane", f"torch.distributed ({backend})"):
        s = summary[method.split(" (")[0]]
        print(f"{method:<22}{s['p50_us']:>10.0f}us{s['p90_us']:>10.0f}us{s['mean_us']:>10.0f}us")
    print(f"ratio tensorlane / torch.distributed ({backend}), p50: {ratio:.2f}")
    print("RESULT " + json.dumps({"ranks": W, "shard_bytes": args.shard_bytes,
                                  "backend": backend, "verified_steps": verified,
                                  "ratio_p50": ratio, **summary}), flush=True)


# ---------------------------------------------------------------------------- the launcher


def launch(args) -> int:
    from tensorlane.testing import LocalCluster, free_port

    W = args.ranks
    if W < 2:
        print("--ranks must be at least 2", file=sys.stderr)
        return 2
    if args.device == "cuda":
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if gpus < W:
            # NCCL refuses two ranks on one GPU ("Duplicate GPU detected").
            print(f"--device cuda needs a GPU per rank on this host: {W} ranks, {gpus} GPUs",
                  file=sys.stderr)
            return 77
    names = ["node-a", "node-b"]
    nodes = [names[q * 2 // W] for q in range(W)]
    mode = pick_poll_mode(args.poll_mode, W + len(names))
    with LocalCluster(names, log_level="warn", poll_mode=mode) as cluster:
        init = f"tcp://127.0.0.1:{free_port()}"
        run_id = f"tp-{os.getpid()}"
        procs = []
        for q in range(W):
            cmd = [sys.executable, os.path.abspath(__file__), "worker", "--rank", str(q),
                   "--world", str(W), "--nodes", ",".join(nodes),
                   "--socket", cluster.socket(nodes[q]), "--dist-init", init,
                   "--run-id", run_id, "--shard-bytes", str(args.shard_bytes),
                   "--steps", str(args.steps), "--warmup", str(args.warmup),
                   "--rounds", str(args.rounds), "--seed", str(args.seed),
                   "--device", args.device, "--timeout", str(args.timeout)]
            procs.append(subprocess.Popen(cmd, env=os.environ.copy()))
        rc = wait_all(procs, args.timeout * 4)
        if rc not in (0, 77):
            for n in names:
                print(f"--- {n} log (tail)\n{cluster[n].log()[-2000:]}", file=sys.stderr)
        return rc


def pick_poll_mode(asked: str, processes: int) -> str:
    """auto: event when the busy processes outnumber the CPUs (spinning clients then take the
    core their sidecar needs: 16 KiB steps measured 10x slower in adaptive mode, 150x in busy
    mode, on a 2-core VM), else adaptive (the sidecar's default)."""
    cpus = os.cpu_count() or 1
    mode = asked if asked != "auto" else ("event" if processes > cpus else "adaptive")
    print(f"sidecars: poll_mode = {mode} ({processes} busy processes on {cpus} CPUs)",
          flush=True)
    return mode


def wait_all(procs, timeout: float) -> int:
    """All exit codes 0 → 0; else the first failure's, after stopping the others."""
    deadline = time.monotonic() + timeout
    rc = 0
    try:
        while any(p.poll() is None for p in procs):
            failed = [p.returncode for p in procs if p.returncode not in (None, 0)]
            if failed or time.monotonic() > deadline:
                rc = failed[0] if failed else 124
                break
            time.sleep(0.05)
        else:
            rc = next((p.returncode for p in procs if p.returncode != 0), 0)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    return rc


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command")

    def common(q):
        q.add_argument("--shard-bytes", type=int, default=256 * 1024,
                       help="bytes per rank per step (float32; default 262144)")
        q.add_argument("--steps", type=int, default=50, help="timed steps per round and method")
        q.add_argument("--warmup", type=int, default=5, help="untimed steps first (default 5)")
        q.add_argument("--rounds", type=int, default=2,
                       help="rounds, each running both methods (default 2)")
        q.add_argument("--seed", type=int, default=1)
        q.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                       help="cpu: host tensors and gloo; cuda: CUDA tensors and NCCL")
        q.add_argument("--timeout", type=float, default=60.0,
                       help="seconds any one wait may take (default 60)")

    common(p)
    p.add_argument("--ranks", type=int, default=4, help="worker processes (default 4)")
    p.add_argument("--poll-mode", choices=("auto", "busy", "adaptive", "event"), default="auto",
                   help="the sidecars' [ipc] poll_mode; auto: event when the workers and "
                   "sidecars outnumber the CPUs, else adaptive")
    w = sub.add_parser("worker", help="one rank (the launcher runs these)")
    common(w)
    w.add_argument("--rank", type=int, required=True)
    w.add_argument("--world", type=int, required=True)
    w.add_argument("--nodes", required=True, help="node of each rank, comma-separated")
    w.add_argument("--socket", default=None, help="this node's sidecar socket "
                   "(default: $TENSORLANE_SOCKET)")
    w.add_argument("--dist-init", required=True, help="torch.distributed init_method")
    w.add_argument("--run-id", default="tp", help="prefix of the exposed names")
    args = p.parse_args(argv)
    if args.shard_bytes < 4 or args.shard_bytes % 4:
        p.error("--shard-bytes must be a positive multiple of 4")
    try:
        import torch  # noqa: F401
    except ImportError:
        p.error(f"needs PyTorch, which {sys.executable} lacks (Debian: apt-get install "
                "python3-torch, then run it with /usr/bin/python3)")
    _default_library()
    if args.command == "worker":
        return worker(args)
    return launch(args)


if __name__ == "__main__":
    sys.exit(main())
