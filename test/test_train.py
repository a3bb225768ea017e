"""Training pieces: object pasting, neighbour regression targets, corner loss, and `livox-infer train` itself
(runs, logs validation AP, writes safetensors, resumes, is reproducible)."""

import argparse
import dataclasses
import json
import math
import re

import numpy as np
import pytest
import torch
import yaml
from safetensors import safe_open

from conftest import tiny_model_dict
from livox_infer.errors import ConfigError
from livox_infer.detector import ModelConfig
from livox_infer.training import train as train_mod
from livox_infer.training.losses import bev_corners_from_regression, corner_loss, detection_loss
from livox_infer.training.paste import ObjectDatabase, PasteConfig, box_point_mask, paste_objects
from livox_infer.training.targets import build_targets

torch.set_num_threads(1)


# --------------------------------------------------------------------------- object pasting


def _ground(x_max=40.0, step=0.25, height=1.5):
    xs, ys = np.meshgrid(np.arange(2.0, x_max, step), np.arange(-10.0, 10.0, step))
    return np.c_[xs.ravel(), ys.ravel(), np.full(xs.size, -height), np.full(xs.size, 20.0)].astype(np.float32)


def _cluster(cx, cy, l, w, h, height=1.5, n=200, seed=0):
    """Points filling a box standing on the ground (sensor frame: ground at z = -height)."""
    r = np.random.default_rng(seed)
    p = np.c_[r.uniform(cx - l / 2, cx + l / 2, n), r.uniform(cy - w / 2, cy + w / 2, n),
              r.uniform(-height + 0.15, -height + h, n), np.full(n, 50.0)]
    return p.astype(np.float32)


def _wall(x, height=1.5):
    ys, zs = np.meshgrid(np.arange(-6.0, 6.0, 0.05), np.arange(-height + 0.1, 2.0, 0.05))
    return np.c_[np.full(ys.size, x), ys.ravel(), zs.ravel(), np.full(ys.size, 10.0)].astype(np.float32)


def _frame(points, boxes, labels, height=1.5, sensor="avia"):
    return train_mod.Frame(np.asarray(points, np.float32), np.asarray(boxes, np.float32).reshape(-1, 7),
                           np.asarray(labels, np.int64), height, np.array([0, 0, 1], np.float32), sensor)


def _source_db(box, label=2, sensor="avia"):
    x, y, _, l, w, h, _ = box
    src = _frame(np.r_[_ground(), _cluster(x, y, l, w, h)], [box], [label], sensor=sensor)
    return ObjectDatabase([src], 3, PasteConfig(probability=1.0, max_per_frame=(0, 0, 1), min_points=(30, 8, 10)))


def test_database_cuts_object_without_ground():
    box = [15.0, 0.0, -1.5 + 0.85, 1.8, 0.6, 1.7, 0.0]  # cyclist standing on the ground 1.5 m below the sensor
    db = _source_db(box)
    assert db.count() == [0, 0, 1] and db.count("avia") == [0, 0, 1] and db.count("mid40") == [0, 0, 0]
    obj = db.objects["avia"][2][0]
    assert obj.points.shape[0] == 200  # all the cluster, none of the ground grid inside the box footprint
    assert obj.points[:, 2].min() > 0.08  # levelled frame: ground at 0
    assert abs(obj.box[2] - 0.85) < 1e-5


def test_paste_removes_what_the_object_hides_and_keeps_the_rest():
    box = [15.0, 0.0, -1.5 + 0.85, 1.8, 0.6, 1.7, 0.0]
    db = _source_db(box)
    wall = _wall(30.0)
    target = _frame(np.r_[_ground(), wall], np.zeros((0, 7)), [])
    out = paste_objects(target, db, np.random.default_rng(0))
    assert out is not target
    assert out.labels.tolist() == [2] and out.sensor_height == 0.0 and out.up.tolist() == [0, 0, 1]
    assert np.allclose(out.boxes[0, :2], box[:2]) and abs(out.boxes[0, 2] - 0.85) < 1e-5  # levelled frame
    # the wall (levelled: x = 30) lost its points in the object's shadow, and only those
    wall_out = out.points[out.points[:, 3] == 10.0]  # the wall's intensity
    assert 0 < wall.shape[0] - wall_out.shape[0] < 0.2 * wall.shape[0]
    shadow = (np.abs(wall_out[:, 1]) < 0.25 * 30 / 15) & (wall_out[:, 2] > 0.3 * 30 / 15) & (wall_out[:, 2] < 1.5)
    assert not shadow.any()
    # far off the shadow the wall is intact
    side = np.abs(wall[:, 1]) > 3.0
    assert np.count_nonzero(np.abs(wall_out[:, 1]) > 3.0) == np.count_nonzero(side)
    # the object's points are all there (nothing in front of it)
    assert np.count_nonzero(out.points[:, 3] == 50.0) == 200


