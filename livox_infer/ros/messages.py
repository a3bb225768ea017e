"""Conversions between the ROS-free core's arrays and ROS 2 messages.

Used by the node (detections → Detection3DArray / MarkerArray) and by the demo and tests
(Detection3DArray → arrays). Message classes are imported inside the functions so that
importing this module never needs a ROS install; only calling a converter does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from livox_infer import CLASS_NAMES
from livox_infer.detector.boxes import quaternion_to_yaw, yaw_to_quaternion  # noqa: F401 - re-exported for node code and tests
from livox_infer.detector.boxes import box_corners

# RGBA per class for markers, the one table the BEV pictures use too; an unknown class name is drawn grey.
from livox_infer.colors import CLASS_COLORS, UNKNOWN_COLOR as _UNKNOWN_COLOR  # noqa: E402,F401 - re-exported

# Index pairs into the 8 box corners (see box_corners) forming the 12 edges of a box.
_BOX_EDGES = np.array(
    [(0, 1), (1, 2), (2, 3), (3, 0),  # bottom face
     (4, 5), (5, 6), (6, 7), (7, 4),  # top face
     (0, 4), (1, 5), (2, 6), (3, 7)],  # verticals
    dtype=np.int64,
)


@dataclass
class DetectionArrays:
    """A Detection3DArray as plain arrays (boxes (M,7) [x,y,z,l,w,h,yaw], class names, scores)."""

    stamp_ns: int
    frame_id: str
    boxes: np.ndarray
    class_names: list[str]
    scores: np.ndarray


def to_numpy(x) -> np.ndarray:
    """Tensor (any device) or array-like → numpy array, without copying numpy input."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def detection_class_names(detections, count: int) -> list[str]:
    """Class name of each of ``count`` detections.

    ``detections.label_names`` holds one name per box (DetectionPipeline's Detections); without
    it the integer ``labels`` index ``detections.class_names`` or CLASS_NAMES.
    """
    per_box = getattr(detections, "label_names", None)
    if per_box is not None and not isinstance(per_box, str) and len(per_box) == count:
        return [str(n) for n in per_box]
    labels = to_numpy(getattr(detections, "labels", np.zeros(0))).astype(np.int64).reshape(-1)
    names = tuple(getattr(detections, "class_names", None) or CLASS_NAMES)
    return [str(names[lab]) if 0 <= lab < len(names) else f"class_{int(lab)}" for lab in labels[:count]]


def box_edge_points(box: np.ndarray) -> np.ndarray:
    """(24,3) end points of the 12 box edges, in LINE_LIST order."""
    return box_corners(box)[_BOX_EDGES.reshape(-1)]


def _header(header_or_none, stamp_ns: int | None, frame_id: str | None):
    from std_msgs.msg import Header

    if header_or_none is not None:  # an rclpy or a rosbags header: copied field by field
        h = Header()
        h.stamp.sec, h.stamp.nanosec = int(header_or_none.stamp.sec), int(header_or_none.stamp.nanosec)
        h.frame_id = str(header_or_none.frame_id) if frame_id is None else frame_id
        return h
    h = Header()
    ns = int(stamp_ns or 0)
    h.stamp.sec, h.stamp.nanosec = ns // 1_000_000_000, ns % 1_000_000_000
    h.frame_id = frame_id or ""
    return h


def stamp_to_ns(stamp) -> int:
    return int(stamp.sec) * 1_000_000_000 + int(stamp.nanosec)


def message_stamp_ns(msg) -> int:
    """Stamp of what the node detects on: a message's header stamp, or a Cloud's ``stamp_ns`` (CustomMsg, merged
    or accumulated clouds)."""
    header = getattr(msg, "header", None)
    return stamp_to_ns(header.stamp) if header is not None else int(getattr(msg, "stamp_ns", 0) or 0)


def detections_to_msg(detections, header=None, *, stamp_ns: int | None = None, frame_id: str | None = None,
                      track_ids=None):
    """Detections (boxes (M,7), labels, scores) → vision_msgs/Detection3DArray.

    The header is copied from ``header`` (the input cloud's), with ``frame_id`` overriding
    its frame when given. Each Detection3D carries one hypothesis (class name, score), the box
    centre + yaw quaternion and its size (l, w, h); the hypothesis pose repeats the box pose
    as vision_msgs consumers expect. ``track_ids`` (M,): ``Detection3D.id`` = the
    track id as a decimal string, "" for 0 (no confirmed track).
    """
    from vision_msgs.msg import Detection3D, Detection3DArray, ObjectHypothesisWithPose

    boxes = to_numpy(detections.boxes).reshape(-1, 7).astype(np.float64)
    scores = to_numpy(detections.scores).reshape(-1).astype(np.float64)
    names = detection_class_names(detections, len(boxes))
    if track_ids is None:  # set by the node's tracking (livox_infer/ros/tracks.py)
        track_ids = getattr(detections, "track_ids", None)
    out = Detection3DArray()
    out.header = _header(header, stamp_ns, frame_id)
    for i, box in enumerate(boxes):
        det = Detection3D()
        det.header = out.header
        hyp = ObjectHypothesisWithPose()
        hyp.hypothesis.class_id = names[i]
        hyp.hypothesis.score = float(scores[i])
        pose = det.bbox.center
        pose.position.x, pose.position.y, pose.position.z = (float(v) for v in box[:3])
        qx, qy, qz, qw = yaw_to_quaternion(box[6])
        pose.orientation.x, pose.orientation.y, pose.orientation.z, pose.orientation.w = qx, qy, qz, qw
        hyp.pose.pose = pose
        det.results = [hyp]
        det.bbox.size.x, det.bbox.size.y, det.bbox.size.z = (float(v) for v in box[3:6])
        if track_ids is not None and int(track_ids[i]) > 0:
            det.id = str(int(track_ids[i]))
        out.detections.append(det)
    return out


