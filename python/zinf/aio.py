"""zinf.aio: DeepNVMe's aio handle over zinf's engine (io_uring, libaio or threads).

Code written for DeepSpeed's ``AsyncIOBuilder().load().aio_handle(...)`` runs with
``zinf.aio.Handle(...)``: same knobs, same verbs, same return values; failures raise
``AioError`` (an OSError naming the file, offset and errno) instead of returning -1.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Sequence, Union

from zinf._errors import AioError
from zinf._zinf import aio as _native

PinnedBuffer = _native.PinnedBuffer
pinned = _native.pinned
backends = _native.backends
default_backend = _native.default_backend

__all__ = ["AioError", "Handle", "PinnedBuffer", "backends", "default_backend", "pinned", "pinned_array",
           "pinned_tensor"]


def _count(shape: Union[int, Sequence[int]]) -> tuple:
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    if any((not isinstance(d, int)) or d < 0 for d in dims):
        raise ValueError(f"shape must be non-negative integers, got {shape!r}")
    return dims, math.prod(dims)


def pinned_array(shape: Union[int, Sequence[int]], dtype: Any = "uint8"):
    """A numpy array of ``shape`` and ``dtype`` in pinned memory (zero-filled).

    The array keeps its ``PinnedBuffer`` alive (``array.base``)."""
    import numpy as np

    dims, count = _count(shape)
    dt = np.dtype(dtype)
    buf = pinned(count * dt.itemsize)
    return np.frombuffer(buf, dtype=dt, count=count).reshape(dims)


def pinned_tensor(shape: Union[int, Sequence[int]], dtype: Any = None):
    """A torch CPU tensor of ``shape`` and ``dtype`` (default torch.float32) in pinned memory.

    Needs PyTorch; the tensor keeps its ``PinnedBuffer`` alive."""
    import torch

    dims, count = _count(shape)
    dt = torch.float32 if dtype is None else dtype
    if count == 0:
        return torch.empty(dims, dtype=dt)
    item = torch.empty((), dtype=dt).element_size()
    buf = pinned(count * item)
    return torch.frombuffer(buf, dtype=dt, count=count).reshape(dims)


class Handle(_native.Handle):
    __doc__ = _native.Handle.__doc__

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._locked: Dict[int, Any] = {}

    def new_cpu_locked_tensor(self, num_elem: int, example_tensor: Any):
        """DeepNVMe's pinned tensor: ``num_elem`` elements of ``example_tensor``'s dtype, 1-D, in
        pinned memory registered with this handle (io_uring fixed buffers). Needs PyTorch."""
        tensor = pinned_tensor((int(num_elem),), example_tensor.dtype)
        if tensor.numel() > 0:
            self.register_buffer(tensor)
            self._locked[tensor.data_ptr()] = tensor
        return tensor

    def free_cpu_locked_tensor(self, tensor: Any) -> bool:
        """Unregisters a tensor from ``new_cpu_locked_tensor``; its memory goes with the last
        reference. Returns whether the tensor was one of this handle's."""
        if self._locked.pop(tensor.data_ptr(), None) is None:
            return False
        self.unregister_buffers()
        for kept in self._locked.values():
            self.register_buffer(kept)
        return True

    def is_pinned(self, buffer: Any) -> bool:
        """DeepNVMe's check: whether ``buffer`` is page-locked memory (a torch-pinned tensor or
        one from ``new_cpu_locked_tensor``). Any buffer works with the handle; pinned, aligned
        ones avoid the engine's bounce copies."""
        if hasattr(buffer, "data_ptr") and buffer.data_ptr() in self._locked:
            return True
        return bool(getattr(buffer, "is_pinned", lambda: False)())
