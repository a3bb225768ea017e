"""ROS 2 detector node: thin rclpy glue over the ROS-free :class:`DetectionPipeline`.

``ros2 run livox_infer detector_node`` / ``ros2 launch livox_infer detect.launch.py`` /
``livox-infer run --sensor avia``.

Data flow: the subscription callback only stores the newest cloud (an overwritten, never
processed cloud is counted as dropped); a worker thread takes the newest one, runs the
pipeline and publishes ``~/detections`` (vision_msgs/Detection3DArray), ``~/markers``
(visualization_msgs/MarkerArray) and, once a second, ``/diagnostics``. A slow pipeline
therefore never builds a backlog: latency stays one frame, throughput degrades gracefully.
"""

from __future__ import annotations

import argparse
import collections
import importlib
import logging
import math
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from livox_infer.accumulate import MAX_FRAMES, MAX_WINDOW_MS
from livox_infer.errors import ConfigError, LivoxInferError, PointCloudError, WeightsError
from livox_infer.decode.pointcloud import DEFAULT_MAX_POINTS, MAX_POINTS_RANGE, check_pointcloud2
from livox_infer.bags import pointcloud2_from_cdr
from livox_infer.threads import DEFAULT_THREADS, MAX_THREADS, add_threads_argument, apply_threads
from livox_infer.presets import SENSOR_PRESETS, pipeline_options  # noqa: F401 - re-exported: one definition

DEVICES = ("auto", "cpu", "cuda")
TAG_FILTER_MODES = ("off", "high_confidence", "strict")
INPUT_TYPES = ("pointcloud2", "custom_msg")
NODE_NAME = "livox_detector"

# Parameters whose change needs a new pipeline (new network / device / weights); the rest are
# applied in place with DetectionPipeline.update().
REBUILD_PARAMS = frozenset({"device", "model", "weights", "use_compile", "test_time_flip", "bev_extent"})
# Parameters only the node itself uses (no pipeline involvement).
NODE_ONLY_PARAMS = frozenset({"frame_id", "publish_markers", "sensor", "input_topic", "input_type",
                              "diagnostics_period", "latency_window", "threads", "input_topics", "rig", "odometry_topic",
                              "accumulate_frames", "accumulate_ms"})

WARN_THROTTLE_S = 5.0
_console = logging.getLogger("livox_infer.ros.node")  # stderr only (Python logging), never /rosout


@dataclass(frozen=True)
class ParamSpec:
    name: str
    default: Any
    description: str
    read_only: bool = False
    float_range: tuple[float, float] | None = None
    int_range: tuple[int, int] | None = None
    choices: tuple[str, ...] | None = None
    array_type: str | None = None  # "double" / "string": an array parameter that may be left unset (default None)


