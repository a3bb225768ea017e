"""PointCloud2 decoding / encoding without ROS.

``decode_pointcloud2`` accepts anything shaped like ``sensor_msgs/msg/PointCloud2``: an rclpy
message (``data`` is an ``array.array('B')``), a rosbags message (``data`` is a numpy uint8
array) or a :class:`PointCloud2Data`. Fields are located **by name and offset** through a
strided numpy view of the raw buffer, so any field order, per-point padding, row padding and
``height > 1`` decode the same way, and nothing is copied until the filtered output is built.

Output is a :class:`Cloud`: points (N, 4) float32 ``[x, y, z, intensity]`` (C-contiguous),
optional per-point time in seconds relative to the frame start (float64), optional Livox tag
(uint8). (0, 0, 0) no-return points and non-finite points are always dropped; a
:class:`DecodeFilter` adds the Livox tag-noise filter, a range window and an axis-aligned ROI.

Time rule (first field present wins: ``timestamp``, ``time``, ``t``, ``offset_time``,
``time_stamp``):
  * integer fields hold nanoseconds; float fields hold seconds, except that float values above
    1e12 can only be nanoseconds (the Livox ROS driver 2 writes absolute ns into a float64
    ``timestamp``);
  * values above 1e6 s (about 11.6 days) are absolute times: they are made relative to the
    header stamp when all of them lie within 10 s of it, otherwise to the earliest point time of
    the message (a header stamped from another clock must not give nonsense offsets);
  * smaller values are already offsets from the frame start and are kept as they are.
"""

from __future__ import annotations

import functools
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

from livox_infer.errors import ConfigError, PointCloudError

# sensor_msgs/msg/PointField datatype codes
INT8 = 1
UINT8 = 2
INT16 = 3
UINT16 = 4
INT32 = 5
UINT32 = 6
FLOAT32 = 7
FLOAT64 = 8

# Little-endian only: big-endian clouds are rejected up front.
DATATYPE_DTYPES: dict[int, np.dtype] = {
    INT8: np.dtype("i1"),
    UINT8: np.dtype("u1"),
    INT16: np.dtype("<i2"),
    UINT16: np.dtype("<u2"),
    INT32: np.dtype("<i4"),
    UINT32: np.dtype("<u4"),
    FLOAT32: np.dtype("<f4"),
    FLOAT64: np.dtype("<f8"),
}
DATATYPE_NAMES = {
    INT8: "INT8", UINT8: "UINT8", INT16: "INT16", UINT16: "UINT16",
    INT32: "INT32", UINT32: "UINT32", FLOAT32: "FLOAT32", FLOAT64: "FLOAT64",
}

INTENSITY_FIELDS = ("intensity", "reflectivity")
TIME_FIELDS = ("timestamp", "time", "t", "offset_time", "time_stamp")
TAG_FIELD = "tag"

TAG_FILTER_MODES = ("off", "high_confidence", "strict")

_ABSOLUTE_TIME_S = 1e6  # seconds; larger point times are wall-clock / epoch times
_FLOAT_NS_THRESHOLD = 1e12  # float point times above this can only be nanoseconds
_STAMP_WINDOW_S = 10.0
_XYZI_RECORD = np.dtype("V16")  # four float32 moved as one opaque record


@dataclass(frozen=True)
class PointField:
    """One entry of ``PointCloud2.fields`` (same attribute names as sensor_msgs)."""

    name: str
    offset: int
    datatype: int
    count: int = 1


@dataclass
class PointCloud2Data:
    """A ROS-free PointCloud2 with the message's fields (header flattened to stamp + frame_id)."""

    stamp_sec: int = 0
    stamp_nanosec: int = 0
    frame_id: str = ""
    height: int = 1
    width: int = 0
    fields: list[PointField] = field(default_factory=list)
    is_bigendian: bool = False
    point_step: int = 0
    row_step: int = 0
    data: bytes = b""
    is_dense: bool = True

    @property
    def stamp_ns(self) -> int:
        return int(self.stamp_sec) * 1_000_000_000 + int(self.stamp_nanosec)


