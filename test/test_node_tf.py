"""TF in the detector node, with the real tf2_ros (upstream geometry2, scripts/setup_tf2.sh) and real static /
dynamic broadcasters on loopback; fake pipeline (it boxes the cloud's centroid, yaw 0.5):

- output_frame: detections and markers moved into it at the cloud's stamp, exactly as livox_infer.transforms does;
- a missing transform: the frame is published empty in output_frame, counted, in the diagnostics; later frames work;
- a rig described by TF (input_topics + output_frame) gives the same boxes as the rig YAML with those extrinsics;
- odometry_frame: accumulation compensated with odom -> sensor poses from /tf;
- without tf2_ros the node starts, says why once, and publishes empty frames (never the wrong frame)."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

pytest.importorskip("rclpy")
pytest.importorskip("vision_msgs.msg")

from tf2_support import load_tf2, static_transform  # noqa: E402

tf2_ros = load_tf2()
if isinstance(tf2_ros, str):
    pytest.skip(tf2_ros, allow_module_level=True)

from rclpy.parameter import Parameter  # noqa: E402
from sensor_msgs.msg import PointCloud2  # noqa: E402
from vision_msgs.msg import Detection3DArray  # noqa: E402
from visualization_msgs.msg import MarkerArray  # noqa: E402

from livox_infer.rig import transform_from_xyz_rpy  # noqa: E402
from livox_infer.ros import messages as ros_msgs  # noqa: E402
from livox_infer.ros.node import DetectorNode  # noqa: E402
from livox_infer.transforms import transform_boxes  # noqa: E402
from test_node_rig import publish_while  # noqa: E402
from test_node_support import Collector, FakeFactory, cloud_msg, unique, wait_for  # noqa: E402

pytestmark = pytest.mark.ros

# livox_frame on a roof: 1.2 m ahead, 1.9 m up, turned 30 deg left and pitched 5 deg down
MOUNT = transform_from_xyz_rpy(1.2, 0.0, 1.9, 0.0, 5.0, 30.0)


def start(ros, params: dict, topics: list[str], markers: bool = False):
    factory = FakeFactory()
    overrides = [Parameter("use_compile", value=False)] + [Parameter(k, value=v) for k, v in params.items()]
    node = ros.add(DetectorNode(pipeline_factory=factory, node_name=unique("det"), context=ros.context,
                                parameter_overrides=overrides))
    client = ros.node(unique("client"))
    pubs = [client.create_publisher(PointCloud2, t, 10) for t in topics]
    dets = Collector(client, Detection3DArray, f"{node.get_fully_qualified_name()}/detections")
    marks = Collector(client, MarkerArray, f"{node.get_fully_qualified_name()}/markers") if markers else None
    assert wait_for(lambda: all(p.get_subscription_count() == 1 for p in pubs)
                    and node._det_pub.get_subscription_count() == 1
                    and (marks is None or node._marker_pub.get_subscription_count() == 1)), "discovery failed"
    return node, client, pubs, dets, marks


def diagnostics(node) -> dict:
    status = node.diagnostics_status()
    return {"level": status.level, "message": status.message, **{kv.key: kv.value for kv in status.values}}


def fake_box(centre) -> np.ndarray:
    """What FakePipeline answers for a cloud around ``centre`` (its centroid; yaw 0.5)."""
    return np.array([[*centre, 4.0, 1.8, 1.5, 0.5]])


def test_output_frame_moves_detections_and_markers_with_the_static_transform(ros):
    topic = "/" + unique("cloud")
    node, client, (pub,), dets, marks = start(ros, {"input_topic": topic, "output_frame": "base_link"}, [topic],
                                              markers=True)
    tf2_ros.StaticTransformBroadcaster(client).sendTransform(static_transform("base_link", "livox_frame", MOUNT))
    stamp = 3_000_000_000
    msg = cloud_msg(stamp_ns=stamp, frame_id="livox_frame", centre=(10.0, 2.0, -0.5))
    assert publish_while(pub, msg, lambda: len(dets.msgs) >= 1 and len(marks.msgs) >= 1)
    out = dets.msgs[0]
    assert out.header.frame_id == "base_link" and ros_msgs.stamp_to_ns(out.header.stamp) == stamp
    from livox_infer.decode.pointcloud import decode_pointcloud2

    centroid = decode_pointcloud2(msg).points[:, :3].astype(np.float64).mean(axis=0)
    want_c, want_q = transform_boxes(fake_box(centroid), MOUNT)
    det = out.detections[0]
    c, q = det.bbox.center.position, det.bbox.center.orientation
    assert det.header.frame_id == "base_link"
    assert np.allclose([c.x, c.y, c.z], want_c[0], atol=1e-3)  # float32 centroid in the fake pipeline
    assert np.allclose([q.x, q.y, q.z, q.w], want_q[0], atol=1e-6)
    assert (det.bbox.size.x, det.bbox.size.y, det.bbox.size.z) == pytest.approx((4.0, 1.8, 1.5))
    assert det.results[0].pose.pose.position.x == pytest.approx(c.x)
    # the markers: every edge point, moved by the marker's pose, lands where the moved box's corners are
    edges = next(m for m in marks.msgs[0].markers if m.ns.endswith("/boxes"))
    assert edges.header.frame_id == "base_link" and all(m.header.frame_id == "base_link" for m in marks.msgs[0].markers)
    from livox_infer.accumulate import pose_matrix

    p, o = edges.pose.position, edges.pose.orientation
    pose = pose_matrix((p.x, p.y, p.z), (o.x, o.y, o.z, o.w))
    local = np.array([[pt.x, pt.y, pt.z, 1.0] for pt in edges.points])
    in_cloud = ros_msgs.box_edge_points(fake_box(centroid)[0].astype(np.float32))
    assert np.allclose((pose @ local.T).T[:, :3], (MOUNT[:3, :3] @ in_cloud.T).T + MOUNT[:3, 3], atol=1e-3)
    d = diagnostics(node)
    assert d["output_frame"] == "base_link" and d["tf"] == "tf2_ros" and d["frames_tf_failed"] == "0"


def test_a_missing_transform_gives_an_empty_frame_in_output_frame_and_a_reason(ros):
    topic = "/" + unique("cloud")
    node, client, (pub,), dets, _ = start(ros, {"input_topic": topic, "output_frame": "map", "tf_timeout": 0.05},
                                          [topic])
    assert publish_while(pub, cloud_msg(stamp_ns=4_000_000_000, frame_id="livox_frame"), lambda: len(dets.msgs) >= 1)
    out = dets.msgs[0]
    assert out.header.frame_id == "map" and len(out.detections) == 0  # never the cloud's frame, never a guess
    d = diagnostics(node)
    assert int(d["frames_tf_failed"]) >= 1 and d["level"] == b"\x01"  # WARN
    assert "TF lookups failed" in d["message"] and "livox_frame -> map" in d["last_error"]
    assert node.stats.processed == 0 and node.stats.failed == 0
    # once the transform exists, frames go out in map with their boxes; the node kept going
    tf2_ros.StaticTransformBroadcaster(client).sendTransform(static_transform("map", "livox_frame", MOUNT))
    assert publish_while(pub, cloud_msg(stamp_ns=4_100_000_000, frame_id="livox_frame"),
                         lambda: any(len(m.detections) == 1 for m in dets.msgs))
    assert next(m for m in dets.msgs if m.detections).header.frame_id == "map"


def test_a_rig_described_by_tf_gives_the_rig_files_boxes(ros, tmp_path):
    """Two sensors: extrinsics from a rig YAML in one node, from /tf_static in another: the same boxes."""
    left, front = "/" + unique("left"), "/" + unique("front")
    ext = {"left": {"x": 1.0, "y": 0.5, "z": 2.0, "roll": 0.0, "pitch": 2.0, "yaw": 90.0},
           "front": {"x": 0.0, "y": 0.0, "z": 2.0, "roll": 1.0, "pitch": 0.0, "yaw": 0.0}}
    rig = {"output_frame": "base_link", "merge_tolerance_ms": 50.0, "sensor_height": 0.0,
           "sensors": [{"name": n, "topic": t, "model": "horizon", "extrinsic": ext[n]}
                       for n, t in (("left", left), ("front", front))]}
    path = tmp_path / "rig.yaml"
    path.write_text(yaml.safe_dump(rig))
    by_file, _, file_pubs, file_dets, _ = start(ros, {"rig": str(path)}, [left, front])
    left_tf, front_tf = "/" + unique("left"), "/" + unique("front")
    by_tf, client, tf_pubs, tf_dets, _ = start(ros, {"input_topics": [left_tf, front_tf], "output_frame": "base_link",
                                                     "sensor_height": 0.0}, [left_tf, front_tf])
    tf2_ros.StaticTransformBroadcaster(client).sendTransform(
        [static_transform("base_link", n, transform_from_xyz_rpy(*ext[n].values())) for n in ("left", "front")])
    assert by_file._rig_options == by_tf._rig_options  # same ground, ROI and range handling as the rig file

    stamp = 6_000_000_000
    clouds = [cloud_msg(stamp_ns=stamp, frame_id="left", centre=(10.0, 0.0, 0.0)),
              cloud_msg(stamp_ns=stamp + 10_000_000, frame_id="front", centre=(15.0, 1.0, 0.5), seed=1)]
    for pubs, dets in ((file_pubs, file_dets), (tf_pubs, tf_dets)):
        # the first sensor's cloud until the node holds it, then the second's until the merged frame is out
        node = by_file if pubs is file_pubs else by_tf
        assert publish_while(pubs[0], clouds[0], lambda n=node: bool(n._assembler.merger._open)), "first cloud lost"
        assert publish_while(pubs[1], clouds[1], lambda d=dets: len(d.msgs) >= 1)
    a, b = ros_msgs.msg_to_arrays(file_dets.msgs[0]), ros_msgs.msg_to_arrays(tf_dets.msgs[0])
    assert a.frame_id == b.frame_id == "base_link" and a.stamp_ns == b.stamp_ns == stamp
    assert len(a.boxes) == 1 and np.allclose(a.boxes, b.boxes, atol=1e-4)  # float32 quaternions in /tf_static
    # the detector gets the same merged cloud, point for point, so the real network's boxes agree as well
    pa, pb = by_file._pipeline.last_points, by_tf._pipeline.last_points
    assert pa.shape == pb.shape == (400, pa.shape[1]) and np.allclose(pa, pb, atol=1e-4)
    assert diagnostics(by_tf)["frames_tf_failed"] == "0"


def test_a_tf_rig_sensor_without_a_transform_is_counted_and_left_out(ros):
    topic = "/" + unique("alone")
    node, _, (pub,), dets, _ = start(ros, {"input_topics": [topic], "output_frame": "base_link"}, [topic])
    assert publish_while(pub, cloud_msg(stamp_ns=6_500_000_000, frame_id="nowhere"), lambda: len(dets.msgs) >= 1)
    out = dets.msgs[0]
    assert out.header.frame_id == "base_link" and not out.detections and node.stats.tf_failed >= 1
    assert "extrinsic of" in node.stats.last_error and "nowhere -> base_link" in node.stats.last_error


def test_accumulation_is_compensated_with_poses_from_tf(ros):
    topic = "/" + unique("cloud")
    node, client, (pub,), dets, _ = start(ros, {"input_topic": topic, "odometry_frame": "odom",
                                                "accumulate_frames": 2}, [topic])
    broadcaster = tf2_ros.TransformBroadcaster(client)
    t0 = 7_000_000_000
    for i, x in enumerate((0.0, 1.0)):  # the vehicle (and its livox_frame) drives 1 m forward in 100 ms
        broadcaster.sendTransform(static_transform("odom", "livox_frame", transform_from_xyz_rpy(x, 0, 0, 0, 0, 0),
                                                   stamp_ns=t0 + i * 100_000_000))
    assert wait_for(lambda: node._tf.buffer.can_transform_core("odom", "livox_frame", _time(t0 + 100_000_000))[0])
    # a wall blob seen 10 m ahead in both frames: it moved with the vehicle, so the older one lands 1 m nearer
    assert publish_while(pub, cloud_msg(stamp_ns=t0, centre=(10.0, 0.0, 0.0)), lambda: len(dets.msgs) >= 1)
    assert publish_while(pub, cloud_msg(stamp_ns=t0 + 100_000_000, centre=(10.0, 0.0, 0.0), seed=1),
                         lambda: any(ros_msgs.stamp_to_ns(d.header.stamp) == t0 + 100_000_000 for d in dets.msgs))
    last = next(d for d in dets.msgs if ros_msgs.stamp_to_ns(d.header.stamp) == t0 + 100_000_000)
    assert last.detections[0].bbox.center.position.x == pytest.approx(9.5, abs=0.15)
    assert node._assembler.accumulator.compensated == 1 and node.stats.tf_failed == 0
    # a cloud at a stamp /tf does not cover: counted, answered with an empty array, not stacked uncompensated
    assert publish_while(pub, cloud_msg(stamp_ns=t0 + 5_000_000_000, centre=(10.0, 0.0, 0.0), seed=2),
                         lambda: node.stats.tf_failed >= 1
                         and any(ros_msgs.stamp_to_ns(d.header.stamp) == t0 + 5_000_000_000 for d in dets.msgs))
    late = next(d for d in dets.msgs if ros_msgs.stamp_to_ns(d.header.stamp) == t0 + 5_000_000_000)
    assert not late.detections and node._assembler.accumulator.compensated == 1


def _time(ns: int):
    from rclpy.time import Time

    return Time(nanoseconds=ns).to_msg()


def test_without_tf2_ros_the_node_runs_says_why_and_never_publishes_a_wrong_frame(ros, monkeypatch):
    from livox_infer.ros import tf as node_tf

    monkeypatch.setattr(node_tf, "import_tf2_ros", lambda: (None, "ModuleNotFoundError: No module named 'tf2_ros'"))
    topic = "/" + unique("cloud")
    node, _, (pub,), dets, _ = start(ros, {"input_topic": topic, "output_frame": "base_link"}, [topic])
    assert publish_while(pub, cloud_msg(stamp_ns=8_000_000_000), lambda: len(dets.msgs) >= 1)
    assert dets.msgs[0].header.frame_id == "base_link" and not dets.msgs[0].detections
    d = diagnostics(node)
    assert d["tf"].startswith("unavailable: ModuleNotFoundError") and int(d["frames_tf_failed"]) >= 1


def test_frame_id_and_output_frame_together_are_refused(ros):
    with pytest.raises(ValueError, match="either frame_id"):
        DetectorNode(pipeline_factory=FakeFactory(), node_name=unique("bad"), context=ros.context,
                     parameter_overrides=[Parameter("frame_id", value="a"), Parameter("output_frame", value="b")])


def test_tracked_objects_follow_output_frame_with_their_velocity_rotated(ros):
    """~/tracked_objects come out in output_frame like the detections: poses moved, velocities rotated."""
    livox_infer_msgs = pytest.importorskip("livox_infer_msgs.msg")
    topic = "/" + unique("cloud")
    node, client, (pub,), dets, _ = start(ros, {"input_topic": topic, "output_frame": "base_link"}, [topic])
    tracks = Collector(client, livox_infer_msgs.TrackedObjects, f"{node.get_fully_qualified_name()}/tracked_objects")
    assert wait_for(lambda: node._tracking.publisher.get_subscription_count() == 1), "discovery failed"
    tf2_ros.StaticTransformBroadcaster(client).sendTransform(static_transform("base_link", "livox_frame", MOUNT))
    t0 = 4_000_000_000
    for k in range(6):  # a car moving +8 m/s along the sensor's x axis
        msg = cloud_msg(stamp_ns=t0 + k * 100_000_000, frame_id="livox_frame", centre=(10.0 + 0.8 * k, 2.0, -0.5),
                        seed=k)
        assert publish_while(pub, msg, lambda n=k: len(dets.msgs) >= n + 1)
    assert wait_for(lambda: any(m.objects for m in tracks.msgs))
    last = tracks.msgs[-1]
    assert last.header.frame_id == "base_link" and ros_msgs.stamp_to_ns(last.header.stamp) == t0 + 500_000_000
    (obj,) = last.objects
    det = dets.msgs[-1].detections[0]  # the same frame's detection, already in base_link
    assert abs(obj.pose.pose.position.x - det.bbox.center.position.x) < 0.5
    assert abs(obj.pose.pose.position.y - det.bbox.center.position.y) < 0.5
    v = np.array([obj.twist.twist.linear.x, obj.twist.twist.linear.y, obj.twist.twist.linear.z])
    want = MOUNT[:3, :3] @ np.array([8.0, 0.0, 0.0])  # the sensor's +x in base_link
    assert np.linalg.norm(v - want) < 1.0, (v, want)
