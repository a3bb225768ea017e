"""Training recipes: every stage that made a model's weights, in one file (``models/<name>.train.yaml``).

A recipe names simulated datasets (seed, frame counts, sensors, simulator options) and stages
(detector or refiner runs: model-config overrides, the stage whose output they start from, the
datasets they train and validate on, steps, learning rate, seed, augmentation). Steps are counts,
never wall-clock budgets, so a recipe is the same on any machine. ``run_recipe`` runs the stages in
order into one directory::

    OUT/data/<dataset>/data/{train,val}-NNNN.npz   simulated shards (`train(data_only=True)`)
    OUT/stages/<stage>/data/                        the stage's shards (symlinks, in the recipe's order)
    OUT/stages/<stage>/<stage>.safetensors          the stage's weights: written when it finished
    OUT/<model>.safetensors                         the last stage's weights, once all stages ran

It is resumable: a stage whose weights exist is skipped, an interrupted one resumes from its checkpoint.
``scaled(recipe, f)`` multiplies frame counts, steps and validation intervals by f for a smoke run
(frame i of a dataset is the same scene at any scale, so a scaled run trains on a prefix of the data).
"""

from __future__ import annotations

import logging
import math
import os
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from livox_infer.detector.config import ModelConfig, deep_merge, read_config_dict
from livox_infer.detector.weights import average_weights
from livox_infer.errors import ConfigError
from livox_infer.training.real_frames import RealTrainingSpec
from livox_infer.training.train import (
    SELECTIONS, SENSOR_NAMES, SHARD_FRAMES, STAGES, TrainOptions, intensity_augment, parse_stack, refuse_models_dir,
    shard_path,
    train,
)

log = logging.getLogger("livox_infer.recipe")

# TrainOptions fields a stage (or the recipe's defaults) may set besides the keys of StageSpec
STAGE_OPTIONS = ("batch", "lr", "weight_decay", "val_every", "paste_probability", "paste_beside_structure",
                 "neighbour_weight", "corner_weight", "heat_class_weight",
                 "refine_box_beta", "refine_train_passes", "precision", "intensity", "real", "fov_crop",
                 "vehicle_class_passes")
STAGE_KEYS = {"name", "kind", "init", "config", "train", "val", "steps", "stop_after", "select", "seed", "average_with",
              *STAGE_OPTIONS}
DATASET_KEYS = {"seed", "train", "val", "sensors", "sim", "stack"}


@dataclass(frozen=True)
class DatasetSpec:
    """Simulated frames as `livox-infer train --data-only` makes them (frame i's scene depends on seed and i)."""

    name: str
    seed: int
    train: int
    val: int
    sensors: tuple[str, ...] = SENSOR_NAMES
    sim: dict[str, Any] = field(default_factory=dict)
    stack: tuple[int, int] | None = None  # samples of K (K..K2) stacked frames (`livox-infer train --stack`)


@dataclass(frozen=True)
class Part:
    """The first ``frames`` frames of a dataset's split (None: all of them)."""

    dataset: str
    frames: int | None = None


@dataclass(frozen=True)
class StageSpec:
    name: str
    kind: str  # "detector" | "refine" | "refine-large" | "vehicle-class"
    init: str | None  # an earlier stage's name, a weights file (relative to the recipe), or None: random
    config: dict[str, Any]  # overrides of the model config, deep-merged (null removes a key)
    train: tuple[Part, ...]
    val: tuple[Part, ...]
    steps: int  # length of the learning-rate schedule
    stop_after: int | None  # the run stops here (None: at steps)
    select: str  # "best" | "last" validation's weights are the stage's output
    seed: int
    options: dict[str, Any]  # the STAGE_OPTIONS it sets
    # {stage: NAME, weight: W, keep: [PREFIX, ...]}: the stage's output is W x its run's weights + (1 - W) x stage
    # NAME's (`weights.average_weights`; tensors under a keep prefix are the run's)
    average_with: dict[str, Any] | None = None


@dataclass(frozen=True)
class Recipe:
    model: str  # model config name or path (the final weights: <out>/<its name>.safetensors)
    source: Path
    shard_frames: int
    datasets: dict[str, DatasetSpec]
    stages: tuple[StageSpec, ...]

    def stage(self, name: str) -> StageSpec:
        for s in self.stages:
            if s.name == name:
                return s
        raise ConfigError(f"recipe {self.source}: no stage {name!r} (stages: {', '.join(s.name for s in self.stages)})")

    def frames(self, part: Part, split: str) -> int:
        total = getattr(self.datasets[part.dataset], split)
        return total if part.frames is None else part.frames


# --------------------------------------------------------------------------- loading


