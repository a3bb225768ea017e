"""`livox-infer train`: train the BEV detector on simulated Livox scans.

Two phases, both resumable and seeded:

1. dataset: simulated frames (all five sensors, "street" and "open" scenes, random mounting
   heights) are generated once into ``<work>/data/{train,val}-NNNN.npz`` shards (points cropped to
   the grid plus a margin, boxes, labels, sensor height). Existing shards are reused.
2. training: each step draws a batch of frames, augments them (y-flip, rotation about z, scaling,
   small pitch/roll, ground-height error, point dropout, intensity gain / 0-1 scale), voxelizes,
   builds CenterPoint targets and takes an AdamW step (one-cycle LR). Every ``--val-every`` steps
   the model is evaluated on the held-out frames (BEV AP, R40); the best weights go to ``--out``
   (safetensors, config architecture in the metadata). ``<work>/checkpoint.safetensors`` holds
   model + optimizer state for ``--resume``; the data order depends only on (seed, step), so a
   resumed run sees the same batches as an uninterrupted one.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
import dataclasses
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from livox_infer import CLASS_NAMES
from livox_infer.errors import ConfigError, LivoxInferError
from livox_infer.detector.boxes import points_in_boxes
from livox_infer.detector.config import ModelConfig
from livox_infer.evaluation.metrics import FrameBoxes, evaluate
from livox_infer.evaluation.options import parse_sim_options
from livox_infer.ground import Mount, level_boxes, level_points, levelling_rotation
from livox_infer.params import PRECISIONS  # the same choices as at inference (auto picks per device)
from livox_infer.training.frame import Frame, points_with_age, sim_returns, training_mount
from livox_infer.training.losses import detection_loss
from livox_infer.detector.network import build_model
from livox_infer.training.paste import ObjectDatabase, PasteConfig, paste_objects
from livox_infer.training.real_frames import RealTrainingSpec
from livox_infer.detector.postprocess import select_detections, topk_decode
from livox_infer.training.sparsify import SparsifyAugment, scale_objects, sparsify, thin_simulated_cars
from livox_infer.detector.refine import (
    first_hit_map, match_candidates, next_boxes, refine_candidates, refine_loss, refiner_context, roi_point_features,
    stage2_points,
)
from livox_infer.training.targets import build_targets
from livox_infer.detector.weights import save_weights
from livox_infer.voxelize.reference import ReferenceConstants, voxelize_reference

log = logging.getLogger("livox_infer.train")

SENSOR_NAMES = ("mid40", "mid70", "tele15", "horizon", "avia")
SCENE_KINDS = ("street", "open")
SHARD_FRAMES = 50
TRAIN_MIN_POINTS = 3  # boxes with fewer points after augmentation get no target (invisible)
VAL_MIN_POINTS = 5  # as `livox-infer eval`'s default


# --------------------------------------------------------------------------- dataset


def simulate_training_frame(sensor: str, seed: int, kind: str, **sim_options: Any) -> Frame:
    """One simulated frame of a fresh scene ``kind`` for ``sensor``.

    The mount (ground height and tilt) is estimated from the cloud as the pipeline's "auto" mode
    does, so training sees the same levelling as inference; when that fails, the simulator's true
    mount (sensor height, world up from the pose) is used."""
    import warnings

    from livox_infer.sim.simulate import simulate_frame

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        f = simulate_frame(sensor, seed, scene=kind, **sim_options)
    pts = np.asarray(f.points, np.float32)[sim_returns(f)]
    est = training_mount(pts, f)
    return Frame(pts, np.asarray(f.boxes, np.float32).reshape(-1, 7), np.asarray(f.labels, np.int64),
                 est.height, np.asarray(est.up, np.float32), sensor)


def _crop_mask(points: np.ndarray, cfg: ModelConfig, margin: float = 8.0) -> np.ndarray:
    g = cfg.grid
    m = (points[:, 0] > g.x_range[0] - margin) & (points[:, 0] < g.x_range[1] + margin)
    m &= (points[:, 1] > g.y_range[0] - margin) & (points[:, 1] < g.y_range[1] + margin)
    return m


def _crop(points: np.ndarray, cfg: ModelConfig, margin: float = 8.0) -> np.ndarray:
    return np.ascontiguousarray(points[_crop_mask(points, cfg, margin)])


def stack_frames(stack: tuple[int, int], i: int) -> int:
    """Frames stacked into sample i of a stacked dataset: stack[0] .. stack[1], in turn."""
    return stack[0] + i % (stack[1] - stack[0] + 1)


def shard_path(data_dir: Path, split: str, index: int) -> Path:
    return data_dir / f"{split}-{index:04d}.npz"


def frame_spec(split: str, i: int, seed: int, sensors: tuple[str, ...] = SENSOR_NAMES) -> tuple[str, int, str]:
    """(sensor, sim seed, scene kind) of frame i: sensors and scene kinds interleave evenly."""
    sensor = sensors[i % len(sensors)]
    kind = SCENE_KINDS[(i // len(sensors)) % len(SCENE_KINDS)]
    base = 1_000_000 if split == "train" else 9_000_000  # disjoint seed ranges: val scenes are unseen
    return sensor, base + seed * 100_003 + i, kind


def generate_shard(data_dir: Path, split: str, index: int, seed: int, cfg: ModelConfig,
                   sim_options: dict | None = None, sensors: tuple[str, ...] = SENSOR_NAMES,
                   shard_frames: int = SHARD_FRAMES, stack: tuple[int, int] | None = None) -> Path:
    frames = []
    for j in range(shard_frames):
        i = index * shard_frames + j
        sensor, sim_seed, kind = frame_spec(split, i, seed, sensors)
        if stack is None:
            f = simulate_training_frame(sensor, sim_seed, kind, **(sim_options or {}))
        else:
            from livox_infer.training.stacked import simulate_stacked_frame

            f = simulate_stacked_frame(sensor, sim_seed, kind, stack_frames(stack, i), **(sim_options or {}))
        keep = _crop_mask(f.points, cfg)
        f.points = np.ascontiguousarray(f.points[keep])
        if f.age is not None:
            f.age = np.ascontiguousarray(f.age[keep])
        frames.append(f)
    counts = np.array([f.points.shape[0] for f in frames], np.int64)
    nbox = np.array([f.boxes.shape[0] for f in frames], np.int64)
    out = shard_path(data_dir, split, index)
    tmp = out.with_name(out.stem + ".tmp.npz")
    np.savez(
        tmp,
        points=np.concatenate([f.points for f in frames]) if frames else np.zeros((0, 4), np.float32),
        counts=counts,
        boxes=np.concatenate([f.boxes for f in frames]).reshape(-1, 7),
        labels=np.concatenate([f.labels for f in frames]),
        nbox=nbox,
        sensor_height=np.array([f.sensor_height for f in frames], np.float32),
        up=np.array([f.up for f in frames], np.float32).reshape(-1, 3),
        sensor=np.array([f.sensor for f in frames]),
        **({"age": np.concatenate([f.age for f in frames])} if frames and all(f.age is not None for f in frames)
           else {}),
    )
    tmp.replace(out)
    return out


def load_shards(data_dir: Path, split: str, n_shards: int) -> list[Frame]:
    frames: list[Frame] = []
    for k in range(n_shards):
        p = shard_path(data_dir, split, k)
        with np.load(p, allow_pickle=False) as z:
            pts, counts, boxes, labels, nbox = z["points"], z["counts"], z["boxes"], z["labels"], z["nbox"]
            hs, ups, sensors = z["sensor_height"], z["up"], z["sensor"]
            age = z["age"] if "age" in z.files else None
        po = np.r_[0, np.cumsum(counts)]
        bo = np.r_[0, np.cumsum(nbox)]
        for j in range(len(counts)):
            frames.append(Frame(pts[po[j] : po[j + 1]], boxes[bo[j] : bo[j + 1]], labels[bo[j] : bo[j + 1]],
                                float(hs[j]), ups[j], str(sensors[j]),
                                None if age is None else age[po[j] : po[j + 1]]))
    return frames


def ensure_dataset(data_dir: Path, split: str, n_frames: int, seed: int, cfg: ModelConfig,
                   sim_options: dict | None = None, sensors: tuple[str, ...] = SENSOR_NAMES,
                   shard_frames: int = SHARD_FRAMES, stack: tuple[int, int] | None = None) -> list[Frame]:
    """The first ``n_frames`` frames of the split, simulating the shards that are missing. Frame i is the
    same scene whatever ``shard_frames`` is (its seed depends on i only), so a run with 1-frame shards
    (a scaled-down recipe) sees a prefix of the full data set."""
    from tqdm import tqdm

    if n_frames <= 0:
        return []
    data_dir.mkdir(parents=True, exist_ok=True)
    n_shards = math.ceil(n_frames / shard_frames)
    todo = [k for k in range(n_shards) if not shard_path(data_dir, split, k).is_file()]
    if todo:
        for k in tqdm(todo, desc=f"simulating {split} ({shard_frames} frames/shard)", unit="shard"):
            generate_shard(data_dir, split, k, seed, cfg, sim_options, sensors, shard_frames, stack)
    return load_shards(data_dir, split, n_shards)[:n_frames]


# --------------------------------------------------------------------------- augmentation


def _rot_z(a: float) -> np.ndarray:
    c, s = math.cos(a), math.sin(a)
    return np.array([[c, -s, 0], [s, c, 0], [0, 0, 1]], np.float64)


@dataclass(frozen=True)
class IntensityAugment:
    """How training varies the intensity channel. Real sensors and firmware differ in scale and curve
    (real_dev medians: KITTI 66, Argoverse 2 12, Livox Horizon 14, the simulator ~15 of 255), so the
    detector must not rely on one: ``drop`` = share of frames with intensity zeroed (what the pipeline
    feeds with ``use_intensity: false``), ``gain`` = log-uniform per-frame gain range, ``gamma`` = range of
    a per-frame power curve on the 0..1 value. The defaults are the original (pre-2026-12-03) augmentation."""

    drop: float = 0.0
    gain: tuple[float, float] = (0.7, 1.3)
    gamma: tuple[float, float] = (1.0, 1.0)
    log_gain: bool = False


# Half-widths (degrees) of the forward cones the Livox models see: Mid-40 38.4 deg circular, Mid-70 / Avia
# ~70 deg, Horizon 81.7 deg; `--fov-crop` crops that share of training frames to one of them.
LIVOX_HALF_FOVS = (19.2, 35.2, 35.2, 40.9, 40.9)


def fov_crop(points: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The points inside a random Livox-like forward cone (objects cut by its edge stay, partly seen, as a
    Livox sees them)."""
    half = math.radians(float(rng.choice(LIVOX_HALF_FOVS)))
    return points[np.abs(np.arctan2(points[:, 1], points[:, 0])) <= half]


