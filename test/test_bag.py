"""rosbag2 I/O: typestore, Livox CustomMsg codec, read_clouds / read_detections / BagWriter / bag_info."""

from __future__ import annotations

import math

import numpy as np
import pytest
from rosbags.rosbag2 import StoragePlugin, Writer

from livox_infer import CLASS_NAMES
from livox_infer.decode.custom_msg import (
    CUSTOM_MSG_TYPES,
    custom_msg_to_cloud,
    decode_custom_msg_cdr,
    encode_custom_msg_cdr,
)
from livox_infer.bags import (
    DEFAULT_GT_TOPIC,
    BagWriter,
    bag_info,
    detection3d_array_cdr,
    interface_files,
    read_clouds,
    read_detections,
    typestore,
)
from livox_infer.errors import PointCloudError
from livox_infer.decode.pointcloud import DecodeFilter, encode_pointcloud2

STAMP_NS = 1_700_000_000_000_000_000
# RIHS01 hash of vision_msgs/msg/Detection3DArray in vision_msgs 4.x (what a ROS 2 Jazzy/Kilted graph expects)
VISION_MSGS_DETECTION3DARRAY_RIHS01 = "RIHS01_793f5eab9595ac1c0da07873cc859db42eae51f0ee76056db8562515d830e018"