def _parts(value: Any, where: str) -> tuple[Part, ...]:
    """["WA", "W1:200", ...] -> Parts."""
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where} must be a non-empty list of DATASET or DATASET:FRAMES")
    parts = []
    for item in value:
        name, sep, n = str(item).partition(":")
        try:
            parts.append(Part(name.strip(), int(n) if sep else None))
        except ValueError:
            raise ConfigError(f"{where}: {item!r} is not DATASET or DATASET:FRAMES") from None
    return tuple(parts)


def _dataset(name: str, d: Any, where: str) -> DatasetSpec:
    if not isinstance(d, dict) or set(d) - DATASET_KEYS or not {"seed", "train", "val"} <= set(d):
        raise ConfigError(f"{where}: a dataset needs seed, train, val (and optionally sensors, sim, stack), got {d!r}")
    sensors = d.get("sensors", list(SENSOR_NAMES))
    return DatasetSpec(name, int(d["seed"]), int(d["train"]), int(d["val"]), tuple(str(s) for s in sensors),
                       dict(d.get("sim") or {}), parse_stack(d.get("stack")))


def _stage(d: Any, defaults: dict[str, Any], where: str) -> StageSpec:
    if not isinstance(d, dict) or set(d) - STAGE_KEYS:
        raise ConfigError(f"{where}: unknown keys {sorted(set(d) - STAGE_KEYS) if isinstance(d, dict) else d!r}; "
                          f"known: {sorted(STAGE_KEYS)}")
    d = deep_merge(defaults, d, drop_none=False)
    for key in ("name", "kind", "train", "val", "steps", "seed"):
        if key not in d:
            raise ConfigError(f"{where}: missing {key!r}")
    if d["kind"] not in STAGES:
        raise ConfigError(f"{where}: kind must be one of {', '.join(STAGES)}, got {d['kind']!r}")
    select = d.get("select", "best")
    if select not in SELECTIONS:
        raise ConfigError(f"{where}: select must be one of {', '.join(SELECTIONS)}, got {select!r}")
    average = d.get("average_with")
    if average is not None:
        weight = average.get("weight") if isinstance(average, dict) else None
        if (not isinstance(average, dict) or set(average) - {"stage", "weight", "keep"} or not average.get("stage")
                or isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 < weight <= 1
                or not isinstance(average.get("keep", []), list)):
            raise ConfigError(f"{where}: average_with needs stage (an earlier stage's name), weight in (0, 1] and "
                              f"optionally keep (tensor-name prefixes), got {average!r}")
        average = {"stage": str(average["stage"]), "weight": float(weight),
                   "keep": [str(k) for k in average.get("keep", [])]}
    return StageSpec(
        name=str(d["name"]), kind=d["kind"], init=d.get("init"), config=dict(d.get("config") or {}),
        train=_parts(d["train"], f"{where}.train"), val=_parts(d["val"], f"{where}.val"), steps=int(d["steps"]),
        stop_after=None if d.get("stop_after") is None else int(d["stop_after"]), select=select, seed=int(d["seed"]),
        options={k: d[k] for k in STAGE_OPTIONS if k in d}, average_with=average,
    )


