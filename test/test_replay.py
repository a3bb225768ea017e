"""Bag replay into ROS (rosbags reader + raw CDR publishing): contents byte-exact, recorded timing
scaled by --rate, remapping, sqlite3 and mcap, CustomMsg, errors; and replay → node end to end."""

from __future__ import annotations

import contextlib
import threading
import time

import numpy as np
import pytest

pytest.importorskip("rclpy")
pytest.importorskip("vision_msgs.msg")

from rclpy.serialization import serialize_message  # noqa: E402
from sensor_msgs.msg import PointCloud2  # noqa: E402
from vision_msgs.msg import Detection3DArray  # noqa: E402

from livox_infer.bags import BagWriter  # noqa: E402
from livox_infer.errors import ConfigError  # noqa: E402
from livox_infer.decode.pointcloud import decode_pointcloud2, encode_pointcloud2  # noqa: E402
from livox_infer.ros.replay import BagError, BagReplayer, parse_remaps  # noqa: E402
from test_node_support import Collector, unique, wait_for  # noqa: E402

pytestmark = pytest.mark.ros
FRAMES = 6
PERIOD_NS = 100_000_000  # 10 Hz
T0 = 1_700_000_000_000_000_000


def frame_points(i: int) -> np.ndarray:
    rng = np.random.default_rng(i)
    return np.concatenate([rng.uniform(1, 30, (50, 3)), rng.uniform(0, 255, (50, 1))], axis=1).astype(np.float32)


def write_bag(path, storage="sqlite3", custom=False):
    with BagWriter(path, storage=storage) as w:
        for i in range(FRAMES):
            stamp = T0 + i * PERIOD_NS
            pts = frame_points(i)
            if custom:
                w.write_custom_msg("/livox/lidar", pts, tag=np.zeros(len(pts), np.uint8), stamp_ns=stamp)
            else:
                w.write_cloud("/livox/lidar", encode_pointcloud2(pts, "livox", stamp_ns=stamp))
            w.write_detections("/livox_infer/ground_truth", stamp, "livox_frame",
                               np.array([[10.0 + i, 1.0, -1.0, 4.2, 1.8, 1.5, 0.1]]), np.array([0]))
    return path


def replay_into(ros, bag, **kwargs):
    """Replay ``bag`` with a fresh remapped cloud topic; returns (stats, clouds, gts, elapsed_s)."""
    cloud_topic = "/" + unique("replayed")
    gt_topic = "/" + unique("gt")
    pub_node = ros.node(unique("replay"))
    sub_node = ros.node(unique("listener"))
    replayer = BagReplayer(pub_node, bag, remap={"/livox/lidar": cloud_topic, "/livox_infer/ground_truth": gt_topic},
                           **kwargs)
    from livox_ros_driver2.msg import CustomMsg  # noqa: F401  (installed with the interface build)

    cloud_type = PointCloud2 if "PointCloud2" in str(replayer._publishers["/livox/lidar"].msg_type) else CustomMsg
    clouds = Collector(sub_node, cloud_type, cloud_topic)
    gts = Collector(sub_node, Detection3DArray, gt_topic)
    assert replayer.wait_for_subscribers(cloud_topic) and replayer.wait_for_subscribers(gt_topic)
    time.sleep(0.2)  # let the subscriptions see the publishers too
    t0 = time.monotonic()
    stats = replayer.run()
    elapsed = time.monotonic() - t0
    assert wait_for(lambda: len(clouds.msgs) == FRAMES and len(gts.msgs) == FRAMES, timeout_s=5)
    return stats, clouds.msgs, gts.msgs, elapsed


