"""The shipped lite weights on a small fixed set of held-out simulated scenes (all five sensors).

The thresholds are the AP measured for the committed weights on exactly this set, minus a margin
(see docs/detector.md); a regression in the model, the pipeline (decode, levelling, voxelizer,
decoding, NMS) or the weights shows up here. Runs the whole pipeline eagerly with
sensor_height="auto", as `livox-infer eval --sim-frames 4 --seed 7` does.
"""

import json
import math

import pytest
import torch

from livox_infer.evaluation.simulated import evaluate_on_simulation, scan_detector
from livox_infer.detector.weights import read_metadata
from livox_infer.pipeline import DetectionPipeline

pytestmark = pytest.mark.slow  # the shipped weights over 20 simulated frames, twice: ~20 s

SENSORS = ("mid40", "mid70", "tele15", "horizon", "avia")
FRAMES_PER_SENSOR = 4
SEED = 7
# measured on this set for the committed models/lite.safetensors, minus a margin (docs/detector.md)
MIN_AP = {
    # measured 2026-12-05 for stage 12 on today's scenes of this set (54 / 32 / 9 GT; the labelled trucks changed them)
    ("car", "bev@0.7"): 0.73,  # measured 0.806 (stage 15; stage 13 0.814, stage 12 0.812; stage 10 0.786 earlier)
    ("car", "bev@0.5"): 0.82,  # measured 0.898 (stage 13 0.897, stage 12 0.899, stage 10 0.894)
    ("pedestrian", "bev@0.5"): 0.55,  # measured 0.771 (stage 13 0.714, stage 12 0.666, stage 10 0.766 earlier)
    # cyclists: only 9 in this small set (AP 0.325 stage 12, 0.025 stage 10), too few for a stable threshold; see docs/detector.md
}
MIN_REFINE_GAIN_PEDESTRIAN = 0.2  # measured 0.771 - 0.376 = 0.395 (stage 15; stage 13 0.415, stage 12 0.320)


def _evaluate(refine: bool):
    torch.set_num_threads(2)
    pipe = DetectionPipeline("lite", compile=False, sensor_height="auto", score_thresholds=0.1,  # eval's default floor
                             refine=refine)

    detect = scan_detector(pipe)
    region = pipe.cfg.grid.region
    return evaluate_on_simulation({"model": detect}, SENSORS, FRAMES_PER_SENSOR, SEED, region=region,
                                  metrics=("bev",))["model"]


@pytest.fixture(scope="module")
def results():
    return _evaluate(refine=True)


def test_shipped_weights_are_trained():
    pipe = DetectionPipeline("lite", compile=False)
    meta = read_metadata(pipe.weights_file)
    assert meta.get("trained") == "yes", "models/lite.safetensors is not a trained checkpoint"
    if pipe.cfg.refine is not None:
        if json.loads(meta["train_args"])["stage"] != "refine":
            # stage 12 fine-tuned the detector only (its refiner is stage 10's, which lite-sim ships): the refiner
            # tensors must be a trained stage-2 refiner's, byte for byte, except the class inputs the truck and bus
            # classes added to its first layer (zero columns after the old one-hot)
            from safetensors.torch import load_file

            from livox_infer.detector.weights import REFINER_FIRST_HIDDEN

            sim = DetectionPipeline("lite-sim", compile=False)
            assert json.loads(read_metadata(sim.weights_file)["train_args"])["stage"] == "refine"
            mine, theirs = load_file(str(pipe.weights_file)), load_file(str(sim.weights_file))
            names = [k for k in mine if k.startswith("refiner.") and k != REFINER_FIRST_HIDDEN]
            assert names and all(torch.equal(mine[k], theirs[k]) for k in names), \
                "the stage-2 refiner in the weights is not a trained one"
            grown, old = mine[REFINER_FIRST_HIDDEN], theirs[REFINER_FIRST_HIDDEN]
            start = pipe.cfg.refine.point_channels[-1] + sim.cfg.num_classes
            added = pipe.cfg.num_classes - sim.cfg.num_classes
            assert torch.equal(grown[:, :start], old[:, :start]) and torch.equal(grown[:, start + added:], old[:, start:])
            assert torch.count_nonzero(grown[:, start:start + added]) == 0


@pytest.mark.parametrize("key", list(MIN_AP))
def test_shipped_weights_reach_measured_ap(results, key):
    cls, metric = key
    ap = results["all"].ap[cls][metric]
    assert not math.isnan(ap), f"no {cls} ground truth in the fixed set"
    assert MIN_AP[key] is not None, "thresholds not filled in"
    assert ap >= MIN_AP[key], f"{cls} {metric} = {ap:.3f} < {MIN_AP[key]}"


def test_refiner_beats_stage_one_on_pedestrians(results):
    stage1 = _evaluate(refine=False)["all"].ap["pedestrian"]["bev@0.5"]
    refined = results["all"].ap["pedestrian"]["bev@0.5"]
    assert refined - stage1 >= MIN_REFINE_GAIN_PEDESTRIAN, f"refine {refined:.3f} vs stage 1 alone {stage1:.3f}"
