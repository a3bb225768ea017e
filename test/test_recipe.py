"""The training recipe (models/lite.train.yaml): it loads, every stage runs at a tiny scale into one directory
(resumable), its stage 9 is the run that made the shipped weights, and training writes into models/ only
when told to."""

import argparse
import json
import os
import shlex
from pathlib import Path

import pytest
import torch
import yaml
from safetensors import safe_open
from safetensors.torch import load_file

from livox_infer.detector import ModelConfig, build_model, load_weights
from livox_infer.errors import ConfigError
from conftest import REPO
from livox_infer.resources import share_dir
from livox_infer.training import cli as train_cli
from livox_infer.training import recipe as recipe_mod
from livox_infer.training import train as train_mod
from livox_infer.training.recipe import Runtime, load_recipe, run_recipe, scaled

torch.set_num_threads(1)
RECIPE = share_dir() / "models" / "lite.train.yaml"
SCALE = 0.0002  # >= 1 frame per dataset and 1-9 steps per stage


def _meta(path):
    with safe_open(str(path), framework="pt") as f:
        return f.metadata()


# --------------------------------------------------------------------------- the whole recipe, tiny


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """Every stage of the shipped recipe at 1/5000 of its frames and steps (~1 min on one core)."""
    out = tmp_path_factory.mktemp("recipe") / "run"
    recipe = scaled(load_recipe(RECIPE), SCALE)
    final = run_recipe(recipe, out, rt=Runtime(threads=1, workers=0))
    return recipe, out, final


def test_recipe_runs_every_stage_in_order_into_one_directory(tiny_run):
    recipe, out, final = tiny_run
    assert final == out / "lite.safetensors"
    names = [s.name for s in recipe.stages]
    assert names[0] == "stage1" and names[-4:] == ["stage18-trucks", "stage18-trucks2", "stage18-large-refiner",
                                                   "stage19-ped-context"] and len(names) == 25
    for stage in recipe.stages:
        args = json.loads(_meta(recipe_mod.stage_weights(out, stage))["train_args"])
        assert (args["stage"], args["seed"], args["steps"]) == (stage.kind, stage.seed, stage.steps)
        init = recipe_mod.resolve_init(recipe, stage, out)
        assert args["init"] == (str(init) if init else None)  # each stage starts from the one before
    # stage 4 hands over its last validated weights (step 8000 of a longer schedule), not its best
    s4 = recipe.stage("stage4")
    assert _meta(recipe_mod.stage_weights(out, s4))["step"] == str(s4.stop_after) and s4.stop_after < s4.steps
    # the final weights are the last stage's, with its refiner, and load into the shipped lite config
    last = recipe_mod.stage_weights(out, recipe.stages[-1])
    assert final.read_bytes() == last.read_bytes()
    cfg = ModelConfig.load("lite")
    load_weights(build_model(cfg), cfg, final)
    # stage 18's output is its run averaged with stage 17 (its second refiner the run's own), and says so
    s18 = recipe_mod.stage_weights(out, recipe.stage("stage18-large-refiner"))
    meta = _meta(s18)
    assert meta["averaged_with"] == "stage stage17-large-refiner" and meta["average_weight"] == "0.5"
    s17 = load_file(str(recipe_mod.stage_weights(out, recipe.stage("stage17-large-refiner"))))
    run = load_file(str(out / "stages" / "stage18-large-refiner" / "stage18-large-refiner.best.safetensors"))
    got = load_file(str(s18))
    for prefix in ("backbone.", "head.", "refiner.", "refiner_large."):
        k = next(n for n in sorted(got) if n.startswith(prefix) and got[n].is_floating_point())
        want = run[k] if k.startswith("refiner_large.") else ((run[k].double() + s17[k].double()) / 2).to(run[k].dtype)
        torch.testing.assert_close(got[k], want, rtol=0, atol=0)
    # stage data: the datasets' shards linked in the recipe's order
    s2 = recipe.stage("stage2")
    links = sorted((out / "stages" / "stage2" / "data").glob("train-*.npz"))
    targets = [os.readlink(p) for p in links]
    assert len(links) == sum(recipe.frames(p, "train") for p in s2.train)
    assert [Path(t).parts[-3] for t in targets] == ["W1", "W1", "V1", "V1"]


