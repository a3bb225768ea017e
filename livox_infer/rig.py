"""Several Livox LiDARs on one vehicle: a rig file, extrinsics, and clouds merged into one output frame.

A rig YAML (contract in docs/rigs.md)::

    output_frame: base_link          # frame of the merged cloud and of the published boxes
    merge_tolerance_ms: 50.0         # clouds whose stamps lie this close form one merged frame
    bev_extent: [-51.2, 51.2, -51.2, 51.2]   # detection grid in the output frame (optional)
    sensor_height: 0.0               # metres the ground lies below the output frame's origin, or 'auto'
    sensors:
      - name: front                  # offline (`detect --rig DIR`): clouds are read from DIR/<name>/
        topic: /livox/lidar_front    # the node subscribes here
        model: horizon               # sensor preset (config/<model>.yaml)
        extrinsic: {x: 0.0, y: 0.0, z: 1.9, roll: 0.0, pitch: 0.43, yaw: 0.0}   # metres, degrees
      - name: tele
        topic: /livox/lidar_tele
        model: tele15
        matrix: [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 1.9], [0, 0, 0, 1]]   # or a 4x4 sensor -> output

The extrinsic is the sensor's pose in the output frame (points p_out = R p_sensor + t), with
R = Rz(yaw) Ry(pitch) Rx(roll) as livox_ros_driver2 applies its ``extrinsic_parameter`` (which gives x, y, z
in millimetres; here they are metres, as everywhere in ROS).

`RigMerger` pairs clouds by stamp: the first cloud of a frame opens it, clouds of the other sensors within
``merge_tolerance_ms`` join it, and it is emitted when every sensor has delivered, or - missing sensors counted -
when a cloud newer than the tolerance opens the next frame. A cloud older than the open frame is late: counted
and dropped (its frame is gone) - unless it is over a second older: then time restarted (a bag loop) and merging
starts over.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from livox_infer.errors import ConfigError
from livox_infer.decode.pointcloud import Cloud
from livox_infer.params import SENSOR_PRESETS as SENSOR_MODELS, parse_sensor_height

EXTRINSIC_KEYS = ("x", "y", "z", "roll", "pitch", "yaw")
RIG_KEYS = {"output_frame", "merge_tolerance_ms", "bev_extent", "sensor_height", "sensors"}
SENSOR_KEYS = {"name", "topic", "model", "extrinsic", "matrix"}
DEFAULT_MERGE_TOLERANCE_MS = 50.0  # half a 10 Hz Livox frame
TIME_JUMP_BACK_NS = 1_000_000_000  # a stamp this far behind the last frame: time restarted (bag loop), not late
MAX_EXTRINSIC_OFFSET_M = 1000.0  # a sensor farther than this from the output frame's origin is a unit mistake (mm?)


def rotation_rpy(roll_deg: float, pitch_deg: float, yaw_deg: float) -> np.ndarray:
    """3x3 rotation Rz(yaw) @ Ry(pitch) @ Rx(roll), angles in degrees (livox_ros_driver2's convention)."""
    r, p, y = (math.radians(a) for a in (roll_deg, pitch_deg, yaw_deg))
    cr, sr, cp, sp, cy, sy = math.cos(r), math.sin(r), math.cos(p), math.sin(p), math.cos(y), math.sin(y)
    rx = np.array([[1, 0, 0], [0, cr, -sr], [0, sr, cr]])
    ry = np.array([[cp, 0, sp], [0, 1, 0], [-sp, 0, cp]])
    rz = np.array([[cy, -sy, 0], [sy, cy, 0], [0, 0, 1]])
    return rz @ ry @ rx


def transform_from_xyz_rpy(x: float, y: float, z: float, roll: float, pitch: float, yaw: float) -> np.ndarray:
    """4x4 homogeneous transform from a translation (m) and roll/pitch/yaw (degrees)."""
    t = np.eye(4)
    t[:3, :3] = rotation_rpy(roll, pitch, yaw)
    t[:3, 3] = (x, y, z)
    return t


def transform_cloud(cloud: Cloud, transform: np.ndarray, frame_id: str) -> Cloud:
    """``cloud`` with its xyz mapped by the 4x4 ``transform`` (p' = R p + t), relabelled ``frame_id``."""
    pts = cloud.points.copy()
    rot, trans = transform[:3, :3].astype(np.float64), transform[:3, 3].astype(np.float64)
    pts[:, :3] = (cloud.points[:, :3].astype(np.float64) @ rot.T + trans).astype(np.float32)
    return Cloud(pts, cloud.time, cloud.tag, cloud.stamp_ns, frame_id)


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{what} must be a finite number, got {value!r}")
    return float(value)


def _parse_matrix(value: Any, what: str) -> np.ndarray:
    try:
        m = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ConfigError(f"{what}: matrix must be 4 rows of 4 numbers, got {value!r}") from None
    if m.shape != (4, 4) or not np.isfinite(m).all():
        raise ConfigError(f"{what}: matrix must be 4 rows of 4 finite numbers, got shape {m.shape}")
    if not np.allclose(m[3], (0, 0, 0, 1)):
        raise ConfigError(f"{what}: matrix's last row must be [0, 0, 0, 1], got {m[3].tolist()}")
    rot = m[:3, :3]
    if not np.allclose(rot @ rot.T, np.eye(3), atol=1e-3) or np.linalg.det(rot) < 0:
        raise ConfigError(f"{what}: the matrix's upper-left 3x3 is not a rotation (orthonormal, det +1)")
    return m


@dataclass(frozen=True)
class RigSensor:
    """One LiDAR of the rig: ``extrinsic`` maps its points into the rig's output frame (4x4)."""

    name: str
    topic: str
    model: str
    extrinsic: np.ndarray = field(repr=False)


@dataclass(frozen=True)
class Rig:
    output_frame: str
    sensors: tuple[RigSensor, ...]
    merge_tolerance_ms: float = DEFAULT_MERGE_TOLERANCE_MS
    bev_extent: tuple[float, float, float, float] | None = None
    sensor_height: float | str = 0.0

    def sensor(self, name: str) -> RigSensor:
        for s in self.sensors:
            if s.name == name:
                return s
        raise ConfigError(f"rig has no sensor {name!r}; sensors: {[s.name for s in self.sensors]}")

    @classmethod
    def load(cls, path: str | Path) -> "Rig":
        import yaml

        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"rig file not found: {path}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"rig file {path} is not UTF-8 text (byte {exc.start}: {exc.object[exc.start:exc.start + 1]!r})"
                              ) from None
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read rig file {path}: {exc}") from None
        return cls.from_dict(data, str(path))

    @classmethod
    def from_dict(cls, data: Any, source: str = "rig") -> "Rig":
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: a rig is a mapping with output_frame and sensors, got {type(data).__name__}")
        unknown = sorted(set(data) - RIG_KEYS)
        if unknown:
            raise ConfigError(f"{source}: unknown keys {unknown}; known: {sorted(RIG_KEYS)}")
        frame = data.get("output_frame")
        if not isinstance(frame, str) or not frame.strip():
            raise ConfigError(f"{source}: output_frame must name a frame (e.g. base_link), got {frame!r}")
        raw = data.get("sensors")
        if not isinstance(raw, list) or not raw:
            raise ConfigError(f"{source}: sensors must be a non-empty list")
        sensors = tuple(_parse_sensor(s, f"{source}: sensors[{i}]") for i, s in enumerate(raw))
        for key in ("name", "topic"):
            seen = [getattr(s, key) for s in sensors]
            dup = sorted({v for v in seen if seen.count(v) > 1})
            if dup:
                raise ConfigError(f"{source}: sensor {key}s must be unique, repeated: {dup}")
        tol = _number(data.get("merge_tolerance_ms", DEFAULT_MERGE_TOLERANCE_MS), f"{source}: merge_tolerance_ms")
        if tol < 0:
            raise ConfigError(f"{source}: merge_tolerance_ms must be >= 0, got {tol}")
        extent = data.get("bev_extent")
        if extent is not None:
            if not isinstance(extent, (list, tuple)) or len(extent) != 4:
                raise ConfigError(f"{source}: bev_extent must be [x_min, x_max, y_min, y_max], got {extent!r}")
            extent = tuple(_number(v, f"{source}: bev_extent") for v in extent)
        try:  # the pipeline's one encoding and range (livox_infer.params)
            height = parse_sensor_height(data.get("sensor_height", 0.0))
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None
        return cls(frame.strip(), sensors, tol, extent, height)


