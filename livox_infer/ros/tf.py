"""TF for the detector node: transforms looked up with tf2_ros (a Buffer filled by a TransformListener on the
node's /tf and /tf_static subscriptions), and the node's outputs moved into another frame.

Every ROS 2 install has tf2_ros; a pip-only environment gets it from ``scripts/setup_tf2.sh`` (upstream geometry2
built into <venv>/ros2_tf2: ``source .venv/ros2_tf2/setup.sh``). Where tf2_ros cannot be imported the node still
runs: :class:`TfLookup` says so once, and every lookup fails with that reason (the frame is then published empty,
never in the wrong frame). The transform math is the ROS-free ``livox_infer.transforms``.
"""

from __future__ import annotations

import numpy as np

from livox_infer.accumulate import pose_matrix
from livox_infer.transforms import matrix_to_quaternion


class TransformUnavailable(Exception):
    """A TF lookup that failed: frame missing, too old, extrapolation, timeout, or no tf2_ros."""


def import_tf2_ros():
    """(tf2_ros module, None), or (None, why it cannot be imported)."""
    try:
        import tf2_ros  # noqa: F401

        return tf2_ros, None
    except Exception as exc:  # noqa: BLE001 - ImportError, or a missing shared library (OSError)
        return None, f"{type(exc).__name__}: {exc}"


def transform_to_matrix(transform) -> np.ndarray:
    """geometry_msgs/Transform (or TransformStamped.transform) -> 4x4 (maps source-frame points into the target)."""
    t, q = transform.translation, transform.rotation
    return pose_matrix((t.x, t.y, t.z), (q.x, q.y, q.z, q.w))


class TfLookup:
    """``matrix(target, source, stamp_ns, timeout_s)``: the 4x4 transform of ``source`` points into ``target`` at
    ``stamp_ns`` (tf2_ros Buffer.lookup_transform), or TransformUnavailable with tf2's reason."""

    def __init__(self, node, cache_s: float = 10.0) -> None:
        self._tf2, self.unavailable = import_tf2_ros()
        self.buffer = self.listener = None
        if self._tf2 is None:
            return
        from rclpy.duration import Duration

        self.buffer = self._tf2.Buffer(cache_time=Duration(seconds=cache_s))
        # the node's own executor serves /tf and /tf_static (no extra spin thread)
        self.listener = self._tf2.TransformListener(self.buffer, node, spin_thread=False)

    @property
    def available(self) -> bool:
        return self.buffer is not None

    def matrix(self, target: str, source: str, stamp_ns: int, timeout_s: float = 0.0) -> np.ndarray:
        if target == source:
            return np.eye(4)
        if self.buffer is None:
            raise TransformUnavailable(f"no tf2_ros ({self.unavailable})")
        from rclpy.duration import Duration
        from rclpy.time import Time

        try:
            stamped = self.buffer.lookup_transform(target, source, Time(nanoseconds=int(stamp_ns)),
                                                   timeout=Duration(nanoseconds=int(timeout_s * 1e9)))
        except self._tf2.TransformException as exc:  # Lookup / Connectivity / Extrapolation / Timeout
            raise TransformUnavailable(f"{type(exc).__name__}: {str(exc).strip()}") from None
        return transform_to_matrix(stamped.transform)

    def close(self) -> None:
        if self.listener is not None:
            self.listener.unregister()


def _move_pose(pose, transform: np.ndarray) -> None:
    """geometry_msgs/Pose in place: T @ pose."""
    p, q = pose.position, pose.orientation
    m = transform @ pose_matrix((p.x, p.y, p.z), (q.x, q.y, q.z, q.w))
    p.x, p.y, p.z = (float(v) for v in m[:3, 3])
    q.x, q.y, q.z, q.w = matrix_to_quaternion(m[:3, :3])


def transform_detections(msg, transform: np.ndarray, frame_id: str):
    """vision_msgs/Detection3DArray in place into ``frame_id``: every box pose (and hypothesis pose) T @ pose, so the
    orientation keeps any roll / pitch of the transform; sizes unchanged. Returns ``msg``."""
    msg.header.frame_id = frame_id
    for det in msg.detections:
        det.header.frame_id = frame_id
        _move_pose(det.bbox.center, transform)
        for hyp in det.results:
            hyp.pose.pose = det.bbox.center
    return msg


def _rotate_covariance(cov, rot: np.ndarray) -> np.ndarray:
    """A 6x6 row-major covariance with its linear (top-left 3x3) block rotated: R C R^T."""
    c = np.asarray(cov, dtype=np.float64).reshape(6, 6).copy()
    c[:3, :3] = rot @ c[:3, :3] @ rot.T
    return c.reshape(-1)


def transform_tracked_objects(msg, transform: np.ndarray, frame_id: str):
    """livox_infer_msgs/TrackedObjects in place into ``frame_id``: poses T @ pose, velocities (linear and angular)
    and the x/y/z covariance blocks rotated; sizes unchanged. Returns ``msg``."""
    rot = np.asarray(transform, dtype=np.float64)[:3, :3]
    msg.header.frame_id = frame_id
    for obj in msg.objects:
        _move_pose(obj.pose.pose, transform)
        obj.pose.covariance = _rotate_covariance(obj.pose.covariance, rot)
        for vec in (obj.twist.twist.linear, obj.twist.twist.angular):
            vec.x, vec.y, vec.z = (float(v) for v in rot @ np.array([vec.x, vec.y, vec.z]))
        obj.twist.covariance = _rotate_covariance(obj.twist.covariance, rot)
    return msg


def transform_markers(msg, transform: np.ndarray, frame_id: str):
    """visualization_msgs/MarkerArray in place into ``frame_id``: each marker's pose T @ pose (its points are in
    the marker's own frame, so they move with it; a DELETEALL is only relabelled). Returns ``msg``."""
    for marker in msg.markers:
        marker.header.frame_id = frame_id
        if marker.action != marker.DELETEALL:
            _move_pose(marker.pose, transform)
    return msg
