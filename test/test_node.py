"""DetectorNode on real rclpy (loopback, isolated domain) with a fake pipeline injected: message
contents, malformed input, latest-frame-only, parameters, diagnostics, no-subscriber skip."""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("rclpy")
pytest.importorskip("vision_msgs.msg")

from diagnostic_msgs.msg import DiagnosticArray  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from sensor_msgs.msg import PointCloud2, PointField  # noqa: E402
from vision_msgs.msg import Detection3DArray  # noqa: E402
from visualization_msgs.msg import Marker, MarkerArray  # noqa: E402

from livox_infer.ros import messages as ros_msgs  # noqa: E402
from livox_infer.ros.node import DetectorNode
from livox_infer.params import pipeline_options  # noqa: E402
from livox_infer.detector.config import ModelConfig  # noqa: E402
from test_node_support import cloud_msg, Collector, FakeFactory, unique, wait_for  # noqa: E402

pytestmark = pytest.mark.ros


def start_node(ros, factory=None, **params):
    """A DetectorNode on a private input topic with ``params`` overrides, plus its output collectors."""
    factory = factory or FakeFactory()
    topic = "/" + unique("cloud")
    overrides = [Parameter("input_topic", value=topic), Parameter("use_compile", value=False)]
    overrides += [Parameter(k, value=v) for k, v in params.items()]
    node = ros.add(DetectorNode(pipeline_factory=factory, node_name=unique("det"), context=ros.context,
                                parameter_overrides=overrides))
    client = ros.node(unique("client"))
    pub = client.create_publisher(PointCloud2, topic, 10)
    dets = Collector(client, Detection3DArray, f"{node.get_fully_qualified_name()}/detections")
    markers = Collector(client, MarkerArray, f"{node.get_fully_qualified_name()}/markers")
    assert wait_for(lambda: pub.get_subscription_count() == 1 and node._det_pub.get_subscription_count() == 1
                    and node._marker_pub.get_subscription_count() == 1), "discovery failed"
    return node, pub, dets, markers, factory


def publish_until(pub, msg, collector, count=1, timeout_s=10.0):
    """Publish ``msg`` until ``collector`` holds ``count`` messages (best-effort input may drop some)."""
    deadline = time.monotonic() + timeout_s
    while len(collector.msgs) < count and time.monotonic() < deadline:
        pub.publish(msg)
        wait_for(lambda: len(collector.msgs) >= count, timeout_s=0.3)
    return len(collector.msgs) >= count


def test_detections_and_markers_follow_the_input(ros):
    node, pub, dets, markers, factory = start_node(ros)
    msg = cloud_msg(stamp_ns=1_234_567_890_123, frame_id="avia_frame", centre=(12.0, -3.0, -0.5))
    assert publish_until(pub, msg, dets)
    out = dets.msgs[0]
    assert ros_msgs.stamp_to_ns(out.header.stamp) == 1_234_567_890_123
    assert out.header.frame_id == "avia_frame"
    assert len(out.detections) == 1
    det = out.detections[0]
    assert det.results[0].hypothesis.class_id == "car"
    assert det.results[0].hypothesis.score == pytest.approx(0.9)
    c = det.bbox.center
    assert (c.position.x, c.position.y) == pytest.approx((12.0, -3.0), abs=0.2)
    assert ros_msgs.quaternion_to_yaw(c.orientation.x, c.orientation.y, c.orientation.z,
                                      c.orientation.w) == pytest.approx(0.5, abs=1e-6)
    assert (det.bbox.size.x, det.bbox.size.y, det.bbox.size.z) == pytest.approx((4.0, 1.8, 1.5))
    arrays = ros_msgs.msg_to_arrays(out)
    assert arrays.class_names == ["car"] and arrays.boxes.shape == (1, 7)

    assert wait_for(lambda: len(markers.msgs) >= 1)
    m = markers.msgs[0].markers
    assert m[0].action == Marker.DELETEALL  # clears the previous frame's boxes
    kinds = sorted((mk.type, mk.ns) for mk in m[1:])
    assert kinds == [(Marker.LINE_LIST, "livox_infer/boxes"), (Marker.TEXT_VIEW_FACING, "livox_infer/labels")]
    lines = next(mk for mk in m if mk.type == Marker.LINE_LIST)
    assert len(lines.points) == 24 and lines.header.frame_id == "avia_frame"
    text = next(mk for mk in m if mk.type == Marker.TEXT_VIEW_FACING)
    assert text.text == "#1 car 0.90"  # its 0.9 >= tracking_confirm_score: a confirmed track at once
    # The fake pipeline was built from the node's parameters.
    assert factory.built[0].options == pipeline_options(node._values)


