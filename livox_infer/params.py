"""The detector's run-time parameters, defined once (ROS-free).

One table (:data:`PARAMS`) gives each parameter its type, default, range or choices, meaning, whether it is
read-only, and how a change takes effect (a new pipeline, in place, or the node only). The per-class score
thresholds are not in the table: they come from the loaded model's own classes and ``score_thresholds``
(models/<name>.yaml, their one owner) via :func:`class_params`. Everything else derives from here: the node's
declared parameters, :func:`validate` (the node, the presets), :func:`pipeline_options` (node / preset values ->
``DetectionPipeline`` keyword arguments), the pipeline's constructor defaults and sensor-height check, the CLI
options shared by detect / eval / bench / run (:func:`add_cli_options`), the launch file's arguments, and the
generated artefacts (config/detector.param.yaml, schema/detector.schema.json, docs/parameters.md:
``livox-infer params --write``).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from livox_infer.accumulate import MAX_FRAMES, MAX_WINDOW_MS
from livox_infer.decode.pointcloud import DEFAULT_MAX_POINTS, MAX_POINTS_RANGE, TAG_FILTER_MODES
from livox_infer.errors import ConfigError
from livox_infer.threads import DEFAULT_THREADS, MAX_THREADS
from livox_infer.tracking.tracker import TrackerConfig, default_gate

TRACKER_DEFAULTS = TrackerConfig()

SENSOR_PRESETS = ("mid40", "mid70", "tele15", "horizon", "avia")
DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("auto", "fp32", "bf16")  # of the network at inference: livox_infer.detector.precision
INPUT_TYPES = ("pointcloud2", "custom_msg")
SENSOR_HEIGHT_RANGE = (0.0, 9.5)  # metres; a roof or mast mount, never below the ground
SCORE_THRESHOLD_PREFIX = "score_threshold_"
TRACKING_GATE_PREFIX = "tracking_gate_"
CLASS_PREFIXES = (SCORE_THRESHOLD_PREFIX, TRACKING_GATE_PREFIX)

# How a change of a parameter takes effect.
REBUILD = "rebuild"  # a new pipeline (network, device, weights)
UPDATE = "update"  # DetectionPipeline.update(), in place
NODE = "node"  # the node alone; the pipeline never sees it

TYPES = ("bool", "int", "double", "string", "double[]", "string[]")


@dataclass(frozen=True)
class Param:
    name: str
    type: str  # one of TYPES (ROS 2 parameter types)
    default: Any  # None: an array that may stay unset
    doc: str
    range: tuple[float, float] | None = None  # inclusive
    choices: tuple[str, ...] | None = None
    read_only: bool = False
    applies: str = UPDATE

    def check(self, value: Any) -> str | None:
        """Why ``value`` is not valid for this parameter (type, range, choices), or None."""
        if value is None and self.default is None:
            return None
        kind = self.type
        if kind == "bool" and not isinstance(value, bool):
            return f"{self.name} must be true or false, got {value!r}"
        if kind == "int" and (isinstance(value, bool) or not isinstance(value, int)):
            return f"{self.name} must be an integer, got {value!r}"
        if kind == "double" and (isinstance(value, bool) or not isinstance(value, (int, float))
                                 or not math.isfinite(value)):
            return f"{self.name} must be a number, got {value!r}"
        if kind == "string" and not isinstance(value, str):
            return f"{self.name} must be a string, got {value!r}"
        if kind.endswith("[]") and not isinstance(value, (list, tuple)):
            return f"{self.name} must be a list, got {value!r}"
        if self.choices is not None and value not in self.choices:
            return f"{self.name} must be one of {list(self.choices)}, got {value!r}"
        if self.range is not None and not self.range[0] <= value <= self.range[1]:
            lo, hi = self.range
            noun = "an integer" if kind == "int" else "a number"
            return f"{self.name} must be {noun} in [{lo}, {hi}], got {value!r}"
        return None


PARAMS: tuple[Param, ...] = (
    Param("sensor", "string", "avia", "Livox sensor preset: config/<sensor>.param.yaml over config/detector.param.yaml.",
          choices=SENSOR_PRESETS, read_only=True, applies=NODE),
    Param("input_topic", "string", "/livox/lidar", "Input cloud topic (sensor_msgs/PointCloud2 or livox CustomMsg).",
          read_only=True, applies=NODE),
    Param("input_type", "string", "pointcloud2", "Input message type: pointcloud2, or custom_msg "
          "(livox_ros_driver2/CustomMsg, needs that interface package installed).",
          choices=INPUT_TYPES, read_only=True, applies=NODE),
    Param("input_topics", "string[]", None, "Several input topics whose clouds already share one frame (e.g. the "
          "driver applied its extrinsics): merged by stamp, detected once. Unset = input_topic.",
          read_only=True, applies=NODE),
    Param("rig", "string", "", "Rig YAML (docs/rigs.md): one topic per sensor with its extrinsic; clouds moved into "
          "the rig's output_frame, merged by stamp, detected once; its bev_extent and sensor_height apply.",
          read_only=True, applies=NODE),
    Param("odometry_topic", "string", "", "nav_msgs/Odometry of the output (or cloud) frame: accumulated frames are "
          "motion-compensated and deskewed with it; empty = plain accumulation.", read_only=True, applies=NODE),
    Param("accumulate_frames", "int", 1, "Detect on the last N frames stacked (1 = each frame alone). The lite "
          "weights see each point's age and were trained on 2-4 stacked frames. With odometry (or on a standing "
          "sensor) and tracking, 3 beat 1 on moving and parked traffic; without odometry a moving vehicle smears "
          "everything, so every preset keeps 1 (docs/rigs.md).",
          range=(1, MAX_FRAMES), read_only=True, applies=NODE),
    Param("accumulate_ms", "double", 0.0, "Stack only frames within this many ms of the newest (0 = no time limit; a gap of over 1 s "
          "between frames always restarts the stack).",
          range=(0.0, MAX_WINDOW_MS), read_only=True, applies=NODE),
    Param("accumulate_track_motion", "bool", True, "With accumulate_frames > 1 and tracking: the older points of "
          "each tracked moving object are moved along its velocity to where it is now before detection, so moving "
          "traffic does not smear (docs/rigs.md).", applies=NODE),
    Param("device", "string", "auto", "Compute device: auto (cuda if available, else cpu), cpu or cuda.",
          choices=DEVICES, applies=REBUILD),
    Param("model", "string", "lite", "Model config: a name in the package's models/ directory or a path to its YAML "
          "(BEV grid, classes, score thresholds, default weights).", applies=REBUILD),
    Param("weights", "string", "", "Path to .safetensors weights; empty = the model config's default.",
          applies=REBUILD),
    Param("use_compile", "bool", True, "Run the network compiled: the AOTInductor package built for this machine, "
          "model, grid, weights and threads when there is one (`make setup` builds the presets'), else see "
          "build_package. false: eager, no compile step.", applies=REBUILD),
    Param("build_package", "bool", True, "With use_compile on a CPU and no matching package: true = detect eagerly at "
          "once, build the package in a background process at the lowest CPU priority (20-60 s) and switch to it; "
          "later starts load it (~2 s). false = torch.compile in the node (see compile_in_background).",
          applies=REBUILD),
    Param("compile_in_background", "bool", True, "Where torch.compile runs in the node (use_compile on a CPU, no "
          "matching package, build_package false): true = detect eagerly at once while a thread compiles the "
          "network and stage 2 (~30-45 s cold) or loads what an earlier start saved (~3 s), then switch to them; "
          "false = compile before the first detection.", applies=REBUILD),
    # read-only: a package is native code, so which one runs is decided at start-up, not over the network
    Param("aoti_package", "string", "", "AOTInductor package (.pt2) from `livox-infer export`: the network compiled "
          "ahead of time with its weights, no compiler needed; empty = off. Only packages listed in the export "
          "manifest are loaded (docs/detector.md, Trust model).", read_only=True, applies=REBUILD),
    Param("precision", "string", "auto", "Arithmetic of the network's backbone and neck: auto (bf16 on a CPU with "
          "AMX, where it is ~1.5-2x faster at the same AP, else fp32), fp32 or bf16; the head stays fp32 "
          "(docs/detector.md, Precision).", choices=PRECISIONS, applies=REBUILD),
    Param("test_time_flip", "bool", False, "Also run the mirrored frame and average the two (~+11 ms compiled "
          "network time on 1 core; with the shipped refiner no AP gain, docs/detector.md).", applies=REBUILD),
    Param("refine", "bool", True, "Stage 2: re-score and refine the best candidates with the points inside them "
          "(models with a refine section; docs/detector.md). false: stage 1 alone, a few ms faster."),
    Param("roi_x_min", "double", 0.0, "Region of interest x min (m, cloud frame: x forward); points outside are "
          "dropped.", range=(-500.0, 500.0)),
    Param("roi_x_max", "double", 80.0, "Region of interest x max (m).", range=(-500.0, 500.0)),
    Param("roi_y_min", "double", -40.0, "Region of interest y min (m, y left).", range=(-500.0, 500.0)),
    Param("roi_y_max", "double", 40.0, "Region of interest y max (m).", range=(-500.0, 500.0)),
    Param("roi_z_min", "double", -3.0, "Region of interest z min (m, sensor frame, z up).", range=(-50.0, 50.0)),
    Param("roi_z_max", "double", 3.0, "Region of interest z max (m, sensor frame).", range=(-50.0, 50.0)),
    Param("bev_extent", "double[]", None, "Detection grid [x_min, x_max, y_min, y_max] (m, multiples of the model's "
          "coarsest cell, 3.2 m for lite; at most 1024 x 1024 cells): the same weights on a grid that fits the "
          "sensor; unset = the model's grid (docs/rigs.md).", applies=REBUILD),
    Param("max_range", "double", 90.0, "Drop points farther than this from the sensor (m).", range=(0.5, 1000.0)),
    Param("max_points", "int", DEFAULT_MAX_POINTS, "Point budget per cloud (after the filters): a larger cloud is "
          "thinned evenly to this many points (counted as frames_over_budget, warned).", range=MAX_POINTS_RANGE),
    Param("tag_filter", "string", "high_confidence", "Livox tag noise filter: off, high_confidence (drop points "
          "Livox flags as high-confidence noise) or strict.", choices=TAG_FILTER_MODES),
    Param("intensity_scale", "double", 255.0, "Full-scale intensity of the input (255 for Livox reflectivity, 1.0 "
          "for clouds already in 0-1); the model sees intensity / intensity_scale.", range=(1e-3, 1e6)),
    Param("sensor_height", "double", 1.8, "How far the ground lies below the sensor origin (m; 1.8 = a typical roof "
          "mount); ignored when estimate_ground is true.", range=SENSOR_HEIGHT_RANGE),
    Param("estimate_ground", "bool", False, "Estimate the sensor height from each cloud's ground points instead of "
          "sensor_height."),
    Param("frame_id", "string", "", "Output frame_id label (no transform); empty = the input cloud's frame_id. To "
          "publish in another frame, use output_frame.", applies=NODE),
    Param("output_frame", "string", "", "Frame the detections and markers are published in (e.g. base_link, map): "
          "transformed with TF (tf2_ros) at the cloud's stamp; with input_topics, each topic's cloud is moved into it "
          "with TF before merging (a rig described by TF). A failed lookup gives that frame an empty "
          "Detection3DArray. Empty = the cloud's (or the rig's) frame.", read_only=True, applies=NODE),
    Param("odometry_frame", "string", "", "Fixed frame (e.g. odom) whose TF transform to the detection frame at each "
          "cloud's stamp gives the poses for accumulation, instead of odometry_topic; empty = none.",
          read_only=True, applies=NODE),
    Param("tf_timeout", "double", 0.1, "Seconds a TF lookup for output_frame may wait for the transform at the "
          "cloud's stamp to arrive.", range=(0.0, 5.0), applies=NODE),
    Param("publish_markers", "bool", True, "Publish ~/markers (RViz boxes, labels, track ids and velocity arrows).", applies=NODE),
    Param("tracking", "bool", True, "Track the detections (docs/tracking.md): Detection3D.id carries the track id, "
          "~/tracked_objects (livox_infer_msgs/TrackedObjects) the tracks with velocities; with "
          "odometry_topic the velocities are over ground, else relative to the sensor.", applies=NODE),
    Param("tracking_confirm_hits", "int", TRACKER_DEFAULTS.confirm_hits, "Detections in a row before a track is "
          "confirmed (gets its id on ~/detections and is published).", range=(1, 20), applies=NODE),
    Param("tracking_max_misses", "int", TRACKER_DEFAULTS.max_misses, "Frames a confirmed track survives without a "
          "detection (predicted; then it ends and its object would get a new id); twice that while it stands still "
          "(docs/tracking.md).", range=(0, 50), applies=NODE),
    Param("tracking_confirm_score", "double", TRACKER_DEFAULTS.confirm_score, "A detection scoring at least this "
          "confirms its track at once (scores are calibrated: the share of such boxes that are right); the others "
          "wait for tracking_confirm_hits (1 = all of them).", range=(0.0, 1.0), applies=NODE),
    Param("tracking_low_score", "double", 0.1, "Boxes scoring below their class's score_threshold but at least this "
          "continue confirmed tracks (not published as detections, never start a track; ByteTrack's second "
          "association); 1 = off.", range=(0.0, 1.0)),
    Param("tracking_coast_frames", "int", TRACKER_DEFAULTS.coast_frames, "Frames a confirmed track without a "
          "detection is still published, at its predicted place (at most tracking_max_misses).", range=(0, 50),
          applies=NODE),
    Param("threads", "int", DEFAULT_THREADS, "torch CPU threads per frame, set at start before torch starts its "
          "pools; 0 = torch's default (one per core). 1 keeps p99 bounded on a busy CPU (docs/performance.md).",
          range=(0, MAX_THREADS), read_only=True, applies=NODE),
    Param("diagnostics_period", "double", 1.0, "Seconds between /diagnostics messages.", range=(0.1, 60.0),
          read_only=True, applies=NODE),
    Param("latency_window", "int", 300, "Frames kept per stage for the latency mean/p50/p99 in the diagnostics.",
          range=(10, 100_000), read_only=True, applies=NODE),
)
BY_NAME: dict[str, Param] = {p.name: p for p in PARAMS}
DEFAULTS: dict[str, Any] = {p.name: p.default for p in PARAMS}


def class_params(model: Any = None) -> tuple[Param, ...]:
    """``score_threshold_<class>`` for each class of ``model`` (a name, a YAML path or a ModelConfig; default the
    table's model), defaulting to the model config's ``score_thresholds``, and ``tracking_gate_<class>``, defaulting
    to the tracker's gate for that class name."""
    from livox_infer.detector.config import ModelConfig

    cfg = model if isinstance(model, ModelConfig) else ModelConfig.load(model or DEFAULTS["model"])
    thresholds = tuple(Param(f"{SCORE_THRESHOLD_PREFIX}{name}", "double", float(threshold),
                             f"Minimum score of a published {name} (default: the model config's score_thresholds).",
                             range=(0.0, 1.0))
                       for name, threshold in zip(cfg.classes, cfg.score_thresholds))
    gates = tuple(Param(f"{TRACKING_GATE_PREFIX}{name}", "double", default_gate(name),
                        f"Largest BEV distance (m) between a {name} track's predicted centre and a detection it "
                        "takes (default: livox_infer/tracking/tracker.py DEFAULT_GATES).", range=(0.1, 20.0),
                        applies=NODE)
                  for name in cfg.classes)
    return thresholds + gates


def parameters(model: Any = None) -> tuple[Param, ...]:
    """Every parameter of a node running ``model``: the table, then the model's class thresholds."""
    return PARAMS + class_params(model)


def is_class_param(name: str) -> bool:
    return name.startswith(CLASS_PREFIXES)


def validate(values: Mapping[str, Any], params: Iterable[Param] | None = None) -> str | None:
    """Why ``values`` (a full set, as the node holds it) are not valid, or None: each value against its
    parameter, then the checks across parameters."""
    params = PARAMS if params is None else params
    for param in params:
        reason = param.check(values.get(param.name))
        if reason:
            return reason
    return _cross_check(values)


def _cross_check(values: Mapping[str, Any]) -> str | None:
    for axis in "xyz":
        lo, hi = values[f"roi_{axis}_min"], values[f"roi_{axis}_max"]
        if lo >= hi:
            return (f"roi_{axis}_min ({lo}) must be smaller than roi_{axis}_max ({hi}); to move the range past "
                    "its other end, change both in one request (ros2 param load, set_parameters_atomically)")
    if values.get("tracking_coast_frames", 0) > values.get("tracking_max_misses", 50):
        return (f"tracking_coast_frames ({values['tracking_coast_frames']}) must not exceed tracking_max_misses "
                f"({values['tracking_max_misses']}): a track ends after that many misses")
    if not str(values["model"]).strip():
        return "model must name a model config"
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
    if values.get("output_frame") and values.get("frame_id"):
        return ("give either frame_id (a new label, no transform) or output_frame (transformed with TF), not both")
    if values.get("odometry_frame") and values.get("odometry_topic"):
        return "give either odometry_topic (nav_msgs/Odometry) or odometry_frame (poses from TF), not both"
    return None


def parse_sensor_height(value: Any) -> float | str:
    """The one sensor-height encoding the pipeline and the CLIs take: metres in SENSOR_HEIGHT_RANGE, or "auto"
    (estimate_ground: true). Numbers given as text (a CLI flag) are parsed."""
    if value == "auto":
        return "auto"
    lo, hi = SENSOR_HEIGHT_RANGE
    try:
        metres = float(value) if isinstance(value, str) else value
    except ValueError:
        metres = None
    if isinstance(metres, bool) or not isinstance(metres, (int, float)) or not math.isfinite(metres) \
            or not lo <= metres <= hi:
        raise ConfigError(f"sensor_height must be metres in [{lo}, {hi}] or 'auto', got {value!r}")
    return float(metres)


def pipeline_options(values: Mapping[str, Any]) -> dict[str, Any]:
    """Node / preset parameter values -> DetectionPipeline keyword arguments (constructor and update()).

    Class thresholds absent from ``values`` stay the model's own (score_thresholds None)."""
    try:
        extent = values.get("bev_extent")
        thresholds = {name[len(SCORE_THRESHOLD_PREFIX):]: float(v) for name, v in values.items()
                      if name.startswith(SCORE_THRESHOLD_PREFIX)}
        return {
            "model": values["model"],
            "weights": values["weights"] or None,
            "device": values["device"],
            "compile": bool(values["use_compile"]),
            "build_package": bool(values.get("build_package", DEFAULTS["build_package"])),
            "compile_in_background": bool(values.get("compile_in_background", DEFAULTS["compile_in_background"])),
            "aoti_package": values["aoti_package"] or None,
            "test_time_flip": bool(values["test_time_flip"]),
            "precision": values.get("precision", DEFAULTS["precision"]),
            "refine": bool(values["refine"]),
            "score_thresholds": thresholds or None,
            "roi": tuple(float(values[f"roi_{a}_{b}"]) for b in ("min", "max") for a in "xyz"),
            "max_range": float(values["max_range"]),
            "max_points": int(values.get("max_points", DEFAULT_MAX_POINTS)),
            "tag_filter": values["tag_filter"],
            "intensity_scale": float(values["intensity_scale"]),
            "sensor_height": "auto" if values["estimate_ground"] else float(values["sensor_height"]),
            "bev_extent": tuple(float(v) for v in extent) if extent else None,
            # the tracker's second association (livox_infer/tracking/tracker.py) takes the boxes scoring below
            "candidate_score": (float(values.get("tracking_low_score", DEFAULTS["tracking_low_score"]))
                                if values.get("tracking", DEFAULTS["tracking"]) else None),
        }
    except KeyError as exc:
        raise ConfigError(f"sensor parameters lack {exc}") from None


def changed_applies(old: Mapping[str, Any], new: Mapping[str, Any]) -> set[str]:
    """Names whose value differs between ``old`` and ``new`` and whose change needs a new pipeline."""
    return {k for k in new if new[k] != old.get(k) and k in BY_NAME and BY_NAME[k].applies == REBUILD}


# ---------------------------------------------------------------------------------------------- CLI options
def parse_bool(text: str) -> bool:
    t = str(text).strip().lower()
    if t in ("1", "true", "yes", "on"):
        return True
    if t in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _sensor_height_arg(text: str) -> float | str:
    try:
        return parse_sensor_height(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


CLI_OPTIONS = ("model", "weights", "compile", "device", "precision", "sensor", "sensor_height", "threads")


def _cli_option(name: str, defaults: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """(flag, add_argument keywords) of a shared option."""
    if name == "model":
        return "--model", dict(default=defaults.get("model", DEFAULTS["model"]),
                               help="model config: lite, full or a YAML path (default %(default)s)")
    if name == "weights":
        return "--weights", dict(default=defaults.get("weights"), help="safetensors weights (default: the model config's)")
    if name == "compile":
        return "--compile", dict(action=argparse.BooleanOptionalAction,
                                 default=defaults.get("compile", DEFAULTS["use_compile"]),
                                 help=f"{BY_NAME['use_compile'].doc} (default %(default)s)")
    if name == "device":
        return "--device", dict(default=defaults.get("device", DEFAULTS["device"]), choices=DEVICES,
                                help="compute device (default %(default)s)")
    if name == "precision":
        return "--precision", dict(default=defaults.get("precision", DEFAULTS["precision"]), choices=PRECISIONS,
                                   help=f"{BY_NAME['precision'].doc} (default %(default)s)")
    if name == "sensor":
        return "--sensor", dict(default=defaults.get("sensor", DEFAULTS["sensor"]), choices=SENSOR_PRESETS,
                                help=f"{BY_NAME['sensor'].doc} (default %(default)s)")
    if name == "sensor_height":
        lo, hi = SENSOR_HEIGHT_RANGE
        return "--sensor-height", dict(type=_sensor_height_arg, default=defaults.get("sensor_height", "auto"),
                                       help=f"metres from the sensor down to the ground ([{lo}, {hi}]), or 'auto': "
                                            "estimated per cloud (default %(default)s)")
    raise ValueError(f"no shared CLI option {name!r}; shared: {CLI_OPTIONS}")


def add_cli_options(parser: argparse.ArgumentParser, names: Iterable[str] = CLI_OPTIONS,
                    helps: Mapping[str, str] | None = None, **defaults: Any) -> None:
    """The options the commands share, one spelling each: --model, --weights, --compile/--no-compile, --device,
    --sensor, --sensor-height, --threads; defaults from the table unless a command passes its own (None =
    "not given": the preset's value applies); ``helps`` replaces an option's help text."""
    helps = helps or {}
    for name in names:
        if name == "threads":
            from livox_infer.threads import add_threads_argument

            add_threads_argument(parser, default=defaults.get("threads", DEFAULT_THREADS))
            continue
        flag, kwargs = _cli_option(name, defaults)
        parser.add_argument(flag, **{**kwargs, "help": helps.get(name, kwargs["help"])})


# ---------------------------------------------------------------------------------------------- parameter files
# rclpy's own parameters, which a parameter file may set for any node
ROS_OWN_PARAMS = frozenset({"use_sim_time", "start_type_description_service"})
ROS_OWN_PREFIXES = ("qos_overrides.",)


def is_ros_own(name: str) -> bool:
    return name in ROS_OWN_PARAMS or name.startswith(ROS_OWN_PREFIXES)


def check_value(param: Param, value: Any) -> str | None:
    """Why ``value`` as a parameter file or ``-p NAME:=VALUE`` gives it cannot be ``param``'s value, or None.

    Integers are taken for doubles (``max_range: 100``, ``bev_extent: [0, 80, -40, 40]``), as the node does."""
    if value is None:
        return f"{param.name} has no value (write one, or leave the line out for the default)"
    if param.type == "string" and isinstance(value, bool):  # YAML (and ROS's parser) read off / on / yes / no so
        return (f"{param.name} must be a string, got {value!r}: YAML reads off, on, yes and no as booleans; quote "
                f"the word ({param.name}: 'off', -p \"{param.name}:='off'\")")
    if param.type.endswith("[]"):
        if not isinstance(value, (list, tuple)):
            return f"{param.name} must be a list, got {value!r}"
        inner = Param(param.name, param.type[:-2], "", "")
        for item in value:
            reason = inner.check(item)
            if reason:
                return f"{param.name} must be a list of {param.type[:-2]}s, got {list(value)!r}"
        return None
    return param.check(value)


def unknown_message(name: str, known: Iterable[str]) -> str:
    import difflib

    hint = difflib.get_close_matches(name, list(known), n=1)
    return f"unknown parameter {name!r}" + (f" (did you mean {hint[0]!r}?)" if hint else "")


def check_values(values: Mapping[str, Any], source: str, model: Any = None) -> None:
    """ConfigError (one line naming ``source`` and the key) for the first unknown name or wrong-typed value in
    ``values`` against the parameters of a node running ``model``; rclpy's own parameters pass."""
    declared = {p.name: p for p in parameters(model)}
    for name, value in values.items():
        if is_ros_own(str(name)):
            continue
        param = declared.get(name)
        if param is None:
            raise ConfigError(f"{source}: {unknown_message(str(name), declared)}")
        reason = check_value(param, value)
        if reason:
            raise ConfigError(f"{source}: {reason}")


def _yaml_loader():
    """yaml.SafeLoader that also reads 1e-3 / 1.0e2 as numbers, as ROS's parameter parser does (PyYAML's YAML 1.1
    rules take them for strings, which would refuse max_range: 1e2)."""
    import re

    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_implicit_resolver("tag:yaml.org,2002:float",
                                 re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
                                 list("-+0123456789."))
    return Loader


def _load_yaml(text: str) -> Any:
    import yaml

    return yaml.load(text, Loader=_yaml_loader())  # noqa: S506 - a SafeLoader subclass


def _yaml_error_line(exc: Exception) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"line {mark.line + 1}: {problem}" if mark is not None else problem


def _applies(key: str, node_fqn: str) -> bool:
    """Does a parameter file's top-level key (``/**``, ``livox_detector``, ``/ns/*``) name the node ``node_fqn``?"""
    import fnmatch

    pattern = "/" + key.strip("/")
    if pattern == "/**":
        return True
    if fnmatch.fnmatchcase(node_fqn, pattern.replace("**", "*")):
        return True
    return "/" not in key.strip("/") and node_fqn.rsplit("/", 1)[-1] == key.strip("/")


def read_params_file(path: Any, node_fqn: str = "/livox_detector") -> dict[str, Any]:
    """The parameters a ROS 2 parameter file gives the node ``node_fqn`` (every section that names it, in file
    order), or ConfigError with one line: unreadable, not YAML, not a parameter file."""
    import yaml
    from pathlib import Path

    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"parameter file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read parameter file {path}: {exc}") from None
    try:
        data = _load_yaml(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"parameter file {path} is not valid YAML ({_yaml_error_line(exc)})") from None
    form = "a ROS 2 parameter file is '<node name or /**>: {ros__parameters: {name: value, ...}}'"
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: {form}")
    values: dict[str, Any] = {}
    for key, section in data.items():
        if not isinstance(section, dict) or set(section) != {"ros__parameters"} \
                or not isinstance(section["ros__parameters"], (dict, type(None))):
            raise ConfigError(f"{path}: section {key!r}: {form}")
        if _applies(str(key), node_fqn):
            values.update(_flatten(section["ros__parameters"] or {}))
    return values


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """ROS 2 parameter files nest dotted names (qos_overrides: {/x: ...} = qos_overrides./x...)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, name + "."))
        else:
            out[name] = v
    return out


def check_ros_arguments(argv: list[str]) -> None:
    """Check what ``--ros-args`` gives the node before it starts: every ``--params-file`` and ``-p NAME:=VALUE``
    against the parameter model (ConfigError, one line naming the file or flag and the key). Values for other
    nodes (``-p other_node:name:=v``, sections naming other nodes) are left to them."""
    import yaml

    files, overrides, node_name, namespace = [], {}, "livox_detector", "/"
    in_ros = False
    it = iter(range(len(argv)))
    for i in it:
        arg = argv[i]
        if arg == "--ros-args":
            in_ros = True
            continue
        if arg == "--":
            in_ros = False
            continue
        if not in_ros or i + 1 >= len(argv):
            continue
        nxt = argv[i + 1]
        if arg == "--params-file":
            files.append(nxt)
        elif arg in ("-p", "--param") and ":=" in nxt:
            name, text = nxt.split(":=", 1)
            if ":" not in name:
                try:
                    overrides[name] = _load_yaml(text) if text.strip() else text
                except yaml.YAMLError:
                    overrides[name] = text
        elif arg in ("-r", "--remap") and nxt.startswith(("__node:=", "__name:=")):
            node_name = nxt.split(":=", 1)[1]
        elif arg in ("-r", "--remap") and nxt.startswith("__ns:="):
            namespace = "/" + nxt.split(":=", 1)[1].strip("/")
        else:
            continue
        next(it, None)
    fqn = (namespace.rstrip("/") + "/" + node_name) if namespace != "/" else "/" + node_name
    given = [(path, read_params_file(path, fqn)) for path in files]
    model = overrides.get("model")
    for _, values in given:
        model = values.get("model", model) if "model" not in overrides else model
    model = model if isinstance(model, str) and model.strip() else None
    if model is not None and "model" in overrides:
        reason = BY_NAME["model"].check(model)
        if reason:
            raise ConfigError(f"-p model: {reason}")
    for path, values in given:
        check_values(values, str(path), model)
    check_values({k: v for k, v in overrides.items()}, "--ros-args -p", model)