def points(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    p = rng.uniform(-30, 30, (n, 4)).astype(np.float32)
    p[:, 3] = rng.integers(0, 256, n)
    return p


def rosbags_custom_msg(msgtype: str, pts: np.ndarray, offsets_ns, tags, lines, stamp_ns: int, timebase: int,
                       frame_id: str = "livox_frame"):
    """A CustomMsg built the slow, independent way: rosbags objects, one per point."""
    t = typestore().types
    pkg = msgtype.split("/")[0]
    cp = t[f"{pkg}/msg/CustomPoint"]
    sec, nsec = divmod(stamp_ns, 10**9)
    return t[msgtype](
        header=t["std_msgs/msg/Header"](stamp=t["builtin_interfaces/msg/Time"](sec=sec, nanosec=nsec), frame_id=frame_id),
        timebase=timebase, point_num=len(pts), lidar_id=1, rsvd=np.zeros(3, np.uint8),
        points=[cp(offset_time=int(o), x=float(p[0]), y=float(p[1]), z=float(p[2]), reflectivity=int(p[3]),
                   tag=int(g), line=int(ln)) for p, o, g, ln in zip(pts, offsets_ns, tags, lines)],
    )


# --------------------------------------------------------------------------- typestore


def test_typestore_registers_all_interfaces_and_hashes_them():
    store = typestore()
    names = set(interface_files())
    assert {"livox_ros_driver2/msg/CustomMsg", "livox_ros_driver2/msg/CustomPoint", "livox_interfaces/msg/CustomMsg",
            "livox_interfaces/msg/CustomPoint", "vision_msgs/msg/Detection3DArray"} <= names
    for name in names:
        digest = store.hash_rihs01(name)
        assert digest.startswith("RIHS01_") and len(digest) == 7 + 64
    assert store.hash_rihs01("vision_msgs/msg/Detection3DArray") == VISION_MSGS_DETECTION3DARRAY_RIHS01
    fields = [f[0] for f in store.get_msgdef("livox_ros_driver2/msg/CustomPoint").fields]
    assert fields == ["offset_time", "x", "y", "z", "reflectivity", "tag", "line"]


# --------------------------------------------------------------------------- CustomMsg codec


@pytest.mark.parametrize("msgtype", CUSTOM_MSG_TYPES)
@pytest.mark.parametrize("n,frame_id", [(0, "f"), (1, "livox_frame"), (7, "abc"), (33, "a_longer_frame_id")])
def test_custom_msg_codec_matches_rosbags_byte_for_byte(msgtype, n, frame_id):
    pts = points(n)
    offsets = np.arange(n) * 1000
    tags, lines = np.arange(n) % 64, np.arange(n) % 6
    ref = rosbags_custom_msg(msgtype, pts, offsets, tags, lines, STAMP_NS + 5, STAMP_NS + 5, frame_id)
    ref_raw = bytes(typestore().serialize_cdr(ref, msgtype))
    ours = encode_custom_msg_cdr(pts, time=offsets * 1e-9, tag=tags, line=lines, stamp_ns=STAMP_NS + 5,
                                 frame_id=frame_id, lidar_id=1)
    assert ours == ref_raw
    dec = decode_custom_msg_cdr(ref_raw)
    assert (dec.stamp_ns, dec.frame_id, dec.timebase, dec.lidar_id) == (STAMP_NS + 5, frame_id, STAMP_NS + 5, 1)
    np.testing.assert_array_equal(dec.points["offset_time"], offsets)
    np.testing.assert_array_equal(np.c_[dec.points["x"], dec.points["y"], dec.points["z"]], pts[:, :3])
    np.testing.assert_array_equal(dec.points["reflectivity"], pts[:, 3])
    np.testing.assert_array_equal(dec.points["tag"], tags)
    np.testing.assert_array_equal(dec.points["line"], lines)


def test_custom_msg_time_is_timebase_plus_offset_relative_to_header():
    pts = points(10)
    # timebase 3 ms after the header stamp: times are offsets + 3 ms
    raw = encode_custom_msg_cdr(pts, time=np.arange(10) * 1e-3 + 3e-3, stamp_ns=STAMP_NS, timebase=STAMP_NS + 3_000_000)
    assert decode_custom_msg_cdr(raw).points["offset_time"][1] == 1_000_000
    cloud = custom_msg_to_cloud(decode_custom_msg_cdr(raw))
    np.testing.assert_allclose(cloud.time, np.arange(10) * 1e-3 + 3e-3, atol=1e-12)
    # header from another clock: times are relative to timebase
    raw = encode_custom_msg_cdr(pts, time=np.arange(10) * 1e-3, stamp_ns=5, timebase=STAMP_NS)
    np.testing.assert_allclose(custom_msg_to_cloud(decode_custom_msg_cdr(raw)).time, np.arange(10) * 1e-3, atol=1e-12)


@pytest.mark.parametrize("cut", [3, 10, 30, -1])
def test_truncated_custom_msg_raises(cut):
    raw = encode_custom_msg_cdr(points(5), stamp_ns=STAMP_NS)
    with pytest.raises(PointCloudError):
        decode_custom_msg_cdr(raw[:cut])


def test_custom_msg_point_num_mismatch_and_big_endian_raise():
    raw = bytearray(encode_custom_msg_cdr(points(5), stamp_ns=STAMP_NS, frame_id="abc"))
    # point_num sits after header (4+4+4+4 bytes incl. "abc\0") and the 8-aligned uint64 timebase
    raw[4 + 16 + 8:4 + 16 + 12] = (6).to_bytes(4, "little")
    with pytest.raises(PointCloudError, match="point_num"):
        decode_custom_msg_cdr(bytes(raw))
    with pytest.raises(PointCloudError, match="little-endian"):
        decode_custom_msg_cdr(b"\x00\x00\x00\x00" + bytes(raw[4:]))


def test_custom_msg_rejects_times_outside_uint32():
    with pytest.raises(PointCloudError):
        encode_custom_msg_cdr(points(2), time=[0.0, 5.0], stamp_ns=STAMP_NS)  # 5 s > 2**32 ns
    with pytest.raises(PointCloudError):
        encode_custom_msg_cdr(points(2), time=[-1e-3, 0.0], stamp_ns=STAMP_NS)


# --------------------------------------------------------------------------- reading bags


@pytest.mark.parametrize("storage", ["sqlite3", "mcap"])
def test_read_custom_msg_from_bag_written_by_rosbags(tmp_path, storage):
    store = typestore()
    path = tmp_path / "bag"
    frames = {}
    with Writer(path, version=9, storage_plugin=StoragePlugin[storage.upper()]) as writer:
        for k, msgtype in enumerate(CUSTOM_MSG_TYPES):
            topic = f"/{msgtype.split('/')[0]}"
            conn = writer.add_connection(topic, msgtype, typestore=store)
            pts = points(50, seed=k)
            pts[0, :3] = 0.0  # no-return point: dropped on read
            tags = np.where(np.arange(50) % 5 == 0, 1, 16)  # every 5th point spatial noise (high confidence)
            stamp = STAMP_NS + k * 100_000_000
            msg = rosbags_custom_msg(msgtype, pts, np.arange(50) * 2000, tags, np.arange(50) % 6, stamp, stamp)
            writer.write(conn, stamp, store.serialize_cdr(msg, msgtype))
            frames[topic] = (pts, tags, stamp)

    seen = []
    for topic, cloud in read_clouds(path):
        pts, tags, stamp = frames[topic]
        seen.append(topic)
        np.testing.assert_array_equal(cloud.points, pts[1:])
        np.testing.assert_allclose(cloud.time, np.arange(1, 50) * 2e-6, atol=1e-12)
        np.testing.assert_array_equal(cloud.tag, tags[1:])
        assert cloud.stamp_ns == stamp and cloud.frame_id == "livox_frame"
    assert sorted(seen) == sorted(frames)

    strict = [c for _, c in read_clouds(path, topic="/livox_interfaces", filters=DecodeFilter(tag_filter="strict"))]
    assert len(strict) == 1 and (strict[0].tag == 16).all() and len(strict[0]) == 50 - 10


@pytest.mark.parametrize("storage", ["sqlite3", "mcap"])
def test_bag_writer_clouds_detections_info(tmp_path, storage):
    path = tmp_path / "drive"
    pts = points(400, seed=3)
    t = np.linspace(0, 0.1, 400)
    boxes = np.array([[10, 2, -0.8, 4.5, 1.9, 1.6, 0.3], [5, -3, -1.0, 0.6, 0.7, 1.7, -2.5],
                      [20, 0, -0.9, 1.8, 0.6, 1.7, 3.5]], np.float32)  # 3.5 rad wraps to 3.5 - 2 pi
    labels = np.array([0, 1, 2])
    with BagWriter(path, storage=storage) as w:
        for k in range(3):
            stamp = STAMP_NS + k * 100_000_000
            w.write_cloud("/livox/lidar", encode_pointcloud2(pts, "livox2", time=t, stamp_ns=stamp))
            w.write_cloud("/autoware", encode_pointcloud2(pts, "xyzirc", stamp_ns=stamp))
            w.write_custom_msg("/livox/custom", pts, time=t, tag=np.zeros(400), stamp_ns=stamp)
            w.write_detections(DEFAULT_GT_TOPIC, stamp, "livox_frame", boxes[:k + 1], labels[:k + 1],
                               None if k == 0 else np.array([0.9, 0.8, 0.7])[:k + 1])
        w.write_detections(DEFAULT_GT_TOPIC, STAMP_NS + 10**9, "livox_frame", np.zeros((0, 7)), [])

    info = bag_info(path)
    assert info["message_count"] == 13
    assert info["topics"]["/livox/lidar"] == {"type": "sensor_msgs/msg/PointCloud2", "count": 3}
    assert info["topics"]["/livox/custom"] == {"type": "livox_ros_driver2/msg/CustomMsg", "count": 3}
    assert info["topics"][DEFAULT_GT_TOPIC] == {"type": "vision_msgs/msg/Detection3DArray", "count": 4}
    assert info["start_ns"] == STAMP_NS and info["duration_ns"] == 10**9

    clouds = list(read_clouds(path))
    assert [topic for topic, _ in clouds] == ["/livox/lidar", "/autoware", "/livox/custom"] * 3
    for topic, cloud in clouds:
        np.testing.assert_array_equal(cloud.points, pts)
        if topic != "/autoware":
            np.testing.assert_allclose(cloud.time, t, atol=1e-6)
    cropped = [c for _, c in read_clouds(path, topic=["/livox/custom"], filters=DecodeFilter(x_min=0.0))]
    assert len(cropped) == 3 and all((c.points[:, 0] >= 0).all() and len(c) < 400 for c in cropped)

    frames = list(read_detections(path))
    assert len(frames) == 4 and [len(f.boxes) for f in frames] == [1, 2, 3, 0]
    stamp, got_boxes, got_labels, got_scores = frames[2]
    assert stamp == STAMP_NS + 200_000_000
    expected = boxes.copy()
    expected[2, 6] = 3.5 - 2 * math.pi
    np.testing.assert_allclose(got_boxes, expected, atol=1e-5)
    np.testing.assert_array_equal(got_labels, labels)
    np.testing.assert_allclose(got_scores, [0.9, 0.8, 0.7], rtol=1e-6)
    np.testing.assert_allclose(frames[0].scores, [1.0])
    assert frames[3].boxes.shape == (0, 7)


def test_detection_message_layout(tmp_path):
    raw = detection3d_array_cdr(STAMP_NS, "livox_frame", [[1, 2, 3, 4, 5, 6, math.pi / 2]], [2], [0.5])
    msg = typestore().deserialize_cdr(raw, "vision_msgs/msg/Detection3DArray")
    det = msg.detections[0]
    assert det.results[0].hypothesis.class_id == CLASS_NAMES[2] == "cyclist"
    assert det.results[0].hypothesis.score == 0.5
    c, q, s = det.bbox.center.position, det.bbox.center.orientation, det.bbox.size
    assert (c.x, c.y, c.z) == (1, 2, 3) and (s.x, s.y, s.z) == (4, 5, 6)
    np.testing.assert_allclose([q.x, q.y, q.z, q.w], [0, 0, math.sin(math.pi / 4), math.cos(math.pi / 4)])
    assert det.header.frame_id == msg.header.frame_id == "livox_frame"


@pytest.mark.parametrize("boxes,labels,scores", [
    ([[0, 0, 0, 1, 1, 1, 0]], [5], None),  # label outside CLASS_NAMES
    ([[0, 0, 0, 1, 1, 1, 0]], [0, 1], None),  # length mismatch
    ([[0, 0, np.nan, 1, 1, 1, 0]], [0], None),
])
def test_bad_detections_rejected(boxes, labels, scores):
    with pytest.raises(PointCloudError):
        detection3d_array_cdr(0, "f", boxes, labels, scores)


# --------------------------------------------------------------------------- errors


def test_missing_and_corrupt_bags_raise(tmp_path):
    with pytest.raises(PointCloudError, match="not found"):
        list(read_clouds(tmp_path / "nope"))
    with pytest.raises(PointCloudError):
        bag_info(tmp_path / "nope")

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "metadata.yaml").write_text("rosbag2_bagfile_information: [unclosed\n")
    with pytest.raises(PointCloudError):
        list(read_clouds(broken))

    garbage = tmp_path / "garbage.db3"
    garbage.write_bytes(b"this is not sqlite" * 10)
    with pytest.raises(PointCloudError):
        list(read_clouds(garbage))

    good = tmp_path / "good"
    with BagWriter(good, storage="mcap") as w:
        w.write_cloud("/c", encode_pointcloud2(points(100), "xyzi", stamp_ns=STAMP_NS))
    mcap = next(good.glob("*.mcap"))
    mcap.write_bytes(mcap.read_bytes()[:200])
    with pytest.raises(PointCloudError):
        list(read_clouds(good))


