"""Train-time sparsification (training/sparsify.py): range thinning and object part dropout, and their train flags."""

import argparse
import dataclasses

import numpy as np
import pytest

from livox_infer.errors import ConfigError
from livox_infer.training import train as train_mod
from livox_infer.training import sparsify as sparsify_mod
from livox_infer.training.sparsify import SparsifyAugment, drop_object_parts, sparsify, thin_with_range

CAR_BOX = np.array([20.0, 0.0, -0.9, 4.0, 1.8, 1.6, 0.0], np.float32)  # x y z(centre) l w h yaw


def _box_points(box, n=4000, seed=0):
    rng = np.random.default_rng(seed)
    loc = rng.uniform(-0.5, 0.5, (n, 3)) * box[3:6]
    c, s = np.cos(box[6]), np.sin(box[6])
    xyz = np.c_[box[0] + loc[:, 0] * c - loc[:, 1] * s, box[1] + loc[:, 0] * s + loc[:, 1] * c, box[2] + loc[:, 2]]
    return np.c_[xyz, np.full(n, 10.0)].astype(np.float32), loc


def test_thin_with_range_keeps_near_points_and_thins_far_ones_at_the_set_rate():
    rng = np.random.default_rng(1)
    near = np.c_[rng.uniform(1, 20, (20000, 2)) / np.sqrt(2), np.zeros((20000, 2))].astype(np.float32)
    far = np.c_[np.full(20000, 60.0), np.zeros(20000), np.zeros((20000, 2))].astype(np.float32)
    assert len(thin_with_range(near, rng, 30.0, 1.5)) == len(near)
    kept = len(thin_with_range(far, rng, 30.0, 1.5)) / len(far)
    assert kept == pytest.approx((30 / 60) ** 1.5, abs=0.02)


def test_part_dropout_removes_points_of_the_object_only():
    obj, _ = _box_points(CAR_BOX)
    background = np.c_[np.random.default_rng(2).uniform(30, 50, (3000, 3)), np.zeros(3000)].astype(np.float32)
    pts = np.r_[obj, background]
    labels = np.array([0])
    removed = []
    for seed in range(30):
        out = drop_object_parts(pts, CAR_BOX[None], labels, np.random.default_rng(seed), prob=1.0)
        assert np.all(np.isin(background[:, 0], out[:, 0]))  # nothing outside the box is lost
        removed.append(len(pts) - len(out))
    assert min(removed) > 0.1 * len(obj) and max(removed) < 0.9 * len(obj)
    same = drop_object_parts(pts, CAR_BOX[None], labels, np.random.default_rng(0), prob=0.0)
    assert np.array_equal(same, pts)


def test_glass_band_takes_the_top_of_a_car():
    obj, loc = _box_points(CAR_BOX)
    for seed in range(40):  # some seed draws the glass mode; it removes only the upper part
        out = drop_object_parts(obj, CAR_BOX[None], np.array([0]), np.random.default_rng(seed), prob=1.0)
        z_out = out[:, 2] - CAR_BOX[2]
        if len(out) < len(obj) and z_out.max() < 0.2 * CAR_BOX[5] and z_out.min() < -0.45 * CAR_BOX[5]:
            return
    pytest.fail("no seed removed a glass band")


def test_sparsify_off_draws_nothing_and_changes_nothing():
    pts, _ = _box_points(CAR_BOX)
    rng = np.random.default_rng(5)
    out = sparsify(pts, CAR_BOX[None], np.array([0]), rng, SparsifyAugment())
    assert out is pts and rng.random() == np.random.default_rng(5).random()
    on = sparsify(pts, CAR_BOX[None], np.array([0]), np.random.default_rng(5), SparsifyAugment(1.0, 30.0, 1.5, 1.0))
    assert len(on) < len(pts)


def test_train_flags_build_the_augment_and_reject_bad_shares():
    p = argparse.ArgumentParser()
    train_mod.add_arguments(p)
    args = p.parse_args(["--range-thinning", "0.5", "--part-dropout", "0.3"])
    assert train_mod.options_from_args(args).sparse == SparsifyAugment(range_prob=0.5, part_prob=0.3)
    assert not train_mod.options_from_args(p.parse_args([])).sparse.enabled
    with pytest.raises(ConfigError, match="--part-dropout"):
        train_mod.options_from_args(p.parse_args(["--part-dropout", "1.5"]))


