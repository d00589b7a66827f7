"""Data moves between two real sidecars (node-a, node-b) and arrives as written."""

from __future__ import annotations

import mmap
import os
import threading
import time

import numpy as np
import pytest

import tensorlane

torch = pytest.importorskip("torch")


def pattern(nbytes: int, seed: int) -> np.ndarray:
    """Bytes that are never zero, so a zeroed buffer never passes by accident."""
    rng = np.random.default_rng(seed)
    return rng.integers(1, 256, nbytes, dtype=np.uint8)


def test_connects_and_names_its_node(client_a, client_b):
    assert client_a.node_name == "node-a"
    assert client_b.node_name == "node-b"
    assert not client_a.closed
    assert "node-a" in repr(client_a)


def test_region_supports_the_buffer_protocol(client_a):
    r = client_a.alloc_host(4096)
    assert isinstance(r, tensorlane.HostRegion) and isinstance(r, tensorlane.Region)
    assert len(r) == r.nbytes == 4096 and r.device == "cpu"
    assert memoryview(r).nbytes == 4096 and memoryview(r).format == "<B"  # ctypes' format
    mv = r.view()
    assert (mv.nbytes, mv.readonly, mv.format) == (4096, False, "B")
    assert bytes(mv[:16]) == bytes(16) == bytes(memoryview(r)[:16])  # zeroed shared memory
    mv[0:4] = b"abcd"
    arr = np.frombuffer(r, dtype=np.uint32)
    assert arr.shape == (1024,) and arr[0] == int.from_bytes(b"abcd", "little")
    t = torch.frombuffer(r, dtype=torch.uint8)
    assert t.data_ptr() == r.address and t[:4].tolist() == list(b"abcd")
    # Zero-copy views, all of the same memory.
    t[4] = 7
    assert mv[4] == 7 and r.numpy()[4] == 7 and r.tensor()[4].item() == 7
    assert r.numpy(np.float32, (32, 32)).shape == (32, 32)
    assert r.tensor(torch.float64, (16, 32)).shape == (16, 32)
    with pytest.raises(tensorlane.InvalidArgumentError):
        r.numpy(np.float32, (64, 64))  # 16 KiB from a 4 KiB region


def test_numpy_arrays_cross_nodes(client_a, client_b, name):
    n = 1 << 20
    recv = client_b.alloc_host(n)
    client_b.expose(recv, name)
    src = client_a.alloc_host_array(n, np.uint8)
    src[:] = pattern(n, 1)
    remote = client_a.lookup("node-b", name, timeout=5)
    assert (remote.peer, remote.name, remote.nbytes) == ("node-b", name, n)
    ticket = client_a.write(src, remote, imm=0xDEADBEEF)
    ticket.wait(10)
    assert ticket.status == tensorlane.Status.OK and ticket.done()
    note = client_b.wait_notification(10)
    assert note.region is recv and note.region_id == recv.handle
    assert (note.imm, note.offset, note.bytes, note.peer) == (0xDEADBEEF, 0, n, "node-a")
    assert np.array_equal(np.frombuffer(recv, np.uint8), src)
    assert bytes(note.view()[:64]) == src[:64].tobytes()


def test_torch_cpu_tensors_cross_nodes_both_ways(client_a, client_b, name):
    shape = (128, 256)
    a = client_a.alloc_host_tensor(shape, torch.float32)
    b = client_b.alloc_host_tensor(shape, torch.float32)
    client_a.expose(a, name)
    client_b.expose(b, name)
    to_b = client_a.lookup("node-b", name, timeout=5)
    to_a = client_b.lookup("node-a", name, timeout=5)
    send_a = client_a.alloc_host_tensor(shape, torch.float32)
    send_b = client_b.alloc_host_tensor(shape, torch.float32)
    send_a.copy_(torch.randn(shape))
    send_b.copy_(torch.randn(shape))
    ta, tb = client_a.write(send_a, to_b, imm=1), client_b.write(send_b, to_a, imm=2)
    ta.wait(10)
    tb.wait(10)
    assert client_b.wait_notification(10).imm == 1
    assert client_a.wait_notification(10).imm == 2
    assert torch.equal(b, send_a) and torch.equal(a, send_b)


def test_local_node_through_its_own_name(client_a, cluster, name):
    with tensorlane.Client(cluster.socket("node-a")) as other:
        recv = other.alloc_host_tensor(1024, torch.int64)
        other.expose(recv, name)
        remote = client_a.lookup(client_a.node_name, name)
        src = client_a.alloc_host_tensor(1024, torch.int64)
        src.copy_(torch.arange(1024) * 3)
        client_a.write(src, remote, imm=5).wait(10)
        note = other.wait_notification(10)
        assert (note.peer, note.imm, note.bytes) == ("node-a", 5, 8192)
        assert torch.equal(recv, src)


def test_offsets_and_sizes(client_a, client_b, name):
    recv = client_b.alloc_host(4096)
    client_b.expose(recv, name)
    remote = client_a.lookup("node-b", name, timeout=5)
    src = client_a.alloc_host_array(1024, np.uint8)
    src[:] = pattern(1024, 2)
    client_a.write(src, remote, imm=9, src_offset=100, dst_offset=3000, nbytes=500).wait(10)
    note = client_b.wait_notification(10)
    assert (note.offset, note.bytes) == (3000, 500)
    got = np.frombuffer(recv, np.uint8)
    assert np.array_equal(got[3000:3500], src[100:600])
    assert not got[:3000].any() and not got[3500:].any()
    # nbytes=None: the rest of the source from src_offset.
    client_a.write(src, remote, src_offset=1000).wait(10)
    assert client_b.wait_notification(10).bytes == 24


