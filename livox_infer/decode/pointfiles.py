"""Point files: PCL ``.pcd`` (ascii, binary, binary_compressed) and KITTI-style ``.bin``.

Readers return the raw points (N, 4) float32 ``[x, y, z, intensity]`` exactly as stored (no
filtering; NaN and (0,0,0) points included); :func:`read_cloud_file` adds the decode filters and
returns a :class:`~livox_infer.decode.pointcloud.Cloud`. In .pcd files intensity comes from the field
``intensity`` (else ``reflectivity``, else ``i``; 0 if none); other fields are ignored; any SIZE /
TYPE combination PCL allows is read. ``binary_compressed`` uses LZF, implemented here in plain
Python (no extra dependency).
"""

from __future__ import annotations

import io
import logging
from pathlib import Path
from typing import Any

import numpy as np

from livox_infer.errors import PointCloudError
from livox_infer.decode.pointcloud import Cloud, DecodeFilter, filter_points

PCD_INTENSITY_FIELDS = ("intensity", "reflectivity", "i")
PCD_DATA_MODES = ("ascii", "binary", "binary_compressed")
_PCD_TYPES = {("F", 4): "<f4", ("F", 8): "<f8", ("I", 1): "i1", ("I", 2): "<i2", ("I", 4): "<i4", ("I", 8): "<i8",
              ("U", 1): "u1", ("U", 2): "<u2", ("U", 4): "<u4", ("U", 8): "<u8"}
_MAX_HEADER_BYTES = 1 << 16


# --------------------------------------------------------------------------- LZF


def lzf_decompress(data: bytes | memoryview, expected_size: int) -> bytes:
    """Decompress an LZF stream (liblzf format, as PCL's binary_compressed uses)."""
    src = bytes(data)
    out = bytearray()
    i, n = 0, len(src)
    try:
        while i < n:
            ctrl = src[i]
            i += 1
            if ctrl < 32:  # literal run of ctrl+1 bytes
                run = ctrl + 1
                if i + run > n:
                    raise PointCloudError("LZF stream truncated inside a literal run")
                out += src[i:i + run]
                i += run
                continue
            length = ctrl >> 5
            if length == 7:
                length += src[i]
                i += 1
            length += 2
            start = len(out) - (((ctrl & 0x1F) << 8) | src[i]) - 1
            i += 1
            if start < 0:
                raise PointCloudError("LZF back-reference points before the start of the output")
            if start + length <= len(out):
                out += out[start:start + length]
            else:  # overlapping copy repeats the last bytes
                for k in range(length):
                    out.append(out[start + k])
    except IndexError:
        raise PointCloudError("LZF stream truncated inside a back-reference") from None
    if len(out) != expected_size:
        raise PointCloudError(f"LZF data decompressed to {len(out)} bytes, header says {expected_size}")
    return bytes(out)


def lzf_compress(data: bytes) -> bytes:
    """Compress with LZF (greedy, 3-byte hash, 8 KiB window). Plain Python: ~1 MB/s."""
    src = bytes(data)
    n = len(src)
    out = bytearray()
    literal_start = 0
    table: dict[bytes, int] = {}
    i = 0

    def flush_literals(end: int) -> None:
        for s in range(literal_start, end, 32):
            chunk = src[s:min(s + 32, end)]
            out.append(len(chunk) - 1)
            out.extend(chunk)

    while i + 2 < n:
        key = src[i:i + 3]
        ref = table.get(key)
        table[key] = i
        if ref is not None and i - ref - 1 < 8192:
            length = 3
            limit = min(264, n - i)
            while length < limit and src[ref + length] == src[i + length]:
                length += 1
            flush_literals(i)
            offset = i - ref - 1
            encoded = length - 2
            if encoded < 7:
                out.append((encoded << 5) | (offset >> 8))
            else:
                out.append((7 << 5) | (offset >> 8))
                out.append(encoded - 7)
            out.append(offset & 0xFF)
            i += length
            literal_start = i
        else:
            i += 1
    flush_literals(n)
    return bytes(out)


# --------------------------------------------------------------------------- PCD


def _parse_pcd_header(blob: bytes, path: Path) -> tuple[dict[str, list[str]], int]:
    header: dict[str, list[str]] = {}
    pos = 0
    while True:
        end = blob.find(b"\n", pos)
        if end < 0 or end > _MAX_HEADER_BYTES:
            raise PointCloudError(f"{path}: no 'DATA' line in the PCD header")
        line = blob[pos:end].decode("ascii", errors="replace").strip()
        pos = end + 1
        if not line or line.startswith("#"):
            continue
        key, *values = line.split()
        header[key.upper()] = values
        if key.upper() == "DATA":
            return header, pos