def test_part_dropout_classes_leave_the_other_classes_whole():
    ped_box = np.array([10.0, 5.0, -0.9, 0.7, 0.6, 1.7, 0.0], np.float32)
    car, _ = _box_points(CAR_BOX)
    ped, _ = _box_points(ped_box, n=800, seed=1)
    pts, boxes, labels = np.r_[car, ped], np.stack([ped_box, CAR_BOX]), np.array([1, 0])  # the pedestrian box first
    ped_in = np.abs(pts[:, 0] - ped_box[0]) < 1.0
    for seed in range(10):
        out = drop_object_parts(pts, boxes, labels, np.random.default_rng(seed), 1.0, classes=(0,))
        assert len(out) < len(pts)  # the car loses a part
        assert (np.abs(out[:, 0] - ped_box[0]) < 1.0).sum() == ped_in.sum()  # the pedestrian none
    only_peds = drop_object_parts(car, CAR_BOX[None], np.array([0]), np.random.default_rng(0), 1.0, classes=(1,))
    assert np.array_equal(only_peds, car)


def test_part_dropout_classes_flag():
    p = argparse.ArgumentParser()
    train_mod.add_arguments(p)
    args = p.parse_args(["--part-dropout", "0.5", "--part-dropout-classes", "car, cyclist"])
    assert train_mod.options_from_args(args).sparse == SparsifyAugment(part_prob=0.5, part_classes=(0, 2))
    assert train_mod.options_from_args(p.parse_args(["--part-dropout", "0.5"])).sparse.part_classes is None
    with pytest.raises(ConfigError, match="--part-dropout-classes"):
        train_mod.options_from_args(p.parse_args(["--part-dropout", "0.5", "--part-dropout-classes", "tank"]))


def test_scale_objects_scales_each_box_with_its_points_about_its_bottom_face():
    """Random object scaling: points inside the box move with it (still inside, at the same place in box units), a
    ground return inside it stays on the ground, the background and ignored boxes stay as they are."""
    car, loc = _box_points(CAR_BOX)
    ground = np.array([[21.0, 0.5, CAR_BOX[2] - CAR_BOX[5] / 2 + 0.02, 5.0]], np.float32)  # 2 cm over its bottom
    background = np.c_[np.random.default_rng(2).uniform(30, 50, (500, 3)), np.zeros(500)].astype(np.float32)
    ignored = np.array([10.0, 6.0, -0.9, 4.0, 1.8, 1.6, 0.0], np.float32)
    pts, boxes, labels = np.r_[car, ground, background], np.stack([CAR_BOX, ignored]), np.array([0, -1])
    out, out_boxes = train_mod.scale_objects(pts, boxes, labels, np.random.default_rng(3), 1.1, 1.1)
    assert out_boxes[0, 3:6] == pytest.approx(CAR_BOX[3:6] * 1.1, rel=1e-6)
    assert out_boxes[0, 2] - out_boxes[0, 5] / 2 == pytest.approx(CAR_BOX[2] - CAR_BOX[5] / 2, abs=1e-6)
    assert np.array_equal(out_boxes[1], ignored) and np.array_equal(out[-500:], background)
    assert np.allclose(out[:len(car), :2] - out_boxes[0, :2], 1.1 * (car[:, :2] - CAR_BOX[:2]), atol=1e-4)
    assert out[len(car), 2] == pytest.approx(ground[0, 2] + 0.002, abs=1e-5)  # 2.2 cm over the same bottom
    assert out[len(car), :2] == pytest.approx([21.1, 0.55], abs=1e-4)
    assert np.array_equal(out[:, 3], pts[:, 3]) and np.array_equal(pts[:len(car)], car)  # input untouched
    # a box that would grow into its neighbour stays; shrinking is always allowed
    near = CAR_BOX + np.array([0, 4.5, 0, 0, 0, 0, 0], np.float32)
    _, grown = train_mod.scale_objects(car, np.stack([CAR_BOX, near]), np.array([0, 0]), np.random.default_rng(0),
                                       1.2, 1.2)
    assert np.allclose(grown, np.stack([CAR_BOX, near]))
    _, shrunk = train_mod.scale_objects(car, np.stack([CAR_BOX, near]), np.array([0, 0]), np.random.default_rng(0),
                                        0.9, 0.9)
    assert shrunk[:, 3:6] == pytest.approx(np.stack([CAR_BOX, near])[:, 3:6] * 0.9, rel=1e-6)


