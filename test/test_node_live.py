"""Every documented way to start the node runs live: the real DetectorNode with the real DetectionPipeline (CPU,
eager) on loopback, started with the ROS arguments each documented command gives it (`livox-infer run ...` through
the CLI's own ros_arguments; `ros2 launch livox_infer detect.launch.py ...` through the `livox-infer run` options
that load the same files; `ros2 run livox_infer detector_node --ros-args ...` as written) from README.md, docs/*.md,
config/ and launch/detect.launch.py, kept alive for several diagnostics periods while clouds (PointCloud2 or
CustomMsg, as configured, and odometry where configured) arrive on every topic it subscribes to. It must publish
detections for the clouds it was sent, count no failed or rejected frame, and still publish diagnostics at the end.

The matrix is generated from the documents, so a newly documented configuration is tested without editing this
file; commands that give the node the same arguments run once. Lines that need an artefact a test cannot afford
to build are listed in NEEDS_ARTEFACT with the reason (that list must keep matching documented lines), and lines
naming a placeholder file (/path/my.yaml) are skipped saying so. Device, compile and threads are forced to cpu /
eager / 1 (the documented `--sensor avia` means auto / compiled): the node's code paths are the same, compile
costs minutes.
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
# documented lines that need something a test cannot afford to build, with the reason (must match a line); such
# a line runs when the file it names is there (e.g. after `livox-infer export` into the repository root)
NEEDS_ARTEFACT = {
    "aoti_package:=": "an AOTInductor package from `livox-infer export` (minutes of C++ compilation); "
                      "the AOTI runner is tested in test_export.py",
}


def _sources() -> list[Path]:
    docs = [p for p in sorted((REPO / "docs").glob("*.md")) if p.name != "log.md"]  # the log keeps old CLIs
    return [REPO / "README.md", *docs, *sorted((REPO / "config").rglob("*.yaml")), REPO / "launch" / "detect.launch.py"]


# the ways to start the node: `livox-infer run ...`, `ros2 launch livox_infer detect.launch.py ...`,
# `ros2 run livox_infer detector_node ...`
_COMMAND = re.compile(r"(?:livox-infer run|ros2 launch livox_infer detect\.launch\.py|ros2 run livox_infer detector_node)"
                      r"(?: [^`#\n(]*)?")
# detect.launch.py's arguments -> the `livox-infer run` option that does the same (node_name: the test names it)
LAUNCH_OPTIONS = {"sensor": "--sensor", "params_file": "--params-file", "input_topic": "--input-topic",
                  "rig": "--rig", "model": "--model", "device": "--device", "use_compile": "--use-compile",
                  "node_name": None}
# launch arguments that set a node parameter `livox-infer run` has no option for: passed as -p NAME:=VALUE (rviz
# starts a viewer beside the node, nothing of the node's)
LAUNCH_PARAMETERS = {"input_type": "input_type", "output_frame": "output_frame", "use_sim_time": "use_sim_time",
                     "rviz": None, "lifecycle": None}


def documented_lines() -> list[str]:
    """Every distinct command that starts the node in the README, docs, config files and the launch file (inline
    code, bash blocks, comments), without its trailing comment."""
    found: dict[str, None] = {}
    for path in _sources():
        for line in path.read_text().splitlines():
            for m in _COMMAND.finditer(line):
                text = m.group(0).strip()
                if "..." in text or "[" in text.split("--ros-args")[0] \
                        or any(re.fullmatch(r"[A-Z][A-Z_]*", t) for t in re.split(r"\s+|:=", text)):
                    continue  # a synopsis (`--threads N`, `--sensor NAME`, `sensor:=NAME`), not a command
                found.setdefault(" ".join(text.split()))
    return list(found)


def documented_run_lines() -> list[str]:
    return [x for x in documented_lines() if x.startswith("livox-infer run")]


def _parse(args: list[str]) -> argparse.Namespace:
    from livox_infer.ros.node import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(args)


def ros_argv_for(line: str) -> list[str]:
    """The argument list the node is initialised with for a documented command (as the program would)."""
    from livox_infer.ros.node import ros_arguments

    tokens = shlex.split(line.replace("$PWD", str(REPO)))
    if tokens[:2] == ["livox-infer", "run"]:
        return ros_arguments(_parse(tokens[2:]))
    if tokens[:2] == ["ros2", "launch"]:  # the launch file loads what `livox-infer run` loads for these options
        options, parameters = [], []
        for arg in tokens[4:]:
            name, value = arg.split(":=", 1)
            assert name in LAUNCH_OPTIONS or name in LAUNCH_PARAMETERS, \
                f"launch argument {name!r} unknown to this test: add it to LAUNCH_OPTIONS or LAUNCH_PARAMETERS"
            if name in LAUNCH_PARAMETERS:
                parameters += ["-p", f"{LAUNCH_PARAMETERS[name]}:={value}"] if LAUNCH_PARAMETERS[name] else []
            else:
                options += [LAUNCH_OPTIONS[name], value] if LAUNCH_OPTIONS[name] else []
        return ros_arguments(_parse(options)) + parameters
    rest = [str(REPO / t) if (REPO / t).is_file() else t for t in tokens[4:]]  # ros2 run: paths from the repo root
    return ["detector_node", *rest] if "--ros-args" in rest else ["detector_node", *rest, "--ros-args"]


def _missing_file(line: str) -> str | None:
    """A file the command names that is not here (a placeholder such as /path/my.yaml)."""
    for token in re.split(r"[\s=]+", line.replace("$PWD", str(REPO))):
        if token.endswith((".yaml", ".pt2")) and not (Path(token).is_file() or (REPO / token).is_file()
                                                     or (REPO / "config" / token).is_file()):
            return token
    return None


def test_the_documents_give_the_configurations_that_merge_and_stack():
    lines = documented_run_lines()
    joined = "\n".join(lines)
    # the configurations issue 30 found crashing must stay documented (and so in the matrix below)
    for needle in ("--rig ", "rig:=", "input_topics:=", "accumulate_frames:=", "odometry_topic:=",
                   "input_type:=custom_msg", "output_frame:=", "odometry_frame:="):
        assert needle in joined, needle
    assert any("accumulate_frames:=" in x and "odometry_topic" not in x for x in lines), \
        "plain accumulation (no odometry) is not documented"
    for key in NEEDS_ARTEFACT:
        assert any(key in x for x in lines), f"NEEDS_ARTEFACT entry {key!r} matches no documented line any more"


def _points(rng: np.random.Generator) -> np.ndarray:
    """A plausible frame in front of a sensor: ground 1.8 m below, a car-sized block 12 m ahead, a wall."""
    ground = np.column_stack([rng.uniform(2, 40, 6000), rng.uniform(-15, 15, 6000), np.full(6000, -1.8)])
    car = np.column_stack([rng.uniform(11, 15.5, 1500), rng.uniform(-1, 1, 1500), rng.uniform(-1.8, -0.3, 1500)])
    wall = np.column_stack([np.full(1500, 30.0), rng.uniform(-10, 10, 1500), rng.uniform(-1.8, 2.0, 1500)])
    xyz = np.concatenate([ground, car, wall]) + rng.normal(0, 0.02, (9000, 3))
    return np.column_stack([xyz, rng.uniform(0, 100, len(xyz))]).astype(np.float32)


def _message(custom: bool, pts: np.ndarray, stamp_ns: int, frame_id: str):
    """The frame as the node's input type: an rclpy PointCloud2, or a livox_ros_driver2 CustomMsg."""
    if custom:
        from rclpy.serialization import deserialize_message

        from livox_infer.decode.custom_msg import encode_custom_msg_cdr
        from livox_infer.ros.node import custom_msg_class

        return deserialize_message(encode_custom_msg_cdr(pts, stamp_ns=stamp_ns, frame_id=frame_id),
                                   custom_msg_class())
    from sensor_msgs.msg import PointCloud2

    from livox_infer.decode.pointcloud import encode_pointcloud2, to_ros_message

    data = encode_pointcloud2(pts, "livox", tag=np.zeros(len(pts), np.uint8), stamp_ns=stamp_ns, frame_id=frame_id)
    return to_ros_message(data, PointCloud2)


