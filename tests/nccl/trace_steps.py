#!/usr/bin/env python3
"""Per-message times from the NCCL plugin's trace files (TENSORLANE_NCCL_TRACE_FILE=PREFIX).

Each rank writes PREFIX.PID at exit: one line a step, "<wall-clock seconds.micros> <step>".
This joins the ranks' files: for each message, its isend (sender), the CTS that let it go (seen at
the sender), the receive NCCL posted for it and its landing (receiver), and prints per message
size the medians and 90th percentiles of

  send->land   isend at the sender until the bytes were in at the receiver
  post->cts    the receive posted until its CTS reached the sender (the CTS's trip)
  cts-send     the CTS's arrival minus the isend (< 0: the CTS was there first)
  send->done   isend until NCCL's test() of the send said done (the sidecar's ACK came back)
  land->rdone  the landing until NCCL's test() of the receive said done (the copy out of a
               shadow buffer, and NCCL's next test())

With --timeline N: also the first N messages after the middle of the run, in isend order,
each step's time relative to the first isend listed (us).

Where the sidecars traced too (TENSORLANE_TRACE_FILE set to the same PREFIX: their files start
with "sidecar node NAME", the plugin's with "plugin node NAME"), each send of the plugin is
matched to its write in its node's sidecar (the next write posted there of the same size) and to
the target sidecar's steps of that write, and a second table splits send->land into stages
(medians / 90th percentiles, us):

  isend->post      the plugin's isend until the sidecar's tcp transport took the write (the
                   isend's line is written after the plugin posted it: may be < 0)
  post->queued     until its first chunk was queued on a connection
  queued->sent     until its last chunk was written into a socket
  sent->begun      the last chunk's send until the target began reading the write's last chunk
  begun->checked   until the write's last chunk was checked (tag) and landed
  checked->deliv   until the target sidecar delivered the write (notification, ACK queued)
  deliv->land      until the receiving rank's plugin saw it
  deliv->acked     until the writer's sidecar had the ACK
  acked->sdone     until NCCL's test() of the send said done

and a third the same stages (post->queued to deliv->acked) of every write with data the sidecars
traced, matched to no plugin send: eager sends too, whose comms no CTS pairs.

Then, per sidecar, where its threads' time went over the traffic (its first write posted to its
last ACK): its engine's turns of 20 us and more ("turn" steps: their share of the window, and
of it each phase's: slept, poll, drain = the rings' requests, transports, of which the tcp
transport's events = reading and writing sockets, tags, deliver..., queues, publish), the tag
workers' jobs (how many of each kind, how long each waited for a worker and ran) and the engine's
waits for a worker; and its writes by size with the number of chunks each was cut into.

Usage: tests/nccl/trace_steps.py [--timeline N] PREFIX   (e.g. $OUT/tltrace, for $OUT/tltrace.1234 ...)
(docs/nccl.md, "Diagnosing a hang" and "What moves the 1 MiB all_reduce").
"""
import collections
import glob
import re
import statistics
import sys

ISEND = re.compile(r"comm S(\d+) isend slot \d+ size (\d+) tag (-?\d+) seq (\d+) (eagerly|into)"
                   r".* ticket (\d+)")
SEND_DONE = re.compile(r"comm S(\d+) send done slot \d+ ticket (\d+)")
RECV_DONE = re.compile(r"comm R(\d+) recv done slot (\d+)")
WHO = re.compile(r"(sidecar|plugin) node (\S+)$")
SC_OUT = re.compile(r"out (\S+) seq (\d+) (post bytes (\d+)( message)?|chunk at \d+ len \d+|chunk sent|"
                    r"acked)")
SC_IN = re.compile(r"in (\S+) seq (\d+) (chunk begun|chunk checked|delivered)")
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


def summary(values):
    """'median / 90th percentile us' of `values`."""
    v = sorted(values)
    p90 = v[min(len(v) - 1, int(0.9 * len(v)))]
    return f"{statistics.median(v):8.1f} / {p90:8.1f} us"


