"""The safetensors file format, read and written with NumPy: no code runs on load.

A file is an 8-byte little-endian header length N, N bytes of JSON header, then the
tensors' bytes (little-endian, C order) back to back::

    {"__metadata__": {str: str, ...},
     "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...}

Offsets count from the end of the header; the tensors cover the data exactly, in any
order, without gaps or overlaps (the format's own rules, checked here before any data is
read). bfloat16 is stored as it is ("BF16") and read back as ml_dtypes' bfloat16.

This writer adds two entries to ``__metadata__``, which any other reader ignores:
``"crc32"``, JSON mapping each tensor name to the zlib CRC-32 of its bytes (8 hex
digits), and ``"header_crc32"``, the CRC-32 of the header itself (the header's JSON with
sorted keys and no spaces, without this entry). The reader checks each one that is
present, so files from other writers (Hugging Face's) read too, unchecked.

>>> with open("x.safetensors", "wb") as f:
...     write_safetensors(f, [("w", np.zeros((2, 3), np.float32))], {"note": "hi"})
>>> with open("x.safetensors", "rb") as f:
...     header = read_header(f, os.fstat(f.fileno()).st_size)
...     w = read_tensor(f, header, "w")
"""
from __future__ import annotations

import json
import math
import struct
import zlib
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable, Dict, Mapping, Optional, Sequence, Tuple

import ml_dtypes
import numpy as np

__all__ = ["DTYPES", "Header", "NotSafetensorsError", "TensorInfo", "TruncatedError",
           "dtype_name", "read_header", "read_tensor", "write_safetensors"]

# the format's dtype names -> NumPy dtypes (little-endian); the format's 4- and 6-bit
# floats, packed two to a byte, have no NumPy dtype and are left out
DTYPES: Dict[str, np.dtype] = {name: np.dtype(kind).newbyteorder("<") for name, kind in {
    "BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "U16": np.uint16, "I16": np.int16,
    "U32": np.uint32, "I32": np.int32, "U64": np.uint64, "I64": np.int64,
    "F16": np.float16, "BF16": ml_dtypes.bfloat16, "F32": np.float32, "F64": np.float64,
    "C64": np.complex64, "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2,
}.items()}
_NAME_OF = {dtype: name for name, dtype in DTYPES.items()}

MAX_HEADER = 100_000_000  # bytes: the safetensors library's own limit on a header
_CHUNK = 16 << 20  # bytes written or read at a time
_ALIGN = 8  # the header is padded with spaces so that the data starts on a multiple of it
_CRC_WIDTH = 8  # hex digits of a CRC: fixed, so the header's length is known before the data
_RESERVED = frozenset({"crc32", "header_crc32"})  # metadata entries the writer fills in


class NotSafetensorsError(ValueError):
    """The file does not begin as a safetensors file does."""


class TruncatedError(ValueError):
    """The file ends before its header or its data do."""


@dataclass(frozen=True)
class TensorInfo:
    """One header entry: dtype, shape and the byte range in the data section."""

    dtype: np.dtype
    shape: Tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True)
class Header:
    """A checked header: tensors in the header's order, metadata, where the data starts."""

    tensors: Dict[str, TensorInfo]
    metadata: Dict[str, str]
    data_start: int  # bytes before the data section: 8 + the header's length
    crc32: Dict[str, int]  # per tensor name, when the file records it


def dtype_name(dtype: Any, where: str) -> str:
    """The format's name of ``dtype`` (any byte order); TypeError naming ``where`` if the
    format has none."""
    dtype = np.dtype(dtype)
    name = None
    if dtype.fields is None and dtype.subdtype is None and not dtype.hasobject:
        name = _NAME_OF.get(dtype.newbyteorder("<"))
    if name is None:
        raise TypeError(f"{where} has dtype {dtype}, which can't be saved; expected one of "
                        "safetensors' dtypes: bool, int8-64, uint8-64, float16/32/64, "
                        "bfloat16, complex64, float8_e4m3fn, float8_e5m2")
    return name