class LiveNode:
    """rclpy initialised with ``ros_argv`` in a context of its own, the DetectorNode built from it (as
    spin_node does) and a client node, spun by one executor thread that records what escapes a callback."""

    def __init__(self, ros_argv: list[str], managed: bool = False) -> None:
        import rclpy
        from rclpy.context import Context

        from livox_infer.ros.node import DetectorNode, create_executor, managed_node_class

        self.context = Context()
        rclpy.init(args=ros_argv, context=self.context)
        self.errors: list[BaseException] = []
        self.node = None
        if managed:  # `--lifecycle` / `lifecycle:=true`: configured and activated as a lifecycle manager would
            from rclpy.lifecycle import TransitionCallbackReturn

            self.node = managed_node_class()(context=self.context)
            assert self.node.trigger_configure() == TransitionCallbackReturn.SUCCESS
            assert self.node.trigger_activate() == TransitionCallbackReturn.SUCCESS
        else:
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
    """One case per distinct start-up (lines that give the node the same arguments, e.g. `ros2 launch ...
    sensor:=horizon` and `livox-infer run --sensor horizon`, run once)."""
    out, seen = [], set()
    for line in documented_lines():
        missing = _missing_file(line)
        reason = None if missing is None else next(
            (f"needs {why}: {missing} is not here" for key, why in NEEDS_ARTEFACT.items() if key in line),
            f"names {missing}, a placeholder that is not a file here")
        if reason is None:
            argv = ros_argv_for(line)[1:]
            forced = {i for i in range(1, len(argv)) if argv[i - 1] == "-p"
                      and argv[i].split(":=")[0] in ("device", "use_compile", "threads")}  # the test sets these
            key = (_managed(line),) + tuple(a for i, a in enumerate(argv) if i not in forced and i + 1 not in forced)
            if key in seen:
                continue
            seen.add(key)
        marks = [pytest.mark.skip(reason=reason)] if reason else []
        out.append(pytest.param(line, marks=marks, id=line[:80]))
    return out