def test_paste_rejected_behind_a_wall_inside_an_obstacle_or_on_a_box():
    box = [15.0, 0.0, -1.5 + 0.85, 1.8, 0.6, 1.7, 0.0]
    db = _source_db(box)
    rng = np.random.default_rng(0)
    hidden = _frame(np.r_[_ground(), _wall(8.0)], np.zeros((0, 7)), [])
    assert paste_objects(hidden, db, rng) is hidden  # every point of the object is behind the wall
    obstacle = _frame(np.r_[_ground(), _cluster(15.0, 0.3, 1.0, 1.0, 2.0, seed=3)], np.zeros((0, 7)), [])
    assert paste_objects(obstacle, db, rng) is obstacle  # a tree trunk / wall stands there
    car = [15.5, 1.0, -0.75, 4.5, 1.8, 1.5, 0.0]
    occupied = _frame(_ground(), [car], [0])
    assert paste_objects(occupied, db, rng) is occupied  # would overlap a labelled box
    other_sensor = _frame(_ground(), np.zeros((0, 7)), [], sensor="horizon")
    assert paste_objects(other_sensor, db, rng) is other_sensor  # a different scan pattern: never mixed


def test_paste_probability_zero_and_seeded():
    box = [15.0, 0.0, -1.5 + 0.85, 1.8, 0.6, 1.7, 0.0]
    src = _frame(np.r_[_ground(), _cluster(15, 0, 1.8, 0.6, 1.7)], [box], [2])
    off = ObjectDatabase([src], 3, PasteConfig(probability=0.0))
    target = _frame(_ground(), np.zeros((0, 7)), [])
    assert paste_objects(target, off, np.random.default_rng(1)) is target
    db = _source_db(box)
    a = paste_objects(target, db, np.random.default_rng(7))
    b = paste_objects(target, db, np.random.default_rng(7))
    assert np.array_equal(a.points, b.points) and np.array_equal(a.boxes, b.boxes)


def test_real_objects_kept_apart_and_drawn_at_the_real_paste_share():
    """--real-paste-share: real views' objects (Frame.real) get lists of their own and each paste draws from them
    with that probability; at 0 they join the simulated lists as before (the same database, the same draws)."""
    import dataclasses

    sim_box = [15.0, 0.0, -1.5 + 0.85, 1.8, 0.6, 1.7, 0.0]
    real_box = [12.0, 3.0, -1.5 + 0.85, 1.8, 0.6, 1.7, 0.0]
    sims = [_frame(np.r_[_ground(), _cluster(15, 0, 1.8, 0.6, 1.7, seed=s)], [sim_box], [2]) for s in range(9)]
    real = dataclasses.replace(_frame(np.r_[_ground(), _cluster(12, 3, 1.8, 0.6, 1.7)], [real_box], [2]), real=True)
    cfg = dict(max_per_frame=(0, 0, 1), min_points=(30, 8, 10), probability=1.0)
    mixed = ObjectDatabase(sims + [real], 3, PasteConfig(**cfg))
    assert mixed.count() == [0, 0, 10] and mixed.count(real=True) == [0, 0, 0] and not mixed.real_objects
    apart = ObjectDatabase(sims + [real], 3, PasteConfig(**cfg, real_share=0.5))
    assert apart.count(real=False) == [0, 0, 9] and apart.count(real=True) == [0, 0, 1] and apart.count() == [0, 0, 10]
    target = _frame(_ground(), np.zeros((0, 7)), [])

    def real_share_of(db, n=400):
        rng, hits, pasted = np.random.default_rng(3), 0, 0
        for _ in range(n):
            out = paste_objects(target, db, rng)
            if out is not target:
                pasted += 1
                hits += int(abs(out.boxes[0, 0] - 12.0) < 1e-4)
        return hits / max(pasted, 1), pasted

    share, pasted = real_share_of(apart)
    assert pasted > 150 and 0.4 < share < 0.6  # half the pastes are the real cyclist (1 of 10 objects)
    share, pasted = real_share_of(mixed)
    assert pasted > 150 and share < 0.2  # by their numbers: ~1 in 10
    # a frame whose scan pattern has only real objects still gets them
    only_real = ObjectDatabase([real], 3, PasteConfig(**cfg, real_share=0.5))
    assert paste_objects(target, only_real, np.random.default_rng(0)) is not target


