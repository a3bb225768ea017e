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
import array
import collections
import importlib
import logging
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from livox_infer.errors import ConfigError, LivoxInferError, PointCloudError, WeightsError
from livox_infer.decode.pointcloud import Cloud, check_pointcloud2
from livox_infer.ground import mount_message, mount_mismatch
from livox_infer.bags import pointcloud2_from_cdr
from livox_infer.threads import apply_threads
from livox_infer import params as param_model
from livox_infer.params import PARAMS, REBUILD, Param, pipeline_options

NODE_NAME = "livox_detector"

# Parameters whose change needs a new pipeline (new network / device / weights); the rest are applied in place
# with DetectionPipeline.update() or by the node alone (livox_infer/params.py says which).
REBUILD_PARAMS = frozenset(p.name for p in PARAMS if p.applies == REBUILD)

WARN_THROTTLE_S = 5.0
_console = logging.getLogger("livox_infer.ros.node")  # stderr only (Python logging), never /rosout


def _close(pipeline) -> None:
    """Stop what a pipeline that is being dropped still runs (its background package build)."""
    close = getattr(pipeline, "close", None)
    if close is not None:
        close()


def validate_params(values: dict[str, Any], params: tuple[Param, ...] | None = None) -> str | None:
    """livox_infer.params.validate, plus what only the node can check (an installed interface package)."""
    reason = param_model.validate(values, params)
    if reason:
        return reason
    if values["input_type"] == "custom_msg" and custom_msg_class() is None:
        return "input_type custom_msg needs the livox_ros_driver2 or livox_interfaces interface package (not installed)"
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
    ground_mismatch: int = 0  # frames levelled with a sensor_height far from the ground their cloud shows
    # (sensor_height used, ground height seen) of the last processed frame when they disagree (ground.mount_mismatch),
    # None when they agree or nothing was seen
    mount_mismatch: tuple[float, float] | None = None
    skipped_no_subscribers: int = 0
    odometry_rejected: int = 0  # nav_msgs/Odometry with a non-finite position or no quaternion (not used)
    tf_failed: int = 0  # TF lookups that failed (output_frame, TF extrinsics, TF poses): the frame went out empty
    skipped_inactive: int = 0  # clouds that arrived while a lifecycle node was configured but not active
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
                                               "over_budget", "skipped_no_subscribers", "odometry_rejected",
                                               "tf_failed", "skipped_inactive", "last_error", "ground_mismatch",
                                               "mount_mismatch")}
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


def _descriptor(spec: Param) -> ParameterDescriptor:
    """The ROS descriptor of a parameter: its doc, read-only flag, range and choices (livox_infer.params)."""
    rebuilds = spec.applies == REBUILD and not spec.read_only
    desc = ParameterDescriptor(description=spec.doc + (" Change rebuilds the pipeline." if rebuilds else ""),
                               read_only=spec.read_only)
    if spec.range is not None and spec.type == "double":
        desc.floating_point_range = [FloatingPointRange(from_value=float(spec.range[0]),
                                                        to_value=float(spec.range[1]), step=0.0)]
    if spec.range is not None and spec.type == "int":
        desc.integer_range = [IntegerRange(from_value=int(spec.range[0]), to_value=int(spec.range[1]), step=1)]
    if spec.choices is not None:
        desc.additional_constraints = "one of: " + ", ".join(spec.choices)
    return desc


