"""Every documented way to start the node runs live: the real DetectorNode with the real DetectionPipeline (CPU,
eager) on loopback, started with the very ROS arguments `livox-infer run` builds from each `livox-infer run ...`
line in README.md, docs/*.md and config/, kept alive for several diagnostics periods while clouds (and, where
configured, odometry) arrive on every topic it subscribes to. It must publish detections for the clouds it was
sent, count no failed or rejected frame, and still publish diagnostics at the end.

The matrix is generated from the documents, so a newly documented configuration is tested without editing this
file; the few lines that need an artefact a test cannot afford to build are listed in NEEDS_ARTEFACT with the
reason, and that list must keep matching documented lines. Device and compile are forced to cpu / eager (the
documented `--sensor avia` means auto / compiled): the node's code paths are the same, compile costs minutes.
"""

from __future__ import annotations

import argparse
import re
import shlex
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("rclpy")
pytest.importorskip("vision_msgs.msg")
pytest.importorskip("livox_infer.pipeline")

from test_node_support import unique, wait_for  # noqa: E402

pytestmark = pytest.mark.ros

REPO = Path(__file__).resolve().parent.parent
DIAG_PERIOD_S = 0.3
MIN_DIAG_TICKS = 4  # diagnostics ticks the node must survive after its first detection
# documented lines that need something a test cannot afford to build, with the reason (must match a line)
NEEDS_ARTEFACT = {
    "aoti_package:=": "an AOTInductor package from `livox-infer export` (minutes of C++ compilation); "
                      "the AOTI runner is tested in test_export.py",
}


def _sources() -> list[Path]:
    docs = [p for p in sorted((REPO / "docs").glob("*.md")) if p.name != "log.md"]  # the log keeps old CLIs
    return [REPO / "README.md", *docs, *sorted((REPO / "config").rglob("*.yaml"))]


def documented_run_lines() -> list[str]:
    """Every distinct `livox-infer run ...` command in the README, docs and config files (inline code, bash
    blocks and YAML comments), without its trailing comment."""
    found: dict[str, None] = {}
    for path in _sources():
        for line in path.read_text().splitlines():
            for m in re.finditer(r"livox-infer run(?: [^`#\n(]*)?", line):
                text = m.group(0).strip()
                if "..." in text or "[" in text.split("--ros-args")[0] \
                        or any(re.fullmatch(r"[A-Z][A-Z_]*", t) for t in text.split()):
                    continue  # a synopsis (`--threads N`, `--sensor NAME`), not a command
                found.setdefault(" ".join(text.split()))
    return list(found)


def _parse(line: str) -> argparse.Namespace:
    from livox_infer.ros.node import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(shlex.split(line.replace("$PWD", str(REPO)))[2:])


def test_the_documents_give_the_configurations_that_merge_and_stack():
    lines = documented_run_lines()
    joined = "\n".join(lines)
    # the configurations issue 30 found crashing must stay documented (and so in the matrix below)
    for needle in ("--rig ", "rig:=", "input_topics:=", "accumulate_frames:=", "odometry_topic:="):
        assert needle in joined, needle
    assert any("accumulate_frames:=" in x and "odometry_topic" not in x for x in lines), \
        "plain accumulation (no odometry) is not documented"
    for key in NEEDS_ARTEFACT:
        assert any(key in x for x in lines), f"NEEDS_ARTEFACT entry {key!r} matches no documented line any more"


def _cloud_msg(stamp_ns: int, frame_id: str, rng: np.random.Generator):
    """A plausible frame in front of a sensor: ground 1.8 m below, a car-sized block 12 m ahead, a wall."""
    from sensor_msgs.msg import PointCloud2

    from livox_infer.decode.pointcloud import encode_pointcloud2, to_ros_message

    ground = np.column_stack([rng.uniform(2, 40, 6000), rng.uniform(-15, 15, 6000), np.full(6000, -1.8)])
    car = np.column_stack([rng.uniform(11, 15.5, 1500), rng.uniform(-1, 1, 1500), rng.uniform(-1.8, -0.3, 1500)])
    wall = np.column_stack([np.full(1500, 30.0), rng.uniform(-10, 10, 1500), rng.uniform(-1.8, 2.0, 1500)])
    xyz = np.concatenate([ground, car, wall]) + rng.normal(0, 0.02, (9000, 3))
    pts = np.column_stack([xyz, rng.uniform(0, 100, len(xyz))]).astype(np.float32)
    data = encode_pointcloud2(pts, "livox", tag=np.zeros(len(pts), np.uint8), stamp_ns=stamp_ns, frame_id=frame_id)
    return to_ros_message(data, PointCloud2)