def test_object_scale_flag():
    p = argparse.ArgumentParser()
    train_mod.add_arguments(p)
    sparse = train_mod.options_from_args(p.parse_args(["--object-scale", "0.85", "1.15"])).sparse
    assert sparse.object_scale == (0.85, 1.15) and not sparse.enabled  # sparsify() itself stays off
    assert train_mod.options_from_args(p.parse_args([])).sparse.object_scale is None
    for bad in (["0", "1.1"], ["1.2", "1.1"], ["0.9", "2.5"]):
        with pytest.raises(ConfigError, match="--object-scale"):
            train_mod.options_from_args(p.parse_args(["--object-scale", *bad]))
    frame = train_mod.Frame(np.r_[_box_points(CAR_BOX)[0]], CAR_BOX[None], np.array([0]), 1.8, np.array([0, 0, 1.0]),
                            "avia")
    plain = train_mod.augment(frame, np.random.default_rng(4))
    scaled = train_mod.augment(frame, np.random.default_rng(4), sparse=SparsifyAugment(object_scale=(1.3, 1.3)))
    assert scaled[1][0, 3] == pytest.approx(plain[1][0, 3] * 1.3, rel=1e-5)


def test_thin_simulated_cars_keeps_near_cars_and_dims_far_ones_only():
    """Cars from 30 m on keep a per-car share drawn from U(low, high); a car inside 15 m keeps every point, one at
    ~24 m the ramp's share; a pedestrian and the background keep theirs."""
    far = CAR_BOX + np.array([20.0, 0, 0, 0, 0, 0, 0], np.float32)  # 40 m
    mid = CAR_BOX + np.array([2.5, 8.0, 0, 0, 0, 0, 0], np.float32)  # sqrt(22.5^2 + 8^2) ~ 23.9 m
    near = CAR_BOX + np.array([-10.0, 0, 0, 0, 0, 0, 0], np.float32)  # 10 m
    ped = np.array([40.0, 5.0, -0.9, 0.6, 0.6, 1.7, 0.0], np.float32)
    boxes = np.stack([far, mid, near, ped])
    labels = np.array([0, 0, 0, 1])
    parts = [_box_points(b, seed=i)[0] for i, b in enumerate(boxes)]
    background = np.c_[np.random.default_rng(2).uniform(60, 70, (500, 3)), np.zeros(500)].astype(np.float32)
    pts = np.concatenate([*parts, background])
    out = sparsify_mod.thin_simulated_cars(pts, boxes, labels, np.random.default_rng(5), 0.4, 0.4)
    counts = train_mod.points_in_boxes(out, boxes)
    ramp = (np.hypot(mid[0], mid[1]) - 15.0) / 15.0
    assert counts[0] / len(parts[0]) == pytest.approx(0.4, abs=0.03)
    assert counts[1] / len(parts[1]) == pytest.approx(1 - 0.6 * ramp, abs=0.03)
    assert counts[2] == len(parts[2]) and counts[3] == len(parts[3])
    assert np.array_equal(out[-500:], background)


def test_sim_car_keep_flag_and_real_views_left_alone():
    p = argparse.ArgumentParser()
    train_mod.add_arguments(p)
    sparse = train_mod.options_from_args(p.parse_args(["--sim-car-keep", "0.25", "0.65"])).sparse
    assert sparse.sim_car_keep == (0.25, 0.65) and not sparse.enabled
    assert train_mod.options_from_args(p.parse_args([])).sparse.sim_car_keep is None
    for bad in (["0", "0.5"], ["0.6", "0.5"], ["0.5", "1.2"]):
        with pytest.raises(ConfigError, match="--sim-car-keep"):
            train_mod.options_from_args(p.parse_args(["--sim-car-keep", *bad]))
    box = CAR_BOX + np.array([20.0, 0, 0, 0, 0, 0, 0], np.float32)  # 40 m
    sim = train_mod.Frame(_box_points(box)[0], box[None], np.array([0]), 1.8, np.array([0, 0, 1.0]), "hdl64")
    real = dataclasses.replace(sim, real=True)
    aug = SparsifyAugment(sim_car_keep=(0.3, 0.3))
    plain = train_mod.augment(sim, np.random.default_rng(4))[0]
    assert len(train_mod.augment(sim, np.random.default_rng(4), sparse=aug)[0]) < 0.5 * len(plain)
    assert np.array_equal(train_mod.augment(real, np.random.default_rng(4), sparse=aug)[0], plain)