def test_pedestrians_pasted_beside_structure_keep_their_range_and_stand_clear_of_it():
    """--paste-beside-structure: a pasted pedestrian is turned about the sensor (same range, so the same density) to
    stand 0.3-1.0 m beside a pole of the target scene, never inside it; at 0 it stays at its own place."""
    ped = [14.0, -3.0, -1.5 + 0.85, 0.6, 0.6, 1.7, 0.0]
    src = _frame(np.r_[_ground(), _cluster(14.0, -3.0, 0.6, 0.6, 1.7)], [ped], [1])
    cfg = dict(max_per_frame=(0, 1, 0), min_points=(30, 8, 10), probability=1.0)
    pole_az = math.radians(25.0)
    r_ped = math.hypot(14.0, -3.0)
    pole = _cluster(r_ped * math.cos(pole_az), r_ped * math.sin(pole_az), 0.2, 0.2, 2.4, n=150)
    target = _frame(np.r_[_ground(x_max=30.0, step=0.25), pole], np.zeros((0, 7)), [])
    target = dataclasses.replace(target, points=target.points[np.hypot(*target.points[:, :2].T) < 30.0])
    for share, beside in ((1.0, True), (0.0, False)):
        db = ObjectDatabase([src], 3, PasteConfig(**cfg, beside_share=share))
        rng, placed = np.random.default_rng(5), 0
        for _ in range(30):
            out = paste_objects(target, db, rng)
            if out is target:
                continue
            box = out.boxes[-1]
            assert math.hypot(box[0], box[1]) == pytest.approx(r_ped, abs=1e-3)  # the range (density) kept
            gap = math.hypot(box[0] - pole[:, 0].mean(), box[1] - pole[:, 1].mean())
            if beside:
                assert 0.3 + 0.3 - 0.15 <= gap <= 0.3 + 1.0 + 0.35  # its side 0.3-1.0 m from the pole
                n_in = box_point_mask(out.points[:, :3], box, 0.0, z_min=float(box[2] - box[5] / 2 + 0.2)).sum()
                assert n_in >= 8  # its own points came along, the pole's did not enter its box
            else:
                assert box[:2] == pytest.approx([14.0, -3.0], abs=1e-4)
            placed += 1
        assert placed >= 10  # 0 or 1 pedestrian drawn per frame (max_per_frame 1)


# --------------------------------------------------------------------------- targets and losses


def _small_config():
    return tiny_model_dict()


def test_neighbour_targets_decode_the_same_box_from_every_cell():
    cfg = ModelConfig.from_dict(_small_config(), source="test")
    boxes = np.array([[10.3, 2.1, 0.8, 4.2, 1.8, 1.5, 0.4], [12.7, -5.3, 0.9, 0.6, 0.7, 1.7, -1.0]], np.float32)
    centre = build_targets(boxes, np.array([0, 1]), cfg)
    t = build_targets(boxes, np.array([0, 1]), cfg, neighbour_weight=0.5)
    assert np.array_equal(t["heatmap"], centre["heatmap"])
    n = int(np.count_nonzero(t["mask"]))
    assert n == 18 and math.isclose(t["mask"].sum(), 2 + 16 * 0.5)
    _, hw = cfg.head_shape
    cell = cfg.head_cell_size
    for i in range(n):
        row, col = divmod(int(t["index"][i]), hw)
        r = t["regression"][i]
        x = (col + r[0]) * cell + cfg.grid.x_range[0]
        y = (row + r[1]) * cell + cfg.grid.y_range[0]
        want = boxes[t["label"][i]]
        assert abs(x - want[0]) < 1e-4 and abs(y - want[1]) < 1e-4
        assert np.allclose(np.exp(r[3:6]), want[3:6], atol=1e-4)


def test_neighbour_cells_do_not_take_another_objects_centre():
    cfg = ModelConfig.from_dict(_small_config(), source="test")
    cell = cfg.head_cell_size
    # two pedestrians in adjacent head cells: each centre cell keeps its own box
    boxes = np.array([[10.0 + 0.5 * cell, 0.5 * cell, 0.9, 0.6, 0.6, 1.7, 0.0],
                      [10.0 + 1.5 * cell, 0.5 * cell, 0.9, 0.6, 0.6, 1.7, 0.0]], np.float32)
    t = build_targets(boxes, np.array([1, 1]), cfg, neighbour_weight=0.5)
    centres = t["index"][t["mask"] == 1.0]
    assert len(set(centres.tolist())) == 2
    for c in centres:
        assert np.count_nonzero((t["index"] == c) & (t["mask"] > 0)) == 1