def test_a_finished_stage_is_skipped(tiny_run, monkeypatch):
    recipe, out, final = tiny_run

    def no_training(options):
        raise AssertionError(f"trained again: {options.work_dir}")

    monkeypatch.setattr(recipe_mod, "train", no_training)
    assert run_recipe(recipe, out, rt=Runtime(threads=1, workers=0)) == final
    assert run_recipe(recipe, out, until="stage3", rt=Runtime(threads=1, workers=0)) == \
        recipe_mod.stage_weights(out, recipe.stage("stage3"))


# --------------------------------------------------------------------------- stage 9 = the run that made the weights

# The commands of scripts/recipes/lite_stage9.sh as run on 2026-12-03 (09:24-11:01 UTC) for the shipped weights,
# before the script was replaced by the recipe; budgets replaced by the steps the runs reached (RUN/history.jsonl:
# detector 7456, REF/history.jsonl: refiner 2791).
STAGE9_DATA = {
    "S1": "--train-frames 1500 --val-frames 100 --seed 201 --sensors hdl64,vlp32,os64 --sim-option ego_speed=[0,15] "
          "--sim-option yaw_rate_dps=[-15,15] --sim-option sensor_height=[1.4,2.2] --sim-option clutter=1.5",
    "S3": "--train-frames 750 --val-frames 0 --seed 203 --sensors hdl64,vlp32,os64 --sim-option n_cyclists=7 "
          "--sim-option n_pedestrians=8 --sim-option sensor_height=[1.4,2.2] --sim-option clutter=1.5",
    "S2": "--train-frames 1500 --val-frames 100 --seed 202 --sensors mid40,mid70,tele15,horizon,avia "
          "--sim-option ego_speed=[0,15] --sim-option yaw_rate_dps=[-15,15] --sim-option sensor_height=[1.0,2.2] "
          "--sim-option clutter=1.5",
    "S4": "--train-frames 500 --val-frames 0 --seed 204 --sensors mid40,mid70,tele15,horizon,avia "
          "--sim-option n_cyclists=7 --sim-option n_pedestrians=8 --sim-option clutter=2.0",
}
AUG = "--intensity-drop 0.5 --intensity-gain 0.25 4 --intensity-gamma 0.6 1.6"
STAGE9_TRAIN = {
    "stage9": "--stage detector --train-frames 4250 --val-frames 200 --steps 7456 --batch 8 --lr 5e-4 "
              f"--val-every 750 --seed 301 {AUG}",
    "stage9-refine": "--stage refine --train-frames 4250 --val-frames 200 --steps 2791 --batch 8 --lr 5e-4 "
                     f"--val-every 500 --seed 311 {AUG}",
}
# stage 10 (2026-12-03): the refiner run as started (--steps 2500 --time-budget 18 stopped it at step 1504; the
# recipe's schedule follows the steps it reached)
STAGE10_TRAIN = {
    "stage10-refine": "--stage refine --train-frames 4250 --val-frames 200 --steps 1504 --batch 8 --lr 4e-4 "
                      f"--val-every 500 --seed 511 {AUG}",
}
# how a run is executed, where it writes, or when it stops by the clock: not part of what it trains
NOT_RECIPE = {"config", "out", "work_dir", "init", "threads", "workers", "device", "resume", "keep_checkpoints",
              "time_budget", "data_only", "write_models", "shard_frames"}


def _cli_options(flags):
    p = argparse.ArgumentParser()
    train_mod.add_arguments(p)
    return train_mod.options_from_args(p.parse_args(shlex.split(flags)))


def _recipe_fields(options):
    return {k: v for k, v in json.loads(options.to_json()).items() if k not in NOT_RECIPE}


