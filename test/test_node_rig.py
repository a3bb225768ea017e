"""DetectorNode with several sensors (a rig file: one topic each, extrinsics, output frame) and with accumulation
motion-compensated by nav_msgs/Odometry. Real rclpy on loopback, fake pipeline (it boxes the cloud's centroid)."""

from __future__ import annotations

import time

import pytest
import yaml

pytest.importorskip("rclpy")
pytest.importorskip("vision_msgs.msg")

from rclpy.parameter import Parameter  # noqa: E402
from sensor_msgs.msg import PointCloud2  # noqa: E402
from vision_msgs.msg import Detection3DArray  # noqa: E402

from livox_infer.ros import messages as ros_msgs  # noqa: E402
from livox_infer.ros.node import DetectorNode  # noqa: E402
from test_node_support import cloud_msg, Collector, FakeFactory, unique, wait_for  # noqa: E402

pytestmark = pytest.mark.ros


def publish_while(pub, msg, condition, timeout_s=10.0) -> bool:
    """Publish ``msg`` until ``condition()`` holds (the input is best-effort: one message may be lost)."""
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        pub.publish(msg)
        wait_for(condition, timeout_s=0.3)
    return condition()


def start(ros, params: dict, topics: list[str]):
    factory = FakeFactory()
    overrides = [Parameter("use_compile", value=False)] + [Parameter(k, value=v) for k, v in params.items()]
    node = ros.add(DetectorNode(pipeline_factory=factory, node_name=unique("det"), context=ros.context,
                                parameter_overrides=overrides))
    client = ros.node(unique("client"))
    pubs = [client.create_publisher(PointCloud2, t, 10) for t in topics]
    dets = Collector(client, Detection3DArray, f"{node.get_fully_qualified_name()}/detections")
    assert wait_for(lambda: all(p.get_subscription_count() == 1 for p in pubs)
                    and node._det_pub.get_subscription_count() == 1), "discovery failed"
    return node, client, pubs, dets, factory


def test_two_sensors_on_two_topics_merge_into_the_rig_output_frame(ros, tmp_path):
    left, front = "/" + unique("left"), "/" + unique("front")
    rig = {"output_frame": "base_link", "merge_tolerance_ms": 20.0, "sensor_height": 0.0,
           "bev_extent": [-51.2, 51.2, -51.2, 51.2], "sensors": [
               {"name": "left", "topic": left, "model": "horizon",
                "extrinsic": {"x": 1.0, "y": 0.0, "z": 2.0, "roll": 0.0, "pitch": 0.0, "yaw": 90.0}},
               {"name": "front", "topic": front, "model": "tele15",
                "extrinsic": {"x": 0.0, "y": 0.0, "z": 2.0, "roll": 0.0, "pitch": 0.0, "yaw": 0.0}}]}
    path = tmp_path / "rig.yaml"
    path.write_text(yaml.safe_dump(rig))
    node, _, (pub_left, pub_front), dets, factory = start(ros, {"rig": str(path)}, [left, front])
    opts = factory.built[0].options
    assert opts["roi"] is None and opts["max_range"] is None and opts["sensor_height"] == 0.0
    assert opts["bev_extent"] == (-51.2, 51.2, -51.2, 51.2)

    # both sensors see a blob 10 m ahead of themselves: left's lies at (1, 10, 2) in base_link, front's at (10, 0, 2)
    stamp = 5_000_000_000
    merger = node._assembler.merger
    assert publish_while(pub_left, cloud_msg(stamp_ns=stamp, frame_id="left", centre=(10.0, 0.0, 0.0)),
                         lambda: "left" in merger._open)
    assert publish_while(pub_front, cloud_msg(stamp_ns=stamp + 10_000_000, frame_id="front", centre=(10.0, 0.0, 0.0),
                                              seed=1), lambda: len(dets.msgs) >= 1)
    out = dets.msgs[0]
    assert out.header.frame_id == "base_link" and ros_msgs.stamp_to_ns(out.header.stamp) == stamp
    centre = out.detections[0].bbox.center.position
    assert (centre.x, centre.y, centre.z) == pytest.approx((5.5, 5.0, 2.0), abs=0.15)  # merged centroid
    assert merger.stats.frames == 1 and merger.stats.partial == 0
    diag = {kv.key: kv.value for kv in node.diagnostics_status().values}
    assert diag["merged_frames"] == "1" and diag["missing_front"] == "0"

    # a sensor that stays silent: the next frame goes out without it once a newer cloud opens the frame after
    assert publish_while(pub_left, cloud_msg(stamp_ns=stamp + 100_000_000, frame_id="left"),
                         lambda: "left" in merger._open and merger._ref_ns == stamp + 100_000_000)
    assert publish_while(pub_left, cloud_msg(stamp_ns=stamp + 200_000_000, frame_id="left"),
                         lambda: len(dets.msgs) >= 2)
    assert merger.stats.partial == 1 and merger.stats.missing["front"] == 1