def test_topic_selection_errors(tmp_path):
    path = tmp_path / "b"
    with BagWriter(path) as w:
        w.write_cloud("/c", encode_pointcloud2(points(10), "xyzi"))
        w.write_detections("/d", 0, "f", np.zeros((0, 7)), [])
    with pytest.raises(PointCloudError, match="not in bag"):
        list(read_clouds(path, topic="/missing"))
    with pytest.raises(PointCloudError, match="not of type"):
        list(read_clouds(path, topic="/d"))
    with pytest.raises(PointCloudError, match="not of type"):
        list(read_detections(path, topic="/c"))
    assert [t for t, _ in read_clouds(path)] == ["/c"]


def test_bag_writer_refuses_existing_path_and_bad_storage(tmp_path):
    with pytest.raises(PointCloudError):
        BagWriter(tmp_path)
    with pytest.raises(PointCloudError):
        BagWriter(tmp_path / "x", storage="rosbag1")
    with BagWriter(tmp_path / "y") as w:
        with pytest.raises(PointCloudError):
            w.write_custom_msg("/c", points(2), package="livox_ros_driver")
        w.write_cloud("/c", encode_pointcloud2(points(2), "xyzi"))
        with pytest.raises(PointCloudError, match="already carries"):
            w.write_custom_msg("/c", points(2))