class DetectorNode(Node):
    """Subscribes to a Livox cloud, publishes 3D detections, markers and diagnostics.

    ``pipeline_factory(options) -> pipeline`` builds the detector (tests inject a fake); the
    pipeline needs ``detect(msg_or_cloud)`` returning an object with ``boxes``, ``labels``,
    ``scores`` and ``timings_ms``, and ``update(**options)`` for in-place parameter changes.
    """

    def __init__(self, *, pipeline_factory: Callable[[dict], Any] | None = None, node_name: str = NODE_NAME,
                 managed: bool = False, **node_kwargs: Any) -> None:
        super().__init__(node_name, **node_kwargs)
        self._factory = pipeline_factory or default_pipeline_factory
        self._params = self._declare_parameters()
        self._refuse_undeclared_overrides()
        self._values = {p.name: self._param_value(p) for p in self._params}
        reason = validate_params(self._values, self._params)
        if reason:
            raise ConfigError(f"invalid parameters: {reason}")
        # a managed (lifecycle) node configures on the configure transition and publishes only while active
        self._configured = False
        self._managed = managed
        self._active = not managed
        self._param_callbacks = False
        if not managed:
            self._configure()

    def _configure(self) -> None:
        """Everything the node needs to run: pipeline (weights loaded and checked), publishers, subscriptions,
        diagnostics timer, worker. At construction, or on a lifecycle node's configure transition."""
        self._values = {p.name: self._param_value(p) for p in self._params}  # as set while unconfigured
        reason = validate_params(self._values, self._params)
        if reason:
            raise ConfigError(f"invalid parameters: {reason}")
        self._rig_options: dict[str, Any] = {}  # pipeline options a rig file fixes
        self._last_detect_stamp: int | None = None  # a later, older stamp restarts the scene
        self._tf = self._make_tf()  # None: no TF needed (output_frame, odometry_frame unset)
        self._assembler = self._make_assembler()  # None: one topic, one frame at a time (the plain path)

        self.stats = NodeStats(latency_window=int(self._values["latency_window"]))
        self._pipeline_lock = threading.Lock()  # held while the pipeline runs or is changed
        self.threads = apply_threads(int(self._values["threads"]))  # before the pipeline's first torch work

        # Outputs first: the topics exist, and /diagnostics says "warming up", while the pipeline builds.
        if not hasattr(self, "_det_pub"):  # kept over a lifecycle cleanup / configure
            self._det_pub = self.create_publisher(Detection3DArray, "~/detections", QoSProfile(depth=5))
            self._marker_pub = self.create_publisher(MarkerArray, "~/markers", QoSProfile(depth=5))
            self._diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", QoSProfile(depth=10))
            from livox_infer.ros.tracks import NodeTracking  # ~/tracked_objects, Detection3D.id (docs/tracking.md)

            self._tracking = NodeTracking(self, lambda: self._values, lambda: getattr(self, "_poses", None),
                                          QoSProfile(depth=5))
        self._pipeline = None
        self.get_logger().info(node_startup.describe_start(self._values))
        with node_startup.warming_up(self.get_logger(), self._publish_warming_up,
                                     float(self._values["diagnostics_period"]), self._describe_startup):
            # Raises (WeightsError, ConfigError, BackendError, ...) so a bad start-up stops the node.
            self._pipeline = self._factory({**pipeline_options(self._values), **self._rig_options})

        # Newest-frame slot: the callback overwrites, the worker takes.
        self._cond = threading.Condition()
        self._pending: tuple[Any, float] | None = None
        self._stopping = False
        self._worker = threading.Thread(target=self._worker_loop, name="livox_detector_worker", daemon=True)

        qos = QoSProfile(depth=1, reliability=qos_profile_sensor_data.reliability,
                         durability=qos_profile_sensor_data.durability, history=qos_profile_sensor_data.history)
        # the message class every input topic is subscribed with (the diagnostics timer checks the graph with it)
        self._input_class = custom_msg_class() if self._values["input_type"] == "custom_msg" else PointCloud2
        if self._assembler is not None:
            self._subscribe_assembled(qos)
        elif self._values["input_type"] == "custom_msg":
            # raw=True: the CDR bytes are parsed in bulk (bag.decode_custom_msg_cdr) instead of
            # building one Python object per point.
            self._sub = self.create_subscription(self._input_class, self._values["input_topic"],
                                                 self._on_custom_msg, qos, raw=True)
        else:
            # raw=True: the CDR is deserialized here (rosbags, numpy view of the data), so an undecodable message
            # is counted and warned about (throttled) instead of one unthrottled middleware line per message
            self._sub = self.create_subscription(PointCloud2, self._values["input_topic"], self._on_cloud_cdr, qos,
                                                 raw=True)
        self._graph_problem: str | None = None  # see _check_graph
        self._skipped_noted = 0
        if not self._param_callbacks:  # once per node, also over lifecycle cleanup / configure
            self._param_callbacks = True
            self.add_on_set_parameters_callback(self._on_set_parameters)
            # integers for doubles (max_range 80) and one all-or-nothing change per set_parameters request
            self.add_pre_set_parameters_callback(ros_params.integers_as_doubles(
                frozenset(p.name for p in self._params if p.type == "double")))
            ros_params.serve_set_parameters_as_one_change(self)
        self._diag_last = (time.monotonic(), 0, 0)
        self._diag_timer = self.create_timer(float(self._values["diagnostics_period"]), self.publish_diagnostics)
        self._worker.start()
        self._configured = True
        topics = self._input_topics()
        self.get_logger().info(
            f"{'detecting' if self._active else 'configured (inactive until activated)'} on {', '.join(topics)} "
            f"({self._values['sensor']}, model {self._values['model']}, device {self._describe_backend()}, "
            f"threads {self.threads.describe()})"
        )

    def _unconfigure(self) -> None:
        """Back to unconfigured (lifecycle cleanup / shutdown): worker stopped, subscriptions, timer and TF
        listener gone, pipeline dropped; the publishers stay."""
        self._active = False
        self._stop_worker()
        for sub in [getattr(self, "_sub", None), *getattr(self, "_subs", [])]:
            if sub is not None:
                self.destroy_subscription(sub)
        self._sub, self._subs = None, []
        if getattr(self, "_diag_timer", None) is not None:
            self.destroy_timer(self._diag_timer)
            self._diag_timer = None
        if getattr(self, "_tf", None) is not None:
            self._tf.close()
            self._tf = None
        with getattr(self, "_pipeline_lock", threading.Lock()):
            _close(self._pipeline)
            self._pipeline = None
            self._backend_said = None
        self._configured = False

    def _input_topics(self) -> list[str]:
        """Every topic the node takes clouds from: a rig's or input_topics' sensors, else input_topic."""
        if getattr(self, "_assembler", None) is not None:
            return [s.topic for s in self._assembler.rig.sensors]
        return [self._values["input_topic"]]

    # ------------------------------------------------------------------ parameters
    def _declare_parameters(self) -> tuple[Param, ...]:
        """Declare the table's parameters and score_threshold_<class> for the classes of the model the node
        starts with (livox_infer.params); returns what was declared."""
        from rclpy.parameter import Parameter

        overrides = getattr(self, "_parameter_overrides", {})
        model = overrides["model"].value if "model" in overrides else param_model.DEFAULTS["model"]
        declared = param_model.parameters(model)  # ConfigError for an unknown model: the node does not start
        for spec in declared:
            # "-p max_range:=100" or "max_range: 100" in a YAML arrive as INTEGER; ROS would refuse
            # them for a double parameter, so take the number as the double it obviously means.
            given = overrides.get(spec.name)
            if spec.type == "double" and given is not None and given.type_ == Parameter.Type.INTEGER:
                overrides[spec.name] = Parameter(spec.name, value=float(given.value))
            if spec.default is None:  # an array that may stay unset: declared by type (ROS cannot infer it from [])
                kind = Parameter.Type.DOUBLE_ARRAY if spec.type == "double[]" else Parameter.Type.STRING_ARRAY
                if kind == Parameter.Type.DOUBLE_ARRAY and given is not None \
                        and given.type_ == Parameter.Type.INTEGER_ARRAY:  # [0, 80, -40, 40] means doubles
                    overrides[spec.name] = Parameter(spec.name, value=[float(v) for v in given.value])
                self.declare_parameter(spec.name, kind, _descriptor(spec))
                continue
            self.declare_parameter(spec.name, spec.default, _descriptor(spec))
        return declared

    def _refuse_undeclared_overrides(self) -> None:
        """A parameter file or ``-p`` naming a parameter this node does not have (a misspelling) stops start-up,
        as ``ros2 param set`` refuses it at run time: rclpy would ignore it and run on the default."""
        declared = {p.name for p in self._params}
        for name in getattr(self, "_parameter_overrides", {}):
            if name not in declared and not param_model.is_ros_own(name):
                raise ConfigError(f"invalid parameters: {param_model.unknown_message(name, declared)}")

    def _param_value(self, spec: Param) -> Any:
        if spec.default is not None:
            return self.get_parameter(spec.name).value
        from rclpy.exceptions import ParameterUninitializedException

        try:
            return list(self.get_parameter(spec.name).value)
        except ParameterUninitializedException:  # an array parameter left unset
            return None

    @staticmethod
    def _check_extent(model: str, extent: list[float]) -> str | None:
        """Why the model cannot run on ``extent`` (not whole coarsest cells, too many cells), said to the caller."""
        from livox_infer.detector.config import ModelConfig

        try:
            cfg = ModelConfig.load(model)
        except (LivoxInferError, OSError) as exc:
            _console.warning("cannot load model %r: %s: %s", model, type(exc).__name__, exc)
            return f"cannot load model {model!r} (details on the node's console)"
        try:
            cfg.with_extent(extent)
        except LivoxInferError as exc:
            return f"bev_extent: {exc}"
        return None

    def _check_model_classes(self, model: str) -> str | None:
        """A new model must have the classes whose thresholds were declared at start-up."""
        try:
            names = [p.name for p in param_model.class_params(model)]
        except (LivoxInferError, FileNotFoundError, OSError) as exc:
            # the caller of the parameter service learns no more than this: why a file is not a model config would
            # tell what a readable file holds (its keys); the details go to stderr only
            _console.warning("cannot load model %r: %s: %s", model, type(exc).__name__, exc)
            return f"cannot load model {model!r} (details on the node's console)"
        declared = [p.name for p in self._params if param_model.is_class_param(p.name)]
        if names != declared:
            return (f"model {model!r} has other classes ({', '.join(names)}) than the node started with "
                    f"({', '.join(declared)}); restart the node to change them")
        return None

    def _on_set_parameters(self, params) -> SetParametersResult:
        candidate = dict(self._values)
        for p in params:
            if p.name in candidate:  # others (use_sim_time, ...) belong to rclpy itself
                # arrays arrive from the parameter service as array('d') / array('q'): the node holds lists
                candidate[p.name] = list(p.value) if isinstance(p.value, array.array) else p.value
        reason = validate_params(candidate, self._params)
        if not reason and candidate["model"] != self._values["model"]:
            reason = self._check_model_classes(candidate["model"])
        if not reason and candidate["bev_extent"] is not None and (
                candidate["bev_extent"] != self._values["bev_extent"] or candidate["model"] != self._values["model"]):
            reason = self._check_extent(candidate["model"], candidate["bev_extent"])
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
                    self._backend_said = None
                _close(old)
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
        return self._det_pub.get_subscription_count() + self._marker_pub.get_subscription_count() \
            + self._tracking.has_subscribers() > 0

    def _reject(self, reason: str) -> None:
        with self.stats.lock:
            self.stats.rejected += 1
            self.stats.last_error = reason
        self.get_logger().warning(f"rejected cloud: {reason}", throttle_duration_sec=WARN_THROTTLE_S)

    def _process(self, msg, received_at: float) -> None:
        if not self._active:  # a lifecycle node that is configured but not active publishes nothing
            with self.stats.lock:
                self.stats.skipped_inactive += 1
            return
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
        if succeeded:
            self._check_mount(dets)

        if header is None:  # a Cloud from a CustomMsg
            out = ros_msgs.detections_to_msg(dets, stamp_ns=msg.stamp_ns, frame_id=frame_override or msg.frame_id)
        else:
            out = ros_msgs.detections_to_msg(dets, header, frame_id=frame_override)
        markers = None
        if self._values["publish_markers"] and self._marker_pub.get_subscription_count() > 0:
            markers = ros_msgs.detections_to_markers(dets, out.header)
        target = self._values["output_frame"]
        moved = True
        if target and out.header.frame_id != target:  # into output_frame at the cloud's stamp, or empty
            out, markers, moved = self._to_output_frame(out, markers, target)
            succeeded = succeeded and moved
        self._det_pub.publish(out)
        if markers is not None:
            self._marker_pub.publish(markers)
        self._tracking.publish_pending(publish=moved)  # ~/tracked_objects, in output_frame too
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

    def _restart_scene_on_time_jump_back(self, msg) -> None:
        """A stamp older than the last frame's (a looped or restarted bag, a sensor restart) starts a new scene: the
        pipeline forgets its smoothed ground estimates, as the tracker drops its tracks, so a replayed recording
        gives the same boxes every time. So does the last frame's stamp again (a replay that lost the frames after
        it, a duplicate delivery): counted twice, one frame would pull the smoothed ground towards its own estimate
        and move the next frames' boxes by ~2 cm."""
        stamp = ros_msgs.message_stamp_ns(msg)
        last, self._last_detect_stamp = self._last_detect_stamp, stamp
        if last is not None and stamp <= last:
            reset = getattr(self._pipeline, "reset_ground", None)
            if reset is not None:
                reset()
            what = (f"time jumped back {(last - stamp) / 1e9:.3f} s" if stamp < last else
                    "the last frame's stamp again")
            self.get_logger().info(f"{what}: a new scene (ground estimate restarts; tracks restart when time went "
                                   "back)", throttle_duration_sec=WARN_THROTTLE_S)

    def _detect(self, msg):
        """The pipeline's detections, or None after counting and warning about a rejected / failed cloud."""
        try:
            self._restart_scene_on_time_jump_back(msg)
            if self._values["accumulate_frames"] > 1 and isinstance(msg, Cloud):  # a stack: de-smear moving traffic
                msg = self._tracking.compensate(msg)
            with self._pipeline_lock:
                dets = self._pipeline.detect(msg)
                self._say_network_change()
            self._tracking.annotate(dets, msg, self._values["frame_id"] or None)  # track ids, ~/tracked_objects
            return dets
        except PointCloudError as exc:
            self._reject(str(exc))
        except Exception as exc:  # noqa: BLE001 - typed (LivoxInferError) or a bug: the frame fails, the node goes on
            with self.stats.lock:
                self.stats.failed += 1
                self.stats.last_error = f"{type(exc).__name__}: {exc}"
            self.get_logger().error(f"detection failed: {type(exc).__name__}: {exc}",
                                    throttle_duration_sec=WARN_THROTTLE_S)
        return None

    def _say_network_change(self) -> None:
        """One line when the network the pipeline runs changes under a running node (the package built in the
        background takes over from the eager network, or that build failed: docs/performance.md, Start-up)."""
        backend, error = self._describe_backend(), getattr(self._pipeline, "package_build_error", None)
        said = getattr(self, "_backend_said", None)
        if said is None or said == (backend, error):
            self._backend_said = (backend, error)
            return
        self._backend_said = (backend, error)
        if error and error != said[1]:
            self.get_logger().warning(f"no AOTInductor package from the background build ({error}): the network "
                                      f"stays {backend}")
        else:
            notes = getattr(getattr(self._pipeline, "startup", None), "notes", None) or ["(no note)"]
            self.get_logger().info(f"network now {backend}: {notes[-1]}")

    def _count_over_budget(self, dets) -> None:
        thinned = int(getattr(dets, "points_over_budget", 0) or 0)
        if thinned:
            with self.stats.lock:
                self.stats.over_budget += 1
            self.get_logger().warning(
                f"cloud over the point budget: {thinned} points dropped to keep max_points="
                f"{self._values['max_points']}", throttle_duration_sec=WARN_THROTTLE_S)

    def _check_mount(self, dets) -> None:
        """Count and warn (throttled) when the frame was levelled with a sensor_height far from the ground its cloud
        shows: every box is then off in z and the network misses cars (docs/ground.md)."""
        used, seen = float(getattr(dets, "sensor_height", float("nan"))), float(getattr(dets, "ground_height_seen",
                                                                                         float("nan")))
        wrong = mount_mismatch(used, seen) is not None
        with self.stats.lock:
            self.stats.mount_mismatch = (used, seen) if wrong else None
            self.stats.ground_mismatch += int(wrong)
        if wrong:
            self.get_logger().warning(mount_message(used, seen), throttle_duration_sec=6 * WARN_THROTTLE_S)

    # ------------------------------------------------------------------ TF
    def _make_tf(self):
        """A TfLookup (tf2_ros Buffer + TransformListener on this node) when a parameter needs TF, else None."""
        v = self._values
        if not (v["output_frame"] or v["odometry_frame"]):
            return None
        from livox_infer.ros.tf import TfLookup

        tf = TfLookup(self)
        if not tf.available:
            self.get_logger().error(
                f"tf2_ros cannot be imported ({tf.unavailable}): output_frame / odometry_frame need TF, so every frame "
                "is published empty (counted as frames_tf_failed). Source a ROS 2 install, or build it for the venv: "
                "scripts/setup_tf2.sh, then source .venv/ros2_tf2/setup.sh")
        return tf

    def _lookup(self, target: str, source: str, stamp_ns: int, timeout_s: float, what: str):
        """4x4 transform source -> target at stamp_ns, or None after counting and warning (throttled)."""
        from livox_infer.ros.tf import TransformUnavailable

        try:
            return self._tf.matrix(target, source, stamp_ns, timeout_s)
        except TransformUnavailable as exc:
            reason = f"TF {what} {source or '(no frame_id)'} -> {target} at {stamp_ns / 1e9:.3f} s: {exc}"
            with self.stats.lock:
                self.stats.tf_failed += 1
                self.stats.last_error = reason
            self.get_logger().warning(f"{reason}; publishing no detections for this frame",
                                      throttle_duration_sec=WARN_THROTTLE_S)
            return None

    def _to_output_frame(self, out, markers, target: str):
        """Detections (and markers) moved into ``target`` with TF at their stamp: (out, markers, True); when the
        lookup fails an empty array in ``target`` (and a DELETEALL): (out, markers, False). Never the wrong frame."""
        from livox_infer.ros.tf import transform_detections, transform_markers

        transform = self._lookup(target, out.header.frame_id, ros_msgs.stamp_to_ns(out.header.stamp),
                                 float(self._values["tf_timeout"]), "output_frame")
        if transform is None:
            empty = ros_msgs.detections_to_msg(_EmptyDetections(), out.header, frame_id=target)
            return empty, (None if markers is None else
                           ros_msgs.detections_to_markers(_EmptyDetections(), empty.header)), False
        transform_detections(out, transform, target)
        if markers is not None:
            transform_markers(markers, transform, target)
        self._tracking.move_pending(transform, target)
        return out, markers, True

    def _publish_empty(self, stamp_ns: int, frame_id: str) -> None:
        """The answer for a cloud that cannot be placed (a TF lookup failed before detection): no boxes."""
        out = ros_msgs.detections_to_msg(_EmptyDetections(), stamp_ns=stamp_ns, frame_id=frame_id)
        self._det_pub.publish(out)
        if self._values["publish_markers"] and self._marker_pub.get_subscription_count() > 0:
            self._marker_pub.publish(ros_msgs.detections_to_markers(_EmptyDetections(), out.header))

    # ------------------------------------------------------------------ diagnostics
    def _describe_backend(self) -> str:
        p = self._pipeline
        if getattr(p, "network_backend", None):  # DetectionPipeline: eager | compiled | aoti, and bf16 where used
            bf16 = ", bf16" if getattr(p, "precision", "fp32") == "bf16" else ""
            return f"{p.device} ({p.network_backend}{bf16})"
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
        values.update(self._tracking.diagnostics())
        for k in ("received", "processed", "dropped", "rejected", "empty", "failed", "over_budget",
                  "skipped_no_subscribers", "ground_mismatch"):
            values[f"frames_{k}"] = snap[k]
        for stage, samples in sorted(snap["latency_ms"].items()):
            mean, p50, p99 = ros_msgs.percentile_summary(samples)
            values[f"latency_{stage}_mean_ms"] = mean
            values[f"latency_{stage}_p50_ms"] = p50
            values[f"latency_{stage}_p99_ms"] = p99
        values["last_error"] = snap["last_error"]
        if self._tf is not None:
            values["output_frame"] = self._values["output_frame"] or "(the cloud's)"
            values["tf"] = "tf2_ros" if self._tf.available else f"unavailable: {self._tf.unavailable}"
            values["frames_tf_failed"] = snap["tf_failed"]
        if self._managed:
            values["lifecycle"] = "active" if self._active else "inactive"
            values["frames_skipped_inactive"] = snap["skipped_inactive"]
        if self._assembler is not None:
            values.update(self._assembler_diagnostics())
        compile_error = getattr(self._pipeline, "compile_error", None)
        if compile_error:
            values["compile_error"] = compile_error
        building = getattr(self._pipeline, "package_build_state", None)
        compiling = getattr(self._pipeline, "background_compile_state", None)
        if compiling:
            values["background_compile"] = compiling
        if building:
            values["package_build"] = building
        elif getattr(self._pipeline, "package_build_error", None):
            values["package_build"] = f"failed: {self._pipeline.package_build_error}"
        if snap["failed"]:
            level, message = "error", f"pipeline errors: {snap['failed']} (last: {snap['last_error']})"
        elif snap["rejected"]:
            level, message = "warn", f"{snap['rejected']} malformed clouds rejected (last: {snap['last_error']})"
        elif snap["tf_failed"]:
            level, message = "warn", (f"{snap['tf_failed']} TF lookups failed, those frames published empty "
                                      f"(last: {snap['last_error']})")
        elif snap["odometry_rejected"]:
            level, message = "warn", f"{snap['odometry_rejected']} odometry messages rejected (last: {snap['last_error']})"
        elif snap["mount_mismatch"] is not None:
            level, message = "warn", mount_message(*snap["mount_mismatch"])
        elif compile_error:
            level, message = "warn", f"torch.compile failed, running eagerly: {compile_error}"
        elif not self._active:
            level, message = "ok", "configured, inactive (lifecycle): activate to publish detections"
        elif snap["received"] == 0 and getattr(self, "_graph_problem", None):
            level, message = "warn", self._graph_problem
        elif snap["received"] == 0:
            level, message = "warn", f"no clouds received on {', '.join(self._input_topics())}"
        else:
            level, message = "ok", "detecting"
        return ros_msgs.diagnostic_status(f"{self.get_name()}: livox_infer detector", self._values["sensor"],
                                          _LEVEL[level][0], message, values)

    def _check_graph(self) -> None:
        """Say why a running node may look dead: input published with another type, or no output subscriber."""
        problems = [node_graph.input_type_mismatch(self, topic, self._input_class) for topic in self._input_topics()]
        self._graph_problem = "; ".join(p for p in problems if p) or None
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
        elif v["input_topics"] and v["output_frame"]:
            # a rig described by TF: each topic's cloud moved into output_frame (its frame_id -> output_frame),
            # then merged and detected there, as a rig file with the same extrinsics (ground, grid: the parameters)
            same = same_frame_rig(v["input_topics"], v["sensor"])
            height = "auto" if v["estimate_ground"] else float(v["sensor_height"])
            rig = Rig(v["output_frame"], same.sensors, same.merge_tolerance_ms, None, height)
            self._rig_options = rig_pipeline_options(rig)
        elif v["input_topics"]:
            rig = same_frame_rig(v["input_topics"], v["sensor"])
        elif v["accumulate_frames"] > 1 or v["odometry_topic"] or v["odometry_frame"]:
            rig = same_frame_rig([v["input_topic"]], v["sensor"])
        else:
            return None
        self._tf_rig = bool(v["input_topics"] and v["output_frame"])
        self._poses = PoseBuffer() if v["odometry_topic"] or v["odometry_frame"] else None
        return FrameAssembler(rig, int(v["accumulate_frames"]), float(v["accumulate_ms"]), self._poses)

    def _subscribe_assembled(self, qos) -> None:
        custom = self._values["input_type"] == "custom_msg"
        self._subs = []
        for sensor in self._assembler.rig.sensors:
            cb = (lambda raw, n=sensor.name: self._on_sensor_cloud(n, raw, True)) if custom else \
                (lambda msg, n=sensor.name: self._on_sensor_cloud(n, msg, False))
            self._subs.append(self.create_subscription(self._input_class, sensor.topic, cb, qos, raw=custom))
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
        except Exception as exc:  # noqa: BLE001 - malformed input must never kill the node
            with self.stats.lock:
                self.stats.received += 1
            self._reject(f"{sensor}: {exc}")
            return
        if self._tf is not None:
            cloud = self._place_with_tf(sensor, cloud)
            if cloud is None:
                return
        try:
            outside = self._assembler.outside_grid[sensor]
            clouds = self._assembler.add(sensor, cloud)
        except Exception as exc:  # noqa: BLE001 - malformed input must never kill the node
            with self.stats.lock:
                self.stats.received += 1
            self._reject(f"{sensor}: {exc}")
            return
        if self._assembler.outside_grid[sensor] > outside:
            self.get_logger().warning(self._assembler.outside_grid_warning(sensor),
                                      throttle_duration_sec=6 * WARN_THROTTLE_S)
        for merged in clouds:
            self._offer(merged)

    def _place_with_tf(self, sensor: str, cloud):
        """TF for one sensor's cloud before it is merged: moved into output_frame (a TF-described rig) and its pose
        in odometry_frame (accumulation) recorded. None after a failed lookup (counted, warned): a single sensor's
        frame is then answered with an empty Detection3DArray; in a rig of several the others' frame goes out
        without this sensor (the merger counts it missing)."""
        from livox_infer.rig import transform_cloud

        v = self._values
        frame = v["output_frame"] if self._tf_rig else (self._assembler.rig.output_frame or cloud.frame_id)
        if self._tf_rig:
            extrinsic = self._lookup(frame, cloud.frame_id, cloud.stamp_ns, 0.0, f"extrinsic of {sensor}")
            if extrinsic is None:
                return self._unplaced(cloud, frame)
            cloud = transform_cloud(cloud, extrinsic, frame)
        if v["odometry_frame"]:
            pose = self._lookup(v["odometry_frame"], frame, cloud.stamp_ns, 0.0, "pose")
            if pose is None:
                return self._unplaced(cloud, frame)
            self._poses.add(cloud.stamp_ns, pose)
        return cloud

    def _unplaced(self, cloud, frame: str) -> None:
        with self.stats.lock:
            self.stats.received += 1
        if len(self._assembler.rig.sensors) == 1 and self._has_output_subscribers():
            self._publish_empty(cloud.stamp_ns, self._values["output_frame"] or frame)
        return None

    def _on_odometry(self, msg) -> None:
        from livox_infer.accumulate import pose_matrix

        p, q = msg.pose.pose.position, msg.pose.pose.orientation
        try:
            self._poses.add(msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec,
                            pose_matrix((p.x, p.y, p.z), (q.x, q.y, q.z, q.w)))
        except (LivoxInferError, TypeError, ValueError) as exc:
            with self.stats.lock:
                self.stats.odometry_rejected += 1
                self.stats.last_error = f"odometry: {exc}"
            self.get_logger().warning(f"rejected odometry (not used): {exc}", throttle_duration_sec=WARN_THROTTLE_S)

    def _assembler_diagnostics(self) -> dict[str, Any]:
        m = self._assembler.merger.stats
        out: dict[str, Any] = {"merged_frames": m.frames, "merged_partial": m.partial, "merge_late": m.late,
                               "merge_restarts": m.restarts,
                               "accumulated_compensated": self._assembler.accumulator.compensated,
                               "accumulated_plain": self._assembler.accumulator.plain,
                               "accumulated_gap_resets": self._assembler.accumulator.gap_resets}
        if self._poses is not None:
            out["odometry_rejected"] = self.stats.odometry_rejected
        out.update({f"missing_{name}": n for name, n in m.missing.items()})
        if self._assembler.rig.bev_extent is not None:
            out.update({f"outside_grid_{name}": n for name, n in self._assembler.outside_grid.items()})
        return out

    # ------------------------------------------------------------------ shutdown
    def _stop_worker(self) -> None:
        cond, worker = getattr(self, "_cond", None), getattr(self, "_worker", None)  # absent if __init__ failed
        if cond is not None:
            with cond:
                self._stopping = True
                cond.notify_all()
        if worker is not None and worker.is_alive() and threading.current_thread() is not worker:
            worker.join(timeout=30.0)

    def destroy_node(self) -> None:
        self._stop_worker()
        super().destroy_node()


