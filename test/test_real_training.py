"""Real labelled scans in training (cross-validation by source): the fold loader, ignored objects in the
targets and the loss, the real/simulated batch mix, and `eval --real --cross-validate`'s fold guard."""

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from livox_infer.detector.config import ModelConfig
from livox_infer.errors import ConfigError
from livox_infer.evaluation.metrics import FrameBoxes
from livox_infer.evaluation.real import cross_validated_detections, load_real_dir, parse_cross_validate
from livox_infer.training.losses import focal_loss
from livox_infer.detector.weights import trained_real_sources
from livox_infer.training.real_frames import RealTrainingSpec, load_real_training_frames, training_labels
from livox_infer.training.targets import build_targets, ignore_mask
from livox_infer.training.train import BatchStream, Frame, TrainOptions, fov_crop

CLASSES = ("car", "pedestrian", "cyclist")


def _box(label, x, y, yaw=0.0, l=4.0, w=1.8, h=1.5):
    return {"label": label, "x": x, "y": y, "z": -1.0, "l": l, "w": w, "h": h, "yaw": yaw}


def _scan(boxes, n=60, seed=0):
    """Points filling each box plus ground all around (so the mount can be estimated)."""
    rng = np.random.default_rng(seed)
    pts = []
    for b in boxes:
        c, s = math.cos(b["yaw"]), math.sin(b["yaw"])
        u = rng.uniform(-0.45, 0.45, (n, 3)) * [b["l"], b["w"], b["h"]]
        pts.append(np.c_[b["x"] + c * u[:, 0] - s * u[:, 1], b["y"] + s * u[:, 0] + c * u[:, 1], b["z"] + u[:, 2]])
    g = rng.uniform(-45, 45, (6000, 2))
    pts.append(np.c_[g, np.full(len(g), -1.75) + rng.normal(0, 0.01, len(g))])
    p = np.concatenate(pts).astype(np.float32)
    return np.c_[p, np.full(len(p), 30.0, np.float32)]


@pytest.fixture
def real_dir(tmp_path):
    labels = {
        # 360-degree labels: a car ahead, a truck (ignored look-alike), a bollard (background), a van (= car)
        "av2_log1_1": [_box("car", 20, 0), _box("truck", 15, 8, 0, 8, 2.5, 3), _box("bollard", 10, -3, 0, 0.3, 0.3, 1),
                       _box("van", -20, 5)],
        # front-camera labels only: a car ahead; points behind / beside the camera cone must be cut away
        "kitti_000050": [_box("car", 15, 2, 0.1), _box("pedestrian", 12, -3, 0, 0.6, 0.6, 1.7)],
    }
    for name, boxes in labels.items():
        np.save(tmp_path / f"{name}.npy", _scan(boxes))
    (tmp_path / "labels.json").write_text(json.dumps(labels))
    (tmp_path / "meta.json").write_text(json.dumps({
        "av2_log1_1": {"labelled_region": "360 deg (all around)"},
        "kitti_000050": {"labelled_region": "front camera field of view only (about 90 deg)"},
    }))
    return tmp_path


def test_training_labels_classes_vans_and_ignored_lookalikes():
    boxes, labels = training_labels([_box("car", 1, 0), _box("van", 2, 0), _box("truck", 3, 0), _box("bollard", 4, 0),
                                     _box("bicycle", 5, 0), _box("pedestrian", 6, 0)], CLASSES)
    assert labels.tolist() == [0, 0, -1, -1, 1]  # bollard left out: background
    assert boxes[:, 0].tolist() == [1, 2, 3, 5, 6]


def test_folds_load_only_their_source(real_dir):
    av2 = load_real_training_frames(RealTrainingSpec(str(real_dir), ("av2",)), CLASSES)
    kitti = load_real_training_frames(RealTrainingSpec(str(real_dir), ("kitti",)), CLASSES)
    assert len(av2) == 8 and len(kitti) == 1  # 360-degree labels: 8 headings; front labels: one view
    assert {f.sensor for f in av2} == {"vlp32"} and {f.sensor for f in kitti} == {"hdl64"}
    # heading 0 of the AV2 scan: the car ahead, the van as a car, the truck ignored, no bollard
    assert sorted(av2[0].labels.tolist()) == [-1, 0, 0]
    # the KITTI view keeps only the labelled cone (±45° less the margin): nothing behind or beside
    az = np.degrees(np.abs(np.arctan2(kitti[0].points[:, 1], kitti[0].points[:, 0])))
    assert az.max() <= 44.0 + 1e-3 and len(kitti[0].points) > 500
    assert abs(kitti[0].sensor_height - 1.75) < 0.1  # estimated from the ground
    with pytest.raises(ConfigError, match="unknown real source"):
        RealTrainingSpec(str(real_dir), ("waymo",)).check()


