"""rosbag2 I/O (sqlite3 and mcap) with the pure-Python ``rosbags`` library; no ROS install needed.

* :func:`typestore` — ROS 2 Kilted types plus the Livox ``CustomMsg``/``CustomPoint`` of both
  driver packages (``livox_ros_driver2``, ``livox_interfaces``) and vision_msgs 4.x, registered
  from the ``.msg`` files in ``livox_infer/interfaces/<package>/msg/``.
* :func:`read_clouds` yields ``(topic, Cloud)`` for every PointCloud2 (any layout) and CustomMsg.
* :func:`read_detections` yields :class:`DetectionFrame` ``(stamp_ns, boxes, labels, scores)``.
* :class:`BagWriter` writes PointCloud2, CustomMsg and Detection3DArray messages; its mcap chunks carry
  the CRC32 the format provides (rosbags writes 0 = none), so a damaged chunk fails to read instead of
  being read silently.
* :func:`bag_info` lists topics, types and message counts.

CustomMsg payloads go through the hand codec in :mod:`livox_infer.decode.custom_msg`; PointCloud2
through rosbags (:func:`to_rosbags_message`, :func:`pointcloud2_to_cdr`, :func:`pointcloud2_from_cdr`).
"""

from __future__ import annotations

import functools
import math
import struct
import zlib
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Sequence

import numpy as np

from livox_infer import CLASS_NAMES
from livox_infer.errors import PointCloudError
from livox_infer.decode.custom_msg import CUSTOM_MSG_TYPES, custom_msg_to_cloud, decode_custom_msg_cdr, encode_custom_msg_cdr
from livox_infer.detector.boxes import quaternion_to_yaw, wrap_angle, yaw_to_quaternion
from livox_infer.decode.pointcloud import (
    PointCloud2Data,
    Cloud,
    DecodeFilter,
    decode_pointcloud2,
    from_message,
)

INTERFACES_DIR = Path(__file__).resolve().parent / "interfaces"
POINTCLOUD2 = "sensor_msgs/msg/PointCloud2"
DETECTION3D_ARRAY = "vision_msgs/msg/Detection3DArray"
CLOUD_TYPES = (POINTCLOUD2, *CUSTOM_MSG_TYPES)
DEFAULT_GT_TOPIC = "/livox_infer/ground_truth"
DEFAULT_GT_TRACKS_TOPIC = "/livox_infer/ground_truth_tracks"
DEFAULT_ODOMETRY_TOPIC = "/livox_infer/odometry"
ODOMETRY = "nav_msgs/msg/Odometry"
TRACKED_OBJECTS = "livox_infer_msgs/msg/TrackedObjects"
STORAGES = ("sqlite3", "mcap")

# --------------------------------------------------------------------------- typestore


def interface_files() -> dict[str, Path]:
    """``{"pkg/msg/Name": path}`` for every .msg file shipped in livox_infer/interfaces."""
    files = {f"{p.parent.parent.name}/msg/{p.stem}": p for p in sorted(INTERFACES_DIR.glob("*/msg/*.msg"))}
    if not files:
        raise FileNotFoundError(
            f"no .msg files under {INTERFACES_DIR}; the package was installed without its interface "
            "definitions (setup.py package_data must include livox_infer/interfaces/**/*.msg)"
        )
    return files


@functools.lru_cache(maxsize=1)
def typestore() -> Any:
    """The shared rosbags Typestore: ROS 2 Kilted + Livox CustomMsg (both packages) + vision_msgs."""
    from rosbags.typesys import Stores, get_types_from_msg, get_typestore

    store = get_typestore(Stores.ROS2_KILTED)
    types: dict[str, Any] = {}
    for name, path in interface_files().items():
        types.update(get_types_from_msg(path.read_text(encoding="utf-8"), name))
    store.register(types)
    return store


# --------------------------------------------------------------------------- ROS message bridges


