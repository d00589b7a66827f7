"""Context managers, garbage collection and forks release what they should, and only that."""

from __future__ import annotations

import gc
import os
import time
import weakref

import numpy as np
import pytest

import tensorlane

torch = pytest.importorskip("torch")


def regions_of(observer: tensorlane.Client) -> int:
    return observer.sidecar_status()["regions"]


def clients_of(observer: tensorlane.Client) -> int:
    return len(observer.sidecar_status()["clients"])


def eventually(cond, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_region_context_manager_deregisters_and_revokes(client_a, client_b, name):
    before = regions_of(client_b)
    with client_b.alloc_host(1 << 16) as r:
        client_b.expose(r, name)
        assert regions_of(client_b) == before + 1
        client_a.lookup("node-b", name, timeout=5)
    assert r.closed and regions_of(client_b) == before
    assert eventually(lambda: _gone(client_a, name))
    r.close()  # idempotent


def _gone(client, name) -> bool:
    try:
        client.lookup("node-b", name)
        return False
    except tensorlane.NotFoundError:
        return True


def test_client_context_manager_disconnects_and_releases_everything(cluster, client_a):
    before = clients_of(client_a)
    regions_before = regions_of(client_a)
    with tensorlane.Client(cluster.socket("node-a")) as c:
        r = c.alloc_host(4096)
        part = c.register(r.numpy()[100:200])  # noqa: F841 (a dropped range is released)
        assert clients_of(client_a) == before + 1
        assert regions_of(client_a) == regions_before + 2
    assert c.closed and r.closed
    assert eventually(lambda: clients_of(client_a) == before)
    assert regions_of(client_a) == regions_before
    with pytest.raises(tensorlane.ClientClosedError):
        c.alloc_host(64)
    with pytest.raises(tensorlane.ClientClosedError):
        c.nop()
    r.close()  # after the client: nothing to do, no error
    c.close()


def test_dropping_the_last_view_frees_host_memory(client_a):
    before = regions_of(client_a)
    t = client_a.alloc_host_tensor((256, 256), torch.float32)
    view = t[10:20]
    a = client_a.alloc_host_array(1000, np.int32)
    assert regions_of(client_a) == before + 2
    del t
    gc.collect()
    assert regions_of(client_a) == before + 2  # `view` still holds the tensor's region
    del view, a
    gc.collect()
    assert regions_of(client_a) == before


def test_a_range_keeps_its_buffer_and_closing_the_buffer_closes_the_range(client_a):
    before = regions_of(client_a)
    buf = client_a.alloc_host(8192)
    part = client_a.register(buf.numpy()[4096:])
    assert part.parent is buf and part.offset == 4096
    del buf
    gc.collect()
    assert regions_of(client_a) == before + 2  # the range keeps its buffer alive
    parent = part.parent
    parent.close()
    assert part.closed and regions_of(client_a) == before
    part.close()  # its buffer took it along: nothing left to do


def test_objects_keep_their_client_alive(cluster, client_a, client_b, name):
    before = clients_of(client_a)

    def make():
        c = tensorlane.Client(cluster.socket("node-a"))
        return weakref.ref(c), c.alloc_host_tensor(1024, torch.uint8)

    cref, t = make()  # only the tensor (through its Region) holds the Client now
    gc.collect()
    owner = cref()
    assert owner is not None and not owner.closed and clients_of(client_a) == before + 1
    recv = client_b.alloc_host(1024)
    client_b.expose(recv, name)
    remote = owner.lookup("node-b", name, timeout=5)
    t.fill_(9)
    owner.write(t, remote).wait(10)
    client_b.wait_notification(5)
    assert set(np.frombuffer(recv, np.uint8)) == {9}
    del owner, remote, t
    gc.collect()
    assert cref() is None  # the last object went: the client was collected and disconnected
    assert eventually(lambda: clients_of(client_a) == before)


def test_a_write_from_a_temporary_region_completes(client_a, client_b, name):
    recv = client_b.alloc_host(4096)
    client_b.expose(recv, name)
    remote = client_a.lookup("node-b", name, timeout=5)
    for i in range(20):
        t = client_a.write(client_a.alloc_host(4096), remote, imm=i)
        gc.collect()  # the temporary region has no other reference now
        t.wait(10)
        assert client_b.wait_notification(5).imm == i


def test_fire_and_forget_tickets_are_consumed_and_keep_their_source(client_a, client_b, name):
    recv = client_b.alloc_host(4096)
    client_b.expose(recv, name)
    remote = client_a.lookup("node-b", name, timeout=5)
    before = regions_of(client_a)
    for i in range(200):
        client_a.write(client_a.alloc_host(64), remote, imm=i, nbytes=64)  # never waited
    for i in range(200):
        assert client_b.wait_notification(10).imm == i
    client_a.nop().wait(5)
    # Dropped tickets were consumed by later writes, and their regions released with them.
    client_a.write(client_a.alloc_host(64), remote, nbytes=64).wait(10)
    assert len(client_a._abandoned) < tensorlane._client._REAP_BATCH
    assert eventually(lambda: regions_of(client_a) <= before + len(client_a._abandoned) + 1)


def test_close_with_live_regions_marks_them_closed(cluster):
    c = tensorlane.Client(cluster.socket("node-a"))
    r = c.alloc_host(64)
    t = c.alloc_host_tensor(16, torch.float32)
    c.close()
    assert r.closed and c.region_of is not None
    with pytest.raises(tensorlane.InvalidArgumentError):
        c.expose(r, "x")  # a closed region is refused before any C call
    del t


def test_a_forked_child_cannot_use_the_parents_client(client_a):
    r = client_a.alloc_host(64)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            client_a.nop()
        except tensorlane.ClientClosedError as e:
            code = 0 if "forked" in e.detail else 2
            client_a.close()  # sends nothing: the session is the parent's
            r.close()
        except BaseException:  # noqa: BLE001
            code = 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    # The parent's client and its region are untouched by the child's exit.
    client_a.nop().wait(5)
    assert not r.closed and memoryview(r).nbytes == 64


def test_an_exposed_range_stays_exposed_without_a_reference(client_a, client_b, name):
    big = client_b.alloc_host_tensor((4, 1024), torch.uint8)
    client_b.expose(big[1], name)  # the range's region is not kept by the caller
    gc.collect()
    remote = client_a.lookup("node-b", name, timeout=5)
    src = client_a.alloc_host_array(1024, np.uint8)
    src[:] = 3
    client_a.write(src, remote).wait(10)
    client_b.wait_notification(5)
    assert set(big[1].tolist()) == {3} and not big[0].any()
    client_b.region_of(big[1])  # (the buffer's region)
    exposed = [r for r in client_b._exposed if r.name == name]
    assert len(exposed) == 1
    exposed[0].close()  # withdrawn only when closed (the revocation reaches node-a soon after)
    assert eventually(lambda: _gone(client_a, name))