def tracks_to_msg(tracks, class_names, header=None, *, stamp_ns: int | None = None, frame_id: str | None = None):
    """A tracker's TrackFrame → livox_infer_msgs/TrackedObjects (the confirmed tracks of the frame).

    Per object: ``track_id`` (the Detection3D.id of its detections), ``class_id`` (the class name), ``score`` (the
    latest detection's), ``age`` (frames), pose = box centre + yaw in the header's frame with the filter's x/y
    covariance, ``size`` = l, w, h, twist = vx, vy in the header frame's axes and the yaw rate, with the filter's
    velocity covariance, and ``velocity_over_ground`` (ego motion was applied).
    """
    from livox_infer_msgs.msg import TrackedObject, TrackedObjects

    out = TrackedObjects()
    out.header = _header(header, stamp_ns, frame_id)
    boxes = to_numpy(tracks.boxes).reshape(-1, 7).astype(np.float64)
    vel = to_numpy(tracks.velocities).reshape(-1, 2).astype(np.float64)
    cov = tracks.covariances
    over_ground = bool(tracks.ego_motion)
    for i, box in enumerate(boxes):
        obj = TrackedObject()
        obj.track_id = int(tracks.track_ids[i])
        label = int(tracks.labels[i])
        obj.class_id = class_names[label] if 0 <= label < len(class_names) else ""
        obj.score = float(np.clip(tracks.scores[i], 0.0, 1.0))
        obj.age = int(min(max(int(tracks.ages[i]), 0), 2**32 - 1))
        pose = obj.pose.pose
        pose.position.x, pose.position.y, pose.position.z = (float(v) for v in box[:3])
        qx, qy, qz, qw = yaw_to_quaternion(box[6])
        pose.orientation.x, pose.orientation.y, pose.orientation.z, pose.orientation.w = qx, qy, qz, qw
        obj.size.x, obj.size.y, obj.size.z = (float(v) for v in box[3:6])
        tw = obj.twist.twist
        tw.linear.x, tw.linear.y = float(vel[i, 0]), float(vel[i, 1])
        tw.angular.z = float(tracks.yaw_rates[i])
        pc = np.zeros(36)
        tc = np.zeros(36)
        if cov is not None:
            P = np.asarray(cov[i], np.float64)
            pc[[0, 1, 6, 7]] = P[:2, :2].reshape(-1)
            tc[[0, 1, 6, 7]] = P[2:, 2:].reshape(-1)
        obj.pose.covariance = pc
        obj.twist.covariance = tc
        obj.velocity_over_ground = over_ground
        out.objects.append(obj)
    return out


def msg_to_arrays(msg) -> DetectionArrays:
    """vision_msgs/Detection3DArray (rclpy or rosbags message) → DetectionArrays."""
    boxes, names, scores = [], [], []
    for det in msg.detections:
        c = det.bbox.center
        q = c.orientation
        s = det.bbox.size
        yaw = quaternion_to_yaw(q.x, q.y, q.z, q.w)
        boxes.append([c.position.x, c.position.y, c.position.z, s.x, s.y, s.z, yaw])
        if det.results:
            best = max(det.results, key=lambda r: r.hypothesis.score)
            names.append(str(best.hypothesis.class_id))
            scores.append(float(best.hypothesis.score))
        else:
            names.append("")
            scores.append(float("nan"))
    return DetectionArrays(
        stamp_ns=stamp_to_ns(msg.header.stamp),
        frame_id=str(msg.header.frame_id),
        boxes=np.asarray(boxes, dtype=np.float32).reshape(-1, 7),
        class_names=names,
        scores=np.asarray(scores, dtype=np.float32),
    )