def to_rosbags_message(data: PointCloud2Data, store: Any = None) -> Any:
    """A rosbags ``sensor_msgs/msg/PointCloud2`` object built from ``data``."""
    if store is None:
        store = typestore()
    types = store.types
    Header, Time = types["std_msgs/msg/Header"], types["builtin_interfaces/msg/Time"]
    RosPointField, RosPointCloud2 = types["sensor_msgs/msg/PointField"], types["sensor_msgs/msg/PointCloud2"]
    return RosPointCloud2(
        header=Header(stamp=Time(sec=int(data.stamp_sec), nanosec=int(data.stamp_nanosec)), frame_id=data.frame_id),
        height=int(data.height), width=int(data.width),
        fields=[RosPointField(name=f.name, offset=int(f.offset), datatype=int(f.datatype), count=int(f.count))
                for f in data.fields],
        is_bigendian=bool(data.is_bigendian), point_step=int(data.point_step), row_step=int(data.row_step),
        data=np.frombuffer(data.data, dtype=np.uint8), is_dense=bool(data.is_dense),
    )


def pointcloud2_to_cdr(data: PointCloud2Data, store: Any = None) -> bytes:
    """Serialized CDR bytes of ``data`` as sensor_msgs/msg/PointCloud2 (``publisher.publish(raw)``)."""
    msg = to_rosbags_message(data, store)
    if store is None:
        store = typestore()
    return bytes(store.serialize_cdr(msg, "sensor_msgs/msg/PointCloud2"))


def pointcloud2_from_cdr(raw: bytes | memoryview, store: Any = None) -> Any:
    """Deserialize CDR bytes of sensor_msgs/msg/PointCloud2 into a rosbags message (decodable)."""
    if store is None:
        store = typestore()
    try:
        return store.deserialize_cdr(raw, "sensor_msgs/msg/PointCloud2")
    except Exception as exc:  # rosbags raises assorted errors on truncated buffers
        raise PointCloudError(f"cannot deserialize PointCloud2 CDR ({len(raw)} bytes): {exc}") from None



# --------------------------------------------------------------------------- Detection3DArray


def _check_boxes(boxes: Any, labels: Any, scores: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 7) if np.size(boxes) else np.zeros((0, 7))
    m = boxes.shape[0]
    labels = np.asarray(labels, dtype=np.int64).reshape(-1)
    scores = np.ones(m) if scores is None else np.asarray(scores, dtype=np.float64).reshape(-1)
    if labels.shape != (m,) or scores.shape != (m,):
        raise PointCloudError(f"boxes ({m}), labels ({labels.shape[0]}) and scores ({scores.shape[0]}) disagree in length")
    if m and (labels.min() < 0 or labels.max() >= len(CLASS_NAMES)):
        raise PointCloudError(f"labels must index CLASS_NAMES {CLASS_NAMES}, got {labels.tolist()}")
    if not np.isfinite(boxes).all():
        raise PointCloudError("boxes contain non-finite values")
    return boxes, labels, scores


def detection3d_array_message(stamp_ns: int, frame_id: str, boxes: Any, labels: Any, scores: Any = None,
                              store: Any = None, ids: Any = None) -> Any:
    """A rosbags vision_msgs/msg/Detection3DArray for boxes (M,7) [x,y,z,l,w,h,yaw] (z = centre); Detection3D.id =
    ``ids[i]`` (e.g. the simulator's object id), else the index."""
    boxes, labels, scores = _check_boxes(boxes, labels, scores)
    t = (store or typestore()).types
    Time, Header = t["builtin_interfaces/msg/Time"], t["std_msgs/msg/Header"]
    Pose, Point, Quaternion = t["geometry_msgs/msg/Pose"], t["geometry_msgs/msg/Point"], t["geometry_msgs/msg/Quaternion"]
    sec, nanosec = divmod(int(stamp_ns), 1_000_000_000)
    header = Header(stamp=Time(sec=sec, nanosec=nanosec), frame_id=str(frame_id))
    detections = []
    for i, (box, label, score) in enumerate(zip(boxes, labels, scores)):
        qx, qy, qz, qw = yaw_to_quaternion(float(box[6]))
        pose = Pose(position=Point(x=float(box[0]), y=float(box[1]), z=float(box[2])),
                    orientation=Quaternion(x=qx, y=qy, z=qz, w=qw))
        hypothesis = t["vision_msgs/msg/ObjectHypothesisWithPose"](
            hypothesis=t["vision_msgs/msg/ObjectHypothesis"](class_id=CLASS_NAMES[int(label)], score=float(score)),
            pose=t["geometry_msgs/msg/PoseWithCovariance"](pose=pose, covariance=np.zeros(36, dtype=np.float64)),
        )
        bbox = t["vision_msgs/msg/BoundingBox3D"](
            center=pose, size=t["geometry_msgs/msg/Vector3"](x=float(box[3]), y=float(box[4]), z=float(box[5])))
        det_id = str(int(ids[i])) if ids is not None else str(i)
        detections.append(t["vision_msgs/msg/Detection3D"](header=header, results=[hypothesis], bbox=bbox, id=det_id))
    return t[DETECTION3D_ARRAY](header=header, detections=detections)


