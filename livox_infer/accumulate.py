"""Multi-frame accumulation and in-frame deskew (ROS-free).

Livox's non-repetitive patterns fill in over time, so sparse sensors (Mid-40, Tele-15) gain from the last N
frames or T ms stacked into one cloud. Poses make that sharp on a moving vehicle: ``pose`` is the 4x4 transform of
the cloud's frame into a fixed frame (odom) at the cloud's stamp (p_odom = pose @ p_cloud); the node takes it from
nav_msgs/Odometry (`PoseBuffer`). Without poses the frames are stacked as they are (plain: right for a standing
sensor, smeared when moving).

Deskew: a Livox frame is scanned over ~100 ms and each point carries its time from the frame start (Cloud.time).
With the motion between the previous and this frame's pose (constant velocity), each point is moved to where it
would have been seen from the pose at the frame's stamp.
"""

from __future__ import annotations

import bisect
import collections
import math
from dataclasses import dataclass

import numpy as np

from livox_infer.errors import ConfigError
from livox_infer.decode.pointcloud import Cloud

MAX_FRAMES = 50
MAX_WINDOW_MS = 5000.0
POSE_MAX_GAP_NS = 200_000_000  # a pose farther than this from a cloud's stamp is not used (no extrapolation)
MAX_FRAME_GAP_NS = 1_000_000_000  # a frame this much newer than the last one: the stream stalled, the stack restarts
MAX_POSE_OFFSET_M = 1e8  # beyond any odom / map / UTM / ECEF coordinate; larger ones overflow the stacked float32 cloud


def check_window(frames: object, window_ms: object, source: str = "accumulation") -> tuple[int, float]:
    """Validated (accumulate_frames, accumulate_ms)."""
    if isinstance(frames, bool) or not isinstance(frames, int) or not 1 <= frames <= MAX_FRAMES:
        raise ConfigError(f"{source}: accumulate_frames must be an integer in [1, {MAX_FRAMES}], got {frames!r}")
    if isinstance(window_ms, bool) or not isinstance(window_ms, (int, float)) or not (
            math.isfinite(window_ms) and 0.0 <= window_ms <= MAX_WINDOW_MS):
        raise ConfigError(f"{source}: accumulate_ms must be in [0, {MAX_WINDOW_MS:g}] (0 = no time limit), "
                          f"got {window_ms!r}")
    return frames, float(window_ms)


def _rotvec(rot: np.ndarray) -> np.ndarray:
    """Axis-angle vector of a 3x3 rotation (angle < pi)."""
    cos = np.clip((np.trace(rot) - 1.0) / 2.0, -1.0, 1.0)
    angle = math.acos(cos)
    if angle < 1e-9:
        return np.zeros(3)
    axis = np.array([rot[2, 1] - rot[1, 2], rot[0, 2] - rot[2, 0], rot[1, 0] - rot[0, 1]]) / (2.0 * math.sin(angle))
    return axis * angle


def _rotation(rotvec: np.ndarray) -> np.ndarray:
    """Rodrigues: 3x3 rotation of an axis-angle vector (works on (..., 3) arrays too)."""
    rv = np.asarray(rotvec, dtype=np.float64)
    angle = np.linalg.norm(rv, axis=-1, keepdims=True)
    axis = rv / np.where(angle < 1e-12, 1.0, angle)
    x, y, z = axis[..., 0], axis[..., 1], axis[..., 2]
    k = np.stack([np.stack([0 * x, -z, y], -1), np.stack([z, 0 * x, -x], -1), np.stack([-y, x, 0 * x], -1)], -2)
    s, c = np.sin(angle)[..., None], np.cos(angle)[..., None]
    return np.eye(3) + s * k + (1 - c) * (k @ k)


