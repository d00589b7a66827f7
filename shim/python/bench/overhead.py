#!/usr/bin/env python3
"""What the Python layer costs per call: the package against bare ctypes calls of the same C
ABI, in the same run, through one real sidecar (tensorlane.testing.LocalCluster).

    python3 shim/python/bench/overhead.py [--iterations 20000]

Rows: a no-op round trip (tl_nop + tl_wait), and a 4 KiB local write round trip (tl_write +
tl_wait at the writer, tl_wait_notification at the target, both clients in this process).
"bare" calls the CDLL functions with prepared ctypes arguments, the floor for any binding
without a compiled extension; "package" is ``client.nop().wait()`` and ``client.write(...)
.wait(); other.wait_notification()``. Prints p50 of each, their ratio and the difference.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))

import tensorlane  # noqa: E402
from tensorlane import _lib  # noqa: E402
from tensorlane.testing import LocalCluster  # noqa: E402


def p50(fn, n: int) -> float:
    for _ in range(min(1000, n // 10)):
        fn()
    samples = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        samples.append(time.perf_counter_ns() - t0)
    return statistics.median(samples) / 1e3


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iterations", type=int, default=20000)
    p.add_argument("--poll-mode", default="adaptive", choices=("busy", "adaptive", "event"))
    args = p.parse_args()
    build = os.environ.get("TENSORLANE_BUILD_DIR", os.path.join(ROOT, "build", "release"))
    os.environ.setdefault("TENSORLANE_LIBRARY", os.path.join(build, "shim", "libtensorlane.so"))
    os.environ.setdefault("TENSORLANE_SIDECAR", os.path.join(build, "sidecar",
                                                             "tensorlane-sidecar"))
    with LocalCluster(("node-a",), poll_mode=args.poll_mode, log_level="warn") as cl, \
            tensorlane.Client(cl.socket("node-a")) as a, \
            tensorlane.Client(cl.socket("node-a")) as b:
        lib = _lib.library()
        recv = b.alloc_host(4096)
        b.expose(recv, "bench")
        remote = a.lookup("node-a", "bench")
        src = a.alloc_host(4096)
        ha, hb = ctypes.c_void_p(a._h), ctypes.c_void_p(b._h)
        t = ctypes.c_uint64()
        note = _lib.NotificationStruct()
        tref, nref = ctypes.byref(t), ctypes.byref(note)

        def bare_nop():
            lib.tl_nop(ha, tref)
            lib.tl_wait(ha, t.value, -1)

        def pkg_nop():
            a.nop().wait()

        def bare_write():
            lib.tl_write(ha, src.handle, 0, remote.handle, 0, 4096, 7, tref)
            lib.tl_wait(ha, t.value, -1)
            lib.tl_wait_notification(hb, nref, -1)

        def pkg_write():
            a.write(src, remote, imm=7).wait()
            b.wait_notification()

        rows = []
        for what, bare, pkg in (("no-op round trip", bare_nop, pkg_nop),
                                ("4 KiB local write round trip", bare_write, pkg_write)):
            x, y = p50(bare, args.iterations), p50(pkg, args.iterations)
            rows.append((what, x, y))
        print(f"poll_mode={args.poll_mode}, {args.iterations} iterations, p50")
        print(f"{'':<30}{'bare ctypes':>13}{'package':>11}{'ratio':>8}{'extra':>10}")
        for what, x, y in rows:
            print(f"{what:<30}{x:>11.1f}us{y:>9.1f}us{y / x:>8.2f}{y - x:>8.1f}us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