# --------------------------------------------------------------------------- compatibility with a ROS 2 install


@pytest.mark.parametrize("msgtype", ["vision_msgs/msg/Detection3DArray", "vision_msgs/msg/Detection3D",
                                     "vision_msgs/msg/ObjectHypothesisWithPose", "vision_msgs/msg/BoundingBox3D",
                                     "sensor_msgs/msg/PointCloud2"])
def test_type_hashes_match_rosidl_generated_descriptions(msgtype):
    """rosidl writes share/<pkg>/msg/<Name>.json with the RIHS01 hash a ROS graph checks."""
    import json
    import sys
    from pathlib import Path

    pkg, _, name = msgtype.split("/")
    desc = Path(sys.prefix) / "share" / pkg / "msg" / f"{name}.json"
    if not desc.is_file():
        pytest.skip(f"{desc} not installed")
    hashes = {h["type_name"]: h["hash_string"] for h in json.loads(desc.read_text())["type_hashes"]}
    assert typestore().hash_rihs01(msgtype) == hashes[msgtype]


def test_rclpy_reads_our_detection_cdr_and_we_read_rclpy_messages():
    serialization = pytest.importorskip("rclpy.serialization")
    vision = pytest.importorskip("vision_msgs.msg")
    from livox_infer.bags import detections_from_message

    boxes = [[1, 2, 3, 4, 5, 6, 0.5], [-1, 0, 1, 0.5, 0.5, 1.8, -3.0]]
    raw = detection3d_array_cdr(STAMP_NS, "livox_frame", boxes, [1, 2], [0.7, 0.6])
    msg = serialization.deserialize_message(raw, vision.Detection3DArray)
    assert msg.detections[1].results[0].hypothesis.class_id == "cyclist"
    frame = detections_from_message(msg)  # rclpy objects work too (what the node's tests use)
    np.testing.assert_allclose(frame.boxes, boxes, atol=1e-6)
    np.testing.assert_array_equal(frame.labels, [1, 2])
    # and rclpy's own serialization reads back through rosbags
    back = typestore().deserialize_cdr(serialization.serialize_message(msg), "vision_msgs/msg/Detection3DArray")
    np.testing.assert_allclose(detections_from_message(back).boxes, boxes, atol=1e-6)