def detection3d_array_cdr(stamp_ns: int, frame_id: str, boxes: Any, labels: Any, scores: Any = None) -> bytes:
    """Serialized CDR bytes of a Detection3DArray (``publisher.publish(raw)`` in the node)."""
    msg = detection3d_array_message(stamp_ns, frame_id, boxes, labels, scores)
    return bytes(typestore().serialize_cdr(msg, DETECTION3D_ARRAY))


class DetectionFrame(NamedTuple):
    stamp_ns: int
    boxes: np.ndarray  # (M, 7) float32
    labels: np.ndarray  # (M,) int64
    scores: np.ndarray  # (M,) float32


def detections_from_message(msg: Any) -> DetectionFrame:
    """Convert a Detection3DArray (rosbags or rclpy object) into arrays; yaw from the quaternion."""
    boxes, labels, scores = [], [], []
    for det in msg.detections:
        if not det.results:
            raise PointCloudError("Detection3D without results (no class_id)")
        best = max(det.results, key=lambda r: r.hypothesis.score)
        class_id = best.hypothesis.class_id
        if class_id not in CLASS_NAMES:
            raise PointCloudError(f"unknown class_id {class_id!r}; expected one of {CLASS_NAMES}")
        c, s, q = det.bbox.center.position, det.bbox.size, det.bbox.center.orientation
        yaw = quaternion_to_yaw(q.x, q.y, q.z, q.w)
        boxes.append([c.x, c.y, c.z, s.x, s.y, s.z, yaw])
        labels.append(CLASS_NAMES.index(class_id))
        scores.append(best.hypothesis.score)
    arr = np.asarray(boxes, dtype=np.float64).reshape(-1, 7)
    arr[:, 6] = wrap_angle(arr[:, 6])
    stamp = msg.header.stamp
    return DetectionFrame(int(stamp.sec) * 1_000_000_000 + int(stamp.nanosec), arr.astype(np.float32),
                          np.asarray(labels, dtype=np.int64), np.asarray(scores, dtype=np.float32))


# --------------------------------------------------------------------------- reading


def _open_reader(path: str | Path) -> Any:
    from rosbags.rosbag2 import Reader

    path = Path(path)
    if not path.exists():
        raise PointCloudError(f"bag not found: {path}")
    try:
        reader = Reader(path)
        reader.open()
    except PointCloudError:
        raise
    except Exception as exc:  # rosbags / sqlite3 / mcap / yaml errors on a damaged bag
        raise PointCloudError(f"cannot open bag {path}: {type(exc).__name__}: {one_line(exc)}") from None
    return reader


def one_line(exc: BaseException) -> str:
    """An exception's text on one line (YAML and sqlite errors span several, with a caret drawing)."""
    return " ".join(str(exc).split())


def _messages(reader: Any, connections: Sequence[Any], path: Path) -> Iterator[tuple[Any, int, Any]]:
    if not connections:  # rosbags reads every connection when given none
        return
    try:
        yield from reader.messages(connections=connections)
    except PointCloudError:
        raise
    except Exception as exc:
        raise PointCloudError(f"cannot read messages from bag {path}: {type(exc).__name__}: {one_line(exc)}") from None


def _select(reader: Any, topic: str | Iterable[str] | None, wanted: Sequence[str], path: Path) -> list[Any]:
    conns = list(reader.connections)
    if topic is None:
        return [c for c in conns if c.msgtype in wanted]
    topics = {topic} if isinstance(topic, str) else set(topic)
    chosen = [c for c in conns if c.topic in topics]
    missing = topics - {c.topic for c in chosen}
    if missing:
        available = sorted(f"{c.topic} ({c.msgtype})" for c in conns)
        raise PointCloudError(f"topic(s) {sorted(missing)} not in bag {path}; it has {available}")
    wrong = [f"{c.topic} ({c.msgtype})" for c in chosen if c.msgtype not in wanted]
    if wrong:
        raise PointCloudError(f"topic(s) {wrong} in {path} are not of type {' / '.join(wanted)}")
    return chosen


