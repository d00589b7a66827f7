"""Statuses of the C ABI and the exception raised for each.

Every exception is a :class:`TensorlaneError` with ``.status`` (a :class:`Status`), ``.call``
(the C function that failed) and ``.detail`` (``tl_last_error()``'s text for that failure), and
is also a subclass of the standard exception a Python programmer would catch for it:
``TimedOutError`` is a ``TimeoutError``, ``NotFoundError`` a ``LookupError``,
``InvalidArgumentError`` a ``ValueError``, ``PermissionDeniedError`` a ``PermissionError``,
``OutOfMemoryError`` a ``MemoryError``, ``PeerError`` and ``SidecarGoneError`` are
``ConnectionError``\\ s.
"""

from __future__ import annotations

import enum
from typing import Optional

__all__ = [
    "Status",
    "TensorlaneError",
    "InvalidArgumentError",
    "NotFoundError",
    "PermissionDeniedError",
    "OutOfMemoryError",
    "RingFullError",
    "TimedOutError",
    "PeerError",
    "SidecarGoneError",
    "CudaError",
    "InternalError",
    "ClientClosedError",
    "error_for",
]


class Status(enum.IntEnum):
    """``tl_status``, in the C header's order."""

    OK = 0
    EINVAL = 1
    ENOENT = 2
    EPERM = 3
    ENOMEM = 4
    EAGAIN = 5
    ETIMEDOUT = 6
    EPEER = 7
    ECONN = 8
    ECUDA = 9
    EINTERNAL = 10
    EDEADLINE = 11

    @property
    def c_name(self) -> str:
        """The C name, as tl_status_str() gives it ("TL_EPEER")."""
        return "TL_" + self.name


class TensorlaneError(Exception):
    """A call failed. ``status`` says how, ``detail`` is the library's explanation."""

    status: Status = Status.EINTERNAL

    def __init__(self, message: str, *, status: Optional[Status] = None, call: str = "",
                 detail: str = "") -> None:
        super().__init__(message)
        if status is not None:
            self.status = Status(status)
        self.call = call
        #: tl_last_error()'s text for a failed C call (else the message itself).
        self.detail = detail or message


class InvalidArgumentError(TensorlaneError, ValueError):
    """TL_EINVAL: wrong on its face (bad argument, unknown region, out of bounds)."""

    status = Status.EINVAL


class NotFoundError(TensorlaneError, LookupError):
    """TL_ENOENT: no such peer, name or ticket; or a region revoked by its owner."""

    status = Status.ENOENT


class PermissionDeniedError(TensorlaneError, PermissionError):
    """TL_EPERM: the sidecar refused this process's credentials."""

    status = Status.EPERM


class OutOfMemoryError(TensorlaneError, MemoryError):
    """TL_ENOMEM: the sidecar or the kernel could not provide the memory."""

    status = Status.ENOMEM


class RingFullError(TensorlaneError, BlockingIOError):
    """TL_EAGAIN: the request ring is full or too many writes are outstanding; wait on a
    ticket and retry. From ``write_batch``, ``tickets`` holds the writes that were submitted."""

    status = Status.EAGAIN

    def __init__(self, message: str, **kw) -> None:
        super().__init__(message, **kw)
        self.tickets: list = []


class TimedOutError(TensorlaneError, TimeoutError):
    """TL_ETIMEDOUT: the wait ran out (the ticket is still pending and may be waited on)."""

    status = Status.ETIMEDOUT


class PeerError(TensorlaneError, ConnectionError):
    """TL_EPEER: the peer node is unreachable or failed."""

    status = Status.EPEER


class SidecarGoneError(TensorlaneError, ConnectionError):
    """TL_ECONN: this node's sidecar is gone (or was never reachable); connect again."""

    status = Status.ECONN


class CudaError(TensorlaneError, RuntimeError):
    """TL_ECUDA: CUDA memory where it is not supported, or a CUDA call failed."""

    status = Status.ECUDA


class InternalError(TensorlaneError, RuntimeError):
    """TL_EINTERNAL."""

    status = Status.EINTERNAL


class DeadlineError(TensorlaneError, TimeoutError):
    """TL_EDEADLINE: the write's deadline passed and it failed (its ticket is over)."""

    status = Status.EDEADLINE


class ClientClosedError(TensorlaneError, ValueError):
    """The Client (or the object's client) was closed by this process."""

    status = Status.EINVAL


_BY_STATUS = {
    Status.EINVAL: InvalidArgumentError,
    Status.ENOENT: NotFoundError,
    Status.EPERM: PermissionDeniedError,
    Status.ENOMEM: OutOfMemoryError,
    Status.EAGAIN: RingFullError,
    Status.ETIMEDOUT: TimedOutError,
    Status.EPEER: PeerError,
    Status.ECONN: SidecarGoneError,
    Status.ECUDA: CudaError,
    Status.EINTERNAL: InternalError,
    Status.EDEADLINE: DeadlineError,
}


def error_for(status: int, call: str, detail: str, context: str = "") -> TensorlaneError:
    """The exception for a failed call: ``"tl_lookup(node-b, kv): TL_ENOENT: detail"``."""
    try:
        st = Status(status)
    except ValueError:
        st = Status.EINTERNAL
        detail = f"unknown status {status}" + (f": {detail}" if detail else "")
    cls = _BY_STATUS.get(st, InternalError)
    where = f"{call}({context})" if context else call
    message = f"{where}: {st.c_name}" + (f": {detail}" if detail else "")
    return cls(message, status=st, call=call, detail=detail)