def load_recipe(path: str | Path) -> Recipe:
    """Read and check a recipe file (ConfigError naming the bad entry)."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read training recipe {path}: {exc}") from None
    if not isinstance(data, dict) or set(data) - {"model", "shard_frames", "datasets", "defaults", "stages"}:
        raise ConfigError(f"recipe {path}: a mapping with model, shard_frames, datasets, defaults, stages")
    datasets = {str(k): _dataset(str(k), v, f"{path}: datasets.{k}") for k, v in (data.get("datasets") or {}).items()}
    defaults = dict(data.get("defaults") or {})
    stages = tuple(_stage(s, defaults, f"{path}: stages[{i}]") for i, s in enumerate(data.get("stages") or []))
    recipe = Recipe(str(data.get("model", "")), path, int(data.get("shard_frames", SHARD_FRAMES)), datasets, stages)
    check_recipe(recipe)
    return recipe


def check_recipe(r: Recipe) -> None:
    where = f"recipe {r.source}"
    if not r.model or not r.stages:
        raise ConfigError(f"{where}: needs a model and at least one stage")
    names = [s.name for s in r.stages]
    if len(set(names)) != len(names):
        raise ConfigError(f"{where}: stage names must be distinct, got {names}")
    for i, s in enumerate(r.stages):
        if isinstance(s.init, str) and s.init in names and names.index(s.init) >= i:
            raise ConfigError(f"{where}: stage {s.name} starts from {s.init}, which does not run before it")
        if s.average_with and (s.average_with["stage"] not in names or names.index(s.average_with["stage"]) >= i):
            raise ConfigError(f"{where}: stage {s.name} averages with {s.average_with['stage']}, which does not run "
                              "before it")
        if s.kind in ("refine", "refine-large", "vehicle-class") and not s.init:
            raise ConfigError(f"{where}: refine stage {s.name} needs init (the detector it refines)")
        if s.stop_after is not None and not 1 <= s.stop_after <= s.steps:
            raise ConfigError(f"{where}: stage {s.name}: stop_after must be in [1, steps]")
        for split, parts in (("train", s.train), ("val", s.val)):
            for p in parts:
                if p.dataset not in r.datasets:
                    raise ConfigError(f"{where}: stage {s.name} {split} names unknown dataset {p.dataset!r}")
                n, total = r.frames(p, split), getattr(r.datasets[p.dataset], split)
                # the stage's data are whole shards linked in order: a part must end on a shard boundary
                if not 0 < n <= total or n % r.shard_frames:
                    raise ConfigError(f"{where}: stage {s.name} {split} {p.dataset}:{n}: need 0 < frames <= "
                                      f"{total} and a multiple of shard_frames ({r.shard_frames})")


def scaled(r: Recipe, scale: float) -> Recipe:
    """The recipe with frame counts, steps and validation intervals multiplied by ``scale`` (0 < scale <= 1):
    1-frame shards, at least one frame and one step everywhere. A smoke test of every stage, not the weights."""
    if not 0 < scale <= 1:
        raise ConfigError(f"--scale must be in (0, 1], got {scale}")
    if scale == 1:
        return r

    def frames(n: int | None) -> int | None:
        return None if n is None else (0 if n == 0 else max(1, math.ceil(n * scale)))

    def steps(n: int) -> int:
        return max(1, round(n * scale))

    datasets = {k: replace(d, train=frames(d.train), val=frames(d.val)) for k, d in r.datasets.items()}
    stages = []
    for s in r.stages:
        options = dict(s.options)
        if "val_every" in options:
            options["val_every"] = steps(options["val_every"])
        n = steps(s.steps)
        stages.append(replace(
            s, steps=n, stop_after=None if s.stop_after is None else min(n, steps(s.stop_after)), options=options,
            train=tuple(replace(p, frames=frames(p.frames)) for p in s.train),
            val=tuple(replace(p, frames=frames(p.frames)) for p in s.val)))
    return replace(r, shard_frames=1, datasets=datasets, stages=tuple(stages))


# --------------------------------------------------------------------------- running


@dataclass(frozen=True)
class Runtime:
    """How to run, not what: these do not change the recipe's weights (the data order depends on seed and step)."""

    threads: int = 1
    workers: int = 1
    device: str = "auto"
    write_models: bool = False


def base_config(r: Recipe) -> ModelConfig:
    model = r.model
    if model.endswith((".yaml", ".yml")) and not Path(model).is_absolute():
        local = r.source.parent / model  # a config next to the recipe
        model = str(local) if local.is_file() else model
    return ModelConfig.load(model)


def stage_config(r: Recipe, stage: StageSpec) -> ModelConfig:
    base = base_config(r)
    return ModelConfig.from_dict(deep_merge(read_config_dict(base.source), stage.config), source=base.source)


def dataset_options(r: Recipe, d: DatasetSpec, out: Path, rt: Runtime) -> TrainOptions:
    return TrainOptions(config=base_config(r), work_dir=out / "data" / d.name, data_only=True, train_frames=d.train,
                        val_frames=d.val, seed=d.seed, sensors=d.sensors, sim_options=dict(d.sim), stack=d.stack,
                        shard_frames=r.shard_frames, threads=rt.threads, write_models=rt.write_models)


def stage_dir(out: Path, stage: StageSpec) -> Path:
    return out / "stages" / stage.name


def stage_weights(out: Path, stage: StageSpec) -> Path:
    """Exists once the stage finished (a running stage writes <stage>.best.safetensors)."""
    return stage_dir(out, stage) / f"{stage.name}.safetensors"


