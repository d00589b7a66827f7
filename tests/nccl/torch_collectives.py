#!/usr/bin/env python3
"""torch.distributed collectives through NCCL's net transport: two ranks on one GPU become two
"hosts" (a different NCCL_HOSTID each), so NCCL moves their data with its network plugin:
``--net tensorlane`` (NCCL_NET_PLUGIN=tensorlane, two sidecars on loopback, one per rank) or
``--net socket`` (NCCL_NET=Socket, NCCL's own TCP transport) for the baseline.

Every result is checked: all_reduce sums, all_gather and reduce_scatter pieces, send/recv
bytes. Prints one JSON line per (op, size) with the median time and NCCL's algorithm
bandwidth, and exits non-zero on any wrong value or when NCCL did not use the network asked
for.

    python3 tests/nccl/torch_collectives.py --net tensorlane --out results.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import sys
import tempfile
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dump_hang(log_dir: str, rank_pids: list, cluster) -> None:
    """What each rank's and sidecar's threads wait on, and the sidecars' own status."""
    import shutil
    import subprocess

    pids = [("rank", p) for p in rank_pids]
    if cluster is not None:
        for name in ("node-a", "node-b"):
            node = cluster[name]
            if node.process is not None:
                pids.append((name, node.process.pid))
            try:
                from tensorlane import Client

                with Client(socket=node.socket) as c:
                    status = c.sidecar_status()
                with open(os.path.join(log_dir, f"status-{name}.json"), "w") as f:
                    json.dump(status, f, indent=1)
            except Exception as e:  # noqa: BLE001 (a dump must not stop the others)
                print(f"status of {name}: {e}", file=sys.stderr)
            try:
                shutil.copy(node.log_path, os.path.join(log_dir, f"sidecar-{name}.log"))
            except OSError:
                pass
    gdb = shutil.which("gdb")
    for what, pid in pids:
        out = os.path.join(log_dir, f"stacks-{what}-{pid}.txt")
        with open(out, "w") as f:
            if gdb:
                subprocess.run([gdb, "-p", str(pid), "-batch", "-ex", "thread apply all bt"],
                               stdout=f, stderr=subprocess.STDOUT, timeout=60)
            for task in sorted(os.listdir(f"/proc/{pid}/task")):
                try:
                    comm = open(f"/proc/{pid}/task/{task}/comm").read().strip()
                    wchan = open(f"/proc/{pid}/task/{task}/wchan").read().strip()
                    stack = open(f"/proc/{pid}/task/{task}/stack").read()
                except OSError as e:
                    comm, wchan, stack = "?", "?", str(e)
                f.write(f"--- task {task} {comm} wchan {wchan}\n{stack}\n")