def managed_node_class():
    """DetectorNode as an rclpy lifecycle (managed) node: configure builds the pipeline (loads and checks the
    weights: a bad file fails the transition, the node stays unconfigured), activate starts publishing, deactivate
    stops it, cleanup drops the pipeline. ``detector_node --lifecycle``, ``ros2 launch ... lifecycle:=true``."""
    from rclpy.lifecycle import LifecycleNode, TransitionCallbackReturn

    class ManagedDetectorNode(DetectorNode, LifecycleNode):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(managed=True, **kwargs)

        def on_configure(self, state) -> TransitionCallbackReturn:
            try:
                self._configure()
            except (LivoxInferError, OSError, ValueError, RuntimeError, ImportError) as exc:
                kind = "weights" if isinstance(exc, WeightsError) else type(exc).__name__
                self.get_logger().error(f"configure failed ({kind}): {exc}")
                self._unconfigure()
                return TransitionCallbackReturn.FAILURE
            return TransitionCallbackReturn.SUCCESS

        def on_activate(self, state) -> TransitionCallbackReturn:
            self._active = True
            self.get_logger().info("activated: publishing detections")
            return super().on_activate(state)

        def on_deactivate(self, state) -> TransitionCallbackReturn:
            self._active = False
            self.get_logger().info("deactivated: clouds are not processed until activated again")
            return super().on_deactivate(state)

        def on_cleanup(self, state) -> TransitionCallbackReturn:
            self._unconfigure()
            return TransitionCallbackReturn.SUCCESS

        def on_shutdown(self, state) -> TransitionCallbackReturn:
            self._unconfigure()
            return TransitionCallbackReturn.SUCCESS

        def on_error(self, state) -> TransitionCallbackReturn:
            self._unconfigure()
            return TransitionCallbackReturn.SUCCESS

    return ManagedDetectorNode


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
    """`livox-infer run`: the shared options (livox_infer.params); given ones override the preset's values."""
    param_model.add_cli_options(parser, ("sensor",))
    parser.add_argument("--params-file", default=None,
                        help="ROS 2 parameter YAML loaded over config/detector.param.yaml instead of the preset's "
                             "override (its own 'sensor' applies)")
    parser.add_argument("--input-topic", default=None, help="override input_topic")
    parser.add_argument("--rig", default=None, help="rig YAML: several LiDARs merged into its output frame "
                        "(a path or a name under config/, e.g. rigs/livox_dataset_v1.yaml; docs/rigs.md)")
    param_model.add_cli_options(parser, ("model", "weights", "device", "compile", "sensor_height", "threads"),
                                model=None, device=None, compile=None, sensor_height=None, threads=None)
    # the spelling of the node parameter (use_compile), kept for the commands in the docs
    parser.add_argument("--use-compile", dest="compile", type=param_model.parse_bool, metavar="{true,false}",
                        help="the same as --compile / --no-compile")
    parser.add_argument("--node-name", default=NODE_NAME, help=f"node name (default {NODE_NAME})")
    parser.add_argument("--lifecycle", action="store_true",
                        help="run as a lifecycle (managed) node: configure loads the weights, activate publishes")
    parser.add_argument("--ros-args", dest="ros_args", nargs=argparse.REMAINDER, default=[],
                        help="everything after this goes to ROS (e.g. --ros-args -p score_threshold_car:=0.5)")