@dataclass
class Cloud:
    """A decoded scan. ``points`` (N, 4) float32 [x, y, z, intensity], C-contiguous;
    ``time`` (N,) float64 seconds from the frame start or None; ``tag`` (N,) uint8 or None."""

    points: np.ndarray
    time: np.ndarray | None = None
    tag: np.ndarray | None = None
    stamp_ns: int = 0
    frame_id: str = ""

    def __len__(self) -> int:
        return int(self.points.shape[0])


@dataclass(frozen=True)
class DecodeFilter:
    """Point filters applied while decoding (all optional; no-return and non-finite points are
    dropped regardless).

    tag_filter (Livox ``tag`` byte: bits 0-1 noise flag from spatial position, bits 2-3 noise
    flag from intensity, each 00 normal / 01 high / 10 moderate / 11 low confidence of noise
    (11 is reserved for intensity), bits 4-5 return number):
      * ``"off"``: keep every point;
      * ``"high_confidence"``: drop points flagged 01 (high-confidence noise) in bits 0-1 or 2-3;
      * ``"strict"``: keep only points with bits 0-3 all zero (as Livox recommends).
      Clouds without a ``tag`` field are not tag-filtered.
    min_range / max_range: euclidean distance window in metres (inclusive).
    x_min ... z_max: axis-aligned crop box in the cloud's frame (inclusive bounds).
    """

    tag_filter: str = "off"
    min_range: float | None = None
    max_range: float | None = None
    x_min: float | None = None
    x_max: float | None = None
    y_min: float | None = None
    y_max: float | None = None
    z_min: float | None = None
    z_max: float | None = None

    def __post_init__(self) -> None:
        if self.tag_filter not in TAG_FILTER_MODES:
            raise ConfigError(f"tag_filter must be one of {TAG_FILTER_MODES}, got {self.tag_filter!r}")
        for name in ("min_range", "max_range", "x_min", "x_max", "y_min", "y_max", "z_min", "z_max"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, numbers.Real) or isinstance(value, bool)
                                      or math.isnan(value)):
                raise ConfigError(f"DecodeFilter.{name} must be a number or None, got {value!r}")
        if self.min_range is not None and self.min_range < 0:
            raise ConfigError(f"DecodeFilter.min_range must be >= 0, got {self.min_range}")
        for lo, hi in (("min_range", "max_range"), ("x_min", "x_max"), ("y_min", "y_max"), ("z_min", "z_max")):
            a, b = getattr(self, lo), getattr(self, hi)
            if a is not None and b is not None and a > b:
                raise ConfigError(f"DecodeFilter.{lo} ({a}) is greater than {hi} ({b})")

    @classmethod
    def from_roi(cls, roi: Sequence[float] | None, **kwargs: Any) -> "DecodeFilter":
        """Build from an ROI given as ``(x_min, y_min, z_min, x_max, y_max, z_max)`` (or None)."""
        if roi is None:
            return cls(**kwargs)
        values = [float(v) for v in roi]
        if len(values) != 6:
            raise ConfigError(f"roi must have 6 numbers (x_min, y_min, z_min, x_max, y_max, z_max), got {len(values)}")
        x0, y0, z0, x1, y1, z1 = values
        return cls(x_min=x0, y_min=y0, z_min=z0, x_max=x1, y_max=y1, z_max=z1, **kwargs)

    @property
    def is_noop(self) -> bool:
        return self.tag_filter == "off" and all(
            getattr(self, n) is None
            for n in ("min_range", "max_range", "x_min", "x_max", "y_min", "y_max", "z_min", "z_max")
        )


# Point budget (pipeline parameter ``max_points``, node parameter of the same name): a cloud with more
# points than this after the filters is thinned to exactly this many, so no stage (ground estimate,
# voxelizer, refiner) ever works on more. 200k is ~8 Livox frames at 10 Hz (Avia: ~24k points per frame):
# room for accumulated or multi-sensor clouds, small enough to bound a frame's time and memory
# (docs/detector.md, "Point budget").
DEFAULT_MAX_POINTS = 200_000
MAX_POINTS_RANGE = (1_000, 5_000_000)


def check_max_points(value: Any) -> int:
    """``value`` as a point budget, or ConfigError."""
    lo, hi = MAX_POINTS_RANGE
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not lo <= value <= hi:
        raise ConfigError(f"max_points must be an integer in [{lo}, {hi}], got {value!r}")
    return int(value)


