"""Payloads, messages, grouped writes and deadlines from Python, between two real sidecars."""

from __future__ import annotations

import numpy as np
import pytest

import tensorlane


def test_payloads_and_messages_arrive_inline_in_order(client_a, client_b):
    inbox = client_b.expose(client_b.alloc_host(1 << 16), "py-msg-inbox")
    remote = client_a.lookup("node-b", "py-msg-inbox", timeout=10)
    src = client_a.alloc_host(1 << 16)
    src.view()[:] = bytes(range(256)) * 256
    t1 = client_a.write_msg(src, remote, payload=b"request-17", imm=1, nbytes=4096)
    t2 = client_a.send_message(remote, payload=b"\x00\xff" * 128, imm=2, offset=9)
    t1.wait(10)
    t2.wait(10)
    m1 = client_b.wait_message(10)
    m2 = client_b.wait_message(10)
    assert (m1.imm, m1.kind, m1.payload, m1.bytes, m1.status) == (
        1, tensorlane.NOTIFY_WRITE, b"request-17", 4096, tensorlane.Status.OK)
    assert m1.region is inbox and m1.ok
    assert bytes(inbox.view()[:4096]) == bytes(src.view()[:4096])
    assert (m2.imm, m2.kind, m2.offset, m2.bytes) == (2, tensorlane.NOTIFY_MESSAGE, 9, 0)
    assert m2.payload == b"\x00\xff" * 128


def test_a_group_is_one_ticket_and_one_notification(client_a, client_b):
    blocks = client_b.expose(client_b.alloc_host(64 * 1024), "py-group-blocks")
    remote = client_a.lookup("node-b", "py-group-blocks", timeout=10)
    src = client_a.alloc_host_array(64 * 1024, dtype="uint8")
    src[:] = np.random.default_rng(3).integers(1, 256, src.size, dtype=np.uint8)
    # 64 entries of 1 KiB, reversed at the target.
    entries = [tensorlane.Write(src, remote, src_offset=i * 1024, dst_offset=(63 - i) * 1024,
                                nbytes=1024) for i in range(64)]
    t = client_a.write_group(entries, imm=5, payload=b"blocks 0..63")
    assert t.entry_status is None or t.done()
    t.wait(20)
    assert t.entry_status == [tensorlane.Status.OK] * 64
    m = client_b.wait_message(10)
    assert (m.kind, m.entries, m.imm, m.payload, m.status) == (
        tensorlane.NOTIFY_GROUP, 64, 5, b"blocks 0..63", tensorlane.Status.OK)
    got = np.frombuffer(blocks.view(), dtype=np.uint8).reshape(64, 1024)
    want = np.asarray(src).reshape(64, 1024)[::-1]
    assert np.array_equal(got, want)


def test_a_missed_deadline_raises_deadline_error_not_a_wait_timeout(make_cluster):
    c = make_cluster(("node-a",))
    with tensorlane.Client(c.socket("node-a")) as w, tensorlane.Client(c.socket("node-a")) as r:
        r.expose(r.alloc_host(128 << 20), "py-deadline")
        remote = w.lookup("node-a", "py-deadline")
        src = w.alloc_host(128 << 20)
        t = w.write_msg(src, remote, payload=b"late", timeout=0.001)
        with pytest.raises(tensorlane.DeadlineError) as e:
            t.wait(20)
        assert t.status == tensorlane.Status.EDEADLINE
        assert not isinstance(e.value, tensorlane.TimedOutError)
        m = r.wait_message(20)
        assert m.status == tensorlane.Status.EDEADLINE and not m.ok


def test_wrong_payloads_are_refused_before_submission(client_a, client_b):
    client_b.expose(client_b.alloc_host(4096), "py-msg-small")
    remote = client_a.lookup("node-b", "py-msg-small", timeout=10)
    with pytest.raises(tensorlane.InvalidArgumentError):
        client_a.send_message(remote, payload=bytes(257))
    with pytest.raises(tensorlane.InvalidArgumentError):
        client_a.write_group([])
    with pytest.raises(tensorlane.InvalidArgumentError):
        client_a.send_message(remote, timeout=0)