def read_clouds(path: str | Path, topic: str | Iterable[str] | None = None,
                filters: DecodeFilter | None = None,
                on_bad_message: Callable[[str], None] | None = None) -> Iterator[tuple[str, Cloud]]:
    """Yield ``(topic, Cloud)`` in bag order for PointCloud2 and Livox CustomMsg topics.

    ``topic`` None reads every cloud topic; a named topic that is missing or not a cloud type
    raises PointCloudError, as does a missing or damaged bag. A message that does not deserialize or decode
    raises too, unless ``on_bad_message`` is given: then it is called with the reason and the message skipped
    (an archive keeps the good frames around one corrupt message).
    """
    path = Path(path)
    store = typestore()
    reader = _open_reader(path)
    try:
        conns = _select(reader, topic, CLOUD_TYPES, path)
        for index, (conn, stamp, raw) in enumerate(_messages(reader, conns, path)):
            what = f"{path}:{conn.topic}"
            try:
                if conn.msgtype == POINTCLOUD2:
                    try:
                        msg = store.deserialize_cdr(raw, POINTCLOUD2)
                    except Exception as exc:
                        raise PointCloudError(f"{what}: cannot deserialize PointCloud2: {exc}") from None
                    cloud = decode_pointcloud2(msg, filters=filters)
                else:
                    cloud = custom_msg_to_cloud(decode_custom_msg_cdr(raw, what), filters)
            except PointCloudError as exc:
                if on_bad_message is None:
                    raise
                on_bad_message(f"message {index} (bag time {stamp} ns): {exc}")
                continue
            yield conn.topic, cloud
    finally:
        reader.close()


def read_detections(path: str | Path, topic: str = DEFAULT_GT_TOPIC) -> Iterator[DetectionFrame]:
    """Yield :class:`DetectionFrame` ``(stamp_ns, boxes (M,7), labels (M,), scores (M,))``."""
    path = Path(path)
    store = typestore()
    reader = _open_reader(path)
    try:
        conns = _select(reader, topic, (DETECTION3D_ARRAY,), path)
        for _, _, raw in _messages(reader, conns, path):
            try:
                msg = store.deserialize_cdr(raw, DETECTION3D_ARRAY)
            except Exception as exc:
                raise PointCloudError(f"{path}:{topic}: cannot deserialize Detection3DArray: {exc}") from None
            yield detections_from_message(msg)
    finally:
        reader.close()


def bag_info(path: str | Path) -> dict[str, Any]:
    """``{"path", "start_ns", "end_ns", "duration_ns", "message_count", "topics": {topic: {"type", "count"}}}``;
    start/end are the first and last message timestamps."""
    path = Path(path)
    reader = _open_reader(path)
    try:
        topics: dict[str, dict[str, Any]] = {}
        for conn in reader.connections:
            entry = topics.setdefault(conn.topic, {"type": conn.msgtype, "count": 0})
            entry["count"] += int(conn.msgcount)
        count = int(reader.message_count)
        return {
            "path": str(path),
            "start_ns": int(reader.start_time) if count else 0,
            # rosbags' end_time is one past the last message
            "end_ns": int(reader.end_time) - 1 if count else 0,
            "duration_ns": int(reader.end_time) - 1 - int(reader.start_time) if count else 0,
            "message_count": count,
            "topics": topics,
        }
    finally:
        reader.close()


# --------------------------------------------------------------------------- writing


_MCAP_MAGIC = b"\x89MCAP0\r\n"
_MCAP_CHUNK, _MCAP_FOOTER = 0x06, 0x02
_RECORD_HEAD = struct.Struct("<BQ")  # opcode, content length
_CHUNK_HEAD = struct.Struct("<QQQI")  # message start / end time, uncompressed size, uncompressed CRC32