# --- writing --------------------------------------------------------------------------------
def write_safetensors(file: BinaryIO, tensors: Sequence[Tuple[str, Any]],
                      metadata: Mapping[str, str],
                      to_host: Callable[[Any], np.ndarray] = np.asarray) -> None:
    """Write ``tensors`` ((name, array) pairs, each array brought to the host by ``to_host``
    one at a time as it is written) and ``metadata`` to ``file`` (seekable, at its start).

    Checks the names, dtypes and the header's size first (TypeError, ValueError: nothing is
    written then). The data is laid out by itemsize, largest first, so each tensor starts
    on a multiple of its own."""
    entries: Dict[str, Dict[str, Any]] = {}
    for name, array in tensors:
        if not isinstance(name, str) or not name or name == "__metadata__" or name in entries:
            raise ValueError(f"write_safetensors: tensor name {name!r}: expected a new "
                             "non-empty str other than '__metadata__'")
        dtype = dtype_name(array.dtype, f"tensor {name!r}")
        entries[name] = {"dtype": dtype, "shape": [int(n) for n in array.shape]}
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, str) or key in _RESERVED:
            raise TypeError(f"write_safetensors: metadata {key!r}: expected str -> str, got "
                            f"{type(key).__name__} -> {type(value).__name__}" +
                            (" (a name this writer fills in)" if key in _RESERVED else ""))
    arrays = dict(tensors)
    order = sorted(entries, key=lambda name: -DTYPES[entries[name]["dtype"]].itemsize)
    offset = 0
    for name in order:
        entry = entries[name]
        end = offset + math.prod(entry["shape"]) * DTYPES[entry["dtype"]].itemsize
        entry["data_offsets"] = [offset, end]
        offset = end
    crcs = {name: 0 for name in entries}
    placeholder = _header_bytes(entries, metadata, crcs)  # as long as the final header
    if len(placeholder) - 8 > MAX_HEADER:
        raise ValueError(f"write_safetensors: the header would be {len(placeholder) - 8:,} "
                         f"bytes, over the format's limit of {MAX_HEADER:,}; store large "
                         "data as arrays rather than as metadata")
    file.write(placeholder)
    for name in order:
        crcs[name] = _write_tensor(file, to_host(arrays[name]), entries[name]["dtype"])
    header = _header_bytes(entries, metadata, crcs)
    if len(header) != len(placeholder):  # fixed-width CRCs: cannot happen
        raise RuntimeError("write_safetensors: the header changed length after the data")
    file.seek(0)
    file.write(header)
    file.seek(0, 2)


def _header_bytes(entries: Dict[str, Dict[str, Any]], metadata: Mapping[str, str],
                  crcs: Dict[str, int]) -> bytes:
    """The length and the header, padded with spaces to a multiple of 8 bytes."""
    meta = dict(metadata)
    meta["crc32"] = json.dumps({name: f"{crc:0{_CRC_WIDTH}x}" for name, crc in crcs.items()},
                               separators=(",", ":"))
    header: Dict[str, Any] = {"__metadata__": meta, **entries}
    meta["header_crc32"] = f"{_header_crc(header):0{_CRC_WIDTH}x}"
    text = json.dumps(header, separators=(",", ":")).encode("ascii")
    text += b" " * (-(8 + len(text)) % _ALIGN)
    return struct.pack("<Q", len(text)) + text


def _header_crc(header: Dict[str, Any]) -> int:
    """CRC-32 of ``header`` without its "header_crc32" entry, in a canonical JSON form."""
    meta = {k: v for k, v in header.get("__metadata__", {}).items() if k != "header_crc32"}
    canonical = dict(header, __metadata__=meta)
    return zlib.crc32(json.dumps(canonical, sort_keys=True, separators=(",", ":")).encode())


def _write_tensor(file: BinaryIO, array: np.ndarray, dtype: str) -> int:
    """Write ``array``'s bytes little-endian in C order; returns their CRC-32."""
    array = np.ascontiguousarray(array, dtype=DTYPES[dtype])  # a copy only when needed
    data = memoryview(array.reshape(-1).view(np.uint8))
    crc = 0
    for start in range(0, len(data), _CHUNK):
        chunk = data[start:start + _CHUNK]
        file.write(chunk)
        crc = zlib.crc32(chunk, crc)
    return crc


# --- reading --------------------------------------------------------------------------------
def read_header(file: BinaryIO, size: int) -> Header:
    """Read and check the header of ``file`` (``size`` bytes long), reading no tensor data.

    Raises NotSafetensorsError when the file does not begin like a safetensors file,
    TruncatedError when it ends before its header or data, and ValueError for a damaged
    header: an unknown dtype, a shape disagreeing with its offsets, tensors that overlap or
    leave a gap, bytes after the data, or a failed header CRC."""
    file.seek(0)
    head = file.read(8)
    if len(head) < 8:
        if int.from_bytes(head, "little") > MAX_HEADER or head[3:] != bytes(len(head[3:])):
            raise NotSafetensorsError(f"its {len(head)} bytes are not a header length")
        raise TruncatedError(f"it ends after {len(head)} bytes, inside its header length")
    length = struct.unpack("<Q", head)[0]
    first = file.read(1)
    if not 2 <= length <= MAX_HEADER or first not in (b"{", b""):
        raise NotSafetensorsError("its first 8 bytes are not the length of a JSON header")
    if 8 + length > size:
        raise TruncatedError(f"it ends at byte {size}, inside its {length}-byte header")
    text = first + file.read(length - 1)
    if len(text) != length:
        raise TruncatedError(f"it ends inside its {length}-byte header")
    try:
        header = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"its header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ValueError(f"its header is a JSON {type(header).__name__}, expected an object")
    metadata = header.get("__metadata__", {})
    if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise ValueError("its header's __metadata__ is not a map of str to str")
    tensors = {name: _tensor_info(name, entry) for name, entry in header.items()
               if name != "__metadata__"}
    data_size = _check_layout(tensors)
    data_start = 8 + length
    if data_start + data_size > size:
        raise TruncatedError(f"its header places {data_size} bytes of tensor data after byte "
                             f"{data_start}, but the file ends at byte {size}")
    if data_start + data_size < size:
        raise ValueError(f"it has {size - data_start - data_size} bytes after its tensors' "
                         "data")
    if "header_crc32" in metadata and _parse_crc(metadata["header_crc32"], "header_crc32") \
            != _header_crc(header):
        raise ValueError("its header fails its CRC check (the header_crc32 in its metadata)")
    return Header(tensors, metadata, data_start, _tensor_crcs(metadata, tensors))