def test_bad_rig_file_stops_start_up(ros, tmp_path):
    path = tmp_path / "rig.yaml"
    path.write_text(yaml.safe_dump({"output_frame": "base_link", "sensors": [{"name": "a", "topic": "/a"}]}))
    with pytest.raises(ValueError, match="model must be one of"):
        DetectorNode(pipeline_factory=FakeFactory(), node_name=unique("bad"), context=ros.context,
                     parameter_overrides=[Parameter("rig", value=str(path))])


def test_accumulation_is_motion_compensated_with_odometry(ros):
    Odometry = pytest.importorskip("nav_msgs.msg").Odometry
    topic, odom_topic = "/" + unique("cloud"), "/" + unique("odom")
    node, client, (pub,), dets, _ = start(ros, {"input_topic": topic, "odometry_topic": odom_topic,
                                                "accumulate_frames": 2}, [topic])
    odom_pub = client.create_publisher(Odometry, odom_topic, 10)
    assert wait_for(lambda: odom_pub.get_subscription_count() == 1)
    t0 = 7_000_000_000
    for i, x in enumerate((0.0, 1.0)):  # the vehicle drives 1 m forward in 100 ms
        odom = Odometry()
        odom.header.stamp.sec, odom.header.stamp.nanosec = divmod(t0 + i * 100_000_000, 1_000_000_000)
        odom.pose.pose.position.x = x
        assert publish_while(odom_pub, odom, lambda n=i + 1: len(node._poses._stamps) >= n)
    # a wall blob seen 10 m ahead in both frames: it moved with the vehicle, so the older one lands 1 m nearer
    assert publish_while(pub, cloud_msg(stamp_ns=t0, centre=(10.0, 0.0, 0.0)), lambda: len(dets.msgs) >= 1)
    assert publish_while(pub, cloud_msg(stamp_ns=t0 + 100_000_000, centre=(10.0, 0.0, 0.0), seed=1),
                         lambda: any(ros_msgs.stamp_to_ns(d.header.stamp) == t0 + 100_000_000 for d in dets.msgs))
    last = next(d for d in dets.msgs if ros_msgs.stamp_to_ns(d.header.stamp) == t0 + 100_000_000)
    assert last.detections[0].bbox.center.position.x == pytest.approx(9.5, abs=0.15)
    assert node._assembler.accumulator.compensated == 1


def test_run_passes_the_rig_to_the_node():
    import argparse

    from livox_infer.ros.node import add_arguments, ros_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    argv = ros_arguments(parser.parse_args(["--sensor", "horizon", "--rig", "rigs/livox_dataset_v1.yaml"]))
    assert argv[argv.index("rig:=rigs/livox_dataset_v1.yaml") - 1] == "-p"


def test_input_topics_merge_clouds_already_in_one_frame(ros):
    a, b = "/" + unique("a"), "/" + unique("b")
    node, _, (pub_a, pub_b), dets, factory = start(ros, {"input_topics": [a, b]}, [a, b])
    assert factory.built[0].options["roi"] is not None  # no rig: the preset's ROI still applies
    merger = node._assembler.merger
    assert publish_while(pub_a, cloud_msg(stamp_ns=3_000_000_000, frame_id="vehicle", centre=(10.0, 0.0, 0.0)),
                         lambda: a in merger._open)
    assert publish_while(pub_b, cloud_msg(stamp_ns=3_000_000_000, frame_id="vehicle", centre=(20.0, 0.0, 0.0)),
                         lambda: len(dets.msgs) >= 1)
    assert dets.msgs[0].header.frame_id == "vehicle"
    assert dets.msgs[0].detections[0].bbox.center.position.x == pytest.approx(15.0, abs=0.15)