def _managed(line: str) -> bool:
    """The command starts the lifecycle (managed) node."""
    return "--lifecycle" in line.split() or "lifecycle:=true" in line.split()


@pytest.mark.parametrize("line", _cases())
def test_documented_node_configuration_runs_live(line):
    _run_live(ros_argv_for(line) + ["-p", "device:=cpu", "-p", "use_compile:=false", "-p", "threads:=1"],
              compiled=False, managed=_managed(line))


@pytest.mark.slow  # torch.compile of the network on the CPU: ~10-60 s depending on the inductor cache
def test_the_first_documented_command_runs_live_compiled():
    """`livox-infer run --sensor avia` as the README writes it: device auto (the CPU here), torch.compile on."""
    line = next(x for x in documented_run_lines() if x.split() == ["livox-infer", "run", "--sensor", "avia"])
    _run_live(ros_argv_for(line) + ["-p", "threads:=1"], compiled=True)


def _run_live(argv: list[str], compiled: bool, managed: bool = False) -> None:
    from diagnostic_msgs.msg import DiagnosticArray
    from nav_msgs.msg import Odometry
    from sensor_msgs.msg import PointCloud2
    from vision_msgs.msg import Detection3DArray

    from livox_infer.ros import messages as ros_msgs
    from livox_infer.ros.node import custom_msg_class

    name = unique("live_det")
    argv = argv + ["-p", f"diagnostics_period:={DIAG_PERIOD_S}", "-r", f"__node:={name}"]
    if "input_type:=custom_msg" in argv and custom_msg_class() is None:
        pytest.skip("input_type custom_msg needs the livox_ros_driver2 (or livox_interfaces) interface package")
    if any(a.startswith(("output_frame:=", "odometry_frame:=")) for a in argv):
        from tf2_support import load_tf2

        reason = load_tf2()  # before the node imports tf2_ros (a venv gets it from scripts/setup_tf2.sh)
        if isinstance(reason, str):
            pytest.skip(f"TF parameters need tf2_ros: {reason}")
    live = LiveNode(argv, managed)
    try:
        node = live.node
        assert node._values["use_compile"] is compiled
        if not compiled:
            assert node._values["device"] == "cpu"
        sensors = node._assembler.rig.sensors if node._assembler is not None else []
        topics = [s.topic for s in sensors] or [node._values["input_topic"]]
        # a rig file's clouds come in each sensor's own frame; clouds already in one frame in the driver's livox_frame
        frames = {s.topic: s.name for s in sensors} if node._values["rig"] else {}
        if getattr(node, "_tf_rig", False):  # a rig described by TF: each topic's clouds in a frame of their own
            frames = {s.topic: f"lidar_{i}" for i, s in enumerate(sensors)}
        custom = node._values["input_type"] == "custom_msg"
        msg_type = custom_msg_class() if custom else PointCloud2
        pubs = {t: live.client.create_publisher(msg_type, t, 10) for t in topics}
        odom_topic = node._values["odometry_topic"]
        odom_pub = live.client.create_publisher(Odometry, odom_topic, 50) if odom_topic else None
        output_frame, odometry_frame = node._values["output_frame"], node._values["odometry_frame"]
        tf_pub = None
        if odometry_frame:  # the vehicle's motion on /tf, as a robot's odometry publishes it
            from tf2_support import load_tf2, static_transform

            tf_pub = load_tf2().TransformBroadcaster(live.client)
        if output_frame:  # the robot's TF: each cloud frame 1.9 m above output_frame, on the real tf2_ros
            from tf2_support import load_tf2, static_transform

            from livox_infer.rig import transform_from_xyz_rpy

            tf2_ros = load_tf2()
            mount = transform_from_xyz_rpy(0.5, 0.0, 1.9, 0.0, 0.0, 0.0)
            broadcaster = tf2_ros.StaticTransformBroadcaster(live.client)
            broadcaster.sendTransform([static_transform(output_frame, f, mount)
                                       for f in {*frames.values(), "livox_frame"}])
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
            if tf_pub is not None:  # 1 m/s forward, as the odometry above
                from livox_infer.rig import transform_from_xyz_rpy

                tf_pub.sendTransform(static_transform(
                    odometry_frame, output_frame or "livox_frame",
                    transform_from_xyz_rpy((stamp % 10**12) * 1e-9, 0, 0, 0, 0, 0), stamp_ns=stamp))
            pts = _points(rng)
            for topic, pub in pubs.items():
                pub.publish(_message(custom, pts, stamp, frames.get(topic, "livox_frame")))
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
        if output_frame or odometry_frame:
            assert int(values["frames_tf_failed"]) <= 1, values  # the first cloud may beat its pose to the buffer
        if output_frame:
            assert {d.header.frame_id for d in dets} == {output_frame}
        if node._values["aoti_package"]:
            assert "aoti" in values["backend"], values["backend"]  # the package runs, not a fallback
        if compiled:  # compiled, or a prebuilt package `make package` left for this machine: not the eager fallback
            assert "compile_error" not in values and "eager" not in values["backend"], values
        if node._assembler is not None:
            assert int(values["merged_frames"]) >= 1
            if len(topics) > 1:
                assert int(values["merged_partial"]) < int(values["merged_frames"]), values
            if node._values["accumulate_frames"] > 1:
                stacked = int(values["accumulated_compensated"]) + int(values["accumulated_plain"])
                assert stacked >= 1, values
            if (odom_topic or odometry_frame) and node._values["accumulate_frames"] > 1:
                assert int(values["accumulated_compensated"]) >= 1, values
    finally:
        live.close()


