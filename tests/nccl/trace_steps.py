#!/usr/bin/env python3
"""Per-message times from the NCCL plugin's trace files (TENSORLANE_NCCL_TRACE_FILE=PREFIX).

Each rank writes PREFIX.PID at exit: one line a step, "<wall-clock seconds.micros> <step>".
This joins the ranks' files: for each message, its isend (sender), the CTS that let it go (seen at
the sender), the receive NCCL posted for it and its landing (receiver), and prints per message
size the medians and 90th percentiles of

  send->land   isend at the sender until the bytes were in at the receiver
  post->cts    the receive posted until its CTS reached the sender (the CTS's trip)
  cts-send     the CTS's arrival minus the isend (< 0: the CTS was there first)

Usage: tests/nccl/trace_steps.py PREFIX   (e.g. $OUT/tltrace, for $OUT/tltrace.1234 ...)
(docs/nccl.md, "Diagnosing a hang" and "What moves the 1 MiB all_reduce").
"""
import collections
import glob
import re
import statistics
import sys

ISEND = re.compile(r"comm S(\d+) isend slot \d+ size (\d+) tag (-?\d+) seq (\d+) (eagerly|into)")
CTS = re.compile(r"comm S(\d+) CTS from R(\d+) slot \d+ gen \d+ n \d+ \(\d+ stale\) size0 \d+ "
                 r"tag0 (-?\d+) seq0 (\d+)")
IRECV = re.compile(r"comm R(\d+) irecv slot (\d+) gen \d+ n \d+ size0 \d+ tag0 (-?\d+) seq0 (\d+)")
LANDED = re.compile(r"comm R(\d+) slot (\d+) entry \d+ landed (\d+) bytes")
EAGER_IN = re.compile(r"comm R(\d+) eager slot \d+ tag (-?\d+) seq (\d+) into slot (\d+)")


def load(prefix):
    events = []
    for path in glob.glob(prefix + ".*"):
        pid = path.rsplit(".", 1)[1]
        if not pid.isdigit():
            continue
        with open(path, errors="replace") as f:
            for line in f:
                t, _, step = line.rstrip("\n").partition(" ")
                try:
                    events.append((float(t) * 1e6, int(pid), step))
                except ValueError:
                    pass  # "# N more lines did not fit"
    events.sort()
    return events


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[-2], file=sys.stderr)
        return 2
    events = load(sys.argv[1])
    if not events:
        print(f"no trace lines in {sys.argv[1]}.*", file=sys.stderr)
        return 1
    isend, cts, posted, landed, pair = {}, {}, {}, {}, {}
    slot_msg = {}
    for t, pid, step in events:
        if m := ISEND.match(step):
            isend[(pid, int(m[1]), int(m[3]), int(m[4]))] = (t, int(m[2]), m[5] == "eagerly")
        elif m := CTS.match(step):
            cts[(pid, int(m[1]), int(m[3]), int(m[4]))] = t
            pair[(pid, int(m[1]))] = int(m[2])
        elif m := IRECV.match(step):
            key = (pid, int(m[1]), int(m[3]), int(m[4]))
            slot_msg[(pid, int(m[1]), int(m[2]))] = key
            posted[key] = t
        elif m := LANDED.match(step):
            key = slot_msg.get((pid, int(m[1]), int(m[2])))
            if key is not None and key not in landed:
                landed[key] = t
        elif m := EAGER_IN.match(step):
            key = slot_msg.get((pid, int(m[1]), int(m[4])))
            if key is not None and key not in landed:
                landed[key] = t
    # Landings by (comm R<r>, tag, seq): the receiving process's and its time.
    landings = collections.defaultdict(list)
    for (rpid, rr, rtag, rseq), t_land in landed.items():
        landings[(rr, rtag, rseq)].append((rpid, t_land))
    rows = collections.defaultdict(lambda: collections.defaultdict(list))
    for (pid, s, tag, seq), (t, size, eager) in isend.items():
        r = pair.get((pid, s))
        if r is None:
            continue
        # The receiver: the other process whose comm R<r> posted this (tag, seq).
        for rpid, t_land in landings.get((r, tag, seq), ()):
            if rpid != pid:
                row = rows[size]
                row["send->land"].append(t_land - t)
                c = cts.get((pid, s, tag, seq))
                if c is not None:
                    row["cts-send"].append(c - t)
                    p = posted.get((rpid, r, tag, seq))
                    if p is not None:
                        row["post->cts"].append(c - p)
                row["eager"].append(1 if eager else 0)
                break
    print(f"{len(events)} steps from {len({e[1] for e in events})} processes")
    for size in sorted(rows):
        row = rows[size]
        parts = [f"size {size:>9}: {len(row['send->land']):5d} messages, {sum(row['eager'])} eager"]
        for k in ("send->land", "post->cts", "cts-send"):
            v = sorted(row[k])
            if v:
                p90 = v[min(len(v) - 1, int(0.9 * len(v)))]
                parts.append(f"{k} {statistics.median(v):8.1f} / {p90:8.1f} us")
        print(";  ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
