"""Weights I/O: safetensors only (no pickle, loading runs no code), tied to the model config.

The metadata holds the architecture dict of the config (JSON), its hash and a content hash (sha256 over
every tensor's name, dtype, shape and bytes); `load_weights` refuses a file whose architecture differs
from the config, whose tensors are missing/extra/mis-shaped/of another dtype, non-finite or implausibly
large (|value| > MAX_ABS_VALUE, a BatchNorm running variance <= 0), that records no content hash or one that
does not match its tensors, or that is not a readable safetensors file, always with a `WeightsError`
saying which and why (`warm_start`, for training, still takes files without a content hash).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from torch import nn

from livox_infer.errors import WeightsError
from livox_infer.detector.config import ModelConfig
from livox_infer.detector.network import upgrade_state_keys

FORMAT = "livox_infer.bev_detector.v1"
CONTENT_HASH_KEY = "content_sha256"
# no trained value comes near this (shipped lite: largest 758, a BatchNorm running variance); a file scaled
# by 1e30 or with random bytes in its data does
MAX_ABS_VALUE = 1e5


def content_sha256(state: dict[str, torch.Tensor]) -> str:
    """sha256 over every tensor's name, dtype, shape and bytes, in name order: what the file holds,
    independent of the safetensors layout and metadata."""
    h = hashlib.sha256()
    for name in sorted(state):
        v = state[name].detach().to("cpu").contiguous()
        h.update(f"{name}|{v.dtype}|{tuple(v.shape)}|".encode())
        h.update(v.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def save_weights(model: nn.Module, cfg: ModelConfig, path: str | Path, extra: dict[str, str] | None = None) -> None:
    state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    meta = {
        "format": FORMAT,
        "config_name": cfg.name,
        "architecture": json.dumps(cfg.architecture(), sort_keys=True),
        "architecture_hash": cfg.architecture_hash(),
    }
    for k, v in (extra or {}).items():
        meta[str(k)] = str(v)
    _write_file(state, meta, path)


def _write_file(state: dict[str, torch.Tensor], meta: dict[str, str], path: str | Path) -> None:
    """``state`` with ``meta`` and its content hash, written to a temporary file and moved into place."""
    from safetensors.torch import save_file

    meta = {**meta, CONTENT_HASH_KEY: content_sha256(state)}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(str(path) + ".tmp")
    save_file(state, str(tmp), metadata=meta)
    tmp.replace(path)


def read_metadata(path: str | Path) -> dict[str, str]:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return dict(f.metadata() or {})
    except FileNotFoundError as exc:
        raise WeightsError(f"weights file not found: {path}") from exc
    except Exception as exc:  # noqa: BLE001 - safetensors raises several types for a bad header
        raise WeightsError(f"weights file {path} is not a valid safetensors file: {exc}") from exc


def _detector_metadata(path: Path) -> dict[str, str]:
    """The file's metadata, after checking it is a detector weights file."""
    meta = read_metadata(path)
    if meta.get("format") != FORMAT:
        raise WeightsError(f"{path}: not a livox_infer detector weights file (format={meta.get('format')!r})")
    return meta


def _differing_keys(ours: dict, theirs: dict) -> list[str]:
    return sorted(k for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k))