def limit_points(cloud: "Cloud", max_points: int) -> tuple["Cloud", int]:
    """``cloud`` thinned to at most ``max_points`` points, and how many were dropped.

    Deterministic: the kept points are evenly spaced in message order (a Livox cloud is in firing order,
    so this is an even thinning in time and over the scan pattern); the same cloud always gives the same
    subset. A cloud within the budget is returned as it is."""
    n = len(cloud)
    if n <= max_points:
        return cloud, 0
    keep = (np.arange(max_points, dtype=np.int64) * n) // max_points  # strictly increasing, first point kept
    take = lambda a: None if a is None else a.take(keep, axis=0)  # noqa: E731
    return Cloud(take(cloud.points), take(cloud.time), take(cloud.tag), cloud.stamp_ns, cloud.frame_id), n - max_points


# --------------------------------------------------------------------------- decoding


@dataclass(frozen=True)
class _Plan:
    """Where the wanted columns sit inside one point, resolved once per field layout."""

    xyz: tuple[tuple[int, np.dtype], tuple[int, np.dtype], tuple[int, np.dtype]]
    intensity: tuple[int, np.dtype] | None
    time: tuple[str, int, np.dtype] | None
    tag: tuple[int, np.dtype] | None
    xyzi_base: int | None  # offset of x when x, y, z, intensity are consecutive float32


def _field_key(fields: Iterable[Any]) -> tuple[tuple[str, int, int, int], ...]:
    try:
        return tuple((str(f.name), int(f.offset), int(f.datatype), int(f.count)) for f in fields)
    except (AttributeError, TypeError, ValueError) as exc:
        raise PointCloudError(f"PointCloud2.fields is not a list of PointField-like objects: {exc}") from None


@functools.lru_cache(maxsize=64)
def _make_plan(fields: tuple[tuple[str, int, int, int], ...], point_step: int) -> _Plan:
    by_name: dict[str, tuple[int, int, int]] = {}
    for name, offset, datatype, count in fields:
        if name in by_name:
            raise PointCloudError(f"field {name!r} appears more than once in PointCloud2.fields")
        by_name[name] = (offset, datatype, count)
        if offset < 0:
            raise PointCloudError(f"field {name!r} has a negative offset {offset}")
        dtype = DATATYPE_DTYPES.get(datatype)
        if dtype is not None and count > 0 and offset + dtype.itemsize * count > point_step:
            raise PointCloudError(
                f"field {name!r} ({DATATYPE_NAMES[datatype]} x{count} at offset {offset}) extends beyond "
                f"point_step {point_step}: point_step is smaller than the fields"
            )

    def column(name: str) -> tuple[int, np.dtype]:
        offset, datatype, count = by_name[name]
        dtype = DATATYPE_DTYPES.get(datatype)
        if dtype is None:
            raise PointCloudError(f"field {name!r} has unsupported datatype {datatype} (expected 1..8)")
        if count != 1:
            raise PointCloudError(f"field {name!r} has count {count}; only count == 1 is supported")
        return offset, dtype

    missing = [n for n in ("x", "y", "z") if n not in by_name]
    if missing:
        raise PointCloudError(
            f"PointCloud2 lacks field(s) {', '.join(missing)}; fields are {[f[0] for f in fields]}"
        )
    xyz = (column("x"), column("y"), column("z"))
    intensity_name = next((n for n in INTENSITY_FIELDS if n in by_name), None)
    intensity = column(intensity_name) if intensity_name else None
    time_name = next((n for n in TIME_FIELDS if n in by_name), None)
    time = (time_name, *column(time_name)) if time_name else None
    tag = column(TAG_FIELD) if TAG_FIELD in by_name else None
    if tag is not None and tag[1].kind not in "ui":
        raise PointCloudError(f"field 'tag' must be an integer type, got {tag[1]}")

    f32 = DATATYPE_DTYPES[FLOAT32]
    base = xyz[0][0]
    consecutive = (
        intensity is not None
        and all(dt == f32 for _, dt in (*xyz, intensity))
        and [xyz[1][0], xyz[2][0], intensity[0]] == [base + 4, base + 8, base + 12]
    )
    return _Plan(xyz=xyz, intensity=intensity, time=time, tag=tag, xyzi_base=base if consecutive else None)