class LiveNode:
    """rclpy initialised with ``ros_argv`` in a context of its own, the DetectorNode built from it (as
    spin_node does) and a client node, spun by one executor thread that records what escapes a callback."""

    def __init__(self, ros_argv: list[str]) -> None:
        import rclpy
        from rclpy.context import Context

        from livox_infer.ros.node import DetectorNode, create_executor

        self.context = Context()
        rclpy.init(args=ros_argv, context=self.context)
        self.errors: list[BaseException] = []
        self.node = None
        self.node = DetectorNode(context=self.context)
        self.client = rclpy.create_node(unique("live_client"), context=self.context)
        self.executor = create_executor(self.context)
        self.executor.add_node(self.node)
        self.executor.add_node(self.client)
        self.thread = threading.Thread(target=self._spin, daemon=True)
        self.thread.start()

    def _spin(self) -> None:
        from rclpy.executors import ExternalShutdownException

        while self.context.ok():
            try:
                self.executor.spin_once(timeout_sec=0.05)
            except ExternalShutdownException:
                return
            except BaseException as exc:  # noqa: BLE001 - what `livox-infer run` would die of
                if self.context.ok():
                    self.errors.append(exc)
                return

    def close(self) -> None:
        for n in (self.client, self.node):
            if n is not None:
                self.executor.remove_node(n)
                n.destroy_node()
        self.context.try_shutdown()
        self.thread.join(timeout=5.0)
        self.executor.shutdown()


def _cases():
    out = []
    for line in documented_run_lines():
        reason = next((why for key, why in NEEDS_ARTEFACT.items() if key in line), None)
        marks = [pytest.mark.skip(reason=f"needs {reason}")] if reason else []
        out.append(pytest.param(line, marks=marks, id=line[len("livox-infer run "):][:70] or "defaults"))
    return out


@pytest.mark.parametrize("line", _cases())
def test_documented_node_configuration_runs_live(line):
    from diagnostic_msgs.msg import DiagnosticArray
    from nav_msgs.msg import Odometry
    from sensor_msgs.msg import PointCloud2
    from vision_msgs.msg import Detection3DArray

    from livox_infer.ros import messages as ros_msgs
    from livox_infer.ros.node import ros_arguments

    args = _parse(line)
    args.device, args.compile, args.threads = "cpu", False, 1
    name = unique("live_det")
    argv = ros_arguments(args) + ["-p", f"diagnostics_period:={DIAG_PERIOD_S}", "-r", f"__node:={name}"]
    live = LiveNode(argv)
    try:
        node = live.node
        sensors = node._assembler.rig.sensors if node._assembler is not None else []
        topics = [s.topic for s in sensors] or [node._values["input_topic"]]
        frames = {s.topic: s.name for s in sensors}  # a rig's clouds come in each sensor's own frame
        pubs = {t: live.client.create_publisher(PointCloud2, t, 10) for t in topics}
        odom_topic = node._values["odometry_topic"]
        odom_pub = live.client.create_publisher(Odometry, odom_topic, 50) if odom_topic else None
        dets, diags = [], []
        live.client.create_subscription(Detection3DArray, f"{node.get_fully_qualified_name()}/detections",
                                        dets.append, 50)
        live.client.create_subscription(DiagnosticArray, "/diagnostics",
                                        lambda m: diags.extend(s for s in m.status if s.name.startswith(name)), 50)
        assert wait_for(lambda: all(p.get_subscription_count() >= 1 for p in pubs.values())
                        and node._det_pub.get_subscription_count() >= 1), "discovery failed"

        rng = np.random.default_rng(0)
        sent: list[int] = []
        stamp = 1_700_000_000_000_000_000
        diag_at_first_detection = None
        deadline = time.monotonic() + 90.0
        while time.monotonic() < deadline and not live.errors:
            stamp += 100_000_000
            if odom_pub is not None:  # the vehicle drives 1 m/s forward
                odom = Odometry()
                odom.header.stamp.sec, odom.header.stamp.nanosec = divmod(stamp, 1_000_000_000)
                odom.pose.pose.position.x = (stamp % 10**12) * 1e-9
                odom.pose.pose.orientation.w = 1.0
                odom_pub.publish(odom)
            msg = _cloud_msg(stamp, "livox_frame", rng)
            for topic, pub in pubs.items():
                msg.header.frame_id = frames.get(topic, "livox_frame")
                pub.publish(msg)
            sent.append(stamp)
            time.sleep(0.1)
            if diag_at_first_detection is None and dets:
                diag_at_first_detection = len(diags)
            if diag_at_first_detection is not None and len(diags) >= diag_at_first_detection + MIN_DIAG_TICKS:
                break
        assert not live.errors, f"the node died: {live.errors[0]!r}"
        assert dets, f"no detections within 90 s; diagnostics: {diags[-1].message if diags else 'none'}"
        assert len(diags) >= (diag_at_first_detection or 0) + MIN_DIAG_TICKS, "diagnostics stopped"
        assert {ros_msgs.stamp_to_ns(d.header.stamp) for d in dets} <= set(sent)
        assert node._worker.is_alive() and live.thread.is_alive()
        values = {kv.key: kv.value for kv in diags[-1].values}
        assert values["frames_failed"] == "0" and values["frames_rejected"] == "0", values
        assert int(values["frames_processed"]) >= 1
        if node._assembler is not None:
            assert int(values["merged_frames"]) >= 1
            if len(topics) > 1:
                assert int(values["merged_partial"]) < int(values["merged_frames"]), values
            if node._values["accumulate_frames"] > 1:
                stacked = int(values["accumulated_compensated"]) + int(values["accumulated_plain"])
                assert stacked >= 1, values
            if odom_topic and node._values["accumulate_frames"] > 1:
                assert int(values["accumulated_compensated"]) >= 1, values
    finally:
        live.close()