def _read_state(path: Path, map_location: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    try:
        return load_file(str(path), device=map_location)
    except Exception as exc:  # noqa: BLE001
        raise WeightsError(f"weights file {path} is corrupt: {exc}") from exc


def _check_values(state: dict[str, torch.Tensor], path: Path, meta: dict[str, str], require_hash: bool = True) -> None:
    """Finite, plausible values, and the recorded content hash: a file without one is refused (deleting the key
    let altered weights load), unless ``require_hash`` is False (warm_start: training from older checkpoints)."""
    for k, v in state.items():
        if not v.is_floating_point():
            continue
        if not torch.isfinite(v).all():
            raise WeightsError(f"{path}: tensor {k} holds NaN/inf values")
        if v.numel() and float(v.abs().max()) > MAX_ABS_VALUE:
            raise WeightsError(f"{path}: tensor {k} holds values beyond +-{MAX_ABS_VALUE:g} (no trained weight does)")
        if k.endswith("running_var") and v.numel() and float(v.min()) <= 0:
            raise WeightsError(f"{path}: BatchNorm variance {k} is not positive")
    recorded = meta.get(CONTENT_HASH_KEY)
    if recorded is None and require_hash:
        raise WeightsError(f"{path}: no content hash ({CONTENT_HASH_KEY}) in its metadata, so altered tensors "
                           "could not be told apart; refused (files written by save_weights record one)")
    if recorded is not None and recorded != content_sha256(state):
        raise WeightsError(f"{path}: tensor data do not match the content hash recorded when it was saved "
                           "(the file was altered or damaged)")


def extent_free(arch: dict) -> dict:
    """An architecture dict without the grid's x/y extent: the network is convolutional, so the same
    weights run on any BEV extent (a per-sensor grid); cell size, z range and channels still must match."""
    out = dict(arch)
    if isinstance(out.get("grid"), dict):
        out["grid"] = {k: v for k, v in out["grid"].items() if k not in ("x_range", "y_range")}
    return out


def _load_matching(model: nn.Module, cfg: ModelConfig, path: Path, map_location: str, meta: dict[str, str],
                   require_hash: bool = True) -> None:
    """Load a file whose architecture hash matches ``cfg``: every tensor present, shaped and finite."""
    raw = _read_state(path, map_location)
    state = upgrade_state_keys(raw)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    extra = sorted(set(state) - set(expected))
    bad = sorted(k for k in set(expected) & set(state) if tuple(expected[k].shape) != tuple(state[k].shape))
    # dtypes exactly: load_state_dict would silently cast an int64 / float16 / float64 file into the network
    wrong_dtype = sorted(k for k in set(expected) & set(state) if expected[k].dtype != state[k].dtype)
    if missing or extra or bad or wrong_dtype:
        raise WeightsError(
            f"{path} does not match the network of {cfg.source or cfg.name}: "
            f"missing {missing[:5]}, unexpected {extra[:5]}, wrong shape {bad[:5]}, "
            f"wrong dtype {[f'{k}: {state[k].dtype}' for k in wrong_dtype[:5]]}"
        )
    _check_values(raw, path, meta, require_hash)  # the content hash covers the names as saved
    model.load_state_dict(state)


def load_weights(model: nn.Module, cfg: ModelConfig, path: str | Path, map_location: str = "cpu") -> dict[str, str]:
    """Load ``path`` into ``model`` after checking it belongs to ``cfg``. Returns the file's metadata."""
    path = Path(path)
    if not path.is_file():
        raise WeightsError(
            f"weights file not found: {path} (config {cfg.source or cfg.name}); train one with "
            f"`livox-infer train --model {cfg.name}` or pass weights=<file.safetensors>"
        )
    meta = _detector_metadata(path)
    if meta.get("architecture_hash") != cfg.architecture_hash():
        try:
            theirs = json.loads(meta.get("architecture", "{}"))
        except json.JSONDecodeError:
            theirs = {}
        diff = _differing_keys(extent_free(cfg.architecture()), extent_free(theirs if isinstance(theirs, dict) else {}))
        if diff or meta.get("architecture_hash") is None:  # only the BEV extent may differ
            raise WeightsError(
                f"{path} was trained for a different model config than {cfg.source or cfg.name} "
                f"(differs in: {', '.join(diff) or 'hash'}); use the config it was trained with"
            )
    _load_matching(model, cfg, path, map_location, meta)
    return meta


Z_LEVEL_CHANNELS = ("z_max", "z_min", "z_mean")  # input channels holding a z level / grid.z_levels
REFINER_FIRST_HIDDEN = "refiner.head.0.weight"  # the refiner's first hidden layer: [point features | context]
GROWABLE_KEYS = ("iou_head", "residual_blocks", "head_residual_blocks", "refine", "refine_large", "vehicle_classifier")


def _core_architecture(arch: dict) -> dict:
    """An architecture dict without what a warm start may add: the IoU head, residual blocks, the stage-2
    refiner, the sub-cell x/y input channels and height slices on top of the z range (checked by
    `_z_level_scale`); without the BEV extent, as `extent_free` (the network is convolutional: weights trained on one
    extent start a run on another)."""
    core = {k: v for k, v in extent_free(arch).items() if k not in GROWABLE_KEYS}
    core["grid"] = {k: v for k, v in (core.get("grid") or {}).items()
                    if k not in ("xy_offsets", "age_channel_s", "z_range", "n_height_slices")}
    return core


def _z_level_scale(old, new, path: Path) -> float:
    """new z levels / old z levels where the new grid's z range only reaches higher: the same bottom and the same
    slice height, so every old slice keeps its meaning and the extra slices sit on top. The z channels are z levels
    divided by the level count, so the first convolution's weights on them scale by this to read the same values."""
    if old.z_range == new.z_range and old.n_height_slices == new.n_height_slices:
        return 1.0
    if not (old.z_range[0] == new.z_range[0] and old.z_range[1] < new.z_range[1]
            and old.levels_per_slice == new.levels_per_slice):
        raise WeightsError(
            f"{path} cannot initialise a grid with z_range {list(new.z_range)} / {new.n_height_slices} slices from "
            f"z_range {list(old.z_range)} / {old.n_height_slices} slices: a warm start may only add slices of the "
            "same height on top of the same bottom")
    return new.z_levels / old.z_levels


def warm_start(model: nn.Module, cfg: ModelConfig, path: str | Path, map_location: str = "cpu") -> list[str]:
    """Initialise ``model`` from weights of the same network, or of one with fewer residual blocks,
    without the IoU head, without the stage-2 refiner and/or without the sub-cell x/y input channels
    (weights trained before these), with fewer height slices on the same bottom (a grid reaching higher: the new
    slices' weights start at 0, the z channels' are rescaled), or with the intensity input where the new grid has the
    point-age input
    (``grid.age_channel_s``; for weights of a model fed no intensity, whose intensity weights saw only zeros).

    New output rows (the IoU channel) keep their fresh initialisation; new input channels of the first
    convolution and new refiner context inputs (``refine.visibility``) get zero weights and new residual
    blocks start as the identity, so the warm-started network computes what the old one did (exactly;
    up to float rounding where a refiner gained inputs) until training teaches it to use them. Returns the
    names of the tensors that were grown or added; any other difference raises `WeightsError`."""
    from livox_infer.detector.backbone import ResidualBlock
    from livox_infer.detector.refine import RoiRefiner
    from livox_infer.detector.vehicle_class import VehicleClassifier
    from livox_infer.voxelize.grid import GridConfig

    path = Path(path)
    meta = _detector_metadata(path)
    if meta.get("architecture_hash") == cfg.architecture_hash():
        _load_matching(model, cfg, path, map_location, meta, require_hash=False)
        return []
    try:
        theirs = json.loads(meta.get("architecture", "{}"))
    except json.JSONDecodeError as exc:
        raise WeightsError(f"{path}: unreadable architecture metadata") from exc
    ours_core, theirs_core = _core_architecture(cfg.architecture()), _core_architecture(theirs)
    old_classes = list(theirs.get("classes") or [])
    added_classes = 0
    if len(old_classes) < len(cfg.classes) and list(cfg.classes[: len(old_classes)]) == old_classes:
        theirs_core["classes"] = list(cfg.classes)  # classes appended (truck, bus): their outputs start fresh
        added_classes = len(cfg.classes) - len(old_classes)
    diff = _differing_keys(ours_core, theirs_core)
    if diff:
        raise WeightsError(f"{path} cannot initialise {cfg.source or cfg.name}: the networks differ in {', '.join(diff)}")
    old_grid = GridConfig.from_dict(theirs["grid"])
    z_scale = _z_level_scale(old_grid, cfg.grid, path)
    old_channels = old_grid.channel_names
    new_channels = cfg.grid.channel_names
    # old input channel -> new index; the intensity channel of a model fed no intensity (use_intensity: false)
    # becomes the point-age channel of stacked frames (grid.age_channel_s): its weights start at 0 like a new input
    age_swap = "intensity_mean" in old_channels and "age_mean" in new_channels
    kept = [i for i, name in enumerate(old_channels) if not (age_swap and name == "intensity_mean")]
    lost = [old_channels[i] for i in kept if old_channels[i] not in new_channels]
    if lost:
        raise WeightsError(f"{path} cannot initialise {cfg.source or cfg.name}: its input channels {lost} are not "
                           "inputs of the new grid")
    channel_map = [new_channels.index(old_channels[i]) for i in kept]
    raw = _read_state(path, map_location)
    state = upgrade_state_keys(raw)
    own = model.state_dict()
    new_blocks = tuple(name + "." for name, m in model.named_modules()
                       if isinstance(m, (ResidualBlock, RoiRefiner, VehicleClassifier)))
    missing = sorted(k for k in set(own) - set(state) if not k.startswith(new_blocks))
    unexpected = sorted(set(state) - set(own))
    if missing or unexpected:
        raise WeightsError(f"{path} does not match the network of {cfg.source or cfg.name}: missing "
                           f"{missing[:5]}, unexpected {unexpected[:5]}")
    _check_values(raw, path, meta, require_hash=False)
    added = sorted(set(own) - set(state))  # residual blocks (identity init), a refiner or a classifier (fresh)
    state.update({k: own[k] for k in added})
    # a new second refiner (refine_large) starts as a copy of the file's refiner where their shapes agree: it then
    # begins from boxes it knows how to refine, not from noise (trained from a copy, trucks and buses gained)
    for k in added:
        twin = "refiner." + k[len("refiner_large."):] if k.startswith("refiner_large.") else None
        if twin in state and tuple(state[twin].shape) == tuple(own[k].shape):
            state[k] = state[twin].detach().clone()
    grown = list(added)
    for k, v in state.items():
        mine = own[k]
        input_conv = (v.dim() == 4 and v.shape[1] == len(old_channels) and mine.shape[1] == len(new_channels)
                      and v.shape[0] == mine.shape[0] and v.shape[2:] == mine.shape[2:])
        if tuple(v.shape) == tuple(mine.shape) and not (age_swap and input_conv and k.startswith("backbone.stem.")):
            continue
        if input_conv:
            new = torch.zeros_like(mine, device=v.device)  # the first conv: new input channels start at 0
            new[:, channel_map] = v[:, kept]
            for name in Z_LEVEL_CHANNELS:  # a taller z range: z / (more levels), so the weight grows to match
                new[:, new_channels.index(name)] *= z_scale
        elif (k == REFINER_FIRST_HIDDEN and v.dim() == 2 and v.shape[0] == mine.shape[0]
              and v.shape[1] < mine.shape[1]):
            # new context inputs start at 0: classes appended to the one-hot class block (its first columns),
            # visibility inputs at the end
            new = torch.zeros_like(mine, device=v.device)
            start = cfg.refine.point_channels[-1] + len(old_classes)  # PointNet features come first
            new[:, :start] = v[:, :start]
            new[:, start + added_classes: v.shape[1] + added_classes] = v[:, start:]
        elif v.dim() >= 1 and v.dim() == mine.dim() and v.shape[1:] == mine.shape[1:] and v.shape[0] < mine.shape[0]:
            new = mine.detach().clone().to(v.device)  # more outputs: the old ones first, the rest as initialised
            new[: v.shape[0]] = v
        else:
            raise WeightsError(f"{path}: tensor {k} has shape {tuple(v.shape)}, the network needs {tuple(mine.shape)}")
        state[k] = new
        grown.append(k)
    model.load_state_dict(state)
    return grown


def trained_real_sources(metadata: dict[str, str]) -> tuple[str, ...]:
    """The real sources a weights file was trained on, from its metadata (``train_args`` JSON; also the
    ``real_sources`` key a recipe writes); () for simulator-only weights."""
    found: set[str] = set()
    raw = metadata.get("real_sources")
    if raw:
        found.update(s for s in str(raw).split(",") if s)
    try:
        args = json.loads(metadata.get("train_args", "{}") or "{}")
    except json.JSONDecodeError:
        args = {}
    real = args.get("real") if isinstance(args, dict) else None
    if isinstance(real, dict):
        found.update(real.get("sources") or ())
    return tuple(sorted(found))


def average_weights(new: str | Path, old: str | Path, weight: float, out: str | Path,
                    keep: tuple[str, ...] = (), label: str = "") -> None:
    """Write ``out`` = ``weight`` x NEW + (1 - ``weight``) x OLD, tensor by tensor (both files of one architecture):
    weight averaging of a fine-tuned run with its start keeps most of what each knows (stage 18: the truck rounds'
    long vehicles with stage 17's real pedestrians). Tensors named under a ``keep`` prefix, and integer ones
    (BatchNorm's batch counts), are NEW's. NEW's metadata, with ``averaged_with`` (``label`` or OLD's name and
    content hash), ``average_weight`` and the union of both files' real sources."""
    if not 0.0 < float(weight) <= 1.0:
        raise WeightsError(f"average weight must be in (0, 1], got {weight!r}")
    meta_new, meta_old = read_metadata(new), read_metadata(old)
    a, b = _read_state(Path(new), "cpu"), _read_state(Path(old), "cpu")
    if meta_new.get("architecture_hash") != meta_old.get("architecture_hash") or a.keys() != b.keys():
        raise WeightsError(f"cannot average {new} with {old}: different architectures")
    state = {}
    for k, v in a.items():
        if k.startswith(tuple(keep)) or not v.is_floating_point():
            state[k] = v
        else:
            state[k] = (float(weight) * v.double() + (1.0 - float(weight)) * b[k].double()).to(v.dtype)
    meta = dict(meta_new)
    meta["averaged_with"] = label or f"{Path(old).name} (content_sha256 {meta_old.get(CONTENT_HASH_KEY, '?')})"
    meta["average_weight"] = f"{float(weight):g}"
    sources = sorted(set(trained_real_sources(meta_new)) | set(trained_real_sources(meta_old)))
    if sources:
        meta["real_sources"] = ",".join(sources)
    _write_file(state, meta, out)