STAGE12_DATA = {  # the commands that made stage 12's (and 13's) shards (2026-12-05)
    "R2": "--train-frames 1000 --val-frames 100 --seed 402",
    "T1": "--train-frames 500 --val-frames 100 --seed 403 --sim-option large_vehicles=3",
    "M1": "--train-frames 900 --val-frames 100 --seed 404 --stack 2,4",
    "M2": "--train-frames 900 --val-frames 100 --seed 405 --stack 2,4",
    "T2": "--train-frames 1000 --val-frames 100 --seed 407 --sim-option large_vehicles=3",  # stage 15 (2026-12-06)
    "T3": "--train-frames 1000 --val-frames 0 --seed 408 --sim-option large_vehicles=3",  # stage 16 / 17 (2026-12-06)
    "C1": "--train-frames 500 --val-frames 0 --seed 821 --sim-option ped_context=0.8",  # stage 19 (2026-12-06)
    "C2": "--train-frames 500 --val-frames 0 --seed 822 --sim-option ped_context=0.8",
}


@pytest.mark.parametrize("name", sorted(STAGE12_DATA))
def test_stage12_datasets_are_the_commands_that_made_their_shards(name, tmp_path):
    r = load_recipe(RECIPE)
    ours = recipe_mod.dataset_options(r, r.datasets[name], tmp_path, Runtime())
    want = _cli_options("--data-only --sensors hdl64,vlp32,os64,mid40,mid70,tele15,horizon,avia "
                        "--sim-option ego_speed=[0,15] --sim-option yaw_rate_dps=[-15,15] "
                        "--sim-option sensor_height=[1.0,2.2] --sim-option clutter=1.5 " + STAGE12_DATA[name])
    assert _recipe_fields(ours) == _recipe_fields(want)


def test_stage9_datasets_are_the_commands_that_made_the_shipped_weights(tmp_path):
    r = load_recipe(RECIPE)
    for name, flags in STAGE9_DATA.items():
        ours = recipe_mod.dataset_options(r, r.datasets[name], tmp_path, Runtime())
        want = _cli_options(flags + " --data-only")
        assert _recipe_fields(ours) == _recipe_fields(want), name


@pytest.mark.parametrize("stage", sorted(STAGE9_TRAIN))
def test_stage9_runs_are_the_commands_that_made_the_shipped_weights(stage, tmp_path):
    r = load_recipe(RECIPE)
    ours = recipe_mod.stage_options(r, r.stage(stage), tmp_path, None, Runtime())
    want = _cli_options(STAGE9_TRAIN[stage])
    assert _recipe_fields(ours) == _recipe_fields(want)
    # the model config: models/lite.yaml as it was then (intensity on), the init chain stage 8 -> 9 -> refiner
    assert ours.model_config().use_intensity and r.stage(stage).init == {"stage9": "stage8-refine3",
                                                                          "stage9-refine": "stage9"}[stage]
    # RUN/data of the script: train = S1 0-29, S2 0-29, S3 0-14, S4 0-9; val = S1 0-1, S2 0-1
    recipe_mod.link_stage_data(r, r.stage(stage), tmp_path)
    data = tmp_path / "stages" / stage / "data"
    got = {p.name: "/".join(Path(os.readlink(p)).parts[-3::2]) for p in data.glob("*.npz")}
    want_links = {}
    for split, parts in (("train", [("S1", 30), ("S2", 30), ("S3", 15), ("S4", 10)]), ("val", [("S1", 2), ("S2", 2)])):
        k = 0
        for ds, n in parts:
            for i in range(n):
                want_links[f"{split}-{k:04d}.npz"] = f"{ds}/{split}-{i:04d}.npz"
                k += 1
    assert got == want_links


def test_stage10_is_the_command_that_made_the_shipped_weights(tmp_path):
    r = load_recipe(RECIPE)
    stage = r.stage("stage10-refine")
    ours = recipe_mod.stage_options(r, stage, tmp_path, None, Runtime())
    assert _recipe_fields(ours) == _recipe_fields(_cli_options(STAGE10_TRAIN["stage10-refine"]))
    assert ours.model_config().use_intensity and stage.init == "stage9-refine"
    assert [p.dataset for p in stage.train] == ["S1", "S2", "S3", "S4"] and all(p.frames is None for p in stage.train)