def add_mcap_chunk_crcs(path: Path) -> int:
    """Fill in the CRC32 of every uncompressed mcap chunk whose CRC field is 0 (in place); returns how many.
    Readers (rosbags, the mcap libraries) then check it, so flipped bytes are an error, not silent data."""
    n = 0
    with open(path, "r+b") as f:
        if f.read(len(_MCAP_MAGIC)) != _MCAP_MAGIC:
            raise PointCloudError(f"{path} is not an mcap file")
        while head := f.read(_RECORD_HEAD.size):
            if len(head) < _RECORD_HEAD.size:
                break
            opcode, length = _RECORD_HEAD.unpack(head)
            start = f.tell()
            if opcode == _MCAP_FOOTER:
                break
            if opcode == _MCAP_CHUNK:
                content = f.read(length)
                *_, size, crc = _CHUNK_HEAD.unpack_from(content)
                (clen,) = struct.unpack_from("<I", content, _CHUNK_HEAD.size)
                compression = content[_CHUNK_HEAD.size + 4 : _CHUNK_HEAD.size + 4 + clen]
                records = content[_CHUNK_HEAD.size + 4 + clen + 8 :]
                if crc == 0 and compression == b"" and len(records) == size:
                    f.seek(start + _CHUNK_HEAD.size - 4)
                    f.write(struct.pack("<I", zlib.crc32(records)))
                    n += 1
            f.seek(start + length)
    return n