PARAMS: tuple[ParamSpec, ...] = (
    ParamSpec("sensor", "avia", f"Livox sensor preset, one of {SENSOR_PRESETS}; selects defaults (height, ROI).",
              read_only=True, choices=SENSOR_PRESETS),
    ParamSpec("input_topic", "/livox/lidar", "Input cloud topic (sensor_msgs/PointCloud2 or livox CustomMsg).",
              read_only=True),
    ParamSpec("input_type", "pointcloud2", "Input message type: pointcloud2, or custom_msg "
              "(livox_ros_driver2/CustomMsg, needs that interface package installed).",
              read_only=True, choices=INPUT_TYPES),
    ParamSpec("device", "auto", "Compute device: auto (cuda if available, else cpu), cpu or cuda. Change rebuilds.",
              choices=DEVICES),
    ParamSpec("model", "lite", "Model config: a name in the package's models/ directory or a path to its YAML. "
              "Change rebuilds."),
    ParamSpec("weights", "", "Optional path to .safetensors weights; empty = the model config's default. "
              "Change rebuilds."),
    ParamSpec("use_compile", True, "torch.compile the network (slower start, faster frames). Change rebuilds."),
    # read-only: a package is native code, so which one runs is decided at start-up, not over the network
    ParamSpec("aoti_package", "", "Optional AOTInductor package (.pt2) from `livox-infer export`: the network "
              "compiled ahead of time with its weights, no compiler needed; empty = off. Only packages listed in "
              "the export manifest are loaded (docs/detector.md, Trust model).", read_only=True),
    ParamSpec("test_time_flip", False, "Run the network on each frame and its mirror image and average them "
              "(~+11 ms compiled network time on 1 core; with the shipped refiner no AP gain, docs/detector.md). "
              "Change rebuilds."),
    ParamSpec("refine", True, "Run stage 2: re-score and refine the best candidates with the points inside them "
              "(models with a refine section; docs/detector.md). false: stage 1 alone, a few ms faster."),
    ParamSpec("score_threshold_car", 0.45, "Minimum score of a published car.", float_range=(0.0, 1.0)),
    ParamSpec("score_threshold_pedestrian", 0.35, "Minimum score of a published pedestrian.",
              float_range=(0.0, 1.0)),
    ParamSpec("score_threshold_cyclist", 0.35, "Minimum score of a published cyclist.", float_range=(0.0, 1.0)),
    ParamSpec("roi_x_min", 0.0, "Region of interest, metres in the cloud frame (points outside are dropped).",
              float_range=(-500.0, 500.0)),
    ParamSpec("roi_x_max", 70.0, "Region of interest x max (m).", float_range=(-500.0, 500.0)),
    ParamSpec("roi_y_min", -40.0, "Region of interest y min (m).", float_range=(-500.0, 500.0)),
    ParamSpec("roi_y_max", 40.0, "Region of interest y max (m).", float_range=(-500.0, 500.0)),
    ParamSpec("roi_z_min", -3.0, "Region of interest z min (m, sensor frame).", float_range=(-50.0, 50.0)),
    ParamSpec("roi_z_max", 3.0, "Region of interest z max (m, sensor frame).", float_range=(-50.0, 50.0)),
    ParamSpec("max_range", 100.0, "Drop points farther than this from the sensor (m).", float_range=(0.5, 1000.0)),
    ParamSpec("max_points", DEFAULT_MAX_POINTS, "Point budget per cloud (after the filters): a larger cloud is "
              "thinned deterministically to this many points (counted as frames_over_budget, warned).",
              int_range=MAX_POINTS_RANGE),
    ParamSpec("tag_filter", "high_confidence", f"Livox tag noise filter: one of {TAG_FILTER_MODES}.",
              choices=TAG_FILTER_MODES),
    ParamSpec("intensity_scale", 255.0, "Full-scale intensity of the input (255 for Livox reflectivity, 1.0 for "
              "clouds already in 0-1); the model sees intensity / intensity_scale.", float_range=(1e-3, 1e6)),
    ParamSpec("sensor_height", 1.8, "How far the ground lies below the sensor origin (m); ignored when "
              "estimate_ground is true.", float_range=(0.0, 9.5)),
    ParamSpec("estimate_ground", False, "Estimate the sensor height from each cloud's ground instead of "
              "sensor_height."),
    ParamSpec("frame_id", "", "Output frame_id; empty = copy the input cloud's frame_id."),
    ParamSpec("publish_markers", True, "Publish ~/markers (RViz boxes and labels)."),
    ParamSpec("diagnostics_period", 1.0, "Seconds between /diagnostics messages.", read_only=True,
              float_range=(0.1, 60.0)),
    ParamSpec("threads", DEFAULT_THREADS, "torch CPU threads per frame, set at start before torch starts its pools; "
              "0 = torch's default (one per core). 1 keeps latency bounded on a busy CPU (docs/performance.md).",
              read_only=True, int_range=(0, MAX_THREADS)),
    ParamSpec("bev_extent", None, "Detection grid [x_min, x_max, y_min, y_max] in metres (multiples of the model's "
              "coarsest cell, 3.2 m for lite); unset = the model's grid. Same weights (docs/rigs.md). Change rebuilds.",
              array_type="double"),
    ParamSpec("input_topics", None, "Several input topics whose clouds already share one frame (e.g. the driver "
              "applied its extrinsics): merged by stamp, detected once. Unset = input_topic.", read_only=True,
              array_type="string"),
    ParamSpec("rig", "", "Rig YAML (docs/rigs.md): one topic per sensor with its extrinsic; clouds moved into the "
              "rig's output_frame, merged by stamp, detected once; its bev_extent and sensor_height apply.",
              read_only=True),
    ParamSpec("odometry_topic", "", "nav_msgs/Odometry of the output (or cloud) frame: accumulated frames are "
              "motion-compensated and deskewed with it; empty = plain accumulation.", read_only=True),
    ParamSpec("accumulate_frames", 1, "Detect on the last N frames stacked (1 = each frame alone).",
              read_only=True, int_range=(1, MAX_FRAMES)),
    ParamSpec("accumulate_ms", 0.0, "Stack only frames within this many ms of the newest (0 = no time limit).",
              read_only=True, float_range=(0.0, MAX_WINDOW_MS)),
    ParamSpec("latency_window", 300, "Frames kept per stage for the latency mean/p50/p99 in the diagnostics.",
              read_only=True, int_range=(10, 100_000)),
)
PARAM_SPECS = {p.name: p for p in PARAMS}
DOUBLE_PARAMS = frozenset(p.name for p in PARAMS if isinstance(p.default, float))


def validate_params(values: dict[str, Any]) -> str | None:
    """Cross-field and choice checks the descriptors cannot express. Returns a reason or None."""
    for spec in PARAMS:
        v = values.get(spec.name)
        if spec.choices is not None and v not in spec.choices:
            return f"{spec.name} must be one of {list(spec.choices)}, got {v!r}"
        if spec.float_range is not None:
            lo, hi = spec.float_range
            if not isinstance(v, (int, float)) or isinstance(v, bool) or math.isnan(v) or not lo <= v <= hi:
                return f"{spec.name} must be a number in [{lo}, {hi}], got {v!r}"
        if spec.int_range is not None:
            lo, hi = spec.int_range
            if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
                return f"{spec.name} must be an integer in [{lo}, {hi}], got {v!r}"
    reason = _check_arrays(values)
    if reason:
        return reason
    for axis in "xyz":
        lo, hi = values[f"roi_{axis}_min"], values[f"roi_{axis}_max"]
        if lo >= hi:
            return (f"roi_{axis}_min ({lo}) must be smaller than roi_{axis}_max ({hi}); to move the range past "
                    "its other end, change both in one request (ros2 param load, set_parameters_atomically)")
    if not str(values["model"]).strip():
        return "model must name a model config"
    if values["input_type"] == "custom_msg" and custom_msg_class() is None:
        return "input_type custom_msg needs the livox_ros_driver2 or livox_interfaces interface package (not installed)"
    return None


