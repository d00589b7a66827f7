"""What memory an object stands for: its address, size and device.

Neither torch nor numpy is imported here: objects are recognised by their interfaces
(``data_ptr``/``is_cuda`` for torch tensors, ``__array_interface__`` for numpy arrays,
``__cuda_array_interface__`` for other CUDA arrays, the buffer protocol for the rest).
"""

from __future__ import annotations

import ctypes
from typing import Any, NamedTuple

from ._errors import InvalidArgumentError

__all__ = ["Span", "span_of", "is_torch_tensor"]


class Span(NamedTuple):
    address: int
    nbytes: int
    device: str  # "cpu", "cuda" or "dmabuf" (register_dmabuf: no address)
    device_index: int  # -1 for host memory


def is_torch_tensor(obj: Any) -> bool:
    t = type(obj)
    return t.__module__.startswith("torch") and hasattr(obj, "data_ptr") and hasattr(
        obj, "is_contiguous")


def _itemsize(typestr: str) -> int:
    return int(typestr[2:])


def span_of(obj: Any) -> Span:
    """The contiguous memory behind ``obj``; InvalidArgumentError when it has none."""
    if is_torch_tensor(obj):
        if not obj.is_contiguous():
            raise InvalidArgumentError(
                "the tensor is not contiguous: tensorlane moves one contiguous byte range "
                "(use .contiguous() into tensorlane memory first)")
        nbytes = obj.numel() * obj.element_size()
        dev = obj.device
        if dev.type == "cuda":
            return Span(obj.data_ptr(), nbytes, "cuda", dev.index if dev.index is not None else 0)
        if dev.type != "cpu":
            raise InvalidArgumentError(f"tensors on {dev.type} are not supported (cpu, cuda)")
        return Span(obj.data_ptr(), nbytes, "cpu", -1)
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        if cai.get("strides") is not None:
            raise InvalidArgumentError("the CUDA array is not C-contiguous")
        n = 1
        for d in cai["shape"]:
            n *= d
        return Span(int(cai["data"][0]), n * _itemsize(cai["typestr"]), "cuda", -1)
    ai = getattr(obj, "__array_interface__", None)
    if ai is not None and hasattr(obj, "flags") and hasattr(obj, "nbytes"):
        if not obj.flags["C_CONTIGUOUS"]:
            raise InvalidArgumentError("the array is not C-contiguous")
        return Span(int(ai["data"][0]), int(obj.nbytes), "cpu", -1)
    try:
        mv = memoryview(obj)
    except TypeError:
        raise InvalidArgumentError(
            f"{type(obj).__name__} is not memory tensorlane knows (a Region, torch tensor, "
            "numpy array or writable buffer)") from None
    with mv:
        if not mv.c_contiguous:
            raise InvalidArgumentError("the buffer is not C-contiguous")
        if mv.readonly:
            raise InvalidArgumentError("the buffer is read-only: tensorlane memory is writable")
        if mv.nbytes == 0:
            return Span(0, 0, "cpu", -1)
        probe = ctypes.c_char.from_buffer(mv.cast("B"))
        return Span(ctypes.addressof(probe), mv.nbytes, "cpu", -1)