# stage 12 (2026-12-05): the commands of the shipped runs (docs/training.md, "Real labelled scans in training"); the
# same commands with --real-sources kitti / av2 made models/cv/lite.trained-on-*.safetensors
_REAL = "--real ../shared/data/real_dev --real-sources kitti,av2 --real-share 0.35 --fov-crop 0.3"
STAGE12_TRAIN = {
    "stage12-trucks": ("--stage detector --train-frames 1000 --val-frames 100 --steps 2000 --val-every 500 --lr 5e-4 "
                       "--seed 711 " + _REAL, "stage10-refine", ["R2"]),
    "stage12-trucks2": ("--stage detector --train-frames 1500 --val-frames 200 --steps 1500 --val-every 500 --lr 3e-4 "
                        "--seed 712 " + _REAL, "stage12-trucks", ["R2", "T1"]),
}


# stage 13 (2026-12-05): the runs with --model <models/lite.yaml with grid.age_channel_s: 0.5>; the same commands with
# --real-sources kitti / av2 made models/cv/lite.trained-on-*.safetensors
STAGE13_TRAIN = {
    "stage13-stacked": ("--stage detector --train-frames 3300 --val-frames 200 --steps 1500 --val-every 500 --lr 3e-4 "
                        "--seed 713 " + _REAL, "stage12-trucks2", ["R2", "T1", "M1", "M1"]),
    "stage13-stacked2": ("--stage detector --train-frames 5100 --val-frames 200 --steps 1500 --val-every 500 "
                         "--lr 4e-4 --seed 714 " + _REAL, "stage13-stacked", ["R2", "T1", "M1", "M1", "M2", "M2"]),
}


# stage 15 (2026-12-06): the same, truck-rich (T1 twice and T2 beside R2, M1, M2); the same commands with --real-sources
# kitti / av2 made models/cv/lite.trained-on-*.safetensors
STAGE15_TRAIN = {
    "stage15-trucks": ("--stage detector --train-frames 4800 --val-frames 200 --steps 1500 --val-every 500 --lr 3e-4 "
                       "--seed 715 " + _REAL, "stage13-stacked2", ["R2", "T1", "T1", "T2", "M1", "M2"]),
    "stage15-trucks2": ("--stage detector --train-frames 4800 --val-frames 200 --steps 1500 --val-every 500 --lr 3e-4 "
                        "--seed 716 " + _REAL, "stage15-trucks", ["R2", "T1", "T1", "T2", "M1", "M2"]),
}


def _check_real_fold_stage(stage, commands, tmp_path, unrecorded=("select",)):
    """A real-fold stage of the recipe (stage 12 or 13) runs the command of its table (flags, init, train data), the
    keys in ``unrecorded`` aside (the runs kept every checkpoint and the last was taken: select last, stop_after);
    returns the stage's options."""
    r = load_recipe(RECIPE)
    ours = recipe_mod.stage_options(r, r.stage(stage), tmp_path, None, Runtime())
    flags, init, train = commands[stage]
    mine, theirs = _recipe_fields(ours), _recipe_fields(_cli_options(flags))
    assert Path(mine["real"].pop("root")).resolve() == (REPO.parent / "shared" / "data" / "real_dev").resolve()
    theirs["real"].pop("root")
    for key in unrecorded:
        mine.pop(key), theirs.pop(key)
    assert mine == theirs
    assert r.stage(stage).init == init and [p.dataset for p in r.stage(stage).train] == train
    return ours


@pytest.mark.parametrize("stage", sorted(STAGE13_TRAIN))
def test_stage13_is_the_command_that_made_the_shipped_weights(stage, tmp_path):
    # stage13-stacked2 was stopped by hand at step 1000 of its schedule (stop_after in the recipe)
    ours = _check_real_fold_stage(stage, STAGE13_TRAIN, tmp_path, unrecorded=("select", "stop_after"))
    cfg = ours.model_config()
    assert cfg.grid.age_channel_s == 0.5 and not cfg.use_intensity and cfg.classes == ModelConfig.load("lite").classes
    assert cfg.architecture_hash() == _without_second_refiner()  # the shipped network before stage 17
    assert load_recipe(RECIPE).stage("stage13-stacked2").stop_after == 1000