def _as_bytes_buffer(data: Any) -> np.ndarray:
    """A flat uint8 view of ``data`` (bytes, bytearray, memoryview, array.array('B'), numpy)."""
    if isinstance(data, np.ndarray):
        if data.dtype != np.uint8:
            raise PointCloudError(f"PointCloud2.data must hold uint8, got numpy dtype {data.dtype}")
        return np.ascontiguousarray(data).reshape(-1)  # a strided view (data[::2]) is copied, not refused untyped
    try:
        view = memoryview(data)
        if view.itemsize != 1:
            raise PointCloudError(f"PointCloud2.data must be a byte buffer, got item size {view.itemsize}")
        return np.frombuffer(view if view.ndim == 1 and view.format == "B" else view.cast("B"), dtype=np.uint8)
    except (TypeError, BufferError) as exc:  # not a buffer, or a non-contiguous one
        raise PointCloudError(f"PointCloud2.data of type {type(data).__name__} is not a byte buffer: {exc}") from None


def _header(msg: Any) -> tuple[int, str]:
    try:
        if isinstance(msg, PointCloud2Data):
            return msg.stamp_ns, str(msg.frame_id)
        header = msg.header
        stamp = header.stamp
        return int(stamp.sec) * 1_000_000_000 + int(stamp.nanosec), str(header.frame_id)
    except (AttributeError, TypeError, ValueError, OverflowError) as exc:  # duck-typed input: any attribute value
        raise PointCloudError(f"object of type {type(msg).__name__} has no valid PointCloud2 header: "
                              f"{type(exc).__name__}: {exc}") from None


def check_geometry(msg: Any) -> tuple[int, int, int, int]:
    """(height, width, point_step, row_step) of a PointCloud2-shaped object, or PointCloudError when they cannot
    describe a cloud (negative, point_step 0, width * point_step beyond row_step, big-endian)."""
    return _geometry(msg)


def _geometry(msg: Any) -> tuple[int, int, int, int]:
    try:
        height, width = int(msg.height), int(msg.width)
        point_step, row_step = int(msg.point_step), int(msg.row_step)
        bigendian = bool(msg.is_bigendian)
    except (AttributeError, TypeError, ValueError, OverflowError) as exc:  # duck-typed input: any attribute value
        raise PointCloudError(f"object of type {type(msg).__name__} has no valid PointCloud2 geometry: "
                              f"{type(exc).__name__}: {exc}") from None
    if bigendian:
        raise PointCloudError("big-endian PointCloud2 (is_bigendian=True) is not supported")
    if height < 0 or width < 0 or point_step < 0 or row_step < 0:
        raise PointCloudError(
            f"negative PointCloud2 geometry: height={height} width={width} point_step={point_step} row_step={row_step}"
        )
    if height * width > 0:
        if point_step == 0:
            raise PointCloudError("point_step is 0 for a non-empty PointCloud2")
        if row_step < width * point_step:
            raise PointCloudError(
                f"row_step {row_step} is smaller than width*point_step = {width}*{point_step} = {width * point_step}"
            )
    return height, width, point_step, row_step


def _strided(buf: np.ndarray, offset: int, dtype: np.dtype, height: int, width: int,
             point_step: int, row_step: int, inner: tuple[int, ...] = ()) -> np.ndarray:
    """Zero-copy view of one column (or ``inner`` consecutive columns) as a flat array."""
    shape = (height, width, *inner)
    strides = (row_step, point_step, *([dtype.itemsize] if inner else []))
    view = np.ndarray(shape, dtype=dtype, buffer=buf, offset=offset, strides=strides)
    if height == 1:
        return view[0]
    return view.reshape(height * width, *inner)  # copies only when rows are padded