def _check_arrays(values: dict[str, Any]) -> str | None:
    extent = values.get("bev_extent")
    if extent is not None:
        if len(extent) != 4 or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in extent):
            return f"bev_extent must be 4 numbers [x_min, x_max, y_min, y_max], got {list(extent)!r}"
        if not (extent[0] < extent[1] and extent[2] < extent[3]):
            return f"bev_extent needs x_min < x_max and y_min < y_max, got {list(extent)!r}"
    topics = values.get("input_topics")
    if topics is not None:
        if not topics or any(not str(t).startswith("/") for t in topics) or len(set(topics)) != len(topics):
            return f"input_topics must be distinct absolute topic names, got {list(topics)!r}"
        if values.get("rig"):
            return "give either rig (its sensors name their topics) or input_topics, not both"
    return None


def update_options(old: dict[str, Any], new: dict[str, Any], fixed: dict[str, Any] | None = None) -> dict[str, Any]:
    """Pipeline keyword arguments that differ between two parameter sets (for update()); ``fixed`` (a rig's
    options) overrides both."""
    a, b = {**pipeline_options(old), **(fixed or {})}, {**pipeline_options(new), **(fixed or {})}
    return {k: v for k, v in b.items() if a[k] != v}


def default_pipeline_factory(options: dict[str, Any]):
    from livox_infer.pipeline import DetectionPipeline

    return DetectionPipeline(**options)


def custom_msg_class():
    """rclpy class of the Livox CustomMsg (livox_ros_driver2, else livox_interfaces), or None when neither
    interface package is installed."""
    for module in ("livox_ros_driver2.msg", "livox_interfaces.msg"):
        try:
            return importlib.import_module(module).CustomMsg
        except (ImportError, AttributeError):
            continue
    return None


def custom_msg_cdr_to_cloud(raw: bytes):
    """Serialized CustomMsg → pointcloud.Cloud, parsed from the CDR bytes without per-point Python work."""
    from livox_infer.decode.custom_msg import custom_msg_to_cloud, decode_custom_msg_cdr

    return custom_msg_to_cloud(decode_custom_msg_cdr(raw))


@dataclass
class NodeStats:
    """Counters and latency windows shared by the callback, the worker and the diagnostics timer."""

    received: int = 0
    processed: int = 0
    dropped: int = 0  # overwritten by a newer cloud before the worker took it
    rejected: int = 0  # malformed / unsupported clouds (PointCloudError)
    empty: int = 0  # clouds with no points (published as empty detection arrays)
    failed: int = 0  # unexpected pipeline errors
    over_budget: int = 0  # clouds thinned to max_points (processed, but not all points used)
    skipped_no_subscribers: int = 0
    last_error: str = ""
    latency_ms: dict[str, collections.deque] = field(default_factory=dict)
    latency_window: int = 300
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add_latency(self, stage: str, ms: float) -> None:
        q = self.latency_ms.get(stage)
        if q is None:
            q = self.latency_ms[stage] = collections.deque(maxlen=self.latency_window)
        q.append(float(ms))

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            d = {k: getattr(self, k) for k in ("received", "processed", "dropped", "rejected", "empty", "failed",
                                               "over_budget", "skipped_no_subscribers", "last_error")}
            d["latency_ms"] = {k: list(v) for k, v in self.latency_ms.items()}
        return d


def _import_ros():
    """Import rclpy and the message packages, with one clear error when something is missing."""
    try:
        import rclpy  # noqa: F401
        from diagnostic_msgs.msg import DiagnosticArray  # noqa: F401
        from sensor_msgs.msg import PointCloud2  # noqa: F401
        from vision_msgs.msg import Detection3DArray  # noqa: F401
        from visualization_msgs.msg import MarkerArray  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            f"the detector node needs rclpy and the sensor_msgs, vision_msgs, visualization_msgs and "
            f"diagnostic_msgs interface packages ({exc}). Source a ROS 2 install or run scripts/setup.sh."
        ) from exc


_import_ros()

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus  # noqa: E402
from rcl_interfaces.msg import (  # noqa: E402
    FloatingPointRange,
    IntegerRange,
    ParameterDescriptor,
    SetParametersResult,
)
from rclpy.node import Node  # noqa: E402
from rclpy.qos import QoSProfile, qos_profile_sensor_data  # noqa: E402
from sensor_msgs.msg import PointCloud2  # noqa: E402
from vision_msgs.msg import Detection3DArray  # noqa: E402
from visualization_msgs.msg import MarkerArray  # noqa: E402

from livox_infer.ros import graph as node_graph, messages as ros_msgs, param_updates as ros_params, warmup as node_startup  # noqa: E402

_LEVEL = {"ok": DiagnosticStatus.OK, "warn": DiagnosticStatus.WARN, "error": DiagnosticStatus.ERROR}


