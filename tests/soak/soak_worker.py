"""One soak worker (tests/soak/soak.py starts them; docs/RELIABILITY.md): a real client of
its node's sidecar through the tensorlane package that writes to the other workers and checks
what the others write to it.

Every write carries, in its first 32 bytes, a header (magic, writer, writer incarnation,
sequence, length, CRC-32 of the rest); the receiver checks the bytes in place when it is
notified. Both ends append one line per event to the worker's ledger file (tab-separated,
flushed at once so a kill -9 loses no line already written); soak.py reads every ledger and
checks the invariants.

Ledger lines (time is time.time()):
  B  t inc                                 a session started (the client connected, exposed)
  W  t inc seq kind target tinc slot bytes a write submitted (kind: s single, b batch entry,
                                           g group entry, m message, L big write, q a single
                                           write stream-ordered from GPU memory)
  E  t inc seq status latency_ms [landed]  that write ended (status: OK, TL_EPEER, ...; a group
                                           entry takes its ticket's failure, and "landed" when
                                           its own status was OK)
  R  t inc w winc seq result               a notification here (result: ok, superseded,
                                           corrupt, nodata, dup, groupfail:<status>)
  S  t inc w winc seq                      found intact in place by the sweep after the
                                           sidecar went away (crash recovery, see soak.py)
  X  t inc reason                          the session ended (econn: sidecar gone; exit)
  I  t inc                                 stopped writing (SIGUSR1)

Slots: the receiver's region holds one lane per writer (``slots`` slots of ``slot`` bytes) and
one area for big writes (``big`` bytes, one writer at a time: an flock). A writer reuses a slot
only once the receiver has handled the write that was there (the receiver publishes, per lane,
the highest sequence it handled in an mmap'ed ack file) or after ``ack_wait`` seconds (then a
later notification of the old write reads "superseded", counted by soak.py).

Stream-ordered writes (``--stream-share``, a CUDA build on a GPU machine): that share of the
single writes is copied into one GPU buffer on a CUDA stream, behind a kernel that keeps the
stream busy first, and written with ``write_on_stream`` on that stream. The
buffer still holds the previous such write's bytes while that copy waits, so a write that did
not wait for the work queued before it on the stream would land the older write's header and
the target would report it (nodata or corrupt).
"""

from __future__ import annotations

import argparse
import faulthandler
import fcntl
import math
import mmap
import os
import random
import signal
import struct
import sys
import threading
import time
import zlib
from typing import Any, Optional, TextIO

import tensorlane
from tensorlane import Status

MAGIC = 0x534F414B  # "SOAK"
HDR = struct.Struct("<IIIIQI4x")  # magic, writer, winc, seq, nbytes, crc (32 bytes)
MSG = struct.Struct("<IIII")  # message payload: magic, writer, winc, seq (+ filler, crc last)
GRP = struct.Struct("<IIIIII")  # group payload: magic, writer, winc, seq_base, n, first_slot
MAX_PAYLOAD = 256  # TL_MAX_PAYLOAD
ACK_HDR = 16  # ack file: u64 session incarnation, u64 reserved, then one u64 per lane


def imm_of(inc: int, seq: int) -> int:
    return ((inc & 0xFF) << 24) | (seq & 0xFFFFFF)



def _verdict(seen: set, key: tuple, ok: bool) -> str:
    """A notified write's result: ok or corrupt, dup when its key was seen before."""
    result = "dup" if key in seen else "ok" if ok else "corrupt"
    seen.add(key)
    return result

class Ledger:
    def __init__(self, path: str):
        self._f: TextIO = open(path, "a", encoding="utf-8", buffering=1)
        self._lock = threading.Lock()

    def line(self, *fields: Any) -> None:
        text = "\t".join(str(f) for f in fields) + "\n"
        with self._lock:
            self._f.write(text)