def test_frame_id_override_and_markers_off(ros):
    node, pub, dets, markers, _ = start_node(ros, frame_id="base_link", publish_markers=False)
    assert publish_until(pub, cloud_msg(frame_id="livox_frame"), dets, count=2)
    assert all(d.header.frame_id == "base_link" for d in dets.msgs)
    time.sleep(0.2)
    assert markers.msgs == []


def malformed_clouds():
    good = cloud_msg(n=10)
    short = cloud_msg(n=10)
    short.data = short.data[:-5]  # buffer shorter than row_step * height
    no_xyz = cloud_msg(n=10)
    no_xyz.fields = [PointField(name="intensity", offset=12, datatype=PointField.FLOAT32, count=1)]
    bad_step = cloud_msg(n=10)
    bad_step.point_step = 4  # fields beyond the point
    bad_step.row_step = 40
    big_endian = cloud_msg(n=10)
    big_endian.is_bigendian = True
    empty = cloud_msg(n=0)
    nans = cloud_msg(n=10)
    arr = np.frombuffer(bytes(nans.data), dtype=np.uint8).copy()
    arr.view(np.float32)[: 18 * 10 // 4] = np.nan  # (not aligned per point: x/y/z/i of many points become NaN)
    nans.data = arr.tobytes()
    assert good.width == 10
    return {"short": short, "no_xyz": no_xyz, "bad_step": bad_step, "big_endian": big_endian}, empty, nans


def deliver(pub, msg, node, timeout_s=5.0):
    """Publish ``msg`` until the node received it and the worker has taken it (best-effort input)."""
    before = node.stats.received
    deadline = time.monotonic() + timeout_s
    while node.stats.received == before and time.monotonic() < deadline:
        pub.publish(msg)
        wait_for(lambda: node.stats.received > before, timeout_s=0.3)
    assert node.stats.received > before
    assert wait_for(lambda: node._pending is None)
    time.sleep(0.05)


def test_malformed_clouds_are_counted_and_survived(ros):
    node, pub, dets, _, _ = start_node(ros)
    diags = Collector(ros.nodes[-1], DiagnosticArray, "/diagnostics")
    bad, empty, nans = malformed_clouds()
    for msg in bad.values():
        deliver(pub, msg, node)
    assert wait_for(lambda: node.stats.rejected == len(bad), timeout_s=5), node.stats
    assert node.stats.last_error
    n_before = len(dets.msgs)
    deliver(pub, empty, node)
    assert wait_for(lambda: node.stats.empty == 1)
    assert wait_for(lambda: len(dets.msgs) == n_before + 1)  # empty clouds give an empty detection array
    assert dets.msgs[-1].detections == []
    deliver(pub, nans, node)
    # ...and the node still detects afterwards
    good_stamp = 77_000_000_000
    assert publish_until(pub, cloud_msg(stamp_ns=good_stamp), dets, count=len(dets.msgs) + 1)
    assert ros_msgs.stamp_to_ns(dets.msgs[-1].header.stamp) == good_stamp
    assert node.stats.failed == 0
    assert wait_for(lambda: any(
        int(ros_msgs.diagnostic_values(a.status[0]).get("frames_rejected", 0)) == len(bad) for a in diags.msgs
        if a.status and a.status[0].name.startswith(node.get_name())), timeout_s=3)
    status = [a.status[0] for a in diags.msgs if a.status[0].name.startswith(node.get_name())][-1]
    assert status.level == b"\x01"  # WARN while rejected clouds are on record
    assert "rejected" in status.message


def test_malformed_clouds_never_displace_a_waiting_valid_one(ros):
    """Junk is rejected in the callback: a valid cloud waiting for the busy worker is still processed."""
    factory = FakeFactory(delay_s=0.4)
    node, pub, dets, _, _ = start_node(ros, factory)
    pipeline = factory.built[0]
    bad, _, _ = malformed_clouds()
    deliver(pub, cloud_msg(stamp_ns=1_000_000_000, n=20), node)  # the worker is busy with it now
    waiting = 2_000_000_000
    before = node.stats.received
    pub.publish(cloud_msg(stamp_ns=waiting, n=20))
    assert wait_for(lambda: node.stats.received > before)
    rejected = node.stats.rejected
    for msg in bad.values():
        pub.publish(msg)
    assert wait_for(lambda: node.stats.rejected >= rejected + 1, timeout_s=3)
    assert wait_for(lambda: waiting in pipeline.calls, timeout_s=5), (pipeline.calls, node.stats)
    assert node.stats.dropped == 0, node.stats


def test_latest_frame_only_under_a_slow_pipeline(ros):
    factory = FakeFactory(delay_s=0.25)
    node, pub, dets, _, _ = start_node(ros, factory)
    pipeline = factory.built[0]
    sent = []
    for i in range(20):  # 50 Hz into a 4 Hz pipeline
        stamp = (i + 1) * 1_000_000_000
        pub.publish(cloud_msg(stamp_ns=stamp, n=20))
        sent.append(stamp)
        time.sleep(0.02)
    assert wait_for(lambda: node._pending is None and len(dets.msgs) == len(pipeline.calls), timeout_s=5)
    time.sleep(0.3)
    s = node.stats
    # Every received cloud is either processed or counted as dropped: there is no queue.
    assert s.received == s.processed + s.dropped
    assert s.dropped >= 10 and s.processed <= 6, s
    assert pipeline.calls == sorted(pipeline.calls)  # in order, never stale
    assert pipeline.calls[-1] == sent[-1]  # the newest cloud is the one processed at the end
    # Latency stays ~one pipeline step: queue wait never exceeds one detect duration by much.
    assert max(node.stats.latency_ms["queue_wait"]) < 0.25e3 * 2


def test_executor_dispatches_each_cloud_once_while_the_worker_is_busy(ros):
    # rclpy's MultiThreadedExecutor re-yields a ready callback until a pool thread starts it; with the
    # worker holding the GIL that loop ran hundreds of times per cloud and starved the node (stalls of
    # up to 2 s, clouds lost before the subscription saw them). The node's executor must not.
    factory = FakeFactory(busy_s=0.06)
    node, pub, dets, _, _ = start_node(ros, factory)
    dispatches = []
    inner = ros.executor.wait_for_ready_callbacks

    def counting(*args, **kwargs):
        handler, entity, n = inner(*args, **kwargs)
        if entity is node._sub:
            dispatches.append(time.monotonic())
        return handler, entity, n

    ros.executor.wait_for_ready_callbacks = counting
    try:
        for i in range(20):
            pub.publish(cloud_msg(stamp_ns=(i + 1) * 100_000_000, n=2000))
            time.sleep(0.05)
        assert wait_for(lambda: node._pending is None and node.stats.processed >= 3)
        time.sleep(0.2)
    finally:
        ros.executor.wait_for_ready_callbacks = inner
    received = node.stats.received
    assert received >= 10
    assert len(dispatches) <= received + 2, f"{len(dispatches)} dispatches for {received} clouds"


def test_no_subscribers_skips_inference_but_counts_input(ros):
    factory = FakeFactory()
    topic = "/" + unique("cloud")
    node = ros.add(DetectorNode(pipeline_factory=factory, node_name=unique("det"), context=ros.context,
                                parameter_overrides=[Parameter("input_topic", value=topic)]))
    pub = ros.node(unique("client")).create_publisher(PointCloud2, topic, 10)
    assert wait_for(lambda: pub.get_subscription_count() == 1)
    for i in range(3):
        pub.publish(cloud_msg(stamp_ns=i + 1))
        time.sleep(0.1)
    assert wait_for(lambda: node.stats.received == 3 and node.stats.skipped_no_subscribers >= 1)
    assert factory.built[0].calls == []
    assert node.stats.processed == 0


def set_param(node, name, value):
    return node.set_parameters([Parameter(name, value=value)])[0]


def test_invalid_parameter_changes_are_rejected_and_change_nothing(ros):
    node, pub, dets, _, factory = start_node(ros)
    before = dict(node._values)
    cases = {
        "roi_x_min": 500.0,  # >= roi_x_max
        "score_threshold_car": 1.5,  # outside the descriptor's range
        "tag_filter": "sometimes",
        "device": "tpu",
        "max_range": -1.0,
        "sensor": "velodyne",  # read-only
        "input_topic": "/elsewhere",  # read-only
        "weights": "/nonexistent/missing.safetensors",  # rebuild fails: old pipeline kept
        "model": "no_such_model",
        "score_threshold_pedestrian": "high",  # wrong type
        "latency_window": 50,  # read-only
    }
    for name, value in cases.items():
        result = set_param(node, name, value)
        assert not result.successful, name
        assert result.reason, name
        assert node.get_parameter(name).value == before[name], name
    assert node._values == before
    assert len(factory.built) == 1 and factory.built[0].updates == []
    # The node still works with its original pipeline.
    assert publish_until(pub, cloud_msg(), dets)
    assert node.pipeline is factory.built[0]


def test_valid_parameter_changes_apply_in_place_or_rebuild(ros):
    node, pub, dets, _, factory = start_node(ros)
    first = factory.built[0]
    assert set_param(node, "score_threshold_car", 0.6).successful
    classes = ModelConfig.load("lite").classes
    assert first.updates[-1] == {"score_thresholds": {
        c: 0.6 if c == "car" else node._values[f"score_threshold_{c}"] for c in classes}}
    r = node.set_parameters_atomically([Parameter("roi_x_min", value=-10.0), Parameter("roi_x_max", value=50.0)])
    assert r.successful
    assert first.updates[-1]["roi"][0] == -10.0 and first.updates[-1]["roi"][3] == 50.0
    assert set_param(node, "estimate_ground", True).successful
    assert first.updates[-1] == {"sensor_height": "auto"}
    assert len(factory.built) == 1  # all in place
    assert set_param(node, "device", "cpu").successful  # needs a rebuild
    assert len(factory.built) == 2 and node.pipeline is factory.built[1]
    assert factory.built[1].options["device"] == "cpu"
    assert factory.built[1].options["score_thresholds"]["car"] == 0.6  # earlier changes carried over
    assert publish_until(pub, cloud_msg(), dets)
    assert factory.built[1].calls and not first.calls
    assert set_param(node, "use_sim_time", True).successful  # rclpy's own parameters pass through


def test_diagnostics_report_backend_rates_and_latency(ros):
    node, pub, dets, _, _ = start_node(ros, diagnostics_period=0.25, latency_window=10)
    diags = Collector(ros.nodes[-1], DiagnosticArray, "/diagnostics")
    # a busy node drops frames on purpose (latest wins), so on a loaded machine 14 sends may not give 11
    # processed frames: keep sending, 50 ms apart, until enough were processed to fill the latency window
    for i in range(200):
        pub.publish(cloud_msg(stamp_ns=(i + 1) * 100_000_000))
        if wait_for(lambda: node.stats.processed >= 11, timeout_s=0.05):
            break
    assert node.stats.processed >= 11
    status = node.diagnostics_status()
    values = ros_msgs.diagnostic_values(status)
    assert values["backend"] == "fake-auto"
    assert values["model"] == "lite"
    for key in ("input_rate_hz", "processed_rate_hz", "frames_received", "frames_processed", "frames_dropped",
                "frames_rejected", "frames_empty", "last_error",
                "latency_decode_mean_ms", "latency_decode_p50_ms", "latency_decode_p99_ms",
                "latency_node_detect_p99_ms", "latency_end_to_end_p50_ms"):
        assert key in values, key
    assert int(values["frames_processed"]) >= 3
    # rates cover the time since the previous report; the 0.25 s timer may have reported the burst already
    def rates():
        return [float(values["input_rate_hz"])] + [
            float(ros_msgs.diagnostic_values(a.status[0])["input_rate_hz"]) for a in list(diags.msgs)
            if a.status[0].name.startswith(node.get_name())]

    assert wait_for(lambda: max(rates()) > 0, timeout_s=3) and min(rates()) >= 0
    assert math.isfinite(float(values["latency_decode_p99_ms"]))
    assert len(node.stats.latency_ms["decode"]) == 10  # latency_window caps the samples kept
    assert status.level == b"\x00" and status.message == "detecting"
    # ...and it is published on /diagnostics every diagnostics_period
    assert wait_for(lambda: sum(a.status[0].name.startswith(node.get_name()) for a in diags.msgs) >= 4, timeout_s=3)


def test_custom_msg_input(ros):
    pytest.importorskip("livox_ros_driver2.msg")
    from livox_ros_driver2.msg import CustomMsg
    from rclpy.serialization import deserialize_message

    from livox_infer.decode.custom_msg import encode_custom_msg_cdr

    factory = FakeFactory()
    topic = "/" + unique("custom")
    node = ros.add(DetectorNode(pipeline_factory=factory, node_name=unique("det"), context=ros.context,
                                parameter_overrides=[Parameter("input_topic", value=topic),
                                                     Parameter("input_type", value="custom_msg")]))
    client = ros.node(unique("client"))
    pub = client.create_publisher(CustomMsg, topic, 10)
    dets = Collector(client, Detection3DArray, f"{node.get_fully_qualified_name()}/detections")
    assert wait_for(lambda: pub.get_subscription_count() == 1 and node._det_pub.get_subscription_count() == 1)
    rng = np.random.default_rng(1)
    pts = np.concatenate([rng.normal((20.0, -4.0, 0.0), 0.3, (100, 3)), np.full((100, 1), 30.0)], axis=1)
    msg = deserialize_message(encode_custom_msg_cdr(pts, stamp_ns=5_000_000_123, frame_id="livox_frame"), CustomMsg)
    assert publish_until(pub, msg, dets)
    out = dets.msgs[0]
    assert ros_msgs.stamp_to_ns(out.header.stamp) == 5_000_000_123 and out.header.frame_id == "livox_frame"
    c = out.detections[0].bbox.center.position
    assert (c.x, c.y) == pytest.approx((20.0, -4.0), abs=0.2)
    # a truncated CustomMsg is counted as rejected, not fatal
    bad = CustomMsg()
    bad.point_num = 5  # claims points it does not carry
    deliver(pub, bad, node)
    assert wait_for(lambda: node.stats.rejected == 1)
    assert publish_until(pub, msg, dets, count=len(dets.msgs) + 1)


def test_parameter_changes_over_the_parameter_service(ros):
    """What `ros2 param set` does: the SetParameters service of the node, from another node."""
    from rcl_interfaces.srv import SetParameters

    node, _, _, _, factory = start_node(ros)
    client_node = ros.node(unique("param_client"))
    client = client_node.create_client(SetParameters, f"{node.get_fully_qualified_name()}/set_parameters")
    assert client.wait_for_service(timeout_sec=5)

    def call(name, value):
        req = SetParameters.Request(parameters=[Parameter(name, value=value).to_parameter_msg()])
        fut = client.call_async(req)
        assert wait_for(fut.done, timeout_s=5)
        return fut.result().results[0]

    bad = call("roi_z_min", 10.0)
    assert not bad.successful and "roi_z_min" in bad.reason
    assert node.get_parameter("roi_z_min").value == node._values["roi_z_min"] != 10.0
    good = call("tag_filter", "strict")
    assert good.successful and node.get_parameter("tag_filter").value == "strict"
    assert factory.built[0].updates[-1] == {"tag_filter": "strict"}


def test_a_set_parameters_request_is_one_change(ros):
    """`ros2 param load` sends one SetParameters request: it is validated and applied as a whole. Moving the ROI
    past its other end (x 0..70 -> 90..150) works, an invalid whole changes nothing; integers are taken for
    doubles, and entries equal to the current value (a read-only `sensor`) are no change."""
    from rcl_interfaces.srv import SetParameters

    node, _, _, _, factory = start_node(ros)
    client_node = ros.node(unique("param_client"))
    client = client_node.create_client(SetParameters, f"{node.get_fully_qualified_name()}/set_parameters")
    assert client.wait_for_service(timeout_sec=5)

    def load(**values):
        req = SetParameters.Request(parameters=[Parameter(k, value=v).to_parameter_msg() for k, v in values.items()])
        fut = client.call_async(req)
        assert wait_for(fut.done, timeout_s=5)
        return fut.result().results

    assert node._values["roi_x_max"] < 90
    results = load(roi_x_min=90, roi_x_max=150, sensor=node._values["sensor"])
    assert [r.successful for r in results] == [True] * 3, [r.reason for r in results]
    assert node.get_parameter("roi_x_min").value == 90.0 and node.get_parameter("roi_x_max").value == 150.0
    assert factory.built[0].updates[-1]["roi"][0::3] == (90.0, 150.0)
    updates = len(factory.built[0].updates)
    results = load(max_range=50.0, roi_x_max=10.0)
    assert [r.successful for r in results] == [False, False]
    assert all("roi_x_min (90.0) must be smaller than roi_x_max (10.0)" in r.reason for r in results)
    assert node.get_parameter("max_range").value != 50.0 and node.get_parameter("roi_x_max").value == 150.0
    assert len(factory.built[0].updates) == updates
    results = load(sensor="mid40", max_range=50.0)
    assert not any(r.successful for r in results) and "read-only" in results[0].reason
    assert node.get_parameter("max_range").value != 50.0


def test_integers_are_taken_for_double_parameters(ros):
    node, _, _, _, factory = start_node(ros)
    result = set_param(node, "max_range", 80)
    assert result.successful, result.reason
    assert node.get_parameter("max_range").value == 80.0 and isinstance(node.get_parameter("max_range").value, float)
    assert factory.built[0].updates[-1] == {"max_range": 80.0}
    assert not set_param(node, "latency_window", 50.0).successful  # the other way round stays an error


def test_topics_and_warming_up_diagnostics_exist_while_the_pipeline_builds(ros):
    """A torch.compile start takes up to a minute: the node must not look dead meanwhile."""
    import threading

    release = threading.Event()
    factory = FakeFactory()

    def slow_factory(options):
        assert release.wait(30), "test did not release the build"
        return factory(options)

    observer = ros.node(unique("observer"))
    diags = Collector(observer, DiagnosticArray, "/diagnostics")
    name = unique("warming")
    built = {}
    starter = threading.Thread(target=lambda: built.update(node=DetectorNode(
        pipeline_factory=slow_factory, node_name=name, context=ros.context,
        parameter_overrides=[Parameter("input_topic", value="/" + unique("cloud")),
                             Parameter("diagnostics_period", value=0.2)])), daemon=True)
    starter.start()
    try:
        assert wait_for(lambda: observer.count_publishers(f"/{name}/detections") == 1, timeout_s=10)
        assert wait_for(lambda: any(st.message.startswith("warming up") and st.name.startswith(name)
                                    for m in diags.msgs for st in m.status), timeout_s=10)
        assert not factory.built
    finally:
        release.set()
        starter.join(timeout=30)
    node = ros.add(built["node"])
    assert node.pipeline is factory.built[0]
    status = node.diagnostics_status()
    assert not status.message.startswith("warming up")


def test_start_up_says_how_the_pipeline_is_built(tmp_path, monkeypatch):
    from livox_infer.ros.node import PARAMS
    from livox_infer.ros.warmup import describe_start

    values = {p.name: p.default for p in PARAMS}
    assert "eager at once while that package is built in the background" in describe_start(values)  # the default
    values["build_package"] = False
    cache = tmp_path / "inductor"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))
    said = describe_start(values)  # compile_in_background, the default
    assert "in a background thread, eager at once until it is ready" in said and "no warm compile cache" in said
    values["compile_in_background"] = False
    assert "no warm compile cache in" in describe_start(values) and str(cache) in describe_start(values)
    (cache / "fxgraph").mkdir(parents=True)
    assert "warm compile cache found in" in describe_start(values)
    assert "(compile_in_background; warm compile cache" in describe_start({**values, "compile_in_background": True})
    assert "eager" in describe_start({**values, "use_compile": False})
    assert "AOTInductor package /x.pt2" in describe_start({**values, "aoti_package": "/x.pt2"})