def landing(landings, r, tag, seq, sender):
    """(receiving process, time) of message (tag, seq) into comm R<r>, or None: the other
    process than `sender` whose comm R<r> posted it."""
    for rpid, t_land in landings.get((r, tag, seq), ()) if r is not None else ():
        if rpid != sender:
            return rpid, t_land
    return None


def processes(events):
    """{pid: ("sidecar" or "plugin", node name)} of the files that say whose they are."""
    who = {}
    for _, pid, step in events:
        if m := WHO.match(step):
            who[pid] = (m[1], m[2])
    return who


def sidecar_stages(events, isend, send_done, pair, landings):
    """The second table: each plugin send through both sidecars (see the module's text)."""
    who = processes(events)
    if not any(w[0] == "sidecar" for w in who.values()):
        return
    # Per sidecar write (writer node, target node, seq): its steps' times.
    posts = collections.defaultdict(list)  # writer node -> [(t, target, seq, bytes)]
    out = collections.defaultdict(dict)    # (writer, target, seq) -> step -> time(s)
    for t, pid, step in events:
        role = who.get(pid)
        if role is None or role[0] != "sidecar":
            continue
        node = role[1]
        if m := SC_OUT.match(step):
            key = (node, m[1], int(m[2]))
            if m[4] is not None:
                if m[5] is None:
                    posts[node].append((t, m[1], int(m[2]), int(m[4])))
                out[key]["post"] = t
            elif m[3].startswith("chunk at"):
                out[key].setdefault("queued", t)
            elif m[3] == "chunk sent":
                out[key]["sent"] = t
            else:
                out[key]["acked"] = t
        elif m := SC_IN.match(step):
            key = (m[1], node, int(m[2]))
            name = {"chunk begun": "begun", "chunk checked": "checked", "delivered": "deliv"}[m[3]]
            if name == "deliv":
                out[key].setdefault(name, t)
            else:
                out[key][name] = t
    # Plugin sends (not eager) matched in time order to their node's posts of the same size.
    sends = sorted((t, key[0], key, size) for key, (t, size, eager) in isend.items()
                   if not eager and who.get(key[0], ("", ""))[0] == "plugin")
    cursor = collections.defaultdict(int)
    used = set()
    stages = collections.defaultdict(lambda: collections.defaultdict(list))
    for t, pid, key, size in sends:
        node = who[pid][1]
        plist = posts[node]
        i = cursor[node]
        # (The isend's line is written once its write was posted: the sidecar may take it first.)
        while i < len(plist) and plist[i][0] < t - 1000:
            i += 1
        j = i
        while j < len(plist) and (plist[j][3] != size or (node, plist[j][1], plist[j][2]) in used):
            j += 1
        if j == len(plist):
            continue
        if j == i:
            cursor[node] = i + 1
        else:
            cursor[node] = i
        w = (node, plist[j][1], plist[j][2])
        used.add(w)
        st = dict(out[w])
        st["isend"] = t
        _, s_, tag, seq = key
        if got := landing(landings, pair.get((pid, s_)), tag, seq, pid):
            st["land"] = got[1]
        if key in send_done:
            st["sdone"] = send_done[key]
        row = stages[size]
        for name, a, b in (("isend->post", "isend", "post"), ("post->queued", "post", "queued"),
                           ("queued->sent", "queued", "sent"), ("sent->begun", "sent", "begun"),
                           ("begun->checked", "begun", "checked"),
                           ("checked->deliv", "checked", "deliv"), ("deliv->land", "deliv", "land"),
                           ("deliv->acked", "deliv", "acked"), ("acked->sdone", "acked", "sdone")):
            if a in st and b in st:
                row[name].append(st[b] - st[a])
    for size in sorted(stages):
        row = stages[size]
        n = max((len(v) for v in row.values()), default=0)
        print(f"size {size:>9}: {n:5d} sends through the sidecars")
        for name, v in row.items():
            print(f"    {name:15} {summary(v)}")
    # Every write with data, from the sidecars' lines alone (eager sends too, which the table
    # above cannot match without their comms' CTS): its stages from post to ACK.
    sizes = {(node, target, seq): size for node, plist in posts.items()
             for _, target, seq, size in plist}
    writes = collections.defaultdict(lambda: collections.defaultdict(list))
    for w, size in sizes.items():
        st = out[w]
        for name, a, b in (("post->queued", "post", "queued"), ("queued->sent", "queued", "sent"),
                           ("sent->begun", "sent", "begun"), ("begun->checked", "begun", "checked"),
                           ("checked->deliv", "checked", "deliv"), ("deliv->acked", "deliv", "acked")):
            if a in st and b in st:
                writes[size][name].append(st[b] - st[a])
    for size in sorted(writes):
        row = writes[size]
        n = max(len(v) for v in row.values())
        print(f"size {size:>9}: {n:5d} sidecar writes (every one, eager sends' too)")
        for name, v in row.items():
            print(f"    {name:15} {summary(v)}")