def rank_main(rank: int, args, port: int, sockets: list, out_path: str) -> None:
    os.environ["NCCL_HOSTID"] = f"tl-host-{rank}"
    if args.deadline and args.log_dir:
        import faulthandler

        # Where Python was when the parent gives up (the dump before the kill).
        stacks = open(os.path.join(args.log_dir, f"py-stacks-rank{rank}.txt"), "w")
        faulthandler.dump_traceback_later(max(1.0, args.deadline - 3), file=stacks)
    if args.net == "tensorlane":
        os.environ["NCCL_NET_PLUGIN"] = "tensorlane"
        os.environ["TENSORLANE_SOCKET"] = sockets[rank]
    else:
        os.environ["NCCL_NET"] = "Socket"
        # Loopback only (the project's rule for test traffic; NCCL would pick eth0).
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    dev = torch.device("cuda", 0)
    results = []
    bad = []

    def timed(fn, iters):
        fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    ops = set(args.ops)
    for size in args.sizes:
        n = size // 4
        iters = args.iters if size <= (16 << 20) else max(3, args.iters // 4)
        # all_reduce: rank r contributes r + 1 everywhere; the sum is 3.
        x = torch.full((n,), float(rank + 1), device=dev)

        def ar():
            x.fill_(float(rank + 1))
            dist.all_reduce(x)

        if "all_reduce" in ops:
            t = timed(ar, iters)
            if not torch.all(x == 3.0):
                bad.append(f"all_reduce {size}")
            results.append({"op": "all_reduce", "bytes": size, "us": t * 1e6,
                            "algbw_GBps": size / t / 1e9})
        if size <= args.max_other:
            half = n // 2
            out = torch.empty(n, device=dev)
            inp = torch.full((half,), float(rank + 1), device=dev)

            def ag():
                dist.all_gather_into_tensor(out, inp)

            t = timed(ag, iters) if "all_gather" in ops else None
            if t is not None and not (torch.all(out[:half] == 1.0) and torch.all(out[half:2 * half] == 2.0)):
                bad.append(f"all_gather {size}")
            if t is not None:
                results.append({"op": "all_gather", "bytes": size, "us": t * 1e6,
                                "algbw_GBps": size / t / 1e9})
            full = torch.arange(2 * half, device=dev, dtype=torch.float32)
            part = torch.empty(half, device=dev)

            def rs():
                dist.reduce_scatter_tensor(part, full)

            t = timed(rs, iters) if "reduce_scatter" in ops else None
            want = 2 * torch.arange(rank * half, (rank + 1) * half, device=dev,
                                    dtype=torch.float32)
            if t is not None:
                if not torch.equal(part, want):
                    bad.append(f"reduce_scatter {size}")
                results.append({"op": "reduce_scatter", "bytes": size, "us": t * 1e6,
                                "algbw_GBps": size / t / 1e9})
            buf = torch.empty(n, device=dev)
            src = torch.arange(n, device=dev, dtype=torch.float32)

            def sr():
                if rank == 0:
                    dist.send(src, 1)
                else:
                    buf.zero_()
                    dist.recv(buf, 0)

            if "send_recv" in ops:
                t = timed(sr, iters)
                if rank == 1 and not torch.equal(buf, src):
                    bad.append(f"send/recv {size}")
                results.append({"op": "send_recv", "bytes": size, "us": t * 1e6,
                                "algbw_GBps": size / t / 1e9})
    flag = torch.tensor([len(bad)], device=dev)
    dist.all_reduce(flag)
    dist.destroy_process_group()
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump({"net": args.net, "results": results, "bad": bad,
                       "bad_total": int(flag.item())}, f)
    if bad:
        print(f"rank {rank}: WRONG: {bad}", file=sys.stderr)
        sys.exit(1)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--net", choices=("tensorlane", "socket"), required=True)
    p.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")],
                   default=[4096, 65536, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20])
    p.add_argument("--max-other", type=int, default=64 << 20,
                   help="largest size for all_gather, reduce_scatter and send/recv")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--out", default="collectives.json")
    p.add_argument("--poll-mode", default="adaptive", choices=("adaptive", "busy", "event"),
                   help="the sidecars' [ipc] poll_mode (--net tensorlane)")
    p.add_argument("--tcp-integrity", default="mac", choices=("mac", "none"),
                   help="the sidecars' [security] tcp_integrity (--net tensorlane)")
    p.add_argument("--ops", type=lambda s: s.split(","),
                   default=["all_reduce", "all_gather", "reduce_scatter", "send_recv"],
                   help="which of all_reduce,all_gather,reduce_scatter,send_recv to run")
    p.add_argument("--deadline", type=float, default=0,
                   help="seconds: past it the ranks are taken as hung; what they, NCCL and "
                        "the sidecars were doing goes to --log-dir and the run fails")
    p.add_argument("--log-dir", default="",
                   help="keep NCCL's logs (and a hang's dumps) here")
    p.add_argument("--trace", action="store_true",
                   help="TENSORLANE_NCCL_TRACE=1: the plugin logs every request's steps")
    p.add_argument("--env", action="append", default=[],
                   help="K=V into both ranks' environment (e.g. NCCL_NET_GDR_LEVEL=SYS)")
    p.add_argument("--sidecar", action="append", default=[], metavar="TABLE.KEY=V",
                   help="a key of the sidecars' TOML (ipc, tcp or security table; V an integer "
                        "or a string), e.g. ipc.spin_us=200 or tcp.tag_threads=4")
    p.add_argument("--no-gdr", action="store_true",
                   help="TENSORLANE_NCCL_GDR=0: the plugin offers host memory only, so NCCL "
                        "stages GPU data through its host buffers")
    args = p.parse_args()
    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:
        print(f"skipped: PyTorch is not importable here ({e})", file=sys.stderr)
        return 77
    if not torch.cuda.is_available():
        print("skipped: no CUDA device (torch.cuda.is_available() is False)", file=sys.stderr)
        return 77
    if not dist.is_nccl_available():
        print("skipped: this PyTorch has no NCCL", file=sys.stderr)
        return 77
    if args.no_gdr:
        os.environ["TENSORLANE_NCCL_GDR"] = "0"
    for kv in args.env:
        k, _, v = kv.partition("=")
        os.environ[k] = v
    if args.trace:
        os.environ["TENSORLANE_NCCL_TRACE"] = "1"
        os.environ.setdefault("NCCL_DEBUG_SUBSYS", "INIT,NET,PROXY,P2P")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")
    os.environ.setdefault("NCCL_DEBUG", "INFO")
    os.environ.setdefault("NCCL_DEBUG_SUBSYS", "INIT,NET")
    # NCCL's log of each rank, read afterwards for the network it used.
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="tl-nccl-log-")
    os.makedirs(log_dir, exist_ok=True)
    os.environ["NCCL_DEBUG_FILE"] = os.path.join(log_dir, "nccl.%p.log")
    cluster = None
    sockets = ["", ""]
    if args.net == "tensorlane":
        from tensorlane.testing import LocalCluster

        tables: dict = {"ipc": {}, "tcp": {}, "security": {"tcp_integrity": args.tcp_integrity}}
        for kv in args.sidecar:
            key, _, value = kv.partition("=")
            table, _, name = key.partition(".")
            if table not in tables or not name or not value:
                p.error(f"--sidecar {kv}: TABLE.KEY=V with TABLE one of {sorted(tables)}")
            tables[table][name] = int(value) if value.lstrip("-").isdigit() else value
        cluster = LocalCluster(("node-a", "node-b"), poll_mode=args.poll_mode, **tables).start()
        sockets = [cluster.socket("node-a"), cluster.socket("node-b")]
    import torch.multiprocessing as mp

    hung = False
    try:
        ctx = mp.start_processes(rank_main, args=(args, free_port(), sockets, args.out),
                                 nprocs=2, join=False, start_method="spawn")
        start = time.monotonic()
        while not ctx.join(timeout=1):
            if args.deadline and time.monotonic() - start > args.deadline:
                hung = True
                dump_hang(log_dir, [p.pid for p in ctx.processes], cluster)
                for proc in ctx.processes:
                    proc.kill()
                break
    finally:
        if cluster is not None:
            cluster.stop()
    if hung:
        print(f"the ranks did not finish within {args.deadline} s; what they were doing is in "
              f"{log_dir}", file=sys.stderr)
        return 1
    want = "Using network tensorlane" if args.net == "tensorlane" else "Using network Socket"
    logs = [open(os.path.join(log_dir, n), errors="replace").read()
            for n in sorted(os.listdir(log_dir))]
    used = sum(1 for text in logs if want in text)
    if used < 2:
        print(f"NCCL did not say '{want}' in both ranks' logs ({used} of {len(logs)}): "
              f"{log_dir}", file=sys.stderr)
        return 1
    # What NCCL chose (channels, rings, the plugin's lines), for the record.
    keys = ("nChannels", "Channel 00", "NET/", "Using network", "comm 0x", "Init COMPLETE")
    shown = 0
    for text in logs[:1]:
        for line in text.splitlines():
            if any(k in line for k in keys) and shown < 60:
                print(line, file=sys.stderr)
                shown += 1
    print(f"both ranks: {want}", file=sys.stderr)
    if args.net == "tensorlane":
        print(f"the plugin's paths: {plugin_paths(logs)}", file=sys.stderr)
    with open(args.out) as f:
        doc = json.load(f)
    for r in doc["results"]:
        print(json.dumps({"net": args.net, **r}))
    return 0 if doc["bad_total"] == 0 else 1


