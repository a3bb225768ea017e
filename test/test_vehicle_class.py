"""The truck / bus classifier (detector/vehicle_class.py; a model config's optional `vehicle_classifier` section, not
in the shipped lite config: docs/detector.md): its config section, the side-view features against a per-point loop,
relabelling (only truck / bus candidates, boxes and scores untouched), the network's stage 2 running it, warm start
adding it, a classifier fitted on simulated trucks and buses telling others apart, and `train --stage vehicle-class`
(only the classifier's tensors change)."""

import math

import numpy as np
import pytest
import torch
from safetensors import safe_open

from conftest import tiny_model_dict
from livox_infer.detector import ModelConfig, build_model, load_weights, save_weights
from livox_infer.detector.vehicle_class import (
    VehicleClassConfig, VehicleClassifier, parse_vehicle_classifier, relabel_vehicles, side_view_features,
)
from livox_infer.detector.weights import warm_start
from livox_infer.errors import ConfigError

torch.set_num_threads(1)
CLASSES = ("car", "pedestrian", "cyclist", "truck", "bus")
CFG = VehicleClassConfig()


def test_the_config_section_parses_and_refuses_bad_values():
    assert parse_vehicle_classifier(None, CLASSES, "x") is None
    assert parse_vehicle_classifier({}, CLASSES, "x") == CFG
    got = parse_vehicle_classifier({"members": 3, "height_step": 0.4}, CLASSES, "x")
    assert (got.members, got.height_step, got.num_features) == (3, 0.4, 12 * 9 + 12 + 6)
    for bad, words in (({"classes": ["truck"]}, "two of"), ({"classes": ["truck", "van"]}, "two of"),
                       ({"members": 0}, "members"), ({"hidden": 2.5}, "hidden"), ({"margin": -1}, "margin"),
                       ({"colour": 1}, "unknown"), ([1], "mapping")):
        with pytest.raises(ConfigError, match=words):
            parse_vehicle_classifier(bad, CLASSES, "x")
    assert ModelConfig.load("lite").vehicle_classifier is None  # not shipped (docs/detector.md)
    # part of the architecture: weights without it do not load as weights with it
    assert ModelConfig.from_dict(tiny_model_dict()).architecture_hash() != \
        ModelConfig.from_dict(_with_classifier(tiny_model_dict())).architecture_hash()


def _with_classifier(d):
    d["vehicle_classifier"] = {}
    return d