def test_corner_loss():
    reg = torch.tensor([[0.4, 0.6, 0.8, math.log(4.5), math.log(1.8), math.log(1.5), math.sin(0.8), math.cos(0.8)]])
    w = torch.ones(1)
    assert float(corner_loss(reg, reg, w, 0.8)) < 1e-5
    # the same rectangle turned by pi (other corner order) is the same box
    turned = reg.clone()
    turned[0, 6:] = torch.tensor([math.sin(0.8 + 2 * math.pi), math.cos(0.8 + 2 * math.pi)])
    assert float(corner_loss(turned, reg, w, 0.8)) < 1e-5
    # a 7 degree yaw error on a 4.5 m x 1.8 m car: mean corner distance = 2 * sin(3.5 deg) * half diagonal
    yaw_err = reg.clone()
    a = 0.4 + math.radians(7)
    yaw_err[0, 6:] = torch.tensor([math.sin(2 * a), math.cos(2 * a)])
    expect = 2 * math.sin(math.radians(3.5)) * 0.5 * math.hypot(4.5, 1.8)
    assert abs(float(corner_loss(yaw_err, reg, w, 0.8)) - expect) < 1e-4
    # a 0.1-cell centre shift moves every corner by 0.1 * cell
    shift = reg.clone()
    shift[0, 0] += 0.1
    assert abs(float(corner_loss(shift, reg, w, 0.8)) - 0.08) < 1e-5
    assert float(corner_loss(shift, reg, torch.zeros(1), 0.8)) == 0.0
    corners = bev_corners_from_regression(reg, 0.8)
    assert corners.shape == (1, 4, 2)
    # gradients are finite and reach every regression channel but z / height
    p = yaw_err.clone().requires_grad_(True)
    corner_loss(p + torch.tensor([0.05, -0.05, 0, 0.1, -0.1, 0, 0, 0]), reg, w, 0.8).backward()
    g = p.grad[0]
    assert torch.isfinite(g).all() and (g[[0, 1, 3, 4, 6, 7]] != 0).all() and (g[[2, 5]] == 0).all()


def test_detection_loss_with_corners_and_neighbours():
    cfg = ModelConfig.from_dict(_small_config(), source="test")
    torch.manual_seed(0)
    from livox_infer.detector import build_model

    net = build_model(cfg)
    boxes = np.array([[10.3, 2.1, 0.8, 4.2, 1.8, 1.5, 0.4]], np.float32)
    t = {k: torch.from_numpy(v)[None] for k, v in build_targets(boxes, np.array([0]), cfg, 0.5).items()}
    bev = torch.rand(1, *cfg.grid.shape)
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        loss, parts = detection_loss(net(bev), t, corner_weight=1.0, cell_size=cfg.head_cell_size)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append((float(loss.detach()), parts))
    assert set(parts) == {"heatmap", "regression", "corners"} | ({"iou"} if cfg.iou_head else set())
    # at initialisation the yaw outputs are ~0 (atan2 undefined): the corner term starts once they are not
    assert losses[0][1]["corners"] == 0.0 and 0 < parts["corners"]
    assert losses[-1][0] < 0.7 * losses[0][0] and parts["regression"] < losses[0][1]["regression"]


def test_heat_class_weight_scales_that_class_channel_only():
    """--heat-class-weight: each class channel's focal terms times its weight; 1 everywhere is the plain loss."""
    from livox_infer.training.losses import focal_loss

    torch.manual_seed(0)
    logits = torch.randn(2, 3, 8, 8)
    target = torch.rand(2, 3, 8, 8) * 0.9
    target[0, 1, 3, 3] = target[1, 0, 5, 2] = target[1, 2, 1, 1] = 1.0
    plain = focal_loss(logits, target)
    assert torch.allclose(focal_loss(logits, target, class_weight=torch.ones(3)), plain)
    per_class = [focal_loss(logits[:, c:c + 1], target[:, c:c + 1]) * (target[:, c].eq(1).sum().clamp_min(1) / 3)
                 for c in range(3)]  # each channel's share of the sum, normalised by all 3 positives
    assert torch.allclose(sum(per_class), plain, atol=1e-5)
    weighted = focal_loss(logits, target, class_weight=torch.tensor([1.0, 2.0, 1.0]))
    assert torch.allclose(weighted, plain + per_class[1], atol=1e-5)
    assert train_mod.parse_class_weights("pedestrian=2, cyclist=1.5") == {"pedestrian": 2.0, "cyclist": 1.5}
    assert train_mod.parse_class_weights(None) is None
    for bad in ("pedestrian", "walker=2", "pedestrian=0", "pedestrian=nan", "pedestrian=x"):
        with pytest.raises(ConfigError, match="heat-class-weight"):
            train_mod.parse_class_weights(bad)
    train_mod.TrainOptions(heat_class_weight={"pedestrian": 2}).check()  # a recipe's value, as YAML gives it
    for bad in ({"pedestrian": -1}, {"walker": 2}, {}):
        with pytest.raises(ConfigError, match="heat-class-weight"):
            train_mod.TrainOptions(heat_class_weight=bad).check()