def test_rig_and_input_topics_together_are_refused(ros):
    with pytest.raises(ValueError, match="either rig"):
        DetectorNode(pipeline_factory=FakeFactory(), node_name=unique("bad"), context=ros.context,
                     parameter_overrides=[Parameter("rig", value="rigs/livox_dataset_v1.yaml"),
                                          Parameter("input_topics", value=["/a", "/b"])])


def test_bev_extent_given_as_integers_is_taken_as_metres_and_changes_rebuild(ros):
    topic = "/" + unique("cloud")
    node, _, _, _, factory = start(ros, {"input_topic": topic, "bev_extent": [0, 80, -48, 48]}, [topic])
    assert factory.built[0].options["bev_extent"] == (0.0, 80.0, -48.0, 48.0)
    result = node.set_parameters([Parameter("bev_extent", value=[0.0, 153.6, -19.2, 19.2])])[0]
    assert result.successful and factory.built[-1].options["bev_extent"] == (0.0, 153.6, -19.2, 19.2)
    bad = node.set_parameters([Parameter("bev_extent", value=[10.0, 0.0, -19.2, 19.2])])[0]
    assert not bad.successful and "x_min < x_max" in bad.reason


def test_odometry_with_a_non_finite_position_is_counted_and_not_used(ros):
    Odometry = pytest.importorskip("nav_msgs.msg").Odometry
    topic, odom_topic = "/" + unique("cloud"), "/" + unique("odom")
    node, client, (pub,), dets, _ = start(ros, {"input_topic": topic, "odometry_topic": odom_topic,
                                                "accumulate_frames": 2}, [topic])
    odom_pub = client.create_publisher(Odometry, odom_topic, 10)
    assert wait_for(lambda: odom_pub.get_subscription_count() == 1)
    odom = Odometry()
    odom.header.stamp.sec = 7
    odom.pose.pose.position.x = float("nan")
    odom.pose.pose.orientation.w = 1.0
    assert publish_while(odom_pub, odom, lambda: node.stats.odometry_rejected >= 1)
    assert len(node._poses._stamps) == 0 and node.stats.rejected == 0  # no pose kept; no cloud counted bad
    status = node.diagnostics_status()
    diag = {kv.key: kv.value for kv in status.values}
    assert int(diag["odometry_rejected"]) >= 1 and "odometry" in status.message
    assert publish_while(pub, cloud_msg(stamp_ns=7_000_000_000), lambda: len(dets.msgs) >= 1)  # still detecting


def test_bev_extent_changes_through_the_parameter_service_type(ros):
    # issue 30: the parameter service hands double arrays over as array('d'): "bev_extent must be a list"
    from livox_infer.ros import param_updates

    topic = "/" + unique("cloud")
    node, _, _, _, factory = start(ros, {"input_topic": topic, "bev_extent": [0.0, 80.0, -41.6, 41.6]}, [topic])

    def via_service(extent):  # what `ros2 param set` / the set_parameters service deliver
        msg = Parameter("bev_extent", value=extent).to_parameter_msg()
        return param_updates.set_as_one_change(node, [Parameter.from_parameter_msg(msg)])

    assert via_service([0.0, 80.0, -41.6, 41.6]).successful and len(factory.built) == 1  # the same: no rebuild
    result = via_service([0.0, 57.6, -28.8, 28.8])
    assert result.successful, result.reason
    assert factory.built[-1].options["bev_extent"] == (0.0, 57.6, -28.8, 28.8)
    assert node._values["bev_extent"] == [0.0, 57.6, -28.8, 28.8]
    huge = via_service([-998.4, 998.4, -998.4, 998.4])  # 4992 x 4992 cells: ~26 s a frame, 5.6 GB
    assert not huge.successful and "at most 1,048,576 cells" in huge.reason
    odd = via_service([0.0, 80.0, -40.0, 40.0])  # 40 is not a multiple of lite's 3.2 m
    assert not odd.successful and "multiples of 3.2" in odd.reason
    assert node._values["bev_extent"] == [0.0, 57.6, -28.8, 28.8] and len(factory.built) == 2