def test_input_published_with_another_type_is_reported(ros):
    """A CustomMsg publisher on a PointCloud2 input never matches: no frame, so the node must say why."""
    livox = pytest.importorskip("livox_ros_driver2.msg")
    node, _, _, _, _ = start_node(ros)
    topic = node._values["input_topic"]
    import rclpy
    from rclpy.context import Context

    elsewhere = Context()  # another process in real life: one DDS participant cannot hold both types
    rclpy.init(context=elsewhere)
    try:
        other = rclpy.create_node(unique("custom_pub"), context=elsewhere)
        other.create_publisher(livox.CustomMsg, topic, 1)
        assert wait_for(lambda: (node._check_graph() or node._graph_problem) is not None, timeout_s=10)
        other.destroy_node()
    finally:
        elsewhere.try_shutdown()
    status = node.diagnostics_status()
    assert "is published as livox_ros_driver2/msg/CustomMsg" in status.message
    assert "set input_type:=custom_msg" in status.message


def test_echo_prints_one_line_per_detection():
    from livox_infer.ros.echo import format_frame
    from test_node_support import FakeDetections

    dets = FakeDetections(np.array([[10.0, -2.0, -1.0, 4.2, 1.8, 1.5, 0.5]], np.float32), np.array([1]),
                          np.array([0.8], np.float32), ["pedestrian"])
    text = format_frame(ros_msgs.detections_to_msg(dets, stamp_ns=1_500_000_000, frame_id="livox_frame"))
    head, line = text.splitlines()
    assert head == "1.500 s  livox_frame  1 detections"
    assert line.split()[:2] == ["pedestrian", "0.80"] and "xyz   10.00   -2.00  -1.00" in line and "yaw +0.50" in line