class BagWriter:
    """Write a rosbag2 (``storage`` "sqlite3" or "mcap"); use as a context manager.

    Each ``write_*`` takes an optional ``timestamp_ns`` (the bag's receive time); by default the
    message's header stamp is used.
    """

    def __init__(self, path: str | Path, storage: str = "sqlite3") -> None:
        from rosbags.rosbag2 import StoragePlugin, Writer

        if storage not in STORAGES:
            raise PointCloudError(f"storage must be one of {STORAGES}, got {storage!r}")
        self.path = Path(path)
        if self.path.exists():
            raise PointCloudError(f"{self.path} exists already; BagWriter does not overwrite bags")
        plugin = StoragePlugin.SQLITE3 if storage == "sqlite3" else StoragePlugin.MCAP
        self._writer = Writer(self.path, version=9, storage_plugin=plugin)
        self._writer.open()
        self._connections: dict[tuple[str, str], Any] = {}
        self._store = typestore()
        self._closed = False

    def __enter__(self) -> "BagWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._writer.close()
            for mcap in self.path.glob("*.mcap"):
                add_mcap_chunk_crcs(mcap)

    def _connection(self, topic: str, msgtype: str) -> Any:
        key = (topic, msgtype)
        if key not in self._connections:
            others = [t for (tp, t) in self._connections if tp == topic]
            if others:
                raise PointCloudError(f"topic {topic} already carries {others[0]}, cannot also write {msgtype}")
            self._connections[key] = self._writer.add_connection(topic, msgtype, typestore=self._store)
        return self._connections[key]

    def write_raw(self, topic: str, msgtype: str, cdr: bytes, timestamp_ns: int) -> None:
        """Write already-serialized CDR bytes of ``msgtype``."""
        if self._closed:
            raise PointCloudError(f"bag {self.path} is closed")
        self._writer.write(self._connection(topic, msgtype), int(timestamp_ns), cdr)

    def write_cloud(self, topic: str, data: Any, timestamp_ns: int | None = None) -> None:
        """Write a PointCloud2Data (or any PointCloud2-shaped message) as sensor_msgs/msg/PointCloud2."""
        data = from_message(data)
        raw = self._store.serialize_cdr(to_rosbags_message(data, self._store), POINTCLOUD2)
        self.write_raw(topic, POINTCLOUD2, raw, data.stamp_ns if timestamp_ns is None else timestamp_ns)

    def write_custom_msg(self, topic: str, points: Any, *, time: Any = None, tag: Any = None, line: Any = None,
                         stamp_ns: int = 0, frame_id: str = "livox_frame", timebase: int | None = None,
                         lidar_id: int = 0, package: str = "livox_ros_driver2",
                         timestamp_ns: int | None = None) -> None:
        """Write a Livox CustomMsg (``package`` "livox_ros_driver2" or "livox_interfaces")."""
        msgtype = f"{package}/msg/CustomMsg"
        if msgtype not in CUSTOM_MSG_TYPES:
            raise PointCloudError(f"package must be livox_ros_driver2 or livox_interfaces, got {package!r}")
        raw = encode_custom_msg_cdr(points, time=time, tag=tag, line=line, stamp_ns=stamp_ns,
                                    frame_id=frame_id, timebase=timebase, lidar_id=lidar_id)
        self.write_raw(topic, msgtype, raw, stamp_ns if timestamp_ns is None else timestamp_ns)

    def write_detections(self, topic: str, stamp_ns: int, frame_id: str, boxes: Any, labels: Any,
                         scores: Any = None, timestamp_ns: int | None = None, ids: Any = None) -> None:
        """Write a vision_msgs Detection3DArray (class_id = CLASS_NAMES[label], score 1 if None, id = ids[i] or
        the index)."""
        msg = detection3d_array_message(stamp_ns, frame_id, boxes, labels, scores, self._store, ids)
        raw = self._store.serialize_cdr(msg, DETECTION3D_ARRAY)
        self.write_raw(topic, DETECTION3D_ARRAY, raw, stamp_ns if timestamp_ns is None else timestamp_ns)

    def write_odometry(self, topic: str, stamp_ns: int, frame_id: str, child_frame_id: str, pose: Any) -> None:
        """Write a nav_msgs/Odometry with the 4x4 ``pose`` (``frame_id``-from-``child_frame_id``); twist zero."""
        t = self._store.types
        pose = np.asarray(pose, dtype=np.float64).reshape(4, 4)
        qx, qy, qz, qw = _quaternion(pose[:3, :3])
        sec, nanosec = divmod(int(stamp_ns), 1_000_000_000)
        msg = t[ODOMETRY](
            header=t["std_msgs/msg/Header"](stamp=t["builtin_interfaces/msg/Time"](sec=sec, nanosec=nanosec),
                                            frame_id=str(frame_id)),
            child_frame_id=str(child_frame_id),
            pose=t["geometry_msgs/msg/PoseWithCovariance"](
                pose=t["geometry_msgs/msg/Pose"](
                    position=t["geometry_msgs/msg/Point"](x=float(pose[0, 3]), y=float(pose[1, 3]), z=float(pose[2, 3])),
                    orientation=t["geometry_msgs/msg/Quaternion"](x=qx, y=qy, z=qz, w=qw)),
                covariance=np.zeros(36, dtype=np.float64)),
            twist=t["geometry_msgs/msg/TwistWithCovariance"](
                twist=t["geometry_msgs/msg/Twist"](linear=t["geometry_msgs/msg/Vector3"](x=0.0, y=0.0, z=0.0),
                                                   angular=t["geometry_msgs/msg/Vector3"](x=0.0, y=0.0, z=0.0)),
                covariance=np.zeros(36, dtype=np.float64)))
        self.write_raw(topic, ODOMETRY, self._store.serialize_cdr(msg, ODOMETRY), int(stamp_ns))

    def write_tracked_objects(self, topic: str, stamp_ns: int, frame_id: str, boxes: Any, labels: Any, ids: Any,
                              velocities: Any) -> None:
        """Write ground-truth tracks as livox_infer_msgs/TrackedObjects (the node's ~/tracked_objects type):
        track_id = the id, class_id = the class name, pose = box centre + heading, size l, w, h, twist.linear =
        the velocity in the header frame's axes, score 1, velocity_over_ground true."""
        boxes, labels, _ = _check_boxes(boxes, labels, None)
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        vel = np.asarray(velocities, dtype=np.float64).reshape(-1, 2)
        if len(ids) != len(boxes) or len(vel) != len(boxes):
            raise PointCloudError(f"boxes ({len(boxes)}), ids ({len(ids)}) and velocities ({len(vel)}) disagree")
        if (ids < 0).any():
            raise PointCloudError(f"track ids must be >= 0, got {int(ids.min())}")
        t = self._store.types
        sec, nanosec = divmod(int(stamp_ns), 1_000_000_000)
        header = t["std_msgs/msg/Header"](stamp=t["builtin_interfaces/msg/Time"](sec=sec, nanosec=nanosec),
                                          frame_id=str(frame_id))
        vec3 = t["geometry_msgs/msg/Vector3"]
        objects = []
        for box, label, oid, v in zip(boxes, labels, ids, vel):
            qx, qy, qz, qw = yaw_to_quaternion(float(box[6]))
            objects.append(t["livox_infer_msgs/msg/TrackedObject"](
                track_id=int(oid),
                class_id=CLASS_NAMES[int(label)] if 0 <= int(label) < len(CLASS_NAMES) else "",
                score=1.0, age=0,
                pose=t["geometry_msgs/msg/PoseWithCovariance"](
                    pose=t["geometry_msgs/msg/Pose"](
                        position=t["geometry_msgs/msg/Point"](x=float(box[0]), y=float(box[1]), z=float(box[2])),
                        orientation=t["geometry_msgs/msg/Quaternion"](x=qx, y=qy, z=qz, w=qw)),
                    covariance=np.zeros(36, dtype=np.float64)),
                size=vec3(x=float(box[3]), y=float(box[4]), z=float(box[5])),
                twist=t["geometry_msgs/msg/TwistWithCovariance"](
                    twist=t["geometry_msgs/msg/Twist"](linear=vec3(x=float(v[0]), y=float(v[1]), z=0.0),
                                                       angular=vec3(x=0.0, y=0.0, z=0.0)),
                    covariance=np.zeros(36, dtype=np.float64)),
                velocity_over_ground=True))
        msg = t[TRACKED_OBJECTS](header=header, objects=objects)
        self.write_raw(topic, TRACKED_OBJECTS, self._store.serialize_cdr(msg, TRACKED_OBJECTS), int(stamp_ns))