TURN = re.compile(r"(turn|tcp) us (\d+)((?: \w+ \d+)*)$")
TAG_JOB = re.compile(r"tag (sign|send|verify) len (\d+) waited (-?\d+) ran (\d+)( read| write)?$")
TAG_WAIT = re.compile(r"tag wait us (\d+)")


def busy(events):
    """Per sidecar: its engine's long turns, its tag jobs and its waits (see the module's text)."""
    for pid, (kind, node) in sorted(processes(events).items()):
        if kind != "sidecar":
            continue
        mine = [(t, step) for t, p, step in events if p == pid]
        traffic = [t for t, step in mine
                   if (SC_OUT.match(step) and ("post" in step or "acked" in step))]
        if len(traffic) < 2:
            continue
        t0, t1 = min(traffic), max(traffic)
        window = max(t1 - t0, 1.0)
        phases = {"turn": collections.Counter(), "tcp": collections.Counter()}
        count = collections.Counter()
        jobs = collections.defaultdict(lambda: ([], []))
        waits = []
        posted = {}  # (peer, seq): "N bytes" or "message"
        cuts = collections.Counter()  # (peer, seq): chunks cut
        for t, step in mine:
            if m := SC_OUT.match(step):
                if m[4] is not None:
                    posted[(m[1], m[2])] = "message" if m[5] else int(m[4])
                elif m[3].startswith("chunk at"):
                    cuts[(m[1], m[2])] += 1
            if not t0 <= t <= t1:
                continue
            if m := TURN.match(step):
                count[m[1]] += 1
                phases[m[1]]["total"] += int(m[2])
                words = m[3].split()
                for name, us in zip(words[::2], words[1::2]):
                    phases[m[1]][name] += int(us)
            elif m := TAG_JOB.match(step):
                waited, ran = jobs[m[1] + (m[5] or "").replace(" ", "-")]
                waited.append(int(m[3]))
                ran.append(int(m[4]))
            elif m := TAG_WAIT.match(step):
                waits.append(int(m[1]))
        turn, tcp = phases["turn"], phases["tcp"]
        print(f"sidecar {node} ({pid}): {window:.0f} us of traffic; {count['turn']} engine turns "
              f"of 20 us or more, {100 * turn['total'] / window:.0f}% of it")

        def shares(c):
            return ", ".join(f"{k} {100 * v / window:.0f}%" for k, v in c.most_common()
                             if k != "total" and 100 * v / window >= 0.5)

        if count["turn"]:
            print(f"    turns: {shares(turn)}")
        if count["tcp"]:
            print(f"    tcp progress of 15 us or more ({count['tcp']}): {shares(tcp)}")
        for kind, (waited, ran) in sorted(jobs.items()):
            print(f"    tag {kind:<12} {len(ran):6d} jobs, waited {summary(waited)}, "
                  f"ran {summary(ran)}, {100 * sum(ran) / window:.0f}% of a worker")
        if waits:
            print(f"    the engine waited for a worker {len(waits)} times, "
                  f"{100 * sum(waits) / window:.1f}% of the window")
        # Its writes by size, and into how many chunks each was cut (messages: one chunk).
        sizes = collections.defaultdict(collections.Counter)
        for key, what in posted.items():
            if what != "message":
                sizes[what][cuts[key]] += 1
        messages = sum(1 for what in posted.values() if what == "message")
        parts = [f"{messages} messages"] + [
            f"{size} B x{sum(c.values())} (" +
            ", ".join(f"{n} in {k} chunk{'s' if k != 1 else ''}" for k, n in sorted(c.items())) +
            ")" for size, c in sorted(sizes.items())]
        print(f"    writes: {'; '.join(parts)}")