def test_clouds_over_the_point_budget_are_counted_and_reported(ros):
    node, pub, dets, _, factory = start_node(ros, max_points=1000)
    assert factory.built[0].options["max_points"] == 1000
    assert publish_until(pub, cloud_msg(n=300), dets)
    assert node.stats.over_budget == 0
    assert publish_until(pub, cloud_msg(n=1500), dets, count=len(dets.msgs) + 1)
    assert wait_for(lambda: node.stats.over_budget >= 1)
    assert int(ros_msgs.diagnostic_values(node.diagnostics_status())["frames_over_budget"]) >= 1
    assert not set_param(node, "max_points", 10).successful  # below MAX_POINTS_RANGE
    assert set_param(node, "max_points", 5000).successful
    assert factory.built[0].updates[-1] == {"max_points": 5000}


def test_aoti_package_is_start_up_only(ros):
    """A package is native code: the parameter service must not make the node load one."""
    node, _, _, _, factory = start_node(ros)
    assert not set_param(node, "aoti_package", "/tmp/any.pt2").successful
    assert len(factory.built) == 1 and node._values["aoti_package"] == ""


class FailingFactory(FakeFactory):
    """Pipelines whose detect fails for chosen stamps: typed (WeightsError) or not (a bug)."""

    def __call__(self, options):
        from livox_infer.errors import WeightsError

        p = super().__call__(options)
        real = p.detect

        def detect(msg):
            stamp = ros_msgs.stamp_to_ns(msg.header.stamp)
            if stamp == 5_000_000_000:
                raise WeightsError("network gave up")
            if stamp == 6_000_000_000:
                raise IndexError("a bug")
            return real(msg)

        p.detect = detect
        return p