def augment(frame: Frame, rng: np.random.Generator, strength: float = 1.0,
            intensity: IntensityAugment = IntensityAugment(), sparse: SparsifyAugment = SparsifyAugment(),
            fov_crop_share: float = 0.0, age_column: bool = False):
    """Augmented copy in the sensor frame: (points (N,4), boxes (M,7), labels, Mount the pipeline
    would use). The mount carries an error (tilt up to ~1 deg, height up to +-0.3 m) so the model
    learns to tolerate an imperfect sensor_height or ground estimate. ``age_column``: the fourth column holds
    point ages (`points_with_age`), which the intensity augmentation leaves alone."""
    pts = frame.points.copy()
    boxes = frame.boxes.astype(np.float64).copy()
    labels = frame.labels.copy()
    up = frame.up.astype(np.float64).copy()
    if rng.random() < 0.5:  # mirror left/right
        pts[:, 1] *= -1
        boxes[:, 1] *= -1
        boxes[:, 6] *= -1
        up[1] *= -1
    yaw = rng.uniform(-0.2, 0.2) * strength  # stays within the forward FOVs
    rot = _rot_z(yaw)
    scale = rng.uniform(0.95, 1.05) if strength else 1.0
    pts[:, :3] = (pts[:, :3].astype(np.float64) @ rot.T * scale).astype(np.float32)
    boxes[:, :3] = boxes[:, :3] @ rot.T * scale
    boxes[:, 3:6] *= scale
    boxes[:, 6] = np.remainder(boxes[:, 6] + yaw + math.pi, 2 * math.pi) - math.pi
    up = rot @ up
    height = frame.sensor_height * scale
    if sparse.object_scale is not None:
        pts, boxes = scale_objects(pts, boxes, labels, rng, *sparse.object_scale)
    if sparse.sim_car_keep is not None and not frame.real:
        pts = thin_simulated_cars(pts, boxes, labels, rng, *sparse.sim_car_keep)
    keep = rng.random(pts.shape[0]) < rng.uniform(0.7, 1.0)  # density / range variation
    pts = sparsify(pts[keep], boxes, labels, rng, sparse)
    if fov_crop_share and rng.random() < fov_crop_share:
        pts = fov_crop(pts, rng)
    if age_column:
        pass
    elif intensity.drop and rng.random() < intensity.drop:
        pts[:, 3] = 0.0
    elif rng.random() < 0.1:
        pts[:, 3] /= 255.0  # a 0..1-intensity driver read with the 0..255 setting
    elif intensity.log_gain:
        gain = math.exp(rng.uniform(math.log(intensity.gain[0]), math.log(intensity.gain[1])))
        gamma = rng.uniform(*intensity.gamma)
        pts[:, 3] = np.clip(255.0 * (np.clip(pts[:, 3], 0, 255) / 255.0) ** gamma * gain, 0, 255)
    else:
        pts[:, 3] = np.clip(pts[:, 3] * rng.uniform(*intensity.gain), 0, 255)
    # what the pipeline would be told / estimate: slightly wrong tilt and height
    tilt_err = Mount.from_pitch_roll(0.0, rng.uniform(-0.6, 0.6) * strength, rng.uniform(-0.4, 0.4) * strength)
    up = levelling_rotation(np.asarray(tilt_err.up)).T @ up
    told = Mount(float(height + rng.uniform(-0.3, 0.3) * strength), tuple(float(v) for v in up / np.linalg.norm(up)))
    return pts, boxes.astype(np.float32), labels, told


def prepare(frame: Frame, rng: np.random.Generator | None, cfg: ModelConfig, consts: ReferenceConstants,
            paste_db: ObjectDatabase | None = None, neighbour_weight: float = 0.0,
            intensity: IntensityAugment = IntensityAugment(), sparse: SparsifyAugment = SparsifyAugment(),
            fov_crop_share: float = 0.0, mount_out: list | None = None):
    """Frame -> (bev (C,H,W), targets dict of tensors, levelled boxes, labels, num_points, levelled points).
    ``mount_out`` (a list) receives the mount the points were levelled with (the sensor sits at its height over the
    levelled origin).

    With ``rng`` the frame is augmented (after pasting objects from ``paste_db``, if given). A model with
    ``grid.age_channel_s`` gets the point ages in the fourth column (0 for single frames), as the pipeline feeds it."""
    age_column = cfg.grid.age_channel_s is not None
    if age_column:
        frame = dataclasses.replace(frame, points=points_with_age(frame), age=None)
    if rng is None:
        pts, boxes, labels, mount = frame.points, frame.boxes, frame.labels, frame.mount
    else:
        if paste_db is not None:
            frame = paste_objects(frame, paste_db, rng)
        pts, boxes, labels, mount = augment(frame, rng, intensity=intensity, sparse=sparse,
                                            fov_crop_share=fov_crop_share, age_column=age_column)
    levelled = level_points(pts, mount)
    if mount_out is not None:
        mount_out.append(mount)
    if not cfg.use_intensity and not age_column:  # as the pipeline feeds such a model
        levelled[:, 3] = 0.0
    boxes = level_boxes(boxes, mount)
    npts = points_in_boxes(levelled, boxes)
    bev = voxelize_reference(torch.from_numpy(levelled), cfg.grid, consts)
    visible = (npts >= TRAIN_MIN_POINTS) | (np.asarray(labels) < 0)  # ignored objects keep their footprint
    t = build_targets(boxes[visible], labels[visible], cfg, neighbour_weight)
    return bev, {k: torch.from_numpy(v) for k, v in t.items()}, boxes, labels, npts, levelled