@pytest.mark.parametrize("stage", sorted(STAGE15_TRAIN))
def test_stage15_is_the_command_that_made_the_shipped_weights(stage, tmp_path):
    ours = _check_real_fold_stage(stage, STAGE15_TRAIN, tmp_path)
    cfg = ours.model_config()
    assert cfg.architecture_hash() == _without_second_refiner()  # the shipped network before stage 17


def _lite_as_trained() -> ModelConfig:
    """models/lite.yaml on the 57.6 m grid every stage trained on (it runs the weights on 80 m since 2026-12-07)."""
    return ModelConfig.load("lite").with_extent((0.0, 57.6, -28.8, 28.8))


def _without_second_refiner():
    from dataclasses import replace

    return replace(_lite_as_trained(), refine_large=None).architecture_hash()


# stage 17 (2026-12-06): the second refiner's run, from the stage-15 weights (--model: models/lite.yaml)
STAGE17_TRAIN = ("--stage refine-large --refine-train-passes 2 --train-frames 3400 --val-frames 100 --steps 800 "
                 "--val-every 400 --lr 4e-4 --seed 731 --fov-crop 0.3")


# stage 18 (2026-12-06): two truck rounds on the six body styles (--model: models/lite.yaml), then the second refiner;
# the same detector commands with --real-sources kitti / av2 made the fold files' runs
STAGE18_TRAIN = {
    "stage18-trucks": ("--stage detector --train-frames 5300 --val-frames 200 --steps 1500 --val-every 500 --lr 2e-4 "
                       "--seed 791 " + _REAL, "stage17-large-refiner", ["R2", "T1", "T2", "T3", "M1", "M2"]),
    "stage18-trucks2": ("--stage detector --train-frames 5800 --val-frames 200 --steps 1500 --val-every 500 --lr 3e-4 "
                        "--seed 792 " + _REAL, "stage18-trucks", ["R2", "T1", "T1", "T2", "T3", "M1", "M2"]),
}


@pytest.mark.parametrize("stage", sorted(STAGE18_TRAIN))
def test_stage18_is_the_command_that_made_the_shipped_weights(stage, tmp_path):
    ours = _check_real_fold_stage(stage, STAGE18_TRAIN, tmp_path)
    assert ours.model_config().architecture_hash() == _lite_as_trained().architecture_hash()


def test_stage18_second_refiner_is_the_command_that_made_the_shipped_weights(tmp_path):
    r = load_recipe(RECIPE)
    stage = r.stage("stage18-large-refiner")
    ours = recipe_mod.stage_options(r, stage, tmp_path, None, Runtime())
    mine, theirs = _recipe_fields(ours), _recipe_fields(_cli_options(STAGE17_TRAIN.replace("--seed 731", "--seed 793")))
    # the run kept every checkpoint (--keep-checkpoints) and its last, step 800, was taken (its best was step 400)
    assert mine.pop("select") == "last" and theirs.pop("select") == "best"
    assert mine == theirs
    assert stage.init == "stage18-trucks2" and [p.dataset for p in stage.train] == ["T1", "T2", "T3", "M1"]
    assert stage.average_with == {"stage": "stage17-large-refiner", "weight": 0.5, "keep": ["refiner_large."]}


# stage 19 (2026-12-06): one detector round with the pedestrians-in-context sets (--model: models/lite.yaml); the
# same command with --real-sources kitti / av2 from each fold's stage-18 file made the fold files' runs
STAGE19_TRAIN = {
    "stage19-ped-context": ("--stage detector --train-frames 6300 --val-frames 200 --steps 1000 --val-every 500 "
                            "--lr 2e-4 --seed 821 " + _REAL, "stage18-large-refiner",
                            ["R2", "T1", "T2", "T3", "M1", "M2", "C1", "C2"]),
}


def test_stage19_is_the_command_that_made_the_shipped_weights(tmp_path):
    ours = _check_real_fold_stage("stage19-ped-context", STAGE19_TRAIN, tmp_path)
    assert ours.model_config().architecture_hash() == _lite_as_trained().architecture_hash()
    # the shipped file is that run's last step, from the stage-18 file, on both folds
    args = json.loads(_meta(share_dir() / "models" / "lite.safetensors")["train_args"])
    assert (args["stage"], args["seed"], args["steps"], args["lr"]) == ("detector", 821, 1000, 2e-4)
    assert args["real"]["sources"] == ["kitti", "av2"]


