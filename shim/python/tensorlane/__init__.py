"""tensorlane: move tensors between nodes through the node's tensorlane sidecar.

ctypes over libtensorlane.so (the C ABI in ``tensorlane.h``): no compiled extension, so one
install works with any Python 3.9+ and any PyTorch. Names follow the C ABI in snake_case::

    import tensorlane

    with tensorlane.Client() as c:                       # $TENSORLANE_SOCKET or the default
        kv = c.alloc_host_tensor((64, 4096), torch.float16)
        c.expose(kv, "kv-layer-0")                       # peers may now write into it
        dst = c.lookup("node-b", "kv-layer-0", timeout=10)
        c.write(kv, dst, imm=7).wait()                   # the data is in place at node-b
        note = c.wait_notification(timeout=5)            # on node-b: region, imm, offset, ...

See docs/python.md for the whole API, errors, threads and lifetimes.
"""

from ._client import (
    UID_PEER,
    UID_UNKNOWN,
    WAIT_SLICE,
    Client,
    DeviceRegion,
    GroupTicket,
    Message,
    NOTIFY_GROUP,
    NOTIFY_MESSAGE,
    NOTIFY_WRITE,
    HostRegion,
    Notification,
    Region,
    Remote,
    StreamUnsupportedError,
    Ticket,
    Write,
)
from ._errors import (
    ClientClosedError,
    CudaError,
    DeadlineError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    OutOfMemoryError,
    PeerError,
    PermissionDeniedError,
    RingFullError,
    SidecarGoneError,
    Status,
    TensorlaneError,
    TimedOutError,
)
from ._lib import LibraryError, library_path

__version__ = "0.1.0"

__all__ = [
    "Client",
    "Region",
    "HostRegion",
    "DeviceRegion",
    "Remote",
    "Ticket",
    "Notification",
    "Message",
    "GroupTicket",
    "NOTIFY_WRITE",
    "NOTIFY_MESSAGE",
    "NOTIFY_GROUP",
    "Write",
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
    "StreamUnsupportedError",
    "InternalError",
    "DeadlineError",
    "ClientClosedError",
    "LibraryError",
    "library_path",
    "WAIT_SLICE",
    "UID_PEER",
    "UID_UNKNOWN",
    "__version__",
]