def _stage2_points(levelled: np.ndarray, cfg: ModelConfig) -> torch.Tensor:
    """The points of a prepared frame that stage 2 sees (`stage2_points`: the newest frame of a stacked sample,
    whose ages a model with ``grid.age_channel_s`` carries in the fourth column)."""
    age_input = cfg.grid.age_channel_s is not None
    return stage2_points(torch.from_numpy(levelled), levelled[:, 3] if age_input else None, age_input)


class BatchStream(torch.utils.data.IterableDataset):
    """Batches for steps [start, total): frame choice and augmentation seeded by (seed, step).

    Yields (step, bev (B,C,H,W), stacked targets, scene), scene = None, or with ``with_scene`` one
    (levelled points (N,4), levelled GT boxes (M,7), GT labels (M,)) tuple per frame (stage-2 training)."""

    def __init__(self, frames: list[Frame], cfg: ModelConfig, batch: int, seed: int, start: int, total: int,
                 paste_db: ObjectDatabase | None = None, neighbour_weight: float = 0.0, with_scene: bool = False,
                 intensity: IntensityAugment = IntensityAugment(), sparse: SparsifyAugment = SparsifyAugment(),
                 frame_weights: np.ndarray | None = None, fov_crop_share: float = 0.0):
        self.frames, self.cfg, self.batch, self.seed, self.start, self.total = frames, cfg, batch, seed, start, total
        self.paste_db, self.neighbour_weight, self.with_scene = paste_db, neighbour_weight, with_scene
        self.intensity, self.sparse, self.fov_crop_share = intensity, sparse, fov_crop_share
        # per-frame draw probabilities (real and simulated frames mixed at a set share); None: uniform
        self.p = None if frame_weights is None else np.asarray(frame_weights, np.float64) / np.sum(frame_weights)

    def __iter__(self):
        torch.set_num_threads(1)
        consts = ReferenceConstants(self.cfg.grid)
        for step in range(self.start, self.total):
            rng = np.random.default_rng([self.seed, step])
            if self.p is None:
                idx = rng.choice(len(self.frames), size=self.batch, replace=len(self.frames) < self.batch)
            else:
                idx = rng.choice(len(self.frames), size=self.batch, replace=True, p=self.p)
            bevs, tgts, scene = [], [], []
            for i in idx:
                bev, t, boxes, labels, _, points = prepare(self.frames[i], rng, self.cfg, consts, self.paste_db,
                                                           self.neighbour_weight, self.intensity, self.sparse,
                                                           self.fov_crop_share)
                bevs.append(bev)
                tgts.append(t)
                if self.with_scene:  # stage 2 sees the newest frame of a stacked sample, as in the pipeline
                    scene.append((_stage2_points(points, self.cfg), torch.from_numpy(np.asarray(boxes, np.float32)),
                                  torch.from_numpy(np.asarray(labels, np.int64))))
            yield (step, torch.stack(bevs), {k: torch.stack([t[k] for t in tgts]) for k in tgts[0]},
                   scene if self.with_scene else None)


# --------------------------------------------------------------------------- validation


@torch.no_grad()
def predict_frames(net: torch.nn.Module, cfg: ModelConfig, frames: list[Frame], device: torch.device,
                   score_floor: float = 0.05, refine: bool = False):
    """Detections (ground-relative frame) and GT for validation, with low thresholds for a full PR curve;
    ``refine``: through the network's stage-2 refiner too, as the pipeline runs it."""
    consts = ReferenceConstants(cfg.grid)
    was_training = net.training
    net.eval()
    dets, gts = [], []
    for f in frames:
        bev, _, boxes, labels, npts, points = prepare(f, None, cfg, consts)
        heads = net(bev[None].to(device))
        s, l, b = (t[0] for t in topk_decode(heads, cfg))
        if refine:
            s, l, b = net.refine(_stage2_points(points, cfg).to(device), s, l, b, cfg.grid.intensity_scale)
        s, l, b = select_detections(s.cpu(), l.cpu(), b.cpu(), [score_floor] * cfg.num_classes,
                                    cfg.nms_iou, cfg.max_detections, cfg.cross_class_iou)
        dets.append(FrameBoxes(b.numpy(), l.numpy(), s.numpy()))
        gts.append(FrameBoxes(boxes, labels, None, npts))
    net.train(was_training)
    return dets, gts


def validate(net, cfg, frames, device, refine: bool = False) -> dict[str, Any]:
    dets, gts = predict_frames(net, cfg, frames, device, refine=refine)
    region = cfg.grid.region
    res = evaluate(dets, gts, cfg.classes, VAL_MIN_POINTS, region, metrics=("bev",))
    return {"ap": res.ap, "num_gt": res.num_gt}


VAL_METRIC = {"car": "bev@0.7"}  # per class, the AP model selection averages; the other classes' BEV AP@0.5


def val_score(v: dict[str, Any]) -> float:
    """Model selection: mean over the classes of car BEV AP@0.7 and the others' BEV AP@0.5 (nan counts as 0)."""
    vals = [ap[VAL_METRIC.get(c, "bev@0.5")] for c, ap in v["ap"].items()]
    return float(np.mean([0.0 if math.isnan(x) else x for x in vals]))


# --------------------------------------------------------------------------- checkpoints


