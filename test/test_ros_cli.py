"""What a ROS 2 user types, with the real upstream tools (launch 3.7.1, launch_ros 0.28.0, ros2cli 0.36.1,
sensor_msgs_py 5.4.2 from ../shared/ros2_upstream, installed by scripts/setup_ros_upstream.sh):

    ros2 launch livox_infer detect.launch.py sensor:=horizon ...      (by package name, through the ament index)
    livox-infer replay drive.db3 --remap ...   +   ros2 topic echo --once .../detections
    ros2 param get / set / load, ros2 topic info -v (type hash)
    sensor_msgs_py.point_cloud2 create_cloud / read_points against livox_infer.decode.pointcloud

One node is launched for the module (use_compile:=false, cpu: ~10-20 s to start on 2 cores); every command is bounded
by a timeout and runs in the module's own ROS domain on localhost. Skipped, with the reason, where the tools are not
installed (../shared absent)."""

from __future__ import annotations

import subprocess
import textwrap
import time

import pytest
import yaml

import ros_upstream
from ros_upstream import Background, ros_env, run

if ros_upstream.skip_reason():
    pytest.skip(ros_upstream.skip_reason(), allow_module_level=True)

pytestmark = [pytest.mark.ros, pytest.mark.slow]  # slow: the upstream ros2 tools against a launched node: ~2 min in all
NODE = "cli_test_detector"
NODE_PATH = f"/{NODE}"
INPUT_TOPIC = "/cli_test/points"
START_TIMEOUT_S = 180  # importing torch and building the eager CPU pipeline on a loaded 2-core machine


@pytest.fixture(scope="module")
def env() -> dict[str, str]:
    environment = ros_env()
    yield environment
    # every ros2 command here runs with --no-daemon; should one still have started the daemon, end it
    run(["ros2", "daemon", "stop"], environment, timeout=30)


@pytest.fixture(scope="module")
def launched(env, tmp_path_factory):
    """`ros2 launch livox_infer detect.launch.py sensor:=horizon ...` running for the whole module."""
    log = tmp_path_factory.mktemp("launch") / "launch.log"
    proc = Background(["ros2", "launch", "livox_infer", "detect.launch.py", "sensor:=horizon", "use_compile:=false",
                       "device:=cpu", f"input_topic:={INPUT_TOPIC}", f"node_name:={NODE}"], env, log)
    started = proc.wait_for_output("detecting on", START_TIMEOUT_S)
    if not started:
        proc.stop()
        pytest.fail(f"the launched node did not start within {START_TIMEOUT_S} s:\n{proc.output()[-3000:]}")
    yield proc
    rc = proc.stop()
    assert rc == 0, f"ros2 launch did not end cleanly on Ctrl-C (rc {rc}):\n{proc.output()[-3000:]}"


@pytest.fixture(scope="module")
def drive_bag(env, tmp_path_factory):
    bag = tmp_path_factory.mktemp("bag") / "drive.db3"
    r = run(["livox-infer", "simulate", "--sensor", "horizon", "--frames", "2", "--seed", "4", "--out", str(bag)],
            env, timeout=120)
    assert r.returncode == 0, r.stderr
    return bag