def test_failed_frames_publish_an_empty_array_with_their_header(ros):
    node, pub, dets, _, _ = start_node(ros, factory=FailingFactory())
    for i, stamp in enumerate((5_000_000_000, 6_000_000_000)):
        assert publish_until(pub, cloud_msg(stamp_ns=stamp, frame_id="f"), dets, count=i + 1)
        assert ros_msgs.stamp_to_ns(dets.msgs[-1].header.stamp) == stamp and dets.msgs[-1].detections == []
    assert wait_for(lambda: node.stats.failed >= 2) and node.stats.processed == 0
    assert "IndexError" in node.stats.last_error
    assert publish_until(pub, cloud_msg(stamp_ns=7_000_000_000), dets, count=len(dets.msgs) + 1)
    assert len(dets.msgs[-1].detections) == 1 and node.stats.processed == 1


def test_rebuild_rejections_do_not_reveal_files(ros, tmp_path):
    """Over the parameter service a missing file and a readable foreign one get the same answer."""
    from livox_infer.errors import ConfigError, WeightsError

    class Revealing(FakeFactory):
        def __call__(self, options):
            w = options.get("weights")
            if w and not Path(w).exists():
                raise WeightsError(f"weights file not found: {w}")
            if w:
                raise ConfigError(f"{w}: unknown keys ['secret_key']")
            return super().__call__(options)

    node, _, _, _, _ = start_node(ros, factory=Revealing())
    existing = tmp_path / "passwords.yaml"
    existing.write_text("secret_key: 1\n")
    missing, readable = set_param(node, "weights", str(tmp_path / "nope.bin")), set_param(node, "weights", str(existing))
    assert not missing.successful and not readable.successful
    assert missing.reason == readable.reason and "cannot load" in missing.reason
    assert "not found" not in readable.reason and "secret_key" not in readable.reason


def test_ctrl_c_during_start_up_exits_without_a_traceback(capsys):
    from livox_infer.ros.node import spin_node

    def interrupted():
        raise KeyboardInterrupt

    try:
        rc = spin_node(["livox-infer-run"], interrupted)
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C during start-up escaped spin_node")
    assert rc == 130
    err = capsys.readouterr().err
    assert "interrupted during start-up" in err and "Traceback" not in err


def test_undecodable_messages_are_counted_as_rejected(ros):
    """Truncated CDR: counted and warned about (throttled) by the node, not one middleware line per message."""
    from rclpy.serialization import serialize_message

    node, pub, dets, _, _ = start_node(ros)
    good = serialize_message(cloud_msg(stamp_ns=8_000_000_000))
    for _ in range(3):
        pub.publish(good[: len(good) // 2])
    assert wait_for(lambda: node.stats.rejected >= 1)
    assert "undecodable" in node.stats.last_error
    assert publish_until(pub, good, dets)  # raw bytes of a valid cloud are detected as before
    assert ros_msgs.stamp_to_ns(dets.msgs[-1].header.stamp) == 8_000_000_000