def _tensor_info(name: str, entry: Any) -> TensorInfo:
    """One header entry checked: a known dtype, a shape of sizes, offsets that fit it."""
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise ValueError(f"tensor {name[:80]!r}: expected the keys dtype, shape and "
                         f"data_offsets, got {str(entry)[:80]}")
    dtype = DTYPES.get(entry["dtype"]) if isinstance(entry["dtype"], str) else None
    if dtype is None:
        raise ValueError(f"tensor {name[:80]!r}: unknown dtype {str(entry['dtype'])[:40]!r}")
    shape, offsets = entry["shape"], entry["data_offsets"]
    if not isinstance(shape, list) or not all(_is_size(n) for n in shape):
        raise ValueError(f"tensor {name[:80]!r}: expected the shape to be a list of sizes, "
                         f"got {str(shape)[:80]}")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(map(_is_size, offsets)):
        raise ValueError(f"tensor {name[:80]!r}: expected data_offsets [begin, end], got "
                         f"{str(offsets)[:80]}")
    nbytes = math.prod(shape) * dtype.itemsize
    if offsets[1] - offsets[0] != nbytes:
        raise ValueError(f"tensor {name[:80]!r}: {entry['dtype']} {tuple(shape)} is {nbytes} "
                         f"bytes, its data_offsets {offsets} hold {offsets[1] - offsets[0]}")
    return TensorInfo(dtype, tuple(shape), offsets[0], offsets[1])


def _is_size(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_layout(tensors: Dict[str, TensorInfo]) -> int:
    """The data section's size; ValueError unless the tensors cover it exactly from 0,
    without gaps or overlaps."""
    end, last = 0, None
    for name, info in sorted(tensors.items(), key=lambda item: (item[1].begin, item[1].end)):
        if info.begin < end:
            raise ValueError(f"tensors {last[:80]!r} and {name[:80]!r} overlap: bytes "
                             f"[{info.begin}, {end}) of the data are in both")
        if info.begin > end:
            raise ValueError(f"no tensor holds bytes [{end}, {info.begin}) of the data (the "
                             "format allows no gaps)")
        end, last = info.end, name
    return end


def _parse_crc(text: Any, where: str) -> int:
    if not isinstance(text, str) or len(text) != _CRC_WIDTH or \
            not all(c in "0123456789abcdef" for c in text):
        raise ValueError(f"its metadata's {where} is {str(text)[:40]!r}, expected "
                         f"{_CRC_WIDTH} hex digits")
    return int(text, 16)


def _tensor_crcs(metadata: Dict[str, str], tensors: Dict[str, TensorInfo]) -> Dict[str, int]:
    """The per-tensor CRCs the metadata records (none when it has no "crc32")."""
    if "crc32" not in metadata:
        return {}
    try:
        recorded = json.loads(metadata["crc32"])
    except json.JSONDecodeError:
        raise ValueError("its metadata's crc32 is not JSON") from None
    if not isinstance(recorded, dict) or set(recorded) != set(tensors):
        raise ValueError("its metadata's crc32 does not list exactly its tensors")
    return {name: _parse_crc(text, f"crc32 of {name[:80]!r}") for name, text in recorded.items()}


def read_tensor(file: BinaryIO, header: Header, name: str) -> np.ndarray:
    """Tensor ``name`` as a new writable array (its CRC checked when recorded); ValueError
    when it fails the check, TruncatedError when the file ends early."""
    info = header.tensors[name]
    array = np.empty(info.shape, info.dtype)
    buffer = memoryview(array.reshape(-1).view(np.uint8))
    file.seek(header.data_start + info.begin)
    done, crc = 0, 0
    while done < len(buffer):
        count = file.readinto(buffer[done:done + _CHUNK])
        if not count:
            raise TruncatedError(f"tensor {name[:80]!r} ends after {done} of {len(buffer)} "
                                 "bytes")
        crc = zlib.crc32(buffer[done:done + count], crc)
        done += count
    expected: Optional[int] = header.crc32.get(name)
    if expected is not None and crc != expected:
        raise ValueError(f"tensor {name[:80]!r} fails its CRC check (recorded {expected:08x}, "
                         f"read {crc:08x})")
    return array
