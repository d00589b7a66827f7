"""Finding and loading libtensorlane.so, and the ctypes prototypes of its C ABI.

The library is looked for in this order, and the first one found wins:

1. ``$TENSORLANE_LIBRARY`` (a path to the ``.so``); when it is set, nothing else is tried, so a
   wrong path is an error and never a silent fall-back to another copy;
2. next to this package (``tensorlane/libtensorlane.so*``: the build tree's package and a
   package installed together with the library);
3. the install's record: ``cmake --install`` writes ``tensorlane/_installed.py`` beside the
   package it installs, naming the library directory of that install (``--prefix`` included);
4. the library directories of the prefixes this Python runs in and of ``/usr/local``
   (``lib/<multiarch>``, ``lib64``, ``lib``): ``pip install ./shim/python`` into a prefix (a
   venv, ``/usr/local``) next to a ``cmake --install`` to the same prefix finds it there, even
   before ``ldconfig`` ran;
5. the dynamic loader's search path (``LD_LIBRARY_PATH``, ``ldconfig``'s cache: an installed
   ``libtensorlane.so.0``).

When none loads, :class:`LibraryError` lists every place tried and why each failed.

Nothing is loaded at import time: the first :class:`tensorlane.Client` loads it, so that
``import tensorlane`` (and the type stubs, ``tensorlane.testing``) work on a machine without it.
"""

from __future__ import annotations

import ctypes
import os
import sys
import sysconfig
import threading
from ctypes import POINTER, c_char, c_char_p, c_int, c_size_t, c_uint32, c_uint64, c_void_p
from typing import Optional

__all__ = ["LibraryError", "library", "library_path", "NotificationStruct", "NotificationExStruct",
           "AccessStruct", "WriteDesc"]

SONAME = "libtensorlane.so.0"


class LibraryError(ImportError):
    """libtensorlane.so could not be found or loaded; the message lists what was tried."""


class NotificationStruct(ctypes.Structure):
    """``tl_notification`` (96 bytes)."""

    _fields_ = [
        ("region", c_uint64),
        ("imm", c_uint32),
        ("offset", c_uint64),
        ("bytes", c_uint64),
        ("peer", c_char * 64),
    ]


class NotificationExStruct(ctypes.Structure):
    """``tl_notification_ex`` (144 bytes): a notification with its writer's uid."""

    _fields_ = [
        ("n", NotificationStruct),
        ("writer_uid", c_uint32),
        ("flags", c_uint32),
        ("dropped", c_uint64),
        ("reserved", c_uint64 * 4),
    ]


class AccessStruct(ctypes.Structure):
    """``tl_access`` (32 bytes): who may write an exposed region."""

    _fields_ = [
        ("flags", c_uint32),
        ("n_uids", c_uint32),
        ("uids", POINTER(c_uint32)),
        ("n_gids", c_uint32),
        ("gids", POINTER(c_uint32)),
    ]


class WriteDesc(ctypes.Structure):
    """``tl_write_desc`` (48 bytes): one write of a batch."""

    _fields_ = [
        ("src", c_uint64),
        ("src_off", c_uint64),
        ("dst", c_uint64),
        ("dst_off", c_uint64),
        ("bytes", c_uint64),
        ("imm", c_uint32),
        ("reserved", c_uint32),
    ]


TL_MAX_PAYLOAD = 256
TL_GROUP_MAX_ENTRIES = 16384


class SendOpts(ctypes.Structure):
    """``tl_send_opts`` (56 bytes): a payload, a deadline, a group's statuses and target."""

    _fields_ = [
        ("imm", c_uint32),
        ("payload_bytes", c_uint32),
        ("payload", c_void_p),
        ("timeout_ms", ctypes.c_int32),
        ("flags", c_uint32),
        ("entry_status", POINTER(ctypes.c_int)),
        ("notify", c_uint64),
        ("reserved", c_uint64 * 2),
    ]


class GroupEntry(ctypes.Structure):
    """``tl_group_entry`` (40 bytes)."""

    _fields_ = [
        ("src", c_uint64),
        ("src_off", c_uint64),
        ("dst", c_uint64),
        ("dst_off", c_uint64),
        ("bytes", c_uint64),
    ]