@pytest.mark.parametrize("storage", ["sqlite3", "mcap"])
def test_replay_publishes_every_message_byte_exact_with_scaled_timing(ros, tmp_path, storage):
    bag = write_bag(tmp_path / "bag", storage)
    stats, clouds, gts, elapsed = replay_into(ros, bag, rate=2.0)
    assert sorted(stats.published.values()) == [FRAMES, FRAMES]
    recorded_s = (FRAMES - 1) * PERIOD_NS * 1e-9
    assert recorded_s / 2.0 - 0.02 <= elapsed < recorded_s / 2.0 + 0.5  # rate 2: half the recorded span
    for i, msg in enumerate(clouds):
        cloud = decode_pointcloud2(msg)
        assert cloud.stamp_ns == T0 + i * PERIOD_NS  # recorded stamps kept, in order
        np.testing.assert_array_equal(cloud.points, frame_points(i))
    assert [g.detections[0].bbox.center.position.x for g in gts] == [10.0 + i for i in range(FRAMES)]
    assert gts[0].detections[0].results[0].hypothesis.class_id == "car"


def test_rate_zero_is_as_fast_as_possible_and_loop_repeats(ros, tmp_path):
    bag = write_bag(tmp_path / "bag")
    node = ros.node(unique("replay"))
    replayer = BagReplayer(node, bag, rate=0.0, loop=True, topics=["/livox/lidar"])
    t0 = time.monotonic()
    stop = threading.Event()
    stats = replayer.run(stop, max_messages=3 * FRAMES)
    assert time.monotonic() - t0 < 1.0
    assert stats.published == {"/livox/lidar": 3 * FRAMES} and stats.loops == 2


def test_custom_msg_bags_replay(ros, tmp_path):
    pytest.importorskip("livox_ros_driver2.msg")
    from livox_infer.ros.node import custom_msg_cdr_to_cloud

    bag = write_bag(tmp_path / "bag", custom=True)
    stats, clouds, _, _ = replay_into(ros, bag, rate=0.0)
    cloud = custom_msg_cdr_to_cloud(serialize_message(clouds[2]))
    np.testing.assert_allclose(cloud.points[:, :3], frame_points(2)[:, :3], atol=1e-6)


def test_bad_input_gives_clear_errors(ros, tmp_path):
    node = ros.node(unique("replay"))
    with pytest.raises(BagError, match="not found"):
        BagReplayer(node, tmp_path / "nope")
    with pytest.raises(ConfigError, match="remap"):
        parse_remaps(["/livox/lidar=/x"])
    assert parse_remaps(["/a:=/b"]) == {"/a": "/b"}
    bag = write_bag(tmp_path / "bag")
    with pytest.raises(BagError, match="nothing to replay"):
        BagReplayer(node, bag, topics=["/not/in/bag"])
    with pytest.raises(ConfigError, match="rate"):
        BagReplayer(node, bag, rate=-1.0)


@pytest.mark.slow  # replay and node subprocesses: ~7 s
def test_replay_cli_ends_cleanly_on_ctrl_c_and_remaps_without_rcl_warnings(tmp_path):
    """`livox-infer replay BAG --loop --remap A:=B`, then Ctrl-C: exit 0 with the summary, no RCLError traceback
    (rclpy's SIGINT handler used to invalidate the context under the publish loop) and no rcl warning about
    the deprecated remap syntax (our --remap reached rcl as a bare `A:=B`)."""
    import signal

    bag = write_bag(tmp_path / "bag")
    topic = "/" + unique("ctrl_c")
    with _replay_cli(bag, "--loop", "--rate", "0", "--wait-for-subscriber", "0", "--remap", f"/livox/lidar:={topic}") \
            as (proc, lines):
        time.sleep(1.0)  # publishing (rate 0: as fast as possible) when the Ctrl-C comes
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=30)
    out = "".join(lines)
    assert rc in (0, 130), out
    assert "Traceback" not in out and "RCLError" not in out, out
    assert "deprecated" not in out, out
    assert f"{topic}:" in out and "loops" in out, out  # the summary