class DetectorNode(Node):
    """Subscribes to a Livox cloud, publishes 3D detections, markers and diagnostics.

    ``pipeline_factory(options) -> pipeline`` builds the detector (tests inject a fake); the
    pipeline needs ``detect(msg_or_cloud)`` returning an object with ``boxes``, ``labels``,
    ``scores`` and ``timings_ms``, and ``update(**options)`` for in-place parameter changes.
    """

    def __init__(self, *, pipeline_factory: Callable[[dict], Any] | None = None, node_name: str = NODE_NAME,
                 **node_kwargs: Any) -> None:
        super().__init__(node_name, **node_kwargs)
        self._factory = pipeline_factory or default_pipeline_factory
        self._declare_parameters()
        self._values = {p.name: self._param_value(p) for p in PARAMS}
        reason = validate_params(self._values)
        if reason:
            raise ConfigError(f"invalid parameters: {reason}")
        self._rig_options: dict[str, Any] = {}  # pipeline options a rig file fixes
        self._assembler = self._make_assembler()  # None: one topic, one frame at a time (the plain path)

        self.stats = NodeStats(latency_window=int(self._values["latency_window"]))
        self._pipeline_lock = threading.Lock()  # held while the pipeline runs or is changed
        self.threads = apply_threads(int(self._values["threads"]))  # before the pipeline's first torch work

        # Outputs first: the topics exist, and /diagnostics says "warming up", while the pipeline builds.
        self._det_pub = self.create_publisher(Detection3DArray, "~/detections", QoSProfile(depth=5))
        self._marker_pub = self.create_publisher(MarkerArray, "~/markers", QoSProfile(depth=5))
        self._diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", QoSProfile(depth=10))
        self._pipeline = None
        self.get_logger().info(node_startup.describe_start(self._values))
        with node_startup.warming_up(self.get_logger(), self._publish_warming_up,
                                     float(self._values["diagnostics_period"])):
            # Raises (WeightsError, ConfigError, BackendError, ...) so a bad start-up stops the node.
            self._pipeline = self._factory({**pipeline_options(self._values), **self._rig_options})

        # Newest-frame slot: the callback overwrites, the worker takes.
        self._cond = threading.Condition()
        self._pending: tuple[Any, float] | None = None
        self._stopping = False
        self._worker = threading.Thread(target=self._worker_loop, name="livox_detector_worker", daemon=True)

        qos = QoSProfile(depth=1, reliability=qos_profile_sensor_data.reliability,
                         durability=qos_profile_sensor_data.durability, history=qos_profile_sensor_data.history)
        if self._assembler is not None:
            self._subscribe_assembled(qos)
        elif self._values["input_type"] == "custom_msg":
            # raw=True: the CDR bytes are parsed in bulk (bag.decode_custom_msg_cdr) instead of
            # building one Python object per point.
            self._input_class = custom_msg_class()
            self._sub = self.create_subscription(self._input_class, self._values["input_topic"],
                                                 self._on_custom_msg, qos, raw=True)
        else:
            self._input_class = PointCloud2
            # raw=True: the CDR is deserialized here (rosbags, numpy view of the data), so an undecodable message
            # is counted and warned about (throttled) instead of one unthrottled middleware line per message
            self._sub = self.create_subscription(PointCloud2, self._values["input_topic"], self._on_cloud_cdr, qos,
                                                 raw=True)
        self._graph_problem: str | None = None  # see _check_graph
        self._skipped_noted = 0
        self.add_on_set_parameters_callback(self._on_set_parameters)
        # integers for doubles (max_range 80) and one all-or-nothing change per set_parameters request
        self.add_pre_set_parameters_callback(ros_params.integers_as_doubles(DOUBLE_PARAMS))
        ros_params.serve_set_parameters_as_one_change(self)
        self._diag_last = (time.monotonic(), 0, 0)
        self._diag_timer = self.create_timer(float(self._values["diagnostics_period"]), self.publish_diagnostics)
        self._worker.start()
        topics = [x.topic for x in self._assembler.rig.sensors] if self._assembler else [self._values["input_topic"]]
        self.get_logger().info(
            f"detecting on {', '.join(topics)} ({self._values['sensor']}, model "
            f"{self._values['model']}, device {self._describe_backend()}, threads {self.threads.describe()})"
        )
        self.get_logger().info(f"start-up: {self._describe_startup()}")

    # ------------------------------------------------------------------ parameters
    def _declare_parameters(self) -> None:
        from rclpy.parameter import Parameter

        overrides = getattr(self, "_parameter_overrides", {})
        for spec in PARAMS:
            # "-p max_range:=100" or "max_range: 100" in a YAML arrive as INTEGER; ROS would refuse
            # them for a double parameter, so take the number as the double it obviously means.
            given = overrides.get(spec.name)
            if isinstance(spec.default, float) and given is not None and given.type_ == Parameter.Type.INTEGER:
                overrides[spec.name] = Parameter(spec.name, value=float(given.value))
            desc = ParameterDescriptor(description=spec.description, read_only=spec.read_only)
            if spec.float_range is not None:
                desc.floating_point_range = [FloatingPointRange(from_value=float(spec.float_range[0]),
                                                                to_value=float(spec.float_range[1]), step=0.0)]
            if spec.int_range is not None:
                desc.integer_range = [IntegerRange(from_value=spec.int_range[0], to_value=spec.int_range[1], step=1)]
            if spec.choices is not None:
                desc.additional_constraints = "one of: " + ", ".join(spec.choices)
            if spec.array_type is not None:  # may stay unset: declared by type (ROS cannot infer it from [])
                kind = Parameter.Type.DOUBLE_ARRAY if spec.array_type == "double" else Parameter.Type.STRING_ARRAY
                ints = given is not None and given.type_ == Parameter.Type.INTEGER_ARRAY
                if kind == Parameter.Type.DOUBLE_ARRAY and ints:  # [0, 80, -40, 40] means doubles
                    overrides[spec.name] = Parameter(spec.name, value=[float(v) for v in given.value])
                self.declare_parameter(spec.name, kind, desc)
                continue
            self.declare_parameter(spec.name, spec.default, desc)

    def _param_value(self, spec: ParamSpec) -> Any:
        if spec.array_type is None:
            return self.get_parameter(spec.name).value
        from rclpy.exceptions import ParameterUninitializedException

        try:
            return list(self.get_parameter(spec.name).value)
        except ParameterUninitializedException:  # an array parameter left unset
            return None

    def _on_set_parameters(self, params) -> SetParametersResult:
        candidate = dict(self._values)
        for p in params:
            if p.name in PARAM_SPECS:  # others (use_sim_time, ...) belong to rclpy itself
                candidate[p.name] = p.value
        reason = validate_params(candidate)
        if reason:
            self.get_logger().warning(f"rejected parameter change: {reason}")
            return SetParametersResult(successful=False, reason=reason)
        changed = {k for k in candidate if candidate[k] != self._values[k]}
        try:
            if changed & REBUILD_PARAMS:
                # Build the replacement first (slow: loads weights); the worker keeps using the old one.
                new_pipeline = self._factory({**pipeline_options(candidate), **self._rig_options})
                with self._pipeline_lock:
                    old, self._pipeline = self._pipeline, new_pipeline
                del old
                self.get_logger().info(f"pipeline rebuilt for {sorted(changed & REBUILD_PARAMS)}")
            else:
                opts = update_options(self._values, candidate, self._rig_options)
                if opts:
                    with self._pipeline_lock:
                        self._pipeline.update(**opts)
        except (LivoxInferError, FileNotFoundError, ValueError, RuntimeError) as exc:
            if changed & REBUILD_PARAMS:
                # the caller of the parameter service (and /rosout) learns no more than this: why a file did not
                # load would tell whether it exists or what a readable one holds; the details go to stderr only
                _console.warning("cannot load %s: %s: %s", sorted(changed & REBUILD_PARAMS), type(exc).__name__, exc)
                reason = f"cannot load {sorted(changed & REBUILD_PARAMS)} (details on the node's console)"
            else:
                reason = f"cannot apply {sorted(changed)}: {exc}"
            self.get_logger().warning(f"rejected parameter change: {reason}")
            return SetParametersResult(successful=False, reason=reason)
        self._values = candidate
        return SetParametersResult(successful=True)

    @property
    def pipeline(self):
        return self._pipeline

    # ------------------------------------------------------------------ input
    def _on_cloud(self, msg) -> None:
        # validate the layout before the message may take the one queue slot: junk must never displace a
        # valid cloud that waits for the worker (it is rejected here, counted and warned about, throttled)
        try:
            check_pointcloud2(msg)
        except PointCloudError as exc:
            with self.stats.lock:
                self.stats.received += 1
            self._reject(str(exc))
            return
        self._offer(msg)

    def _on_cloud_cdr(self, raw: bytes) -> None:
        try:
            msg = pointcloud2_from_cdr(raw)
        except PointCloudError as exc:
            with self.stats.lock:
                self.stats.received += 1
            self._reject(f"undecodable PointCloud2: {exc}")
            return
        self._on_cloud(msg)

    def _on_custom_msg(self, raw: bytes) -> None:
        try:
            cloud = custom_msg_cdr_to_cloud(raw)
        except Exception as exc:  # noqa: BLE001 - malformed input must never kill the node
            with self.stats.lock:
                self.stats.received += 1
            self._reject(f"malformed CustomMsg: {exc}")
            return
        self._offer(cloud)

    def _offer(self, msg) -> None:
        with self._cond:
            with self.stats.lock:
                self.stats.received += 1
                if self._pending is not None:
                    self.stats.dropped += 1
            self._pending = (msg, time.monotonic())
            self._cond.notify()

    # ------------------------------------------------------------------ worker
    def _worker_loop(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                msg, received_at = self._pending
                self._pending = None
            try:
                self._process(msg, received_at)
            except Exception as exc:  # noqa: BLE001 - last line of defence: keep the worker alive
                with self.stats.lock:
                    self.stats.failed += 1
                    self.stats.last_error = f"{type(exc).__name__}: {exc}"
                self.get_logger().error(f"frame failed: {type(exc).__name__}: {exc}",
                                        throttle_duration_sec=WARN_THROTTLE_S)

    def _has_output_subscribers(self) -> bool:
        return self._det_pub.get_subscription_count() + self._marker_pub.get_subscription_count() > 0

    def _reject(self, reason: str) -> None:
        with self.stats.lock:
            self.stats.rejected += 1
            self.stats.last_error = reason
        self.get_logger().warning(f"rejected cloud: {reason}", throttle_duration_sec=WARN_THROTTLE_S)

    def _process(self, msg, received_at: float) -> None:
        if not self._has_output_subscribers():
            with self.stats.lock:
                self.stats.skipped_no_subscribers += 1
            return
        header = getattr(msg, "header", None)
        frame_override = self._values["frame_id"] or None
        started = time.monotonic()
        n_points = _point_count(msg)
        if n_points == 0:
            with self.stats.lock:
                self.stats.empty += 1
            self.get_logger().warning("empty cloud (no points); publishing no detections",
                                      throttle_duration_sec=WARN_THROTTLE_S)
            dets = _EmptyDetections()
        else:
            dets = self._detect(msg)
        succeeded = dets is not None
        if not succeeded:  # rejected or failed (counted): every cloud the worker takes still gets an (empty) answer
            dets = _EmptyDetections()
        detect_ms = (time.monotonic() - started) * 1e3
        self._count_over_budget(dets)

        if header is None:  # a Cloud from a CustomMsg
            out = ros_msgs.detections_to_msg(dets, stamp_ns=msg.stamp_ns, frame_id=frame_override or msg.frame_id)
        else:
            out = ros_msgs.detections_to_msg(dets, header, frame_id=frame_override)
        self._det_pub.publish(out)
        if self._values["publish_markers"] and self._marker_pub.get_subscription_count() > 0:
            self._marker_pub.publish(ros_msgs.detections_to_markers(dets, out.header))
        done = time.monotonic()
        if not succeeded:
            return
        with self.stats.lock:
            self.stats.processed += 1
            for stage, ms in (getattr(dets, "timings_ms", None) or {}).items():
                self.stats.add_latency(str(stage), float(ms))
            self.stats.add_latency("node_detect", detect_ms)
            self.stats.add_latency("queue_wait", (started - received_at) * 1e3)
            self.stats.add_latency("end_to_end", (done - received_at) * 1e3)

    def _detect(self, msg):
        """The pipeline's detections, or None after counting and warning about a rejected / failed cloud."""
        try:
            with self._pipeline_lock:
                return self._pipeline.detect(msg)
        except PointCloudError as exc:
            self._reject(str(exc))
        except Exception as exc:  # noqa: BLE001 - typed (LivoxInferError) or a bug: the frame fails, the node goes on
            with self.stats.lock:
                self.stats.failed += 1
                self.stats.last_error = f"{type(exc).__name__}: {exc}"
            self.get_logger().error(f"detection failed: {type(exc).__name__}: {exc}",
                                    throttle_duration_sec=WARN_THROTTLE_S)
        return None

    def _count_over_budget(self, dets) -> None:
        thinned = int(getattr(dets, "points_over_budget", 0) or 0)
        if thinned:
            with self.stats.lock:
                self.stats.over_budget += 1
            self.get_logger().warning(
                f"cloud over the point budget: {thinned} points dropped to keep max_points="
                f"{self._values['max_points']}", throttle_duration_sec=WARN_THROTTLE_S)

    # ------------------------------------------------------------------ diagnostics
    def _describe_backend(self) -> str:
        p = self._pipeline
        if getattr(p, "network_backend", None):  # DetectionPipeline: eager | compiled | aoti
            return f"{p.device} ({p.network_backend})"
        backend = getattr(p, "backend", None) or getattr(p, "device", None) or self._values["device"]
        compiled = getattr(p, "compiled", None)
        return str(backend) if compiled is None else f"{backend} ({'compiled' if compiled else 'eager'})"

    def _describe_startup(self) -> str:
        startup = getattr(self._pipeline, "startup", None)  # DetectionPipeline.startup: phases, inductor cache
        return startup.summary() if startup is not None else "not timed"

    def _describe_model(self) -> str:
        cfg = getattr(self._pipeline, "cfg", None)
        return str(getattr(cfg, "name", None) or self._values["model"])

    def _publish_warming_up(self, elapsed_s: float) -> None:
        arr = DiagnosticArray()
        arr.header.stamp = self.get_clock().now().to_msg()
        arr.status = [ros_msgs.diagnostic_status(
            f"{self.get_name()}: livox_infer detector", self._values["sensor"], _LEVEL["warn"][0],
            f"warming up: building the pipeline ({elapsed_s:.0f} s)",
            {"sensor": self._values["sensor"], "input_topic": self._values["input_topic"],
             "model": self._values["model"], "use_compile": self._values["use_compile"]})]
        self._diag_pub.publish(arr)

    def diagnostics_status(self):
        snap = self.stats.snapshot()
        now = time.monotonic()
        t0, received0, processed0 = self._diag_last
        dt = max(now - t0, 1e-6)
        self._diag_last = (now, snap["received"], snap["processed"])
        values: dict[str, Any] = {
            "sensor": self._values["sensor"],
            "input_topic": self._values["input_topic"],
            "backend": self._describe_backend(),
            "model": self._describe_model(),
            "weights": str(getattr(self._pipeline, "weights_file", None) or self._values["weights"] or "default"),
            "threads": self.threads.describe(),
            "startup": self._describe_startup(),
            "input_rate_hz": (snap["received"] - received0) / dt,
            "processed_rate_hz": (snap["processed"] - processed0) / dt,
        }
        for k in ("received", "processed", "dropped", "rejected", "empty", "failed", "over_budget",
                  "skipped_no_subscribers"):
            values[f"frames_{k}"] = snap[k]
        for stage, samples in sorted(snap["latency_ms"].items()):
            mean, p50, p99 = ros_msgs.percentile_summary(samples)
            values[f"latency_{stage}_mean_ms"] = mean
            values[f"latency_{stage}_p50_ms"] = p50
            values[f"latency_{stage}_p99_ms"] = p99
        values["last_error"] = snap["last_error"]
        if self._assembler is not None:
            values.update(self._assembler_diagnostics())
        compile_error = getattr(self._pipeline, "compile_error", None)
        if compile_error:
            values["compile_error"] = compile_error
        if snap["failed"]:
            level, message = "error", f"pipeline errors: {snap['failed']} (last: {snap['last_error']})"
        elif snap["rejected"]:
            level, message = "warn", f"{snap['rejected']} malformed clouds rejected (last: {snap['last_error']})"
        elif compile_error:
            level, message = "warn", f"torch.compile failed, running eagerly: {compile_error}"
        elif snap["received"] == 0 and getattr(self, "_graph_problem", None):
            level, message = "warn", self._graph_problem
        elif snap["received"] == 0:
            level, message = "warn", f"no clouds received on {self._values['input_topic']}"
        else:
            level, message = "ok", "detecting"
        return ros_msgs.diagnostic_status(f"{self.get_name()}: livox_infer detector", self._values["sensor"],
                                          _LEVEL[level][0], message, values)

    def _check_graph(self) -> None:
        """Say why a running node may look dead: input published with another type, or no output subscriber."""
        self._graph_problem = node_graph.input_type_mismatch(self, self._values["input_topic"], self._input_class)
        if self._graph_problem:
            self.get_logger().warning(self._graph_problem, throttle_duration_sec=6 * WARN_THROTTLE_S)
        skipped = self.stats.skipped_no_subscribers
        if skipped > self._skipped_noted:
            self._skipped_noted = skipped
            self.get_logger().info(node_graph.no_subscribers_note(skipped), throttle_duration_sec=6 * WARN_THROTTLE_S)

    def publish_diagnostics(self) -> None:
        self._check_graph()
        arr = DiagnosticArray()
        arr.header.stamp = self.get_clock().now().to_msg()
        arr.status = [self.diagnostics_status()]
        self._diag_pub.publish(arr)

    # ------------------------------------------------------------------ several topics, rig, accumulation
    def _make_assembler(self):
        """A FrameAssembler when clouds are merged (rig / input_topics) or accumulated; None otherwise."""
        from livox_infer.accumulate import PoseBuffer
        from livox_infer.rig import FrameAssembler, Rig, rig_pipeline_options, same_frame_rig

        v = self._values
        if v["rig"]:
            from livox_infer.resources import find

            try:
                path = find("config", v["rig"])  # a path, or a name under config/ (rigs/livox_dataset_v1.yaml)
            except FileNotFoundError as exc:
                raise ConfigError(f"rig: {exc}") from None
            rig = Rig.load(path)
            self._rig_options = rig_pipeline_options(rig)
        elif v["input_topics"]:
            rig = same_frame_rig(v["input_topics"], v["sensor"])
        elif v["accumulate_frames"] > 1 or v["odometry_topic"]:
            rig = same_frame_rig([v["input_topic"]], v["sensor"])
        else:
            return None
        self._poses = PoseBuffer() if v["odometry_topic"] else None
        return FrameAssembler(rig, int(v["accumulate_frames"]), float(v["accumulate_ms"]), self._poses)

    def _subscribe_assembled(self, qos) -> None:
        custom = self._values["input_type"] == "custom_msg"
        self._subs = []
        for sensor in self._assembler.rig.sensors:
            cb = (lambda raw, n=sensor.name: self._on_sensor_cloud(n, raw, True)) if custom else \
                (lambda msg, n=sensor.name: self._on_sensor_cloud(n, msg, False))
            self._subs.append(self.create_subscription(custom_msg_class() if custom else PointCloud2, sensor.topic,
                                                       cb, qos, raw=custom))
        if self._values["odometry_topic"]:
            try:
                from nav_msgs.msg import Odometry
            except ImportError as exc:
                raise ConfigError(f"odometry_topic needs the nav_msgs interface package ({exc})") from None
            self._subs.append(self.create_subscription(Odometry, self._values["odometry_topic"], self._on_odometry,
                                                       QoSProfile(depth=50)))

    def _on_sensor_cloud(self, sensor: str, msg, custom: bool) -> None:
        from livox_infer.decode.pointcloud import decode_pointcloud2

        try:  # decoded here (not in the worker): every frame must reach the merger and the accumulator
            cloud = custom_msg_cdr_to_cloud(msg) if custom else decode_pointcloud2(msg)
            clouds = self._assembler.add(sensor, cloud)
        except Exception as exc:  # noqa: BLE001 - malformed input must never kill the node
            with self.stats.lock:
                self.stats.received += 1
            self._reject(f"{sensor}: {exc}")
            return
        for merged in clouds:
            self._offer(merged)

    def _on_odometry(self, msg) -> None:
        from livox_infer.accumulate import pose_matrix

        p, q = msg.pose.pose.position, msg.pose.pose.orientation
        try:
            self._poses.add(msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec,
                            pose_matrix((p.x, p.y, p.z), (q.x, q.y, q.z, q.w)))
        except LivoxInferError as exc:
            self._reject(f"odometry: {exc}")

    def _assembler_diagnostics(self) -> dict[str, Any]:
        m = self._assembler.merger.stats
        out: dict[str, Any] = {"merged_frames": m.frames, "merged_partial": m.partial, "merge_late": m.late,
                               "merge_restarts": m.restarts,
                               "accumulated_compensated": self._assembler.accumulator.compensated,
                               "accumulated_plain": self._assembler.accumulator.plain}
        out.update({f"missing_{name}": n for name, n in m.missing.items()})
        return out

    # ------------------------------------------------------------------ shutdown
    def destroy_node(self) -> None:
        cond, worker = getattr(self, "_cond", None), getattr(self, "_worker", None)  # absent if __init__ failed
        if cond is not None:
            with cond:
                self._stopping = True
                cond.notify_all()
        if worker is not None and worker.is_alive() and threading.current_thread() is not worker:
            worker.join(timeout=30.0)
        super().destroy_node()


class _EmptyDetections:
    """What an empty cloud yields: no boxes (published so consumers see that nothing is there)."""

    def __init__(self) -> None:
        import numpy as np

        self.boxes = np.zeros((0, 7), dtype=np.float32)
        self.labels = np.zeros(0, dtype=np.int64)
        self.scores = np.zeros(0, dtype=np.float32)
        self.label_names: list[str] = []
        self.timings_ms: dict[str, float] = {}


def _point_count(msg) -> int | None:
    if hasattr(msg, "width") and hasattr(msg, "height"):
        try:
            return int(msg.width) * int(msg.height)
        except (TypeError, ValueError):
            return None
    points = getattr(msg, "points", None)
    return None if points is None else len(points)


# ---------------------------------------------------------------------- entry points
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sensor", default="avia", choices=SENSOR_PRESETS,
                        help="sensor preset: loads config/<sensor>.yaml (default avia)")
    parser.add_argument("--params-file", default=None,
                        help="ROS 2 parameter YAML instead of the preset (its own 'sensor' applies)")
    parser.add_argument("--input-topic", default=None, help="override input_topic")
    parser.add_argument("--rig", default=None, help="rig YAML: several LiDARs merged into its output frame "
                        "(a path or a name under config/, e.g. rigs/livox_dataset_v1.yaml; docs/rigs.md)")
    parser.add_argument("--device", default=None, choices=DEVICES, help="override device")
    parser.add_argument("--use-compile", default=None, type=_parse_bool, metavar="{true,false}",
                        help="override use_compile")
    add_threads_argument(parser, default=None)
    parser.add_argument("--node-name", default=NODE_NAME, help=f"node name (default {NODE_NAME})")
    parser.add_argument("--ros-args", dest="ros_args", nargs=argparse.REMAINDER, default=[],
                        help="everything after this goes to ROS (e.g. --ros-args -p score_threshold_car:=0.5)")


