"""zinf.save_file / zinf.load_file: safetensors files through the aio engine (O_DIRECT)."""

from __future__ import annotations

import json
import math
import os
import struct
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

from zinf._zinf import _read_stream, _write_stream

PathLike = Union[str, bytes, "os.PathLike[str]"]

# safetensors dtypes in the format's order (its writer puts larger ranks first) and their sizes.
_DTYPES: List[Tuple[str, int]] = [
    ("BOOL", 1), ("U8", 1), ("I8", 1), ("F8_E5M2", 1), ("F8_E4M3", 1), ("I16", 2), ("U16", 2),
    ("F16", 2), ("BF16", 2), ("I32", 4), ("U32", 4), ("F32", 4), ("F64", 8), ("I64", 8), ("U64", 8),
]
_RANK = {name: i for i, (name, _) in enumerate(_DTYPES)}
_SIZE = dict(_DTYPES)
_NUMPY = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16", "F16": "float16",
          "I32": "int32", "U32": "uint32", "F32": "float32", "F64": "float64", "I64": "int64", "U64": "uint64"}
_NUMPY_BACK = {v: k for k, v in _NUMPY.items()}
_TORCH = dict(_NUMPY, BF16="bfloat16", F8_E5M2="float8_e5m2", F8_E4M3="float8_e4m3fn")
_TORCH_BACK = {v: k for k, v in _TORCH.items()}
_MAX_HEADER = 100_000_000  # the safetensors reader's own limit

# Engine knobs for whole-file transfers (docs/python.md: how they were chosen).
_KNOBS = {"block_size": 4 << 20, "queue_depth": 16, "intra_op_parallelism": 2, "backend": "auto"}
_STAGING = 64 << 20  # bytes per pinned staging buffer (kept between calls)
_STAGING_COUNT = 2


def _is_torch(t: Any) -> bool:
    return type(t).__module__.startswith("torch") and hasattr(t, "data_ptr")


def _describe(name: str, t: Any, verb: str = "save_file") -> Tuple[str, List[int], int]:
    """(safetensors dtype, shape, nbytes) of a tensor, or a clear error."""
    if _is_torch(t):
        dtype = _TORCH_BACK.get(str(t.dtype).replace("torch.", ""))
        if dtype is None:
            raise TypeError(f"{verb}: tensor {name!r} has dtype {t.dtype}, which safetensors cannot store")
        if t.device.type != "cpu":
            raise ValueError(f"{verb}: tensor {name!r} is on {t.device}; move it to the CPU first")
        if not t.is_contiguous():
            raise ValueError(f"{verb}: tensor {name!r} is not contiguous; pass tensor.contiguous()")
        return dtype, list(t.shape), t.numel() * t.element_size()
    import numpy as np

    if not isinstance(t, np.ndarray):
        raise TypeError(f"{verb}: {name!r} is a {type(t).__name__}, not a numpy array or torch tensor")
    if not t.flags.c_contiguous:
        raise ValueError(f"{verb}: array {name!r} is not C-contiguous; pass numpy.ascontiguousarray(a)")
    if t.dtype.byteorder == ">" or (t.dtype.byteorder == "=" and struct.pack("=H", 1) != b"\x01\x00"):
        raise ValueError(f"{verb}: array {name!r} is big-endian; safetensors stores little-endian")
    dtype = _NUMPY_BACK.get(t.dtype.name)
    if dtype is None:
        raise TypeError(f"{verb}: array {name!r} has dtype {t.dtype}, which safetensors cannot store")
    return dtype, list(t.shape), t.nbytes


def _header(entries: List[Tuple[str, str, List[int], int]], metadata: Optional[Mapping[str, str]]) -> bytes:
    header: Dict[str, Any] = {}
    if metadata is not None:
        for k, v in metadata.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise TypeError(f"save_file: metadata must map str to str, got {k!r}: {v!r}")
        header["__metadata__"] = dict(sorted(metadata.items()))
    offset = 0
    for name, dtype, shape, nbytes in entries:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)  # the data section starts 8-aligned
    return struct.pack("<Q", len(text)) + text


def save_file(tensors: Mapping[str, Any], path: PathLike, metadata: Optional[Mapping[str, str]] = None, *,
              fsync: bool = False) -> None:
    """Writes ``tensors`` (name -> numpy array or torch CPU tensor) to ``path`` as safetensors.

    Same layout as ``safetensors.torch.save_file``/``safetensors.numpy.save_file`` (tensors sorted
    by dtype, then name; compact JSON header padded to 8 bytes), so for the same tensors and at
    most one metadata key the bytes are identical. The bytes go through two pinned staging
    buffers and the aio engine with O_DIRECT into a temporary file beside ``path``, renamed over
    it once complete (``fsync=True`` syncs the file and its folder before returning): a failure
    part-way leaves ``path`` as it was. An existing file's permission bits carry over; a link
    at ``path`` is followed. Tensors must be contiguous and on the CPU; tensors sharing memory
    are each written in full.
    """
    if not isinstance(tensors, Mapping):
        raise TypeError(f"save_file: tensors must be a mapping of name to tensor, got {type(tensors).__name__}")
    entries = []
    parts: List[Any] = []
    described = []
    for name, t in tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"save_file: tensor names must be str, got {name!r}")
        if name == "__metadata__":
            raise ValueError("save_file: '__metadata__' is reserved for the metadata; pass metadata=")
        dtype, shape, nbytes = _describe(name, t)
        described.append((name, dtype, shape, nbytes, t))
    described.sort(key=lambda e: (-_RANK[e[1]], e[0]))
    for name, dtype, shape, nbytes, t in described:
        entries.append((name, dtype, shape, nbytes))
        parts.append(t)
    head = _header(entries, metadata)
    _write_stream(os.fsdecode(os.fspath(path)), [head] + parts, _KNOBS["block_size"], _KNOBS["queue_depth"],
                  _KNOBS["intra_op_parallelism"], _KNOBS["backend"], _STAGING, _STAGING_COUNT, fsync)


