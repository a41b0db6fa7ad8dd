"""Skyhive's checkpoint files: safetensors with float32 tensors, string
metadata and a SHA-256 checksum (docs/checkpoint.md), read and written
without the safetensors package."""

import hashlib
import json
import os
import struct
import tempfile

import numpy as np

from .errors import ConfigError

# Bounds a reader checks before it allocates, as the Go reader does.
MAX_HEADER_BYTES = 100 << 20
MAX_RANK = 32
CHECKSUM_KEY = "skyhive.sha256"
_DOMAIN = b"skyhive-checkpoint-v1\n"


class CheckpointError(ConfigError):
    """The file is not a checkpoint this package can read: damaged,
    truncated, of another format, or its checksum does not match."""


def _u64(v):
    return struct.pack("<Q", v)


def _str(s):
    b = s.encode()
    return _u64(len(b)) + b


def _digest(entries, meta, data):
    """The checksum of docs/checkpoint.md over the header entries (name ->
    (shape, begin, end)), the metadata and the data buffer."""
    h = hashlib.sha256(_DOMAIN + _u64(len(entries)))
    for name in sorted(entries, key=str.encode):
        shape, begin, end = entries[name]
        h.update(_str(name) + _str("F32") + _u64(len(shape)) + b"".join(_u64(d) for d in shape))
        h.update(_u64(begin) + _u64(end))
    rest = {k: v for k, v in meta.items() if k != CHECKSUM_KEY}
    h.update(_u64(len(rest)))
    for k in sorted(rest, key=str.encode):
        h.update(_str(k) + _str(rest[k]))
    h.update(data)
    return h.hexdigest()


class Checkpoint:
    """A decoded checkpoint: tensors (name -> float32 numpy array), meta
    (the string metadata without the checksum) and verified (whether it
    carried a checksum and it matched)."""

    def __init__(self, tensors, meta, verified):
        self.tensors, self.meta, self.verified = tensors, meta, verified


def load(path, require_verified=True):
    """Reads a checkpoint, checking every offset and shape before it
    allocates. A file without a valid Skyhive checksum is refused unless
    require_verified is False."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{path}: truncated: {size} bytes, not even a header length")
        n = struct.unpack("<Q", head)[0]
        if n > MAX_HEADER_BYTES or 8 + n > size:
            raise CheckpointError(f"{path}: header of {n} bytes in a file of {size}")
        try:
            header = json.loads(f.read(n), object_pairs_hook=_no_duplicates)
        except (ValueError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{path}: bad header: {e}") from None
        if not isinstance(header, dict):
            raise CheckpointError(f"{path}: the header is not a JSON object")
        meta = header.pop("__metadata__", {}) or {}
        if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
            raise CheckpointError(f"{path}: __metadata__ must map strings to strings")
        avail = size - 8 - n
        entries, spans = {}, []
        for name, e in header.items():
            if not isinstance(e, dict) or e.get("dtype") != "F32":
                raise CheckpointError(f"{path}: tensor {name!r} is not F32 (Skyhive writes float32 only)")
            shape, offs = e.get("shape"), e.get("data_offsets")
            if (not isinstance(shape, list) or len(shape) > MAX_RANK
                    or not all(isinstance(d, int) and d >= 0 for d in shape)
                    or not isinstance(offs, list) or len(offs) != 2
                    or not all(isinstance(o, int) and 0 <= o <= avail for o in offs) or offs[0] > offs[1]):
                raise CheckpointError(f"{path}: tensor {name!r} has a bad shape or offsets: {e}")
            if 4 * int(np.prod(shape, dtype=object)) != offs[1] - offs[0]:
                raise CheckpointError(f"{path}: tensor {name!r} of shape {shape} spans {offs[1] - offs[0]} bytes")
            entries[name] = (shape, offs[0], offs[1])
            spans.append((offs[0], offs[1]))
        end = 0
        for b, e in sorted(spans):
            if b != end:
                raise CheckpointError(f"{path}: the tensors' data do not tile the buffer (gap or overlap at byte {b})")
            end = e
        if end != avail:
            raise CheckpointError(f"{path}: {avail - end} bytes after the last tensor")
        data = f.read(avail)
    if len(data) != avail:
        raise CheckpointError(f"{path}: truncated data buffer")
    want = meta.pop(CHECKSUM_KEY, None)
    verified = want is not None and _digest(entries, meta, data) == want
    if want is not None and not verified:
        raise CheckpointError(f"{path}: checksum mismatch: the file is damaged")
    if require_verified and not verified:
        raise CheckpointError(f"{path} has no Skyhive checksum; load it with require_verified=False to accept it")
    tensors = {name: np.frombuffer(data, dtype="<f4", count=(e - b) // 4, offset=b).reshape(shape).copy()
               for name, (shape, b, e) in entries.items()}
    return Checkpoint(tensors, meta, verified)


def _no_duplicates(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise ValueError(f"duplicate key {k!r}")
        d[k] = v
    return d


def save(path, tensors, meta):
    """Writes tensors (name -> array-like of float32 values) and meta
    (string -> string) as a Skyhive checkpoint with its checksum, replacing
    path atomically: it holds the old file or the complete new one."""
    arrays = {k: np.ascontiguousarray(np.asarray(v, dtype="<f4")) for k, v in tensors.items()}
    entries, header, off = {}, {}, 0
    for name in sorted(arrays, key=str.encode):
        a = arrays[name]
        entries[name] = (list(a.shape), off, off + a.nbytes)
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
    data = b"".join(arrays[name].tobytes() for name in sorted(arrays, key=str.encode))
    meta = {str(k): str(v) for k, v in meta.items() if k != CHECKSUM_KEY}
    header["__metadata__"] = dict(meta, **{CHECKSUM_KEY: _digest(entries, meta, data)})
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, prefix="." + os.path.basename(path) + ".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_u64(len(hb)) + hb + data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