def _pcd_layout(header: dict[str, list[str]], path: Path) -> tuple[list[tuple[str, str, int]], int]:
    """[(name, numpy dtype, count)] and the number of points."""
    names = header.get("FIELDS")
    if not names:
        raise PointCloudError(f"{path}: PCD header has no FIELDS line")
    sizes = header.get("SIZE")
    types = header.get("TYPE")
    counts = header.get("COUNT", ["1"] * len(names))
    if sizes is None or types is None or not (len(sizes) == len(types) == len(counts) == len(names)):
        raise PointCloudError(f"{path}: FIELDS/SIZE/TYPE/COUNT lines disagree in length or are missing")
    layout = []
    seen: dict[str, int] = {}
    for name, size, typ, count in zip(names, sizes, types, counts):
        try:
            dtype = _PCD_TYPES[(typ.upper(), int(size))]
            count_i = int(count)
        except (KeyError, ValueError):
            raise PointCloudError(f"{path}: unsupported PCD field {name!r} TYPE {typ} SIZE {size} COUNT {count}") from None
        if count_i < 1:
            raise PointCloudError(f"{path}: field {name!r} has COUNT {count_i}")
        if name in seen:  # PCL pads with repeated "_" fields
            seen[name] += 1
            name = f"{name}__{seen[name]}"
        else:
            seen[name] = 0
        layout.append((name, dtype, count_i))
    try:
        width = int(header.get("WIDTH", ["0"])[0])
        height = int(header.get("HEIGHT", ["1"])[0])
        points = int(header.get("POINTS", [str(width * height)])[0])
    except ValueError:
        raise PointCloudError(f"{path}: WIDTH/HEIGHT/POINTS are not integers") from None
    if points < 0 or points != width * height:
        raise PointCloudError(f"{path}: POINTS {points} != WIDTH*HEIGHT {width}*{height}")
    for axis in ("x", "y", "z"):
        entry = next((f for f in layout if f[0] == axis), None)
        if entry is None:
            raise PointCloudError(f"{path}: PCD lacks field {axis!r}; fields are {names}")
        if entry[2] != 1:
            raise PointCloudError(f"{path}: field {axis!r} has COUNT {entry[2]}, expected 1")
    return layout, points


_warned_no_intensity = False


def warn_no_intensity(path: Path, what: str) -> None:
    """Say once per process that a point file has no intensity: the detector then sees 0 for every point (its
    reflectivity channel carries nothing; boxes are worse than on the sensor's own clouds)."""
    global _warned_no_intensity
    if not _warned_no_intensity:
        _warned_no_intensity = True
        logging.getLogger("livox_infer.pointfiles").warning(
            "warning: %s has no intensity (%s): every point gets intensity 0, which the detector was not trained "
            "on; said once, later files may lack it too", path, what)


def _columns_to_points(columns: dict[str, np.ndarray], n: int, path: Path) -> np.ndarray:
    out = np.empty((n, 4), dtype=np.float32)
    out[:, 0], out[:, 1], out[:, 2] = columns["x"], columns["y"], columns["z"]
    name = next((f for f in PCD_INTENSITY_FIELDS if f in columns), None)
    if name is None:
        warn_no_intensity(path, f"fields {', '.join(columns)}; none of {', '.join(PCD_INTENSITY_FIELDS)}")
    out[:, 3] = 0.0 if name is None else (columns[name] if columns[name].ndim == 1 else columns[name][:, 0])
    return out


def read_pcd(path: str | Path) -> np.ndarray:
    """Read a .pcd file into (N, 4) float32 [x, y, z, intensity] (unfiltered)."""
    path = Path(path)
    blob = _read_bytes(path)
    header, start = _parse_pcd_header(blob, path)
    layout, n = _pcd_layout(header, path)
    mode = header["DATA"][0].lower() if header["DATA"] else ""
    record = np.dtype([(name, dt, (c,)) if c > 1 else (name, dt) for name, dt, c in layout])
    body = memoryview(blob)[start:]
    if mode == "binary":
        if len(body) < n * record.itemsize:
            raise PointCloudError(f"{path}: binary PCD holds {len(body)} bytes, {n} points need {n * record.itemsize}")
        rec = np.frombuffer(body, dtype=record, count=n)
        return _columns_to_points({name: rec[name] for name, _, _ in layout}, n, path)
    if mode == "binary_compressed":
        if len(body) < 8:
            raise PointCloudError(f"{path}: binary_compressed PCD lacks its size words")
        packed, unpacked = np.frombuffer(body[:8], dtype="<u4")
        if unpacked != n * record.itemsize or len(body) < 8 + packed:
            raise PointCloudError(f"{path}: binary_compressed sizes ({packed}, {unpacked}) do not fit {n} points")
        raw = lzf_decompress(body[8:8 + int(packed)], int(unpacked)) if n else b""
        columns, pos = {}, 0
        for name, dt, c in layout:  # data are stored field by field (structure of arrays)
            size = np.dtype(dt).itemsize * c * n
            col = np.frombuffer(raw, dtype=dt, count=n * c, offset=pos)
            columns[name] = col if c == 1 else col.reshape(n, c)
            pos += size
        return _columns_to_points(columns, n, path)
    if mode == "ascii":
        text = bytes(body).decode("ascii", errors="replace")
        width = sum(c for _, _, c in layout)
        try:
            values = np.loadtxt(io.StringIO(text), dtype=np.float64, ndmin=2) if text.strip() else np.zeros((0, width))
        except ValueError as exc:
            raise PointCloudError(f"{path}: malformed ascii PCD data: {exc}") from None
        if values.shape != (n, width):
            raise PointCloudError(f"{path}: ascii PCD has {values.shape[0]} rows x {values.shape[1]} values, "
                                  f"header says {n} x {width}")
        columns, col = {}, 0
        for name, _, c in layout:
            columns[name] = values[:, col] if c == 1 else values[:, col:col + c]
            col += c
        return _columns_to_points(columns, n, path)
    raise PointCloudError(f"{path}: unsupported PCD DATA mode {mode!r} (expected one of {PCD_DATA_MODES})")