def _bad(path: str, why: str) -> ValueError:
    return ValueError(f"load_file {path}: not a valid safetensors file: {why}")


def read_header(path: PathLike) -> Tuple[int, Dict[str, Any], Dict[str, str]]:
    """Reads and checks a safetensors header: (data section offset, tensors by name in file
    order as {"dtype", "shape", "data_offsets"}, metadata). Raises ValueError for a malformed file."""
    p = os.fsdecode(os.fspath(path))
    with open(p, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        raw = f.read(8)
        if len(raw) < 8:
            raise _bad(p, f"{size} bytes, shorter than the 8-byte header length")
        (n,) = struct.unpack("<Q", raw)
        if n > _MAX_HEADER or 8 + n > size:
            raise _bad(p, f"header length {n} with a file of {size} bytes")
        text = f.read(n)
    try:
        header = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise _bad(p, f"header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise _bad(p, "header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise _bad(p, "__metadata__ must map strings to strings")
    items = []
    for name, info in header.items():
        try:
            dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
        except (TypeError, KeyError, ValueError):
            raise _bad(p, f"tensor {name!r}: needs dtype, shape and data_offsets [begin, end]") from None
        if dtype not in _SIZE:
            raise _bad(p, f"tensor {name!r}: unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise _bad(p, f"tensor {name!r}: shape {shape!r} is not a list of non-negative integers")
        if not all(isinstance(o, int) for o in (begin, end)) or not 0 <= begin <= end:
            raise _bad(p, f"tensor {name!r}: data_offsets [{begin}, {end}]")
        if end - begin != math.prod(shape) * _SIZE[dtype]:
            raise _bad(p, f"tensor {name!r}: {end - begin} bytes for shape {shape} of {dtype}")
        items.append((begin, end, name, info))
    items.sort(key=lambda e: (e[0], e[1]))
    at = 0
    for begin, end, name, _ in items:
        if begin != at:
            raise _bad(p, f"tensor {name!r} starts at {begin}, not where the previous one ends ({at})")
        at = end
    if 8 + n + at != size:
        raise _bad(p, f"the tensors end at byte {8 + n + at} but the file has {size}")
    return 8 + n, {name: info for _, _, name, info in items}, dict(metadata)


def load_file(path: PathLike, framework: str = "numpy", *, out: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """Reads a safetensors file: name -> numpy array (``framework="numpy"``) or torch CPU tensor
    (``framework="pt"``), in file order.

    Each tensor is its own allocation (``numpy.empty`` / ``torch.empty``), filled from pinned
    staging buffers that the aio engine reads the file into with O_DIRECT, several reads in
    flight while earlier ones are copied out. numpy has no bfloat16 or float8: such a file needs
    framework="pt".

    ``out``: existing tensors or arrays (e.g. a model's state dict) to fill in place instead,
    one per tensor of the file with the same name, dtype and shape (contiguous, writable);
    returned as a dict in file order. No new memory is allocated.
    """
    if out is not None:
        return _load_into(path, out)
    if framework in ("np", "numpy"):
        import numpy as np

        types = {k: np.dtype(v) for k, v in _NUMPY.items()}
        empty = lambda shape, dt: np.empty(shape, dtype=dt)  # noqa: E731
    elif framework in ("pt", "torch"):
        import torch

        types = {k: getattr(torch, v) for k, v in _TORCH.items() if hasattr(torch, v)}
        empty = lambda shape, dt: torch.empty(shape, dtype=dt)  # noqa: E731
    else:
        raise ValueError(f"load_file: framework must be 'numpy' or 'pt', got {framework!r}")
    p = os.fsdecode(os.fspath(path))
    start, entries, _ = read_header(p)
    for name, info in entries.items():
        if info["dtype"] not in types:
            raise TypeError(f"load_file {p}: tensor {name!r} is {info['dtype']}, which {framework} cannot hold"
                            + (" (use framework='pt')" if framework in ("np", "numpy") else ""))
    out = {name: empty(info["shape"], types[info["dtype"]]) for name, info in entries.items()}
    parts = [t for t in out.values() if math.prod(t.shape) > 0]
    if parts:
        _read_stream(p, start, parts, _KNOBS["block_size"], _KNOBS["queue_depth"], _KNOBS["intra_op_parallelism"],
                     _KNOBS["backend"], _STAGING, _STAGING_COUNT)
    return out


def _load_into(path: PathLike, out: Mapping[str, Any]) -> Dict[str, Any]:
    p = os.fsdecode(os.fspath(path))
    start, entries, _ = read_header(p)
    missing = [name for name in entries if name not in out]
    extra = [name for name in out if name not in entries]
    if missing or extra:
        raise ValueError(f"load_file {p}: out= must hold exactly the file's tensors; "
                         f"missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
                         f"not in the file {extra[:5]}{'...' if len(extra) > 5 else ''}")
    parts = []
    for name, info in entries.items():
        dtype, shape, nbytes = _describe(name, out[name], "load_file out=")
        if (dtype, shape) != (info["dtype"], info["shape"]):
            raise ValueError(f"load_file {p}: tensor {name!r} is {info['dtype']} {info['shape']} in the file, "
                             f"but out[{name!r}] is {dtype} {shape}")
        if nbytes:
            parts.append(out[name])
    if parts:
        _read_stream(p, start, parts, _KNOBS["block_size"], _KNOBS["queue_depth"], _KNOBS["intra_op_parallelism"],
                     _KNOBS["backend"], _STAGING, _STAGING_COUNT)
    return {name: out[name] for name in entries}