def test_a_rig_sensor_whose_points_miss_the_grid_is_named_in_the_diagnostics(ros, tmp_path):
    far, near = "/" + unique("far"), "/" + unique("near")
    ext = {"y": 0.0, "z": 0.0, "roll": 0.0, "pitch": 0.0, "yaw": 0.0}
    rig = {"output_frame": "base_link", "bev_extent": [-51.2, 51.2, -51.2, 51.2], "sensors": [
        {"name": "far", "topic": far, "model": "horizon", "extrinsic": {"x": 900.0, **ext}},
        {"name": "near", "topic": near, "model": "horizon", "extrinsic": {"x": 0.0, **ext}}]}
    path = tmp_path / "rig.yaml"
    path.write_text(yaml.safe_dump(rig))
    node, _, (pub_far, _), _, _ = start(ros, {"rig": str(path)}, [far, near])
    assert publish_while(pub_far, cloud_msg(stamp_ns=5_000_000_000, frame_id="far"),
                         lambda: node._assembler.outside_grid["far"] >= 1)
    diag = {kv.key: kv.value for kv in node.diagnostics_status().values}
    assert int(diag["outside_grid_far"]) >= 1 and diag["outside_grid_near"] == "0"


def test_a_model_path_to_some_yaml_does_not_tell_the_caller_what_the_file_holds(ros, tmp_path):
    # issue 30: the refusal named the file's top-level keys, so any readable YAML could be probed remotely
    secret = tmp_path / "secret.yaml"
    secret.write_text("db_password: hunter2\napi_token: abc\n")
    topic = "/" + unique("cloud")
    node, _, _, _, factory = start(ros, {"input_topic": topic}, [topic])
    for value in (str(secret), str(tmp_path / "missing.yaml")):
        result = node.set_parameters([Parameter("model", value=value)])[0]
        assert not result.successful and result.reason == f"cannot load model {value!r} (details on the node's console)"
    result = node.set_parameters([Parameter("model", value=str(secret)),
                                  Parameter("bev_extent", value=[0.0, 57.6, -28.8, 28.8])])[0]
    assert not result.successful and "db_password" not in result.reason and "api_token" not in result.reason



@pytest.mark.parametrize("track_motion", [True, False])
def test_stacked_frames_move_a_tracked_moving_object_to_its_newest_place(ros, track_motion):
    """accumulate_frames 3 with tracking: the tracker's velocity moves the older frames' points of a moving object
    to where it is now before detection (accumulate_track_motion); without it the stack smears behind it."""
    topic = "/" + unique("cloud")
    node, client, (pub,), dets, factory = start(ros, {"input_topic": topic, "accumulate_frames": 3,
                                                      "accumulate_track_motion": track_motion}, [topic])
    t0 = 9_000_000_000
    for k in range(10):  # a blob driving +x at 8 m/s in front of a standing sensor
        stamp = t0 + k * 100_000_000
        assert publish_while(pub, cloud_msg(stamp_ns=stamp, centre=(10.0 + 0.8 * k, 2.0, -0.5), seed=k),
                             lambda s=stamp: any(ros_msgs.stamp_to_ns(d.header.stamp) == s for d in dets.msgs))
    stack = factory.built[-1].last_points  # the last stack the pipeline was given: 3 x 200 points
    assert len(stack) == 600
    newest_x = 10.0 + 0.8 * 9
    older = stack[:400, 0].mean()  # frames 7 and 8 come first
    moved = node._tracking.motion_points
    if track_motion:
        assert moved >= 200 and abs(older - newest_x) < 0.4, (moved, older)
    else:
        assert moved is None and older < newest_x - 1.0  # 0.8 and 1.6 m behind