def _parse_sensor(data: Any, what: str) -> RigSensor:
    if not isinstance(data, dict):
        raise ConfigError(f"{what} must be a mapping with name, topic, model and extrinsic or matrix")
    unknown = sorted(set(data) - SENSOR_KEYS)
    if unknown:
        raise ConfigError(f"{what}: unknown keys {unknown}; known: {sorted(SENSOR_KEYS)}")
    name, topic, model = data.get("name"), data.get("topic"), data.get("model")
    if not isinstance(name, (str, int)) or isinstance(name, bool) or not str(name).strip():
        raise ConfigError(f"{what}: name must be a non-empty string, got {name!r}")
    plain = str(name).strip()
    if any(c in plain for c in "/\\\0") or plain in (".", ".."):
        raise ConfigError(f"{what}: name must be a plain folder name (offline, the sensor's clouds are read from "
                          f"INPUT/<name>/; no '/', '\\', '.' or '..'), got {name!r}")
    what = f"{what} ({name})"
    if not isinstance(topic, str) or not topic.startswith("/"):
        raise ConfigError(f"{what}: topic must be an absolute topic name like /livox/lidar_front, got {topic!r}")
    if model not in SENSOR_MODELS:
        raise ConfigError(f"{what}: model must be one of {list(SENSOR_MODELS)}, got {model!r}")
    if ("extrinsic" in data) == ("matrix" in data):
        raise ConfigError(f"{what}: give exactly one of extrinsic (x, y, z, roll, pitch, yaw) or matrix (4x4)")
    if "matrix" in data:
        extrinsic = _parse_matrix(data["matrix"], what)
    else:
        ext = data["extrinsic"]
        if not isinstance(ext, dict) or set(ext) != set(EXTRINSIC_KEYS):
            got = sorted(ext) if isinstance(ext, dict) else ext
            raise ConfigError(f"{what}: extrinsic needs exactly {list(EXTRINSIC_KEYS)} (m, deg), got {got!r}")
        extrinsic = transform_from_xyz_rpy(*(_number(ext[k], f"{what}: extrinsic.{k}") for k in EXTRINSIC_KEYS))
    offset = float(np.linalg.norm(extrinsic[:3, 3]))
    if offset > MAX_EXTRINSIC_OFFSET_M:
        raise ConfigError(f"{what}: the extrinsic puts the sensor {offset:.6g} m from the output frame's origin "
                          f"(at most {MAX_EXTRINSIC_OFFSET_M:g} m; x, y, z are metres, not millimetres)")
    return RigSensor(plain, topic, model, extrinsic)