def main():
    args = sys.argv[1:]
    timeline = 0
    if len(args) == 3 and args[0] == "--timeline" and args[1].isdigit():
        timeline = int(args[1])
        args = args[2:]
    if len(args) != 1:
        print(__doc__.strip().splitlines()[-2], file=sys.stderr)
        return 2
    events = load(args[0])
    if not events:
        print(f"no trace lines in {args[0]}.*", file=sys.stderr)
        return 1
    isend, cts, posted, landed, pair = {}, {}, {}, {}, {}
    slot_msg = {}
    ticket_msg, send_done, recv_done = {}, {}, {}
    for t, pid, step in events:
        if m := ISEND.match(step):
            key = (pid, int(m[1]), int(m[3]), int(m[4]))
            isend[key] = (t, int(m[2]), m[5] == "eagerly")
            ticket_msg[(pid, int(m[1]), int(m[6]))] = key
        elif m := SEND_DONE.match(step):
            key = ticket_msg.get((pid, int(m[1]), int(m[2])))
            if key is not None and key not in send_done:
                send_done[key] = t
        elif m := RECV_DONE.match(step):
            key = slot_msg.get((pid, int(m[1]), int(m[2])))
            if key is not None and key not in recv_done:
                recv_done[key] = t
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
    lines = []  # (isend time, text) for --timeline
    for (pid, s, tag, seq), (t, size, eager) in isend.items():
        r = pair.get((pid, s))
        got = landing(landings, r, tag, seq, pid)
        if got is None:
            continue
        rpid, t_land = got
        row = rows[size]
        row["send->land"].append(t_land - t)
        c = cts.get((pid, s, tag, seq))
        p = posted.get((rpid, r, tag, seq))
        if c is not None:
            row["cts-send"].append(c - t)
            if p is not None:
                row["post->cts"].append(c - p)
        d = send_done.get((pid, s, tag, seq))
        if d is not None:
            row["send->done"].append(d - t)
        rd = recv_done.get((rpid, r, tag, seq))
        if rd is not None:
            row["land->rdone"].append(rd - t_land)
        row["eager"].append(1 if eager else 0)
        lines.append((t, pid, size, tag, seq, p, c, t_land, rd, d))
    print(f"{len(events)} steps from {len({e[1] for e in events})} processes")
    sidecar_stages(events, isend, send_done, pair, landings)
    busy(events)
    for size in sorted(rows):
        row = rows[size]
        parts = [f"size {size:>9}: {len(row['send->land']):5d} messages, {sum(row['eager'])} eager"]
        for k in ("send->land", "post->cts", "cts-send", "send->done", "land->rdone"):
            if row[k]:
                parts.append(f"{k} {summary(row[k])}")
        print(";  ".join(parts))
    if timeline > 0 and lines:
        lines.sort(key=lambda x: x[0])
        part = lines[len(lines) // 2:len(lines) // 2 + timeline]
        t0 = part[0][0]

        def rel(x):
            return f"{x - t0:9.1f}" if x is not None else f"{'-':>9}"

        print(f"{'sender':>8} {'bytes':>8} {'tag':>4} {'seq':>5} {'posted':>9} {'isend':>9} "
              f"{'cts':>9} {'landed':>9} {'rdone':>9} {'sdone':>9}")
        for t, pid, size, tag, seq, p, c, t_land, rd, d in part:
            print(f"{pid:>8} {size:>8} {tag:>4} {seq:>5} {rel(p)} {rel(t)} {rel(c)} "
                  f"{rel(t_land)} {rel(rd)} {rel(d)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