class MessageStruct(ctypes.Structure):
    """``tl_message``: a notification with its kind, status and payload."""

    _fields_ = [
        ("ex", NotificationExStruct),
        ("kind", c_uint32),
        ("status", ctypes.c_int),
        ("entries", c_uint32),
        ("payload_bytes", c_uint32),
        ("payload", ctypes.c_uint8 * TL_MAX_PAYLOAD),
    ]


# The C header's layouts (tensorlane.h static_asserts sizeof(tl_notification) == 96).
assert ctypes.sizeof(NotificationStruct) == 96
assert ctypes.sizeof(WriteDesc) == 48
assert ctypes.sizeof(NotificationExStruct) == 144
assert ctypes.sizeof(AccessStruct) == 32
assert ctypes.sizeof(SendOpts) == 56
assert ctypes.sizeof(GroupEntry) == 40
assert ctypes.sizeof(MessageStruct) == 144 + 16 + TL_MAX_PAYLOAD

TL_ACCESS_PEERS = 0x1
TL_ACCESS_LOCAL_ANY = 0x2
TL_ACCESS_MAX_IDS = 64

_u64p = POINTER(c_uint64)

# name: (restype, argtypes). Every call of the first list must be there; the optional ones
# (stream-ordered calls, CUDA builds with GPU support) are looked up with getattr.
_REQUIRED = {
    "tl_status_str": (c_char_p, [c_int]),
    "tl_last_error": (c_char_p, []),
    "tl_connect": (c_int, [c_char_p, POINTER(c_void_p)]),
    "tl_disconnect": (None, [c_void_p]),
    "tl_alloc_host": (c_int, [c_void_p, c_size_t, POINTER(c_void_p), _u64p]),
    "tl_register": (c_int, [c_void_p, c_void_p, c_size_t, _u64p]),
    "tl_register_dmabuf": (c_int, [c_void_p, c_int, c_uint64, c_uint64, _u64p]),
    "tl_deregister": (c_int, [c_void_p, c_uint64]),
    "tl_expose": (c_int, [c_void_p, c_uint64, c_char_p]),
    "tl_lookup": (c_int, [c_void_p, c_char_p, c_char_p, _u64p, _u64p]),
    "tl_write": (
        c_int,
        [c_void_p, c_uint64, c_uint64, c_uint64, c_uint64, c_uint64, c_uint32, _u64p],
    ),
    "tl_wait": (c_int, [c_void_p, c_uint64, c_int]),
    "tl_test": (c_int, [c_void_p, c_uint64, POINTER(c_int)]),
    "tl_wait_notification": (c_int, [c_void_p, POINTER(NotificationStruct), c_int]),
    "tl_nop": (c_int, [c_void_p, _u64p]),
    "tl_write_batch": (
        c_int,
        [c_void_p, POINTER(WriteDesc), c_size_t, _u64p, POINTER(c_size_t)],
    ),
    "tl_nop_batch": (c_int, [c_void_p, c_size_t, _u64p, POINTER(c_size_t)]),
    "tl_node_name": (c_char_p, [c_void_p]),
    "tl_sidecar_status": (c_int, [c_void_p, c_char_p, c_size_t, POINTER(c_size_t)]),
    "tl_expose_access": (c_int, [c_void_p, c_uint64, c_char_p, POINTER(AccessStruct)]),
    "tl_wait_notification_ex": (c_int, [c_void_p, POINTER(NotificationExStruct), c_int]),
    "tl_write_msg": (
        c_int,
        [c_void_p, c_uint64, c_uint64, c_uint64, c_uint64, c_uint64, POINTER(SendOpts), _u64p],
    ),
    "tl_write_group": (
        c_int, [c_void_p, POINTER(GroupEntry), c_size_t, POINTER(SendOpts), _u64p],
    ),
    "tl_wait_message": (c_int, [c_void_p, POINTER(MessageStruct), c_int]),
}

_OPTIONAL = {
    # DESIGN.md, "Stream-ordered calls (CUDA builds; s is a cudaStream_t)".
    "tl_write_on_stream": (
        c_int,
        [c_void_p, c_uint64, c_uint64, c_uint64, c_uint64, c_uint64, c_uint32, c_void_p, _u64p],
    ),
    "tl_stream_wait_ticket": (c_int, [c_void_p, c_uint64, c_void_p]),
    "tl_stream_wait_notification": (c_int, [c_void_p, c_uint64, c_uint32, c_void_p]),
}

