"""CUDA tensors (registered by data_ptr()) and the stream-ordered calls.

These need a GPU, PyTorch with CUDA, and a libtensorlane whose C ABI accepts CUDA memory
(a CUDA build: docs/gpu.md). Each test skips, with the reason, when one of those is missing
(CI: no GPU; a library built without the CUDA toolkit: TL_ECUDA). A skip is never counted as a
pass. On the GPU machine they run with its PyTorch (scripts/device-run.sh).
"""

from __future__ import annotations

import pytest

import tensorlane

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="CUDA unavailable: torch.cuda.is_available() is False (Debian's torch is CPU-only;"
    " these run on the GPU machine with its PyTorch)")


def registered(client, tensor):
    """The tensor's Region. Keep it: a Region nobody holds is closed (deregistered) when it is
    collected, and then the tensor is no longer in a region of the client."""
    try:
        return client.register(tensor)
    except tensorlane.CudaError as e:
        if e.status == tensorlane.Status.ECUDA:
            pytest.skip(f"the C ABI refuses CUDA memory (TL_ECUDA): {e.detail}")
        raise


def needs_streams():
    if not tensorlane.Client.supports_streams():
        pytest.skip(f"{tensorlane.library_path()} does not export the stream-ordered calls "
                    "(tl_write_on_stream, tl_stream_wait_ticket, tl_stream_wait_notification)")


def test_a_slice_of_a_caching_allocator_block_registers_by_data_ptr(client_a):
    block = torch.empty(1 << 22, dtype=torch.uint8, device="cuda")
    t = block[4096:4096 + 65536]  # an offset inside the allocation
    r = registered(client_a, t)
    assert isinstance(r, tensorlane.DeviceRegion) and r.device == "cuda"
    assert (r.address, r.nbytes) == (t.data_ptr(), 65536)
    with pytest.raises(TypeError):
        memoryview(r)  # device memory is not a CPU buffer
    assert client_a.region_of(t[100:200]) is r


def test_cuda_to_cuda_across_nodes(client_a, client_b, name):
    recv = torch.zeros((256, 1024), dtype=torch.float32, device="cuda")
    client_b.expose(registered(client_b, recv), name)
    src = torch.randn((256, 1024), device="cuda")
    src_region = registered(client_a, src)  # noqa: F841 (held: see registered())
    torch.cuda.synchronize()
    remote = client_a.lookup("node-b", name, timeout=5)
    client_a.write(src, remote, imm=11).wait(30)
    note = client_b.wait_notification(30)
    assert note.imm == 11 and note.bytes == src.numel() * 4
    assert torch.equal(recv, src)


def test_cuda_and_host_memory_both_ways(client_a, client_b, name):
    host = client_b.alloc_host_tensor(4096, torch.float32)
    client_b.expose(host, name)
    dev = torch.arange(4096, dtype=torch.float32, device="cuda")
    dev_region = registered(client_a, dev)  # noqa: F841 (held: see registered())
    torch.cuda.synchronize()
    client_a.write(dev, client_a.lookup("node-b", name, timeout=5)).wait(30)
    client_b.wait_notification(30)
    assert torch.equal(host, dev.cpu())
    back = torch.zeros(4096, dtype=torch.float32, device="cuda")
    client_a.expose(registered(client_a, back), name + "-back")
    client_b.write(host, client_b.lookup("node-a", name + "-back", timeout=5)).wait(30)
    client_a.wait_notification(30)
    assert torch.equal(back.cpu(), host)


def test_stream_ordered_write_and_waits(client_a, client_b, name):
    needs_streams()
    recv = torch.zeros(1 << 20, dtype=torch.uint8, device="cuda")
    region = registered(client_b, recv)
    client_b.expose(region, name)
    src = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
    src_region = registered(client_a, src)  # noqa: F841 (held: see registered())
    remote = client_a.lookup("node-b", name, timeout=5)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        src.fill_(7)  # queued before the write on s: the write must see it
    ticket = client_a.write_on_stream(src, remote, imm=5, stream=s)
    client_a.stream_wait_ticket(ticket, stream=s)
    s.synchronize()
    ticket.wait(30)
    r = torch.cuda.Stream()
    client_b.stream_wait_notification(region, 5, stream=r)
    with torch.cuda.stream(r):
        total = recv.sum()  # runs only after the data has landed
    r.synchronize()
    assert total.item() == 7 * (1 << 20)


_EXPANDABLE = r"""
import os, sys, torch, tensorlane
a = tensorlane.Client(os.environ["TL_A"])
b = tensorlane.Client(os.environ["TL_B"])
# 64 MiB tensors: several of the allocator's VMM pieces (20 MiB on an H200) each.
src = torch.randn(16 << 20, device="cuda")
recv = torch.zeros(16 << 20, device="cuda")
held = [a.register(src), b.register(recv)]
b.expose(held[1], sys.argv[1])
torch.cuda.synchronize()
a.write(src, a.lookup("node-b", sys.argv[1], timeout=5), imm=5).wait(60)
note = b.wait_notification(60)
assert note.bytes == src.numel() * 4, note.bytes
assert torch.equal(src, recv), "the data differs"
print("expandable segments: ok")
"""


def test_expandable_segments_tensors_cross_nodes(cluster, name):
    """PyTorch's expandable segments allocate with cuMemCreate/cuMemMap: a 64 MiB tensor spans
    several VMM pieces, which the shim exports as fds (TL_ECUDA before VMM support). Run in a
    process of its own: the allocator setting is read when CUDA is first used."""
    import os
    import subprocess
    import sys
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
               TL_A=cluster.socket("node-a"), TL_B=cluster.socket("node-b"))
    out = subprocess.run([sys.executable, "-c", _EXPANDABLE, name], env=env, capture_output=True,
                         text=True, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "expandable segments: ok" in out.stdout