def param_get(env, name: str) -> str:
    r = run(["ros2", "param", "get", "--no-daemon", "--timeout", "10", NODE_PATH, name], env, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout.strip()


def test_launch_by_package_name_turns_a_replayed_cloud_into_detection3darray(launched, env, drive_bag, tmp_path):
    echo = subprocess.Popen(["ros2", "topic", "echo", "--once", f"{NODE_PATH}/detections",
                             "vision_msgs/msg/Detection3DArray"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    ours = Background(["livox-infer", "echo", "--topic", f"{NODE_PATH}/detections", "--count", "1",
                       "--timeout", "120"], env, tmp_path / "livox_echo.log")
    replay = Background(["livox-infer", "replay", str(drive_bag), "--loop", "--topics", "/livox/lidar",
                         "--remap", f"/livox/lidar:={INPUT_TOPIC}"], env, tmp_path / "replay.log")
    try:
        out, err = echo.communicate(timeout=120)
        ours.proc.wait(timeout=60)
    finally:
        if echo.poll() is None:
            echo.kill()
            echo.wait()
        ours.stop()
        replay_rc = replay.stop()
    assert echo.returncode == 0, err
    assert ours.proc.returncode == 0, ours.output()
    assert " detections" in ours.output() and ("car " in ours.output() or "pedestrian " in ours.output()), ours.output()
    assert replay_rc == 0 and "Traceback" not in replay.output(), replay.output()
    msg = yaml.safe_load(out.split("---")[0])
    assert msg["header"]["frame_id"], msg["header"]
    assert msg["detections"], "the simulated street scene has cars: the shipped weights find some"
    for det in msg["detections"]:
        hyp = det["results"][0]["hypothesis"]
        assert hyp["class_id"] in ("car", "pedestrian", "cyclist") and 0.0 < hyp["score"] <= 1.0
        assert all(det["bbox"]["size"][k] > 0 for k in "xyz")


def test_param_get_and_set_with_an_integer_for_a_double(launched, env):
    assert param_get(env, "sensor") == "String value is: horizon"
    assert param_get(env, "roi_x_max") == "Double value is: 80.0"
    r = run(["ros2", "param", "set", "--no-daemon", "--timeout", "10", NODE_PATH, "max_range", "80"], env, timeout=30)  # as users type it
    assert "Set parameter successful" in r.stdout, r.stdout + r.stderr
    assert param_get(env, "max_range") == "Double value is: 80.0"
    r = run(["ros2", "param", "set", "--no-daemon", "--timeout", "10", NODE_PATH, "max_range", "90.0"], env, timeout=30)
    assert "Set parameter successful" in r.stdout, r.stdout + r.stderr


def test_param_set_that_breaks_the_whole_is_refused_with_a_reason(launched, env):
    r = run(["ros2", "param", "set", "--no-daemon", "--timeout", "10", NODE_PATH, "roi_x_min", "90.0"], env, timeout=30)
    assert "Setting parameter failed: roi_x_min (90.0) must be smaller than roi_x_max (80.0)" in r.stderr
    assert "change both in one request (ros2 param load" in r.stderr
    assert param_get(env, "roi_x_min") == "Double value is: 0.0"
    r = run(["ros2", "param", "set", "--no-daemon", "--timeout", "10", NODE_PATH, "sensor", "avia"], env, timeout=30)
    assert "Setting parameter failed" in r.stderr and "read-only" in r.stderr, r.stdout + r.stderr
    assert param_get(env, "sensor") == "String value is: horizon"


def test_param_load_is_all_or_nothing(launched, env, tmp_path):
    """An ROI move x 0..80 -> 90..150 in one file applies as a whole (one at a time, 90..80 would be refused and
    0..150 left behind); a file whose whole is invalid changes nothing."""
    good = tmp_path / "far.yaml"
    good.write_text("/**:\n  ros__parameters:\n    roi_x_min: 90\n    roi_x_max: 150\n    sensor: horizon\n")
    r = run(["ros2", "param", "load", "--no-daemon", "--timeout", "10", NODE_PATH, str(good)], env, timeout=30)
    assert r.returncode == 0 and "failed" not in r.stdout + r.stderr, r.stdout + r.stderr
    assert param_get(env, "roi_x_min") == "Double value is: 90.0"
    assert param_get(env, "roi_x_max") == "Double value is: 150.0"

    bad = tmp_path / "inverted.yaml"
    bad.write_text("/**:\n  ros__parameters:\n    roi_x_max: 0.0\n    max_range: 50.0\n")
    r = run(["ros2", "param", "load", "--no-daemon", "--timeout", "10", NODE_PATH, str(bad)], env, timeout=30)
    assert r.stderr.count("failed") == 2, r.stdout + r.stderr
    assert "roi_x_min (90.0) must be smaller than roi_x_max (0.0)" in r.stderr
    assert param_get(env, "roi_x_max") == "Double value is: 150.0"
    assert param_get(env, "max_range") == "Double value is: 90.0"

    back = tmp_path / "back.yaml"
    back.write_text("/**:\n  ros__parameters:\n    roi_x_min: 0.0\n    roi_x_max: 80.0\n")
    r = run(["ros2", "param", "load", "--no-daemon", "--timeout", "10", NODE_PATH, str(back)], env, timeout=30)
    assert r.returncode == 0 and "failed" not in r.stdout + r.stderr, r.stdout + r.stderr
    assert param_get(env, "roi_x_max") == "Double value is: 80.0"


def test_detections_topic_type_hash_equals_upstream_vision_msgs(launched, env):
    upstream = ros_upstream.upstream_type_hashes("vision_msgs")
    for _ in range(20):  # without the daemon, discovery of the node's topics takes a moment (longer on a busy CPU)
        r = run(["ros2", "topic", "info", "--verbose", "--no-daemon", f"{NODE_PATH}/detections"], env, timeout=30)
        if r.returncode == 0:
            break
        time.sleep(1.0)
    assert r.returncode == 0, r.stderr
    hashes = {line.split(":", 1)[1].strip() for line in r.stdout.splitlines() if line.startswith("Topic type hash")}
    assert hashes == {upstream["Detection3DArray"]}, r.stdout


def test_every_upstream_vision_msgs_message_is_built_with_the_upstream_hash():
    """The vision_msgs this environment imports is the whole upstream message set (an overlay of the upstream
    package then finds every symbol it expects, whichever library the loader finds first), each message with
    its type support and the upstream type hash."""
    import json
    from pathlib import Path

    import vision_msgs.msg
    from rclpy.type_support import check_for_type_support

    upstream = ros_upstream.upstream_type_hashes("vision_msgs")
    assert len(upstream) == 16
    for name in upstream:
        check_for_type_support(getattr(vision_msgs.msg, name))
    prefix = Path(vision_msgs.__file__).resolve().parents[4]  # <prefix>/lib/pythonX.Y/site-packages/vision_msgs
    ours = {f.stem: json.loads(f.read_text())["type_hashes"][0]["hash_string"]
            for f in (prefix / "share" / "vision_msgs" / "msg").glob("*.json")}
    assert ours == upstream


def test_sensor_msgs_py_reads_and_writes_the_clouds_the_decoder_reads_and_writes():
    script = textwrap.dedent("""
        import numpy as np
        from sensor_msgs.msg import PointField
        from sensor_msgs_py import point_cloud2
        from std_msgs.msg import Header
        from rclpy.serialization import deserialize_message
        from sensor_msgs.msg import PointCloud2
        from livox_infer.decode.pointcloud import decode_pointcloud2, encode_pointcloud2
        from livox_infer.bags import pointcloud2_to_cdr

        rng = np.random.default_rng(0)
        xyzi = np.concatenate([rng.uniform(-50, 50, (500, 3)), rng.uniform(0, 255, (500, 1))], 1).astype(np.float32)
        # sensor_msgs_py writes (intensity first, an extra field, odd offsets), our decoder reads
        fields = [PointField(name="intensity", offset=0, datatype=PointField.FLOAT32, count=1),
                  PointField(name="ring", offset=4, datatype=PointField.UINT16, count=1),
                  PointField(name="x", offset=6, datatype=PointField.FLOAT32, count=1),
                  PointField(name="y", offset=10, datatype=PointField.FLOAT32, count=1),
                  PointField(name="z", offset=14, datatype=PointField.FLOAT32, count=1)]
        rows = [(p[3], i % 16, p[0], p[1], p[2]) for i, p in enumerate(xyzi)]
        msg = point_cloud2.create_cloud(Header(frame_id="lidar"), fields, rows)
        cloud = decode_pointcloud2(msg)
        assert np.array_equal(cloud.points, xyzi), "decode_pointcloud2 differs"
        # our encoder writes (the Livox driver's layout, as bags and the replay publish it), sensor_msgs_py reads
        for layout in ("livox", "livox2", "xyzi"):
            sent = deserialize_message(pointcloud2_to_cdr(encode_pointcloud2(xyzi, layout, stamp_ns=1)), PointCloud2)
            read = point_cloud2.read_points(sent, field_names=("x", "y", "z", "intensity"))
            back = np.stack([read[name] for name in ("x", "y", "z", "intensity")], 1)
            assert np.array_equal(back, xyzi), f"read_points differs ({layout})"
        print("ok", len(back))
    """)
    r = run(["python", "-c", script], ros_env(), timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok 500", r.stdout + r.stderr


def test_launch_exits_non_zero_when_the_node_fails_and_warns_about_unknown_arguments(tmp_path):
    """Missing weights: the node prints its FATAL line and exits 1, so `ros2 launch` must not report success.
    `sensr:=` (a typo) is not silently ignored."""
    params = tmp_path / "broken.yaml"
    params.write_text("/**:\n  ros__parameters:\n    weights: /nonexistent/missing.safetensors\n"
                      "    input_topic: /cli_test/unused\n")
    r = run(["ros2", "launch", "livox_infer", "detect.launch.py", f"params_file:={params}", "use_compile:=false",
             "device:=cpu", "sensr:=mid40", "node_name:=cli_test_failing"], ros_env(), timeout=START_TIMEOUT_S)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "FATAL" in out and "missing.safetensors" in out, out
    assert "cli_test_failing" in out and "exited with status 1" in out, out
    assert "launch argument 'sensr' is not one of detect.launch.py's" in out and "did you mean 'sensor'?" in out, out