def test_a_slice_of_a_tensor_writes_from_its_place_in_the_region(client_a, client_b, name):
    recv = client_b.alloc_host_tensor((4, 64), torch.int32)
    client_b.expose(recv, name)
    remote = client_a.lookup("node-b", name, timeout=5)
    src = client_a.alloc_host_tensor((4, 64), torch.int32)
    src.copy_(torch.arange(256, dtype=torch.int32).view(4, 64))
    row = src[2]  # a view 512 bytes into src's region
    assert client_a.region_of(row) is client_a.region_of(src)
    client_a.write(row, remote, dst_offset=row.element_size() * 64 * 2).wait(10)
    client_b.wait_notification(10)
    assert torch.equal(recv[2], src[2]) and not recv[0].any()


def test_register_a_range_and_expose_exactly_it(client_a, client_b, name):
    big = client_b.alloc_host_tensor((8, 1024), torch.uint8)
    part = big[3]  # a range inside the buffer: registered as a region of its own
    exposed = client_b.expose(part, name)
    assert exposed is not client_b.region_of(big)
    assert exposed.parent is client_b.region_of(big)
    assert (exposed.nbytes, exposed.offset) == (1024, 3 * 1024)
    remote = client_a.lookup("node-b", name, timeout=5)
    assert remote.nbytes == 1024
    src = client_a.alloc_host_array(1024, np.uint8)
    src[:] = pattern(1024, 3)
    client_a.write(src, remote, imm=77).wait(10)
    note = client_b.wait_notification(10)
    assert note.region is exposed and note.offset == 0
    assert np.array_equal(big[3].numpy(), src) and not big[2].any() and not big[4].any()
    # register() of memory in a region gives a HostRegion that is itself a buffer.
    r = client_b.register(big[5])
    assert isinstance(r, tensorlane.HostRegion) and memoryview(r).nbytes == 1024
    assert r.address == big[5].data_ptr()


def test_write_batch_keeps_its_order(client_a, client_b, name):
    recv = client_b.alloc_host(64 * 1024)
    client_b.expose(recv, name)
    remote = client_a.lookup("node-b", name, timeout=5)
    src = client_a.alloc_host_array(64 * 1024, np.uint8)
    src[:] = pattern(64 * 1024, 4)
    writes = [tensorlane.Write(src, remote, imm=i, src_offset=i * 1024, dst_offset=i * 1024,
                               nbytes=1024) for i in range(64)]
    writes[1] = (src, remote, 1, 1024, 1024, 1024)  # a tuple works too
    writes[2] = dict(src=src, remote=remote, imm=2, src_offset=2048, dst_offset=2048,
                     nbytes=1024)
    tickets = client_a.write_batch(writes)
    assert len(tickets) == 64
    for t in tickets:
        t.wait(10)
    imms = [client_b.wait_notification(10).imm for _ in range(64)]
    assert imms == list(range(64))
    assert np.array_equal(np.frombuffer(recv, np.uint8), src)
    assert client_a.write_batch([]) == []


def test_tickets_answer_done_and_wait_in_any_order(client_a):
    t = client_a.nop()
    deadline = time.monotonic() + 10
    while not t.done():
        assert time.monotonic() < deadline
    assert t.status == tensorlane.Status.OK
    t.wait()  # answered from the recorded status
    t.wait(0)
    t2 = client_a.nop()
    t2.wait(5)
    assert t2.done()


def test_lookup_waits_for_a_name_exposed_later(client_a, client_b, name):
    def expose_soon():
        time.sleep(0.3)
        r = client_b.alloc_host(128)
        client_b.expose(r, name)
        keep.append(r)

    keep: list = []
    th = threading.Thread(target=expose_soon)
    th.start()
    start = time.monotonic()
    remote = client_a.lookup("node-b", name, timeout=10)
    th.join()
    # (the sidecar reports the page-rounded size of a tl_alloc_host buffer)
    assert remote.nbytes >= 128 and 0.2 < time.monotonic() - start < 5


def test_sidecar_status_is_parsed_json(client_a):
    st = client_a.sidecar_status()
    assert st["node"] == "node-a" and isinstance(st["clients"], list)
    assert any(p.get("name") == "node-b" for p in st["peers"])


def test_dmabuf_region_is_checked_and_tcp_refuses_it(client_a, client_b, name):
    """register_dmabuf takes a dma-buf's range (a memfd stands in for one); the sidecar does not
    map it, so a write over tcp into it ends with CudaError and leaves it untouched."""
    fd = os.memfd_create("tl-dmabuf")
    os.ftruncate(fd, 65536)
    with pytest.raises(tensorlane.InvalidArgumentError, match="runs past the end"):
        client_a.register_dmabuf(fd, 61440, 8192)
    with pytest.raises(tensorlane.InvalidArgumentError):
        client_a.register_dmabuf(fd, 0, 0)
    r = client_a.register_dmabuf(fd, 4096, 8192)
    assert isinstance(r, tensorlane.DeviceRegion)
    assert (r.device, r.address, r.nbytes) == ("dmabuf", 0, 8192)
    client_a.expose(r, name)
    with mmap.mmap(fd, 65536) as view:
        os.close(fd)  # the sidecar holds its own reference
        remote = client_b.lookup("node-a", name, timeout=5)
        src = client_b.alloc_host_array(8192, np.uint8)
        src[:] = pattern(8192, 3)
        ticket = client_b.write(src, remote)
        with pytest.raises(tensorlane.CudaError, match="only the verbs transport"):
            ticket.wait(10)
        assert view[:] == bytes(65536)
    r.close()
