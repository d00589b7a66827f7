"""Client, Region, Remote, Ticket, Notification: the C ABI as Python objects.

Lifetimes. Every object keeps its Client alive, so a Client is collected (and disconnected) only
after everything made from it. A Region keeps alive what it was registered over (a torch tensor
or numpy array), and a sub-range region keeps its buffer's region alive. Tensors and arrays made
by ``Region.tensor()``/``numpy()``, ``alloc_host_tensor()``/``alloc_host_array()`` keep their
Region alive, so host memory is released when the last view of it goes away; an exposed
region is published, so the client keeps it until it is closed. An explicit ``close()`` (or
leaving a ``with`` block) releases at once, as ``munmap`` would: views of a closed region must
not be touched again.

Threads. Any method may be called from any thread. Waits run in slices of WAIT_SLICE seconds
(the C call blocks with a timeout, ctypes releases the GIL around it), so other threads run
meanwhile and Ctrl-C interrupts a wait within a slice. ``Client.close()`` waits for calls in
progress to return (a wait notices within a slice) before it disconnects, since the C ABI
forbids tl_disconnect racing another call.

Forks. A Client belongs to the process that connected: in a forked child every call on an
inherited Client raises ClientClosedError and nothing is sent to the parent's sidecar session.
"""

from __future__ import annotations

import bisect
import builtins
import collections
import ctypes
import functools
import json
import logging
import math
import os
import sys
import threading
import time
import weakref
from ctypes import POINTER, byref, c_int, c_size_t, c_uint32, c_uint64, c_void_p
from typing import Any, Iterable, NamedTuple, Optional, Sequence, Union, cast

from . import _lib
from ._buffers import Span, span_of
from ._errors import (
    ClientClosedError,
    CudaError,
    InvalidArgumentError,
    RingFullError,
    Status,
    TensorlaneError,
    TimedOutError,
    error_for,
)

__all__ = [
    "Client",
    "Region",
    "HostRegion",
    "DeviceRegion",
    "Remote",
    "Ticket",
    "Notification",
    "Write",
    "StreamUnsupportedError",
    "WAIT_SLICE",
    "UID_PEER",
    "UID_UNKNOWN",
]

#: ``Notification.writer_uid`` of a write that came from a peer node (TL_UID_PEER).
UID_PEER = 0xFFFFFFFF
#: ``Notification.writer_uid`` the sidecar could not attribute (TL_UID_UNKNOWN; not expected).
UID_UNKNOWN = 0xFFFFFFFE

#: Longest single blocking C call of a wait, in seconds: how soon Ctrl-C and close() are seen.
WAIT_SLICE = 0.05

#: Writes consume dropped, unwaited tickets once this many have piled up.
_REAP_BATCH = 32
# Client.lookup(timeout=...) says every this many seconds what it still waits for.
_LOOKUP_NOTE_S = 5.0
_log = logging.getLogger("tensorlane")

_fork_generation = 0


def _after_fork_in_child() -> None:
    global _fork_generation
    _fork_generation += 1


os.register_at_fork(after_in_child=_after_fork_in_child)


class StreamUnsupportedError(CudaError, NotImplementedError):
    """The loaded libtensorlane has no stream-ordered calls (tl_write_on_stream and the
    others of DESIGN.md arrive with GPU support)."""


def _last_error(lib) -> str:
    raw = lib.tl_last_error()
    return raw.decode("utf-8", "replace") if raw else ""


def _timeout_ms(deadline: Optional[float]) -> int:
    """The next slice of a wait: at most WAIT_SLICE, at most what is left before deadline."""
    if deadline is None:
        return int(WAIT_SLICE * 1000)
    return int(math.ceil(min(WAIT_SLICE, max(0.0, deadline - time.monotonic())) * 1000))


def _deadline(timeout: Optional[float]) -> Optional[float]:
    if timeout is None:
        return None
    if timeout < 0:
        raise ValueError("timeout must be None (wait forever) or >= 0 seconds")
    return time.monotonic() + timeout


# ----------------------------------------------------------------------------------- regions