def _reference_features(points, box, cfg, reverse=False, ceiling=8.0):
    """One box, one point at a time."""
    x, y, z, length, width, height, yaw = (float(v) for v in box)
    nl, nh = cfg.length_bins, cfg.height_bins
    counts = np.zeros((nl, nh))
    top = np.zeros(nl)
    c, s = math.cos(yaw), math.sin(yaw)
    half_l, half_w = length / 2 + cfg.margin, width / 2 + cfg.margin
    for px, py, pz in points[:, :3].tolist():
        u = c * (px - x) + s * (py - y)
        v = -s * (px - x) + c * (py - y)
        up = pz - (z - height / 2)
        if abs(u) < half_l and abs(v) < half_w and 0.15 < up < nh * cfg.height_step:
            i = min(nl - 1, max(0, math.floor((u / half_l + 1) * nl / 2)))
            i = nl - 1 - i if reverse else i
            counts[i, min(nh - 1, int(up // cfg.height_step))] += 1
            top[i] = max(top[i], up)
    total = counts.sum()
    size = [length / 10, width / 2.5, height / 3, math.log1p(total) / 6, math.hypot(x, y) / 50, ceiling / 4]
    return np.r_[(counts / max(total, 1)).ravel() * 10, top / 4, size]


def _truck_points(box, seed=0, n=1500):
    """Points on a truck-like body in ``box``: a low cab at the front (+x end), a tall cargo box behind it."""
    r = np.random.default_rng(seed)
    x, y, z, length, width, height, yaw = box
    u = r.uniform(-length / 2, length / 2, n)
    roof = np.where(u > length / 2 - 2.2, 2.9, height)
    up = r.uniform(0.2, 1, n) * roof
    v = r.choice([-width / 2, width / 2], n)
    c, s = math.cos(yaw), math.sin(yaw)
    pts = np.c_[x + c * u - s * v, y + s * u + c * v, z - height / 2 + up, np.zeros(n)]
    noise = np.c_[r.uniform(0, 40, 300), r.uniform(-20, 20, 300), r.uniform(-1, 3, 300), np.zeros(300)]
    return torch.from_numpy(np.r_[pts, noise].astype(np.float32))


BOXES = torch.tensor([[20.0, 3.0, 1.6, 8.0, 2.5, 3.4, 0.3],
                      [12.0, -6.0, 1.5, 11.0, 2.5, 3.1, -2.0],
                      [60.0, 0.0, 1.5, 8.0, 2.5, 3.2, 0.0]])  # the last one holds no points


def test_features_match_a_per_point_loop():
    pts = torch.cat([_truck_points(BOXES[0].tolist()), _truck_points(BOXES[1].tolist(), seed=1)])
    for reverse in (False, True):
        got = side_view_features(pts, BOXES, CFG, reverse).numpy()
        assert got.shape == (3, CFG.num_features)
        for k in range(3):
            np.testing.assert_allclose(got[k], _reference_features(pts.numpy(), BOXES[k], CFG, reverse), atol=1e-4)
    front = side_view_features(pts, BOXES[:1], CFG)[0]
    top = front[12 * 9: 12 * 9 + 12] * 4
    assert top[-1] < top[0] - 0.3  # the cab (front, +x end) is lower than the cargo box
    np.testing.assert_allclose(side_view_features(pts, BOXES[:1], CFG, True)[0, 12 * 9: 12 * 9 + 12] * 4,
                               top.flip(0), atol=1e-6)
    assert float(front[: 12 * 9].sum()) == pytest.approx(10.0, abs=1e-4)  # shares (x10) of the box's points
    empty = side_view_features(pts, BOXES[2:], CFG)[0]
    assert float(empty[: 12 * 9 + 12].abs().sum()) == 0.0 and float(empty[-3]) == 0.0  # no points: zeros, count 0


def test_the_view_ceiling_is_how_high_the_sensor_sees_at_the_box():
    """A cloud whose steepest rays rise 2 degrees from a sensor 1.7 m up (a 64-beam sensor's top beam): at a box
    26 m out standing on the ground the sensor sees up to 1.7 + 26 tan 2 deg = 2.61 m; no sensor height, few points
    or a ceiling above OPEN_CEILING_M give OPEN_CEILING_M; the features carry it."""
    from livox_infer.detector.vehicle_class import OPEN_CEILING_M, view_ceiling

    r = np.random.default_rng(0)
    rng_m = r.uniform(5, 60, 5000)
    slope = np.tan(np.radians(r.uniform(-24, 2, 5000)))
    slope[:50] = np.tan(np.radians(2.0))  # the top beam
    az = r.uniform(-0.6, 0.6, 5000)
    pts = torch.from_numpy(np.c_[rng_m * np.cos(az), rng_m * np.sin(az), 1.7 + rng_m * slope,
                                 np.zeros(5000)].astype(np.float32))
    box = torch.tensor([[26.0, 0.0, 1.7, 10.0, 2.5, 3.4, 0.0]])
    got = float(view_ceiling(pts, box, 1.7)[0])
    assert got == pytest.approx(1.7 + 26 * math.tan(math.radians(2.0)), abs=0.05)
    assert float(view_ceiling(pts, box, None)[0]) == OPEN_CEILING_M
    assert float(view_ceiling(pts[:50], box, 1.7)[0]) == OPEN_CEILING_M
    assert float(view_ceiling(pts, torch.tensor([[500.0, 0.0, 1.7, 10.0, 2.5, 3.4, 0.0]]), 1.7)[0]) == OPEN_CEILING_M
    feats = side_view_features(pts, box, CFG, ceiling=torch.tensor([got]))
    assert float(feats[0, -1]) == pytest.approx(got / 4)


def _fixed(cfg, bus_logit):
    """A classifier that says bus (positive logit) or truck (negative) whatever it sees."""
    c = VehicleClassifier(cfg).eval()
    with torch.no_grad():
        for w in (c.w1, c.w2, c.w3):
            w.zero_()
        c.b3.fill_(bus_logit)
    return c


def test_relabelling_touches_only_truck_and_bus_candidates():
    labels = torch.tensor([0, 3, 4, 1, 3])
    boxes = torch.cat([BOXES, BOXES[:2]])
    pts = _truck_points(BOXES[0].tolist())
    assert relabel_vehicles(_fixed(CFG, 5.0), CLASSES, pts, labels, boxes).tolist() == [0, 4, 4, 1, 4]
    assert relabel_vehicles(_fixed(CFG, -5.0), CLASSES, pts, labels, boxes).tolist() == [0, 3, 3, 1, 3]
    none = torch.tensor([0, 1, 2, 0, 1])
    assert relabel_vehicles(_fixed(CFG, 5.0), CLASSES, pts, none, boxes) is none
    # both ends and all members averaged: a member that says bus and one that says truck as strongly give 0.5 (bus)
    two = VehicleClassConfig(members=2)
    c = _fixed(two, 0.0)
    with torch.no_grad():
        c.b3[0].fill_(3.0)
        c.b3[1].fill_(-3.0)
    assert float(c.bus_probability(pts, BOXES[:1])[0]) == pytest.approx(0.5)
    # more candidates than one chunk
    many = BOXES[[0] * 40]
    assert c.bus_probability(pts, many).shape == (40,)
    assert c.bus_probability(pts, BOXES[:0]).shape == (0,)


def test_the_networks_stage_2_runs_the_classifier_after_the_refiners():
    cfg = ModelConfig.from_dict(_with_classifier(tiny_model_dict()))
    net = build_model(cfg).eval()
    net.vehicle_classifier = _fixed(cfg.vehicle_classifier, 5.0)
    pts = _truck_points(BOXES[0].tolist())
    scores = torch.tensor([0.9, 0.8, 0.7, 0.6])
    labels = torch.tensor([0, 3, 4, 1])
    boxes = torch.tensor([[8.0, 2.0, 0.8, 4.2, 1.8, 1.5, 0.4], BOXES[0].tolist(), BOXES[1].tolist(),
                          [15.0, -5.0, 0.9, 0.6, 0.7, 1.7, -1.2]])
    s, lab, b = net.refine(pts, scores, labels, boxes, 255.0)
    unclassified = net.refine(pts, scores, labels, boxes, 255.0, classify=False)  # what its training collects
    net.vehicle_classifier = None
    s0, lab0, b0 = net.refine(pts, scores, labels, boxes, 255.0)
    torch.testing.assert_close(s, s0)
    torch.testing.assert_close(b, b0)  # boxes and scores are the refiners'
    assert lab.tolist() == [4 if x == 3 else x for x in lab0.tolist()] and 3 in lab0.tolist()  # the truck: a bus
    for got, want in zip(unclassified, (s0, lab0, b0)):
        torch.testing.assert_close(got, want)


def test_warm_start_adds_a_fresh_classifier_to_weights_without_one(tmp_path):
    old_cfg = ModelConfig.from_dict(tiny_model_dict())
    old = build_model(old_cfg)
    save_weights(old, old_cfg, tmp_path / "old.safetensors")
    cfg = ModelConfig.from_dict(_with_classifier(tiny_model_dict()))
    net = build_model(cfg)
    grown = warm_start(net, cfg, tmp_path / "old.safetensors")
    assert sorted(grown) == sorted(f"vehicle_classifier.{k}" for k in ("w1", "b1", "w2", "b2", "w3", "b3"))
    for k, v in old.state_dict().items():
        torch.testing.assert_close(net.state_dict()[k], v)


def _simulated_trucks_and_buses(first_seed, frames):
    """(levelled-enough points, labelled truck / bus boxes with >= 100 points, labels) of street frames with many
    large vehicles (a level sensor: the sensor frame's heights are the levelled frame's up to a constant)."""
    from livox_infer.sim.simulate import simulate_frame

    out = []
    for i in range(frames):
        f = simulate_frame(("avia", "horizon", "mid70", "hdl64")[i % 4], first_seed + i, scene="street",
                           large_vehicles=3, pitch_deg=0.0, roll_deg=0.0)
        keep = (f.labels >= 3) & (f.num_points >= 100)
        if keep.any():
            out.append((torch.from_numpy(f.points[f.valid]), torch.from_numpy(f.boxes[keep]),
                        torch.from_numpy(f.labels[keep])))
    return out


def _samples(frames, rng):
    """Features (2, S, F) of the boxes, jittered as a detector's boxes are, and their targets (1: bus)."""
    feats, targets = [], []
    for pts, boxes, labels in frames:
        jit = boxes.clone()
        n = boxes.shape[0]
        jit[:, :2] += torch.from_numpy(rng.normal(0, 0.3, (n, 2)).astype(np.float32))
        jit[:, 3] *= torch.from_numpy(rng.uniform(0.75, 1.1, n).astype(np.float32))  # often seen in part
        jit[:, 6] += torch.from_numpy(rng.normal(0, 0.03, n).astype(np.float32))
        feats.append(torch.stack([side_view_features(pts, jit, CFG), side_view_features(pts, jit, CFG, True)]))
        targets.append((labels == 4).float())
    return torch.cat(feats, 1), torch.cat(targets)


def test_a_classifier_fitted_on_simulated_trucks_and_buses_tells_others_apart():
    """The side view carries the difference: fitted (`training.vehicle_class.fit`) on the labelled trucks and buses
    of 80 simulated street frames (box trucks, tractor-trailers, flatbeds; city buses, coaches, articulated buses),
    it labels those of 40 other frames at least 80 % right (0.91 when written; always saying bus: ~0.6)."""
    from livox_infer.training.vehicle_class import accuracy, fit

    rng = np.random.default_rng(0)
    train_x, train_y = _samples(_simulated_trucks_and_buses(71_000_000, 80), rng)
    test_x, test_y = _samples(_simulated_trucks_and_buses(72_000_000, 40), np.random.default_rng(1))
    assert train_y.numel() >= 60 and test_y.numel() >= 40
    torch.manual_seed(0)
    classifier = VehicleClassifier(CFG)
    fit(classifier, train_x, train_y, steps=800, lr=2e-3, weight_decay=0.1, seed=0)
    got = accuracy(classifier, test_x, test_y)
    assert got["samples"] == test_y.numel()
    assert 0.25 < float(test_y.mean()) < 0.75 and got["accuracy"] >= 0.8, got


def test_training_the_classifier_changes_only_its_tensors(tmp_path):
    """`train --stage vehicle-class` on a few simulated frames with trucks and buses, from the shipped weights: the
    classifier's tensors are new, every other tensor is the shipped one, and the validation result is recorded."""
    from livox_infer.training import train as train_mod

    shipped = _shipped_weights()
    config = tmp_path / "lite-vc.yaml"  # the shipped config with a classifier
    config.write_text(f"base: {shipped.parent / 'lite.yaml'}\nvehicle_classifier: {{}}\n"
                      f"weights: {shipped}\n")
    opts = train_mod.TrainOptions(config=str(config), work_dir=tmp_path / "w", out=tmp_path / "vc.safetensors",
                                  stage="vehicle-class", init=shipped, train_frames=6, val_frames=2, steps=30,
                                  lr=2e-3, weight_decay=0.1, seed=5, threads=1, workers=0, shard_frames=2,
                                  sensors=("avia", "horizon"), sim_options={"large_vehicles": 3},
                                  vehicle_class_passes=2)
    res = train_mod.train(opts)
    assert res.out == tmp_path / "vc.safetensors" and res.step == 30
    with safe_open(str(res.out), framework="pt") as f:
        meta = f.metadata()
        new = {k: f.get_tensor(k) for k in f.keys()}
    with safe_open(str(shipped), framework="pt") as f:
        old = {k: f.get_tensor(k) for k in f.keys()}
    assert set(new) == set(old) | {f"vehicle_classifier.{k}" for k in ("w1", "b1", "w2", "b2", "w3", "b3")}
    for k in old:
        if k.startswith("vehicle_classifier."):
            continue
        assert torch.equal(new[k], old[k]), k
    cfg = ModelConfig.load(str(config))
    net = build_model(cfg)
    load_weights(net, cfg, res.out)  # loads into the config with the classifier
    assert int(meta["vehicle_class_samples"]) >= 4  # the shipped detector's candidates on labelled trucks / buses
    import json

    val = json.loads(meta["vehicle_class_val"])
    assert val["samples"] >= 0 and meta["step"] == "30"
    assert json.loads(meta["train_args"])["vehicle_class_passes"] == 2


def test_the_stage_needs_init_weights(tmp_path):
    from livox_infer.training import train as train_mod

    config = tmp_path / "lite-vc.yaml"
    config.write_text(f"base: {_shipped_weights().parent / 'lite.yaml'}\nvehicle_classifier: {{}}\n")
    opts = train_mod.TrainOptions(config=str(config), work_dir=tmp_path / "w", stage="vehicle-class", train_frames=1,
                                  val_frames=0, steps=1, threads=1, workers=0, shard_frames=1, sensors=("avia",))
    with pytest.raises(ConfigError, match="--init"):
        train_mod.train(opts)


def _shipped_weights():
    from livox_infer.resources import share_dir

    return share_dir() / "models" / "lite.safetensors"
