"""Every failure maps to its exception, carrying the status and tl_last_error()'s text."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import tensorlane
from tensorlane import Status


def test_a_missing_socket_is_sidecar_gone(tmp_path):
    path = str(tmp_path / "nobody-here.sock")
    with pytest.raises(tensorlane.SidecarGoneError) as e:
        tensorlane.Client(path)
    err = e.value
    assert isinstance(err, ConnectionError) and isinstance(err, tensorlane.TensorlaneError)
    assert err.status == Status.ECONN and err.call == "tl_connect"
    assert path in err.detail and "TL_ECONN" in str(err) and err.detail in str(err)


def test_unknown_names_and_peers_are_not_found(client_a):
    with pytest.raises(tensorlane.NotFoundError) as e:
        client_a.lookup("node-b", "no-such-region")
    assert isinstance(e.value, LookupError) and e.value.status == Status.ENOENT
    assert "no-such-region" in e.value.detail
    start = time.monotonic()
    with pytest.raises(tensorlane.NotFoundError):
        client_a.lookup("node-b", "no-such-region", timeout=0.3)  # retried, then given up
    assert 0.25 < time.monotonic() - start < 3


def test_a_node_that_is_no_peer_fails_at_once_even_with_a_timeout(client_a):
    # Issue 24: it was NotFoundError, retried for the whole timeout. The static peer list is
    # fixed when the sidecar starts: waiting cannot help.
    start = time.monotonic()
    with pytest.raises(tensorlane.InvalidArgumentError) as e:
        client_a.lookup("node-zz", "x", timeout=30)
    assert time.monotonic() - start < 3
    assert e.value.status == Status.EINVAL
    assert "node-zz" in e.value.detail and "retrying cannot help" in e.value.detail


def test_a_lookup_that_waits_says_what_it_waits_for(client_a, caplog, monkeypatch):
    from tensorlane import _client

    monkeypatch.setattr(_client, "_LOOKUP_NOTE_S", 0.2)
    with caplog.at_level("WARNING", logger="tensorlane"):
        with pytest.raises(tensorlane.NotFoundError):
            client_a.lookup("node-b", "not-yet", timeout=0.7)
    notes = [r.getMessage() for r in caplog.records if r.name == "tensorlane"]
    assert len(notes) >= 2, notes
    assert "still waiting for 'not-yet' on node-b" in notes[0]
    assert "no region named 'not-yet'" in notes[0], notes[0]


def test_wrong_on_its_face_is_invalid_argument(client_a, client_b, name):
    recv = client_b.alloc_host(4096)
    client_b.expose(recv, name)
    remote = client_a.lookup("node-b", name, timeout=5)
    src = client_a.alloc_host(8192)
    # Out of the remote region's bounds: refused by tl_write itself.
    with pytest.raises(tensorlane.InvalidArgumentError) as e:
        client_a.write(src, remote, nbytes=8192)
    assert isinstance(e.value, ValueError) and e.value.call == "tl_write"
    assert "past the region's end" in e.value.detail
    with pytest.raises(tensorlane.InvalidArgumentError):
        client_a.write(src, remote, dst_offset=4000, nbytes=200)
    # Out of the source's bounds, a bad immediate, a closed source region.
    with pytest.raises(tensorlane.InvalidArgumentError):
        client_a.write(src, remote, src_offset=8000, nbytes=400)
    with pytest.raises(tensorlane.InvalidArgumentError):
        client_a.write(src, remote, imm=1 << 32, nbytes=8)
    closed = client_a.alloc_host(64)
    closed.close()
    with pytest.raises(tensorlane.InvalidArgumentError, match="closed"):
        client_a.write(closed, remote)
    # Bad names, and a name that is taken.
    with pytest.raises(tensorlane.InvalidArgumentError) as e:
        client_b.expose(client_b.alloc_host(64), "spaces are not allowed")
    assert e.value.call == "tl_expose"
    with pytest.raises(tensorlane.InvalidArgumentError):
        client_b.expose(client_b.alloc_host(64), name)
    # A remote of another client, a non-remote.
    with pytest.raises(tensorlane.InvalidArgumentError):
        client_b.write(client_b.alloc_host(64), remote)
    with pytest.raises(tensorlane.InvalidArgumentError):
        client_a.write(src, "node-b/" + name)


def test_memory_outside_tensorlane_is_refused_with_a_hint(client_a):
    plain = np.zeros(1024, np.uint8)
    with pytest.raises(tensorlane.InvalidArgumentError) as e:
        client_a.register(plain)
    assert e.value.call == "tl_register" and "tl_alloc_host" in e.value.detail
    assert "alloc_host_tensor" in str(e.value)
    with pytest.raises(tensorlane.InvalidArgumentError, match="not in a region"):
        client_a.region_of(plain)
    with pytest.raises(tensorlane.InvalidArgumentError, match="not C-contiguous"):
        client_a.register(client_a.alloc_host_array((8, 8), np.uint8)[:, 1])
    with pytest.raises(tensorlane.InvalidArgumentError, match="read-only"):
        client_a.register(b"bytes are read-only")
    with pytest.raises(tensorlane.InvalidArgumentError):
        client_a.alloc_host(0)


def test_waits_time_out_as_timeout_error(client_a):
    start = time.monotonic()
    with pytest.raises(TimeoutError) as e:
        client_a.wait_notification(timeout=0.2)
    took = time.monotonic() - start
    assert isinstance(e.value, tensorlane.TimedOutError) and e.value.status == Status.ETIMEDOUT
    assert "nothing arrived" in e.value.detail
    assert 0.19 < took < 1.0
    with pytest.raises(tensorlane.TimedOutError):
        client_a.wait_notification(timeout=0)
    with pytest.raises(ValueError):
        client_a.wait_notification(timeout=-1)


def test_a_pending_ticket_times_out_and_stays_waitable(make_cluster, name):
    cl = make_cluster()
    with tensorlane.Client(cl.socket("node-a")) as a, tensorlane.Client(cl.socket("node-b")) as b:
        recv = b.alloc_host(1 << 16)
        b.expose(recv, name)
        remote = a.lookup("node-b", name, timeout=5)
        a.write(a.alloc_host(64), remote, nbytes=64).wait(10)  # connected and working
        b.wait_notification(5)
        src = a.alloc_host_array(1 << 16, np.uint8)
        src[:] = 0x5A
        cl["node-b"].process.send_signal(signal.SIGSTOP)  # the target stops answering
        try:
            ticket = a.write(src, remote, imm=3)
            with pytest.raises(TimeoutError):
                ticket.wait(0.3)
            assert not ticket.done() and ticket.status is None
        finally:
            cl["node-b"].process.send_signal(signal.SIGCONT)
        ticket.wait(10)  # the same ticket completes once the node runs again
        assert b.wait_notification(10).imm == 3
        assert np.frombuffer(recv, np.uint8).min() == 0x5A


def test_too_many_outstanding_writes_is_ring_full(make_cluster, name):
    cl = make_cluster(ring_depth=64)
    with tensorlane.Client(cl.socket("node-a")) as a, tensorlane.Client(cl.socket("node-b")) as b:
        recv = b.alloc_host(4096)
        b.expose(recv, name)
        remote = a.lookup("node-b", name, timeout=5)
        src = a.alloc_host(4096)
        a.write(src, remote, nbytes=8).wait(10)
        cl["node-b"].process.send_signal(signal.SIGSTOP)
        try:
            tickets = [a.write(src, remote, imm=i, nbytes=8) for i in range(64)]
            with pytest.raises(tensorlane.RingFullError) as e:
                a.write(src, remote, nbytes=8)
            assert isinstance(e.value, BlockingIOError) and e.value.status == Status.EAGAIN
            with pytest.raises(tensorlane.RingFullError) as e:
                a.write_batch([(src, remote, 99, 0, 0, 8)] * 4)
            assert e.value.tickets == []  # nothing of the batch fit
        finally:
            cl["node-b"].process.send_signal(signal.SIGCONT)
        for t in tickets:
            t.wait(10)
        # Room again: a batch larger than what is left is submitted in part.
        cl["node-b"].process.send_signal(signal.SIGSTOP)
        try:
            first = [a.write(src, remote, nbytes=8) for _ in range(60)]
            with pytest.raises(tensorlane.RingFullError) as e:
                a.write_batch([(src, remote, 0, 0, 0, 8)] * 10)
            part = e.value.tickets
            assert len(part) == 4
        finally:
            cl["node-b"].process.send_signal(signal.SIGCONT)
        for t in first + part:
            t.wait(10)


def test_a_dead_peer_is_a_peer_error(make_cluster, name):
    cl = make_cluster()
    with tensorlane.Client(cl.socket("node-a")) as a, tensorlane.Client(cl.socket("node-b")) as b:
        recv = b.alloc_host(4096)
        b.expose(recv, name)
        remote = a.lookup("node-b", name, timeout=5)
        src = a.alloc_host(4096)
        a.write(src, remote).wait(10)
        cl["node-b"].kill()
        start = time.monotonic()
        with pytest.raises(tensorlane.PeerError) as e:
            # Refused at once once node-a knows, else the ticket fails.
            a.write(src, remote, imm=1).wait(10)
        assert isinstance(e.value, ConnectionError) and e.value.status == Status.EPEER
        assert time.monotonic() - start < 5
        with pytest.raises(tensorlane.PeerError) as e:
            a.lookup("node-b", name)
        assert "node-b" in e.value.detail


def test_a_region_its_owner_closed_is_not_found_at_the_writer(client_a, client_b, name):
    recv = client_b.alloc_host(4096)
    client_b.expose(recv, name)
    remote = client_a.lookup("node-b", name, timeout=5)
    src = client_a.alloc_host(4096)
    client_a.write(src, remote).wait(10)
    client_b.wait_notification(5)
    recv.close()
    # Whether the revocation has reached node-a yet or not (then node-b refuses the write),
    # the writer learns it from the ticket; the name is gone too.
    with pytest.raises(tensorlane.NotFoundError) as e:
        client_a.write(src, remote).wait(10)
    assert e.value.call == "tl_wait" and name in str(e.value)
    deadline = time.monotonic() + 5
    while True:  # node-a answers lookups from what node-b told it: the revocation comes soon
        try:
            client_a.lookup("node-b", name)
        except tensorlane.NotFoundError:
            break
        assert time.monotonic() < deadline, "the closed region is still looked up"
        time.sleep(0.01)


def test_a_killed_sidecar_is_sidecar_gone_for_waiters_and_later_calls(make_cluster):
    cl = make_cluster(("node-a",))
    c = tensorlane.Client(cl.socket("node-a"))
    r = c.alloc_host(4096)
    caught: list = []

    def waiter():
        start = time.monotonic()
        try:
            c.wait_notification()  # forever: only the sidecar's death ends it
        except BaseException as e:  # noqa: BLE001
            caught.append((e, time.monotonic() - start))

    th = threading.Thread(target=waiter)
    th.start()
    time.sleep(0.2)
    killed = time.monotonic()
    cl["node-a"].kill()
    th.join(5)
    assert not th.is_alive()
    err, _ = caught[0]
    assert isinstance(err, tensorlane.SidecarGoneError), err
    assert time.monotonic() - killed < 2
    for call in (lambda: c.alloc_host(64), lambda: c.nop().wait(1),
                 lambda: c.lookup("node-a", "x"), lambda: c.expose(r, "x")):
        with pytest.raises(tensorlane.SidecarGoneError):
            call()
    c.close()
    assert c.closed and r.closed


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as another uid")
def test_a_refused_uid_is_permission_denied(cluster, tmp_path):
    # The package must be readable by the other uid: copy it somewhere it is.
    pkg = os.path.dirname(tensorlane.__file__)
    dst = tmp_path / "pkg"
    shutil.copytree(pkg, dst / "tensorlane", symlinks=False)
    os.chmod(tmp_path, 0o755)
    for root, dirs, files in os.walk(dst):
        os.chmod(root, 0o755)
        for f in files:
            os.chmod(os.path.join(root, f), 0o644)
    lib = tensorlane.library_path()
    if not os.access(lib, os.R_OK) or not _readable_by_nobody(lib):
        libcopy = dst / "tensorlane" / "libtensorlane.so"
        shutil.copy(lib, libcopy)
        os.chmod(libcopy, 0o755)
        lib = str(libcopy)
    code = (
        "import os, tensorlane\n"
        "os.setgid(65534); os.setuid(65534)\n"
        "try:\n"
        f"    tensorlane.Client({cluster.socket('node-a')!r})\n"
        "except tensorlane.PermissionDeniedError as e:\n"
        "    assert isinstance(e, PermissionError) and e.status == tensorlane.Status.EPERM\n"
        "    print('refused:', e.detail)\n"
        "else:\n"
        "    raise SystemExit('connected as nobody')\n")
    env = {**os.environ, "PYTHONPATH": str(dst), "TENSORLANE_LIBRARY": lib}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60, cwd=str(tmp_path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "refused:" in out.stdout


def _readable_by_nobody(path: str) -> bool:
    path = os.path.realpath(path)
    while path != "/":
        st = os.stat(path)
        if not st.st_mode & (0o005 if os.path.isdir(path) else 0o004):
            return False
        path = os.path.dirname(path)
    return True


def test_a_quota_is_out_of_memory(make_cluster):
    # [limits] refusals are TL_ENOMEM. (Small on purpose: a tl_alloc_host larger than the
    # machine's memory reaches the kernel's OOM killer instead, see the report.)
    cl = make_cluster(("node-a",), limits={"registered_bytes": "1MiB", "regions": 4})
    with tensorlane.Client(cl.socket("node-a")) as c:
        with pytest.raises(tensorlane.OutOfMemoryError) as e:
            c.alloc_host(2 << 20)
        assert isinstance(e.value, MemoryError) and e.value.status == Status.ENOMEM
        assert "registered_bytes" in e.value.detail
        keep = [c.alloc_host(4096) for _ in range(4)]
        with pytest.raises(tensorlane.OutOfMemoryError, match="regions"):
            c.alloc_host(4096)
        keep.pop().close()
        keep.append(c.alloc_host(4096))  # room again once one is released


def test_stream_calls_absent_from_the_library_say_so(client_a, client_b, name):
    if tensorlane.Client.supports_streams():
        pytest.skip("this libtensorlane has the stream-ordered calls (tests/python/test_cuda.py)")
    recv = client_b.alloc_host(64)
    client_b.expose(recv, name)
    remote = client_a.lookup("node-b", name, timeout=5)
    src = client_a.alloc_host(64)
    with pytest.raises(NotImplementedError) as e:
        client_a.write_on_stream(src, remote, stream=0)
    assert isinstance(e.value, tensorlane.CudaError) and "tl_write_on_stream" in str(e.value)
    with pytest.raises(tensorlane.StreamUnsupportedError, match="tl_stream_wait_ticket"):
        client_a.stream_wait_ticket(client_a.nop(), stream=0)
    with pytest.raises(tensorlane.StreamUnsupportedError, match="tl_stream_wait_notification"):
        client_a.stream_wait_notification(recv, 1, stream=0)


def test_every_status_has_its_exception():
    from tensorlane._errors import error_for

    expected = {
        Status.EINVAL: (tensorlane.InvalidArgumentError, ValueError),
        Status.ENOENT: (tensorlane.NotFoundError, LookupError),
        Status.EPERM: (tensorlane.PermissionDeniedError, PermissionError),
        Status.ENOMEM: (tensorlane.OutOfMemoryError, MemoryError),
        Status.EAGAIN: (tensorlane.RingFullError, BlockingIOError),
        Status.ETIMEDOUT: (tensorlane.TimedOutError, TimeoutError),
        Status.EPEER: (tensorlane.PeerError, ConnectionError),
        Status.ECONN: (tensorlane.SidecarGoneError, ConnectionError),
        Status.ECUDA: (tensorlane.CudaError, RuntimeError),
        Status.EINTERNAL: (tensorlane.InternalError, RuntimeError),
    }
    lib = tensorlane._lib.library()
    for st, (cls, std) in expected.items():
        e = error_for(st, "tl_x", "detail text", "ctx")
        assert type(e) is cls and isinstance(e, std) and e.status == st
        assert str(e) == f"tl_x(ctx): {st.c_name}: detail text"
        assert lib.tl_status_str(int(st)).decode() == st.c_name  # the C ABI's own names
    assert isinstance(error_for(99, "tl_x", ""), tensorlane.InternalError)