def _points_to_seconds(column: np.ndarray, keep: np.ndarray | None, dtype: np.dtype, stamp_ns: int) -> np.ndarray:
    """Seconds from the frame start for the kept points (rule in the module docstring).

    Units and absolute/relative are judged on the kept points; the earliest-point fallback looks
    at every point of the message so that filters do not move the frame start."""
    kept = _take(column, keep)
    if kept.size == 0:
        return kept.astype(np.float64)
    if dtype.kind in "ui":
        peak_s = float(kept.max()) * 1e-9
        scale = 1e-9
    else:
        with np.errstate(invalid="ignore"):
            peak = float(np.fmax.reduce(np.abs(kept), initial=0.0))
        scale = 1e-9 if peak > _FLOAT_NS_THRESHOLD else 1.0
        peak_s = peak * scale
    if peak_s <= _ABSOLUTE_TIME_S:
        return kept.astype(np.float64) * scale if scale != 1.0 else kept.astype(np.float64)
    stamp = stamp_ns * 1e-9 / scale  # header stamp in the column's unit
    window = _STAMP_WINDOW_S / scale
    if dtype.kind in "ui":
        lo, hi = int(kept.min()), int(kept.max())
        if stamp_ns > 0 and stamp - window <= lo and hi <= stamp + window:
            return (kept.astype(np.int64) - stamp_ns).astype(np.float64) * 1e-9  # exact integer subtraction
        return (kept.astype(np.int64) - int(column.min())).astype(np.float64) * 1e-9
    with np.errstate(invalid="ignore"):
        lo, hi = float(np.fmin.reduce(kept)), float(np.fmax.reduce(kept))
    if stamp_ns > 0 and stamp - window <= lo and hi <= stamp + window:
        return (kept.astype(np.float64) - stamp) * scale
    with np.errstate(invalid="ignore"):
        first = float(np.fmin.reduce(column))
    return (kept.astype(np.float64) - first) * scale


def _filter_mask(x: np.ndarray, y: np.ndarray, z: np.ndarray, intensity: np.ndarray | None,
                 tag: np.ndarray | None, filters: DecodeFilter | None) -> np.ndarray:
    """Keep-mask over contiguous columns (contiguous float32 runs ~5x faster than strided)."""
    if filters is not None and not isinstance(filters, DecodeFilter):
        raise ConfigError(f"filters must be a DecodeFilter or None, got {type(filters).__name__}")
    with np.errstate(over="ignore", invalid="ignore"):
        r2 = x * x
        r2 += y * y
        r2 += z * z
    # r2 > 0 drops (0,0,0) and NaN; r2 < inf drops +-inf and coordinates beyond ~1.8e19 m
    # (whose square overflows float32: no sensor measures that, so they are garbage too).
    lo2, hi2 = 0.0, np.inf
    if filters is not None:
        if filters.min_range is not None and filters.min_range > 0:
            lo2 = float(filters.min_range) ** 2
        if filters.max_range is not None:
            hi2 = float(filters.max_range) ** 2
    mask = (r2 >= lo2) if lo2 > 0 else (r2 > 0)
    mask &= (r2 <= hi2) if hi2 != np.inf else (r2 < np.inf)
    if intensity is not None and intensity.dtype.kind == "f":
        mask &= np.isfinite(intensity)
    if filters is None:
        return mask
    for col, lo, hi in ((x, filters.x_min, filters.x_max), (y, filters.y_min, filters.y_max),
                        (z, filters.z_min, filters.z_max)):
        if lo is not None:
            mask &= col >= lo
        if hi is not None:
            mask &= col <= hi
    if tag is not None and filters.tag_filter != "off":
        mask &= tag_keep_mask(tag, filters.tag_filter)
    return mask


def _keep_index(mask: np.ndarray) -> np.ndarray | None:
    """Indices of kept points, or None when all are kept. ``take`` with an index array is
    several times faster than boolean indexing when the mask is irregular (ROI, tag noise)."""
    return None if mask.all() else np.flatnonzero(mask)


def _take(array: np.ndarray, keep: np.ndarray | None) -> np.ndarray:
    return array if keep is None else array.take(keep, axis=0)


def tag_keep_mask(tag: np.ndarray, mode: str) -> np.ndarray:
    """Boolean mask of points to keep under the Livox tag filter ``mode`` (see DecodeFilter)."""
    tag = np.asarray(tag).astype(np.uint8, copy=False)
    if mode == "off":
        return np.ones(tag.shape, dtype=bool)
    if mode == "strict":
        return (tag & 0x0F) == 0
    if mode == "high_confidence":
        return ((tag & 0x03) != 0x01) & ((tag & 0x0C) != 0x04)
    raise ConfigError(f"tag_filter must be one of {TAG_FILTER_MODES}, got {mode!r}")