def stage_options(r: Recipe, stage: StageSpec, out: Path, init: Path | None, rt: Runtime) -> TrainOptions:
    o = dict(stage.options)
    aug = o.pop("intensity", None) or {}
    real = o.pop("real", None)
    if real is not None:  # {root: DIR relative to the recipe, sources: [kitti, av2], share: 0.5, paste_share: 0}
        if not isinstance(real, dict) or set(real) - {"root", "sources", "share", "paste_share"} or "root" not in real:
            raise ConfigError(f"stage {stage.name}: real needs root (and sources, share, paste_share), got {real!r}")
        root = Path(str(real["root"])).expanduser()
        o["real"] = RealTrainingSpec(os.path.normpath(root if root.is_absolute() else r.source.parent / root),
                                     tuple(real.get("sources") or ("kitti", "av2")), float(real.get("share", RealTrainingSpec.share)),
                                     float(real.get("paste_share", RealTrainingSpec.paste_share)))
    return TrainOptions(
        config=stage_config(r, stage), work_dir=stage_dir(out, stage),
        out=stage_dir(out, stage) / f"{stage.name}.best.safetensors", stage=stage.kind, init=init,
        train_frames=sum(r.frames(p, "train") for p in stage.train),
        val_frames=sum(r.frames(p, "val") for p in stage.val), steps=stage.steps, stop_after=stage.stop_after,
        select=stage.select, seed=stage.seed, resume=True, shard_frames=r.shard_frames,
        intensity=intensity_augment(aug.get("drop", 0.0), aug.get("gain"), aug.get("gamma", (1.0, 1.0))),
        threads=rt.threads, workers=rt.workers, device=rt.device, write_models=rt.write_models, **o,
    )


def link_stage_data(r: Recipe, stage: StageSpec, out: Path) -> None:
    """<stage>/data/{split}-NNNN.npz -> the datasets' shards, parts in the recipe's order (relative links)."""
    data = stage_dir(out, stage) / "data"
    data.mkdir(parents=True, exist_ok=True)
    for old in data.glob("*.npz"):
        if old.is_symlink():
            old.unlink()
    for split, parts in (("train", stage.train), ("val", stage.val)):
        k = 0
        for p in parts:
            for i in range(r.frames(p, split) // r.shard_frames):
                target = shard_path(out / "data" / p.dataset / "data", split, i)
                os.symlink(os.path.relpath(target, data), shard_path(data, split, k))
                k += 1


def resolve_init(r: Recipe, stage: StageSpec, out: Path) -> Path | None:
    if stage.init is None:
        return None
    if stage.init in {s.name for s in r.stages}:
        return stage_weights(out, r.stage(stage.init))
    p = Path(stage.init).expanduser()
    return p if p.is_absolute() else r.source.parent / p


def run_recipe(r: Recipe, out: Path, until: str | None = None, rt: Runtime = Runtime(), start: str | None = None) -> Path:
    """Run the stages from ``start`` (default: the first; the weights its init names must exist) up to
    ``until`` (default: the last) into ``out``; returns the last stage's weights, copied to
    ``out/<model>.safetensors`` when the recipe's last stage ran."""
    out = Path(out).expanduser()
    refuse_models_dir(out, rt.write_models, "the output directory")
    first = 0 if start is None else r.stages.index(r.stage(start))
    stages = r.stages[first: len(r.stages) if until is None else r.stages.index(r.stage(until)) + 1]
    if not stages:
        raise ConfigError(f"--until {until} comes before --from {start}")
    for stage in stages:
        weights = stage_weights(out, stage)
        if weights.is_file():
            log.info("stage %s: done (%s)", stage.name, weights)
            continue
        init = resolve_init(r, stage, out)
        if init is not None and not init.is_file():
            raise ConfigError(f"stage {stage.name}: init weights {init} do not exist")
        partner = r.stage(stage.average_with["stage"]) if stage.average_with else None
        if partner is not None and not stage_weights(out, partner).is_file():
            raise ConfigError(f"stage {stage.name}: the weights it averages with, {stage_weights(out, partner)}, "
                              "do not exist")
        for name in dict.fromkeys(p.dataset for p in (*stage.train, *stage.val)):
            train(dataset_options(r, r.datasets[name], out, rt))
        link_stage_data(r, stage, out)
        log.info("stage %s: %s, %d steps from %s", stage.name, stage.kind, stage.stop_after or stage.steps,
                 init or "random weights")
        result = train(stage_options(r, stage, out, init, rt))
        if result.out is None or not result.out.is_file():
            raise ConfigError(f"stage {stage.name} saved no weights (no validation ran)")
        if partner is not None:
            average_weights(result.out, stage_weights(out, partner), stage.average_with["weight"],
                            weights.with_suffix(".tmp"), tuple(stage.average_with["keep"]), label=f"stage {partner.name}")
            log.info("stage %s: averaged with stage %s (weight %g)", stage.name, partner.name,
                     stage.average_with["weight"])
        else:
            shutil.copyfile(result.out, weights.with_suffix(".tmp"))
        weights.with_suffix(".tmp").replace(weights)
    last = stage_weights(out, stages[-1])
    if stages[-1] is not r.stages[-1]:
        return last
    final = out / f"{base_config(r).name}.safetensors"
    refuse_models_dir(final, rt.write_models, "the final weights")
    shutil.copyfile(last, final)
    log.info("recipe %s finished: %s", r.source, final)
    return final