def _quaternion(rot: np.ndarray) -> tuple[float, float, float, float]:
    """(x, y, z, w) of a rotation matrix."""
    m = rot
    w = math.sqrt(max(0.0, 1.0 + m[0, 0] + m[1, 1] + m[2, 2])) / 2
    x = math.copysign(math.sqrt(max(0.0, 1.0 + m[0, 0] - m[1, 1] - m[2, 2])) / 2, m[2, 1] - m[1, 2])
    y = math.copysign(math.sqrt(max(0.0, 1.0 - m[0, 0] + m[1, 1] - m[2, 2])) / 2, m[0, 2] - m[2, 0])
    z = math.copysign(math.sqrt(max(0.0, 1.0 - m[0, 0] - m[1, 1] + m[2, 2])) / 2, m[1, 0] - m[0, 1])
    return x, y, z, w


class TrackFrameGT(NamedTuple):
    stamp_ns: int
    boxes: np.ndarray  # (M, 7)
    labels: np.ndarray  # (M,)
    ids: np.ndarray  # (M,) int64
    velocities: np.ndarray  # (M, 2) m/s in the header frame's axes


def read_tracked_objects(path: str | Path, topic: str = DEFAULT_GT_TRACKS_TOPIC) -> Iterator[TrackFrameGT]:
    """Ground-truth tracks as written by :meth:`BagWriter.write_tracked_objects` (ids, velocities in the header
    frame's axes)."""
    path = Path(path)
    store = typestore()
    reader = _open_reader(path)
    try:
        conns = _select(reader, topic, (TRACKED_OBJECTS,), path)
        for _, _, raw in _messages(reader, conns, path):
            msg = store.deserialize_cdr(raw, TRACKED_OBJECTS)
            boxes, labels, ids, vel = [], [], [], []
            for o in msg.objects:
                p = o.pose.pose
                yaw = quaternion_to_yaw(p.orientation.x, p.orientation.y, p.orientation.z, p.orientation.w)
                d = o.size
                boxes.append([p.position.x, p.position.y, p.position.z, d.x, d.y, d.z, yaw])
                labels.append(CLASS_NAMES.index(o.class_id) if o.class_id in CLASS_NAMES else -1)
                ids.append(int(o.track_id))
                vel.append([o.twist.twist.linear.x, o.twist.twist.linear.y])
            yield TrackFrameGT(stamp_ns=msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec,
                               boxes=np.asarray(boxes, np.float32).reshape(-1, 7), labels=np.asarray(labels, np.int64),
                               ids=np.asarray(ids, np.int64), velocities=np.asarray(vel, np.float32).reshape(-1, 2))
    finally:
        reader.close()


def read_poses(path: str | Path, topic: str) -> list[tuple[int, np.ndarray]]:
    """(stamp_ns, 4x4 pose) of every nav_msgs/Odometry on ``topic``."""
    from livox_infer.accumulate import pose_matrix

    path = Path(path)
    store = typestore()
    reader = _open_reader(path)
    out = []
    try:
        conns = _select(reader, topic, (ODOMETRY,), path)
        for _, _, raw in _messages(reader, conns, path):
            msg = store.deserialize_cdr(raw, ODOMETRY)
            p, q = msg.pose.pose.position, msg.pose.pose.orientation
            out.append((msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec,
                        pose_matrix((p.x, p.y, p.z), (q.x, q.y, q.z, q.w))))
    finally:
        reader.close()
    return out