def test_resolve_precision(monkeypatch):
    cpu = torch.device("cpu")
    assert train_mod.resolve_precision("fp32", cpu) is None
    assert train_mod.resolve_precision("bf16", cpu) is torch.bfloat16
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    assert train_mod.resolve_precision("auto", cpu) is torch.bfloat16
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert train_mod.resolve_precision("auto", cpu) is None  # bf16 without AMX tiles is slower than fp32
    with pytest.raises(ConfigError, match="precision"):
        train_mod.resolve_precision("fp16", cpu)


@pytest.mark.parametrize("amp_dtype", [None, torch.bfloat16], ids=["fp32", "bf16"])
def test_batch_loss_learns_in_both_precisions(amp_dtype):
    """The training step's loss (channels_last, autocast) fits one frame, and weights and gradients stay fp32."""
    cfg = ModelConfig.from_dict(_small_config(), source="test")
    torch.manual_seed(0)
    from livox_infer.detector import build_model

    net = build_model(cfg).to(memory_format=torch.channels_last)
    boxes = np.array([[10.3, 2.1, 0.8, 4.2, 1.8, 1.5, 0.4]], np.float32)
    t = {k: torch.from_numpy(v)[None] for k, v in build_targets(boxes, np.array([0]), cfg).items()}
    bev = torch.rand(1, *cfg.grid.shape)
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        loss, parts = train_mod.batch_loss(net, bev, t, cfg, amp_dtype)
        assert loss.dtype == torch.float32
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    stage2 = ("refiner.", "refiner_large.")
    detector = [p for n, p in net.named_parameters() if not n.startswith(stage2)]
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in detector)
    assert all(p.grad is None for n, p in net.named_parameters() if n.startswith(stage2))  # stage 2 untouched
    assert math.isfinite(losses[-1]) and losses[-1] < 0.5 * losses[0]
    # with the same starting weights, bf16 and fp32 compute the same loss to bf16 precision
    torch.manual_seed(0)
    fresh = build_model(cfg)
    with torch.no_grad():
        ref, _ = train_mod.batch_loss(fresh, bev, t, cfg, None)
        got, _ = train_mod.batch_loss(fresh, bev, t, cfg, amp_dtype)
    assert abs(float(got) - float(ref)) <= 0.03 * abs(float(ref))
    assert (float(got) != float(ref)) == (amp_dtype is not None)  # autocast did engage (and only for bf16)


# --------------------------------------------------------------------------- livox-infer train


def _train_args(tmp_path, cfg_path, **over):
    p = argparse.ArgumentParser()
    train_mod.add_arguments(p)
    args = p.parse_args(["--config", str(cfg_path), "--work-dir", str(tmp_path / "work"), "--out",
                         str(tmp_path / "best.safetensors"), "--train-frames", "50", "--val-frames", "10",
                         "--steps", "4", "--batch", "2", "--val-every", "2", "--threads", "1", "--workers", "0",
                         "--seed", "3"])
    for k, v in over.items():
        setattr(args, k, v)
    return args


@pytest.fixture(scope="module")
def tiny_dataset(tmp_path_factory):
    """One 50-frame training shard and one validation shard of the tiny config, simulated once (~10 s)."""
    root = tmp_path_factory.mktemp("train")
    cfg_path = root / "tiny.yaml"
    cfg_path.write_text(yaml.safe_dump(_small_config()))
    args = _train_args(root, cfg_path, data_only=True)
    assert train_mod.main(args) == 0
    return root, cfg_path


def _fresh_run(tiny_dataset, tmp_path, **over):
    root, cfg_path = tiny_dataset
    work = tmp_path / "work"
    (work / "data").mkdir(parents=True)
    for f in (root / "work" / "data").glob("*.npz"):
        (work / "data" / f.name).symlink_to(f)
    args = _train_args(tmp_path, cfg_path, **over)
    return args, work


def _tensors(path):
    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()


@pytest.mark.slow  # simulates the tiny dataset (module fixture) and trains: ~10 s
def test_train_writes_weights_history_and_checkpoint(tiny_dataset, tmp_path):
    args, work = _fresh_run(tiny_dataset, tmp_path, corner_weight=1.0, neighbour_weight=0.5)
    assert train_mod.main(args) == 0
    _, meta = _tensors(tmp_path / "best.safetensors")
    assert meta["trained"] == "yes" and int(meta["step"]) in (2, 4)
    assert set(json.loads(meta["val_ap"])) == {"car", "pedestrian", "cyclist", "truck", "bus"}
    hist = [json.loads(line) for line in (work / "history.jsonl").read_text().splitlines()]
    assert [h["step"] for h in hist] == [2, 4]
    assert "corners" in hist[0]["loss"] and "bev@0.7" in hist[0]["val"]["ap"]["car"]
    # the weights load into the pipeline's model
    from livox_infer.detector import build_model, load_weights

    cfg = ModelConfig.load(args.config)
    load_weights(build_model(cfg), cfg, tmp_path / "best.safetensors")


