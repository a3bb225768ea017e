"""Model configuration files (models/*.yaml): grid, classes, network widths, head, thresholds, NMS.

A config and its weights travel together: `ModelConfig.architecture()` (everything that changes the
meaning or shape of the weights) is stored in the safetensors metadata and compared at load time.
Score thresholds and NMS parameters are run-time choices and may differ from the training run.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from livox_infer.detector.calibration import parse_calibration
from livox_infer.detector.vehicle_class import VehicleClassConfig, parse_vehicle_classifier

from livox_infer import CLASS_NAMES
from livox_infer.errors import ConfigError
from livox_infer.detector.refine import RefineConfig, parse_refine
from livox_infer.voxelize.grid import GridConfig


def _positive_ints(value: Any, name: str, minimum: int = 1) -> tuple[int, ...]:
    """A non-empty list of whole numbers >= ``minimum`` (1: positive; 0 for counts that may be zero)."""
    what = "positive integers" if minimum == 1 else f"whole numbers >= {minimum}"
    try:
        out = tuple(int(v) for v in value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{name} must be a list of {what}, got {value!r}") from exc
    if not out or any(v < minimum for v in out) or any(float(v) != float(w) for v, w in zip(out, value)):
        raise ConfigError(f"{name} must be a non-empty list of {what}, got {value!r}")
    return out


def _per_class(value: Any, classes: tuple[str, ...], name: str, lo: float, hi: float) -> tuple[float, ...]:
    """A number (same for all classes) or a {class: number} mapping covering every class. Entries for classes of
    ``CLASS_NAMES`` the model does not have are ignored (a three-class config may inherit a five-class base)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        out = tuple(float(value) for _ in classes)
    elif isinstance(value, dict):
        missing = [c for c in classes if c not in value]
        unknown = [k for k in value if k not in classes and k not in CLASS_NAMES]
        if missing or unknown:
            raise ConfigError(f"{name}: classes missing {missing}, unknown {unknown} (classes: {list(classes)})")
        try:
            out = tuple(float(value[c]) for c in classes)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{name} values must be numbers, got {value!r}") from exc
    else:
        raise ConfigError(f"{name} must be a number or a mapping class -> number, got {value!r}")
    if any(not (lo <= v <= hi) for v in out):
        raise ConfigError(f"{name} values must lie in [{lo}, {hi}], got {value!r}")
    return out


# cells of the largest BEV grid with_extent allows: 1024 x 1024 (409.6 m square at lite's 0.4 m) costs ~2.6 s a
# frame eager on one busy CPU core and ~0.8 GB; the +-1000 m bounds alone allowed 5000 x 5000 (26 s, 5.6 GB)
MAX_GRID_CELLS = 1024 * 1024