def merge_clouds(clouds: list[Cloud], frame_id: str) -> Cloud:
    """One cloud from clouds already in ``frame_id``: points concatenated; stamp = the earliest; per-point
    times (where every cloud has them) re-based on that stamp; tags kept (0 = a normal point, which no tag filter
    drops, for clouds without them)."""
    if not clouds:
        raise ConfigError("merge_clouds needs at least one cloud")
    frame_id = frame_id or clouds[0].frame_id
    stamp = min(int(c.stamp_ns) for c in clouds)
    points = np.concatenate([c.points for c in clouds]).astype(np.float32, copy=False)
    time = None
    if all(c.time is not None for c in clouds):
        time = np.concatenate([c.time + (int(c.stamp_ns) - stamp) * 1e-9 for c in clouds])
    tag = None
    if any(c.tag is not None for c in clouds):
        tag = np.concatenate([np.zeros(len(c), np.uint8) if c.tag is None else c.tag for c in clouds])
    return Cloud(np.ascontiguousarray(points), time, tag, stamp, frame_id)


@dataclass
class MergeStats:
    frames: int = 0  # merged frames emitted
    partial: int = 0  # emitted without every sensor
    late: int = 0  # clouds older than the open frame (dropped)
    replaced: int = 0  # a second cloud of one sensor within one frame (the newer kept)
    restarts: int = 0  # time jumped back (a bag loop): the open frame was dropped and merging started over
    missing: dict[str, int] = field(default_factory=dict)  # per sensor: frames emitted without it