def test_a_wrong_sensor_height_is_named_in_the_diagnostics_and_the_log():
    """`livox-infer run --sensor avia` (sensor_height 1.8 m) on clouds whose ground lies 0.8 m below the sensor (a
    low mount): the node keeps detecting, counts the frames, and its diagnostics say WARN with both heights."""
    from sensor_msgs.msg import PointCloud2
    from vision_msgs.msg import Detection3DArray

    name = unique("mount_det")
    argv = ros_argv_for("livox-infer run --sensor avia") + [
        "-p", "device:=cpu", "-p", "use_compile:=false", "-p", "threads:=1", "-p", "sensor_height:=1.8",
        "-p", f"diagnostics_period:={DIAG_PERIOD_S}", "-r", f"__node:={name}"]
    live = LiveNode(argv)
    try:
        node = live.node
        pub = live.client.create_publisher(PointCloud2, node._values["input_topic"], 10)
        dets = []  # a subscriber: a node without one skips its frames
        live.client.create_subscription(Detection3DArray, f"{node.get_fully_qualified_name()}/detections",
                                        dets.append, 50)
        assert wait_for(lambda: pub.get_subscription_count() >= 1 and node._det_pub.get_subscription_count() >= 1), \
            "discovery failed"
        rng = np.random.default_rng(1)
        stamp = 1_700_000_000_000_000_000
        deadline = time.monotonic() + 90.0
        while time.monotonic() < deadline and not live.errors and node.stats.ground_mismatch < 3:
            stamp += 100_000_000
            pts = _points(rng)
            pts[:, 2] += 1.0  # the ground 0.8 m below the sensor
            pub.publish(_message(False, pts, stamp, "livox_frame"))
            time.sleep(0.1)
        assert not live.errors, f"the node died: {live.errors[0]!r}"
        status = node.diagnostics_status()
        values = {kv.key: kv.value for kv in status.values}
        assert int(values["frames_ground_mismatch"]) >= 3 and values["frames_failed"] == "0", values
        assert dets  # still detecting
        assert status.level == b"\x01", status.message  # WARN
        assert "sensor_height is 1.80 m" in status.message and "estimate_ground to true" in status.message, \
            status.message
    finally:
        live.close()