def params_files_for(sensor: str) -> list[str]:
    """The preset's parameter files in load order: config/detector.param.yaml, config/<sensor>.param.yaml."""
    from livox_infer.presets import preset_files

    return [str(p) for p in preset_files(sensor)]


def ros_arguments(args: argparse.Namespace) -> list[str]:
    """``livox-infer run`` options → the ROS argument list the node is initialised with."""
    from livox_infer.presets import base_path

    # --sensor picks the preset's override; an explicit --params-file names its own sensor.
    files = [str(base_path()), args.params_file] if args.params_file else params_files_for(args.sensor)
    out = ["livox-infer-run", "--ros-args"]
    for path in files:
        out += ["--params-file", path]
    overrides = {"input_topic": args.input_topic, "rig": getattr(args, "rig", None),
                 "model": getattr(args, "model", None), "weights": getattr(args, "weights", None),
                 "device": args.device, "threads": getattr(args, "threads", None)}
    if getattr(args, "compile", None) is not None:
        overrides["use_compile"] = "true" if args.compile else "false"
    height = getattr(args, "sensor_height", None)
    if height is not None:
        overrides["estimate_ground"] = "true" if height == "auto" else "false"
        if height != "auto":
            overrides["sensor_height"] = height
    out += [x for name, value in overrides.items() if value is not None for x in ("-p", f"{name}:={value}")]
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