def _parse_bool(text: str) -> bool:
    t = str(text).strip().lower()
    if t in ("1", "true", "yes", "on"):
        return True
    if t in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def params_file_for(sensor: str) -> str:
    from livox_infer.resources import find

    return str(find("config", f"{sensor}.yaml"))


def ros_arguments(args: argparse.Namespace) -> list[str]:
    """``livox-infer run`` options → the ROS argument list the node is initialised with."""
    # --sensor picks the preset YAML; an explicit --params-file names its own sensor.
    params_file = args.params_file or params_file_for(args.sensor)
    out = ["livox-infer-run", "--ros-args", "--params-file", params_file]
    if args.input_topic:
        out += ["-p", f"input_topic:={args.input_topic}"]
    if getattr(args, "rig", None):
        out += ["-p", f"rig:={args.rig}"]
    if args.device:
        out += ["-p", f"device:={args.device}"]
    if args.use_compile is not None:
        out += ["-p", f"use_compile:={'true' if args.use_compile else 'false'}"]
    if getattr(args, "threads", None) is not None:
        out += ["-p", f"threads:={args.threads}"]
    if getattr(args, "node_name", NODE_NAME) != NODE_NAME:
        out += ["-r", f"__node:={args.node_name}"]
    extra = list(args.ros_args or [])
    if extra and extra[0] == "--ros-args":
        extra = extra[1:]
    return out + extra