@dataclass
class MergedFrame:
    cloud: Cloud  # in the rig's output frame
    sensors: tuple[str, ...]  # sensors that contributed
    missing: tuple[str, ...]  # sensors that did not


class RigMerger:
    """Pairs the sensors' clouds (already in the output frame) by stamp into merged frames; see the module
    docstring. ``add`` returns the frames completed by this cloud (0, 1 or 2), ``flush`` the open one."""

    def __init__(self, sensor_names: list[str] | tuple[str, ...], output_frame: str, tolerance_ms: float) -> None:
        self.names = tuple(sensor_names)
        self.output_frame = output_frame
        self.tolerance_ns = int(round(tolerance_ms * 1e6))
        self.stats = MergeStats(missing={n: 0 for n in self.names})
        self._open: dict[str, Cloud] = {}
        self._ref_ns: int | None = None  # stamp of the open frame's first cloud
        self._last_ref_ns: int | None = None  # ... of the last emitted frame

    def add(self, name: str, cloud: Cloud) -> list[MergedFrame]:
        if name not in self.names:
            raise ConfigError(f"unknown rig sensor {name!r}; sensors: {list(self.names)}")
        stamp = int(cloud.stamp_ns)
        out: list[MergedFrame] = []
        newest = self._ref_ns if self._ref_ns is not None else self._last_ref_ns
        if newest is not None and stamp < newest - TIME_JUMP_BACK_NS:
            self.stats.restarts += 1
            self._open, self._ref_ns, self._last_ref_ns = {}, None, None
        if self._ref_ns is None and self._last_ref_ns is not None and stamp <= self._last_ref_ns + self.tolerance_ns:
            self.stats.late += 1  # its frame has been emitted already
            return out
        if self._ref_ns is not None:
            if stamp < self._ref_ns - self.tolerance_ns:
                self.stats.late += 1
                return out
            if stamp > self._ref_ns + self.tolerance_ns:
                out.append(self._emit())
        if self._ref_ns is None:
            self._ref_ns = stamp
        if name in self._open:
            self.stats.replaced += 1
        self._open[name] = cloud
        if len(self._open) == len(self.names):
            out.append(self._emit())
        return out

    def flush(self) -> list[MergedFrame]:
        return [self._emit()] if self._open else []

    def _emit(self) -> MergedFrame:
        present = tuple(n for n in self.names if n in self._open)
        missing = tuple(n for n in self.names if n not in self._open)
        frame = MergedFrame(merge_clouds([self._open[n] for n in present], self.output_frame), present, missing)
        self.stats.frames += 1
        if missing:
            self.stats.partial += 1
            for n in missing:
                self.stats.missing[n] += 1
        self._open = {}
        self._last_ref_ns, self._ref_ns = self._ref_ns, None
        return frame


def rig_pipeline_options(rig: Rig) -> dict:
    """DetectionPipeline options a rig fixes: its grid and ground in the output frame; the sensor presets'
    ROI and range window (sensor-frame, forward) do not apply to a merged cloud."""
    level = rig.sensor_height != "auto"  # a numeric height means a level output frame (base_link)
    opts = {"roi": None, "max_range": None, "sensor_height": rig.sensor_height,
            "sensor_tilt": None if level else "auto"}
    if rig.bev_extent is not None:
        opts["bev_extent"] = rig.bev_extent
    return opts


def same_frame_rig(topics: list[str] | tuple[str, ...], model: str,
                   tolerance_ms: float = DEFAULT_MERGE_TOLERANCE_MS) -> Rig:
    """A rig of clouds that already share one frame (e.g. livox_ros_driver2 applied its extrinsics): merged as
    they are and published in their own frame_id (output_frame "")."""
    sensors = tuple(RigSensor(t, t, model, np.eye(4)) for t in topics)
    return Rig("", sensors, tolerance_ms)