def test_ignored_objects_switch_off_background_loss_under_their_footprint():
    cfg = ModelConfig.load("lite")
    boxes = np.array([[20, 0, 0.8, 4, 1.8, 1.5, 0], [20, 10, 1.5, 8, 2.5, 3, 0.3]], np.float32)
    t = build_targets(boxes, np.array([0, -1]), cfg)
    assert t["mask"].sum() == 1  # the truck gets no target
    ign = t["ignore"]
    cell = cfg.head_cell_size
    col = int((20 - cfg.grid.x_range[0]) / cell)
    assert ign[int((10 - cfg.grid.y_range[0]) / cell), col] == 1  # under the truck
    assert ign[int((0 - cfg.grid.y_range[0]) / cell), col] == 0  # not under the car
    assert np.array_equal(ign, ignore_mask(boxes[1:], cfg))
    # a confident car score on the truck costs nothing where ignored, something where not
    logits = torch.full((1, cfg.num_classes, *cfg.head_shape), -8.0)
    logits[0, 0, int((10 - cfg.grid.y_range[0]) / cell), col] = 4.0
    hm = torch.from_numpy(t["heatmap"])[None]
    with_ignore = focal_loss(logits, hm, ignore=torch.from_numpy(ign)[None])
    without = focal_loss(logits, hm)
    assert without > with_ignore + 1.0


def test_batches_mix_real_and_simulated_frames_at_the_share(monkeypatch):
    import livox_infer.training.train as train_mod

    cfg = ModelConfig.load("lite")
    frames = [SimpleNamespace(real=False)] * 30 + [SimpleNamespace(real=True)] * 2
    # prepare() stubbed: the frame's kind as its "bev", so the batch shows which frames were drawn
    monkeypatch.setattr(train_mod, "prepare", lambda f, *a, **k: (torch.tensor([float(f.real)]), {"x": torch.zeros(1)},
                                                                  None, None, None, None))
    w = np.r_[np.full(30, 0.75 / 30), np.full(2, 0.25 / 2)]
    drawn = [bev.mean().item() for _, bev, _, _ in BatchStream(frames, cfg, batch=4, seed=1, start=0, total=300,
                                                                frame_weights=w)]
    assert 0.2 < np.mean(drawn) < 0.3  # 2 real frames of 32, drawn a quarter of the time
    uniform = [bev.mean().item() for _, bev, _, _ in BatchStream(frames, cfg, batch=4, seed=1, start=0, total=300)]
    assert np.mean(uniform) < 0.12


def test_fov_crop_keeps_a_livox_cone():
    pts = np.c_[np.random.default_rng(0).uniform(-40, 40, (5000, 2)), np.zeros((5000, 2))].astype(np.float32)
    out = fov_crop(pts, np.random.default_rng(3))
    az = np.degrees(np.abs(np.arctan2(out[:, 1], out[:, 0])))
    assert len(out) < len(pts) and az.max() <= 41.0
    with pytest.raises(ConfigError, match="fov-crop"):
        TrainOptions(fov_crop=1.5).check()


def test_trained_sources_come_from_metadata():
    assert trained_real_sources({}) == ()
    assert trained_real_sources({"real_sources": "kitti"}) == ("kitti",)
    args = json.dumps({"real": {"root": "x", "sources": ["av2"], "share": 0.5}})
    assert trained_real_sources({"train_args": args, "real_sources": "kitti"}) == ("av2", "kitti")


def test_cross_validate_refuses_weights_that_saw_the_fold(real_dir, tmp_path, monkeypatch):
    views = load_real_dir(real_dir)
    wk = tmp_path / "k.safetensors"
    wk.write_bytes(b"x")
    assert parse_cross_validate([f"av2={wk}", f"kitti={wk}"]) == {"av2": str(wk), "kitti": str(wk)}
    with pytest.raises(ConfigError, match="SOURCE=WEIGHTS"):
        parse_cross_validate(["kitti"])
    import livox_infer.evaluation.real as real

    monkeypatch.setattr(real, "seen_sources", lambda w: ("kitti",))
    used = []

    def make_pipeline(weights=None):
        used.append(weights)
        return SimpleNamespace()

    monkeypatch.setattr(real, "scan_detector", lambda pipe: lambda pts: (np.zeros((0, 7)), np.zeros(0, int), np.zeros(0)))
    with pytest.raises(ConfigError, match="trained on kitti frames"):
        cross_validated_detections(views, {"av2": str(wk), "kitti": str(wk)}, make_pipeline)
    with pytest.raises(ConfigError, match="no weights for source"):
        cross_validated_detections(views, {"av2": str(wk)}, make_pipeline)
    monkeypatch.setattr(real, "seen_sources", lambda w: ("av2",) if w == "wA" else ("kitti",))
    dets = cross_validated_detections(views, {"av2": "wK", "kitti": "wA"}, make_pipeline)
    assert len(dets) == len(views) and all(isinstance(d, FrameBoxes) for d in dets)
    assert used[-2:] == ["wK", "wA"]


