"""Rigid transforms of poses and boxes between frames (ROS-free).

The node looks transforms up with tf2_ros (``livox_infer.ros.tf``) and hands the 4x4 matrices here; the offline tools
and the tests use the same functions, so a box published in ``output_frame`` is exactly the cloud-frame box moved by
the transform. Convention: ``T`` (4x4) maps points of the source frame into the target frame, p' = R p + t (a tf2
lookup_transform(target, source) as a matrix); quaternions are (x, y, z, w) as in geometry_msgs.
"""

from __future__ import annotations

import math

import numpy as np

from livox_infer.accumulate import pose_matrix
from livox_infer.errors import ConfigError

__all__ = ["pose_matrix", "matrix_to_quaternion", "transform_pose", "transform_boxes", "transform_boxes_yaw"]


def matrix_to_quaternion(rot: np.ndarray) -> tuple[float, float, float, float]:
    """Unit quaternion (x, y, z, w) of a 3x3 rotation, w >= 0 (Shepperd's method: stable for any angle)."""
    m = np.asarray(rot, dtype=np.float64)
    trace = m[0, 0] + m[1, 1] + m[2, 2]
    if trace > 0:
        s = 2.0 * math.sqrt(trace + 1.0)
        w, x, y, z = 0.25 * s, (m[2, 1] - m[1, 2]) / s, (m[0, 2] - m[2, 0]) / s, (m[1, 0] - m[0, 1]) / s
    elif m[0, 0] > m[1, 1] and m[0, 0] > m[2, 2]:
        s = 2.0 * math.sqrt(1.0 + m[0, 0] - m[1, 1] - m[2, 2])
        w, x, y, z = (m[2, 1] - m[1, 2]) / s, 0.25 * s, (m[0, 1] + m[1, 0]) / s, (m[0, 2] + m[2, 0]) / s
    elif m[1, 1] > m[2, 2]:
        s = 2.0 * math.sqrt(1.0 + m[1, 1] - m[0, 0] - m[2, 2])
        w, x, y, z = (m[0, 2] - m[2, 0]) / s, (m[0, 1] + m[1, 0]) / s, 0.25 * s, (m[1, 2] + m[2, 1]) / s
    else:
        s = 2.0 * math.sqrt(1.0 + m[2, 2] - m[0, 0] - m[1, 1])
        w, x, y, z = (m[1, 0] - m[0, 1]) / s, (m[0, 2] + m[2, 0]) / s, (m[1, 2] + m[2, 1]) / s, 0.25 * s
    n = math.sqrt(x * x + y * y + z * z + w * w)
    sign = -1.0 if w < 0 else 1.0
    return sign * x / n, sign * y / n, sign * z / n, sign * w / n


def check_transform(transform: np.ndarray) -> np.ndarray:
    """``transform`` as a float64 4x4 rigid transform, or ConfigError (not finite, not a rotation)."""
    t = np.asarray(transform, dtype=np.float64)
    if t.shape != (4, 4) or not np.all(np.isfinite(t)):
        raise ConfigError(f"a transform must be a finite 4x4 matrix, got shape {t.shape}")
    rot = t[:3, :3]
    if not np.allclose(rot @ rot.T, np.eye(3), atol=1e-5) or np.linalg.det(rot) < 0:
        raise ConfigError("the transform's 3x3 part is not a rotation (orthonormal, det +1)")
    return t


def transform_pose(transform: np.ndarray, position, quaternion_xyzw) -> tuple[np.ndarray, tuple[float, ...]]:
    """A pose (position, quaternion) of the source frame expressed in the target frame: T @ pose."""
    moved = check_transform(transform) @ pose_matrix(position, quaternion_xyzw)
    return moved[:3, 3].copy(), matrix_to_quaternion(moved[:3, :3])


def transform_boxes(boxes: np.ndarray, transform: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Boxes (M, 7) [x, y, z, l, w, h, yaw] of the source frame in the target frame, exactly: their centres (M, 3)
    and orientations (M, 4) quaternions (x, y, z, w) = R @ Rz(yaw). Sizes do not change."""
    t = check_transform(transform)
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 7)
    centres = b[:, :3] @ t[:3, :3].T + t[:3, 3]
    quats = np.zeros((len(b), 4))
    for i, yaw in enumerate(b[:, 6]):
        c, s = math.cos(yaw), math.sin(yaw)
        quats[i] = matrix_to_quaternion(t[:3, :3] @ np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]]))
    return centres, quats


def transform_boxes_yaw(boxes: np.ndarray, transform: np.ndarray) -> np.ndarray:
    """Boxes (M, 7) in the target frame as (M, 7) with yaw about the target's z: exact when the transform rotates
    about z only (a level sensor in base_link); otherwise the heading of each box's x axis projected on the
    target's xy plane (the box's roll / pitch, which (M, 7) cannot hold, is dropped)."""
    t = check_transform(transform)
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 7)
    out = b.copy()
    out[:, :3] = b[:, :3] @ t[:3, :3].T + t[:3, 3]
    heading = np.stack([np.cos(b[:, 6]), np.sin(b[:, 6]), np.zeros(len(b))], axis=1) @ t[:3, :3].T
    out[:, 6] = np.arctan2(heading[:, 1], heading[:, 0])
    return out