class FrameAssembler:
    """Per-sensor clouds -> what the pipeline sees: each moved into the rig's output frame, merged by stamp
    (`RigMerger`), then accumulated (`Accumulator`, with the output frame's pose from ``poses`` when given).

    ``add(sensor_name, cloud)`` returns the finished clouds (usually 0 or 1), ``flush()`` the open one."""

    def __init__(self, rig: Rig, accumulate_frames: int = 1, accumulate_ms: float = 0.0, poses=None) -> None:
        from livox_infer.accumulate import Accumulator

        self.rig = rig
        self.merger = RigMerger([s.name for s in rig.sensors], rig.output_frame, rig.merge_tolerance_ms)
        self.accumulator = Accumulator(accumulate_frames, accumulate_ms)
        self.poses = poses  # PoseBuffer or None
        self._extrinsics = {s.name: s.extrinsic for s in rig.sensors}
        # per sensor: clouds none of whose points landed on the rig's grid (a wrong extrinsic loses them silently)
        self.outside_grid = {s.name: 0 for s in rig.sensors}

    def add(self, sensor_name: str, cloud: Cloud) -> list[Cloud]:
        if sensor_name not in self._extrinsics:
            raise ConfigError(f"unknown rig sensor {sensor_name!r}; sensors: {list(self._extrinsics)}")
        ext = self._extrinsics[sensor_name]
        frame = self.rig.output_frame or cloud.frame_id
        moved = Cloud(cloud.points, cloud.time, cloud.tag, cloud.stamp_ns, frame) if np.array_equal(ext, np.eye(4)) \
            else transform_cloud(cloud, ext, frame)
        extent = self.rig.bev_extent
        if extent is not None and len(moved):
            x, y = moved.points[:, 0], moved.points[:, 1]
            if not np.any((x >= extent[0]) & (x < extent[1]) & (y >= extent[2]) & (y < extent[3])):
                self.outside_grid[sensor_name] += 1
        return [self._accumulate(m) for m in self.merger.add(sensor_name, moved)]

    def outside_grid_warning(self, sensor_name: str) -> str:
        return (f"rig sensor {sensor_name!r}: none of its points land on the rig's grid {list(self.rig.bev_extent)} "
                f"({self.outside_grid[sensor_name]} clouds); check its extrinsic")

    def flush(self) -> list[Cloud]:
        return [self._accumulate(m) for m in self.merger.flush()]

    def _accumulate(self, merged: MergedFrame) -> Cloud:
        pose = None if self.poses is None else self.poses.at(merged.cloud.stamp_ns)
        return self.accumulator.add(merged.cloud, pose)


OFFLINE_FRAME_PERIOD_NS = 100_000_000  # point files carry no stamps: the i-th file of each sensor is frame i, 10 Hz


def read_rig_directory(rig: Rig, root: str | Path):
    """(source, sensor name, Cloud) for a directory with one sub-folder per sensor (root/<name>/*.pcd|.bin), in
    frame order: the i-th file (sorted by name) of every sensor folder forms frame i (stamp i x 100 ms)."""
    from livox_infer.errors import PointCloudError
    from livox_infer.decode.pointfiles import read_cloud_file

    root = Path(root)
    files = {}
    for s in rig.sensors:
        folder = root / s.name
        if os.path.normpath(folder) != os.path.join(os.path.normpath(root), s.name) or s.name in (".", ".."):
            # a name is one plain folder inside root (checked at load, again here)
            raise PointCloudError(f"{root}: rig sensor name {s.name!r} is not a folder inside the input")
        if not folder.is_dir():
            raise PointCloudError(f"{root}: no sub-folder {s.name!r} for rig sensor {s.name} ({s.model}); "
                                  f"expected one folder per sensor named as in the rig")
        files[s.name] = sorted(f for f in folder.iterdir() if f.suffix.lower() in (".pcd", ".bin"))
        if not files[s.name]:
            raise PointCloudError(f"{folder}: no .pcd/.bin files")
    for i in range(max(len(v) for v in files.values())):
        for name, paths in files.items():
            if i < len(paths):
                cloud = read_cloud_file(paths[i], frame_id=name)
                cloud.stamp_ns = i * OFFLINE_FRAME_PERIOD_NS
                yield f"{name}/{paths[i].name}", name, cloud
