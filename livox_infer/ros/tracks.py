"""The node's tracking glue: runs `livox_infer.tracking.Tracker` after each frame, publishes
``~/tracked_objects`` (livox_infer_msgs/TrackedObjects) and reports in the diagnostics.

Kept out of node.py: the node calls :meth:`NodeTracking.frame` with the frame's detections and stamp, and gets the
track id of each detection (or None when tracking is off or failed) and the TrackFrame for the markers.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from livox_infer import CLASS_NAMES
from livox_infer.ros import messages as ros_msgs
from livox_infer.accumulate import compensate_object_motion
from livox_infer.tracking import TrackFrame, Tracker, TrackerConfig, candidates_of

TRACKED_TOPIC = "~/tracked_objects"


def tracked_objects_class():
    """livox_infer_msgs TrackedObjects, or None when that interface package is not built (make setup / colcon)."""
    try:
        from livox_infer_msgs.msg import TrackedObjects
    except ImportError:
        return None
    return TrackedObjects


class NodeTracking:
    """One tracker per node; ``values`` are the node's parameters (read at every frame, so a change of
    tracking_* applies at the next frame, and tracking: false drops the tracks)."""

    def __init__(self, node, values: Callable[[], dict[str, Any]], poses: Callable[[], Any] = lambda: None,
                 qos=None) -> None:
        self._node = node
        self._values = values
        self._poses = poses  # -> livox_infer.accumulate.PoseBuffer when odometry is subscribed, else None
        self.failed = 0
        self.last_error = ""
        self.tracker: Tracker | None = None
        self.pending = None  # the last frame's TrackedObjects, until the node publishes it
        self.motion_points: int | None = None  # older points of moving objects moved in the last stack
        cls = tracked_objects_class()
        self.publisher = node.create_publisher(cls, TRACKED_TOPIC, qos) if cls is not None else None
        if cls is None:
            node.get_logger().warning(f"livox_infer_msgs is not installed: {TRACKED_TOPIC} is not published "
                                      "(track ids still go into Detection3D.id and the markers)")

    def move_pending(self, transform, frame_id: str) -> None:
        """The frame's tracked objects into ``frame_id`` (the detections' output_frame transform)."""
        if self.pending is not None:
            from livox_infer.ros.tf import transform_tracked_objects

            transform_tracked_objects(self.pending, transform, frame_id)

    def publish_pending(self, publish: bool = True) -> None:
        """Publish the frame's tracked objects (after its detections), or drop them (``publish`` False: the frame
        could not be placed in output_frame, and a wrong frame is never published)."""
        msg, self.pending = self.pending, None
        if publish and msg is not None and self.publisher is not None:
            self.publisher.publish(msg)

    def has_subscribers(self) -> int:
        return self.publisher.get_subscription_count() if self.publisher is not None else 0

    def frame(self, dets, stamp_ns: int, class_names, header, frame_id) -> tuple[np.ndarray | None, TrackFrame | None]:
        """Track one frame's detections; publish the tracked objects. (track id per detection, TrackFrame), or
        (None, None) when tracking is off or the frame could not be tracked (counted, warned, throttled)."""
        values = self._values()
        if not values.get("tracking", False):
            self.tracker = None
            return None, None
        config = TrackerConfig.from_params(values)
        if self.tracker is None:
            self.tracker = Tracker(config, tuple(class_names))
        elif self.tracker.config != config:
            self.tracker.config = config
        buffer = self._poses()
        pose = buffer.at(int(stamp_ns)) if buffer is not None else None
        try:
            tracks = self.tracker.update(ros_msgs.to_numpy(dets.boxes), ros_msgs.to_numpy(dets.labels),
                                         ros_msgs.to_numpy(dets.scores), int(stamp_ns), pose, candidates_of(dets))
        except (ValueError, TypeError, IndexError) as exc:
            self.failed += 1
            self.last_error = f"tracking: {type(exc).__name__}: {exc}"
            self._node.get_logger().warning(f"frame not tracked: {exc}", throttle_duration_sec=5.0)
            return None, None
        self.pending = None
        if self.publisher is not None:
            if header is None:
                msg = ros_msgs.tracks_to_msg(tracks, tuple(class_names), stamp_ns=stamp_ns, frame_id=frame_id)
            else:
                msg = ros_msgs.tracks_to_msg(tracks, tuple(class_names), header, frame_id=frame_id)
            self.pending = msg  # published by the node with the frame's detections (moved to output_frame first)
        return tracks.detection_track_ids, tracks

    def annotate(self, dets, msg, frame_override: str | None) -> None:
        """Track the frame ``dets`` came from (``msg``: the PointCloud2 or Cloud it was detected in) and set
        ``dets.track_ids`` and ``dets.tracks``, which detections_to_msg / detections_to_markers then show."""
        header = getattr(msg, "header", None)
        stamp_ns = ros_msgs.message_stamp_ns(msg)
        if header is not None:
            frame_id = frame_override
        else:  # a Cloud (CustomMsg, merged or accumulated clouds)
            frame_id = frame_override or str(getattr(msg, "frame_id", ""))
        names = tuple(getattr(dets, "class_names", None) or CLASS_NAMES)
        track_ids, tracks = self.frame(dets, stamp_ns, names, header, frame_id)
        try:
            dets.track_ids, dets.tracks = track_ids, tracks
        except AttributeError:  # an object that takes no attributes: the frame goes out without ids
            pass

    def compensate(self, cloud):
        """A stacked cloud (accumulate_frames > 1) with its tracked moving objects' older points moved along their
        velocities to where the objects are at its stamp (`livox_infer.accumulate.compensate_object_motion`, the
        tracker's prediction); the cloud as it is when tracking or accumulate_track_motion is off or no track
        moves. A failure is counted and warned about, and the frame goes on uncompensated."""
        values = self._values()
        if self.tracker is None or not values.get("tracking", False) or not values.get("accumulate_track_motion"):
            return cloud
        try:
            buffer = self._poses()
            pose = buffer.at(int(cloud.stamp_ns)) if buffer is not None else None
            cloud, moved = compensate_object_motion(cloud, *self.tracker.predict(int(cloud.stamp_ns), pose))
        except (ValueError, TypeError, IndexError) as exc:
            self.failed += 1
            self.last_error = f"motion compensation: {type(exc).__name__}: {exc}"
            self._node.get_logger().warning(f"stack not motion-compensated: {exc}", throttle_duration_sec=5.0)
            return cloud
        self.motion_points = moved
        return cloud

    def diagnostics(self) -> dict[str, Any]:
        out: dict[str, Any] = {"tracking": "on" if self._values().get("tracking", False) else "off",
                               "tracked_objects": TRACKED_TOPIC if self.publisher is not None else
                               "not published (livox_infer_msgs not installed)",
                               "tracking_failed": self.failed}
        if self.tracker is not None:
            out.update(self.tracker.diagnostics())
            if self.motion_points is not None:
                out["tracking_stack_points_moved"] = self.motion_points  # the last stack's (accumulate_track_motion)
            if self.tracker.ego_motion is False and self._poses() is not None:
                out["tracking_ego_motion"] = "none: no odometry within 0.2 s of the cloud's stamp"
        return out
