#!/usr/bin/env python3
"""scripts/demo.sh as a new user meets it (the first-run items of issue 12).

    check_demo.py --demo scripts/demo.sh --build BUILD_DIR

- Bad arguments are refused at once, naming the argument and its value, before anything is
  installed, built or started (run without --no-install/--no-build to prove it), exit 2.
- A short run with the built binaries succeeds: the configuration summary says what the files
  mean (listen address, peer and address, transport, traffic class), and `tensorlane status`
  runs while the workers are connected (node-a shows their regions and requests, node-b up).
- It leaves nothing behind: its temporary directory is gone and none of its processes remain.
"""
import argparse
import glob
import os
import re
import subprocess
import sys
import time

from checks import check, failures


def demo_dirs():
    return set(glob.glob("/tmp/tensorlane-demo.*"))


def processes_mentioning(text):
    found = []
    for cmdline in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            with open(cmdline, "rb") as f:
                if text.encode() in f.read():
                    found.append(cmdline.split("/")[2])
        except OSError:
            pass
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--demo", required=True)
    ap.add_argument("--build", required=True)
    args = ap.parse_args()

    bad = [
        (["--bytes", "abc"], "--bytes 'abc'"),
        (["--bytes", "12"], "--bytes '12'"),
        (["--bytes", "64XB"], "--bytes '64XB'"),
        (["--iterations", "many"], "--iterations 'many'"),
        (["--iterations", "0"], "--iterations '0'"),
        (["--bytes"], "--bytes needs a value"),
        (["--frobnicate"], "unknown argument '--frobnicate'"),
    ]
    for argv, named in bad:
        before = demo_dirs()
        t0 = time.monotonic()
        r = subprocess.run([args.demo] + argv, capture_output=True, text=True, timeout=60)
        took = time.monotonic() - t0
        out = r.stdout + r.stderr
        check(r.returncode == 2 and named in r.stderr,
              f"demo {' '.join(argv)}: exit 2 naming {named!r} (exit {r.returncode}: {r.stderr.strip()!r})")
        check("install-deps" not in out and "== building" not in out and "sidecar" not in r.stdout
              and took < 10 and demo_dirs() == before,
              f"demo {' '.join(argv)}: refused before installing, building or starting anything ({took:.1f} s)")

    before = demo_dirs()
    r = subprocess.run([args.demo, "--no-install", "--no-build", "--build-dir", args.build,
                        "--bytes", "1MiB", "--iterations", "2"],
                       capture_output=True, text=True, timeout=240)
    out = r.stdout
    if not check(r.returncode == 0 and out.rstrip().endswith("stopping and cleaning up"),
                 f"a 1 MiB x 2 run ends with demo: ok (exit {r.returncode})"):
        print(out + r.stderr)
    check(re.search(r"^node-a: listens for peers on 127\.0\.0\.1:\d+; its workers connect to /tmp/tensorlane-demo\.\w+/node-a\.sock$",
                    out, re.M) is not None, "the summary says where node-a listens and where its workers connect")
    check(re.search(r"^\s+peer node-b at 127\.0\.0\.1:\d+ over tcp \(", out, re.M) is not None,
          "the summary says node-a's peer, its address and the transport, with the reason")
    check("traffic class 106 (DSCP 26 << 2 | ECN 2" in out, "the summary explains the traffic class")
    check("tensorlane-key-v1, mode 0600, from `tensorlane keygen`" in out, "the summary names the key's format and maker")
    status_at = out.find("== node-a while both workers are connected")
    means = [m.end() for m in re.finditer(r"^\[node-[ab]\] 2 x 1048576 bytes: mean", out, re.M)]
    check(status_at > 0 and len(means) == 2 and all(m < status_at for m in means),
          "status runs after both workers finished their exchanges")
    status = out[status_at:]
    check(re.search(r"^regions 2, registered bytes 3145728$", status, re.M) is not None,
          "status shows the connected worker's two regions (2 + 1 shards of 1 MiB)")
    check(re.search(r"^  session \d+ pid \d+ uid \d+: 2 regions, 2 requests, 0 rejected, 2097152 bytes written$",
                    status, re.M) is not None, "status lists the worker as a client with its regions and requests")
    check(re.search(r"^  node-b 127\.0\.0\.1:\d+ via tcp: up$", status, re.M) is not None, "status shows the peer up")

    work = re.search(r"(/tmp/tensorlane-demo\.\w+)/", out)
    check(work is not None and not os.path.exists(work.group(1)), "the demo's temporary directory is removed")
    check(demo_dirs() <= before, "no other tensorlane-demo directory is left")
    if work:
        time.sleep(0.2)
        left = processes_mentioning(work.group(1))
        check(not left, f"none of its processes remain ({left})")

    if failures:
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