class Region:
    """A local region: memory this client registered with its sidecar.

    ``handle`` is the C ``tl_region``, ``address`` and ``nbytes`` the range, ``device``
    ``"cpu"``, ``"cuda"`` or ``"dmabuf"`` (``register_dmabuf``: address 0). Host regions (:class:`HostRegion`) support the buffer protocol;
    device regions (:class:`DeviceRegion`) do not (their memory is not addressable by the CPU).
    A Region is a context manager: leaving the block deregisters it.
    """

    __hash__ = object.__hash__  # (ctypes arrays are unhashable; regions hash by identity)

    handle: int
    address: int
    nbytes: int
    device: str
    device_index: int
    parent: Optional["Region"]
    name: Optional[str]
    _client: "Client"
    _keep: Any
    _closed: bool
    _children: "weakref.WeakSet[Region]"

    def _init(self, client: "Client", handle: int, span: Span, parent: Optional["Region"],
              keep: Any) -> None:
        self._client = client
        self.handle = handle
        self.address = span.address
        self.nbytes = span.nbytes
        self.device = span.device
        self.device_index = span.device_index
        self.parent = parent
        self._keep = keep  # what was registered (a tensor must not be freed under us)
        self._closed = False
        self._children = weakref.WeakSet()
        self.name = None
        if parent is not None:
            parent._children.add(self)

    @property
    def client(self) -> "Client":
        return self._client

    @property
    def closed(self) -> bool:
        return self._closed or self._client.closed

    @property
    def offset(self) -> int:
        """Offset of this range in its parent region (0 for a buffer of its own)."""
        return 0 if self.parent is None else self.address - self.parent.address

    def expose(self, name: str, peers: bool = True, uids: Iterable[int] = (),
               gids: Iterable[int] = (), any_local: bool = False) -> "Region":
        """``client.expose(self, name, ...)``: see ``Client.expose`` for who may write."""
        return self._client.expose(self, name, peers=peers, uids=uids, gids=gids,
                                   any_local=any_local)

    def close(self) -> None:
        """Deregisters the region (for a tl_alloc_host buffer: frees it, and every range
        registered inside it). Idempotent. Peers writing into it afterwards get NotFoundError."""
        if self._closed:
            return
        parent = self.parent
        if not self._client.closed and not (parent is not None and parent.closed):
            self._client._deregister(self)
        self._mark_closed()

    def _mark_closed(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._client._forget(self)
        for child in list(self._children):
            child._mark_closed()
        self._keep = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if not self._closed:
                self.close()
        except Exception:  # noqa: BLE001 - never raise from a finaliser (or at shutdown)
            pass

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"handle={self.handle}"
        name = f" name={self.name!r}" if self.name else ""
        kind = "HostRegion" if isinstance(self, HostRegion) else "DeviceRegion"
        return f"<tensorlane.{kind} {state} {self.device} {self.nbytes} bytes at " \
               f"{self.address:#x}{name}>"


class HostRegion(Region):
    """A region of host memory (from ``alloc_host``, or a range inside one). Supports the
    buffer protocol: ``memoryview(region)``, ``numpy.frombuffer(region, ...)`` and
    ``torch.frombuffer(region, ...)`` view it without a copy. ``len(region)`` is ``nbytes``.

    The buffer's format is ctypes' ``"<B"``, which numpy, torch and ``bytes()`` take but
    memoryview's item access and slice assignment do not: ``region.view()`` is the same
    memory as a plain ``"B"`` memoryview for those."""

    def view(self) -> memoryview:
        """The region as a writable memoryview of format ``"B"`` (no copy)."""
        return memoryview(cast(Any, self)).cast("B")

    def numpy(self, dtype: Any = "uint8", shape: Any = None, offset: int = 0):
        """A numpy array over the region (no copy), starting ``offset`` bytes in. ``shape``
        None: one dimension over the rest of the region."""
        import numpy as np

        dt = np.dtype(dtype)
        count = _count(self, dt.itemsize, shape, offset)
        arr = np.frombuffer(cast(Any, self), dtype=dt, count=count, offset=offset)
        return arr if shape is None else arr.reshape(shape)

    def tensor(self, dtype: Any = None, shape: Any = None, offset: int = 0):
        """A torch CPU tensor over the region (no copy); dtype defaults to torch.uint8."""
        import torch

        dt = torch.uint8 if dtype is None else dtype
        itemsize = torch.empty((), dtype=dt).element_size()
        count = _count(self, itemsize, shape, offset)
        t = torch.frombuffer(cast(Any, self), dtype=dt, count=count, offset=offset)
        return t if shape is None else t.view(shape)

    def __len__(self) -> int:
        return self.nbytes


class DeviceRegion(Region):
    """A region of CUDA device memory (registered by ``data_ptr()``)."""


def _count(region: HostRegion, itemsize: int, shape: Any, offset: int) -> int:
    nbytes = region.nbytes
    if offset < 0 or offset > nbytes:
        raise InvalidArgumentError(f"offset {offset} is outside the region ({nbytes} bytes)")
    if shape is None:
        if (nbytes - offset) % itemsize:
            raise InvalidArgumentError(
                f"{nbytes - offset} bytes are not a whole number of {itemsize}-byte items")
        return (nbytes - offset) // itemsize
    if isinstance(shape, int):
        shape = (shape,)
    count = math.prod(shape)
    if count * itemsize > nbytes - offset:
        raise InvalidArgumentError(
            f"shape {tuple(shape)} needs {count * itemsize} bytes; the region has "
            f"{nbytes - offset} from offset {offset}")
    return count


@functools.lru_cache(maxsize=512)
def _host_region_type(nbytes: int) -> Any:
    # A ctypes array type of the region's size gives instances the buffer protocol (Python
    # 3.11 has no __buffer__ for plain classes); from_address() makes one over the mapping
    # without owning it. Types are cached by size; instances keep theirs alive.
    return type("HostRegion", (HostRegion, ctypes.c_ubyte * nbytes), {})


def _new_host_region(client: "Client", handle: int, span: Span, parent: Optional[Region],
                     keep: Any) -> HostRegion:
    r = _host_region_type(span.nbytes).from_address(span.address)
    r._init(client, handle, span, parent, keep)
    return r


def _new_device_region(client: "Client", handle: int, span: Span, keep: Any) -> DeviceRegion:
    r = DeviceRegion()
    r._init(client, handle, span, None, keep)
    return r


# --------------------------------------------------------------------- remotes and tickets


class Remote:
    """A region some process exposed on node ``peer`` under ``name`` (from ``lookup``):
    ``nbytes`` long, writable by this client."""

    __slots__ = ("_client", "handle", "peer", "name", "nbytes", "__weakref__")

    def __init__(self, client: "Client", handle: int, peer: str, name: str, nbytes: int):
        self._client = client
        self.handle = handle
        self.peer = peer
        self.name = name
        self.nbytes = nbytes

    @property
    def client(self) -> "Client":
        return self._client

    def __repr__(self) -> str:
        return (f"<tensorlane.Remote {self.peer}/{self.name} {self.nbytes} bytes "
                f"handle={self.handle}>")


class Ticket:
    """One submitted write (or no-op). ``wait()`` blocks until it ended and raises the error
    it ended with; ``done()`` asks without blocking. Once known, ``status`` keeps the outcome,
    so ``wait()`` after ``done()`` (or a second ``wait()``) answers from it. A Ticket dropped
    without being waited for is consumed later by the client (its error is then lost)."""

    __slots__ = ("_client", "id", "_what", "_status", "_detail", "_lock", "_src", "__weakref__")

    def __init__(self, client: "Client", ticket_id: int, what: Any, src: Any = None):
        self._client = client
        self.id = ticket_id
        self._what = what  # a str, or (remote, WriteDesc) formatted only when asked
        self._status: Optional[Status] = None
        self._detail = ""
        self._lock = threading.Lock()  # one C wait/test per ticket at a time (it consumes it)
        # The source region stays registered while the write is in flight: a deregistration
        # (a temporary region collected right after write() returned) could reach the sidecar
        # on its socket before the request on the ring, and fail the write with TL_EINVAL.
        self._src = src

    @property
    def status(self) -> Optional[Status]:
        """How it ended (Status.OK on success), None while that is not known yet."""
        return self._status

    @property
    def what(self) -> str:
        """What was submitted ("4096 bytes to node-b/kv+0 imm=7", "nop")."""
        if not isinstance(self._what, str):
            self._what = _what(*self._what)
        return self._what

    def done(self) -> bool:
        """True once the write has ended (successfully or not); never blocks."""
        if self._status is None and self._lock.acquire(blocking=False):
            try:
                if self._status is None:
                    self._client._test_ticket(self)
            finally:
                self._lock.release()
        return self._status is not None

    def wait(self, timeout: Optional[float] = None) -> None:
        """Waits until the data is in place at the target (returns None) or the write failed
        (raises its error: PeerError, NotFoundError, SidecarGoneError, ...). TimedOutError
        (a TimeoutError) when ``timeout`` seconds pass first; the ticket stays pending."""
        if self._status is None:
            deadline = _deadline(timeout)
            if deadline is None:
                self._lock.acquire()
            elif not self._lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
                raise TimedOutError(f"tl_wait({self.what}): TL_ETIMEDOUT: another thread is "
                                    "waiting for this ticket", call="tl_wait")
            try:
                if self._status is None:
                    self._client._wait_ticket(self, deadline)
            finally:
                self._lock.release()
        self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        if self._status is not None and self._status != Status.OK:
            raise error_for(self._status, "tl_wait", self._detail, self.what)

    def __del__(self) -> None:
        try:
            if self._status is None:
                self._client._abandon(self.id, self._src)
        except Exception:  # noqa: BLE001
            pass

    def __repr__(self) -> str:
        st = "pending" if self._status is None else self._status.c_name
        return f"<tensorlane.Ticket {self.id} {self.what} {st}>"


class Notification(NamedTuple):
    """Data arrived in one of this client's regions: ``bytes`` bytes at ``offset`` of
    ``region``, written by node ``peer`` with immediate ``imm``; ``writer_uid`` is the local
    writer's uid (``UID_PEER`` for a write from a peer node), ``dropped`` how many
    notifications the sidecar dropped for this client (its backlog full) before this one."""

    region: Optional[Region]  #: the Region object (None if this process has dropped it)
    region_id: int  #: the C tl_region
    imm: int
    offset: int
    bytes: int
    peer: str
    writer_uid: int = UID_UNKNOWN
    dropped: int = 0

    def view(self) -> memoryview:
        """The bytes that arrived, as a memoryview of the (host) region; no copy."""
        if not isinstance(self.region, HostRegion):
            raise InvalidArgumentError("the notification's region is not a live host region")
        return self.region.view()[self.offset:self.offset + self.bytes]


class Message(NamedTuple):
    """A notification with all it carries (``wait_message``): the Notification's fields, and
    ``kind`` (``NOTIFY_WRITE``, ``NOTIFY_MESSAGE``: a payload alone, ``NOTIFY_GROUP``: a
    grouped write ended), ``status`` (Status.OK, or why the group or deadline failed:
    Status.EDEADLINE, Status.EPEER, ...), ``entries`` (a group's count) and ``payload``."""

    region: Optional[Region]
    region_id: int
    imm: int
    offset: int
    bytes: int
    peer: str
    writer_uid: int
    dropped: int
    kind: int
    status: Status
    entries: int
    payload: builtins.bytes

    @property
    def ok(self) -> bool:
        return self.status == Status.OK


NOTIFY_WRITE = 0
NOTIFY_MESSAGE = 1
NOTIFY_GROUP = 2


class GroupTicket(Ticket):
    """The ticket of ``write_group``: once it has ended, ``entry_status`` holds each entry's
    Status (the ticket's own error is the first failure)."""

    __slots__ = ("_statuses",)
    _statuses: Any

    @property
    def entry_status(self) -> Optional[list]:
        """Each entry's Status once the ticket has ended; None before."""
        if self._status is None:
            return None
        return [_status(s) for s in self._statuses]


class Write(NamedTuple):
    """One entry of ``Client.write_batch`` (the arguments of ``Client.write``)."""

    src: Any
    remote: Remote
    imm: int = 0
    src_offset: int = 0
    dst_offset: int = 0
    nbytes: Optional[int] = None


# -------------------------------------------------------------------------------- the client


class Client:
    """One connection to this node's sidecar.

    ``socket`` None: ``$TENSORLANE_SOCKET``, else ``/run/tensorlane/sidecar.sock`` (the C
    ABI's rule). A context manager: leaving the block closes it, which releases every region
    it registered (views of them must not be used afterwards).
    """

    def __init__(self, socket: Optional[Union[str, os.PathLike]] = None) -> None:
        self._h: Optional[int] = None
        self._lib = _lib.library()
        self._cv = threading.RLock()  # region bookkeeping; never held across a C call
        self._calls: list[int] = []  # a thread id per C call in progress (see _enter)
        self._closing = False
        self._close_deferred = False
        self._generation = _fork_generation
        self._regions: "weakref.WeakValueDictionary[int, Region]" = weakref.WeakValueDictionary()
        self._host_starts: list[int] = []  # sorted addresses of tl_alloc_host buffers
        self._host_by_start: dict[int, "weakref.ref[HostRegion]"] = {}
        self._device_regions: "weakref.WeakSet[DeviceRegion]" = weakref.WeakSet()
        self._exposed: set[Region] = set()  # exposed regions stay alive until closed
        # (ticket, its source region) of dropped, unwaited tickets; appended from __del__.
        self._abandoned: collections.deque[tuple[int, Any]] = collections.deque()
        path = os.fspath(socket) if socket is not None else None
        h = c_void_p()
        st = self._lib.tl_connect(path.encode() if path else None, byref(h))
        if st != Status.OK:
            raise error_for(st, "tl_connect", _last_error(self._lib), path or "")
        self._h = h.value
        self.socket = path or os.environ.get("TENSORLANE_SOCKET") or "/run/tensorlane/sidecar.sock"
        self.node_name: str = (self._lib.tl_node_name(self._h) or b"").decode()

    # ---- call guard: tl_disconnect must not race any other call (tensorlane.h)
    #
    # Lock-free on the call path: list.append and list.remove are atomic under the GIL, and
    # each thread appends before it reads _closing while close() sets _closing before it waits
    # for the others' entries to go, so any call that saw the client open is waited for (and a
    # call that starts after close() began sees _closing and backs out).

    def _enter(self) -> None:
        me = threading.get_ident()
        self._calls.append(me)
        if self._closing or self._h is None or self._generation != _fork_generation:
            self._calls.remove(me)
            if self._generation != _fork_generation:
                raise ClientClosedError(
                    "this Client was connected by the parent process; a forked child must "
                    "create its own", detail="forked")
            raise ClientClosedError("the client is closed", detail="closed")

    def _leave(self) -> None:
        self._calls.remove(threading.get_ident())
        if self._close_deferred and not self._calls:
            self._finish_close()

    def _fail(self, st: int, call: str, context: str = "") -> TensorlaneError:
        return error_for(st, call, _last_error(self._lib), context)

    @property
    def closed(self) -> bool:
        return self._h is None or self._closing

    def close(self) -> None:
        """Disconnects; the sidecar releases everything this client held. Idempotent. Waits
        for calls in progress on other threads (a wait returns within WAIT_SLICE). Called
        from inside a call of this thread (a signal handler), it refuses new calls at once
        and disconnects when that call returns."""
        with self._cv:
            if self._h is None or self._closing:
                return
            self._closing = True
        me = threading.get_ident()
        while any(t != me for t in list(self._calls)):
            if sys.is_finalizing():
                # Interpreter shutdown with a (daemon) thread frozen inside a call: it never
                # returns, so never wait for it; the process's exit closes the socket, and the
                # sidecar releases everything when it sees that.
                return
            time.sleep(0.001)
        if me in self._calls:
            self._close_deferred = True
            if self._calls:  # (re-checked: the interrupted call may have left meanwhile)
                return
        self._finish_close()

    def _finish_close(self) -> None:
        with self._cv:
            if self._h is None:
                return
            h, forked = self._h, self._generation != _fork_generation
            self._h = None  # a call evaluating self._h from now on passes NULL: TL_EINVAL
        for r in list(self._regions.values()):
            r._mark_closed()
        if not forked:
            self._lib.tl_disconnect(h)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass

    def __repr__(self) -> str:
        state = "closed" if self.closed else "connected"
        return f"<tensorlane.Client {state} node={self.node_name!r} socket={self.socket!r}>"

    # ---- regions

    def alloc_host(self, nbytes: int) -> HostRegion:
        """``nbytes`` of host memory shared with the sidecar, registered as a region."""
        if nbytes <= 0:
            raise InvalidArgumentError(f"alloc_host: nbytes must be > 0, not {nbytes}",
                                       call="tl_alloc_host")
        ptr, out = c_void_p(), c_uint64()
        self._enter()
        try:
            st = self._lib.tl_alloc_host(self._h, nbytes, byref(ptr), byref(out))
            if st != Status.OK:
                raise self._fail(st, "tl_alloc_host", str(nbytes))
        finally:
            self._leave()
        r = _new_host_region(self, out.value, Span(ptr.value or 0, nbytes, "cpu", -1), None, None)
        self._remember(r)
        return r

    def alloc_host_tensor(self, shape: Any, dtype: Any = None):
        """A torch CPU tensor (zeroed) over a fresh ``alloc_host`` region, which lives as long
        as the tensor (or its views) does. dtype defaults to torch.float32."""
        import torch

        dt = torch.float32 if dtype is None else dtype
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        itemsize = torch.empty((), dtype=dt).element_size()
        region = self.alloc_host(math.prod(shape) * itemsize)
        return region.tensor(dt, shape)

    def alloc_host_array(self, shape: Any, dtype: Any = "float32"):
        """A numpy array (zeroed) over a fresh ``alloc_host`` region, alive as long as it is."""
        import numpy as np

        dt = np.dtype(dtype)
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        region = self.alloc_host(math.prod(shape) * dt.itemsize)
        return region.numpy(dt, shape)

    def register(self, obj: Any) -> Region:
        """Registers the memory of ``obj`` as a region of its own and returns it.

        * a torch CPU tensor, numpy array or writable buffer must lie inside an ``alloc_host``
          region (``alloc_host_tensor``/``alloc_host_array`` make such tensors); the result is
          a HostRegion over exactly that range, inside the buffer's region;
        * a CUDA tensor (or ``__cuda_array_interface__`` object) is registered by its
          ``data_ptr()`` and byte size: a slice of a larger caching-allocator block is fine,
          the library finds the allocation (CudaError until the C ABI supports CUDA memory).

        The region keeps ``obj`` alive until it is closed.
        """
        if isinstance(obj, Region):
            raise InvalidArgumentError("already a region; register a tensor or array")
        span = span_of(obj)
        if span.nbytes == 0:
            raise InvalidArgumentError("register: the object has no bytes", call="tl_register")
        parent = self._host_region_at(span.address, span.nbytes) if span.device == "cpu" else None
        out = c_uint64()
        self._enter()
        try:
            st = self._lib.tl_register(self._h, c_void_p(span.address), span.nbytes, byref(out))
            if st != Status.OK:
                err = self._fail(st, "tl_register", f"{span.address:#x}, {span.nbytes}")
                if st == Status.EINVAL and span.device == "cpu":
                    err.args = (err.args[0] + " (allocate it with Client.alloc_host_tensor(), "
                                "alloc_host_array() or alloc_host())",)
                raise err
        finally:
            self._leave()
        if span.device == "cpu":
            r: Region = _new_host_region(self, out.value, span, parent, obj)
        else:
            r = _new_device_region(self, out.value, span, obj)
            self._device_regions.add(r)
        self._regions[r.handle] = r
        return r

    def register_dmabuf(self, fd: int, offset: int, nbytes: int) -> DeviceRegion:
        """Registers ``[offset, offset + nbytes)`` of the dma-buf ``fd`` (``tl_register_dmabuf``:
        what NCCL hands a net plugin's ``regMrDmaBuf``) and returns its region, of device
        ``"dmabuf"`` and address 0. The sidecar takes its own reference to ``fd`` (close yours
        when you like) and checks the range against the dma-buf's size. The sidecar does not map
        the memory: only the verbs transport reaches the region; local and tcp writes to or from
        it end with CudaError."""
        if nbytes <= 0 or offset < 0:
            raise InvalidArgumentError("register_dmabuf: nbytes must be > 0 and offset >= 0",
                                       call="tl_register_dmabuf")
        out = c_uint64()
        self._enter()
        try:
            st = self._lib.tl_register_dmabuf(self._h, int(fd), offset, nbytes, byref(out))
            if st != Status.OK:
                raise self._fail(st, "tl_register_dmabuf", f"fd {fd}, {offset}, {nbytes}")
        finally:
            self._leave()
        r = _new_device_region(self, out.value, Span(0, nbytes, "dmabuf", -1), None)
        self._regions[r.handle] = r
        return r

    def region_of(self, obj: Any) -> Region:
        """The region of this client that holds ``obj`` (a Region, tensor, array or buffer):
        for host memory the ``alloc_host`` buffer around it, for CUDA memory the smallest
        registered region around it. InvalidArgumentError if there is none."""
        region, _, _ = self._resolve(obj)
        return region

    def expose(self, target: Any, name: str, peers: bool = True, uids: Iterable[int] = (),
               gids: Iterable[int] = (), any_local: bool = False) -> Region:
        """Makes a region writable under ``name`` by the configured peers (``peers``, the
        default; False: the name is not offered to peers at all) and, on this node, by clients
        with this process's uid and root; also by the local ``uids``, by clients with one of
        ``gids`` (primary or supplementary), or by every local client (``any_local``). Other
        local writers get PermissionDeniedError from ``lookup``. Defaults: ``tl_expose``;
        otherwise ``tl_expose_access`` (at most 64 uids and 64 gids).
        ``target`` may be a Region, or a tensor/array in this client's memory: when it spans
        a whole region that region is exposed, otherwise its range is registered first (so is
        a CUDA tensor not registered yet). Returns the exposed Region."""
        uid_list = [int(u) for u in uids]
        gid_list = [int(g) for g in gids]
        for what, ids in (("uids", uid_list), ("gids", gid_list)):
            if len(ids) > _lib.TL_ACCESS_MAX_IDS:
                raise InvalidArgumentError(
                    f"expose: at most {_lib.TL_ACCESS_MAX_IDS} {what} (got {len(ids)})")
            if any(i < 0 or i > 0xFFFFFFFF for i in ids):
                raise InvalidArgumentError(f"expose: {what} are integers 0-4294967295")
        default = peers and not any_local and not uid_list and not gid_list
        try:
            region, off, n = self._resolve(target)
            if off != 0 or n != region.nbytes:
                region = self.register(target)
        except InvalidArgumentError:
            if isinstance(target, Region) or span_of(target).device != "cuda":
                raise
            region = self.register(target)  # CUDA memory not registered yet: register it
        self._enter()
        try:
            if default:
                st = self._lib.tl_expose(self._h, region.handle, name.encode())
            else:
                u = (c_uint32 * max(1, len(uid_list)))(*uid_list)
                g = (c_uint32 * max(1, len(gid_list)))(*gid_list)
                access = _lib.AccessStruct(
                    (_lib.TL_ACCESS_PEERS if peers else 0)
                    | (_lib.TL_ACCESS_LOCAL_ANY if any_local else 0),
                    len(uid_list), ctypes.cast(u, POINTER(c_uint32)),
                    len(gid_list), ctypes.cast(g, POINTER(c_uint32)))
                st = self._lib.tl_expose_access(self._h, region.handle, name.encode(),
                                                byref(access))
            if st != Status.OK:
                raise self._fail(st, "tl_expose" if default else "tl_expose_access", name)
        finally:
            self._leave()
        region.name = name
        # Published under a name: it stays registered until closed (or the client is), even
        # when the caller keeps no reference (a range registered here would otherwise go at
        # once, and peers would find the name gone).
        with self._cv:
            self._exposed.add(region)
        return region

    def lookup(self, peer: str, name: str, timeout: float = 0) -> Remote:
        """Finds ``name`` exposed on node ``peer`` (this node's own name is valid). With a
        ``timeout`` (seconds), NotFoundError is retried until the name appears or the time is
        up (another process may not have exposed it yet); while it waits, a line goes to the
        ``tensorlane`` logger every 5 seconds saying what it waits for and why. A ``peer`` that
        is no configured peer fails at once (InvalidArgumentError: retrying cannot help)."""
        start = time.monotonic()
        deadline = start + timeout
        next_note = start + _LOOKUP_NOTE_S
        out, nbytes = c_uint64(), c_uint64()
        while True:
            self._enter()
            try:
                st = self._lib.tl_lookup(self._h, peer.encode(), name.encode(), byref(out),
                                         byref(nbytes))
                err = None if st == Status.OK else self._fail(st, "tl_lookup", f"{peer}, {name}")
            finally:
                self._leave()
            if err is None:
                return Remote(self, out.value, peer, name, nbytes.value)
            now = time.monotonic()
            if err.status != Status.ENOENT or now >= deadline:
                raise err
            if now >= next_note:
                next_note = now + _LOOKUP_NOTE_S
                _log.warning("still waiting for '%s' on %s (%.0f s of %.0f s): %s", name, peer,
                             now - start, timeout, err)
            time.sleep(min(0.01, max(0.0, deadline - time.monotonic())))

    # ---- writes

    def write(self, src: Any, remote: Remote, imm: int = 0, src_offset: int = 0,
              dst_offset: int = 0, nbytes: Optional[int] = None) -> Ticket:
        """Writes ``nbytes`` (None: all of ``src`` from ``src_offset``) from ``src`` into
        ``remote`` at ``dst_offset``, and delivers ``imm`` (32 bits) to the target's owner.
        ``src`` is a Region, or a tensor/array/buffer in this client's memory (offsets are
        then relative to it). Returns at once; the Ticket says how it ended."""
        desc, src_region = self._describe(src, remote, imm, src_offset, dst_offset, nbytes)
        out = c_uint64()
        self._enter()
        try:
            st = self._lib.tl_write(self._h, desc.src, desc.src_off, desc.dst, desc.dst_off,
                                    desc.bytes, desc.imm, byref(out))
            if st != Status.OK:
                raise self._fail(st, "tl_write", _what(remote, desc))
        finally:
            self._leave()
        if len(self._abandoned) >= _REAP_BATCH:
            self._reap_abandoned()
        return Ticket(self, out.value, (remote, desc), src_region)

    def write_msg(self, src: Any, remote: Remote, payload: bytes = b"", imm: int = 0,
                  src_offset: int = 0, dst_offset: int = 0, nbytes: Optional[int] = None,
                  timeout: Optional[float] = None) -> Ticket:
        """``write`` with up to ``TL_MAX_PAYLOAD`` bytes of ``payload`` delivered with its
        notification (``wait_message``), and a deadline of ``timeout`` seconds: past it the
        ticket fails with DeadlineError and the target is told."""
        desc, src_region = self._describe(src, remote, imm, src_offset, dst_offset, nbytes)
        opts, keep = _send_opts(imm, payload, timeout)
        return self._submit_msg(desc.src, desc.src_off, remote, desc.dst_off, desc.bytes, opts,
                                (src_region, keep), (remote, desc))

    def send_message(self, remote: Remote, payload: bytes = b"", imm: int = 0,
                     offset: int = 0, timeout: Optional[float] = None) -> Ticket:
        """A message: ``payload`` alone (no bytes written), notified at ``offset`` of
        ``remote`` in order with this client's writes to that peer."""
        if not isinstance(remote, Remote) or remote._client is not self:
            raise InvalidArgumentError("remote must be a Remote this Client looked up")
        opts, keep = _send_opts(imm, payload, timeout)
        return self._submit_msg(0, 0, remote, offset, 0, opts, keep,
                                f"message of {len(payload)} bytes to {remote.peer}/{remote.name}")

    def _submit_msg(self, src: int, src_off: int, remote: Remote, dst_off: int, nbytes: int,
                    opts: Any, keep: Any, what: Any) -> Ticket:
        out = c_uint64()
        self._enter()
        try:
            st = self._lib.tl_write_msg(self._h, src, src_off, remote.handle, dst_off, nbytes,
                                        byref(opts), byref(out))
            if st != Status.OK:
                raise self._fail(st, "tl_write_msg", what if isinstance(what, str) else
                                 _what(*what))
        finally:
            self._leave()
        return Ticket(self, out.value, what, keep)

    def write_group(self, writes: Iterable[Union[Write, Sequence[Any], dict]],
                    notify: Optional[Remote] = None, imm: int = 0, payload: bytes = b"",
                    timeout: Optional[float] = None) -> GroupTicket:
        """One grouped write (``tl_write_group``): every entry (a :class:`Write`, a tuple of
        ``write``'s arguments or a dict; their imm is not used) to one peer, under one ticket;
        the target is notified once (``NOTIFY_GROUP``, with ``imm``, ``payload`` and the entry
        count) after every entry is in place, at ``notify`` (None: the first entry's remote).
        The ticket's ``entry_status`` says how each entry ended."""
        entries = [w if isinstance(w, Write) else Write(**w) if isinstance(w, dict) else Write(*w)
                   for w in writes]
        if not entries:
            raise InvalidArgumentError("write_group: no entries")
        arr = (_lib.GroupEntry * len(entries))()
        srcs = []
        for i, w in enumerate(entries):
            d, region = self._describe(w.src, w.remote, 0, w.src_offset, w.dst_offset, w.nbytes)
            arr[i] = _lib.GroupEntry(d.src, d.src_off, d.dst, d.dst_off, d.bytes)
            srcs.append(region)
        if notify is not None and (not isinstance(notify, Remote) or notify._client is not self):
            raise InvalidArgumentError("notify must be a Remote this Client looked up")
        opts, keep = _send_opts(imm, payload, timeout)
        statuses = (ctypes.c_int * len(entries))(*([-1] * len(entries)))
        opts.entry_status = ctypes.cast(statuses, ctypes.POINTER(ctypes.c_int))
        opts.notify = notify.handle if notify is not None else 0
        out = c_uint64()
        self._enter()
        try:
            st = self._lib.tl_write_group(self._h, arr, len(entries), byref(opts), byref(out))
            if st != Status.OK:
                raise self._fail(st, "tl_write_group", f"{len(entries)} entries")
        finally:
            self._leave()
        # The statuses array is written when the ticket ends: it stays with the ticket (and
        # with an abandoned one until it has ended).
        t = GroupTicket(self, out.value, f"group of {len(entries)} entries",
                        (srcs, keep, statuses))
        t._statuses = statuses
        return t

    def wait_message(self, timeout: Optional[float] = None) -> Message:
        """``wait_notification`` with the kind, status and payload (``tl_wait_message``);
        the two take from one queue."""
        deadline = _deadline(timeout)
        m = _lib.MessageStruct()
        while True:
            ms = _timeout_ms(deadline)
            self._enter()
            try:
                st = self._lib.tl_wait_message(self._h, byref(m), ms)
                err = None
                if st != Status.OK and (st != Status.ETIMEDOUT or (
                        deadline is not None and time.monotonic() >= deadline)):
                    err = self._fail(st, "tl_wait_message", _timeout_text(timeout))
            finally:
                self._leave()
            if st == Status.OK:
                n = m.ex.n
                return Message(self._regions.get(n.region), n.region, n.imm, n.offset, n.bytes,
                               n.peer.decode(errors="replace"), m.ex.writer_uid, m.ex.dropped,
                               m.kind, _status(m.status), m.entries,
                               bytes(m.payload[:m.payload_bytes]))
            if err is not None:
                raise err

    def write_batch(self, writes: Iterable[Union[Write, Sequence[Any], dict]]) -> list[Ticket]:
        """Submits several writes with one doorbell (``tl_write_batch``); notifications of one
        batch arrive in its order. Each entry is a :class:`Write`, a tuple of ``write``'s
        arguments or a dict of them. If one entry is wrong on its face nothing is submitted
        (InvalidArgumentError names it). RingFullError when only some fit: its ``tickets``
        holds those that were submitted (the first ones)."""
        entries = [w if isinstance(w, Write) else Write(**w) if isinstance(w, dict) else Write(*w)
                   for w in writes]
        if not entries:
            return []
        descs = (_lib.WriteDesc * len(entries))()
        whats, srcs = [], []
        for i, w in enumerate(entries):
            d, region = self._describe(w.src, w.remote, w.imm, w.src_offset, w.dst_offset,
                                       w.nbytes)
            descs[i] = d
            whats.append((w.remote, d))
            srcs.append(region)
        out = (c_uint64 * len(entries))()
        submitted = c_size_t(0)
        self._enter()
        try:
            st = self._lib.tl_write_batch(self._h, descs, len(entries), out, byref(submitted))
            err = None if st == Status.OK else self._fail(st, "tl_write_batch",
                                                          f"{len(entries)} writes")
        finally:
            self._leave()
        tickets = [Ticket(self, out[i], whats[i], srcs[i]) for i in range(submitted.value)]
        if err is not None:
            if isinstance(err, RingFullError):
                err.tickets = tickets
            raise err
        if len(self._abandoned) >= _REAP_BATCH:
            self._reap_abandoned()
        return tickets

    def nop(self) -> Ticket:
        """A no-op the sidecar completes at once (a health check)."""
        out = c_uint64()
        self._enter()
        try:
            st = self._lib.tl_nop(self._h, byref(out))
            if st != Status.OK:
                raise self._fail(st, "tl_nop")
        finally:
            self._leave()
        return Ticket(self, out.value, "nop")

    def wait_notification(self, timeout: Optional[float] = None) -> Notification:
        """Waits until data arrives in one of this client's regions. TimedOutError (a
        TimeoutError) after ``timeout`` seconds (None: forever; 0: just look)."""
        deadline = _deadline(timeout)
        ex = _lib.NotificationExStruct()
        note = ex.n
        while True:
            ms = _timeout_ms(deadline)
            self._enter()
            try:
                st = self._lib.tl_wait_notification_ex(self._h, byref(ex), ms)
                err = None
                if st != Status.OK and (st != Status.ETIMEDOUT or (
                        deadline is not None and time.monotonic() >= deadline)):
                    err = self._fail(st, "tl_wait_notification", _timeout_text(timeout))
            finally:
                self._leave()
            if st == Status.OK:
                return Notification(self._regions.get(note.region), note.region, note.imm,
                                    note.offset, note.bytes, note.peer.decode(errors="replace"),
                                    ex.writer_uid, ex.dropped)
            if err is not None:
                raise err

    # ---- stream-ordered calls (CUDA builds of the library, once GPU support is in)

    def write_on_stream(self, src: Any, remote: Remote, imm: int = 0, src_offset: int = 0,
                        dst_offset: int = 0, nbytes: Optional[int] = None,
                        stream: Any = None) -> Ticket:
        """``write`` that starts after the work queued on ``stream`` before it (a
        ``torch.cuda.Stream``, a raw ``cudaStream_t`` int, or None for torch's current
        stream). StreamUnsupportedError when the library lacks tl_write_on_stream."""
        fn = self._stream_call("tl_write_on_stream")
        desc, src_region = self._describe(src, remote, imm, src_offset, dst_offset, nbytes)
        s = _stream_handle(stream)
        out = c_uint64()
        self._enter()
        try:
            st = fn(self._h, desc.src, desc.src_off, desc.dst, desc.dst_off, desc.bytes,
                    desc.imm, c_void_p(s), byref(out))
            if st != Status.OK:
                raise self._fail(st, "tl_write_on_stream", _what(remote, desc))
        finally:
            self._leave()
        return Ticket(self, out.value, (remote, desc), src_region)

    def stream_wait_ticket(self, ticket: Ticket, stream: Any = None) -> None:
        """Makes ``stream`` wait (on the GPU, without blocking this thread) for the write."""
        fn = self._stream_call("tl_stream_wait_ticket")
        s = _stream_handle(stream)
        self._enter()
        try:
            st = fn(self._h, ticket.id, c_void_p(s))
            if st != Status.OK:
                raise self._fail(st, "tl_stream_wait_ticket", str(ticket.id))
        finally:
            self._leave()

    def stream_wait_notification(self, region: Region, imm: int, stream: Any = None) -> None:
        """Makes ``stream`` wait until a write with ``imm`` has landed in ``region``."""
        fn = self._stream_call("tl_stream_wait_notification")
        s = _stream_handle(stream)
        self._enter()
        try:
            st = fn(self._h, region.handle, imm, c_void_p(s))
            if st != Status.OK:
                raise self._fail(st, "tl_stream_wait_notification", f"imm={imm}")
        finally:
            self._leave()

    @staticmethod
    def supports_streams() -> bool:
        """Whether the loaded library has the stream-ordered calls."""
        return all(_lib.optional(n) is not None for n in
                   ("tl_write_on_stream", "tl_stream_wait_ticket", "tl_stream_wait_notification"))

    def _stream_call(self, name: str):
        fn = _lib.optional(name)
        if fn is None:
            raise StreamUnsupportedError(
                f"{name}: {_lib.library_path()} does not export it; the stream-ordered calls "
                "(DESIGN.md) come with the library's GPU support", status=Status.ECUDA,
                call=name, detail="not exported by this library")
        return fn

    # ---- status

    def sidecar_status(self) -> dict:
        """The sidecar's status (peers, clients, counters), parsed from its JSON."""
        cap = 1 << 16
        while True:
            buf = ctypes.create_string_buffer(cap)
            n = c_size_t(0)
            self._enter()
            try:
                st = self._lib.tl_sidecar_status(self._h, buf, cap, byref(n))
                if st != Status.OK:
                    raise self._fail(st, "tl_sidecar_status")
            finally:
                self._leave()
            if n.value < cap:
                return json.loads(buf.value.decode())
            cap = n.value + 1

    # ---- internals

    def _remember(self, r: HostRegion) -> None:
        with self._cv:
            self._regions[r.handle] = r
            start = r.address
            bisect.insort(self._host_starts, start)
            self._host_by_start[start] = weakref.ref(r)

    def _forget(self, r: Region) -> None:
        with self._cv:
            self._exposed.discard(r)
            handle = r.handle
            if self._regions.get(handle) is r:
                del self._regions[handle]
            start = r.address
            ref = self._host_by_start.get(start)
            if r.parent is None and ref is not None and ref() in (r, None):
                del self._host_by_start[start]
                i = bisect.bisect_left(self._host_starts, start)
                if i < len(self._host_starts) and self._host_starts[i] == start:
                    del self._host_starts[i]

    def _host_region_at(self, address: int, nbytes: int) -> Optional[HostRegion]:
        """The alloc_host buffer region containing [address, address + nbytes), if any."""
        with self._cv:
            i = bisect.bisect_right(self._host_starts, address) - 1
            if i < 0:
                return None
            ref = self._host_by_start.get(self._host_starts[i])
        r = ref() if ref is not None else None
        if r is None or r._closed:
            return None
        if address + nbytes <= r.address + r.nbytes:
            return r
        return None

    def _resolve(self, obj: Any) -> tuple[Region, int, int]:
        """(region, offset of obj in it, obj's bytes) for a Region or memory inside one."""
        if isinstance(obj, Region):
            if obj._client is not self:
                raise InvalidArgumentError("the region belongs to another Client")
            if obj.closed:
                raise InvalidArgumentError(f"{obj!r} is closed", status=Status.EINVAL)
            return obj, 0, obj.nbytes
        span = span_of(obj)
        if span.device == "cpu":
            r = self._host_region_at(span.address, span.nbytes)
            if r is not None:
                return r, span.address - r.address, span.nbytes
        else:
            best = None
            for d in list(self._device_regions):
                a, n = d.address, d.nbytes
                if not d._closed and a <= span.address and span.address + span.nbytes <= a + n:
                    if best is None or n < best.nbytes:
                        best = d
            if best is not None:
                return best, span.address - best.address, span.nbytes
        kind = "CUDA memory: register() it" if span.device == "cuda" else (
            "host memory: allocate it with alloc_host_tensor(), alloc_host_array() or "
            "alloc_host()")
        raise InvalidArgumentError(
            f"{type(obj).__name__} at {span.address:#x} ({span.nbytes} bytes) is not in a "
            f"region of this client ({kind})")

    def _describe(self, src: Any, remote: Remote, imm: int, src_offset: int, dst_offset: int,
                  nbytes: Optional[int]) -> tuple[_lib.WriteDesc, Region]:
        if not isinstance(remote, Remote):
            raise InvalidArgumentError(f"remote must be a Remote from lookup(), not "
                                       f"{type(remote).__name__}")
        if remote._client is not self:
            raise InvalidArgumentError("the Remote was looked up by another Client")
        region, base, size = self._resolve(src)
        if src_offset < 0 or dst_offset < 0 or not 0 <= imm <= 0xFFFFFFFF:
            raise InvalidArgumentError("offsets must be >= 0 and imm a 32-bit unsigned value")
        if nbytes is None:
            nbytes = size - src_offset
        if nbytes <= 0 or src_offset + nbytes > size:
            raise InvalidArgumentError(
                f"{nbytes} bytes from offset {src_offset} do not fit in the source "
                f"({size} bytes)")
        desc = _lib.WriteDesc(region.handle, base + src_offset,
                              remote.handle, dst_offset, nbytes, imm, 0)
        return desc, region

    def _deregister(self, r: Region) -> None:
        self._enter()
        try:
            st = self._lib.tl_deregister(self._h, r.handle)
            if st != Status.OK:
                raise self._fail(st, "tl_deregister", str(r.handle))
        finally:
            self._leave()

    def _wait_ticket(self, t: Ticket, deadline: Optional[float]) -> None:
        # t._lock held: this is the only C call on the ticket now.
        while True:
            ms = _timeout_ms(deadline)
            self._enter()
            try:
                st = self._lib.tl_wait(self._h, t.id, ms)
                detail = _last_error(self._lib) if st != Status.OK else ""
            finally:
                self._leave()
            if st == Status.ETIMEDOUT:
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimedOutError(f"tl_wait({t.what}): TL_ETIMEDOUT: {detail}",
                                        call="tl_wait", detail=detail)
                continue
            t._status, t._detail, t._src = _status(st), detail, None
            return

    def _test_ticket(self, t: Ticket) -> None:
        # t._lock held.
        done = c_int(0)
        self._enter()
        try:
            st = self._lib.tl_test(self._h, t.id, byref(done))
            detail = _last_error(self._lib) if st != Status.OK else ""
        finally:
            self._leave()
        if done.value or st != Status.OK:
            t._status, t._detail, t._src = _status(st), detail, None

    def _abandon(self, ticket_id: int, src: Any) -> None:
        # A Ticket dropped unwaited: its completion would stay in the C ticket table for good,
        # so later writes consume it (tl_test) once it has ended, and its source region stays
        # registered until then. Runs from __del__, on any thread: it only appends.
        if not self.closed:
            self._abandoned.append((ticket_id, src))

    def _reap_abandoned(self) -> None:
        # Oldest first, up to the first one still pending: tickets end roughly in order, so
        # this costs one tl_test per ended ticket plus one, however long the queue.
        done = c_int(0)
        q = self._abandoned
        self._enter()
        try:
            while q:
                st = self._lib.tl_test(self._h, q[0][0], byref(done))
                if st == Status.OK and not done.value:
                    break
                q.popleft()
        finally:
            self._leave()


def _status(st: int) -> Status:
    if st == 0:
        return Status.OK
    try:
        return Status(st)
    except ValueError:
        return Status.EINTERNAL


def _send_opts(imm: int, payload: Any, timeout: Optional[float]) -> tuple:
    """A tl_send_opts and what must stay alive while the call runs (the payload's buffer)."""
    if not 0 <= imm <= 0xFFFFFFFF:
        raise InvalidArgumentError("imm must be a 32-bit unsigned value")
    data = bytes(payload)
    if len(data) > _lib.TL_MAX_PAYLOAD:
        raise InvalidArgumentError(f"payload of {len(data)} bytes (at most "
                                   f"{_lib.TL_MAX_PAYLOAD})")
    buf = ctypes.create_string_buffer(data, len(data)) if data else None
    opts = _lib.SendOpts()
    opts.imm = imm
    opts.payload_bytes = len(data)
    opts.payload = ctypes.cast(buf, ctypes.c_void_p) if buf is not None else None
    if timeout is not None:
        if timeout <= 0:
            raise InvalidArgumentError("timeout must be > 0 seconds (None: no deadline)")
        opts.timeout_ms = max(1, int(timeout * 1000))
    return opts, buf


def _what(remote: Remote, d: _lib.WriteDesc) -> str:
    return f"{d.bytes} bytes to {remote.peer}/{remote.name}+{d.dst_off} imm={d.imm}"


def _timeout_text(timeout: Optional[float]) -> str:
    return "forever" if timeout is None else f"{timeout:g} s"


def _stream_handle(stream: Any) -> int:
    """A cudaStream_t from a torch.cuda.Stream, an int, or None (torch's current stream)."""
    if isinstance(stream, int):
        return stream
    if stream is None:
        import torch

        if not torch.cuda.is_available():
            raise CudaError("no CUDA stream: torch.cuda is not available", status=Status.ECUDA)
        stream = torch.cuda.current_stream()
    handle = getattr(stream, "cuda_stream", None)
    if handle is None:
        raise InvalidArgumentError(f"{type(stream).__name__} is not a CUDA stream")
    return int(handle)