def spin_node(ros_argv: list[str], node_factory: Callable[[], Node] | None = None, *,
              exiting: bool = False) -> int:
    """Initialise rclpy with ``ros_argv``, run the node until shutdown; exit status 1 on start-up failure.

    From the clean-up on, SIGINT is ignored; ``exiting`` (the process ends after this: `main`) leaves it so,
    otherwise the previous handler is restored at the end."""
    import rclpy
    from rclpy.exceptions import ParameterException
    from rclpy.executors import ExternalShutdownException

    try:  # every --params-file and -p against the parameter model, before rclpy (which ignores unknown names)
        param_model.check_ros_arguments(ros_argv)
    except ConfigError as exc:
        print(f"[livox_detector] FATAL: cannot start (ConfigError): {exc}", file=sys.stderr, flush=True)
        return 1
    rclpy.init(args=ros_argv)
    node = None
    try:
        try:
            node = (node_factory or DetectorNode)()
        except (KeyboardInterrupt, ExternalShutdownException):  # Ctrl-C while loading / compiling
            print("[livox_detector] interrupted during start-up", file=sys.stderr, flush=True)
            return 130
        except (LivoxInferError, ParameterException, ImportError, OSError, ValueError, RuntimeError) as exc:
            if not rclpy.ok():  # Ctrl-C reached a compiler subprocess too (same process group): not a failure
                print("[livox_detector] interrupted during start-up", file=sys.stderr, flush=True)
                return 130
            kind = "weights" if isinstance(exc, WeightsError) else type(exc).__name__
            print(f"[livox_detector] FATAL: cannot start ({kind}): {exc}", file=sys.stderr, flush=True)
            return 1
        try:
            executor = create_executor()
            executor.add_node(node)
            executor.spin()
        except (KeyboardInterrupt, ExternalShutdownException):
            pass
        except Exception:
            # Ctrl-C shut the context down between two waits: rclpy then raises RCLError ("the given context is not
            # valid") from the next wait set instead of ExternalShutdownException (seen on a loaded CPU in CI)
            if rclpy.ok():
                raise
        return 0
    finally:
        # shutting down: a second Ctrl-C (the terminal's and `ros2 launch`'s own SIGINT both arrive) must not cut
        # the clean-up short with a traceback or a death by signal (launch: "process has died, exit code -2")
        main_thread = threading.current_thread() is threading.main_thread()  # signal.signal works there only
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main_thread else None
        try:
            if node is not None:
                node.destroy_node()
            if rclpy.ok():
                rclpy.try_shutdown()
        finally:
            if main_thread and not exiting:  # a late second SIGINT would otherwise kill the exiting process (-2)
                signal.signal(signal.SIGINT, previous)


def main(args: argparse.Namespace | list[str] | None = None) -> int:
    """``ros2 run livox_infer detector_node [--ros-args ...]`` (args None: sys.argv) or ``livox-infer run``."""
    lifecycle = False
    if isinstance(args, argparse.Namespace):
        lifecycle = bool(getattr(args, "lifecycle", False))
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
        lifecycle = "--lifecycle" in user
    return spin_node(ros_argv, managed_node_class() if lifecycle else None, exiting=True)


def node_help() -> str:
    """`detector_node --help`: usage and every parameter with its default and meaning."""
    lines = ["usage: ros2 run livox_infer detector_node [--lifecycle] [--ros-args -p NAME:=VALUE ... | --params-file FILE]",
             "       ros2 launch livox_infer detect.launch.py sensor:=avia", "", "parameters:"]
    for p in PARAMS:
        lines.append(f"  {p.name} (default {p.default!r})")
        lines.append(f"      {p.doc}")
    lines.append("  score_threshold_<class> (default: the model config's score_thresholds)")
    lines.append("      Minimum score of a published object, one per class of the model (models/<model>.yaml).")
    lines.append("reference: docs/parameters.md")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
