"""`weights.average_weights`: the recipe's average_with (stage 18 = its run averaged with stage 17)."""

import pytest
import torch
from safetensors.torch import load_file

from livox_infer.detector import ModelConfig, build_model, load_weights, save_weights
from livox_infer.detector.weights import average_weights, read_metadata, trained_real_sources
from livox_infer.errors import WeightsError
from conftest import tiny_model_dict


def _file(tmp_path, name, seed, extra):
    cfg = ModelConfig.from_dict(tiny_model_dict())
    torch.manual_seed(seed)
    net = build_model(cfg)
    for p in net.parameters():
        p.data.normal_()
    for m in net.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_var.uniform_(0.5, 2.0)
            m.num_batches_tracked.fill_(seed)
    path = tmp_path / f"{name}.safetensors"
    save_weights(net, cfg, path, extra=extra)
    return path, cfg


def test_average_is_a_weighted_mean_except_kept_and_integer_tensors(tmp_path):
    new, cfg = _file(tmp_path, "new", 1, {"real_sources": "kitti", "step": "800"})
    old, _ = _file(tmp_path, "old", 2, {"real_sources": "av2"})
    out = tmp_path / "avg.safetensors"
    average_weights(new, old, 0.25, out, keep=("refiner.",), label="stage old")
    a, b, got = load_file(str(new)), load_file(str(old)), load_file(str(out))
    kept = [k for k in got if k.startswith("refiner.")]
    assert kept and all(torch.equal(got[k], a[k]) for k in kept)
    for k, v in got.items():
        if k.startswith("refiner."):
            continue
        if v.is_floating_point():
            torch.testing.assert_close(v, (0.25 * a[k].double() + 0.75 * b[k].double()).to(v.dtype), rtol=0, atol=0)
        else:
            assert torch.equal(v, a[k])  # BatchNorm batch counts: the new run's
    meta = read_metadata(out)
    assert meta["averaged_with"] == "stage old" and meta["average_weight"] == "0.25" and meta["step"] == "800"
    assert trained_real_sources(meta) == ("av2", "kitti")  # saw what either file saw: the fold guard still holds
    load_weights(build_model(cfg), cfg, out)  # a valid file: content hash and values checked


def test_average_refuses_other_architectures_and_bad_weights(tmp_path):
    new, _ = _file(tmp_path, "new", 1, {})
    cfg = ModelConfig.from_dict(tiny_model_dict(stem_channels=6))
    other = tmp_path / "other.safetensors"
    save_weights(build_model(cfg), cfg, other)
    with pytest.raises(WeightsError, match="different architectures"):
        average_weights(new, other, 0.5, tmp_path / "x.safetensors")
    with pytest.raises(WeightsError, match="in \\(0, 1\\]"):
        average_weights(new, new, 0.0, tmp_path / "x.safetensors")