def test_bag_without_clouds_yields_nothing_and_writer_takes_ros_messages(tmp_path):
    only_gt = tmp_path / "gt"
    with BagWriter(only_gt) as w:
        w.write_detections(DEFAULT_GT_TOPIC, 5, "f", [[0, 0, 0, 1, 1, 1, 0]], [0])
    assert list(read_clouds(only_gt)) == []
    assert list(read_detections(only_gt, topic=None))[0].stamp_ns == 5

    msg_mod = pytest.importorskip("sensor_msgs.msg")
    from livox_infer.decode.pointcloud import to_ros_message

    pts = points(20)
    msg = to_ros_message(encode_pointcloud2(pts, "livox", stamp_ns=STAMP_NS), msg_mod.PointCloud2)
    with BagWriter(tmp_path / "ros") as w:
        w.write_cloud("/c", msg)
    (topic, cloud), = read_clouds(tmp_path / "ros")
    np.testing.assert_array_equal(cloud.points, pts)
    assert cloud.stamp_ns == STAMP_NS


def test_mcap_chunks_carry_crcs_so_flipped_bytes_are_an_error(tmp_path):
    from livox_infer.bags import add_mcap_chunk_crcs

    bag = tmp_path / "drive"
    pts = np.c_[np.random.default_rng(0).uniform(1, 30, (500, 3)), np.full(500, 7.0)].astype(np.float32)
    with BagWriter(bag, storage="mcap") as w:
        for i in range(3):
            w.write_cloud("/livox/lidar", encode_pointcloud2(pts, "xyzi", stamp_ns=(i + 1) * 10**8))
    (mcap,) = bag.glob("*.mcap")
    assert add_mcap_chunk_crcs(mcap) == 0  # already filled in by BagWriter
    assert len(list(read_clouds(bag))) == 3  # rosbags accepts our CRCs
    raw = bytearray(mcap.read_bytes())
    at = raw.find(pts[250].tobytes())  # inside the point data of the first message
    assert at > 0
    raw[at + 1] ^= 0x10
    mcap.write_bytes(bytes(raw))
    with pytest.raises(PointCloudError, match="checksum"):
        list(read_clouds(bag))