def detections_to_markers(detections, header=None, *, stamp_ns: int | None = None,
                          frame_id: str | None = None, namespace: str = "livox_infer",
                          line_width: float = 0.06, text_height: float = 0.6, track_ids=None, tracks=None):
    """Detections → visualization_msgs/MarkerArray: DELETEALL, then per box a LINE_LIST of its
    12 edges and a TEXT_VIEW_FACING "class score" label above it, coloured per class.

    With ``track_ids`` (M,) a tracked box's label reads "#id class score"; with ``tracks`` (a tracker's
    TrackFrame) each confirmed track also gets an ARROW (namespace ``<ns>/velocities``) from its centre to where
    it will be in 1 s at its velocity (tracks slower than 0.2 m/s get none).
    The leading DELETEALL clears the previous frame's markers, so boxes that disappeared never
    linger in RViz whatever the count of the new frame.
    """
    from geometry_msgs.msg import Point
    from visualization_msgs.msg import Marker, MarkerArray

    hdr = _header(header, stamp_ns, frame_id)
    boxes = to_numpy(detections.boxes).reshape(-1, 7).astype(np.float64)
    scores = to_numpy(detections.scores).reshape(-1)
    names = detection_class_names(detections, len(boxes))
    if track_ids is None:
        track_ids = getattr(detections, "track_ids", None)
    if tracks is None:
        tracks = getattr(detections, "tracks", None)
    out = MarkerArray()
    clear = Marker()
    clear.header = hdr
    clear.action = Marker.DELETEALL
    out.markers.append(clear)
    for i, box in enumerate(boxes):
        r, g, b, a = CLASS_COLORS.get(names[i], _UNKNOWN_COLOR)
        edges = Marker()
        edges.header = hdr
        edges.ns = f"{namespace}/boxes"
        edges.id = i
        edges.type = Marker.LINE_LIST
        edges.action = Marker.ADD
        edges.pose.orientation.w = 1.0
        edges.scale.x = line_width
        edges.color.r, edges.color.g, edges.color.b, edges.color.a = r, g, b, a
        edges.points = [Point(x=float(p[0]), y=float(p[1]), z=float(p[2])) for p in box_edge_points(box)]
        out.markers.append(edges)

        label = Marker()
        label.header = hdr
        label.ns = f"{namespace}/labels"
        label.id = i
        label.type = Marker.TEXT_VIEW_FACING
        label.action = Marker.ADD
        label.pose.position.x, label.pose.position.y = float(box[0]), float(box[1])
        label.pose.position.z = float(box[2] + 0.5 * box[5] + 0.5 * text_height)
        label.pose.orientation.w = 1.0
        label.scale.z = text_height
        label.color.r, label.color.g, label.color.b, label.color.a = r, g, b, a
        label.text = f"{names[i]} {float(scores[i]):.2f}"
        if track_ids is not None and int(track_ids[i]) > 0:
            label.text = f"#{int(track_ids[i])} {label.text}"
        out.markers.append(label)
    if tracks is not None:
        tboxes = to_numpy(tracks.boxes).reshape(-1, 7).astype(np.float64)
        tvel = to_numpy(tracks.velocities).reshape(-1, 2).astype(np.float64)
        tnames = detection_class_names(tracks, len(tboxes))
        for i, box in enumerate(tboxes):
            if float(np.hypot(*tvel[i])) < 0.2:
                continue
            r, g, b, a = CLASS_COLORS.get(tnames[i], _UNKNOWN_COLOR)
            arrow = Marker()
            arrow.header = hdr
            arrow.ns = f"{namespace}/velocities"
            arrow.id = int(tracks.track_ids[i])
            arrow.type = Marker.ARROW
            arrow.action = Marker.ADD
            arrow.pose.orientation.w = 1.0
            arrow.scale.x, arrow.scale.y, arrow.scale.z = 0.15, 0.3, 0.3  # shaft, head diameter, head length
            arrow.color.r, arrow.color.g, arrow.color.b, arrow.color.a = r, g, b, a
            z = float(box[2] + 0.5 * box[5])
            arrow.points = [Point(x=float(box[0]), y=float(box[1]), z=z),
                            Point(x=float(box[0] + tvel[i, 0]), y=float(box[1] + tvel[i, 1]), z=z)]
            out.markers.append(arrow)
    return out


def percentile_summary(samples: Sequence[float]) -> tuple[float, float, float]:
    """(mean, p50, p99) of ``samples``; NaNs when empty."""
    if len(samples) == 0:
        return float("nan"), float("nan"), float("nan")
    a = np.asarray(samples, dtype=np.float64)
    return float(a.mean()), float(np.percentile(a, 50)), float(np.percentile(a, 99))


def diagnostic_status(name: str, hardware_id: str, level: int, message: str, values: dict):
    """diagnostic_msgs/DiagnosticStatus with ``values`` as string KeyValues (floats as %.3f)."""
    from diagnostic_msgs.msg import DiagnosticStatus, KeyValue

    st = DiagnosticStatus()
    st.level = bytes([level]) if isinstance(st.level, bytes) else level
    st.name = name
    st.hardware_id = hardware_id
    st.message = message
    for k, v in values.items():
        if isinstance(v, float):
            v = "nan" if math.isnan(v) else f"{v:.3f}"
        st.values.append(KeyValue(key=str(k), value=str(v)))
    return st


def diagnostic_values(status) -> dict[str, str]:
    """KeyValues of a DiagnosticStatus as a dict (tests, demo)."""
    return {kv.key: kv.value for kv in status.values}