def plugin_paths(logs: list) -> dict:
    """The plugin's per-comm counts at close (its INFO lines), summed over both ranks: how many
    sends went eagerly, into a CTS, after an RTS; how long sends waited for a CTS or a slot; how
    much the plugin copied on NCCL's proxy threads (docs/nccl.md, "The eager path"); and, from
    each rank's last running totals, how long the plugin's calls held its lock (NCCL's proxy
    thread's time in the plugin), over how many calls and seconds, how many copy parts the
    helper threads took, and how many of NCCL's host buffers were registered in place or
    shadowed (both ranks summed)."""
    sent = re.compile(r"send comm \d+ to \S+ closed: (\d+) sends eager, (\d+) into a CTS, "
                      r"(\d+) RTS, (\d+) CTS crossed by an eager send; (\d+) sends waited "
                      r"([\d.]+) ms in all; copied ([\d.]+) MiB in ([\d.]+) ms")
    got = re.compile(r"recv comm \d+ from \S+ closed: (\d+) eager messages \((\d+) kept for a "
                     r"later receive, (\d+) crossing a CTS, (\d+) copied into GPU memory\), "
                     r"(\d+) entries sent a CTS \(\d+ on an RTS\); copied ([\d.]+) MiB in "
                     r"([\d.]+) ms")
    send_keys = ("sends_eager", "sends_into_cts", "rts", "cts_crossed", "sends_waited",
                 "send_wait_ms", "send_copy_mib", "send_copy_ms")
    recv_keys = ("recv_eager", "recv_kept", "recv_crossing", "recv_gpu_copies", "recv_cts",
                 "recv_copy_mib", "recv_copy_ms")
    total = dict.fromkeys(send_keys + recv_keys, 0.0)
    closes = sum(text.count(" closed: ") for text in logs)
    matched = 0
    for text in logs:
        for pattern, keys in ((sent, send_keys), (got, recv_keys)):
            for m in pattern.finditer(text):
                matched += 1
                for k, v in zip(keys, m.groups()):
                    total[k] += float(v)
    # Each close line is followed by the process's running totals: the last one of each rank.
    proc = re.compile(r"process totals: the plugin's lock held ([\d.]+) ms in (\d+) calls over "
                      r"([\d.]+) s since init; copy helpers took (\d+) parts; host buffers "
                      r"registered in place (\d+), shadowed (\d+)")
    proc_keys = ("lock_held_ms", "lock_calls", "since_init_s", "helper_copy_parts",
                 "host_buffers_in_place", "host_buffers_shadowed")
    total.update(dict.fromkeys(proc_keys, 0.0))
    for text in logs:
        last = None
        for last in proc.finditer(text):
            pass
        if last is not None:
            for k, v in zip(proc_keys, last.groups()):
                total[k] += float(v)
    if matched < closes:
        print(f"warning: {closes - matched} of the plugin's close lines did not parse (has their "
              f"format changed?)", file=sys.stderr)
    # Where a big step's time goes: sends of 128 KiB and more from tl_write to their end, and
    # CTS'd receive entries of that size from their CTS until their bytes were in (means over
    # both ranks' comms, weighted by their counts).
    timed = ((re.compile(r"send comm \d+ to \S+ closed: .*?; (\d+) writes of 128 KiB and more "
                         r"took ([\d.]+) us on average"), "big_sends", "big_send_us"),
             (re.compile(r"recv comm \d+ from \S+ closed: .*?; (\d+) entries of 128 KiB and "
                         r"more landed ([\d.]+) us on average after their CTS"),
              "big_recvs", "big_recv_after_cts_us"))
    for pattern, count_key, mean_key in timed:
        n = weighted = 0.0
        for text in logs:
            for m in pattern.finditer(text):
                n += float(m.group(1))
                weighted += float(m.group(1)) * float(m.group(2))
        total[count_key] = n
        total[mean_key] = weighted / n if n else 0.0
    return {k: round(v, 3) for k, v in total.items()}


if __name__ == "__main__":
    sys.exit(main())