def test_stage17_is_the_command_that_made_the_shipped_weights(tmp_path):
    r = load_recipe(RECIPE)
    stage = r.stage("stage17-large-refiner")
    ours = recipe_mod.stage_options(r, stage, tmp_path, None, Runtime())
    assert _recipe_fields(ours) == _recipe_fields(_cli_options(STAGE17_TRAIN))
    assert stage.init == "stage15-trucks2" and [p.dataset for p in stage.train] == ["T1", "T2", "T3", "M1"]
    assert ours.model_config().architecture_hash() == _lite_as_trained().architecture_hash()


@pytest.mark.parametrize("stage", sorted(STAGE12_TRAIN))
def test_stage12_is_the_command_that_made_the_shipped_weights(stage, tmp_path):
    cfg = _check_real_fold_stage(stage, STAGE12_TRAIN, tmp_path).model_config()
    assert not cfg.use_intensity and cfg.classes == ("car", "pedestrian", "cyclist", "truck", "bus")


def test_the_shipped_weights_record_the_recipes_last_stage():
    """models/lite.safetensors holds the last (stage-19) run's own arguments: the recipe's last stage must match them;
    its detector was trained on both folds of the real scans, and the file says so."""
    r = load_recipe(RECIPE)
    shipped = json.loads(_meta(share_dir() / "models" / "lite.safetensors")["train_args"])
    last = r.stages[-1]
    ours = json.loads(recipe_mod.stage_options(r, last, Path("/x"), None, Runtime()).to_json())
    assert shipped["stage"] == ours["stage"] == "detector"
    assert shipped["real"]["sources"] == ours["real"]["sources"] == ["kitti", "av2"]
    assert shipped["real"]["share"] == ours["real"]["share"] and shipped["fov_crop"] == ours["fov_crop"]
    assert _meta(share_dir() / "models" / "lite.safetensors")["real_sources"] == "av2,kitti"
    # trained on the 57.6 m grid the recipe pins (lite.yaml runs it on 80 m): the same network otherwise
    assert _meta(share_dir() / "models" / "lite.safetensors")["architecture_hash"] == \
        recipe_mod.stage_config(r, last).architecture_hash() == _lite_as_trained().architecture_hash()
    for key in ("seed", "lr", "batch", "val_every", "train_frames", "val_frames", "weight_decay", "paste_probability",
                "neighbour_weight", "corner_weight", "refine_box_beta", "refine_train_passes", "precision"):
        assert shipped[key] == ours[key], key
    # recorded flat by runs before the re-fold (stage 9), as TrainOptions' own "intensity" section since
    recorded = shipped.get("intensity") or {"drop": shipped["intensity_drop"], "gain": shipped["intensity_gain"],
                                            "gamma": shipped["intensity_gamma"]}
    assert (recorded["drop"], recorded["gain"], recorded["gamma"]) == \
        (ours["intensity"]["drop"], ours["intensity"]["gain"], ours["intensity"]["gamma"])
    assert int(_meta(share_dir() / "models" / "lite.safetensors")["step"]) <= last.steps


# --------------------------------------------------------------------------- models/ is written only when told


def test_training_refuses_to_write_into_models_unless_told(tmp_path, capsys):
    models = share_dir() / "models"
    shipped = (models / "lite.safetensors").read_bytes()
    opts = train_mod.TrainOptions(config="lite", work_dir=tmp_path / "w", out=models / "lite.safetensors",
                                  data_only=True, train_frames=1, val_frames=0, shard_frames=1, threads=1)
    with pytest.raises(ConfigError, match="--write-models"):
        train_mod.train(opts)
    assert not (tmp_path / "w").exists()  # refused before anything was simulated
    with pytest.raises(ConfigError, match="models/"):
        train_mod.train(train_mod.TrainOptions(config="lite", work_dir=models / "work", data_only=True))
    # the CLI: the README's train command with --out into models/ fails with one line, the file untouched
    p = argparse.ArgumentParser()
    train_mod.add_arguments(p)
    args = p.parse_args(["--config", "lite", "--out", str(models / "lite.safetensors"), "--work-dir",
                         str(tmp_path / "w"), "--threads", "1", "--steps", "1"])
    assert train_mod.main(args) == 2 and "--write-models" in capsys.readouterr().err
    q = argparse.ArgumentParser()
    train_cli.add_arguments(q)
    recipe_args = q.parse_args([str(RECIPE), "--out", str(models), "--scale", "0.0001"])
    assert train_cli.main(recipe_args) == 2 and "--write-models" in capsys.readouterr().err
    assert (models / "lite.safetensors").read_bytes() == shipped
    # told to: the guard lets it through (data only here, so nothing is written into models/)
    opts.write_models = True
    assert train_mod.train(opts).out is None