def write_pcd(path: str | Path, points: Any, data: str = "binary") -> None:
    """Write (N, 3|4) points as a .pcd with float32 fields x y z intensity."""
    if data not in PCD_DATA_MODES:
        raise PointCloudError(f"data must be one of {PCD_DATA_MODES}, got {data!r}")
    pts = _as_points(points)
    n = pts.shape[0]
    header = (
        "# .PCD v0.7 - Point Cloud Data file format\nVERSION 0.7\nFIELDS x y z intensity\nSIZE 4 4 4 4\n"
        f"TYPE F F F F\nCOUNT 1 1 1 1\nWIDTH {n}\nHEIGHT 1\nVIEWPOINT 0 0 0 1 0 0 0\nPOINTS {n}\nDATA {data}\n"
    ).encode("ascii")
    if data == "binary":
        body = pts.tobytes()
    elif data == "ascii":
        buf = io.StringIO()
        np.savetxt(buf, pts, fmt="%.9g")  # 9 significant digits round-trip float32 exactly
        body = buf.getvalue().encode("ascii")
    else:
        raw = np.ascontiguousarray(pts.T).tobytes()  # structure of arrays, field by field
        packed = lzf_compress(raw)
        body = np.array([len(packed), len(raw)], dtype="<u4").tobytes() + packed
    Path(path).write_bytes(header + body)


# --------------------------------------------------------------------------- KITTI .bin


def read_bin(path: str | Path) -> np.ndarray:
    """Read a KITTI-style .bin (float32 N x 4 [x, y, z, intensity])."""
    path = Path(path)
    blob = _read_bytes(path)
    if len(blob) % 16:
        raise PointCloudError(f"{path}: {len(blob)} bytes is not a whole number of float32 x4 points (16 B)")
    return np.frombuffer(blob, dtype="<f4").reshape(-1, 4).copy()


def write_bin(path: str | Path, points: Any) -> None:
    """Write (N, 3|4) points as KITTI-style float32 N x 4."""
    Path(path).write_bytes(_as_points(points).astype("<f4").tobytes())


# --------------------------------------------------------------------------- helpers


def read_npy(path: str | Path) -> np.ndarray:
    """Read a NumPy .npy array of shape (N, 3|4) (x, y, z[, intensity]) as float32 N x 4; no pickles."""
    path = Path(path)
    try:
        arr = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise PointCloudError(f"point file not found: {path}") from None
    except (OSError, ValueError) as exc:
        raise PointCloudError(f"cannot read {path}: {exc}") from None
    if arr.ndim != 2 or arr.shape[1] < 3 or arr.dtype.kind not in "fiu":
        raise PointCloudError(f"{path}: expected a numeric (N, 3|4) array, got {arr.dtype} {arr.shape}")
    if arr.shape[1] == 3:
        warn_no_intensity(path, "an (N, 3) array")
    return _as_points(arr[:, :4])


def read_points_file(path: str | Path) -> np.ndarray:
    """Read a .pcd, .bin or .npy file by suffix into raw (N, 4) float32 points."""
    suffix = Path(path).suffix.lower()
    if suffix == ".pcd":
        return read_pcd(path)
    if suffix == ".bin":
        return read_bin(path)
    if suffix == ".npy":
        return read_npy(path)
    raise PointCloudError(f"{path}: unknown point file type {suffix!r} (expected .pcd, .bin or .npy)")


def read_cloud_file(path: str | Path, filters: DecodeFilter | None = None, frame_id: str = "livox_frame") -> Cloud:
    """Read a .pcd/.bin into a :class:`Cloud`, dropping no-return / non-finite points and applying ``filters``."""
    points, _, _ = filter_points(read_points_file(path), None, None, filters)
    return Cloud(points=points, time=None, tag=None, stamp_ns=0, frame_id=frame_id)


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise PointCloudError(f"point file not found: {path}") from None
    except OSError as exc:
        raise PointCloudError(f"cannot read {path}: {exc}") from None


def _as_points(points: Any) -> np.ndarray:
    pts = np.asarray(points, dtype=np.float32)
    if pts.ndim != 2 or pts.shape[1] not in (3, 4):
        raise PointCloudError(f"points must have shape (N, 3) or (N, 4), got {pts.shape}")
    if pts.shape[1] == 3:
        pts = np.concatenate([pts, np.zeros((pts.shape[0], 1), np.float32)], axis=1)
    return np.ascontiguousarray(pts)


__all__ = [
    "read_pcd", "write_pcd", "read_bin", "write_bin", "read_npy", "read_points_file", "read_cloud_file",
    "lzf_compress", "lzf_decompress",
]
