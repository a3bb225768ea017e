"""ROS-free detection pipeline: decode -> filter -> ground shift -> voxelize -> network -> boxes.

    pipe = DetectionPipeline(model="lite", sensor_height=1.8)
    det = pipe.detect(cloud_or_msg_or_array)   # -> Detections (boxes in the cloud's own frame)
    pipe.update(score_thresholds={"car": 0.4})  # cheap parameter changes at run time

`sensor_height` is how far the ground lies below the sensor origin (m). The network was trained on
clouds levelled and shifted so the ground is at z ~ 0; boxes come back in the input frame.
``sensor_height="auto"`` estimates the ground plane (height and tilt) from each cloud
(`livox_infer.ground.estimate_mount`) and takes the median over the last frames;
``sensor_tilt`` is estimated the same way by default ("auto"); (pitch_deg, roll_deg) gives a known
mounting tilt instead, None a level sensor.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from livox_infer.accumulate import point_ages
from livox_infer.cache import inductor_cache_dir
from livox_infer.errors import ConfigError, LivoxInferError, PointCloudError, WeightsError
from livox_infer.detector.boxes import axis_angle
from livox_infer.detector.config import ModelConfig
from livox_infer.ground import Mount, estimate_mount, level_points, median_mount, unlevel_boxes
from livox_infer.detector.calibration import calibrate_scores, calibration_tables
from livox_infer.detector.postprocess import build_inference_model, select_detections, select_detections_and_candidates
from livox_infer.detector.precision import resolve_precision
from livox_infer.detector.refine import stage2_points
from livox_infer.decode.pointcloud import (
    DEFAULT_MAX_POINTS,
    Cloud,
    DecodeFilter,
    check_max_points,
    decode_pointcloud2,
    filter_points,
    limit_points,
)
from livox_infer.params import DEFAULTS, DEVICES, parse_sensor_height
from livox_infer.startup import StartupLog
from livox_infer.voxelize import Voxelizer
from livox_infer.voxelize.voxelizer import resolve_device

log = logging.getLogger(__name__)

DEFAULT_SENSOR_HEIGHT = DEFAULTS["sensor_height"]
AUTO_HEIGHT_WINDOW = 15  # frames whose estimates are median-smoothed in "auto" mode
STAGES = ("decode", "ground", "voxelize", "network", "refine", "postprocess", "total")


@dataclass
class Detections:
    """Boxes (M, 7) f32 [x, y, z, l, w, h, yaw] in the input cloud's frame (yaw = box axis modulo pi, in
    [-pi/2, pi/2): front and back are not distinguished), labels (M,) int64 into
    `class_names`, scores (M,) f32, label_names (M,) class name per box, timings_ms per stage
    (decode, ground (ground-plane estimate in "auto" mode), voxelize, network, postprocess, total)."""

    boxes: np.ndarray
    labels: np.ndarray
    scores: np.ndarray
    label_names: list[str]
    timings_ms: dict[str, float]
    class_names: tuple[str, ...] = ()
    stamp_ns: int = 0
    frame_id: str = ""
    sensor_height: float = float("nan")  # the value used for this frame (estimated in "auto" mode)
    sensor_tilt_deg: float = 0.0  # tilt of the ground plane used for this frame (0 = level)
    # the ground's height below the sensor as the clouds show it (median of the last estimates, also where
    # sensor_height is a fixed number and the tilt is estimated); NaN where nothing is estimated (height and tilt both
    # fixed) or no cloud showed enough ground. Far from sensor_height: a wrong mount (`ground.mount_mismatch`)
    ground_height_seen: float = float("nan")
    num_points: int = 0  # points that reached the voxelizer (after filters)
    points_over_budget: int = 0  # points dropped to keep the frame within max_points (0: within budget)
    # with ``candidate_score``: the boxes that scored in [candidate_score, their class's threshold) and survive the NMS
    # after the detections (`select_detections_and_candidates`), (N, 7) f32 / (N,) int64 / (N,) f32 as above; not
    # detections (which they never change): the tracker may continue a confirmed track with one
    candidate_boxes: np.ndarray | None = None
    candidate_labels: np.ndarray | None = None
    candidate_scores: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.boxes.shape[0])

    def to_dicts(self) -> list[dict[str, Any]]:
        keys = ("x", "y", "z", "l", "w", "h", "yaw")
        return [
            {"label": name, "score": round(float(s), 4), **{k: round(float(v), 4) for k, v in zip(keys, box)}}
            for name, s, box in zip(self.label_names, self.scores, self.boxes)
        ]


def synthetic_frame(grid: Any) -> np.ndarray:
    """A fixed levelled frame (ground at z = 0, a car-sized block of points on it) inside ``grid``'s region:
    the known input a new pipeline is checked with before it is used (`DetectionPipeline.self_test`)."""
    (x0, x1), (y0, y1) = grid.x_range, grid.y_range
    gx, gy = np.meshgrid(np.linspace(x0 + 1, x1 - 1, 64), np.linspace(y0 + 1, y1 - 1, 64))
    ground = np.c_[gx.ravel(), gy.ravel(), np.zeros(gx.size)]
    cx, cy = x0 + 0.3 * (x1 - x0), 0.5 * (y0 + y1)
    bx, by, bz = np.meshgrid(np.linspace(-2, 2, 16), np.linspace(-0.9, 0.9, 8), np.linspace(0.2, 1.5, 6))
    car = np.c_[bx.ravel() + cx, by.ravel() + cy, bz.ravel()]
    pts = np.r_[ground, car]
    return np.c_[pts, np.full(len(pts), 0.3 * grid.intensity_scale)].astype(np.float32)


def _as_cloud(x: Any, filters: DecodeFilter) -> Cloud:
    """Accept a PointCloud2-shaped message, a Cloud, or an (N, 4) array / tensor; apply the filters."""
    if isinstance(x, Cloud):
        pts, t, tag = filter_points(x.points, x.time, x.tag, filters)
        return Cloud(pts, t, tag, x.stamp_ns, x.frame_id)
    if isinstance(x, torch.Tensor):
        x = x.detach().to("cpu").numpy()
    if isinstance(x, np.ndarray):
        if x.ndim != 2 or x.shape[1] != 4:
            raise PointCloudError(f"points must have shape (N, 4) [x, y, z, intensity], got {x.shape}")
        if not np.issubdtype(x.dtype, np.number) or np.iscomplexobj(x):
            raise PointCloudError(f"points must be real numbers, got dtype {x.dtype}")
        pts, _, _ = filter_points(x.astype(np.float32, copy=False), None, None, filters)
        return Cloud(pts)
    if hasattr(x, "fields") and hasattr(x, "data"):
        return decode_pointcloud2(x, filters=filters)
    raise PointCloudError(
        f"cannot detect on a {type(x).__name__}: pass a PointCloud2 message, a Cloud or an (N, 4) array"
    )


class DetectionPipeline:
    """The whole ROS-free detector. See the module docstring; parameters:

    model: "lite" | "full" | path to a model YAML | a ModelConfig.
    weights: safetensors file; default the config's ``weights`` next to it (WeightsError if missing).
    device: "auto" | "cpu" | "cuda" ("cuda" without a GPU raises BackendError).
    compile: torch.compile the network + top-k decoding (static shapes, channels_last); falls back
        to eager with one warning if compilation fails. On CUDA, ``cuda_graphs`` uses mode="reduce-overhead".
    sensor_height: metres the ground lies below the sensor (livox_infer.params.SENSOR_HEIGHT_RANGE), or "auto"
        (estimated per cloud, smoothed).
    sensor_tilt: "auto" (default: ground-plane tilt estimated per cloud, also with a numeric
        sensor_height), None or (0, 0) (level), or (pitch_deg, roll_deg) of the sensor relative to
        the ground (pitch positive = nose down).
    intensity_scale: the sensor's full-scale intensity (255 for Livox reflectivity, 1.0 for 0-1 clouds);
        default: the model config's.
    score_thresholds: float, {class: float} or per-class sequence; default: the config's.
    roi: (x_min, y_min, z_min, x_max, y_max, z_max) crop in the cloud's frame, or None.
    tag_filter: Livox tag filter "off" | "high_confidence" | "strict" (clouds without tags unaffected).
    max_range / min_range: euclidean range window (m) or None.
    max_points: point budget (`livox_infer.decode.pointcloud.DEFAULT_MAX_POINTS`, range ``MAX_POINTS_RANGE``): a
        filtered cloud with more points is thinned deterministically to this many (evenly spaced in
        message order) before any later stage; ``Detections.points_over_budget`` says how many were dropped.
    nms_iou, max_detections: override the config's NMS parameters.
    aoti_package: an AOTInductor package from `livox-infer export` (network + decoding compiled ahead of
        time, weights inside): used instead of torch.compile / the weights file, so the machine needs
        no compiler. Must match the model config (checked); ``weights``, if also given, must be the file
        it was exported from. None (default) with ``compile`` on a CPU: the package built for this machine
        (`make package`, `livox-infer export --install`) when one matches the config, grid, weights, threads,
        CPU and torch version (`livox_infer.detector.aoti.find_package`), else torch.compile; the start-up
        summary says which and why. False: never a package.
    build_package: with ``compile`` on a CPU and no package built for this machine: detect eagerly at once, build
        the package in a background child process at the lowest CPU priority (`livox_infer.detector.package_build`)
        and switch to it between two frames once it is built (every later start loads it). False: torch.compile
        now (see ``compile_in_background``).
    compile_in_background: with ``compile`` on a CPU where torch.compile runs (no package, no background package
        build): detect eagerly at once while a thread compiles the network and stage 2's parts, or loads what an
        earlier start saved (`livox_infer.detector.precompiled`), and switch to them between two frames once they
        are ready (the node's default: it is never blind for the 5-8 s of a warm start or the ~45 s of a cold one).
        False (the offline commands' setting): compile before the first detection, so every frame runs compiled.
    test_time_flip: run the network on the frame and its mirror image (y -> -y) and average the
        head maps: a little more accurate, ~2x network time (docs/detector.md).
    refine: run stage 2 (point-based refinement of the best candidates, `livox_infer.detector.refine`) when
        the model has one; False skips it (faster, less accurate). Changes at run time.
    candidate_score: also return the boxes scoring in [this, their class's threshold) that survive the NMS after the
        detections, as ``Detections.candidate_*`` (the tracker continues confirmed tracks with them; the detections
        are the same as without); None (default): none.
    precision: stage 1's backbone and neck in "fp32" or "bf16" (autocast; the head stays fp32); "auto" (default):
        bf16 on a CPU with AMX, else fp32 (`livox_infer.detector.precision`). ``self.precision`` is the one used.
    """

    def __init__(
        self,
        model: str | Path | ModelConfig = DEFAULTS["model"],
        weights: str | Path | None = None,
        device: str = DEFAULTS["device"],
        compile: bool = DEFAULTS["use_compile"],  # noqa: A002 - the user-facing name
        sensor_height: float | str = DEFAULT_SENSOR_HEIGHT,
        sensor_tilt: Any = "auto",
        intensity_scale: float | None = None,
        score_thresholds: Any = None,
        roi: Any = None,
        tag_filter: str = DEFAULTS["tag_filter"],
        max_range: float | None = None,
        min_range: float | None = None,
        nms_iou: Any = None,
        max_detections: int | None = None,
        max_points: int = DEFAULTS["max_points"],
        cuda_graphs: bool = True,
        aoti_package: str | Path | None = None,
        test_time_flip: bool = DEFAULTS["test_time_flip"],
        refine: bool = DEFAULTS["refine"],
        bev_extent: Any = None,
        candidate_score: float | None = None,
        build_package: bool = False,
        precision: str = DEFAULTS["precision"],
        compile_in_background: bool = False,
    ) -> None:
        self._params: dict[str, Any] = {}
        self._net_params = dict(model=model, weights=weights, device=device, compile=compile, cuda_graphs=cuda_graphs,
                                aoti_package=aoti_package, test_time_flip=bool(test_time_flip),
                                bev_extent=None if bev_extent is None else tuple(bev_extent),
                                build_package=bool(build_package), precision=precision,
                                compile_in_background=bool(compile_in_background))
        self._package_build = None  # PackageBuild while the package is being built in the background
        self._background: _BackgroundCompile | None = None  # torch.compile running in a thread (compile_in_background)
        self._background_pending = False  # the network built eager, its background compile not started yet
        self.package_build_error: str | None = None  # why the background build gave no package
        # the last ground estimates (estimated heights also where sensor_height is fixed: `ground_height_seen`)
        self._mount_history: collections.deque[Mount] = collections.deque(maxlen=AUTO_HEIGHT_WINDOW)
        self._build_network()
        self.update(
            sensor_height=sensor_height, sensor_tilt=sensor_tilt, intensity_scale=intensity_scale, score_thresholds=score_thresholds,
            roi=roi, tag_filter=tag_filter, max_range=max_range, min_range=min_range, nms_iou=nms_iou,
            max_detections=max_detections, refine=refine, max_points=max_points, candidate_score=candidate_score,
        )
        self.self_test()
        self._start_background_compile()

    # -- construction --------------------------------------------------------------------------
    def _build_network(self) -> None:
        p = self._net_params
        self._stop_package_build()  # a build for the settings before a rebuild is not needed any more
        self._background, self._background_pending = None, False  # a compile for the old settings: its result unused
        self.startup = StartupLog()  # phases of this build, for the log and the node's start-up line
        self._fields: dict[str, str] | None = None  # what a package or saved compile must match (aoti.package_fields)
        self.cfg = p["model"] if isinstance(p["model"], ModelConfig) else ModelConfig.load(p["model"])
        if p.get("bev_extent") is not None:  # same weights on a per-sensor grid (the network is convolutional)
            self.cfg = self.cfg.with_extent(p["bev_extent"])
        dev = p["device"]
        if dev not in DEVICES and not str(dev).startswith("cuda:"):
            raise ConfigError(f"device must be 'auto', 'cpu' or 'cuda', got {dev!r}")
        self.device = resolve_device(dev)  # BackendError for cuda without a GPU
        self.precision = resolve_precision(p["precision"], self.device)  # of stage 1's backbone and neck
        self._calibration = (calibration_tables(self.cfg.score_calibration, self.device)
                             if self.cfg.score_calibration else None)
        self.network_backend = "eager"
        self._input = torch.zeros((1, *self.cfg.grid.shape), device=self.device).contiguous(
            memory_format=torch.channels_last
        )
        inductor_cache_dir()  # before anything is compiled or loaded: the one cache folder (livox_infer/cache.py)
        if p.get("aoti_package"):
            with self.startup.phase("aoti package"):
                self._load_package(Path(p["aoti_package"]))
            log.info("pipeline ready: %s", self.startup.summary())
            return
        weights = Path(p["weights"]) if p["weights"] else self.cfg.weights_path()
        no_package = ""  # why no package was loaded (torch.compile or the background build follows)
        if p["compile"] and self.device.type == "cpu" and p.get("aoti_package") is None:
            no_package = self._cached_package(weights)
            if not no_package:
                log.info("pipeline ready: %s", self.startup.summary())
                return
        with self.startup.phase("weights"):
            self._use_eager(weights)
        self.compile_error: str | None = None
        if no_package and p.get("build_package") and self._start_package_build(weights, no_package):
            pass  # eager until the package is built (detect() switches to it)
        elif p["compile"]:
            if no_package:
                self.startup.notes.append(f"torch.compile, since {no_package}")
            if p.get("compile_in_background") and self.device.type == "cpu":
                self._background_pending = True  # started once the pipeline is checked (`_start_background_compile`)
                self.startup.notes.append("eager until torch.compile is ready in the background")
            else:
                with self.startup.phase("compile"), self.startup.inductor_cache():
                    self._compile(self._eager)
        log.info("pipeline ready: %s", self.startup.summary())

    def _start_package_build(self, weights: Path, why: str) -> bool:
        """Start building the package for this machine in the background (True), noting it in the start-up summary;
        False (with the reason noted) when it cannot be built from here, so torch.compile runs instead."""
        from livox_infer.cache import packages_dir
        from livox_infer.detector import package_build
        from livox_infer.detector.aoti import package_fields, package_name

        source, extent = self.cfg.source, self._net_params.get("bev_extent")
        try:
            same = bool(source) and (ModelConfig.load(source) if extent is None else
                                     ModelConfig.load(source).with_extent(extent)).architecture_hash() == \
                self.cfg.architecture_hash()
            if not same:
                self.startup.notes.append("no background package build (the model config is not a file as given)")
                return False
            target = packages_dir() / package_name(package_fields(self.cfg, weights, self.device,
                                                                  self._net_params["test_time_flip"], self.precision))
            command = package_build.export_command(source, weights.resolve(), torch.get_num_threads(), extent,
                                                   self._net_params["test_time_flip"], self.precision)
            self._package_build = package_build.PackageBuild(command, target)
        except (OSError, LivoxInferError) as exc:
            self.startup.notes.append(f"no background package build ({type(exc).__name__}: {exc})")
            return False
        self.startup.notes.append(f"eager until the AOTInductor package being built in the background is ready "
                                  f"(pid {self._package_build.pid}), since {why}")
        return True

    def _stop_package_build(self) -> None:
        build, self._package_build = getattr(self, "_package_build", None), None
        if build is not None:
            build.stop()

    @property
    def package_build_state(self) -> str | None:
        """While the package is built in the background: what, by which process, for how long; else None."""
        build = self._package_build
        if build is None:
            return None
        return f"building {build.package.name} in the background ({build.elapsed_s():.0f} s, log {build.log_path})"

    def close(self) -> None:
        """Stop a background package build (it also ends with this process); a background compile's result is
        dropped (its daemon thread ends with its compile)."""
        self._stop_package_build()
        self._background = None

    def _adopt_built_package(self) -> None:
        """Between two frames: switch to the package once the background build has made it (one log line either way)."""
        build = self._package_build
        state = build.poll()
        if state is None:
            return
        self._package_build = None
        if state:
            self.package_build_error = state
            log.warning("the AOTInductor package was not built in the background (%s; log %s): the network stays "
                        "eager", state, build.log_path)
            self.startup.notes.append(f"background package build failed: {state}")
            return
        weights = self.weights_file
        try:
            t0 = time.perf_counter()
            self._load_package(build.package, weights)
            self.self_test()
        except Exception as exc:  # noqa: BLE001 - whatever stops the package: keep the eager network
            self.package_build_error = f"{type(exc).__name__}: {exc}"
            log.warning("the AOTInductor package built in the background did not load (%s): the network stays eager",
                        self.package_build_error)
            self._use_eager(weights)
            return
        note = (f"switched to the AOTInductor package {build.package.name} built in the background, "
                f"{build.elapsed_s():.0f} s after start-up (loaded in {time.perf_counter() - t0:.1f} s)")
        self.startup.notes.append(note)
        log.info("%s", note)

    def _use_eager(self, weights: Path) -> None:
        """Run the eager network of ``weights`` (built at start-up, or again when a package built later fails)."""
        infer, self.weights_meta = build_inference_model(self.cfg, weights, self.device,
                                                         self._net_params["test_time_flip"], self.precision)
        self.weights_file = weights
        self._stage2 = infer.net if self.cfg.refine else None  # the detector module runs its own stage 2
        self._eager = self._runner = infer
        self.compiled = False
        self.network_backend = "eager"

    def _cached_package(self, weights: Path) -> str:
        """Load the package built for this machine, config, grid and weights (""), or say why none is used (torch.compile
        or the background build follows). A loaded package is noted in the start-up summary (the ready line)."""
        from livox_infer.detector.aoti import find_package, package_fields

        try:
            with self.startup.phase("package lookup"):
                fields = self._fields = package_fields(self.cfg, weights, self.device,
                                                       self._net_params["test_time_flip"], self.precision)
                path, why = find_package(fields)
        except (OSError, LivoxInferError) as exc:
            path, why = None, f"no package lookup ({type(exc).__name__}: {exc})"
        if path is not None:
            try:
                with self.startup.phase("aoti package"):
                    self._load_package(path, weights)
                self.startup.notes.append(f"AOTInductor package {path.name} (built for this machine)")
                return ""
            except Exception as exc:  # noqa: BLE001 - whatever stops the package: torch.compile instead
                why = f"the package {path} built for this machine did not load ({type(exc).__name__}: {exc})"
        return why

    def _load_package(self, path: Path, weights: Path | None = None) -> None:
        from livox_infer.detector.aoti import AotiRunner, file_sha256

        runner = AotiRunner(path, self.cfg, self.device, self._net_params["test_time_flip"],
                            None if self._net_params["precision"] == "auto" else self.precision)
        self.precision = runner.metadata.get("precision", "fp32")
        weights = weights or self._net_params["weights"]
        if weights and file_sha256(weights) != runner.metadata.get("weights_sha256"):
            raise WeightsError(f"{path} was not exported from {weights} (weights differ); export it again or drop weights")
        self.weights_meta = {k: v for k, v in runner.metadata.items() if k in ("trained", "weights_file", "weights_sha256")}
        self.weights_file = path
        self._stage2 = None
        if self.cfg.refine:  # stage 2 runs eagerly from the weights file the package was exported from
            from livox_infer.detector.network import build_model
            from livox_infer.detector.weights import load_weights

            source = Path(weights) if weights else self.cfg.weights_path()
            if file_sha256(source) != runner.metadata.get("weights_sha256"):
                raise WeightsError(f"{path} was not exported from {source}, which holds this model's stage-2 refiner; "
                                   "pass weights=<the file it was exported from>")
            net = build_model(self.cfg)
            load_weights(net, self.cfg, source)
            self._stage2 = net.to(self.device).eval()
            self._stage2.compiled_refiner = runner.stage2  # the package's compiled stage-2 parts, if it has them
            if runner.stage2 is not None:
                runner.stage2.eager_refiner = self._stage2.refiner
            self._stage2.compiled_refiner_large = runner.stage2_large  # refine_large's compiled pass (format v4)
            if runner.stage2_large is not None:
                runner.stage2_large.eager_refiner = self._stage2.refiner_large
        self._eager = None
        self._runner = runner
        self.compiled = True
        self.compile_error = None
        self.network_backend = "aoti"
        with torch.no_grad():
            runner(self._input)  # warm-up: first call allocates

    def _compile(self, infer: torch.nn.Module) -> None:
        mode = "reduce-overhead" if self.device.type == "cuda" and self._net_params["cuda_graphs"] else None
        try:
            # No inductor freezing: frozen weights pre-packed for oneDNN are mkldnn tensors, which the FX graph cache
            # cannot pickle, and freezing turns the AOT autograd cache off, so every start re-traced and re-lowered
            # the network ("inductor graph cache bypassed"). Without it a second start loads both from the cache
            # (docs/performance.md, Start-up). Freezing + pre-packing is kept for the AOTInductor package, which is
            # compiled once per machine (livox_infer/tools/export.py).
            if self.device.type == "cpu":  # a restart loads what this start compiles (detector/precompiled.py)
                compiled = self._compile_saved(infer, (self._input,), "network")
            else:
                compiled = torch.compile(infer, dynamic=False, fullgraph=True, mode=mode)
                with torch.no_grad():
                    for _ in range(3 if mode else 1):  # warm-up: compile (and record the CUDA graph) now
                        compiled(self._input)
            self._runner = compiled
            self.compiled = True
            self.network_backend = "compiled"
        except Exception as exc:  # noqa: BLE001 - any compiler failure: keep running eagerly
            self.compile_error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            log.warning("torch.compile failed, running the network eagerly: %s", self.compile_error)
            self._runner = self._eager
            return
        if self._stage2 is not None and self.device.type == "cpu":
            self._compile_refiner()

    def _compile_saved(self, fn: Any, example_args: tuple, part: str, dynamic: bool = False,
                       notes: list[str] | None = None) -> Any:
        """torch.compile ``fn`` (run once on ``example_args``), or load what an earlier start compiled for the same
        settings, weights and code; which of the two it was goes into ``notes`` (default: the start-up summary)."""
        from livox_infer.detector.precompiled import compile_saved

        with torch.no_grad():
            compiled, how = compile_saved(fn, example_args, part, self._match_fields(), dynamic=dynamic)
        (self.startup.notes if notes is None else notes).append(f"{part} {how}")
        return compiled

    def _match_fields(self) -> dict[str, str]:
        """What a package or saved compile of this network must match (`aoti.package_fields`), computed once."""
        if self._fields is None:
            from livox_infer.detector.aoti import package_fields

            self._fields = package_fields(self.cfg, self.weights_file, self.device, self._net_params["test_time_flip"],
                                          self.precision)
        return self._fields

    def _compile_refiner(self) -> None:
        """Stage 2's costly parts compiled too (on the CPU, where they are a third of a frame; issue 33). They
        compile when `self_test` warms them up; any failure there leaves them eager with one warning."""
        try:
            self._stage2.compile_refiner()
        except Exception as exc:  # noqa: BLE001 - any compiler failure: stage 2 runs eagerly
            self._refiner_compile_failed(exc)

    def _refiner_compile_failed(self, exc: Exception, running: bool = True) -> None:
        """Stage 2 runs eagerly (``running``: the pipeline's compiled parts are dropped; else they were never used)."""
        if running:
            self._stage2.compiled_refiner = None
        log.warning("torch.compile of stage 2 failed, running it eagerly: %s: %s", type(exc).__name__,
                    str(exc).splitlines()[0] if str(exc) else "")

    def _warm_up_refiner(self, points: torch.Tensor, boxes: torch.Tensor, compiled: Any = None,
                         notes: list[str] | None = None) -> bool:
        """Compile stage 2's parts now, not on the first real frame: its point features compile at their first
        call with at least `refine.points` points near the boxes. ``compiled``: the `CompiledRefiner` to fill
        (default the running stage 2's). False when that failed (logged; stage 2 then runs eagerly)."""
        from livox_infer.detector.refine import refiner_example_inputs, sampled_features

        rc, compiled = self.cfg.refine, compiled or self._stage2.compiled_refiner
        try:
            n = max(rc.points, 256)
            features_args = (points[:n].float(), torch.arange(n, device=self.device), boxes[: rc.rois].float(),
                             rc.points, rc.margin, self.grid.intensity_scale)
            refiner_args = refiner_example_inputs(rc, self.cfg.num_classes, self.device)
            if self.device.type == "cpu":  # saved for the next start, like the network
                compiled.features = self._compile_saved(sampled_features, features_args, "stage2_features", dynamic=True,
                                                        notes=notes)
                compiled.refiner = self._compile_saved(self._stage2.refiner, refiner_args, "stage2_refiner",
                                                       notes=notes)
            else:
                compiled.features(*features_args)
                compiled.refiner(*refiner_args)
        except Exception as exc:  # noqa: BLE001 - any compiler failure: stage 2 runs eagerly
            self._refiner_compile_failed(exc, running=notes is None)  # in the background it is eager already
            return False
        return True

    # -- torch.compile in the background (compile_in_background) ------------------------------------
    def _start_background_compile(self) -> None:
        if not self._background_pending:
            return
        self._background_pending = False
        self._match_fields()  # computed here, so the thread only reads it
        self._background = _BackgroundCompile(self._compile_detached)

    def _compile_detached(self, notes: list[str]) -> tuple[Any, Any]:
        """The background thread's work: (the compiled network, stage 2's compiled parts or None), each compiled or
        loaded as `_compile` and `_warm_up_refiner` do, on inputs of its own (``detect`` fills ``self._input``
        meanwhile); nothing the running pipeline uses is touched until `_adopt_compiled` takes them."""
        from livox_infer.detector.refine import CompiledRefiner

        example = torch.zeros_like(self._input)
        network = self._compile_saved(self._eager, (example,), "network", notes=notes)
        if self._stage2 is None:
            return network, None
        refiner = CompiledRefiner(self._stage2.refiner, self.cfg.refine)
        with torch.no_grad():
            _, _, boxes = network(example)
        points = torch.from_numpy(synthetic_frame(self.grid)).to(self.device)
        if not self._warm_up_refiner(points, boxes, refiner, notes):
            refiner = None  # its compile failed (logged): stage 2 stays eager
        return network, refiner

    def _adopt_compiled(self) -> None:
        """Between two frames: run what the background thread compiled once it is done (one log line either way)."""
        job = self._background
        if job.thread.is_alive():
            return
        self._background = None
        if job.error is not None:
            self.compile_error = job.error
            log.warning("torch.compile in the background failed, the network stays eager: %s", job.error)
            self.startup.notes.append(f"torch.compile in the background failed: {job.error}")
            return
        network, refiner = job.result
        self._runner = network
        if self._stage2 is not None:
            self._stage2.compiled_refiner = refiner
        self.compiled = True
        self.network_backend = "compiled"
        note = (f"switched to torch.compile, ready {job.elapsed_s:.1f} s after the eager start "
                f"({', '.join(job.notes)})")
        self.startup.notes.append(note)
        log.info("%s", note)

    @property
    def background_compile_state(self) -> str | None:
        """While torch.compile runs in the background: for how long; else None."""
        job = self._background
        if job is None:
            return "torch.compile to start in the background" if self._background_pending else None
        return f"torch.compile in the background ({time.monotonic() - job.started:.0f} s)"

    def wait_compiled(self, timeout: float | None = None) -> bool:
        """Wait for a background compile (benchmarks, tests) and switch to it now; True when the network runs
        compiled."""
        job = self._background
        if job is not None:
            job.thread.join(timeout)
            self._adopt_compiled()
        return self.compiled

    # -- parameters ----------------------------------------------------------------------------
    def update(self, **params: Any) -> None:
        """Change parameters at run time. model/weights/device/compile/cuda_graphs rebuild the network;
        intensity_scale rebuilds the voxelizer; everything else is immediate."""
        net_keys = {"model", "weights", "device", "compile", "cuda_graphs", "aoti_package", "test_time_flip", "bev_extent",
                    "build_package", "precision", "compile_in_background"}
        all_keys = net_keys | {
            "sensor_height", "sensor_tilt", "intensity_scale", "score_thresholds", "roi", "tag_filter", "max_range",
            "min_range", "nms_iou", "max_detections", "refine", "max_points", "candidate_score",
        }
        unknown = sorted(set(params) - all_keys)
        if unknown:
            raise ConfigError(f"unknown pipeline parameters {unknown}; known: {sorted(all_keys)}")
        rebuild_net = any(k in params and params[k] != self._net_params.get(k) for k in net_keys)
        for k in net_keys & set(params):
            self._net_params[k] = params[k]
        if rebuild_net:
            self._build_network()
        new = {**self._params, **{k: v for k, v in params.items() if k not in net_keys}}
        classes = self.cfg.classes

        # sensor height
        sh = new.get("sensor_height")
        sh = parse_sensor_height(DEFAULT_SENSOR_HEIGHT if sh is None else sh)  # the node's range (params.py)
        tilt = new.get("sensor_tilt")
        if tilt is not None and tilt != "auto":
            try:
                pitch, roll = (float(v) for v in tilt)
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"sensor_tilt must be None, 'auto' or (pitch_deg, roll_deg), got {tilt!r}") from exc
            if not (abs(pitch) <= 45 and abs(roll) <= 45):
                raise ConfigError(f"sensor_tilt angles must be within +-45 deg, got {tilt!r}")
            tilt = (pitch, roll)
        if sh != self._params.get("sensor_height") or tilt != self._params.get("sensor_tilt"):
            self._mount_history.clear()
        new["sensor_height"] = sh
        new["sensor_tilt"] = tilt

        # intensity scale -> the voxelizer's grid
        iscale = new.get("intensity_scale")
        iscale = self.cfg.grid.intensity_scale if iscale is None else iscale
        if isinstance(iscale, bool) or not isinstance(iscale, (int, float)) or not (math.isfinite(iscale) and iscale > 0):
            raise ConfigError(f"intensity_scale must be a positive number, got {iscale!r}")
        grid = dataclasses.replace(self.cfg.grid, intensity_scale=float(iscale))
        if rebuild_net or getattr(self, "grid", None) != grid:
            self.grid = grid
            self.voxelizer = Voxelizer(grid, self.device)
        if rebuild_net:  # a new network is checked before it is used
            self.self_test()

        new["score_thresholds"] = self._per_class(new.get("score_thresholds"), self.cfg.score_thresholds, "score_thresholds")
        new["nms_iou"] = self._per_class(new.get("nms_iou"), self.cfg.nms_iou, "nms_iou")
        md = new.get("max_detections")
        md = self.cfg.max_detections if md is None else md
        if isinstance(md, bool) or not isinstance(md, int) or md < 1:
            raise ConfigError(f"max_detections must be a positive integer, got {md!r}")
        new["max_detections"] = md
        refine = new.get("refine", True)
        if not isinstance(refine, bool):
            raise ConfigError(f"refine must be true or false, got {refine!r}")
        new["refine"] = refine
        cand = new.get("candidate_score")
        if cand is not None and (isinstance(cand, bool) or not isinstance(cand, (int, float)) or not 0.0 <= cand <= 1.0):
            raise ConfigError(f"candidate_score must be None or a score in [0, 1], got {cand!r}")
        new["candidate_score"] = None if cand is None else float(cand)
        mp = new.get("max_points")
        new["max_points"] = check_max_points(DEFAULT_MAX_POINTS if mp is None else mp)
        self.filters = DecodeFilter.from_roi(
            new.get("roi"), tag_filter=new.get("tag_filter") or "off",
            max_range=new.get("max_range"), min_range=new.get("min_range"),
        )
        self._params = new
        self.classes = classes
        if rebuild_net:
            self._start_background_compile()

    def _per_class(self, value: Any, default: tuple[float, ...], name: str) -> tuple[float, ...]:
        classes = self.cfg.classes
        if value is None:
            return tuple(default)
        if isinstance(value, dict):
            unknown = sorted(set(value) - set(classes))
            if unknown:
                raise ConfigError(f"{name}: unknown classes {unknown}; classes are {list(classes)}")
            out = tuple(float(value.get(c, d)) for c, d in zip(classes, default))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out = (float(value),) * len(classes)
        else:
            try:
                out = tuple(float(v) for v in value)
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"{name} must be a number, a {{class: number}} mapping or a list") from exc
            if len(out) != len(classes):
                raise ConfigError(f"{name} needs {len(classes)} values ({list(classes)}), got {len(out)}")
        if any(not 0.0 <= v <= 1.0 for v in out):
            raise ConfigError(f"{name} values must lie in [0, 1], got {value!r}")
        return out

    @property
    def params(self) -> dict[str, Any]:
        return {**self._net_params, **self._params}

    # -- running -------------------------------------------------------------------------------
    @torch.no_grad()
    def self_test(self) -> None:
        """Run `synthetic_frame` through voxelizer, network and stage 2: WeightsError when any output is not
        finite (weights that pass every file check but still compute garbage are refused before use)."""
        points = torch.from_numpy(synthetic_frame(self.grid)).to(self.device)
        self._input.copy_(self.voxelizer(points)[None])
        scores, labels, boxes = self._runner(self._input)
        if self._stage2 is not None:
            with contextlib.ExitStack() as timed:
                if self._stage2.compiled_refiner is not None and self.network_backend != "aoti":  # compile them now
                    timed.enter_context(self.startup.phase("stage-2 compile"))
                    timed.enter_context(self.startup.inductor_cache())
                    self._warm_up_refiner(points, boxes)
                scores, labels, boxes = self._stage2.refine(points, scores, labels, boxes, self.grid.intensity_scale)
        if not (torch.isfinite(scores.float()).all() and torch.isfinite(boxes.float()).all()):
            raise WeightsError(f"cannot load {self.weights_file}: the network gives non-finite outputs on a "
                               "known synthetic frame")

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def reset_ground(self) -> None:
        """Forget the ground estimates of earlier clouds ("auto" mode smooths over them): the next cloud
        is an independent scene (evaluation over unrelated scans, a new bag)."""
        self._mount_history.clear()

    def current_mount(self, points: np.ndarray) -> Mount:
        """The ground plane to level this cloud with (fixed, or estimated and median-smoothed)."""
        sh, tilt = self._params["sensor_height"], self._params["sensor_tilt"]
        tilt_auto = tilt == "auto"
        if not tilt_auto:
            fixed = Mount.from_pitch_roll(0.0, *(tilt or (0.0, 0.0)))
            if sh != "auto":
                return Mount(float(sh), fixed.up)
            est = estimate_mount(level_points(points, fixed), fit_tilt=False)
            if est is not None:
                self._mount_history.append(Mount(est.height, fixed.up))
        else:
            est = estimate_mount(points, fit_tilt=True)
            if est is not None:
                self._mount_history.append(est)
        if self._mount_history:  # (median per component: a fixed height replaces the estimated ones' median)
            smoothed = median_mount(list(self._mount_history))
            return smoothed if sh == "auto" else Mount(float(sh), smoothed.up)
        return Mount(DEFAULT_SENSOR_HEIGHT if sh == "auto" else float(sh))

    @property
    def ground_height_seen(self) -> float:
        """Median of the last ground estimates (`Detections.ground_height_seen`); NaN without one."""
        return float(np.median([m.height for m in self._mount_history])) if self._mount_history else float("nan")

    @torch.no_grad()
    def detect(self, x: Any) -> Detections:
        if self._package_build is not None:  # built in the background: use it from this frame on
            self._adopt_built_package()
        if self._background is not None:  # compiled in the background: the same
            self._adopt_compiled()
        t0 = time.perf_counter()
        cloud, over_budget = limit_points(_as_cloud(x, self.filters), self._params["max_points"])
        t1 = time.perf_counter()
        mount = self.current_mount(cloud.points)
        t_ground = time.perf_counter()
        # level + shift so the ground is at z ~ 0 (a copy: the caller's array is untouched)
        levelled = level_points(torch.from_numpy(cloud.points).to(self.device), mount)
        ages = point_ages(cloud)
        if self.grid.age_channel_s is not None:  # the fourth column carries the point age (stacked frames)
            levelled[:, 3] = 0.0 if ages is None else torch.from_numpy(ages).to(self.device)
        elif not self.cfg.use_intensity:  # the detector was trained not to rely on a sensor's intensity scale
            levelled[:, 3] = 0.0
        bev = self.voxelizer(levelled)
        self._input.copy_(bev[None])
        self._sync()
        t2 = time.perf_counter()
        scores, labels, boxes = self._runner(self._input)
        self._sync()
        t3 = time.perf_counter()
        p = self._params
        if self._stage2 is not None and p["refine"]:
            points = stage2_points(levelled, ages, self.grid.age_channel_s is not None)  # the newest frame
            scores, labels, boxes = self._stage2.refine(points, scores, labels, boxes, self.grid.intensity_scale,
                                                        sensor_height=mount.height)
            self._sync()
        t_refine = time.perf_counter()
        if self._calibration is not None:  # scores -> share of such boxes that are right (detector/calibration.py)
            scores = calibrate_scores(scores.float(), labels, self._calibration)
        candidates = None
        paired = getattr(self._runner, "paired_area", None)  # a package's compiled NMS part, if it has one
        if p["candidate_score"] is None:
            scores, labels, boxes = select_detections(
                scores.float(), labels, boxes.float(), p["score_thresholds"], p["nms_iou"], p["max_detections"],
                self.cfg.cross_class_iou, paired,
            )
        else:  # the same detections, and the boxes just below the thresholds for the tracker
            (scores, labels, boxes), low = select_detections_and_candidates(
                scores.float(), labels, boxes.float(), p["score_thresholds"], p["candidate_score"], p["nms_iou"],
                p["max_detections"], self.cfg.cross_class_iou, paired)
            candidates = self._numpy_boxes(*low, mount)
        scores_np, labels_np, boxes_np = self._numpy_boxes(scores, labels, boxes, mount)
        t4 = time.perf_counter()
        ms = lambda a, b: (b - a) * 1000.0  # noqa: E731
        timings = {
            "decode": ms(t0, t1), "ground": ms(t1, t_ground), "voxelize": ms(t_ground, t2), "network": ms(t2, t3),
            "refine": ms(t3, t_refine), "postprocess": ms(t_refine, t4), "total": ms(t0, t4),
        }
        return Detections(
            boxes=boxes_np, labels=labels_np, scores=scores_np,
            label_names=[self.cfg.classes[i] for i in labels_np], timings_ms=timings,
            class_names=tuple(self.cfg.classes), stamp_ns=cloud.stamp_ns, frame_id=cloud.frame_id,
            sensor_height=mount.height, sensor_tilt_deg=mount.tilt_deg, ground_height_seen=self.ground_height_seen,
            num_points=int(cloud.points.shape[0]), points_over_budget=over_budget,
            **({} if candidates is None else dict(candidate_scores=candidates[0], candidate_labels=candidates[1],
                                                   candidate_boxes=candidates[2])),
        )

    @staticmethod
    def _numpy_boxes(scores: torch.Tensor, labels: torch.Tensor, boxes: torch.Tensor, mount: Mount):
        """(scores f32, labels int64, boxes f32 in the input cloud's frame) as numpy arrays."""
        boxes_np = unlevel_boxes(boxes.cpu().numpy(), mount)
        boxes_np[:, 6] = axis_angle(boxes_np[:, 6]).astype(np.float32)
        return scores.cpu().numpy().astype(np.float32), labels.cpu().numpy().astype(np.int64), boxes_np

    __call__ = detect


class _BackgroundCompile:
    """One thread running ``work(notes)`` -> result; ``error`` says why it has none. A daemon thread: a pipeline that
    is rebuilt or closed meanwhile drops the job, and the thread ends with its compile."""

    def __init__(self, work: Any) -> None:
        self.started = time.monotonic()
        self.elapsed_s = 0.0
        self.notes: list[str] = []
        self.result: Any = None
        self.error: str | None = None
        self.thread = threading.Thread(target=self._run, args=(work,), name="livox_background_compile", daemon=True)
        self.thread.start()

    def _run(self, work: Any) -> None:
        try:
            self.result = work(self.notes)
        except Exception as exc:  # noqa: BLE001 - any compiler failure: the pipeline stays eager
            self.error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        self.elapsed_s = time.monotonic() - self.started