_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_path: Optional[str] = None


def _prefix_dirs() -> list[str]:
    """The library directories of this Python's prefixes and of /usr/local, without repeats."""
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    out: list[str] = []
    for prefix in (sys.prefix, sys.base_prefix, "/usr/local"):
        for sub in ([os.path.join("lib", multiarch)] if multiarch else []) + ["lib64", "lib"]:
            d = os.path.join(prefix, sub)
            if d not in out:
                out.append(d)
    return out


def _recorded_dir(here: str) -> Optional[str]:
    """The library directory named by the install's record (_installed.py), if there is one."""
    path = os.path.join(here, "_installed.py")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("LIBDIR = "):
            value = line[len("LIBDIR = "):].strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
                return value[1:-1]
    return None


def _candidates() -> list[tuple[str, str]]:
    """(how it was found, what to dlopen), in the order they are tried. Paths that do not exist
    are kept, so that the error lists them."""
    env = os.environ.get("TENSORLANE_LIBRARY")
    if env:
        return [("$TENSORLANE_LIBRARY", env)]
    here = os.path.dirname(os.path.abspath(__file__))
    out = []
    for name in ("libtensorlane.so", SONAME):
        path = os.path.join(here, name)
        if os.path.exists(path):
            out.append(("next to the package", path))
    recorded = _recorded_dir(here)
    if recorded:
        out.append(("the install's record, tensorlane/_installed.py",
                    os.path.join(recorded, SONAME)))
    for d in _prefix_dirs():
        out.append(("the prefix's library directory", os.path.join(d, SONAME)))
    out.append(("the loader path", SONAME))
    out.append(("the loader path", "libtensorlane.so"))
    return out


def _prototype(lib: ctypes.CDLL, name: str, spec: tuple) -> None:
    fn = getattr(lib, name)
    fn.restype, fn.argtypes = spec[0], spec[1]


def library() -> ctypes.CDLL:
    """The loaded libtensorlane (loaded on first use); raises LibraryError if there is none."""
    global _lib, _path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for how, what in _candidates():
            if os.sep in what and how != "$TENSORLANE_LIBRARY" and not os.path.exists(what):
                tried.append(f"{what} ({how}): not there")
                continue
            try:
                # CDLL, not PyDLL: ctypes releases the GIL around every call, so a thread
                # blocked in tl_wait never stops the others.
                lib = ctypes.CDLL(what)
            except OSError as e:
                tried.append(f"{what} ({how}): {e}")
                continue
            missing = [n for n in _REQUIRED if not hasattr(lib, n)]
            if missing:
                tried.append(f"{what} ({how}): lacks {', '.join(missing)}")
                continue
            for name, spec in _REQUIRED.items():
                _prototype(lib, name, spec)
            for name, spec in _OPTIONAL.items():
                if hasattr(lib, name):
                    _prototype(lib, name, spec)
            _path = _resolved_path(lib, what)
            _lib = lib
            return lib
        raise LibraryError(
            "cannot load libtensorlane.so; tried:\n  "
            + "\n  ".join(tried)
            + "\nSet TENSORLANE_LIBRARY to the library's path, put it next to the package "
            "(TENSORLANE_WHEEL_LIBRARY when building the wheel), `cmake --install` into this "
            "Python's prefix, or install it where the dynamic loader finds it (then ldconfig)."
        )


def _resolved_path(lib: ctypes.CDLL, fallback: str) -> str:
    """The file the loader actually mapped (from /proc/self/maps), else what was asked for."""
    try:
        addr = ctypes.cast(lib.tl_status_str, c_void_p).value or 0
        with open("/proc/self/maps", encoding="utf-8") as maps:
            for line in maps:
                parts = line.split()
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                if lo <= addr < hi and len(parts) >= 6:
                    return parts[5]
    except (OSError, ValueError):
        pass
    return fallback


def library_path() -> str:
    """The path of the loaded library (loading it first)."""
    library()
    assert _path is not None
    return _path


def optional(name: str):
    """An optional C function, or None when this build of the library lacks it."""
    return getattr(library(), name, None)