def _worker_ignores_sigint(_worker_id: int) -> None:
    """Ctrl-C reaches the whole process group: the main process stops the data workers itself, so a worker must
    not die on its own first (its traceback and a broken pipe were all a user saw)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def save_checkpoint(path: Path, net, opt, cfg: ModelConfig, step: int, best: float, args_json: str) -> None:
    """Model + AdamW state as safetensors (no pickle); scalars in the metadata."""
    from safetensors.torch import save_file

    tensors = {f"model.{k}": v.detach().cpu().contiguous() for k, v in net.state_dict().items()}
    params = [p for grp in opt.param_groups for p in grp["params"]]
    opt_steps = {}
    for i, p in enumerate(params):
        st = opt.state.get(p, {})
        for key in ("exp_avg", "exp_avg_sq"):
            if key in st:
                tensors[f"opt.{i}.{key}"] = st[key].detach().cpu().contiguous()
        if "step" in st:
            opt_steps[i] = float(st["step"])
    meta = {"step": str(step), "best": repr(best), "arch": cfg.architecture_hash(), "args": args_json,
            "opt_steps": json.dumps(opt_steps)}
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata=meta)
    tmp.replace(path)


def load_checkpoint(path: Path, net, opt, cfg: ModelConfig) -> tuple[int, float]:
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    if meta.get("arch") != cfg.architecture_hash():
        raise ConfigError(f"checkpoint {path} belongs to another model config; delete it or use its config")
    t = load_file(str(path))
    net.load_state_dict({k[6:]: v for k, v in t.items() if k.startswith("model.")})
    params = [p for grp in opt.param_groups for p in grp["params"]]
    steps = {int(k): v for k, v in json.loads(meta.get("opt_steps", "{}")).items()}
    for i, p in enumerate(params):
        if f"opt.{i}.exp_avg" in t:
            opt.state[p] = {  # empty_like keeps the parameter's memory format (channels_last)
                "step": torch.tensor(steps.get(i, 0.0)),
                "exp_avg": torch.empty_like(p).copy_(t[f"opt.{i}.exp_avg"]),
                "exp_avg_sq": torch.empty_like(p).copy_(t[f"opt.{i}.exp_avg_sq"]),
            }
    return int(meta["step"]), float(meta.get("best", "-inf"))


# refine-large: the second refiner (`refine_large`, trucks and buses), on its classes' candidates only;
# vehicle-class: the truck / bus classifier (`vehicle_classifier`) on the candidates of both refiners
STAGES = ("detector", "refine", "refine-large", "vehicle-class")


def resolve_precision(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for training (None: plain fp32). "auto" picks bfloat16 where it is fast: a CUDA
    GPU that supports it, or a CPU with AMX tiles (Sapphire Rapids and newer), where oneDNN's bf16
    convolutions ran the lite network's training step 2.4x faster than fp32 (docs/detector.md); fp32
    elsewhere. Weights, optimizer state, BatchNorm statistics and the losses stay fp32 either way."""
    if precision not in PRECISIONS:
        raise ConfigError(f"--precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision == "fp32":
        return None
    if precision == "bf16":
        return torch.bfloat16
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else None
    from livox_infer.detector.precision import cpu_has_amx

    return torch.bfloat16 if device.type == "cpu" and cpu_has_amx() else None


def batch_loss(net: torch.nn.Module, bev: torch.Tensor, targets: dict[str, torch.Tensor], cfg: ModelConfig,
               amp_dtype: torch.dtype | None = None, corner_weight: float = 0.0, heat_class_weight=None):
    """Training loss of a batch: the network in channels_last, under autocast when ``amp_dtype`` is set
    (see `resolve_precision`), the losses on its outputs in fp32."""
    bev = bev.contiguous(memory_format=torch.channels_last)
    with torch.autocast(bev.device.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
        heads = net(bev)
    heads = {k: v.float() for k, v in heads.items()}
    return detection_loss(heads, targets, corner_weight=corner_weight, cell_size=cfg.head_cell_size,
                          heat_class_weight=heat_class_weight)


def refine_batch_loss(net: torch.nn.Module, bev: torch.Tensor, scene: list, cfg: ModelConfig,
                      amp_dtype: torch.dtype | None = None, box_beta: float = 0.02, passes: int = 1,
                      classes: tuple[str, ...] | None = None, large: bool = False):
    """Stage-2 training loss of a batch: the frozen detector (eval mode, no gradients) proposes its first
    ``refine.rois`` candidates per frame, the refiner (training mode) scores and refines them against the
    frame's ground truth (`refine.refine_loss`). ``passes`` > 1 also trains on the boxes that the current
    refiner (eval mode, no gradients) makes of them, as inference's later passes see them. ``classes``: only
    candidates of these classes (None: all), the first ``refine.rois`` of them per frame. ``large``: the second
    refiner (``refine_large``), on its own classes' candidates."""
    rc = cfg.refine_large if large else cfg.refine
    refiner = net.refiner_large if large else net.refiner
    # a refiner for some classes only (`refine.classes` at inference) sees only their candidates there: training it
    # on the others' would spend its capacity (and its BatchNorm statistics) on boxes it never gets
    flags = rc.refined if large else None if classes is None else [c in classes for c in cfg.classes]
    keep = None if flags is None else torch.tensor(flags, device=bev.device)
    with torch.no_grad():
        bev = bev.contiguous(memory_format=torch.channels_last)
        with torch.autocast(bev.device.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
            heads = net(bev)
        scores, labels, boxes = topk_decode({k: v.float() for k, v in heads.items()}, cfg, max(cfg.top_k, rc.rois))
    parts = {name: [] for name in ("feats", "valid", "context", "iou", "matched", "labels", "boxes")}
    for b, (points, gt_boxes, gt_labels) in enumerate(scene):
        sc, lab, bx = scores[b], labels[b], boxes[b]
        if keep is not None:  # as `refine_candidates` picks a config's refine.classes: filtered, then the first rois
            own = keep[lab]
            if not bool(own.any()):  # none of them in this frame (the refiner cannot run on zero RoIs)
                continue
            sc, lab, bx = sc[own], lab[own], bx[own]
        sc, lab, bx = sc[: rc.rois], lab[: rc.rois], bx[: rc.rois]
        points, gt_boxes, gt_labels = points.to(bev.device), gt_boxes.to(bev.device), gt_labels.to(bev.device)
        hits = first_hit_map(points) if rc.visibility else None
        for k in range(passes):
            if k:  # the previous pass's inputs through the current refiner, as `refine_candidates` does
                was_training = refiner.training
                refiner.eval()  # no BatchNorm statistics from these extra forward passes
                with torch.no_grad():
                    bx = next_boxes(bx, refiner(feats, valid, context)[1], valid)
                refiner.train(was_training)
            feats, valid = roi_point_features(points, bx, rc.points, rc.margin, cfg.grid.intensity_scale)
            context = refiner_context(rc, cfg.num_classes, sc, lab, bx, hits)
            iou, matched = match_candidates(bx, lab, gt_boxes, gt_labels)
            for name, t in zip(parts, (feats, valid, context, iou, matched, lab, bx)):
                parts[name].append(t)
    if not parts["labels"]:  # no candidate of ``classes`` in the batch: nothing to learn (a loss of none is nan)
        return sum(p.sum() for p in refiner.parameters()) * 0.0, {"refine_iou": 0.0, "refine_box": 0.0}
    cat = {k: torch.cat(v) for k, v in parts.items()}
    iou_logit, residual = refiner(cat["feats"], cat["valid"], cat["context"])
    return refine_loss(iou_logit, residual, cat["boxes"], cat["labels"], cat["iou"], cat["matched"], cfg.classes,
                       box_beta)


class WeightAverage:
    """An exponential moving average of a network's weights over the optimizer steps (``--ema-decay``): a copy of
    the network whose floating tensors (parameters and BatchNorm statistics) follow ``decay`` * average +
    (1 - decay) * current after each step; integer buffers are copied. Until step 1 / (1 - decay) the decay is
    n / (n + 1), a plain mean of the weights so far, so the starting weights of a short fine-tune fade as 1 / n
    instead of holding a share decay^n (TensorFlow's (1 + n) / (10 + n) ramp instead would cap a 1000-step run's
    decay at 0.991, whatever was asked)."""

    def __init__(self, net: torch.nn.Module, decay: float):
        import copy

        self.decay = float(decay)
        self.model = copy.deepcopy(net).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.steps = 0

    @torch.no_grad()
    def update(self, net: torch.nn.Module) -> None:
        self.steps += 1
        d = min(self.decay, self.steps / (self.steps + 1.0))
        for avg, cur in zip(self.model.state_dict().values(), net.state_dict().values()):
            if avg.dtype.is_floating_point:
                avg.lerp_(cur.detach(), 1.0 - d)
            else:
                avg.copy_(cur)


def lr_at(progress: float, peak: float, warmup: float = 0.05) -> float:
    """Linear warm-up over the first 5 % of training, then cosine decay to 2 % of the peak."""
    if progress < warmup:
        return peak * (0.1 + 0.9 * progress / warmup)
    t = (progress - warmup) / (1 - warmup)
    return peak * (0.02 + 0.98 * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


# --------------------------------------------------------------------------- options


SELECTIONS = ("best", "last")


@dataclass
class TrainOptions:
    """Everything one training run depends on; one field per `livox-infer train` flag.

    ``steps`` is the length of the learning-rate schedule, ``stop_after`` (default: ``steps``) where
    the run stops; ``select`` = "best": ``out`` holds the weights of the best validation, "last": of
    the last one. ``shard_frames``: frames per dataset shard (1 in scaled-down recipe runs)."""

    config: str | Path | ModelConfig = "lite"
    out: Path | None = None
    work_dir: Path | None = None
    train_frames: int = 2000
    val_frames: int = 100
    steps: int = 6000
    stop_after: int | None = None
    select: str = "best"
    batch: int = 8
    lr: float = 3e-3
    weight_decay: float = 1e-2
    seed: int = 0
    val_every: int = 500
    threads: int = 2
    workers: int = 1
    device: str = "auto"
    precision: str = "auto"
    resume: bool = False
    init: str | Path | None = None
    stage: str = "detector"
    refine_box_beta: float = 0.02
    refine_train_passes: int | None = None
    refine_classes: tuple[str, ...] | None = None  # --stage refine: train on these classes' candidates only (None: all)
    vehicle_class_passes: int = 2  # --stage vehicle-class: passes over the training frames (the first unaugmented)
    data_only: bool = False
    sim_options: dict[str, Any] = field(default_factory=dict)
    sensors: tuple[str, ...] = SENSOR_NAMES
    shard_frames: int = SHARD_FRAMES
    paste_probability: float = 0.6
    paste_beside_structure: float = 0.0  # share of pasted pedestrians placed beside scene structure (paste.py)
    neighbour_weight: float = 0.0
    corner_weight: float = 0.0
    heat_class_weight: dict[str, float] | None = None  # class -> heatmap loss weight (others 1)
    intensity: IntensityAugment = IntensityAugment()
    sparse: SparsifyAugment = SparsifyAugment()  # --range-thinning / --part-dropout (off by default)
    keep_checkpoints: bool = False
    time_budget: float | None = None  # minutes; progress = max(step/steps, elapsed/budget): not reproducible
    write_models: bool = False  # allow out / work_dir inside the package's models/ (the shipped weights)
    real: RealTrainingSpec | None = None  # real labelled scans mixed into the batches (cross-validation folds)
    fov_crop: float = 0.0  # share of training frames cropped to a random Livox-like forward cone
    stack: tuple[int, int] | None = None  # newly simulated samples stack this many frames (min, max): --stack
    ema_decay: float = 0.0  # > 0: also keep an exponential moving average of the weights (<work-dir>/ema.safetensors)

    def model_config(self) -> ModelConfig:
        return self.config if isinstance(self.config, ModelConfig) else ModelConfig.load(self.config)

    def check(self) -> None:
        """ConfigError for an inconsistent option, before any shard is simulated."""
        from livox_infer.sim.sensors import get_sensor

        if not self.sensors:
            raise ConfigError("--sensors names no sensor")
        for name in self.sensors:
            get_sensor(name)  # ConfigError for an unknown name
        for name in ("train_frames", "val_frames"):
            if getattr(self, name) < 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 0")
        for name in ("steps", "batch", "val_every", "shard_frames"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.stop_after is not None and not 1 <= self.stop_after <= self.steps:
            raise ConfigError(f"stop_after must be in [1, steps={self.steps}], got {self.stop_after}")
        if self.stage not in STAGES:
            raise ConfigError(f"--stage must be one of {', '.join(STAGES)}, got {self.stage!r}")
        if self.select not in SELECTIONS:
            raise ConfigError(f"select must be one of {', '.join(SELECTIONS)}, got {self.select!r}")
        aug = self.intensity
        if not 0.0 <= aug.drop <= 1.0:
            raise ConfigError("--intensity-drop must be in [0, 1]")
        if not 0 < aug.gain[0] <= aug.gain[1]:
            raise ConfigError("--intensity-gain needs 0 < LOW <= HIGH")
        if not 0.0 <= self.fov_crop <= 1.0:
            raise ConfigError("--fov-crop must be in [0, 1]")
        if not 0.0 <= self.paste_beside_structure <= 1.0:
            raise ConfigError("--paste-beside-structure must be in [0, 1]")
        if self.heat_class_weight is not None:  # a recipe's dict comes here unparsed
            check_class_weights(self.heat_class_weight)
        if not 0.0 <= self.ema_decay < 1.0:
            raise ConfigError(f"--ema-decay must be in [0, 1), got {self.ema_decay}")
        if self.real is not None:
            self.real.check()
        if self.stack is not None:
            from livox_infer.accumulate import MAX_FRAMES

            lo, hi = self.stack
            if not 1 <= lo <= hi <= MAX_FRAMES:
                raise ConfigError(f"--stack needs 1 <= MIN <= MAX <= {MAX_FRAMES} frames, got {lo},{hi}")

    def to_json(self) -> str:
        """The options as recorded in the weights' metadata (train_args)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, ModelConfig):
                v = v.source or v.name
            elif isinstance(v, (IntensityAugment, RealTrainingSpec)):
                v = asdict(v)
            elif isinstance(v, Path):
                v = str(v)
            out[f.name] = v
        return json.dumps(out, sort_keys=True, default=str)


@dataclass(frozen=True)
class TrainResult:
    out: Path | None  # the selected weights (None for data_only)
    work_dir: Path
    step: int  # the last step trained
    best_score: float  # the best validation score (-inf if none ran)


def refuse_models_dir(path: Path, allowed: bool, what: str) -> None:
    """Training writes into the package's models/ (the shipped weights) only when told to."""
    from livox_infer.resources import models_dirs

    if allowed:
        return
    p = Path(path).expanduser().resolve()
    for models in (m.resolve() for m in models_dirs()):
        if p == models or models in p.parents:
            raise ConfigError(f"{what} {path} is inside the package's models/ ({models}), which holds the shipped "
                              "weights: training writes there only with --write-models")


# --------------------------------------------------------------------------- CLI


def add_arguments(p: argparse.ArgumentParser) -> None:
    D = TrainOptions()  # the defaults live in TrainOptions only
    p.add_argument("--write-models", action="store_true",
                   help="allow writing into the package's models/ (the shipped weights); refused otherwise")
    p.add_argument("--model", "--config", dest="config", default=D.config,
                   help="model config name (models/<name>.yaml) or path (--config: the older spelling)")
    p.add_argument("--out", default=None, help="best weights (safetensors); default <work-dir>/<config>.best.safetensors. "
                                               "With a recipe: the output directory")
    p.add_argument("--work-dir", default=None, help="dataset shards + checkpoint (default ~/.cache/livox_infer/train/<config>)")
    p.add_argument("--train-frames", type=int, default=D.train_frames)
    p.add_argument("--val-frames", type=int, default=D.val_frames)
    p.add_argument("--steps", type=int, default=D.steps)
    p.add_argument("--batch", type=int, default=D.batch)
    p.add_argument("--lr", type=float, default=D.lr)
    p.add_argument("--weight-decay", type=float, default=D.weight_decay)
    p.add_argument("--seed", type=int, default=D.seed)
    p.add_argument("--val-every", type=int, default=D.val_every)
    p.add_argument("--threads", type=int, default=D.threads, help="torch CPU threads")
    p.add_argument("--workers", type=int, default=D.workers, help="data-preparation processes (0 = in the main process)")
    p.add_argument("--device", default=D.device, help="auto | cpu | cuda")
    p.add_argument("--precision", default=D.precision, choices=PRECISIONS,
                   help="training arithmetic: bf16 autocast (fp32 master weights) or fp32; auto = bf16 on a GPU "
                        "that supports it or a CPU with AMX, else fp32. Validation always runs in fp32")
    p.add_argument("--resume", action="store_true", help="continue from <work-dir>/checkpoint.safetensors")
    p.add_argument("--init", default=None, help="start from these weights instead of random (same config, or "
                                                "the same network without the IoU head)")
    p.add_argument("--stage", default=D.stage, choices=STAGES,
                   help="detector: train the BEV network; refine: train only the stage-2 refiner of a config with "
                        "a refine section, on the candidates of the trained detector given by --init (frozen); "
                        "refine-large: its second refiner; vehicle-class: its truck / bus classifier (--steps, --lr, "
                        "--weight-decay, --seed; no checkpoints)")
    p.add_argument("--refine-box-beta", type=float, default=D.refine_box_beta,
                   help="--stage refine: smooth-L1 beta of the box residual loss. Residuals are in box lengths, so "
                        "a car's 0.2-0.3 m errors are ~0.05: at beta 0.1 they sat in the weak quadratic part "
                        "(0.02: validation car AP@0.7 +0.03, docs/detector.md)")
    p.add_argument("--refine-train-passes", type=int, default=None, choices=(1, 2, 3, 4),
                   help="--stage refine: also train on the refiner's own refined boxes, as inference's later "
                        "passes see them (default: the config's refine.passes)")
    p.add_argument("--refine-classes", default=None, metavar="C[,C]",
                   help="--stage refine: only candidates of these classes enter the loss, the first refine.rois of "
                        "them per frame, as inference picks a config's refine.classes (default: all classes); "
                        "--stage refine-large always trains on refine_large.classes and refuses it")
    p.add_argument("--vehicle-class-passes", type=int, default=D.vehicle_class_passes, choices=range(1, 9),
                   metavar="N", help="--stage vehicle-class: passes over the training frames collecting truck / bus "
                                     "candidates, the first as stored, the others augmented (default %(default)s)")
    p.add_argument("--data-only", action="store_true", help="only simulate the dataset shards")
    p.add_argument("--sim-option", action="append", default=[], metavar="KEY=VALUE",
                   help="simulate_frame option for newly generated shards (e.g. n_cyclists=6); repeatable")
    p.add_argument("--paste-probability", type=float, default=D.paste_probability,
                   help="share of training frames that get objects pasted in from other frames (0 = off)")
    p.add_argument("--paste-beside-structure", type=float, default=D.paste_beside_structure, metavar="SHARE",
                   help="share of pasted pedestrians turned about the sensor (same range) to stand 0.3-1.0 m beside "
                        "structure of the frame they are pasted into, as real ones stand by walls, poles and cars "
                        "(0 = each at its own place, the default)")
    p.add_argument("--neighbour-weight", type=float, default=D.neighbour_weight,
                   help="loss weight of box regression at the 8 cells around each centre (0 = centre only, "
                        "the default: 0.5 made lite's pedestrian boxes less precise, docs/detector.md)")
    p.add_argument("--heat-class-weight", default=None, metavar="C=W[,C=W]",
                   help="heatmap loss weight of these classes (e.g. pedestrian=2; the others 1)")
    p.add_argument("--corner-weight", type=float, default=D.corner_weight,
                   help="weight of the BEV corner-distance loss (m) beside the L1 regression (0 = off, the "
                        "default: with uncertain yaw it biases box sizes, docs/detector.md)")
    p.add_argument("--sensors", default=",".join(D.sensors),
                   help="comma-separated sensors newly generated shards cycle through: the five Livox models and "
                        "the spinning training proxies hdl64, vlp32, os64 (sim/sensors.py PROXY_SENSORS)")
    p.add_argument("--intensity-drop", type=float, default=D.intensity.drop,
                   help="share of training frames whose intensity is zeroed (robustness to sensors whose intensity "
                        "differs from the simulator's, and the input of configs with use_intensity: false)")
    p.add_argument("--intensity-gain", type=float, nargs=2, default=None, metavar=("LOW", "HIGH"),
                   help="log-uniform per-frame intensity gain range (default: the original uniform 0.7-1.3)")
    p.add_argument("--intensity-gamma", type=float, nargs=2, default=D.intensity.gamma, metavar=("LOW", "HIGH"),
                   help="per-frame power curve applied to intensity / 255 (with --intensity-gain)")
    p.add_argument("--range-thinning", type=float, default=D.sparse.range_prob, metavar="SHARE",
                   help="share of training frames thinned with range beyond 30 m, keep (30/r)^1.5 (real far objects are "
                        "sparser than simulated ones; training/sparsify.py)")
    p.add_argument("--part-dropout", type=float, default=D.sparse.part_prob, metavar="P",
                   help="per object, chance to lose a part: car glass, an occluded end, dark-paint thinning")
    p.add_argument("--part-dropout-classes", default=None, metavar="C[,C]",
                   help="with --part-dropout: only objects of these classes lose parts (default: all). Real cars "
                        "return about half the simulated points at the same range, real pedestrians about as many")
    p.add_argument("--object-scale", type=float, nargs=2, default=None, metavar=("LOW", "HIGH"),
                   help="random object scaling: each labelled object and its points scaled by a factor from "
                        "U(LOW, HIGH) about its bottom face (training/sparsify.py; default off)")
    p.add_argument("--sim-car-keep", type=float, nargs=2, default=None, metavar=("LOW", "HIGH"),
                   help="simulated cars only: keep each car's points with a probability drawn per car from U(LOW, HIGH) "
                        "from 30 m on, ramping from 1 at 15 m (real cars return fewer points than simulated ones; "
                        "training/sparsify.py; default off)")
    p.add_argument("--real", default=None, metavar="DIR",
                   help="also train on the labelled real scans in DIR (livox-infer eval --real's layout), only those of "
                        "--real-sources: cross-validation by source, docs/training.md")
    p.add_argument("--real-sources", default="kitti,av2", metavar="S[,S]",
                   help="with --real: the sources (folds) trained on: kitti (fold K), av2 (fold A) or both")
    p.add_argument("--real-share", type=float, default=RealTrainingSpec.share, metavar="SHARE",
                   help="with --real: expected share of each batch drawn from the real views (the rest simulated)")
    p.add_argument("--real-paste-share", type=float, default=RealTrainingSpec.paste_share, metavar="SHARE",
                   help="with --real: share of the pasted objects drawn from the real views' objects of the frame's "
                        "scan pattern (KITTI's in hdl64 frames, AV2's in vlp32 ones); 0: drawn with the simulated "
                        "ones by their numbers (a few dozen among thousands)")
    p.add_argument("--fov-crop", type=float, default=D.fov_crop, metavar="SHARE",
                   help="share of training frames cropped to a random Livox-like forward cone (±19-41 deg)")
    p.add_argument("--stack", default=None, metavar="K[,K2]",
                   help="newly simulated samples are K (K..K2, in turn) consecutive frames of a drive stacked with "
                        "their poses as the node's accumulate_frames does, labelled with the last frame's boxes and "
                        "carrying each point's age (training/stacked.py)")
    p.add_argument("--keep-checkpoints", action="store_true",
                   help="also save the weights of every validation as <work-dir>/step-NNNNNN.safetensors "
                        "(to choose among them on other data, e.g. livox-infer eval --real)")
    p.add_argument("--ema-decay", type=float, default=D.ema_decay, metavar="D",
                   help="also keep an exponential moving average of the weights (decay D per step, e.g. 0.995; 0 = "
                        "off), written beside the weights as <work-dir>/ema.safetensors at every validation "
                        "(step-NNNNNN.ema.safetensors with --keep-checkpoints); a resumed run's average restarts there")
    p.add_argument("--time-budget", type=float, default=None, metavar="MINUTES",
                   help="train for this many minutes of wall time: progress (and the LR schedule) is then "
                        "max(step/steps, elapsed/budget), so the schedule completes on a slow or busy machine "
                        "(the step count then depends on the machine: recipes record steps instead)")


def intensity_augment(drop: float = 0.0, gain: tuple[float, float] | None = None,
                      gamma: tuple[float, float] = (1.0, 1.0)) -> IntensityAugment:
    """--intensity-drop / --intensity-gain / --intensity-gamma: without a gain range, the original augmentation."""
    if gain is None:
        return IntensityAugment(drop=float(drop))
    return IntensityAugment(drop=float(drop), gain=(float(gain[0]), float(gain[1])),
                            gamma=(float(gamma[0]), float(gamma[1])), log_gain=True)


def options_from_args(args: argparse.Namespace) -> TrainOptions:
    """The flags of one `livox-infer train` run (no recipe) as TrainOptions."""
    return TrainOptions(
        config=args.config, out=Path(args.out) if args.out else None,
        work_dir=Path(args.work_dir) if args.work_dir else None, train_frames=args.train_frames,
        val_frames=args.val_frames, steps=args.steps, batch=args.batch, lr=args.lr, weight_decay=args.weight_decay,
        seed=args.seed, val_every=args.val_every, threads=args.threads, workers=args.workers, device=args.device,
        precision=args.precision, resume=args.resume, init=args.init, stage=args.stage,
        refine_box_beta=args.refine_box_beta, refine_train_passes=args.refine_train_passes,
        refine_classes=None if args.refine_classes is None else
        tuple(x.strip() for x in str(args.refine_classes).split(",") if x.strip()),
        vehicle_class_passes=args.vehicle_class_passes,
        data_only=args.data_only,
        sim_options=parse_sim_options(args.sim_option),
        sensors=tuple(x.strip() for x in str(args.sensors).split(",") if x.strip()),
        paste_probability=args.paste_probability, paste_beside_structure=args.paste_beside_structure,
        neighbour_weight=args.neighbour_weight,
        corner_weight=args.corner_weight, heat_class_weight=parse_class_weights(args.heat_class_weight),
        intensity=intensity_augment(args.intensity_drop, args.intensity_gain, args.intensity_gamma),
        sparse=sparse_augment(args.range_thinning, args.part_dropout, args.part_dropout_classes, args.object_scale,
                              args.sim_car_keep),
        keep_checkpoints=args.keep_checkpoints, time_budget=args.time_budget,
        write_models=getattr(args, "write_models", False),
        real=None if not args.real else RealTrainingSpec(
            args.real, tuple(x.strip() for x in str(args.real_sources).split(",") if x.strip()), args.real_share,
            args.real_paste_share),
        fov_crop=args.fov_crop, ema_decay=args.ema_decay,
        stack=parse_stack(args.stack),
    )


def parse_stack(value: Any) -> tuple[int, int] | None:
    """--stack K or K,K2 (a recipe's ``stack: K`` or ``[K, K2]``) -> (min, max) frames, or None."""
    if value is None:
        return None
    parts = [p for p in str(value).replace("[", "").replace("]", "").split(",") if p.strip()] \
        if not isinstance(value, (list, tuple)) else list(value)
    try:
        nums = [int(p) for p in parts]
    except (TypeError, ValueError):
        nums = []
    if len(nums) not in (1, 2):
        raise ConfigError(f"--stack must be K or K,K2 frames, got {value!r}")
    return (nums[0], nums[-1])


def check_class_weights(weights: dict, given: Any = None) -> dict[str, float]:
    """``weights`` (class name -> weight) as floats, or ConfigError: no class, an unknown class or a weight that is
    not a finite number > 0. ``given``: what the user wrote, for the message (default: ``weights``)."""
    out = {}
    for name, w in dict(weights).items():
        try:
            out[name] = float(w)
        except (TypeError, ValueError):
            out[name] = float("nan")
    if out and all(n in CLASS_NAMES and math.isfinite(w) and w > 0 for n, w in out.items()):
        return out
    raise ConfigError(f"--heat-class-weight takes CLASS=W[,CLASS=W] with W > 0 and classes among "
                      f"{', '.join(CLASS_NAMES)}, got {weights if given is None else given!r}")


def parse_class_weights(value: str | None) -> dict[str, float] | None:
    """--heat-class-weight 'pedestrian=2,cyclist=1.5' -> {"pedestrian": 2.0, "cyclist": 1.5}; None stays None."""
    if value is None:
        return None
    pairs = [item.partition("=") for item in str(value).split(",")]
    if not all(sep for _, sep, _ in pairs):
        return check_class_weights({}, value)  # raises
    return check_class_weights({name.strip(): w for name, _, w in pairs}, value)


def _low_high(flag: str, value, top: float) -> tuple[float, float] | None:
    """A LOW HIGH pair as floats with 0 < LOW <= HIGH <= ``top`` (ConfigError otherwise); None stays None."""
    if value is None:
        return None
    low, high = (float(v) for v in value)
    if not (0.0 < low <= high <= top):
        raise ConfigError(f"{flag} needs 0 < LOW <= HIGH <= {top:g}, got {low} {high}")
    return (low, high)


def sparse_augment(range_thinning: float = 0.0, part_dropout: float = 0.0,
                   part_classes: str | None = None, object_scale=None, sim_car_keep=None) -> SparsifyAugment:
    """--range-thinning / --part-dropout (shares in [0, 1]) / --part-dropout-classes (class names, comma-separated) /
    --object-scale LOW HIGH (0 < LOW <= HIGH <= 2) / --sim-car-keep LOW HIGH (0 < LOW <= HIGH <= 1)."""
    sim_car_keep = _low_high("--sim-car-keep", sim_car_keep, 1)
    object_scale = _low_high("--object-scale", object_scale, 2)
    for name, value in (("range-thinning", range_thinning), ("part-dropout", part_dropout)):
        if not (0.0 <= value <= 1.0):
            raise ConfigError(f"--{name} must be in [0, 1]")
    classes = None
    if part_classes is not None:
        names = [x.strip() for x in str(part_classes).split(",") if x.strip()]
        unknown = [n for n in names if n not in CLASS_NAMES]
        if not names or unknown:
            raise ConfigError(f"--part-dropout-classes: unknown or no class {unknown or part_classes!r} "
                              f"(classes: {', '.join(CLASS_NAMES)})")
        classes = tuple(sorted({CLASS_NAMES.index(n) for n in names}))
    return SparsifyAugment(range_prob=float(range_thinning), part_prob=float(part_dropout), part_classes=classes,
                           object_scale=object_scale, sim_car_keep=sim_car_keep)


def trained_real_sources_of(weights: str | Path | None) -> tuple[str, ...]:
    """Real sources (folds) the weights ``weights`` were trained on, through every run that led to them
    (the ``real_sources`` metadata each run writes, the union of its init's and its own)."""
    if not weights:
        return ()
    from safetensors import safe_open

    from livox_infer.detector.weights import trained_real_sources

    with safe_open(str(weights), framework="pt") as f:
        return trained_real_sources(f.metadata() or {})


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    try:
        train(options_from_args(args))
        return 0
    except LivoxInferError as exc:
        print(f"livox-infer train: {exc}", file=sys.stderr)
        return 2


# --------------------------------------------------------------------------- training


class _StopOnSigint:
    """The first Ctrl-C asks the training loop to stop after the current step. A KeyboardInterrupt raised at any
    point tore through a data-loader fetch mid-handshake, and the worker printed a ConnectionResetError traceback.
    A second Ctrl-C interrupts at once. Only in the main thread, where Python delivers signals."""

    def __init__(self) -> None:
        self.requested = False
        self._previous = None

    def install(self) -> None:
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def restore(self) -> None:
        import signal

        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None


def train(opts: TrainOptions) -> TrainResult:
    """One training run (dataset shards, then the detector or the refiner); see the module doc."""
    from tqdm import tqdm

    from livox_infer.voxelize.voxelizer import resolve_device

    opts.check()
    torch.set_num_threads(opts.threads)
    torch.manual_seed(opts.seed)
    cfg = opts.model_config()
    device = resolve_device(opts.device)
    work = Path(opts.work_dir or Path.home() / ".cache" / "livox_infer" / "train" / cfg.name).expanduser()
    # never over the shipped weights unless told to (write_models): the best weights go into the work dir
    out = Path(opts.out) if opts.out else work / f"{cfg.name}.best.safetensors"
    refuse_models_dir(work, opts.write_models, "the work dir")
    refuse_models_dir(out, opts.write_models, "the output")
    end = opts.stop_after or opts.steps
    t_start = time.time()
    train_frames = ensure_dataset(work / "data", "train", opts.train_frames, opts.seed, cfg, opts.sim_options,
                                  opts.sensors, opts.shard_frames, opts.stack)
    # (validation scenes are simulated without the sim options, but stacked as the training ones)
    val_frames = ensure_dataset(work / "data", "val", opts.val_frames, opts.seed, cfg, sensors=opts.sensors,
                                shard_frames=opts.shard_frames, stack=opts.stack)
    log.info("dataset: %d train / %d val frames in %s (%.0f s)", len(train_frames), len(val_frames), work,
             time.time() - t_start)
    if opts.data_only:
        return TrainResult(None, work, 0, -math.inf)
    frame_weights = None
    real_sources = trained_real_sources_of(opts.init)
    if opts.real is not None:
        from livox_infer.training.real_frames import load_real_training_frames

        real = load_real_training_frames(opts.real, cfg.classes, crop=lambda p: _crop(p, cfg))
        real_sources = tuple(sorted(set(real_sources) | set(opts.real.sources)))
        n_sim = len(train_frames)
        share = opts.real.share if n_sim else 1.0
        frame_weights = np.r_[np.full(n_sim, (1.0 - share) / max(n_sim, 1)), np.full(len(real), share / len(real))]
        train_frames = train_frames + real
        log.info("real scans: %d views of %s from %s, %.0f %% of each batch", len(real), "+".join(opts.real.sources),
                 opts.real.root, 100 * share)

    amp_dtype = resolve_precision(opts.precision, device)
    # channels_last: oneDNN's (and cuDNN's) fast layout for these convolutions, also in fp32
    net = build_model(cfg).to(device).to(memory_format=torch.channels_last)
    refining, large = opts.stage in ("refine", "refine-large"), opts.stage == "refine-large"
    section = "refine_large" if large else "refine"  # the refiner a refine stage trains: its config and module
    trained = net
    if refining:
        if getattr(cfg, section) is None:
            raise ConfigError(f"--stage {opts.stage} needs a model config with a {section} section "
                              f"({cfg.source or cfg.name} has none)")
        if not opts.init and not (opts.resume and (work / "checkpoint.safetensors").is_file()):
            raise ConfigError("--stage refine trains stage 2 on a trained detector: give its weights with --init")
        if large and opts.refine_classes is not None:
            own = [c for c, r in zip(cfg.classes, cfg.refine_large.refined) if r]
            raise ConfigError(f"--stage refine-large trains on refine_large's classes {own}; "
                              "--refine-classes is for --stage refine")
        if opts.refine_classes is not None and (not opts.refine_classes or set(opts.refine_classes) - set(cfg.classes)):
            raise ConfigError(f"--refine-classes must name some of the model's classes {list(cfg.classes)}, "
                              f"got {list(opts.refine_classes)}")
        trained = net.refiner_large if large else net.refiner
        net.requires_grad_(False)
        trained.requires_grad_(True)
    elif cfg.refine is not None and opts.stage == "detector":
        log.warning("--stage detector does not train the stage-2 refiner of %s: train it afterwards on the new "
                    "detector with --stage refine --init <these weights>", cfg.source or cfg.name)
    heat_weights = None
    if opts.heat_class_weight:
        unknown = sorted(set(opts.heat_class_weight) - set(cfg.classes))
        if unknown:
            raise ConfigError(f"--heat-class-weight: {', '.join(unknown)} not among the model's classes "
                              f"{list(cfg.classes)}")
        heat_weights = tuple(float(opts.heat_class_weight.get(c, 1.0)) for c in cfg.classes)
    opt = torch.optim.AdamW(trained.parameters(), lr=opts.lr, weight_decay=opts.weight_decay)
    ckpt = work / "checkpoint.safetensors"
    start, best = 0, -math.inf
    if opts.init:
        from livox_infer.detector.weights import warm_start

        grown = warm_start(net, cfg, opts.init, map_location=str(device))
        log.info("initialised from %s%s", opts.init,
                 f" ({len(grown)} tensors grown or added: {', '.join(grown[:4])}{', ...' if len(grown) > 4 else ''})"
                 if grown else "")
    if opts.stage == "vehicle-class":
        from livox_infer.training.vehicle_class import train_vehicle_classifier

        if not opts.init:
            raise ConfigError("--stage vehicle-class classifies a trained detector's candidates: give its weights "
                              "with --init")
        score = train_vehicle_classifier(net, cfg, train_frames, val_frames, opts, out, device, opts.to_json(),
                                         real_sources, prepare, _stage2_points, lr_at)
        return TrainResult(out, work, opts.steps, score)
    if opts.resume and ckpt.is_file():
        start, best = load_checkpoint(ckpt, net, opt, cfg)
        log.info("resumed from %s at step %d (best val score %.3f)", ckpt, start, best)
    log.info("training on %s, %s arithmetic, %d threads", device, "bf16 autocast" if amp_dtype else "fp32",
             torch.get_num_threads())
    args_json = opts.to_json()
    paste_db = None
    if opts.paste_probability > 0:
        t0 = time.time()
        paste_share = opts.real.paste_share if opts.real is not None else 0.0
        paste_db = ObjectDatabase(train_frames, cfg.num_classes,
                                  PasteConfig(probability=opts.paste_probability, real_share=paste_share,
                                              beside_share=opts.paste_beside_structure),
                                  seed=opts.seed, age_column=cfg.grid.age_channel_s is not None)
        log.info("object database for pasting: %s objects per class (%s) in %.0f s%s", paste_db.count(),
                 ", ".join(cfg.classes), time.time() - t0,
                 f"; real ones kept apart, drawn for {100 * paste_share:.0f} % of the pastes: {paste_db.count(real=True)}"
                 if paste_share else "")
    stream = BatchStream(train_frames, cfg, opts.batch, opts.seed, start, end, paste_db, opts.neighbour_weight,
                         with_scene=refining, intensity=opts.intensity, sparse=opts.sparse,
                         frame_weights=frame_weights, fov_crop_share=opts.fov_crop)
    loader = torch.utils.data.DataLoader(stream, batch_size=None, num_workers=opts.workers,
                                         prefetch_factor=4 if opts.workers else None,
                                         worker_init_fn=_worker_ignores_sigint if opts.workers else None)
    history = []
    t_loop = time.time()
    budget_s = opts.time_budget * 60 if opts.time_budget else None
    if start and budget_s:  # a resumed budgeted run continues its progress where it stopped
        budget_s = max(60.0, budget_s * (1 - start / opts.steps))
    if refining and start == 0:
        v = validate(net, cfg, val_frames, device)
        log.info("detector alone (no refiner): val score %.3f, BEV AP %s", val_score(v),
                 {c: {k: round(x, 3) for k, x in a.items()} for c, a in v["ap"].items()})
    net.train(not refining)  # stage 2 keeps the detector in eval mode (BatchNorm statistics frozen)
    if refining:
        trained.train()
    bar = tqdm(loader, total=max(0, end - start), desc=f"train {cfg.name}" + (" refiner" if refining else ""), unit="step")
    smoothed = None  # the loss terms, smoothed for the progress bar and the log
    averaged = WeightAverage(net, opts.ema_decay) if opts.ema_decay else None
    step = start - 1
    progress = start / opts.steps
    completed = start  # steps whose optimizer update has finished: what an interrupt keeps
    stop = _StopOnSigint()
    try:
        stop.install()
        for step, bev, tgt, scene in bar:
            progress = step / opts.steps
            if budget_s:
                progress = max(progress, (time.time() - t_loop) / budget_s)
            for grp in opt.param_groups:
                grp["lr"] = lr_at(progress, opts.lr)
            bev = bev.to(device, non_blocking=True)
            tgt = {k: v.to(device, non_blocking=True) for k, v in tgt.items()}
            if refining:
                loss, parts = refine_batch_loss(net, bev, scene, cfg, amp_dtype, opts.refine_box_beta,
                                                 opts.refine_train_passes or getattr(cfg, section).passes,
                                                 opts.refine_classes, large)
            else:
                loss, parts = batch_loss(net, bev, tgt, cfg, amp_dtype, opts.corner_weight, heat_weights)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trained.parameters(), 10.0)
            opt.step()
            completed = step + 1
            if averaged is not None:
                averaged.update(net)
            smoothed = parts if smoothed is None else {k: 0.95 * smoothed[k] + 0.05 * parts[k] for k in parts}
            bar.set_postfix(**{k: f"{v:.3f}" for k, v in smoothed.items()}, lr=f"{opt.param_groups[0]['lr']:.1e}")
            done = step + 1
            out_of_time = progress >= 1.0
            if done % opts.val_every == 0 or done == end or out_of_time:
                v = validate(net, cfg, val_frames, device, refine=refining)
                if refining:
                    net.train(False)
                    trained.train()
                score = val_score(v)
                ap = v["ap"]
                log.info("step %d loss %s | val BEV AP %s (GT %s) score %.3f", done,
                         " ".join(f"{k} {x:.3f}" for k, x in smoothed.items()),
                         " ".join(f"{c}@{VAL_METRIC.get(c, 'bev@0.5')[4:]} {a[VAL_METRIC.get(c, 'bev@0.5')]:.3f}"
                                  for c, a in ap.items()), v["num_gt"], score)
                history.append({"step": done, "loss": smoothed, "val": v, "score": score, "minutes": (time.time() - t_start) / 60})
                meta = {"trained": "yes", "step": str(done), "val_score": f"{score:.4f}", "val_ap": json.dumps(v["ap"]),
                        "train_args": args_json, "real_sources": ",".join(real_sources)}
                if score > best or opts.select == "last":
                    best = max(best, score)
                    save_weights(net, cfg, out, extra=meta)
                    log.info("saved %s weights to %s", opts.select, out)
                if opts.keep_checkpoints:
                    save_weights(net, cfg, work / f"step-{done:06d}.safetensors", extra=meta)
                if averaged is not None:  # not validated: choose it on other data (eval --real), like the steps
                    ema_meta = {**meta, "ema_decay": str(opts.ema_decay), "ema_steps": str(averaged.steps)}
                    for k in ("val_score", "val_ap"):
                        ema_meta.pop(k)
                    save_weights(averaged.model, cfg, work / "ema.safetensors", extra=ema_meta)
                    if opts.keep_checkpoints:
                        save_weights(averaged.model, cfg, work / f"step-{done:06d}.ema.safetensors", extra=ema_meta)
                save_checkpoint(ckpt, net, opt, cfg, done, best, args_json)
                with open(work / "history.jsonl", "a") as f:
                    f.write(json.dumps(history[-1]) + "\n")
            if out_of_time:
                log.info("--time-budget used up at step %d", done)
                break
            if stop.requested:
                raise KeyboardInterrupt
    except KeyboardInterrupt:  # Ctrl-C: keep the finished steps, say how to go on, stop (the CLI exits 130)
        bar.close()
        save_checkpoint(ckpt, net, opt, cfg, completed, best, args_json)
        log.warning("interrupted at step %d of %d: checkpoint %s saved; the same command with --resume continues "
                    "(best weights so far: %s)", completed, opts.steps, ckpt, out if out.is_file() else "none yet")
        raise
    finally:
        stop.restore()
    log.info("finished at step %d, best val score %.3f, %.1f min", step + 1, best, (time.time() - t_start) / 60)
    return TrainResult(out, work, step + 1, best)