def filter_points(points: np.ndarray, time: np.ndarray | None = None, tag: np.ndarray | None = None,
                  filters: DecodeFilter | None = None) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Apply the decode filters to already-decoded arrays (CustomMsg, .pcd, simulator output).
    Returns fresh arrays (points (K,4) float32 C-contiguous, time, tag)."""
    points = np.ascontiguousarray(points, dtype=np.float32)
    if points.ndim != 2 or points.shape[1] != 4:
        raise PointCloudError(f"points must have shape (N, 4), got {points.shape}")
    n = points.shape[0]
    for name, arr in (("time", time), ("tag", tag)):
        if arr is not None and np.shape(arr) != (n,):
            raise PointCloudError(f"{name} must have shape ({n},), got {np.shape(arr)}")
    columns = np.ascontiguousarray(points.T)
    mask = _filter_mask(columns[0], columns[1], columns[2], columns[3],
                        None if tag is None else np.asarray(tag), filters)
    keep = np.flatnonzero(mask)  # always copy: the caller's arrays are not handed back
    return (points.take(keep, axis=0), None if time is None else np.asarray(time).take(keep),
            None if tag is None else np.asarray(tag).take(keep))


def filter_columns(columns: np.ndarray, tag: np.ndarray | None = None, filters: DecodeFilter | None = None,
                   float_intensity: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
    """Filter column-major float32 ``columns`` (4, N) [x, y, z, intensity] (the fastest input form).

    Returns (points (K, 4) float32 C-contiguous, kept indices or None when every point is kept), so
    callers can pick the matching time/tag entries with ``take``."""
    keep = _keep_index(_filter_mask(columns[0], columns[1], columns[2], columns[3] if float_intensity else None,
                                    tag, filters))
    # per-column fill then a row take: ~3x faster than ascontiguousarray((4, N).T) or per-column takes
    points = np.empty((columns.shape[1], 4), dtype=np.float32)
    for col in range(4):
        points[:, col] = columns[col]
    return _take(points, keep), keep


def check_pointcloud2(msg: Any):
    """Header, geometry, fields and data size of a PointCloud2-shaped object, without reading any point:
    raises PointCloudError for a cloud `decode_pointcloud2` would reject for its layout. Cheap enough for a
    subscription callback (a malformed cloud must not take a valid one's place in the node's queue).
    Returns (stamp_ns, frame_id, geometry, plan, buffer) for the decoder."""
    stamp_ns, frame_id = _header(msg)
    height, width, point_step, row_step = _geometry(msg)
    try:
        raw_fields = msg.fields
    except AttributeError:
        raise PointCloudError(f"object of type {type(msg).__name__} has no 'fields'") from None
    plan = _make_plan(_field_key(raw_fields), point_step)
    try:
        buf = _as_bytes_buffer(msg.data)
    except AttributeError:
        raise PointCloudError(f"object of type {type(msg).__name__} has no 'data'") from None
    if buf.size != row_step * height:
        raise PointCloudError(
            f"PointCloud2.data has {buf.size} bytes but row_step*height = {row_step}*{height} = {row_step * height}"
        )
    return stamp_ns, frame_id, (height, width, point_step, row_step), plan, buf


def decode_pointcloud2(msg: Any, *, filters: DecodeFilter | None = None) -> Cloud:
    """Decode a PointCloud2-shaped object into a :class:`Cloud` (see module docstring)."""
    stamp_ns, frame_id, (height, width, point_step, row_step), plan, buf = check_pointcloud2(msg)
    n = height * width
    if n == 0:
        return Cloud(np.zeros((0, 4), np.float32), None if plan.time is None else np.zeros(0, np.float64),
                     None if plan.tag is None else np.zeros(0, np.uint8), stamp_ns, frame_id)

    geom = (height, width, point_step, row_step)
    tag = None if plan.tag is None else _strided(buf, plan.tag[0], plan.tag[1], *geom).astype(np.uint8)
    if plan.xyzi_base is not None:
        # x, y, z, intensity are 16 consecutive bytes: copy them as one 16-byte record per point,
        # then a column-major copy for the mask arithmetic
        pts = np.array(_strided(buf, plan.xyzi_base, _XYZI_RECORD, *geom)).view(np.float32).reshape(n, 4)
        columns = np.ascontiguousarray(pts.T)
        keep = _keep_index(_filter_mask(columns[0], columns[1], columns[2], columns[3], tag, filters))
        points = _take(pts, keep)  # pts is already a private copy
    else:
        columns = np.empty((4, n), dtype=np.float32)
        for col, (offset, dtype) in enumerate(plan.xyz):
            columns[col] = _strided(buf, offset, dtype, *geom)
        intensity = None
        if plan.intensity is None:
            columns[3] = 0.0
        else:
            intensity = _strided(buf, plan.intensity[0], plan.intensity[1], *geom)
            columns[3] = intensity
        points, keep = filter_columns(columns, tag, filters,
                                      float_intensity=intensity is not None and intensity.dtype.kind == "f")
    time = None
    if plan.time is not None:
        _, offset, dtype = plan.time
        time = _points_to_seconds(_strided(buf, offset, dtype, *geom), keep, dtype, stamp_ns)
    return Cloud(points=points, time=time, tag=None if tag is None else _take(tag, keep),
                 stamp_ns=stamp_ns, frame_id=frame_id)


# --------------------------------------------------------------------------- encoding

LAYOUTS: dict[str, tuple[PointField, ...]] = {
    # livox_ros_driver (v1) PointCloud2: x y z intensity f32, tag u8, line u8, packed 18 B
    "livox": (
        PointField("x", 0, FLOAT32), PointField("y", 4, FLOAT32), PointField("z", 8, FLOAT32),
        PointField("intensity", 12, FLOAT32), PointField("tag", 16, UINT8), PointField("line", 17, UINT8),
    ),
    # livox_ros_driver2 PointCloud2: v1 + absolute float64 timestamp (ns), 26 B
    "livox2": (
        PointField("x", 0, FLOAT32), PointField("y", 4, FLOAT32), PointField("z", 8, FLOAT32),
        PointField("intensity", 12, FLOAT32), PointField("tag", 16, UINT8), PointField("line", 17, UINT8),
        PointField("timestamp", 18, FLOAT64),
    ),
    "xyzi": (
        PointField("x", 0, FLOAT32), PointField("y", 4, FLOAT32), PointField("z", 8, FLOAT32),
        PointField("intensity", 12, FLOAT32),
    ),
    # Autoware PointXYZIRC: intensity u8, return_type u8, channel u16
    "xyzirc": (
        PointField("x", 0, FLOAT32), PointField("y", 4, FLOAT32), PointField("z", 8, FLOAT32),
        PointField("intensity", 12, UINT8), PointField("return_type", 13, UINT8), PointField("channel", 14, UINT16),
    ),
}
LAYOUT_POINT_STEP = {"livox": 18, "livox2": 26, "xyzi": 16, "xyzirc": 16}


def layout_dtype(layout: str) -> np.dtype:
    """The numpy structured dtype of one point of an encode layout."""
    if layout not in LAYOUTS:
        raise ConfigError(f"unknown PointCloud2 layout {layout!r}; choose one of {sorted(LAYOUTS)}")
    fields = LAYOUTS[layout]
    return np.dtype({
        "names": [f.name for f in fields],
        "formats": [DATATYPE_DTYPES[f.datatype] for f in fields],
        "offsets": [f.offset for f in fields],
        "itemsize": LAYOUT_POINT_STEP[layout],
    })


def _column_arg(value: Any, n: int, name: str, dtype: Any) -> np.ndarray | None:
    if value is None:
        return None
    arr = np.asarray(value)
    if arr.shape != (n,):
        raise PointCloudError(f"{name} must have shape ({n},), got {arr.shape}")
    return arr.astype(dtype, copy=False)


def encode_pointcloud2(points: Any, layout: str = "livox", *, time: Any = None, tag: Any = None,
                       line: Any = None, stamp_ns: int = 0, frame_id: str = "livox_frame") -> PointCloud2Data:
    """Pack points (N, 3|4) into a :class:`PointCloud2Data` of the given layout.

    ``time`` is seconds from the frame start; only ``livox2`` stores it (as absolute ns in the
    float64 ``timestamp`` field, i.e. ``stamp_ns + time*1e9``). ``tag`` is stored by ``livox``
    and ``livox2``; ``xyzirc`` stores tag bits 4-5 (return number) as ``return_type``. ``line``
    goes to ``line`` (livox*) or ``channel`` (xyzirc). Values a layout cannot hold are not stored.
    """
    dtype = layout_dtype(layout)
    pts = np.asarray(points)
    if pts.ndim != 2 or pts.shape[1] not in (3, 4):
        raise PointCloudError(f"points must have shape (N, 3) or (N, 4), got {pts.shape}")
    if stamp_ns < 0:
        raise PointCloudError(f"stamp_ns must be >= 0, got {stamp_ns}")
    n = pts.shape[0]
    time_s = _column_arg(time, n, "time", np.float64)
    tag_u8 = _column_arg(tag, n, "tag", np.uint8)
    line_arr = _column_arg(line, n, "line", np.int64)

    rec = np.zeros(n, dtype=dtype)
    rec["x"], rec["y"], rec["z"] = pts[:, 0], pts[:, 1], pts[:, 2]
    intensity = pts[:, 3] if pts.shape[1] == 4 else np.zeros(n, np.float32)
    if layout == "xyzirc":
        rec["intensity"] = np.clip(np.rint(np.nan_to_num(intensity)), 0, 255).astype(np.uint8)
        if tag_u8 is not None:
            rec["return_type"] = (tag_u8 >> 4) & 0x03
        if line_arr is not None:
            rec["channel"] = np.clip(line_arr, 0, 65535).astype(np.uint16)
    else:
        rec["intensity"] = intensity
        if layout in ("livox", "livox2"):
            if tag_u8 is not None:
                rec["tag"] = tag_u8
            if line_arr is not None:
                rec["line"] = np.clip(line_arr, 0, 255).astype(np.uint8)
        if layout == "livox2":
            offsets_ns = np.zeros(n) if time_s is None else time_s * 1e9
            rec["timestamp"] = float(stamp_ns) + offsets_ns
    sec, nanosec = divmod(int(stamp_ns), 1_000_000_000)
    step = dtype.itemsize
    return PointCloud2Data(
        stamp_sec=sec, stamp_nanosec=nanosec, frame_id=str(frame_id), height=1, width=n,
        fields=list(LAYOUTS[layout]), is_bigendian=False, point_step=step, row_step=step * n,
        data=rec.tobytes(), is_dense=bool(np.isfinite(pts).all()),
    )


# --------------------------------------------------------------------------- ROS message objects


def to_ros_message(data: PointCloud2Data, msg_class: type, point_field_class: type | None = None) -> Any:
    """Fill an instance of ``msg_class`` (e.g. rclpy's ``sensor_msgs.msg.PointCloud2``) from ``data``.

    Imports no ROS package itself: the PointField class comes from ``point_field_class`` or from
    the module that defines ``msg_class``.
    """
    import array
    import importlib

    if point_field_class is None:
        package = msg_class.__module__.rsplit(".", 1)[0]  # sensor_msgs.msg._point_cloud2 -> sensor_msgs.msg
        point_field_class = getattr(importlib.import_module(package), "PointField")
    msg = msg_class()
    msg.header.stamp.sec = int(data.stamp_sec)
    msg.header.stamp.nanosec = int(data.stamp_nanosec)
    msg.header.frame_id = data.frame_id
    msg.height, msg.width = int(data.height), int(data.width)
    msg.fields = [point_field_class(name=f.name, offset=int(f.offset), datatype=int(f.datatype), count=int(f.count))
                  for f in data.fields]
    msg.is_bigendian = bool(data.is_bigendian)
    msg.point_step, msg.row_step = int(data.point_step), int(data.row_step)
    msg.data = array.array("B", bytes(data.data))  # array('B', bytes) is one memcpy
    msg.is_dense = bool(data.is_dense)
    return msg


def from_message(msg: Any) -> PointCloud2Data:
    """Copy any PointCloud2-shaped object into a :class:`PointCloud2Data` (validated, data as bytes)."""
    if isinstance(msg, PointCloud2Data):
        return msg
    stamp_ns, frame_id = _header(msg)
    height, width, point_step, row_step = _geometry(msg)
    sec, nanosec = divmod(stamp_ns, 1_000_000_000)
    fields = [PointField(*key) for key in _field_key(msg.fields)]
    return PointCloud2Data(sec, nanosec, frame_id, height, width, fields, False, point_step, row_step,
                           _as_bytes_buffer(msg.data).tobytes(), bool(msg.is_dense))