@dataclass(frozen=True)
class ModelConfig:
    name: str
    grid: GridConfig
    classes: tuple[str, ...] = CLASS_NAMES
    stem_channels: int = 16
    stem_stride: int = 1
    stem_blocks: int = 1
    stage_channels: tuple[int, ...] = (32, 64, 128)
    stage_blocks: tuple[int, ...] = (2, 2, 2)
    # zero-initialised residual blocks appended to each stage / after the head's fuse conv: they start as
    # the identity, so a network can grow from trained weights without changing its output (warm_start)
    residual_blocks: tuple[int, ...] = ()
    head_residual_blocks: int = 0
    neck_channels: int = 32
    head_channels: int = 32
    out_stride: int = 2  # head cells per input cell (1 stride-1 stem, then stride-2 stages)
    iou_head: bool = False  # the regression head also predicts the BEV IoU of its own box with the object
    min_radius: tuple[float, ...] = (2.0, 1.0, 1.0)  # gaussian radius floor per class, in head cells
    gaussian_overlap: float = 0.1
    max_objects: int = 128  # per frame, training targets
    top_k: int = 64  # fixed number of candidates decoded per frame (static shape)
    score_thresholds: tuple[float, ...] = (0.3, 0.3, 0.3)
    nms_iou: tuple[float, ...] = (0.1, 0.1, 0.1)
    max_detections: int = 64
    cross_class_iou: float | None = None  # None: classes never suppress each other
    # IoU-aware score (needs iou_head): score = heat^(1 - a) * predicted_iou^a per class, so among the
    # found objects the well-localised boxes rank first (AP at strict IoU rewards that ordering)
    iou_score_alpha: tuple[float, ...] = (0.0, 0.0, 0.0)
    refine: RefineConfig | None = None  # stage 2: point-based refinement of the best candidates (refine.py)
    # a second stage-2 refiner with weights of its own for the classes it lists (trucks and buses: a refiner trained
    # beside the cars' lost the cars); its classes must be ones `refine` leaves alone
    refine_large: RefineConfig | None = None
    # truck or bus from the side view of each such candidate's points (vehicle_class.py)
    vehicle_classifier: VehicleClassConfig | None = None
    # per class [[raw, calibrated], ...] knots or None (detector/calibration.py); not part of the architecture
    score_calibration: tuple | None = None
    # false: the pipeline zeroes every point's intensity before voxelizing and refining. Intensity scales and
    # curves differ between sensors and firmware; a detector trained with intensity dropped (train
    # --intensity-drop) does not depend on them. Not part of the architecture (same tensors either way).
    use_intensity: bool = True
    weights: str = ""
    source: str = ""  # the file it was loaded from (not part of the architecture)
    extra: dict = field(default_factory=dict)

    # -- derived ---------------------------------------------------------------------------------
    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def head_cell_size(self) -> float:
        return self.grid.cell_size * self.out_stride

    @property
    def head_shape(self) -> tuple[int, int]:
        """(H, W) of the head outputs."""
        return self.grid.height // self.out_stride, self.grid.width // self.out_stride

    def with_extent(self, extent: Any) -> "ModelConfig":
        """The same model on another BEV extent (x_min, x_max, y_min, y_max) in metres, e.g. a per-sensor
        grid: weights load unchanged (`weights.extent_free`). Every bound must be a multiple of
        `extent_quantum` (the network's coarsest cell), so all feature maps tile the extent exactly."""
        try:
            x0, x1, y0, y1 = (float(v) for v in extent)
        except (TypeError, ValueError):
            raise ConfigError(f"BEV extent must be 4 numbers (x_min, x_max, y_min, y_max), got {extent!r}") from None
        q = self.extent_quantum
        for v in (x0, x1, y0, y1):
            if not abs(v) <= 1000.0 or abs(v / q - round(v / q)) > 1e-6:
                raise ConfigError(f"BEV extent values must be multiples of {q:g} m within ±1000 m, got {extent!r}")
        if not (x1 > x0 and y1 > y0):
            raise ConfigError(f"BEV extent needs x_min < x_max and y_min < y_max, got {extent!r}")
        cell = self.grid.cell_size
        nx, ny = round((x1 - x0) / cell), round((y1 - y0) / cell)
        if nx * ny > MAX_GRID_CELLS:
            raise ConfigError(f"BEV extent {list(extent)!r} is {nx} x {ny} cells of {cell:g} m; at most "
                              f"{MAX_GRID_CELLS:,} cells (1024 x 1024, ~2.6 s a frame eager on one CPU core) are "
                              "allowed: detect on a smaller extent")
        import dataclasses

        return dataclasses.replace(self, grid=dataclasses.replace(self.grid, x_range=(x0, x1), y_range=(y0, y1)))

    @property
    def extent_quantum(self) -> float:
        """Metres per cell of the network's coarsest feature map: BEV extents are whole numbers of it."""
        return round(self.grid.cell_size * self.stem_stride * (1 << len(self.stage_channels)), 6)

    def architecture(self) -> dict[str, Any]:
        """What the weights depend on; stored with them and checked at load."""
        return {
            "classes": list(self.classes),
            "grid": self.grid.to_dict(),
            "stem_channels": self.stem_channels,
            "stem_stride": self.stem_stride,
            "stem_blocks": self.stem_blocks,
            "stage_channels": list(self.stage_channels),
            "stage_blocks": list(self.stage_blocks),
            "neck_channels": self.neck_channels,
            "head_channels": self.head_channels,
            "out_stride": self.out_stride,
            # only when set, so weights trained before these existed keep their hash
            **({"residual_blocks": list(self.residual_blocks)} if any(self.residual_blocks) else {}),
            **({"head_residual_blocks": self.head_residual_blocks} if self.head_residual_blocks else {}),
            **({"iou_head": True} if self.iou_head else {}),
            **({"refine": self.refine.architecture()} if self.refine else {}),
            **({"refine_large": self.refine_large.architecture()} if self.refine_large else {}),
            **({"vehicle_classifier": self.vehicle_classifier.architecture()} if self.vehicle_classifier else {}),
        }

    def architecture_hash(self) -> str:
        text = json.dumps(self.architecture(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    # -- loading ---------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "") -> "ModelConfig":
        if not isinstance(data, dict):
            raise ConfigError(f"model config {source or ''} must be a mapping, got {type(data).__name__}")
        d = dict(data)
        known = {
            "name", "grid", "classes", "backbone", "head", "score_thresholds", "iou_score_alpha", "nms", "weights",
            "description", "refine", "refine_large", "use_intensity", "score_calibration", "vehicle_classifier",
        }
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"model config {source}: unknown keys {unknown}; known: {sorted(known)}")
        if "grid" not in d:
            raise ConfigError(f"model config {source}: missing 'grid'")
        grid = GridConfig.from_dict(d["grid"])
        classes = tuple(d.get("classes", CLASS_NAMES))
        if not classes or any(not isinstance(c, str) for c in classes) or len(set(classes)) != len(classes):
            raise ConfigError(f"model config {source}: classes must be distinct names, got {classes!r}")
        bb = d.get("backbone", {}) or {}
        hd = d.get("head", {}) or {}
        nms = d.get("nms", {}) or {}
        for sec, keys in (
            (bb, {"stem_channels", "stem_stride", "stem_blocks", "stage_channels", "stage_blocks", "residual_blocks",
                  "neck_channels"}),
            (hd, {"head_channels", "out_stride", "min_radius", "gaussian_overlap", "max_objects", "top_k", "iou_head",
                  "residual_blocks"}),
            (nms, {"iou_threshold", "max_detections", "cross_class_iou"}),
        ):
            if not isinstance(sec, dict) or set(sec) - keys:
                raise ConfigError(f"model config {source}: bad section {sec!r}; allowed keys {sorted(keys)}")
        stage_channels = _positive_ints(bb.get("stage_channels", (32, 64, 128)), "backbone.stage_channels")
        stage_blocks = _positive_ints(bb.get("stage_blocks", (2,) * len(stage_channels)), "backbone.stage_blocks")
        if len(stage_blocks) != len(stage_channels):
            raise ConfigError("backbone.stage_blocks and backbone.stage_channels must have the same length")
        residual_blocks = _positive_ints(bb.get("residual_blocks", (0,) * len(stage_channels)), "backbone.residual_blocks",
                                         minimum=0)
        if len(residual_blocks) != len(stage_channels):
            raise ConfigError("backbone.residual_blocks and backbone.stage_channels must have the same length")
        (head_residual,) = _positive_ints([hd.get("residual_blocks", 0)], "head.residual_blocks", minimum=0)
        (stem,) = _positive_ints([bb.get("stem_channels", 16)], "backbone.stem_channels")
        (neck,) = _positive_ints([bb.get("neck_channels", 32)], "backbone.neck_channels")
        (head_ch,) = _positive_ints([hd.get("head_channels", 32)], "head.head_channels")
        (out_stride,) = _positive_ints([hd.get("out_stride", 2)], "head.out_stride")
        (stem_stride,) = _positive_ints([bb.get("stem_stride", 1)], "backbone.stem_stride")
        (stem_blocks,) = _positive_ints([bb.get("stem_blocks", 1)], "backbone.stem_blocks")
        if stem_stride not in (1, 2):
            raise ConfigError(f"backbone.stem_stride must be 1 or 2, got {stem_stride}")
        strides = [stem_stride << i for i in range(len(stage_channels) + 1)]
        if out_stride not in strides:
            raise ConfigError(f"head.out_stride must be one of the backbone strides {strides}, got {out_stride}")
        total_stride = strides[-1]
        if grid.height % total_stride or grid.width % total_stride:
            raise ConfigError(
                f"grid {grid.height}x{grid.width} cells must be divisible by the backbone stride {total_stride}"
            )
        (max_objects,) = _positive_ints([hd.get("max_objects", 128)], "head.max_objects")
        (top_k,) = _positive_ints([hd.get("top_k", 64)], "head.top_k")
        (max_det,) = _positive_ints([nms.get("max_detections", 64)], "nms.max_detections")
        cross = nms.get("cross_class_iou")
        if cross is not None and not (isinstance(cross, (int, float)) and 0.0 <= float(cross) <= 1.0):
            raise ConfigError(f"nms.cross_class_iou must be a number in [0, 1] or absent, got {cross!r}")
        iou_head = hd.get("iou_head", False)
        if not isinstance(iou_head, bool):
            raise ConfigError(f"head.iou_head must be true or false, got {iou_head!r}")
        iou_alpha = _per_class(d.get("iou_score_alpha", 0.0), classes, "iou_score_alpha", 0.0, 1.0)
        if any(iou_alpha) and not iou_head:
            raise ConfigError(f"model config {source}: iou_score_alpha needs head.iou_head: true")
        use_intensity = d.get("use_intensity", True)
        if not isinstance(use_intensity, bool):
            raise ConfigError(f"model config {source}: use_intensity must be true or false, got {use_intensity!r}")
        if grid.age_channel_s is not None and use_intensity:
            raise ConfigError(f"model config {source}: grid.age_channel_s puts the point age where intensity goes: "
                              "it needs use_intensity: false")
        overlap = float(hd.get("gaussian_overlap", 0.1))
        if not 0 < overlap < 1:
            raise ConfigError(f"head.gaussian_overlap must be in (0, 1), got {overlap}")
        refine = parse_refine(d.get("refine"), classes, source, _per_class, _positive_ints)
        refine_large = parse_refine(d.get("refine_large"), classes, source, _per_class, _positive_ints)
        if refine_large is not None:
            own = [c for c, r in zip(classes, refine_large.refined) if r]
            taken = [c for c, r in zip(classes, refine.refined) if r] if refine is not None else []
            if (d.get("refine_large") or {}).get("classes") is None or refine is None or set(own) & set(taken):
                raise ConfigError(f"model config {source}: refine_large needs a refine section and its own "
                                  f"classes list, none of them refined by refine (refine refines {taken})")
        return cls(
            name=str(d.get("name", Path(source).stem if source else "model")),
            grid=grid,
            classes=classes,
            stem_channels=stem,
            stem_stride=stem_stride,
            stem_blocks=stem_blocks,
            stage_channels=stage_channels,
            stage_blocks=stage_blocks,
            residual_blocks=residual_blocks,
            head_residual_blocks=head_residual,
            neck_channels=neck,
            head_channels=head_ch,
            out_stride=out_stride,
            iou_head=iou_head,
            min_radius=_per_class(hd.get("min_radius", 1.0), classes, "head.min_radius", 0.0, 50.0),
            gaussian_overlap=overlap,
            max_objects=max_objects,
            top_k=top_k,
            score_thresholds=_per_class(d.get("score_thresholds", 0.3), classes, "score_thresholds", 0.0, 1.0),
            nms_iou=_per_class(nms.get("iou_threshold", 0.1), classes, "nms.iou_threshold", 0.0, 1.0),
            max_detections=max_det,
            cross_class_iou=None if cross is None else float(cross),
            iou_score_alpha=iou_alpha,
            refine=refine,
            refine_large=refine_large,
            vehicle_classifier=parse_vehicle_classifier(d.get("vehicle_classifier"), classes, source),
            use_intensity=use_intensity,
            score_calibration=parse_calibration(d.get("score_calibration"), classes, source),
            weights=str(d.get("weights", "")),
            source=source,
        )

    @classmethod
    def load(cls, name_or_path: str | Path) -> "ModelConfig":
        """Load ``models/<name>.yaml`` (a bare name like "lite") or a YAML path."""
        from livox_infer.resources import find

        name = str(name_or_path)
        # one message whether the file is missing, unreadable or not YAML: a caller of the node's parameter
        # service learns nothing about the files on the robot
        refused = ConfigError(f"cannot load model config {name!r}: neither a name in models/ nor a readable "
                              "UTF-8 YAML file")
        try:
            path = find("models", name if name.endswith((".yaml", ".yml")) else name + ".yaml")
            data = read_config_dict(path)
        except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError):
            raise refused from None
        return cls.from_dict(data, source=str(path))

    def weights_path(self) -> Path:
        """The weights file next to the config (or found in models/)."""
        from livox_infer.resources import find

        if not self.weights:
            raise ConfigError(f"model config {self.source or self.name} names no weights file")
        if self.source:
            p = Path(self.source).parent / self.weights
            if p.is_file():
                return p
        try:
            return find("models", self.weights)
        except FileNotFoundError:
            return (Path(self.source).parent if self.source else Path(".")) / self.weights

    def _refine_dict(self, rc: RefineConfig) -> dict[str, Any]:
        return {"rois": rc.rois, "points": rc.points, "margin": rc.margin, "point_channels": list(rc.point_channels),
                "hidden": list(rc.hidden), "score_alpha": {c: float(v) for c, v in zip(self.classes, rc.score_alpha)},
                "passes": rc.passes, **({"visibility": list(rc.visibility)} if rc.visibility else {}),
                **({} if all(rc.refined) else {"classes": [c for c, r in zip(self.classes, rc.refined) if r]})}

    def to_dict(self) -> dict[str, Any]:
        by = lambda vals: {c: float(v) for c, v in zip(self.classes, vals)}  # noqa: E731
        return {
            "name": self.name,
            "classes": list(self.classes),
            "grid": self.grid.to_dict(),
            "backbone": {
                "stem_channels": self.stem_channels,
                "stem_stride": self.stem_stride,
                "stem_blocks": self.stem_blocks,
                "stage_channels": list(self.stage_channels),
                "stage_blocks": list(self.stage_blocks),
                **({"residual_blocks": list(self.residual_blocks)} if any(self.residual_blocks) else {}),
                "neck_channels": self.neck_channels,
            },
            "head": {
                "head_channels": self.head_channels,
                "out_stride": self.out_stride,
                "min_radius": by(self.min_radius),
                "gaussian_overlap": self.gaussian_overlap,
                "max_objects": self.max_objects,
                "top_k": self.top_k,
                **({"iou_head": True} if self.iou_head else {}),
                **({"residual_blocks": self.head_residual_blocks} if self.head_residual_blocks else {}),
            },
            "score_thresholds": by(self.score_thresholds),
            **({"iou_score_alpha": by(self.iou_score_alpha)} if self.iou_head else {}),
            "nms": {"iou_threshold": by(self.nms_iou), "max_detections": self.max_detections,
                    **({} if self.cross_class_iou is None else {"cross_class_iou": self.cross_class_iou})},
            **({"refine": self._refine_dict(self.refine)} if self.refine else {}),
            **({"refine_large": self._refine_dict(self.refine_large)} if self.refine_large else {}),
            **({"vehicle_classifier": self.vehicle_classifier.to_dict()} if self.vehicle_classifier else {}),
            **({} if self.use_intensity else {"use_intensity": False}),
            **({"score_calibration": {c: [list(k) for k in knots] for c, knots in zip(self.classes, self.score_calibration)
                                      if knots is not None}} if self.score_calibration else {}),
            "weights": self.weights,
        }


def deep_merge(base: dict[str, Any], over: dict[str, Any], drop_none: bool = True) -> dict[str, Any]:
    """``over`` on top of ``base``: mappings merge, other values replace; a None removes the key (``drop_none``)
    or stays (a recipe stage over the recipe's defaults: the None removes a config key later)."""
    out = dict(base)
    for k, v in over.items():
        if v is None and drop_none:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v, drop_none)
        else:
            out[k] = v
    return out


def read_config_dict(path: str | Path, depth: int = 0) -> Any:
    """A model config file's mapping, with ``base: OTHER.yaml`` (relative to the file) merged under it: a
    variant (e.g. lite-sim: other weights, its own thresholds) states only what differs."""
    path = Path(path)
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if isinstance(data, dict) and "base" in data:
        if depth > 4:
            raise RecursionError(f"{path}: base chain too deep")
        data = dict(data)
        base = read_config_dict(path.parent / str(data.pop("base")), depth + 1)
        if isinstance(base, dict):
            data = deep_merge(base, data)
    return data