def pose_matrix(position: tuple[float, float, float], quaternion_xyzw: tuple[float, float, float, float]) -> np.ndarray:
    """4x4 pose from a position and a unit quaternion (x, y, z, w), as in geometry_msgs/Pose."""
    if not all(math.isfinite(float(v)) and abs(float(v)) <= MAX_POSE_OFFSET_M for v in position):
        raise ConfigError(f"pose position is not finite or beyond +-{MAX_POSE_OFFSET_M:g} m: {tuple(position)!r}")
    x, y, z, w = (float(v) for v in quaternion_xyzw)
    n = math.sqrt(x * x + y * y + z * z + w * w)
    if not math.isfinite(n) or n < 1e-9:
        raise ConfigError(f"pose orientation is not a quaternion: {quaternion_xyzw!r}")
    x, y, z, w = x / n, y / n, z / n, w / n
    m = np.eye(4)
    m[:3, :3] = [[1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
                 [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
                 [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)]]
    m[:3, 3] = position
    return m


def interpolate_pose(a: np.ndarray, b: np.ndarray, f: float) -> np.ndarray:
    """Pose a fraction ``f`` of the way from ``a`` to ``b`` (rotation along the shortest arc, linear translation)."""
    rel = np.linalg.inv(a) @ b
    out = np.eye(4)
    out[:3, :3] = _rotation(_rotvec(rel[:3, :3]) * f)
    out[:3, 3] = rel[:3, 3] * f
    return a @ out


class PoseBuffer:
    """Recent (stamp, pose) pairs, e.g. from nav_msgs/Odometry; `at` interpolates between the two around a stamp."""

    def __init__(self, maxlen: int = 400) -> None:
        self._stamps: collections.deque[int] = collections.deque(maxlen=maxlen)
        self._poses: collections.deque[np.ndarray] = collections.deque(maxlen=maxlen)

    def add(self, stamp_ns: int, pose: np.ndarray) -> None:
        if self._stamps and stamp_ns <= self._stamps[-1]:
            if stamp_ns < self._stamps[-1] - POSE_MAX_GAP_NS:  # time went back (bag loop): start over
                self._stamps.clear()
                self._poses.clear()
            else:
                return  # out of order within the gap: keep the newer ones
        self._stamps.append(int(stamp_ns))
        self._poses.append(np.asarray(pose, dtype=np.float64))

    def at(self, stamp_ns: int) -> np.ndarray | None:
        """Pose at ``stamp_ns``, or None when no pose lies within POSE_MAX_GAP_NS on both sides (or one exact)."""
        stamps = list(self._stamps)
        i = bisect.bisect_left(stamps, stamp_ns)
        if i < len(stamps) and stamps[i] == stamp_ns:
            return self._poses[i]
        if i == 0 or i == len(stamps):
            near = 0 if i == 0 else len(stamps) - 1
            if stamps and abs(stamps[near] - stamp_ns) <= POSE_MAX_GAP_NS // 10:  # a few ms off: use it as is
                return self._poses[near]
            return None
        t0, t1 = stamps[i - 1], stamps[i]
        if t1 - t0 > 2 * POSE_MAX_GAP_NS:
            return None
        return interpolate_pose(self._poses[i - 1], self._poses[i], (stamp_ns - t0) / (t1 - t0))


def deskew(cloud: Cloud, motion: np.ndarray, motion_dt_s: float) -> Cloud:
    """Move each point to where the frame's pose at its stamp sees it.

    ``motion`` = inv(pose_prev) @ pose_now: how the cloud frame moved over the last ``motion_dt_s`` seconds
    (constant velocity assumed). A point measured ``t`` s after the stamp was seen from pose_now advanced by
    t / motion_dt_s of that motion."""
    if cloud.time is None or motion_dt_s <= 0 or len(cloud) == 0:
        return cloud
    f = (cloud.time / motion_dt_s)[:, None]
    rots = _rotation(_rotvec(motion[:3, :3])[None, :] * f)  # (N, 3, 3)
    xyz = cloud.points[:, :3].astype(np.float64)
    moved = np.einsum("nij,nj->ni", rots, xyz) + motion[:3, 3][None, :] * f
    pts = cloud.points.copy()
    pts[:, :3] = moved.astype(np.float32)
    return Cloud(pts, cloud.time, cloud.tag, cloud.stamp_ns, cloud.frame_id)


@dataclass
class _Frame:
    stamp_ns: int
    cloud: Cloud
    pose: np.ndarray | None
    deskewed: bool = False


class Accumulator:
    """Stacks the last ``frames`` clouds (and only those within ``window_ms`` of the newest, when > 0).

    ``add(cloud, pose=None)`` returns the accumulated cloud in the newest cloud's frame and stamp: older frames are
    moved by inv(pose_now) @ pose_then where both poses are known, stacked as they are otherwise. Point times are
    re-based on the newest stamp (older points get negative times; a frame without point times gets its stamp's
    offset for all of its points, so a stacked cloud always has times). With poses, each cloud is deskewed first.
    A cloud with the newest stamp again replaces that frame; an older stamp (a bag loop) starts over, and so does
    one more than ``max_gap_ns`` (1 s) newer than the last frame (a stalled stream: its old frames are stale even
    when ``window_ms`` is 0, no time limit)."""

    def __init__(self, frames: int = 1, window_ms: float = 0.0, max_gap_ns: int = MAX_FRAME_GAP_NS) -> None:
        self.frames, self.window_ms = check_window(frames, window_ms)
        self.max_gap_ns = int(max_gap_ns)
        self._history: collections.deque[_Frame] = collections.deque(maxlen=self.frames)
        self.compensated = 0  # older frames moved by their poses
        self.plain = 0  # older frames stacked without poses
        self.gap_resets = 0  # stacks restarted because the stream stalled for more than max_gap_ns

    def reset(self) -> None:
        self._history.clear()

    def add(self, cloud: Cloud, pose: np.ndarray | None = None) -> Cloud:
        stamp = int(cloud.stamp_ns)
        if self._history and stamp < self._history[-1].stamp_ns:
            self._history.clear()  # time went back (bag loop, sim restart): the old frames belong elsewhere
        elif self._history and stamp == self._history[-1].stamp_ns:
            self._history.pop()  # the same frame again (re-sent): it replaces itself
        elif self._history and stamp - self._history[-1].stamp_ns > self.max_gap_ns:
            self._history.clear()  # the stream stalled: what came before the gap is not this scene any more
            self.gap_resets += 1
        prev = self._history[-1] if self._history else None
        deskewed = False
        if pose is not None and prev is not None and prev.pose is not None and stamp > prev.stamp_ns:
            motion, dt = np.linalg.inv(prev.pose) @ pose, (stamp - prev.stamp_ns) * 1e-9
            cloud, deskewed = deskew(cloud, motion, dt), cloud.time is not None
            if not prev.deskewed and prev.cloud.time is not None:  # a first frame: its own motion is known now
                prev.cloud, prev.deskewed = deskew(prev.cloud, motion, dt), True
        self._history.append(_Frame(stamp, cloud, None if pose is None else np.asarray(pose, dtype=np.float64),
                                    deskewed))
        if self.window_ms > 0:
            while self._history[0].stamp_ns < stamp - self.window_ms * 1e6:
                self._history.popleft()
        if len(self._history) == 1:
            return cloud
        return self._stack(cloud, pose)

    def _stack(self, cloud: Cloud, pose: np.ndarray | None) -> Cloud:
        stamp = int(cloud.stamp_ns)
        inv_now = None if pose is None else np.linalg.inv(pose)
        points, times, tags = [], [], []
        for f in self._history:
            pts = f.cloud.points
            if f is not self._history[-1]:
                if inv_now is not None and f.pose is not None:
                    rel = inv_now @ f.pose
                    pts = pts.copy()
                    xyz = f.cloud.points[:, :3].astype(np.float64)
                    pts[:, :3] = (xyz @ rel[:3, :3].T + rel[:3, 3]).astype(np.float32)
                    self.compensated += 1
                else:
                    self.plain += 1
            points.append(pts)
            # every stacked point gets a time relative to the newest stamp (a frame without point times: its
            # stamp's), so a stacked cloud always says how old each point is (the detector's age input)
            offset = (f.stamp_ns - stamp) * 1e-9
            times.append(np.full(len(f.cloud), offset) if f.cloud.time is None else f.cloud.time + offset)
            tags.append(f.cloud.tag)
        time = np.concatenate(times)
        tag = np.concatenate(tags) if all(t is not None for t in tags) else None
        return Cloud(np.ascontiguousarray(np.concatenate(points)), time, tag, stamp, cloud.frame_id)


def point_ages(cloud: Cloud) -> np.ndarray | None:
    """Seconds each point lies before the cloud's stamp (float32, >= 0; the newest frame's points, whose times run
    forward from its stamp, are 0), or None when the cloud has no point times (a single frame without them)."""
    if cloud.time is None:
        return None
    return np.maximum(-np.asarray(cloud.time, np.float64), 0.0).astype(np.float32)


# Moving-object compensation of a stack (issue 32): objects slower than this are left as stacked (a parked car's
# frames already agree); the box is grown by MOTION_BOX_MARGIN_M on every side, and its lowest
# MOTION_GROUND_CLEARANCE_M left out, so the road under a car never travels with it.
MOTION_MIN_SPEED = 1.0
MOTION_BOX_MARGIN_M = 0.3
MOTION_GROUND_CLEARANCE_M = 0.15


def compensate_object_motion(cloud: Cloud, boxes: np.ndarray, velocities: np.ndarray) -> tuple[Cloud, int]:
    """A stack with its moving objects' older points moved to where those objects are at the newest stamp.

    ``boxes`` (K, 7) ``[x, y, z, l, w, h, yaw]`` and ``velocities`` (K, 2) m/s are the objects at the cloud's stamp,
    in its frame and axes (the tracker's prediction, `livox_infer.tracking.Tracker.predict`; over ground when the
    stack was motion-compensated with poses). An older point (age a > 0, `point_ages`) belongs to an object when,
    moved by v * a, it lies in the object's (grown) box: it is moved there, so the object's frames agree as a parked
    car's do, instead of smearing along its path. Returns the cloud (a copy when anything moved) and how many points
    moved."""
    ages = point_ages(cloud)
    boxes = np.asarray(boxes, np.float64).reshape(-1, 7)
    velocities = np.asarray(velocities, np.float64).reshape(-1, 2)
    speed = np.hypot(velocities[:, 0], velocities[:, 1])
    keep = (speed >= MOTION_MIN_SPEED) & np.isfinite(boxes).all(1) & np.isfinite(velocities).all(1)
    if ages is None or not keep.any():
        return cloud, 0
    older = np.nonzero(ages > 0)[0]
    if not len(older):
        return cloud, 0
    pts = cloud.points
    x, y, z, age = pts[older, 0], pts[older, 1], pts[older, 2], ages[older]
    max_age = float(age.max())
    moves: dict[int, tuple[float, float]] = {}  # index into ``older`` -> its shift (the first object that takes it)
    for box, vel in zip(boxes[keep], velocities[keep]):
        # the points anywhere along the object's path over the stack's time span (a cheap square around it), then the
        # exact test of each candidate moved by v * its age
        reach = 0.5 * math.hypot(box[3], box[4]) + MOTION_BOX_MARGIN_M + math.hypot(*vel) * max_age
        near = np.flatnonzero(np.abs(x - np.float32(box[0])) <= reach)
        near = near[np.abs(y[near] - np.float32(box[1])) <= reach]
        if not len(near):
            continue
        a = age[near].astype(np.float64)
        sx, sy = x[near] + a * vel[0], y[near] + a * vel[1]
        c, s = math.cos(box[6]), math.sin(box[6])
        dx, dy = sx - box[0], sy - box[1]
        u, v = dx * c + dy * s, -dx * s + dy * c
        bottom = box[2] - box[5] / 2
        zn = z[near]
        inside = ((np.abs(u) <= box[3] / 2 + MOTION_BOX_MARGIN_M) & (np.abs(v) <= box[4] / 2 + MOTION_BOX_MARGIN_M)
                  & (zn >= bottom + MOTION_GROUND_CLEARANCE_M) & (zn <= bottom + box[5] + MOTION_BOX_MARGIN_M))
        for i, dxs, dys in zip(near[inside].tolist(), (sx - x[near])[inside].tolist(), (sy - y[near])[inside].tolist()):
            moves.setdefault(i, (dxs, dys))
    if not moves:
        return cloud, 0
    idx = np.fromiter(moves.keys(), np.int64, len(moves))
    shift = np.array(list(moves.values()), np.float64).reshape(-1, 2)
    out = pts.copy()
    out[older[idx], :2] = (out[older[idx], :2].astype(np.float64) + shift).astype(np.float32)
    return Cloud(out, cloud.time, cloud.tag, cloud.stamp_ns, cloud.frame_id), len(moves)