def test_paired_bootstrap_of_a_detector_against_itself_is_zero_and_a_worse_one_negative(real_dir):
    from livox_infer.evaluation.real import paired_bootstrap

    views = load_real_dir(real_dir)
    perfect = [FrameBoxes(v.gt.boxes[~v.gt_ignore], v.gt.labels[~v.gt_ignore], np.ones(int((~v.gt_ignore).sum())))
               for v in views]
    empty = [FrameBoxes(np.zeros((0, 7)), np.zeros(0, int), np.zeros(0)) for _ in views]
    same = paired_bootstrap(views, perfect, perfect, CLASSES, n=20)
    assert same["car"]["bev@0.5"] == [0.0, 0.0]
    worse = paired_bootstrap(views, empty, perfect, CLASSES, n=20)
    assert worse["car"]["bev@0.5"][1] < 0


def test_paired_with_other_fold_weights_compares_two_cross_validated_detectors(real_dir, tmp_path, monkeypatch, capsys):
    """`eval --real --cross-validate S=W ... --bootstrap N --paired-with S=W0 ...`: each fold pair scores the source it
    never saw, and the printed / written interval is of the new folds' AP minus the old folds'."""
    import argparse

    import livox_infer.evaluation.real as real
    from livox_infer.evaluation import evaluate as E

    files = {}
    for name in ("newK", "newA", "oldK", "oldA"):
        files[name] = tmp_path / f"{name}.safetensors"
        files[name].write_bytes(b"x")
    assert real.parse_paired_with([], {}) is None
    assert real.parse_paired_with("lite-sim", {}) == "lite-sim"
    with pytest.raises(ConfigError, match="give --cross-validate"):
        real.parse_paired_with([f"av2={files['oldK']}"], {})
    with pytest.raises(ConfigError, match="--paired-with names source 'av2' twice"):
        real.parse_paired_with([f"av2={files['oldK']}", f"av2={files['oldA']}"], {"av2": "x"})
    with pytest.raises(ConfigError, match="one WEIGHTS or MODEL"):
        real.parse_paired_with(["a", "b"], {"av2": "x"})
    # a weights path holding '=' is one file, not SOURCE=WEIGHTS
    (tmp_path / "lr=2e-4.safetensors").write_bytes(b"x")
    for path in ("runs/lr=2e-4/step-000500.safetensors", str(tmp_path / "lr=2e-4.safetensors")):
        assert real.parse_paired_with([path], {}) == path

    gt = {v.points.tobytes(): v for v in load_real_dir(real_dir)}  # main_real loads the same views again
    # the new folds find every labelled object, the old ones nothing; each fold file saw only its own source
    monkeypatch.setattr(real, "seen_sources", lambda w: ("kitti",) if "K" in Path(w).name else ("av2",))
    used = []

    def make_pipeline(weights=None, model=None):
        used.append(Path(weights).name)
        return SimpleNamespace(weights_file=weights, new=Path(weights).name.startswith("new"))

    def scan_detector(pipe):
        def detect(points):
            v = gt.get(points.tobytes())
            if not pipe.new or v is None:
                return np.zeros((0, 7)), np.zeros(0, int), np.zeros(0)
            keep = ~v.gt_ignore
            return v.gt.boxes[keep], v.gt.labels[keep], np.ones(int(keep.sum()))
        return detect

    monkeypatch.setattr(real, "scan_detector", scan_detector)
    p = argparse.ArgumentParser()
    E.add_arguments(p)
    out = tmp_path / "cv.json"
    args = p.parse_args(["--real", str(real_dir), "--no-compile", "--bootstrap", "20", "--out", str(out),
                         "--cross-validate", f"av2={files['newK']}", "--cross-validate", f"kitti={files['newA']}",
                         "--paired-with", f"av2={files['oldK']}", "--paired-with", f"kitti={files['oldA']}"])
    args.score_threshold = E._default_score_threshold(args)
    args.bootstrap = 0  # the comparison is an interval: refused without resamples, before anything runs
    with pytest.raises(ConfigError, match="give --bootstrap N"):
        real.main_real(args, make_pipeline)
    assert used == []
    args.bootstrap = 20
    assert real.main_real(args, make_pipeline) == 0
    assert used == ["newK.safetensors", "newA.safetensors", "oldK.safetensors", "oldA.safetensors"]
    printed = capsys.readouterr().out
    assert "of the AP difference to the folds av2 by oldK.safetensors, kitti by oldA.safetensors" in printed
    paired = json.loads(out.read_text())["bootstrap"]["paired"]
    assert paired["weights"] == {"av2": str(files["oldK"]), "kitti": str(files["oldA"])}
    assert paired["difference"]["car"]["bev@0.5"][0] > 0  # better in every resample