@pytest.mark.slow  # a replay subprocess: ~5 s
def test_replay_cli_waits_for_a_late_subscriber_so_the_first_frame_is_not_lost(ros, tmp_path):
    """A node subscribing a moment after `livox-infer replay` started still gets the bag's first frame (DDS drops
    what is published before discovery matched the subscriber; `ros2 launch` + replay lost it every time)."""
    bag = write_bag(tmp_path / "bag")
    topic = "/" + unique("late")
    with _replay_cli(bag, "--rate", "0", "--remap", f"/livox/lidar:={topic}") as (proc, lines):
        time.sleep(0.5)  # the replay is up; the subscriber comes late
        got = Collector(ros.node(unique("late_sub")), PointCloud2, topic)
        proc.wait(timeout=60)
    out = "".join(lines)
    assert proc.returncode == 0, out
    assert wait_for(lambda: len(got.msgs) == FRAMES), (len(got.msgs), out)
    first = got.msgs[0].header.stamp
    assert first.sec * 1_000_000_000 + first.nanosec == T0, out  # the first frame arrived


@contextlib.contextmanager
def _replay_cli(bag, *args: str):
    """`livox-infer replay BAG ARGS` as a subprocess, once it says "replaying": (process, its output lines so far,
    growing); killed on the way out if still running, its output read to the end."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "livox_infer.tools.cli", "replay", str(bag), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        assert wait_for(lambda: any("replaying" in line for line in lines), timeout_s=60), "".join(lines)
        yield proc, lines
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(timeout=5)


def test_corrupt_messages_are_counted_not_published_and_fail_the_cli(ros, tmp_path, capsys):
    bag = tmp_path / "damaged"
    with BagWriter(bag) as w:
        for i in range(FRAMES):
            w.write_cloud("/livox/lidar", encode_pointcloud2(frame_points(i), "livox", stamp_ns=T0 + i * PERIOD_NS))
        conn = w._connection("/livox/lidar", "sensor_msgs/msg/PointCloud2")
        w._writer.write(conn, T0 + FRAMES * PERIOD_NS, b"\x00\x01\x00\x00 truncated")  # undecodable CDR
        good = serialize_message(PointCloud2())
        short = encode_pointcloud2(frame_points(0), "livox", stamp_ns=T0)
        short.data = short.data[:-7]  # decodes, but its data are shorter than row_step * height
        from livox_infer.bags import pointcloud2_to_cdr

        w._writer.write(conn, T0 + (FRAMES + 1) * PERIOD_NS, pointcloud2_to_cdr(short))
        w._writer.write(conn, T0 + (FRAMES + 2) * PERIOD_NS, bytes(good))  # an empty cloud is valid
        wide = encode_pointcloud2(frame_points(0)[:1], "xyzi", stamp_ns=T0)  # issue 30: width 1e9 in 18 bytes
        wide.width, wide.row_step, wide.data = 10**9, 18, wide.data[:16] + b"\x00\x00"
        w._writer.write(conn, T0 + (FRAMES + 3) * PERIOD_NS, pointcloud2_to_cdr(wide))
    node = ros.node(unique("replay"))
    stats = BagReplayer(node, bag, rate=0, remap={"/livox/lidar": "/" + unique("out")}).run()
    assert stats.corrupt == {"/livox/lidar": 3}
    assert sum(stats.published.values()) == FRAMES + 1

    import argparse

    from livox_infer.ros import replay

    p = argparse.ArgumentParser()
    replay.add_arguments(p)
    ros.close()  # main() initialises rclpy's default context itself
    assert replay.main(p.parse_args([str(bag), "--rate", "0"])) == 1
    assert "3 corrupt messages skipped" in capsys.readouterr().err


def test_a_damaged_mcap_chunk_is_a_bag_error(ros, tmp_path):
    bag = write_bag(tmp_path / "bag", storage="mcap")
    (mcap,) = bag.glob("*.mcap")
    raw = bytearray(mcap.read_bytes())
    at = raw.find(frame_points(2)[10].tobytes())
    assert at > 0
    raw[at] ^= 0x01
    mcap.write_bytes(bytes(raw))
    replayer = BagReplayer(ros.node(unique("replay")), bag, rate=0, remap={"/livox/lidar": "/" + unique("out")})
    with pytest.raises(BagError, match="checksum"):
        replayer.run()