class Acks:
    """The mmap'ed ack file of one worker: its session incarnation and per-lane progress."""

    def __init__(self, path: str, lanes: int, create: bool):
        size = ACK_HDR + 8 * lanes
        if create:
            with open(path, "wb") as f:
                f.write(b"\0" * size)
        self._fd = os.open(path, os.O_RDWR)
        self._m = mmap.mmap(self._fd, size)
        self.lanes = lanes

    def incarnation(self) -> int:
        return int(struct.unpack_from("<Q", self._m, 0)[0])

    def set_incarnation(self, inc: int) -> None:
        struct.pack_into("<Q", self._m, 0, inc)

    def reset(self) -> None:
        self._m[ACK_HDR:] = b"\0" * (8 * self.lanes)

    def handled(self, lane: int) -> int:
        return int(struct.unpack_from("<Q", self._m, ACK_HDR + 8 * lane)[0])

    def mark(self, lane: int, winc: int, seq: int) -> None:
        v = (winc << 32) | seq
        if v > self.handled(lane):
            struct.pack_into("<Q", self._m, ACK_HDR + 8 * lane, v)


class Worker:
    def __init__(self, a: argparse.Namespace):
        self.a = a
        self.me = a.index
        self.workers = a.workers
        self.rng = random.Random(a.seed * 1000003 + a.index * 7919 + a.proc_inc)
        self.ledger = Ledger(os.path.join(a.dir, f"ledger-w{a.index}.log"))
        self.acks_path = os.path.join(a.dir, f"ack-w{a.index}")
        self.acks = Acks(self.acks_path, self.workers, create=not os.path.exists(self.acks_path))
        self.lane_bytes = a.slots * a.slot
        self.big_at = self.workers * self.lane_bytes
        self.region_bytes = self.big_at + a.big
        self.stop_writing = threading.Event()
        self.stop_all = threading.Event()
        self.stop_rx = threading.Event()
        self.others: dict[int, Acks] = {}
        self.node_of = [n for n in a.node_of.split(",")]
        self.session_inc = 0
        self.seq = 0
        self.slot_next: dict[int, int] = {}
        # (target, target inc, slot) -> the (winc, seq) that used it and whether it ended OK
        self.slot_last: dict[tuple[int, int, int], tuple[int, bool]] = {}
        self.remotes: dict[tuple[int, int], tensorlane.Remote] = {}
        self.did_big = False
        self.src: Any = None
        self.gsrc: Any = None  # --stream-share: the GPU buffer, its region, the stream
        self.gsrc_region: Any = None
        self.stream: Any = None
        self.lookup_after: dict[int, float] = {}

    # ---- receiving

    def check_slot(self, region: memoryview, off: int, nbytes: int) -> Optional[tuple]:
        """(writer, winc, seq, crc_ok) of the header at ``off``, None when there is none."""
        if nbytes < HDR.size or off + nbytes > len(region):
            return None
        magic, w, winc, seq, n, crc = HDR.unpack_from(region, off)
        if magic != MAGIC:
            return None
        ok = n == nbytes and zlib.crc32(region[off + HDR.size:off + nbytes]) == crc
        return (w, winc, seq, ok)

    def on_data(self, view: memoryview, seen: set, inc: int, off: int, nbytes: int,
                imm: int) -> None:
        lane = off // self.lane_bytes if off < self.big_at else -1
        got = self.check_slot(view, off, nbytes)
        nseq, ninc8 = imm & 0xFFFFFF, imm >> 24
        if got is None:
            self.ledger.line("R", time.time(), inc, lane, -1, nseq, "nodata")
            return
        w, winc, seq, ok = got
        if lane >= 0 and w != lane:
            self.ledger.line("R", time.time(), inc, lane, winc, nseq, "nodata")
            return
        if (winc & 0xFF) == ninc8 and (seq & 0xFFFFFF) == nseq:
            result = _verdict(seen, (w, winc, seq), ok)
            self.ledger.line("R", time.time(), inc, w, winc, seq, result)
            self.acks.mark(w, winc, seq)
        elif (winc & 0xFF) != ninc8 or seq > nseq:
            # Another write of the same writer is in the slot (a later session's, or a later
            # one of this session after the writer stopped waiting for the ack): the old one
            # was overwritten. Counted; it names the write the notice named.
            self.ledger.line("R", time.time(), inc, w, -1, nseq, "superseded")
        else:  # an older write of the same session still there: the notice came before data
            self.ledger.line("R", time.time(), inc, w, winc, nseq, "nodata")

    def on_group(self, view: memoryview, seen: set, inc: int, payload: bytes,
                 status: Status) -> None:
        if len(payload) < GRP.size:
            self.ledger.line("R", time.time(), inc, -1, -1, -1, "nodata")
            return
        magic, w, winc, base, n, first = GRP.unpack_from(payload, 0)
        if status != Status.OK:
            for i in range(n):
                self.ledger.line("R", time.time(), inc, w, winc, base + i,
                                 f"groupfail:{status.c_name}")
            return
        for i in range(n):
            slot = (first + i) % self.a.slots
            off = w * self.lane_bytes + slot * self.a.slot
            got = self.check_slot(view, off, self.a.slot)
            # Group entries have various sizes: the header says it; look it up by its n.
            hdr = HDR.unpack_from(view, off)
            if hdr[0] == MAGIC and hdr[4] <= self.a.slot:
                got = self.check_slot(view, off, hdr[4])
            seq = base + i
            if got is None:
                result = "nodata"
            else:
                gw, gwinc, gseq, ok = got
                if (gw, gwinc, gseq) == (w, winc, seq):
                    result = "ok" if ok else "corrupt"
                elif gw == w and (gwinc, gseq) > (winc, seq):
                    result = "superseded"
                else:
                    result = "nodata"
            key = (w, winc, seq)
            if result == "ok" and key in seen:
                result = "dup"
            seen.add(key)
            self.ledger.line("R", time.time(), inc, w, winc, seq, result)
        self.acks.mark(w, winc, base + n - 1)

    def on_message(self, seen: set, inc: int, payload: bytes) -> None:
        if len(payload) < MSG.size + 4:
            self.ledger.line("R", time.time(), inc, -1, -1, -1, "nodata")
            return
        magic, w, winc, seq = MSG.unpack_from(payload, 0)
        crc = struct.unpack_from("<I", payload, len(payload) - 4)[0]
        ok = magic == MAGIC and zlib.crc32(payload[:-4]) == crc
        result = _verdict(seen, (w, winc, seq), ok)
        self.ledger.line("R", time.time(), inc, w, winc, seq, result)
        self.acks.mark(w, winc, seq)

    def receive(self, client: tensorlane.Client, region: tensorlane.HostRegion, inc: int,
                gone: threading.Event) -> None:
        view = region.view()
        seen: set = set()
        while not self.stop_all.is_set() and not self.stop_rx.is_set():
            try:
                m = client.wait_message(timeout=0.2)
            except TimeoutError:
                continue
            except tensorlane.TensorlaneError as e:
                if e.status == Status.ECONN:
                    gone.set()
                    return
                if self.stop_all.is_set() or client.closed:
                    return
                time.sleep(0.05)
                continue
            if m.dropped:
                self.ledger.line("R", time.time(), inc, -1, -1, m.dropped, "dropped")
            if m.status != Status.OK and (m.kind != tensorlane.NOTIFY_GROUP or
                                          len(m.payload) < GRP.size):
                # The failure of a message, group or deadline told to the target (its writer's
                # sidecar died, the peer failed): nothing was promised to be in place.
                self.ledger.line("R", time.time(), inc, -1, -1, m.imm,
                                 f"failnote:{m.status.c_name}")
            elif m.kind == tensorlane.NOTIFY_MESSAGE:
                self.on_message(seen, inc, m.payload)
            elif m.kind == tensorlane.NOTIFY_GROUP:
                self.on_group(view, seen, inc, m.payload, m.status)
            else:
                self.on_data(view, seen, inc, m.offset, m.bytes, m.imm)

    def sweep(self, region: tensorlane.HostRegion, inc: int) -> None:
        """After the sidecar went away: every write found intact in place (the mapping stays
        ours until the client is closed)."""
        try:
            view = region.view()
        except tensorlane.TensorlaneError:
            return
        for w in range(self.workers):
            for s in range(self.a.slots):
                off = w * self.lane_bytes + s * self.a.slot
                hdr = HDR.unpack_from(view, off)
                if hdr[0] == MAGIC and hdr[4] <= self.a.slot:
                    got = self.check_slot(view, off, hdr[4])
                    if got is not None and got[3]:
                        self.ledger.line("S", time.time(), inc, got[0], got[1], got[2])
        hdr = HDR.unpack_from(view, self.big_at)
        if hdr[0] == MAGIC and hdr[4] <= self.a.big:
            got = self.check_slot(view, self.big_at, hdr[4])
            if got is not None and got[3]:
                self.ledger.line("S", time.time(), inc, got[0], got[1], got[2])

    # ---- writing

    def target_inc(self, r: int) -> int:
        acks = self.others.get(r)
        if acks is None:
            path = os.path.join(self.a.dir, f"ack-w{r}")
            if not os.path.exists(path) or os.path.getsize(path) < ACK_HDR + 8 * self.workers:
                return 0
            acks = Acks(path, self.workers, create=False)
            self.others[r] = acks
        return acks.incarnation()

    def remote(self, client: tensorlane.Client, r: int, tinc: int) -> Optional[tensorlane.Remote]:
        rem = self.remotes.get((r, tinc))
        if rem is None:
            if time.monotonic() < self.lookup_after.get(r, 0.0):
                return None
            t0 = time.monotonic()
            try:
                rem = client.lookup(self.node_of[r], f"soak-w{r}-i{tinc}", timeout=0.5)
            except tensorlane.SidecarGoneError:
                raise
            except (tensorlane.TensorlaneError, TimeoutError) as e:
                print(f"lookup w{r}.{tinc} on {self.node_of[r]}: {e}", file=sys.stderr)
                self.lookup_after[r] = time.monotonic() + 1.0  # not again at once
                return None
            if time.monotonic() - t0 > 1:
                print(f"lookup w{r}.{tinc} on {self.node_of[r]}: "
                      f"{time.monotonic() - t0:.1f} s", file=sys.stderr)
            self.remotes = {k: v for k, v in self.remotes.items() if k[0] != r}
            self.remotes[(r, tinc)] = rem
        return rem

    def take_slot(self, r: int, tinc: int) -> int:
        """The next slot of our lane at r, once r has handled what was there."""
        s = self.slot_next.get(r, 0)
        self.slot_next[r] = (s + 1) % self.a.slots
        last = self.slot_last.get((r, tinc, s))
        if last is not None and last[1]:
            want = (self.session_inc << 32) | last[0]
            end = time.monotonic() + self.a.ack_wait
            acks = self.others[r]
            while acks.handled(self.me) < want and acks.incarnation() == tinc and \
                    time.monotonic() < end:
                time.sleep(0.002)
        return s

    def header(self, src: memoryview, pos: int, nbytes: int, seq: int) -> None:
        struct.pack_into("<I", src, pos, 0)  # not valid while the rest changes
        crc = zlib.crc32(src[pos + HDR.size:pos + nbytes])
        HDR.pack_into(src, pos, MAGIC, self.me, self.session_inc, seq, nbytes, crc)

    def size(self) -> int:
        # Log-uniform from the header's 32 bytes to a slot.
        return int(math.exp(self.rng.uniform(math.log(HDR.size), math.log(self.a.slot))))

    def end(self, seq: int, t0: float, st: str, note: Optional[str] = None) -> None:
        self.ledger.line("E", time.time(), self.session_inc, seq, st,
                         f"{(time.monotonic() - t0) * 1000:.3f}", *([note] if note else []))

    def wait_all(self, tickets: list, seqs: list, t0: float,
                 slots: list[tuple[int, int, int]]) -> None:
        """Waits for every ticket (each ends once: its E line), then raises SidecarGoneError
        if the sidecar went away meanwhile."""
        gone = False
        for t, seq, key in zip(tickets, seqs, slots):
            try:
                t.wait(timeout=self.a.wait_timeout)
                st = "OK"
            except TimeoutError:
                st = "HANG"
            except tensorlane.TensorlaneError as e:
                st = e.status.c_name
            self.end(seq, t0, st)
            if key[2] >= 0:
                self.slot_last[key] = (seq, st == "OK")
            gone = gone or st == "TL_ECONN"
        if gone:
            raise tensorlane.SidecarGoneError("sidecar gone", call="tl_wait")

    def one_op(self, client: tensorlane.Client, src: tensorlane.HostRegion) -> None:
        others = [r for r in range(self.workers) if r != self.me]
        r = self.rng.choice(others)
        tinc = self.target_inc(r)
        if tinc == 0:
            return
        rem = self.remote(client, r, tinc)
        if rem is None:
            return
        sv = src.view()
        x = self.rng.random()
        mix = self.a.mix
        if x < mix[0]:  # a message: no data, a payload
            self.seq += 1
            seq = self.seq
            filler = self.rng.randbytes(self.rng.randint(0, MAX_PAYLOAD - MSG.size - 4))
            body = MSG.pack(MAGIC, self.me, self.session_inc, seq) + filler
            payload = body + struct.pack("<I", zlib.crc32(body))
            self.ledger.line("W", time.time(), self.session_inc, seq, "m", r, tinc, -1, 0)
            t0 = time.monotonic()
            try:
                t = client.send_message(rem, payload, imm=imm_of(self.session_inc, seq))
            except tensorlane.SidecarGoneError:
                self.end(seq, t0, "TL_ECONN")
                raise
            except tensorlane.TensorlaneError as e:
                self.end(seq, t0, e.status.c_name)
                self.drop_remote(e, r)
                return
            self.wait_all([t], [seq], t0, [(r, tinc, -1)])
        elif x < mix[0] + mix[1]:  # one write, rarely a big one
            big = self.rng.random() < self.a.big_prob
            lock_fd = -1
            if big:
                lock_fd = os.open(os.path.join(self.a.dir, f"big-w{r}.lock"),
                                  os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    # A holder killed -9 leaves its pid here: its write may still be landing.
                    if os.pread(lock_fd, 16, 0).strip(b"\0 "):
                        time.sleep(2.0)
                    os.pwrite(lock_fd, str(os.getpid()).encode().ljust(16), 0)
                except OSError:
                    os.close(lock_fd)
                    lock_fd, big = -1, False
            try:
                self.single(client, sv, rem, r, tinc, big)
            finally:
                if lock_fd >= 0:
                    os.pwrite(lock_fd, b"\0" * 16, 0)
                    os.close(lock_fd)
        else:  # a batch or a group of 2-8 small writes into consecutive slots
            group = x >= mix[0] + mix[1] + mix[2]
            n = self.rng.randint(2, 8)
            first = self.slot_next.get(r, 0)
            slots = [self.take_slot(r, tinc) for _ in range(n)]
            seqs, writes = [], []
            for i, s in enumerate(slots):
                self.seq += 1
                nbytes = self.size()
                pos = self.a.big + i * self.a.slot
                self.header(sv, pos, nbytes, self.seq)
                seqs.append(self.seq)
                writes.append(tensorlane.Write(src, rem, imm_of(self.session_inc, self.seq),
                                               pos, self.me * self.lane_bytes + s * self.a.slot,
                                               nbytes))
                self.ledger.line("W", time.time(), self.session_inc, self.seq,
                                 "g" if group else "b", r, tinc, s, nbytes)
            t0 = time.monotonic()
            keys = [(r, tinc, s) for s in slots]
            try:
                if group:
                    payload = GRP.pack(MAGIC, self.me, self.session_inc, seqs[0], n, first)
                    gt = client.write_group(writes, imm=imm_of(self.session_inc, seqs[0]),
                                            payload=payload)
                    tickets: list = [gt]
                else:
                    tickets = client.write_batch(writes)
            except tensorlane.RingFullError as e:
                done = list(e.tickets)
                self.wait_all(done, seqs[:len(done)], t0, keys[:len(done)])
                for seq in seqs[len(done):]:
                    self.end(seq, t0, "TL_EAGAIN")
                return
            except tensorlane.SidecarGoneError:
                for seq in seqs:
                    self.end(seq, t0, "TL_ECONN")
                raise
            except tensorlane.TensorlaneError as e:
                for seq in seqs:
                    self.end(seq, t0, e.status.c_name)
                self.drop_remote(e, r)
                return
            if group:
                gt = tickets[0]
                try:
                    gt.wait(timeout=self.a.wait_timeout)
                    st = "OK"
                except TimeoutError:
                    st = "HANG"
                except tensorlane.TensorlaneError as e:
                    st = e.status.c_name
                statuses = gt.entry_status or []
                for i, seq in enumerate(seqs):
                    # The target is promised one notification, OK, only when the ticket is OK:
                    # a group whose ticket failed (its end record lost with the peer, say) is
                    # failed at both ends even where an entry of it landed ("landed" says so).
                    own = None if i >= len(statuses) else statuses[i]
                    if st != "OK" or own is None:
                        self.end(seq, t0, st, "landed" if own == Status.OK else None)
                    else:
                        self.end(seq, t0, "OK" if own == Status.OK else own.c_name)
                    self.slot_last[keys[i]] = (seq, st == "OK" and own == Status.OK)
                if st == "TL_ECONN":
                    raise tensorlane.SidecarGoneError("sidecar gone", call="tl_wait")
            else:
                self.wait_all(tickets, seqs, t0, keys)

    def single(self, client: tensorlane.Client, sv: memoryview, rem: tensorlane.Remote, r: int,
               tinc: int, big: bool) -> None:
        self.seq += 1
        seq = self.seq
        if big:
            nbytes = self.a.big if not self.did_big else int(math.exp(self.rng.uniform(
                math.log(1 << 20), math.log(self.a.big))))
            self.did_big = True
            pos, dst, slot, kind = 0, self.big_at, -2, "L"
        else:
            nbytes = self.size()
            slot = self.take_slot(r, tinc)
            pos, dst, kind = self.a.big, self.me * self.lane_bytes + slot * self.a.slot, "s"
            if self.gsrc is not None and self.rng.random() < self.a.stream_share:
                kind = "q"
        self.header(sv, pos, nbytes, seq)
        self.ledger.line("W", time.time(), self.session_inc, seq, kind, r, tinc, slot, nbytes)
        t0 = time.monotonic()
        try:
            if kind == "q":
                torch = self.torch
                with torch.cuda.stream(self.stream):
                    # The new bytes reach the GPU first (a copy from pageable memory returns
                    # when it is done), then wait behind a busy kernel before the stream copies
                    # them into the buffer the write reads: up to ~1 ms in which that buffer
                    # still holds the previous write's bytes.
                    self.gstage[:nbytes].copy_(self.hsrc[pos:pos + nbytes])
                    torch.cuda._sleep(self.rng.randint(0, 2_000_000))
                    self.gsrc[:nbytes].copy_(self.gstage[:nbytes], non_blocking=True)
                t = client.write_on_stream(self.gsrc, rem, imm=imm_of(self.session_inc, seq),
                                           dst_offset=dst, nbytes=nbytes, stream=self.stream)
            else:
                t = client.write(self.src, rem, imm=imm_of(self.session_inc, seq),
                                 src_offset=pos, dst_offset=dst, nbytes=nbytes)
        except tensorlane.SidecarGoneError:
            self.end(seq, t0, "TL_ECONN")
            raise
        except tensorlane.TensorlaneError as e:
            self.end(seq, t0, e.status.c_name)
            self.drop_remote(e, r)
            return
        self.wait_all([t], [seq], t0, [(r, tinc, slot)])
        if big:  # hold the big area until the receiver has checked it (or ack_wait passed)
            want = (self.session_inc << 32) | seq
            end = time.monotonic() + self.a.ack_wait
            acks = self.others[r]
            while acks.handled(self.me) < want and acks.incarnation() == tinc and \
                    time.monotonic() < end:
                time.sleep(0.005)

    def drop_remote(self, e: tensorlane.TensorlaneError, r: int) -> None:
        if e.status in (Status.ENOENT, Status.EINVAL, Status.EPEER):
            self.remotes = {k: v for k, v in self.remotes.items() if k[0] != r}

    # ---- sessions

    def session(self) -> str:
        """One connection to the sidecar, until it goes away ("econn") or we stop ("exit")."""
        self.session_inc += 1
        inc = self.session_inc
        client = tensorlane.Client(self.a.socket)
        gone = threading.Event()
        region = client.alloc_host(self.region_bytes)
        self.src = client.alloc_host(self.a.big + 8 * self.a.slot)
        self.src.view()[:] = os.urandom(len(self.src))
        self.gpu_session(client)
        self.did_big = False
        self.acks.set_incarnation(0)
        self.acks.reset()
        client.expose(region, f"soak-w{self.me}-i{inc}")
        self.acks.set_incarnation(inc)
        self.ledger.line("B", time.time(), inc)
        self.seq = 0
        self.slot_next.clear()
        self.slot_last.clear()
        self.remotes.clear()
        rx = threading.Thread(target=self.receive, args=(client, region, inc, gone), daemon=True)
        rx.start()
        reason = "exit"
        try:
            while not self.stop_writing.is_set() and not gone.is_set():
                try:
                    self.one_op(client, self.src)
                except tensorlane.SidecarGoneError:
                    gone.set()
                    break
                if self.a.pace > 0:
                    time.sleep(self.rng.uniform(0, self.a.pace / 1000.0))
            if not gone.is_set():
                self.ledger.line("I", time.time(), inc)
                while not self.stop_all.is_set() and not gone.is_set():
                    time.sleep(0.05)
        finally:
            if gone.is_set():
                reason = "econn"
                self.acks.set_incarnation(0)
                rx.join(timeout=2)
                self.sweep(region, inc)
            self.stop_rx.set()
            rx.join(timeout=2)
            self.stop_rx.clear()
            self.ledger.line("X", time.time(), inc, reason)
            self.acks.set_incarnation(0)
            try:
                client.close()
            except tensorlane.TensorlaneError:
                pass
        return reason

    def gpu_session(self, client: tensorlane.Client) -> None:
        """The GPU buffer of this session's stream-ordered writes (--stream-share)."""
        self.gsrc = None
        if self.a.stream_share <= 0:
            return
        import torch  # only on the GPU machine; the soak's other workers never import it
        if not torch.cuda.is_available() or not tensorlane.Client.supports_streams():
            raise SystemExit(f"worker {self.me}: --stream-share needs a GPU and a library with "
                             f"the stream-ordered calls (cuda: {torch.cuda.is_available()}, "
                             f"streams: {tensorlane.Client.supports_streams()})")
        self.torch = torch
        if self.stream is None:
            self.stream = torch.cuda.Stream()
        self.gsrc = torch.zeros(self.a.slot, dtype=torch.uint8, device="cuda")
        self.gstage = torch.zeros(self.a.slot, dtype=torch.uint8, device="cuda")
        self.gsrc_region = client.register(self.gsrc)
        self.hsrc = torch.frombuffer(self.src.view(), dtype=torch.uint8)

    def run(self) -> int:
        while True:
            try:
                reason = self.session()
            except (tensorlane.TensorlaneError, ConnectionError, OSError) as e:
                # The sidecar is not back yet (connect refused) or went away mid-setup.
                print(f"worker {self.me}: {e}", file=sys.stderr)
                reason = "econn"
                self.acks.set_incarnation(0)
            if reason == "exit" or self.stop_writing.is_set():
                return 0
            time.sleep(0.3)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--workers", type=int, required=True)
    p.add_argument("--node-of", required=True, help="comma-separated node name per worker")
    p.add_argument("--socket", required=True)
    p.add_argument("--dir", required=True)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--proc-inc", type=int, default=0, help="restart count (varies the rng)")
    p.add_argument("--slots", type=int, default=8)
    p.add_argument("--slot", type=int, default=256 << 10)
    p.add_argument("--big", type=int, default=64 << 20)
    p.add_argument("--big-prob", type=float, default=0.01)
    p.add_argument("--mix", default="0.2,0.45,0.2,0.15",
                   help="message,single,batch,group probabilities")
    p.add_argument("--pace", type=float, default=5.0, help="max ms to sleep between ops")
    p.add_argument("--ack-wait", type=float, default=3.0)
    p.add_argument("--wait-timeout", type=float, default=60.0)
    p.add_argument("--stream-share", type=float, default=0.0,
                   help="share of single writes stream-ordered from GPU memory (needs CUDA)")
    a = p.parse_args()
    a.mix = [float(x) for x in a.mix.split(",")]
    w = Worker(a)
    # The session incarnation continues across process restarts (the ledger keys on it).
    w.session_inc = a.proc_inc * 1000
    faulthandler.register(signal.SIGUSR2, all_threads=True)  # stacks to stderr, for hangs
    signal.signal(signal.SIGUSR1, lambda *_: w.stop_writing.set())

    def term(*_: Any) -> None:
        w.stop_writing.set()
        threading.Timer(a.drain, w.stop_all.set).start()

    a.drain = 2.0
    signal.signal(signal.SIGTERM, term)
    return w.run()


if __name__ == "__main__":
    sys.exit(main())