# --------------------------------------------------------------------------- recipe files


def _write(tmp_path, **over):
    data = {"model": "lite", "datasets": {"A": {"seed": 1, "train": 100, "val": 50}},
            "stages": [{"name": "one", "kind": "detector", "train": ["A"], "val": ["A"], "steps": 10, "seed": 0}]}
    data.update(over)
    p = tmp_path / "r.train.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


@pytest.mark.parametrize("over, message", [
    ({"stages": [{"name": "one", "kind": "detector", "train": ["B"], "val": ["A"], "steps": 10, "seed": 0}]},
     "unknown dataset"),
    ({"stages": [{"name": "one", "kind": "detector", "train": ["A:70"], "val": ["A"], "steps": 10, "seed": 0}]},
     "multiple of shard_frames"),
    ({"stages": [{"name": "one", "kind": "detector", "init": "two", "train": ["A"], "val": ["A"], "steps": 1,
                  "seed": 0},
                 {"name": "two", "kind": "detector", "train": ["A"], "val": ["A"], "steps": 1, "seed": 0}]},
     "does not run before it"),
    ({"stages": [{"name": "one", "kind": "refine", "train": ["A"], "val": ["A"], "steps": 1, "seed": 0}]},
     "needs init"),
    ({"stages": [{"name": "one", "kind": "detector", "train": ["A"], "val": ["A"], "steps": 1, "seed": 0,
                  "time_budget": 70}]}, "unknown keys"),
    ({"stages": [{"name": "one", "kind": "detector", "train": ["A"], "val": ["A"], "steps": 1, "seed": 0,
                  "average_with": {"stage": "one", "weight": 0.5}}]}, "averages with one, which does not run before"),
    ({"stages": [{"name": "one", "kind": "detector", "train": ["A"], "val": ["A"], "steps": 1, "seed": 0},
                 {"name": "two", "kind": "detector", "train": ["A"], "val": ["A"], "steps": 1, "seed": 0,
                  "average_with": {"stage": "one", "weight": 1.5}}]}, "weight in \\(0, 1\\]"),
])
def test_bad_recipes_are_refused_with_the_entry_named(tmp_path, over, message):
    with pytest.raises(ConfigError, match=message):
        load_recipe(_write(tmp_path, **over))


def test_scaled_recipe_keeps_the_order_and_reaches_every_stage():
    r = load_recipe(RECIPE)
    s = scaled(r, SCALE)
    assert [x.name for x in s.stages] == [x.name for x in r.stages] and s.shard_frames == 1
    assert all(x.steps >= 1 and x.options["val_every"] >= 1 for x in s.stages)
    assert s.datasets["S1"].train == 1 and s.datasets["WB"].val == 0
    assert scaled(r, 1.0) is r
    with pytest.raises(ConfigError):
        scaled(r, 0)