def test_weight_average_is_a_mean_then_an_exponential_decay():
    net = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    avg = train_mod.WeightAverage(net, 0.9)
    assert not any(p.requires_grad for p in avg.model.parameters())
    start = {k: v.clone() for k, v in net.state_dict().items()}
    with torch.no_grad():
        for p in net.parameters():
            p.add_(1.0)
        net[1].running_mean.fill_(4.0)
        net[1].num_batches_tracked.fill_(7)
    avg.update(net)  # first step: decay 1 / 2, the mean of the start and the step
    w = avg.model[0].weight
    assert torch.allclose(w, start["0.weight"] + 0.5, atol=1e-6)
    assert torch.allclose(avg.model[1].running_mean, torch.full((2,), 2.0), atol=1e-6)
    assert int(avg.model[1].num_batches_tracked) == 7  # integer buffers are copied
    with torch.no_grad():
        net[0].weight.add_(3.0)
    avg.update(net)  # decay 2 / 3: the plain mean of start, start + 1 and start + 4
    assert torch.allclose(avg.model[0].weight, start["0.weight"] + 5.0 / 3.0, atol=1e-6)
    for _ in range(8):  # from step 1 / (1 - 0.9) = 10 on the decay stays 0.9
        avg.update(net)
    before = avg.model[0].weight.clone()
    avg.update(net)
    assert torch.allclose(avg.model[0].weight, 0.9 * before + 0.1 * net[0].weight, atol=1e-6)
    for _ in range(300):  # held weights: the average converges to them
        avg.update(net)
    assert torch.allclose(avg.model[0].weight, net[0].weight, atol=1e-5) and avg.steps == 311
    with pytest.raises(ConfigError, match="ema-decay"):
        train_mod.TrainOptions(ema_decay=1.0).check()


@pytest.mark.slow  # a short training run: ~4 s
def test_train_writes_the_weight_average_beside_the_weights(tiny_dataset, tmp_path):
    args, work = _fresh_run(tiny_dataset, tmp_path, ema_decay=0.5, keep_checkpoints=True)
    assert train_mod.main(args) == 0
    last, _ = _tensors(tmp_path / "best.safetensors")
    ema, meta = _tensors(work / "ema.safetensors")
    assert meta["ema_decay"] == "0.5" and meta["ema_steps"] == "4" and meta["step"] == "4" and "val_score" not in meta
    assert (work / "step-000002.ema.safetensors").is_file()
    moved = [k for k in last if last[k].is_floating_point() and not torch.equal(last[k], ema[k])]
    assert moved and set(ema) == set(last)
    from livox_infer.detector import build_model, load_weights

    cfg = ModelConfig.load(args.config)
    load_weights(build_model(cfg), cfg, work / "ema.safetensors")


@pytest.mark.slow  # three short training runs: ~8 s
def test_train_is_reproducible_and_resumes_to_the_same_weights(tiny_dataset, tmp_path, monkeypatch):
    a_args, _ = _fresh_run(tiny_dataset, tmp_path / "a")
    assert train_mod.main(a_args) == 0
    ckpt_a, _ = _tensors(tmp_path / "a" / "work" / "checkpoint.safetensors")
    # same seed, same data: identical checkpoint
    b_args, _ = _fresh_run(tiny_dataset, tmp_path / "b")
    assert train_mod.main(b_args) == 0
    ckpt_b, _ = _tensors(tmp_path / "b" / "work" / "checkpoint.safetensors")
    assert ckpt_a.keys() == ckpt_b.keys() and all(torch.equal(ckpt_a[k], ckpt_b[k]) for k in ckpt_a)
    # killed right after the step-2 checkpoint, resumed: the same weights as the uninterrupted run
    c_args, _ = _fresh_run(tiny_dataset, tmp_path / "c")
    original = train_mod.save_checkpoint

    class Killed(Exception):
        pass

    def save_then_die(path, net, opt, cfg, step, *rest):
        original(path, net, opt, cfg, step, *rest)
        if step == 2:
            raise Killed

    monkeypatch.setattr(train_mod, "save_checkpoint", save_then_die)
    with pytest.raises(Killed):
        train_mod.main(c_args)
    monkeypatch.setattr(train_mod, "save_checkpoint", original)
    c_args.resume = True
    assert train_mod.main(c_args) == 0
    ckpt_c, meta = _tensors(tmp_path / "c" / "work" / "checkpoint.safetensors")
    assert meta["step"] == "4"
    model_keys = [k for k in ckpt_a if k.startswith("model.")]
    assert all(torch.allclose(ckpt_a[k], ckpt_c[k], atol=1e-6) for k in model_keys)


