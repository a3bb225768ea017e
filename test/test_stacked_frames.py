"""Stacked frames with a point-age input (issue 32 item 4): the accumulator gives every stacked point a time,
the pipeline feeds ages to a model with ``grid.age_channel_s`` and only the newest frame to stage 2, training
samples stack simulated drives, and a stage-12 network grows the age input without changing what it computes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import yaml

from livox_infer.accumulate import Accumulator, point_ages
from livox_infer.detector.refine import EARLIER_FRAME_AGE_S
from livox_infer.decode.pointcloud import Cloud
from livox_infer.detector.config import ModelConfig
from livox_infer.errors import ConfigError

MS = 1_000_000


def age_config(age_s: float = 0.5, base: str = "lite-sim", **extra) -> ModelConfig:
    """``base`` (default lite-sim: the stage-10 network, no age input) with the point-age input."""
    plain = ModelConfig.load(base)
    d = plain.to_dict()
    d["grid"]["age_channel_s"] = age_s
    d.update(extra)
    return ModelConfig.from_dict(d, source=plain.source)


def cloud(n: int, stamp_ms: int, seed: int, time: bool = False) -> Cloud:
    rng = np.random.default_rng(seed)
    pts = np.c_[rng.uniform([5, -5, -1], [30, 5, 1], (n, 3)), rng.uniform(0, 255, n)].astype(np.float32)
    return Cloud(pts, np.linspace(0, 0.099, n) if time else None, None, stamp_ms * MS, "livox")


def test_stacked_clouds_always_carry_point_times_and_ages():
    acc = Accumulator(3)
    single = acc.add(cloud(10, 0, 0))
    assert single.time is None and point_ages(single) is None  # one frame without times: nothing to say
    acc.add(cloud(10, 100, 1))
    out = acc.add(cloud(10, 200, 2))
    ages = point_ages(out)
    np.testing.assert_allclose(ages, np.repeat([0.2, 0.1, 0.0], 10), atol=1e-6)  # oldest frame first
    # with point times: a point's age is how long before the newest stamp it was measured
    acc = Accumulator(2)
    acc.add(cloud(10, 0, 0, time=True))
    out = acc.add(cloud(10, 100, 1, time=True))
    ages = point_ages(out)
    np.testing.assert_allclose(ages[:10], 0.1 - np.linspace(0, 0.099, 10), atol=1e-6)
    assert not ages[10:].any()  # the newest frame's times run forward from its stamp: age 0


def test_age_config_needs_intensity_off_and_names_its_channel():
    cfg = age_config()
    assert cfg.grid.channel_names[4] == "age_mean"
    assert cfg.architecture_hash() != ModelConfig.load("lite-sim").architecture_hash()
    assert ModelConfig.load("lite").grid.age_channel_s == 0.5  # the shipped model has it (stage 13)
    with pytest.raises(ConfigError, match="use_intensity"):
        age_config(use_intensity=True)


def test_warm_start_turns_the_unused_intensity_input_into_a_zero_age_input():
    """A network without the age input (here lite-sim, the stage-10 weights; stage 12 grew so into stage 13) gets
    it with zero weights where its intensity input was: with channel 4 at 0, as the pipeline feeds a model without
    intensity, it computes what it did."""
    from livox_infer.detector.network import build_model
    from livox_infer.detector.weights import load_weights, warm_start

    lite, cfg = ModelConfig.load("lite-sim"), age_config()
    old = build_model(lite).eval()
    load_weights(old, lite, lite.weights_path())
    new = build_model(cfg).eval()
    assert warm_start(new, cfg, lite.weights_path()) == ["backbone.stem.0.0.weight"]
    w = new.backbone.stem[0][0].weight
    assert not w[:, 4].any()
    torch.testing.assert_close(torch.cat([w[:, :4], w[:, 5:]], 1),
                               torch.cat([old.backbone.stem[0][0].weight[:, :4], old.backbone.stem[0][0].weight[:, 5:]], 1))
    bev = torch.rand(1, *cfg.grid.shape)
    zeroed = bev.clone()
    zeroed[:, 4] = 0
    with torch.no_grad():
        a, b = old(zeroed), new(bev)
    for name in ("heatmap", "size", "offset"):
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-5)


def test_pipeline_feeds_ages_to_the_network_and_the_newest_frame_to_stage_2(tmp_path, monkeypatch):
    from livox_infer.pipeline import DetectionPipeline

    pipe = DetectionPipeline(model="lite", compile=False, sensor_height=1.8)  # the shipped model has the age input
    seen = {}
    voxelize = pipe.voxelizer

    def spy_voxelizer(points):
        seen["voxelized"] = points.clone()
        return voxelize(points)

    refine = pipe._stage2.refine

    def spy_refine(points, *a, **k):
        seen["refined"] = points.clone()
        return refine(points, *a, **k)

    pipe.voxelizer = spy_voxelizer
    monkeypatch.setattr(pipe._stage2, "refine", spy_refine)
    acc = Accumulator(3)
    for i in range(3):
        stacked = acc.add(cloud(2000, 100 * i, i))
    pipe.detect(stacked)
    np.testing.assert_allclose(np.sort(np.unique(seen["voxelized"][:, 3].numpy())), [0.0, 0.1, 0.2], atol=1e-6)
    assert len(seen["refined"]) == 2000 and not seen["refined"][:, 3].any()  # the newest frame, no age column
    pipe.detect(cloud(2000, 1000, 5))  # a single frame: age 0 everywhere, all of it refined
    assert not seen["voxelized"][:, 3].any() and len(seen["refined"]) == 2000


def test_a_model_without_the_age_input_still_refines_only_the_newest_frame():
    from livox_infer.pipeline import DetectionPipeline

    pipe = DetectionPipeline(model="lite-sim", compile=False, sensor_height=1.8)
    seen = {}
    refine = pipe._stage2.refine
    pipe._stage2.refine = lambda points, *a, **k: (seen.setdefault("n", len(points)), refine(points, *a, **k))[1]
    acc = Accumulator(2)
    acc.add(cloud(1500, 0, 0))
    pipe.detect(acc.add(cloud(1000, 100, 1)))
    assert seen["n"] == 1000
    assert EARLIER_FRAME_AGE_S < 0.1  # one Livox frame


def test_stacked_training_sample_has_the_newest_frames_boxes_and_ages():
    from livox_infer.sim.simulate import simulate_frame
    from livox_infer.training.stacked import simulate_stacked_frame

    f = simulate_stacked_frame("avia", 10, "street", 3, ego_speed=8.0)  # even seed: one age per frame
    last = simulate_frame("avia", 10, frame_index=2, scene="street", ego_speed=8.0)
    np.testing.assert_array_equal(f.boxes, np.asarray(last.boxes, np.float32).reshape(-1, 7))
    np.testing.assert_allclose(np.unique(np.round(f.age, 3)), [0.0, 0.1, 0.2], atol=1e-6)
    assert f.points.shape == (f.age.shape[0], 4)
    n_new = int(last.valid.sum())
    assert np.count_nonzero(f.age == 0) == n_new
    g = simulate_stacked_frame("avia", 11, "street", 2, ego_speed=8.0)  # odd seed: ages from the point times
    assert len(np.unique(g.age)) > 10 and g.age.max() <= 0.2 + 1e-6


def test_stacked_shards_round_trip_and_prepare_feeds_ages(tmp_path):
    from livox_infer.training import train as train_mod
    from livox_infer.voxelize.reference import ReferenceConstants

    cfg = age_config()
    train_mod.generate_shard(tmp_path, "train", 0, 5, cfg, {"ego_speed": 5.0}, ("avia", "hdl64"), 3, (2, 3))
    frames = train_mod.load_shards(tmp_path, "train", 1)
    assert [round(float(f.age.max()), 1) for f in frames] == [0.1, 0.2, 0.1]  # 2, 3, 2 frames stacked
    f = frames[1]
    bev, *_, levelled = train_mod.prepare(f, None, cfg, ReferenceConstants(cfg.grid))
    np.testing.assert_allclose(levelled[:, 3], f.age)
    assert bev[4].max() > 0
    rng = np.random.default_rng(0)
    pts, *_ = train_mod.augment(dataclasses.replace(f, points=np.c_[f.points[:, :3], f.age]), rng, age_column=True)
    assert np.isin(pts[:, 3], f.age).all() and pts[:, 3].max() > 0.05  # the intensity augmentation left it alone
    lite = ModelConfig.load("lite-sim")  # a model without the age input gets zeros there, stacked or not
    *_, levelled = train_mod.prepare(f, None, lite, ReferenceConstants(lite.grid))
    assert not levelled[:, 3].any()
    assert train_mod.parse_stack("2,4") == (2, 4) and train_mod.parse_stack([3]) == (3, 3)
    with pytest.raises(ConfigError, match="stack"):
        train_mod.parse_stack("a")


def test_a_stage_2_that_fails_to_compile_runs_eagerly(monkeypatch, caplog, tmp_path):
    """The compiled pipeline warms stage 2's compiled parts up at start; a compiler failure there leaves stage 2
    eager with one warning instead of failing the frame (issue 33)."""
    import logging

    from livox_infer.pipeline import DetectionPipeline

    monkeypatch.setenv("LIVOX_INFER_CACHE_DIR", str(tmp_path))  # nothing saved by an earlier start to load instead

    pipe = DetectionPipeline(model="lite", compile=False, sensor_height=1.8)

    def failing(*a, **k):
        def run(*args, **kwargs):
            raise RuntimeError("no C++ compiler")
        return run

    monkeypatch.setattr(torch, "compile", failing)
    pipe._stage2.compile_refiner()
    assert pipe._stage2.compiled_refiner is not None
    with caplog.at_level(logging.WARNING):
        pipe.self_test()
    assert pipe._stage2.compiled_refiner is None
    assert any("stage 2 failed, running it eagerly" in r.message for r in caplog.records)
    assert len(pipe.detect(cloud(3000, 0, 1)).timings_ms) == 7


def _moving_car_stack():
    """A 3-frame stack (ages 0.2, 0.1, 0 s) of a car driving +x at 10 m/s (now at x = 20), a parked car at y = 6,
    and the road: (cloud, the moving car's points, the parked car's, the road's)."""
    from livox_infer.decode.pointcloud import Cloud

    rng = np.random.default_rng(0)
    parts, times = [], []
    for age, x in ((0.2, 18.0), (0.1, 19.0), (0.0, 20.0)):
        parts.append(np.c_[rng.uniform(x - 2, x + 2, 100), rng.uniform(-0.9, 0.9, 100), rng.uniform(-1.5, 0, 100)])
        times.append(np.full(100, -age))
    parts.append(np.c_[rng.uniform(8, 12, 150), rng.uniform(5.1, 6.9, 150), rng.uniform(-1.5, 0, 150)])  # parked
    times.append(np.repeat([-0.2, -0.1, 0.0], 50))
    parts.append(np.c_[rng.uniform(10, 30, 200), rng.uniform(-4, 4, 200), np.full(200, -1.7)])  # road, 0.2 s old
    times.append(np.full(200, -0.2))
    pts = np.c_[np.vstack(parts), np.zeros(650)].astype(np.float32)
    return Cloud(pts, np.concatenate(times), None, 5, "s"), slice(0, 300), slice(300, 450), slice(450, 650)


def test_moving_objects_older_points_move_to_where_the_tracker_says_they_are():
    from livox_infer.accumulate import compensate_object_motion

    cloud, car, parked, road = _moving_car_stack()
    boxes = np.array([[20.0, 0.0, -0.85, 4.5, 1.9, 1.7, 0.0], [10.0, 6.0, -0.85, 4.5, 1.9, 1.7, 0.0]])
    out, moved = compensate_object_motion(cloud, boxes, np.array([[10.0, 0.0], [0.2, 0.0]]))
    assert moved == 200  # the moving car's two older frames; not its newest, the parked car (0.2 m/s) or the road
    x = out.points[car, 0]
    assert x.min() >= 18.0 - 1e-4  # every frame of it where the newest one is (18..22)
    assert np.allclose(x[:200], cloud.points[car, 0][:200] + np.repeat([2.0, 1.0], 100), atol=1e-4)
    assert np.array_equal(out.points[parked], cloud.points[parked]) and np.array_equal(out.points[road],
                                                                                         cloud.points[road])
    assert np.array_equal(out.time, cloud.time) and cloud.points[car, 0].min() < 16.5  # the input is untouched
    # nothing to move: the same cloud back (no copy)
    for b, v in ((boxes[:0], np.zeros((0, 2))), (boxes[:1], np.array([[0.5, 0.0]])),
                 (np.full((1, 7), np.nan), np.array([[10.0, 0.0]]))):
        same, n = compensate_object_motion(cloud, b, v)
        assert same is cloud and n == 0


def test_tracker_predicts_its_moving_tracks_without_changing_them():
    from livox_infer.tracking import Tracker

    tracker = Tracker()
    assert tracker.predict(0)[0].shape == (0, 7)  # before any frame
    t0 = 10_000_000_000
    for k in range(4):
        tracker.update([[10 + 1.0 * k, 2.0, -1.0, 4.5, 1.9, 1.6, 0.0]], [0], [0.9], t0 + k * 100_000_000)
    boxes, vel = tracker.predict(t0 + 4 * 100_000_000)
    assert boxes.shape == (1, 7) and boxes[0, 0] == pytest.approx(14.0, abs=0.3) and vel[0, 0] == pytest.approx(10.0, abs=1.5)
    again, _ = tracker.predict(t0 + 4 * 100_000_000)
    assert np.array_equal(again, boxes)  # no state changed
    assert tracker.predict(t0)[0].shape == (0, 7)  # time going back
    assert tracker.predict(t0 + 4 * 100_000_000, np.eye(4))[0].shape == (0, 7)  # poses start: another frame
    # with poses: the prediction comes back in the cloud frame of the pose given (eight frames: a moving sensor's
    # boxes count the shot-time spread as noise, so the velocity settles a few frames later than a standing one's)
    tracker = Tracker()
    pose = np.eye(4)
    for k in range(8):
        pose[0, 3] = 5.0 * k * 0.1  # the vehicle drives +x at 5 m/s, the car at 15 m/s over ground
        tracker.update([[10 + 1.0 * k, 2.0, -1.0, 4.5, 1.9, 1.6, 0.0]], [0], [0.9], t0 + k * 100_000_000, pose.copy())
    pose[0, 3] = 4.0
    boxes, vel = tracker.predict(t0 + 8 * 100_000_000, pose)
    assert boxes[0, 0] == pytest.approx(18.0, abs=0.3) and vel[0, 0] == pytest.approx(15.0, abs=2.0)