def create_executor(context=None):
    """The executor the node spins in: single-threaded on purpose.

    Every callback here is short (a cloud is handed to the worker thread, which runs the pipeline), so one
    thread is enough. rclpy's MultiThreadedExecutor re-yields a ready callback until a pool thread has
    started it; while the worker holds the GIL for the network, that spin thread loops hundreds to
    thousands of times per frame (measured: 200-4300 dispatches for 20 clouds), starving the worker and
    the subscription: frames then stall for up to 2 s and are lost before the node sees them.
    """
    from rclpy.executors import SingleThreadedExecutor

    return SingleThreadedExecutor(context=context)


def spin_node(ros_argv: list[str], node_factory: Callable[[], Node] | None = None) -> int:
    """Initialise rclpy with ``ros_argv``, run the node until shutdown; exit status 1 on start-up failure."""
    import rclpy
    from rclpy.exceptions import ParameterException
    from rclpy.executors import ExternalShutdownException

    rclpy.init(args=ros_argv)
    node = None
    try:
        try:
            node = (node_factory or DetectorNode)()
        except (KeyboardInterrupt, ExternalShutdownException):  # Ctrl-C while loading / compiling
            print("[livox_detector] interrupted during start-up", file=sys.stderr, flush=True)
            return 130
        except (LivoxInferError, ParameterException, ImportError, OSError, ValueError, RuntimeError) as exc:
            kind = "weights" if isinstance(exc, WeightsError) else type(exc).__name__
            print(f"[livox_detector] FATAL: cannot start ({kind}): {exc}", file=sys.stderr, flush=True)
            return 1
        executor = create_executor()
        try:
            executor.add_node(node)
            executor.spin()
        except (KeyboardInterrupt, ExternalShutdownException):
            pass
        return 0
    finally:
        if node is not None:
            node.destroy_node()
        if rclpy.ok():
            rclpy.try_shutdown()


def main(args: argparse.Namespace | list[str] | None = None) -> int:
    """``ros2 run livox_infer detector_node [--ros-args ...]`` (args None: sys.argv) or ``livox-infer run``."""
    if isinstance(args, argparse.Namespace):
        try:
            ros_argv = ros_arguments(args)
        except FileNotFoundError as exc:
            print(f"livox-infer run: {exc}", file=sys.stderr)
            return 2
    else:
        ros_argv = list(sys.argv if args is None else args)
        # -h/--help before any --ros-args: print the node's contract instead of starting it
        user = ros_argv[1:ros_argv.index("--ros-args")] if "--ros-args" in ros_argv else ros_argv[1:]
        if "-h" in user or "--help" in user:
            print(node_help())
            return 0
    return spin_node(ros_argv)


def node_help() -> str:
    """`detector_node --help`: usage and every parameter with its default and meaning."""
    lines = ["usage: ros2 run livox_infer detector_node [--ros-args -p NAME:=VALUE ... | --params-file FILE]",
             "       ros2 launch livox_infer detect.launch.py sensor:=avia", "", "parameters:"]
    for p in PARAMS:
        lines.append(f"  {p.name} (default {p.default!r})")
        lines.append(f"      {p.description}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
