"""Stage 1's backbone and neck in bf16 (livox_infer/detector/precision.py): what "auto" picks, and the detections
against fp32. Tolerances: scores within 0.03 and matched box centres within 0.1 m on the shipped weights (measured:
simulated AP within 0.001 of fp32, docs/detector.md Precision)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from livox_infer.detector import precision as precision_mod
from livox_infer.detector.config import ModelConfig
from livox_infer.detector.postprocess import build_inference_model
from livox_infer.errors import ConfigError
from livox_infer.pipeline import DetectionPipeline
from livox_infer.sim import simulate_frame


def test_auto_is_bf16_only_on_a_cpu_with_amx(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.setattr(precision_mod, "cpu_has_amx", lambda: True)
    assert precision_mod.resolve_precision("auto", cpu) == "bf16"
    assert precision_mod.resolve_precision("auto", cuda) == "fp32"  # not measured on a GPU: fp32 there
    monkeypatch.setattr(precision_mod, "cpu_has_amx", lambda: False)
    assert precision_mod.resolve_precision("auto", cpu) == "fp32"  # bf16 would be emulated: slower
    assert precision_mod.resolve_precision("bf16", cpu) == "bf16" and precision_mod.resolve_precision("fp32", cpu) == "fp32"
    with pytest.raises(ConfigError, match="precision must be one of"):
        precision_mod.resolve_precision("fp16", cpu)
    with pytest.raises(ConfigError, match="precision must be one of"):
        DetectionPipeline("lite", compile=False, precision="half")


def test_bf16_runs_the_backbone_and_neck_in_bf16_and_the_head_in_fp32():
    cfg = ModelConfig.load("lite")
    infer, _ = build_inference_model(cfg, cfg.weights_path(), torch.device("cpu"), precision="bf16")
    seen = {}
    hooks = [m.register_forward_hook(lambda mod, i, o, name=name: seen.__setitem__(name, o.dtype))
             for name, m in (("neck", infer.net.neck), ("head", infer.net.head.heatmap))]
    x = torch.zeros((1, *cfg.grid.shape)).contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        scores, _, boxes = infer(x)
    for h in hooks:
        h.remove()
    assert seen == {"neck": torch.bfloat16, "head": torch.float32}
    assert scores.dtype == torch.float32 and boxes.dtype == torch.float32


def test_bf16_detections_match_fp32():
    fp32 = DetectionPipeline("lite", compile=False, precision="fp32", sensor_height=1.7)
    bf16 = DetectionPipeline("lite", compile=False, precision="bf16", sensor_height=1.7)
    assert (fp32.precision, bf16.precision) == ("fp32", "bf16")
    matched = 0
    for seed in (3, 4):
        f = simulate_frame("avia", seed=seed, scene="street", sensor_height=1.7, pitch_deg=0, roll_deg=0)
        cloud = np.ascontiguousarray(f.points[f.valid])
        a, b = fp32.detect(cloud), bf16.detect(cloud)
        assert abs(len(a) - len(b)) <= 1  # a box at the threshold may fall either way
        for box, score, label in zip(a.boxes, a.scores, a.labels):
            d = np.hypot(*(b.boxes[:, :2] - box[:2]).T) if len(b) else np.array([np.inf])
            j = int(np.argmin(d))
            if score < fp32.cfg.score_thresholds[label] + 0.1:
                continue  # near the threshold: may be missing from the other list
            assert d[j] < 0.1 and b.labels[j] == label and abs(b.scores[j] - score) < 0.03, (seed, box, score)
            matched += 1
    assert matched >= 10


def test_bf16_inference_leaves_autocasts_weight_cache_empty():
    """The inference network's weights need no gradient, so bf16 autocast caches no weight casts: clearing a filled
    cache at autocast's exit took the GIL under the cache's mutex and deadlocked eager frames against torch.compile
    tracing in the background thread (compile_in_background, issue 33)."""
    infer, _ = build_inference_model(ModelConfig.load("lite"), ModelConfig.load("lite").weights_path(),
                                     torch.device("cpu"), precision="bf16")
    assert not any(p.requires_grad for p in infer.parameters())