@pytest.mark.slow  # shares the tiny-dataset fixture
def test_train_function_makes_the_weights_the_cli_makes(tiny_dataset, tmp_path):
    """`train(TrainOptions)` is the library entry; the CLI only builds the options."""
    cli_args, _ = _fresh_run(tiny_dataset, tmp_path / "cli")
    assert train_mod.main(cli_args) == 0
    _, work = _fresh_run(tiny_dataset, tmp_path / "fn")
    opts = train_mod.TrainOptions(config=tiny_dataset[1], work_dir=work, out=tmp_path / "fn" / "best.safetensors",
                                  train_frames=50, val_frames=10, steps=4, batch=2, val_every=2, threads=1, workers=0,
                                  seed=3)
    result = train_mod.train(opts)
    assert result.out == opts.out and result.step == 4 and result.best_score > -math.inf
    a, _ = _tensors(tmp_path / "cli" / "work" / "checkpoint.safetensors")
    b, meta = _tensors(work / "checkpoint.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads(meta["args"])["seed"] == 3
    # stop_after ends the run early on the same schedule; select "last" keeps the last validation's weights
    _, work = _fresh_run(tiny_dataset, tmp_path / "stop")
    opts.work_dir, opts.out, opts.stop_after, opts.select = work, tmp_path / "stop" / "w.safetensors", 2, "last"
    assert train_mod.train(opts).step == 2
    _, meta = _tensors(opts.out)
    assert meta["step"] == "2"
    c, _ = _tensors(work / "checkpoint.safetensors")
    assert any(not torch.equal(a[k], c[k]) for k in a if k.startswith("model."))  # 4 steps vs 2


@pytest.mark.slow  # two short training runs: ~10 s
def test_heat_class_weight_reaches_the_training_step(tiny_dataset, tmp_path):
    """--heat-class-weight pedestrian=3 changes the weights a run makes (same seed) and is recorded in them."""
    plain, _ = _fresh_run(tiny_dataset, tmp_path / "plain")
    weighted, _ = _fresh_run(tiny_dataset, tmp_path / "weighted", heat_class_weight="pedestrian=3")
    assert train_mod.main(plain) == 0 and train_mod.main(weighted) == 0
    a, _ = _tensors(tmp_path / "plain" / "work" / "checkpoint.safetensors")
    b, meta = _tensors(tmp_path / "weighted" / "work" / "checkpoint.safetensors")
    assert any(not torch.equal(a[k], b[k]) for k in a if k.startswith("model."))
    assert json.loads(meta["args"])["heat_class_weight"] == {"pedestrian": 3.0}


@pytest.mark.slow  # shares the tiny-dataset fixture
def test_train_rejects_bad_sim_option(tiny_dataset, tmp_path, capsys):
    args, _ = _fresh_run(tiny_dataset, tmp_path, sim_option=["n_cyclists"])
    assert train_mod.main(args) == 2
    assert "KEY=VALUE" in capsys.readouterr().err


@pytest.mark.slow  # a short training run: ~5 s
def test_train_without_out_writes_into_the_work_dir_not_next_to_the_config(tiny_dataset, tmp_path):
    """The README's train command once overwrote models/lite.safetensors: the default is the work dir."""
    args, work = _fresh_run(tiny_dataset, tmp_path, out=None)
    cfg_dir = tiny_dataset[1].parent
    before = sorted(p.name for p in cfg_dir.glob("*.safetensors"))
    assert train_mod.main(args) == 0
    assert sorted(p.name for p in cfg_dir.glob("*.safetensors")) == before
    best = list(work.glob("*.best.safetensors"))
    assert len(best) == 1
    _, meta = _tensors(best[0])
    assert meta["trained"] == "yes"


def test_intensity_augmentation_drops_and_varies_intensity():
    frame = train_mod.Frame(np.c_[np.random.default_rng(0).uniform(1, 40, (500, 3)).astype(np.float32),
                                  np.full(500, 20.0, np.float32)],
                            np.zeros((0, 7), np.float32), np.zeros(0, np.int64), 1.8, np.array([0, 0, 1.0]), "avia")
    default = [train_mod.augment(frame, np.random.default_rng(s))[0][:, 3] for s in range(40)]
    assert all(np.all(i > 0) for i in default)  # the original augmentation never drops intensity
    aug = train_mod.IntensityAugment(drop=0.5, gain=(0.25, 4.0), gamma=(0.6, 1.6), log_gain=True)
    out = [train_mod.augment(frame, np.random.default_rng(s), intensity=aug)[0][:, 3] for s in range(40)]
    dropped = sum(bool(np.all(i == 0)) for i in out)
    assert 10 <= dropped <= 30
    kept = [float(i.mean()) for i in out if np.any(i > 0) and i.max() > 1.0]
    assert min(kept) < 12 and max(kept) > 35  # gains well beyond the original 0.7-1.3
    assert all(np.all((i >= 0) & (i <= 255)) for i in out)


def test_use_intensity_false_zeroes_the_input_in_training_and_in_the_pipeline():
    from livox_infer.detector.config import ModelConfig
    from livox_infer.pipeline import DetectionPipeline
    from livox_infer.voxelize.reference import ReferenceConstants

    off = ModelConfig.load("lite-sim")  # the network without the point-age input (lite's channel 4 is the age)
    assert not off.use_intensity  # as lite's since stage 9
    cfg = ModelConfig.from_dict({**off.to_dict(), "use_intensity": True}, source=off.source)
    assert cfg.use_intensity and off.architecture_hash() == cfg.architecture_hash()  # not part of the architecture
    assert ModelConfig.from_dict(off.to_dict(), source=off.source) == off
    with pytest.raises(ConfigError):
        ModelConfig.from_dict({**off.to_dict(), "use_intensity": "no"})
    rng = np.random.default_rng(1)
    pts = np.c_[rng.uniform([2, -20, -1.5], [50, 20, 1.0], (3000, 3)), rng.uniform(0, 255, 3000)].astype(np.float32)
    frame = train_mod.Frame(pts, np.zeros((0, 7), np.float32), np.zeros(0, np.int64), 1.8, np.array([0, 0, 1.0]), "avia")
    *_, levelled_on = train_mod.prepare(frame, None, cfg, ReferenceConstants(cfg.grid))
    *_, levelled_off = train_mod.prepare(frame, None, off, ReferenceConstants(off.grid))
    assert np.any(levelled_on[:, 3] > 0) and np.all(levelled_off[:, 3] == 0)
    np.testing.assert_array_equal(levelled_on[:, :3], levelled_off[:, :3])
    pipe_on = DetectionPipeline(model=cfg, compile=False, refine=False, sensor_height=1.8)
    pipe_off = DetectionPipeline(model=off, compile=False, refine=False, sensor_height=1.8)
    zeroed = pts.copy()
    zeroed[:, 3] = 0
    a, b = pipe_off.detect(pts), pipe_on.detect(zeroed)
    np.testing.assert_array_equal(a.boxes, b.boxes)
    np.testing.assert_array_equal(a.scores, b.scores)


@pytest.mark.slow  # simulates shards for several sensors: ~27 s
def test_train_generates_shards_for_the_named_sensors(tmp_path):
    args = _train_args(tmp_path, "lite", data_only=True, train_frames=3, val_frames=2, sensors="hdl64,avia")
    assert train_mod.main(args) == 0
    frames = train_mod.load_shards(tmp_path / "work" / "data", "train", 1)
    assert [f.sensor for f in frames[:4]] == ["hdl64", "avia", "hdl64", "avia"]
    bad = _train_args(tmp_path / "b", "lite", data_only=True, sensors="hdl64,nope")
    assert train_mod.main(bad) == 2


@pytest.mark.slow  # a real `livox-infer train` process with a data worker, stopped by Ctrl-C: ~15 s
def test_train_stops_on_ctrl_c_keeping_its_steps(tiny_dataset, tmp_path):
    """SIGINT to the process group (what Ctrl-C in a terminal sends): exit 130 within seconds, one line saying at
    which step and how to resume, a checkpoint of the finished steps, and no worker traceback."""
    import os
    import signal
    import subprocess
    import sys
    import time

    args, work = _fresh_run(tiny_dataset, tmp_path)
    cmd = [sys.executable, "-m", "livox_infer.tools.cli", "train", "--config", str(args.config), "--work-dir", str(work),
           "--out", str(tmp_path / "o.safetensors"), "--train-frames", "50", "--val-frames", "10", "--steps", "1000000",
           "--batch", "2", "--val-every", "1000000", "--threads", "1", "--workers", "1", "--seed", "3"]
    log = tmp_path / "train.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.time() + 120
        while not re.search(r"train \S+:\s+\d+%.*\| *[1-9]\d*/", log.read_text()):  # steps are being taken
            assert proc.poll() is None and time.time() < deadline, log.read_text()[-2000:]
            time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)
        rc = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text()
    assert rc == 130, text[-2000:]
    assert "Traceback" not in text, text[-3000:]
    m = re.search(r"interrupted at step (\d+) of 1000000: checkpoint (\S+) saved; the same command with --resume", text)
    assert m and int(m.group(1)) >= 1, text[-2000:]
    _, meta = _tensors(work / "checkpoint.safetensors")
    assert int(meta["step"]) == int(m.group(1))
