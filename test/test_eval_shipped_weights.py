"""The shipped lite weights on a small fixed set of held-out simulated scenes (all five sensors).

The thresholds are the AP measured for the committed weights on exactly this set, minus a margin
(see docs/detector.md); a regression in the model, the pipeline (decode, levelling, voxelizer,
decoding, NMS) or the weights shows up here. Runs the whole pipeline eagerly with
sensor_height="auto", as `livox-infer eval --sim-frames 4 --seed 7` does.
"""

import math

import pytest
import torch

from livox_infer.model.evaluate import evaluate_on_simulation
from livox_infer.model.weights import read_metadata
from livox_infer.pipeline import DetectionPipeline

SENSORS = ("mid40", "mid70", "tele15", "horizon", "avia")
FRAMES_PER_SENSOR = 4
SEED = 7
# measured on this set for the committed models/lite.safetensors, minus a margin (docs/detector.md)
MIN_AP = {
    ("car", "bev@0.7"): 0.58,  # measured 0.682 (stage 7; stage 6 0.680)
    ("car", "bev@0.5"): 0.73,  # measured 0.861 (stage 6 0.834)
    ("pedestrian", "bev@0.5"): 0.17,  # measured 0.290 (stage 6 0.273)
    # cyclists: only 6 in this small set (AP 0.075 stage 7, 0.281 stage 6), too few for a stable threshold; see docs/detector.md
}


@pytest.fixture(scope="module")
def results():
    torch.set_num_threads(2)
    pipe = DetectionPipeline("lite", compile=False, sensor_height="auto", score_thresholds=0.1)  # eval's default floor

    def detect(points):
        pipe._mount_history.clear()
        d = pipe.detect(points)
        return d.boxes, d.labels, d.scores

    region = pipe.cfg.grid.region
    return evaluate_on_simulation({"model": detect}, SENSORS, FRAMES_PER_SENSOR, SEED, region=region,
                                  metrics=("bev",))["model"]


def test_shipped_weights_are_trained():
    meta = read_metadata(DetectionPipeline("lite", compile=False).weights_file)
    assert meta.get("trained") == "yes", "models/lite.safetensors is not a trained checkpoint"


@pytest.mark.parametrize("key", list(MIN_AP))
def test_shipped_weights_reach_measured_ap(results, key):
    cls, metric = key
    ap = results["all"].ap[cls][metric]
    assert not math.isnan(ap), f"no {cls} ground truth in the fixed set"
    assert MIN_AP[key] is not None, "thresholds not filled in"
    assert ap >= MIN_AP[key], f"{cls} {metric} = {ap:.3f} < {MIN_AP[key]}"
