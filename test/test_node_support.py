"""Helpers shared by the node / replay / launch tests: an rclpy context per test, spinning with a
deadline, synthetic clouds and a controllable fake pipeline (the node is pipeline-agnostic)."""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import pytest

from livox_infer import CLASS_NAMES
from livox_infer.errors import ConfigError, WeightsError
from livox_infer.decode.pointcloud import Cloud, decode_pointcloud2, encode_pointcloud2, to_ros_message

_counter = itertools.count()


def unique(prefix: str) -> str:
    """A topic / node name no other test in this process uses (tests share one ROS domain)."""
    return f"{prefix}_{next(_counter)}_{int(time.monotonic() * 1e3) % 100000}"


@dataclass
class FakeDetections:
    boxes: np.ndarray
    labels: np.ndarray
    scores: np.ndarray
    label_names: list  # one class name per box, as DetectionPipeline's Detections
    timings_ms: dict = field(default_factory=dict)
    class_names: tuple = CLASS_NAMES
    points_over_budget: int = 0


class FakePipeline:
    """Stands in for DetectionPipeline: really decodes the cloud (so malformed input raises the
    real PointCloudError), then reports one "car" box centred on the points' centroid."""

    def __init__(self, options: dict, delay_s: float = 0.0, busy_s: float = 0.0) -> None:
        self.options = dict(options)
        self.delay_s = delay_s
        self.busy_s = busy_s  # Python work holding the GIL, as a network forward does between ops
        self.calls: list[int] = []  # stamp_ns of every cloud detected, in order
        self.updates: list[dict] = []
        self.last_points = None
        self.ground_resets = 0
        self.backend = f"fake-{options.get('device')}"

    def detect(self, msg) -> FakeDetections:
        t0 = time.perf_counter()
        cloud = msg if isinstance(msg, Cloud) else decode_pointcloud2(msg)
        t1 = time.perf_counter()
        self.calls.append(cloud.stamp_ns)
        self.last_points = cloud.points  # what a real network would have been given
        if self.delay_s:
            time.sleep(self.delay_s)
        end = time.perf_counter() + self.busy_s
        while time.perf_counter() < end:
            sum(range(200))
        if len(cloud) == 0:
            return FakeDetections(np.zeros((0, 7), np.float32), np.zeros(0, np.int64), np.zeros(0, np.float32), [])
        c = cloud.points[:, :3].mean(axis=0)
        box = np.array([[c[0], c[1], c[2], 4.0, 1.8, 1.5, 0.5]], dtype=np.float32)
        return FakeDetections(box, np.array([0]), np.array([0.9], np.float32), ["car"],
                              timings_ms={"decode": (t1 - t0) * 1e3, "network": self.delay_s * 1e3},
                              points_over_budget=max(0, len(cloud) - self.options.get("max_points", len(cloud))))

    def reset_ground(self) -> None:
        self.ground_resets += 1

    def update(self, **options) -> None:
        self.updates.append(options)
        self.options.update(options)


class FakeFactory:
    """pipeline_factory for DetectorNode: records builds; weights named 'missing*' fail like real ones."""

    def __init__(self, delay_s: float = 0.0, busy_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.busy_s = busy_s
        self.built: list[FakePipeline] = []

    def __call__(self, options: dict) -> FakePipeline:
        weights = options.get("weights") or ""
        if "missing" in weights:
            raise WeightsError(f"weights file not found: {weights}")
        if options.get("model") == "no_such_model":
            raise ConfigError("model config not found: no_such_model")
        p = FakePipeline(options, self.delay_s, self.busy_s)
        self.built.append(p)
        return p


def cloud_msg(stamp_ns: int = 1_000_000_000, frame_id: str = "livox_frame", n: int = 200, centre=(10.0, 2.0, -0.5),
              layout: str = "livox", seed: int = 0):
    """An rclpy PointCloud2 with ``n`` points around ``centre``."""
    from sensor_msgs.msg import PointCloud2

    rng = np.random.default_rng(seed)
    pts = np.concatenate([rng.normal(centre, 0.5, size=(n, 3)), rng.uniform(0, 255, size=(n, 1))], axis=1)
    data = encode_pointcloud2(pts.astype(np.float32), layout, tag=np.zeros(n, np.uint8), stamp_ns=stamp_ns,
                              frame_id=frame_id)
    return to_ros_message(data, PointCloud2)


class RosHarness:
    """One rclpy context + a background executor; nodes added here spin until close()."""

    def __init__(self) -> None:
        import rclpy
        from rclpy.context import Context

        self.context = Context()
        rclpy.init(context=self.context)
        from livox_infer.ros.node import create_executor

        self.executor = create_executor(self.context)  # what the node spins in
        self.nodes = []
        self._thread = threading.Thread(target=self._spin, daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        from rclpy.executors import ExternalShutdownException

        try:
            while self.context.ok():
                self.executor.spin_once(timeout_sec=0.05)
        except (ExternalShutdownException, RuntimeError):
            pass

    def add(self, node):
        self.nodes.append(node)
        self.executor.add_node(node)
        return node

    def node(self, name: str):
        from rclpy.node import Node

        return self.add(Node(name, context=self.context))

    def close(self) -> None:
        for n in reversed(self.nodes):
            self.executor.remove_node(n)
            n.destroy_node()
        self.context.try_shutdown()
        self._thread.join(timeout=5.0)
        self.executor.shutdown()


def wait_for(predicate, timeout_s: float = 10.0, period_s: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(period_s)
    return bool(predicate())


class Collector:
    """Subscribes to a topic and keeps every message (thread-safe enough for tests: list.append)."""

    def __init__(self, node, msg_type, topic: str, depth: int = 100) -> None:
        self.msgs = []
        self.sub = node.create_subscription(msg_type, topic, self.msgs.append, depth)


@pytest.mark.slow  # starts the detector_node wrapper: ~8 s
def test_detector_node_help_prints_the_parameters_and_does_not_start():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", "import sys; from livox_infer.ros.node import main; sys.exit(main())",
                          "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: ros2 run livox_infer detector_node")
    from livox_infer.ros.node import PARAMS

    assert all(f"  {p.name} (default" in out.stdout for p in PARAMS)