def test_from_a_stage_needs_its_init_and_runs_only_the_rest(tiny_run, tmp_path):
    recipe, out, _ = tiny_run
    with pytest.raises(ConfigError, match="init weights"):
        run_recipe(recipe, tmp_path, start="stage9-refine", rt=Runtime(threads=1, workers=0))
    src = recipe_mod.stage_weights(out, recipe.stage("stage9"))
    dst = recipe_mod.stage_weights(tmp_path, recipe.stage("stage9"))
    dst.parent.mkdir(parents=True)
    dst.write_bytes(src.read_bytes())
    final = run_recipe(recipe, tmp_path, start="stage9-refine", rt=Runtime(threads=1, workers=0))
    assert final == tmp_path / "lite.safetensors"
    assert sorted(p.name for p in (tmp_path / "stages").iterdir()) == [
        "stage10-refine", "stage12-trucks", "stage12-trucks2", "stage13-stacked", "stage13-stacked2", "stage15-trucks",
        "stage15-trucks2", "stage17-large-refiner", "stage18-large-refiner", "stage18-trucks", "stage18-trucks2",
        "stage19-ped-context", "stage9", "stage9-refine"]
    first = json.loads(_meta(recipe_mod.stage_weights(tmp_path, recipe.stage("stage9-refine")))["train_args"])
    assert first["init"] == str(dst) and first["stage"] == "refine"
    args = json.loads(_meta(recipe_mod.stage_weights(tmp_path, recipe.stage("stage10-refine")))["train_args"])
    assert args["init"] == str(recipe_mod.stage_weights(tmp_path, recipe.stage("stage9-refine"))) and args["stage"] == "refine"
    # stages 12-13 trained on the real scans of both folds, and the weights say so (eval --cross-validate reads it)
    assert _meta(final)["real_sources"] == "av2,kitti"  # stage 17 (no real scans) keeps what its init saw
    stage15 = recipe_mod.stage_weights(tmp_path, recipe.stage("stage15-trucks2"))
    assert json.loads(_meta(stage15)["train_args"])["real"]["sources"] == ["kitti", "av2"]


# the commits that shipped each stage's weights; every weights file records the arguments of the run that made it
SHIPPED = {"54475a4": "stage2", "2ea4602": "stage3", "cdefe1e": "stage5", "b81dc91": "stage6", "3d40829": "stage7",
           "b785cd8": "stage8-refine2", "0ac1e7e": "stage8-refine3", "1571ba0": "stage9-refine"}
# options that did not exist yet when a run was made, and what their absence meant
ABSENT = {"paste_probability": 0.0, "refine_train_passes": 1}


def _shipped_args(commit, tmp_path):
    import subprocess

    repo = Path(__file__).resolve().parent.parent
    got = subprocess.run(["git", "-C", str(repo), "show", f"{commit}:models/lite.safetensors"], capture_output=True)
    if got.returncode:
        pytest.skip(f"git history with {commit} not available")
    path = tmp_path / f"{commit}.safetensors"
    path.write_bytes(got.stdout)
    return json.loads(_meta(path)["train_args"]), int(_meta(path)["step"])


@pytest.mark.parametrize("commit", sorted(SHIPPED))
def test_recipe_stages_match_the_arguments_recorded_in_each_shipped_weights_file(commit, tmp_path):
    r = load_recipe(RECIPE)
    stage = r.stage(SHIPPED[commit])
    recorded, step = _shipped_args(commit, tmp_path)
    ours = json.loads(recipe_mod.stage_options(r, stage, tmp_path, None, Runtime()).to_json())
    for key in ("seed", "lr", "batch", "val_every", "train_frames", "val_frames", "weight_decay", "neighbour_weight",
                "corner_weight", "refine_box_beta", "paste_probability", "refine_train_passes"):
        if key in ("refine_box_beta", "refine_train_passes") and stage.kind != "refine":
            continue
        want = recorded.get(key, ABSENT.get(key, ours[key]))
        passes = recipe_mod.stage_config(r, stage).refine.passes if stage.kind == "refine" else None
        if key == "refine_train_passes":  # None: the config's refine.passes
            want, got = want or passes, ours[key] or passes
        else:
            got = ours[key]
        assert got == want, (key, got, want)
    assert recorded.get("stage", "detector") == stage.kind and recorded["sim_option"] == []
    assert step <= (stage.stop_after or stage.steps)  # the shipped checkpoint lies within the recorded run



def test_single_run_flags_are_refused_with_a_recipe(tmp_path, capsys):
    p = argparse.ArgumentParser()
    train_cli.add_arguments(p)
    args = p.parse_args([str(RECIPE), "--out", str(tmp_path), "--steps", "10", "--lr", "0.1"])
    assert train_cli.main(args) == 2
    assert "--lr, --steps" in capsys.readouterr().err and not any(tmp_path.iterdir())
