"""Stage 2 (model/refine.py): RoI point gathering against a per-box loop, residual encoding, matching, the
loss, re-scoring, the config section, weights (warm start adds a fresh refiner, the detector stays exact)
and `livox-infer train --stage refine` (trains only the refiner: the detector's tensors stay bit-identical)."""

import argparse
import math

import numpy as np
import pytest
import torch
import yaml
from safetensors import safe_open

from conftest import tiny_model_dict
from livox_infer.errors import ConfigError, WeightsError
from livox_infer.detector import ModelConfig, build_model, load_weights, save_weights
from livox_infer.training import train as train_mod
from livox_infer.detector.boxes import axis_angle, paired_bev_iou
from livox_infer.detector.refine import (
    POINT_FEATURES, VIS_OBSTACLE_Z, CompiledRefiner, RefineConfig, RoiRefiner, apply_residuals, context_size,
    encode_residuals, first_hit_map, match_candidates, refine_candidates, refine_loss, roi_context,
    roi_point_features, roi_visibility,
)
from livox_infer.detector.weights import warm_start

torch.set_num_threads(1)


def _cfg_dict(refine=None, large=None):
    d = tiny_model_dict()
    d.pop("refine", None)
    d.pop("refine_large", None)
    if refine is not None:
        d["refine"] = refine
    if large is not None:
        d["refine_large"] = large
    return d


SMALL = {"rois": 4, "points": 16, "point_channels": [8], "hidden": [8]}
THREE = {**SMALL, "classes": ["car", "pedestrian", "cyclist"]}
TWO = {**SMALL, "classes": ["truck", "bus"]}


def _points(n=3000, seed=0):
    r = np.random.default_rng(seed)
    return torch.from_numpy(np.c_[r.uniform(0, 25, n), r.uniform(-12, 12, n), r.uniform(-0.2, 2.5, n),
                                  r.uniform(0, 255, n)].astype(np.float32))


BOXES = torch.tensor([[10.0, 2.0, 0.8, 4.2, 1.8, 1.5, 0.4],
                      [15.0, -5.0, 0.9, 0.6, 0.7, 1.7, -1.2],
                      [40.0, 0.0, 0.8, 4.0, 1.8, 1.5, 0.0]])  # the last one outside the cloud: no points


def _reference_features(points, boxes, n_samples, margin, scale):
    """One box at a time, in plain Python: the points inside the enlarged box, largest hash first."""
    feats = torch.zeros(boxes.shape[0], n_samples, POINT_FEATURES)
    valid = torch.zeros(boxes.shape[0], n_samples, dtype=torch.bool)
    golden = (math.sqrt(5) - 1) / 2
    key = [math.modf(i * golden)[0] for i in range(points.shape[0])]
    for r, (x, y, z, l, w, h, yaw) in enumerate(boxes.tolist()):
        c, s = math.cos(yaw), math.sin(yaw)
        hl, hw, hh = l / 2 + margin, w / 2 + margin, h / 2 + margin
        inside = []
        for i, (px, py, pz, pi) in enumerate(points.tolist()):
            u, v, q = c * (px - x) + s * (py - y), -s * (px - x) + c * (py - y), pz - z
            if abs(u) <= hl and abs(v) <= hw and abs(q) <= hh:
                inside.append((key[i], [u / hl, v / hw, q / hh, u, v, q, pi / scale]))
        for j, (_, f) in enumerate(sorted(inside, key=lambda t: -t[0])[:n_samples]):
            feats[r, j] = torch.tensor(f)
            valid[r, j] = True
    return feats, valid


def test_roi_point_features_match_a_per_box_loop():
    pts = _points()
    feats, valid = roi_point_features(pts, BOXES, 16, 0.5, 255.0)
    ref_f, ref_v = _reference_features(pts, BOXES, 16, 0.5, 255.0)
    assert feats.shape == (3, 16, POINT_FEATURES) and torch.equal(valid, ref_v)
    assert torch.allclose(feats, ref_f, atol=1e-4)
    assert valid[0].all() and 0 < valid[1].sum() < 16 and not valid[2].any()  # full, padded, empty
    assert (feats[~valid] == 0).all() and (feats[valid][:, :3].abs() <= 1 + 1e-6).all()
    # deterministic, and independent of the other boxes
    again, _ = roi_point_features(pts, BOXES[1:2], 16, 0.5, 255.0)
    assert torch.equal(again[0], feats[1])


def test_point_cells_give_the_same_near_points_as_a_map_per_call():
    """Each refinement pass reuses the cloud's cell per point (`PointCells`): the near points must be the ones the
    per-call map finds, also for boxes partly or wholly outside the cloud's extent; a cloud with NaN or absurd
    extent gets no cells (the per-call map runs)."""
    from livox_infer.detector.refine import PointCells, _near_any_box

    r = np.random.default_rng(4)
    pts = torch.from_numpy(np.c_[r.uniform(-30, 60, (5000, 2)), r.uniform(-1, 2, 5000),
                                 r.uniform(0, 255, 5000)].astype(np.float32))
    cells = PointCells(pts)
    assert cells.flat is not None
    for trial in range(20):
        n = int(r.integers(1, 12))
        boxes = torch.from_numpy(np.c_[r.uniform(-45, 75, (n, 2)), r.uniform(-1, 1, n), r.uniform(0.5, 12, (n, 3)),
                                       r.uniform(-np.pi, np.pi, n)].astype(np.float32))
        want = _near_any_box(pts, boxes, 0.5)
        got = _near_any_box(pts, boxes, 0.5, cells=cells)
        assert torch.equal(got, want), trial
    far = torch.tensor([[500.0, 500.0, 0.0, 4.0, 2.0, 1.5, 0.0]])  # nowhere near the cloud
    assert len(_near_any_box(pts, far, 0.5, cells=cells)) == 0
    with_nan = pts.clone()
    with_nan[7, 0] = float("nan")
    assert PointCells(with_nan).flat is None
    assert PointCells(torch.tensor([[0.0, 0.0, 0, 0], [3e6, 3e6, 0, 0]])).flat is None
    assert PointCells(pts[:0]).flat is None
    boxes = torch.tensor([[10.0, 0.0, 0.0, 4.0, 2.0, 1.5, 0.3]])
    assert torch.equal(_near_any_box(with_nan, boxes, 0.5, cells=PointCells(with_nan)),
                       _near_any_box(with_nan, boxes, 0.5))


def test_roi_point_features_edge_cases():
    f, v = roi_point_features(torch.zeros(0, 4), BOXES, 8, 0.5, 255.0)
    assert f.shape == (3, 8, POINT_FEATURES) and not v.any()
    f, v = roi_point_features(_points(5), BOXES[:0], 8, 0.5, 255.0)
    assert f.shape == (0, 8, POINT_FEATURES)
    few = torch.tensor([[10.0, 2.0, 0.8, 50.0], [10.5, 2.2, 1.0, 100.0]])  # fewer points than samples
    f, v = roi_point_features(few, BOXES[:1], 8, 0.5, 100.0)
    assert v[0].sum() == 2 and set(f[0, v[0], 6].tolist()) == {0.5, 1.0}


def test_residuals_round_trip():
    g = torch.Generator().manual_seed(0)
    boxes = torch.cat([torch.rand(50, 2, generator=g) * 40, torch.rand(50, 1, generator=g),
                       0.5 + 4 * torch.rand(50, 3, generator=g), (torch.rand(50, 1, generator=g) - 0.5) * 3], 1)
    target = boxes + torch.cat([torch.randn(50, 3, generator=g) * 0.3, torch.zeros(50, 3),
                                torch.randn(50, 1, generator=g) * 0.3], 1)
    target[:, 3:6] *= torch.exp(torch.randn(50, 3, generator=g) * 0.2)
    back = apply_residuals(boxes, encode_residuals(boxes, target))
    assert torch.allclose(back[:, :6], target[:, :6], atol=1e-4)
    assert torch.allclose(axis_angle(back[:, 6] - target[:, 6]), torch.zeros(50), atol=1e-5)
    assert torch.equal(apply_residuals(boxes, torch.zeros(50, 7)), boxes)
    # the same box turned by pi needs no change
    turned = boxes.clone()
    turned[:, 6] += math.pi
    assert encode_residuals(boxes, turned).abs().max() < 1e-4


def test_match_candidates_is_class_aware():
    gt = torch.tensor([[10.1, 2.0, 0.8, 4.2, 1.8, 1.5, 0.4], [15.0, -5.0, 0.9, 0.6, 0.7, 1.7, -1.2]])
    iou, matched = match_candidates(BOXES, torch.tensor([0, 2, 0]), gt, torch.tensor([0, 1]))
    assert 0.9 < iou[0] < 1 and torch.equal(matched[0], gt[0])
    assert iou[1] == 0 and torch.equal(matched[1], BOXES[1])  # a cyclist candidate on a pedestrian: background
    assert iou[2] == 0
    iou, matched = match_candidates(BOXES, torch.tensor([0, 1, 0]), gt[:0], torch.tensor([], dtype=torch.long))
    assert (iou == 0).all() and torch.equal(matched, BOXES)


def test_refiner_starts_as_the_identity_and_learns():
    cfg = RefineConfig(points=16, point_channels=(16, 32), hidden=(32,))
    torch.manual_seed(0)
    net = RoiRefiner(cfg, 3)
    pts = _points()
    labels = torch.tensor([0, 1, 0])
    scores = torch.tensor([0.9, 0.6, 0.3])
    feats, valid = roi_point_features(pts, BOXES, 16, 0.5, 255.0)
    ctx = roi_context(scores, labels, BOXES, 3)
    assert ctx.shape == (3, context_size(3)) and torch.isfinite(ctx).all()
    logit, residual = net(feats, valid, ctx)
    assert logit.shape == (3,) and residual.shape == (3, 7) and (residual == 0).all()  # zero-initialised
    assert torch.isfinite(logit).all()  # also for the box without points
    # fit: the car candidate is 0.3 m off its object, the other two are background
    gt = torch.tensor([[10.3, 2.0, 0.8, 4.4, 1.8, 1.5, 0.45]])
    match_iou, matched = match_candidates(BOXES, labels, gt, torch.tensor([0]))
    assert match_iou[0] > 0.5 and (match_iou[1:] == 0).all()
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    first = None
    for _ in range(150):
        loss, parts = refine_loss(*net(feats, valid, ctx), BOXES, labels, match_iou, matched, ("car", "pedestrian", "cyclist"))
        first = first if first is not None else parts
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert parts["refine_box"] < 0.2 * first["refine_box"] and parts["refine_iou"] < first["refine_iou"]
    net.eval()
    logit, residual = net(feats, valid, ctx)
    refined = apply_residuals(BOXES[:1], residual[:1])
    assert paired_bev_iou(refined, gt) > paired_bev_iou(BOXES[:1], gt) + 0.1
    assert torch.sigmoid(logit[1]) < 0.2


def test_refine_candidates_rescoring():
    cfg0 = RefineConfig(rois=2, points=16, point_channels=(8,), hidden=(8,), score_alpha=(0.0, 0.0, 0.0))
    net = RoiRefiner(cfg0, 3).eval()
    scores, labels = torch.tensor([0.9, 0.6, 0.3]), torch.tensor([0, 1, 0])
    s, l, b = refine_candidates(net, cfg0, 3, _points(), scores, labels, BOXES, 255.0)
    assert torch.allclose(s, scores[:2]) and torch.equal(l, labels[:2]) and torch.equal(b, BOXES[:2])  # rois=2
    cfg1 = RefineConfig(rois=8, points=16, point_channels=(8,), hidden=(8,), score_alpha=(1.0, 0.5, 1.0))
    s, _, _ = refine_candidates(net, cfg1, 3, _points(), scores, labels, BOXES, 255.0)
    feats, valid = roi_point_features(_points(), BOXES, 16, 0.5, 255.0)
    p = torch.sigmoid(net(feats, valid, roi_context(scores, labels, BOXES, 3))[0])
    assert valid[:2].any(dim=1).all() and not valid[2].any()  # the third box has no points in reach:
    # its score may only go down (min of stage 1 and stage 2), and its box stays stage 1's
    assert torch.allclose(s, torch.stack([p[0], scores[1].sqrt() * p[1].sqrt(), torch.minimum(p[2], scores[2])]),
                          atol=1e-6)
    with torch.no_grad():
        net.residual.bias.fill_(0.1)  # every box moves ... except the one without points
    _, _, b = refine_candidates(net, cfg1, 3, _points(), scores, labels, BOXES, 255.0)
    assert not torch.allclose(b[:2], BOXES[:2]) and torch.equal(b[2], BOXES[2])
    # passes=2: the refiner again on its own boxes, with the stage-1 scores and labels
    s1, l1, b1 = refine_candidates(net, cfg1, 3, _points(), scores, labels, BOXES, 255.0)
    s_again, _, b_again = refine_candidates(net, cfg1, 3, _points(), scores, l1, b1, 255.0)
    s2, l2, b2 = refine_candidates(net, cfg1, 3, _points(), scores, labels, BOXES, 255.0, passes=2)
    assert torch.equal(s2, s_again) and torch.equal(b2, b_again) and torch.equal(l2, labels)
    assert not torch.allclose(b2[:2], b1[:2])  # the second pass moved the boxes once more
    twice = RefineConfig(rois=8, points=16, point_channels=(8,), hidden=(8,), score_alpha=(1.0, 0.5, 1.0), passes=2)
    assert torch.equal(refine_candidates(net, twice, 3, _points(), scores, labels, BOXES, 255.0)[2], b2)


@pytest.mark.slow  # two small torch.compile graphs: ~20-60 s cold
def test_compiled_stage_2_matches_the_eager_one():
    """The compiled pipeline's stage 2 (torch.compile'd point features with a dynamic point count, and the
    refiner on its fixed shape) gives the eager scores and boxes, on clouds of several sizes without recompiling
    for each, and on a cloud with fewer near points than samples (that one runs eagerly)."""
    cfg = RefineConfig(rois=3, points=16, point_channels=(8, 16), hidden=(8,), score_alpha=(0.5, 0.5, 0.5), passes=2)
    torch.manual_seed(0)
    net = RoiRefiner(cfg, 3).eval()
    with torch.no_grad():
        net.residual.bias.fill_(0.05)
        for m in net.modules():
            if isinstance(m, torch.nn.BatchNorm1d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
    compiled = CompiledRefiner(net, cfg)
    scores, labels = torch.tensor([0.9, 0.6, 0.3]), torch.tensor([0, 1, 0])
    for n, seed in ((40, 2), (5000, 1), (3000, 0)):
        pts = _points(n, seed)
        with torch.no_grad():
            eager = refine_candidates(net, cfg, 3, pts, scores, labels, BOXES, 255.0)
            fast = refine_candidates(net, cfg, 3, pts, scores, labels, BOXES, 255.0, compiled=compiled)
        torch.testing.assert_close(fast[0], eager[0], rtol=0, atol=1e-5)
        torch.testing.assert_close(fast[2], eager[2], rtol=0, atol=1e-4)
        assert torch.equal(fast[1], eager[1])
    # fewer candidates than rois: filled up to the compiled refiner's shape, the fill dropped again
    with torch.no_grad():
        eager = refine_candidates(net, cfg, 3, pts, scores[:2], labels[:2], BOXES[:2], 255.0)
        fast = refine_candidates(net, cfg, 3, pts, scores[:2], labels[:2], BOXES[:2], 255.0, compiled=compiled)
    assert len(fast[0]) == 2 and torch.equal(fast[1], eager[1])
    torch.testing.assert_close(fast[0], eager[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(fast[2], eager[2], rtol=0, atol=1e-4)


def test_classes_stage_2_does_not_refine_keep_stage_1_and_take_no_roi():
    """refine.classes: a class stage 2 was never trained on (trucks and buses for the shipped refiner) keeps its
    stage-1 score and box, and its candidates do not use up the RoIs of the refined classes."""
    net = RoiRefiner(RefineConfig(rois=2, points=16, point_channels=(8,), hidden=(8,)), 3).eval()
    with torch.no_grad():
        net.residual.bias.fill_(0.1)  # refined boxes move
    scores, labels = torch.tensor([0.9, 0.6, 0.3]), torch.tensor([2, 0, 1])
    cfg = RefineConfig(rois=2, points=16, point_channels=(8,), hidden=(8,), score_alpha=(1.0, 1.0, 1.0),
                       refined=(True, True, False))
    s, l, b = refine_candidates(net, cfg, 3, _points(), scores, labels, BOXES, 255.0)
    assert l.tolist() == [0, 1, 2]  # the two refined candidates (both RoIs), then class 2's unchanged
    assert s[2] == scores[0] and torch.equal(b[2], BOXES[0])
    every = RefineConfig(rois=2, points=16, point_channels=(8,), hidden=(8,), score_alpha=(1.0, 1.0, 1.0))
    s_all, l_all, b_all = refine_candidates(net, every, 3, _points(), scores[1:], labels[1:], BOXES[1:], 255.0)
    assert torch.allclose(s[:2], s_all) and torch.equal(b[:2], b_all)  # the refined ones as without class 2
    only = refine_candidates(net, cfg, 3, _points(), scores[:1], labels[:1], BOXES[:1], 255.0)  # none to refine
    assert only[0].tolist() == [scores[0].item()] and torch.equal(only[2], BOXES[:1])
    cfg5 = ModelConfig.from_dict(_cfg_dict({"classes": ["car", "pedestrian", "cyclist"]}), source="t")
    assert cfg5.refine.refined == (True, True, True, False, False)
    assert ModelConfig.from_dict(cfg5.to_dict(), source="t") == cfg5
    assert cfg5.architecture_hash() == ModelConfig.from_dict(_cfg_dict({}), source="t").architecture_hash()
    for bad in (["lorry"], [], "car"):
        with pytest.raises(ConfigError, match="refine.classes"):
            ModelConfig.from_dict(_cfg_dict({"classes": bad}), source="t")


def test_refine_config_section():
    plain = ModelConfig.from_dict(_cfg_dict(), source="t")
    assert plain.refine is None and "refine" not in plain.architecture()
    cfg = ModelConfig.from_dict(_cfg_dict({"rois": 24, "score_alpha": {"car": 0.5, "pedestrian": 1.0, "cyclist": 0.75,
                                                                  "truck": 0.25, "bus": 0.0}}),
                                source="t")
    assert cfg.refine.rois == 24 and cfg.refine.score_alpha == (0.5, 1.0, 0.75, 0.25, 0.0) and cfg.refine.points == 64
    assert cfg.refine.passes == 1 and ModelConfig.from_dict(_cfg_dict({"passes": 2}), source="t").refine.passes == 2
    assert cfg.architecture()["refine"] == {"points": 64, "margin": 0.5, "point_channels": [32, 64, 128], "hidden": [128, 64]}
    # run-time knobs do not change the architecture; the sampling does
    other_rois = ModelConfig.from_dict(_cfg_dict({"rois": 48, "score_alpha": 0.2, "passes": 3}), source="t")
    assert other_rois.architecture_hash() == cfg.architecture_hash() != plain.architecture_hash()
    assert ModelConfig.from_dict(_cfg_dict({"points": 32}), source="t").architecture_hash() != cfg.architecture_hash()
    assert ModelConfig.from_dict(cfg.to_dict(), source="t") == cfg
    for bad, msg in (({"bogus": 1}, "refine"), ({"margin": -1}, "margin"), ({"rois": 0}, "rois"),
                     ({"score_alpha": 2}, "score_alpha"), ({"passes": 0}, "passes"), ({"passes": 5}, "passes"),
                     ("yes", "refine")):
        with pytest.raises(ConfigError, match=msg):
            ModelConfig.from_dict(_cfg_dict(bad), source="t")


def test_refine_large_config_section():
    """refine_large: a second refiner with weights of its own, for classes listed there and left alone by refine."""
    cfg = ModelConfig.from_dict(_cfg_dict(THREE, TWO), source="t")
    assert cfg.refine_large.refined == (False, False, False, True, True)
    assert cfg.architecture()["refine_large"] == cfg.architecture()["refine"]
    assert cfg.architecture_hash() != ModelConfig.from_dict(_cfg_dict(THREE), source="t").architecture_hash()
    assert ModelConfig.from_dict(cfg.to_dict(), source="t") == cfg
    for refine, large in ((THREE, SMALL), ({**THREE, "classes": ["car", "truck"]}, TWO), (SMALL, TWO), (None, TWO)):
        with pytest.raises(ConfigError, match="refine_large"):  # no classes, overlapping classes, no refine
            ModelConfig.from_dict(_cfg_dict(refine, large), source="t")


def test_refine_large_refines_its_classes_only():
    """Stage 2 with both refiners: cars, pedestrians and cyclists come out as with the first refiner alone; trucks and
    buses are re-scored and refined by the second."""
    torch.manual_seed(0)
    one = build_model(ModelConfig.from_dict(_cfg_dict(THREE), source="t")).eval()
    two = build_model(ModelConfig.from_dict(_cfg_dict(THREE, TWO), source="t")).eval()
    two.load_state_dict({**two.state_dict(), **one.state_dict()})
    with torch.no_grad():
        two.refiner_large.residual.bias.fill_(0.1)
    boxes = torch.cat([BOXES[:2], BOXES[:2]])
    scores, labels = torch.tensor([0.9, 0.8, 0.7, 0.6]), torch.tensor([0, 3, 1, 4])
    s1, l1, b1 = one.refine(_points(), scores, labels, boxes, 255.0)
    s2, l2, b2 = two.refine(_points(), scores, labels, boxes, 255.0)
    first = {int(l): (float(s), b) for s, l, b in zip(s1, l1, b1)}
    second = {int(l): (float(s), b) for s, l, b in zip(s2, l2, b2)}
    assert sorted(second) == [0, 1, 3, 4]
    for c in (0, 1):
        assert second[c][0] == pytest.approx(first[c][0]) and torch.equal(second[c][1], first[c][1])
    for c in (3, 4):  # stage 1's without the second refiner (refine.classes), its own with it
        assert torch.equal(first[c][1], boxes[labels.tolist().index(c)])
        assert not torch.equal(second[c][1], first[c][1]) and second[c][0] != pytest.approx(first[c][0])


def test_warm_start_begins_a_second_refiner_as_a_copy_of_the_first(tmp_path):
    """Weights without refine_large initialise a model with it: its refiner starts as a copy of the file's."""
    one_cfg = ModelConfig.from_dict(_cfg_dict(THREE), source="t")
    torch.manual_seed(1)
    one = build_model(one_cfg)
    save_weights(one, one_cfg, tmp_path / "one.safetensors")
    two = build_model(ModelConfig.from_dict(_cfg_dict(THREE, TWO), source="t"))
    grown = warm_start(two, two.cfg, tmp_path / "one.safetensors")
    assert grown and all(k.startswith("refiner_large.") for k in grown)
    for k, v in one.refiner.state_dict().items():
        assert torch.equal(two.refiner_large.state_dict()[k], v) and torch.equal(two.refiner.state_dict()[k], v)


def _reference_first_hits(points, n_bins):
    """Point by point in plain Python: nearest obstacle-height return and any return per azimuth bin."""
    first, seen = [math.inf] * n_bins, [False] * n_bins
    for x, y, z, _ in points.tolist():
        b = min(n_bins - 1, max(0, int(math.floor((math.atan2(y, x) + math.pi) * n_bins / (2 * math.pi)))))
        seen[b] = True
        if VIS_OBSTACLE_Z[0] < z < VIS_OBSTACLE_Z[1]:
            first[b] = min(first[b], math.hypot(x, y))
    return torch.tensor(first), torch.tensor(seen)


def test_first_hit_map_matches_a_per_point_loop():
    pts = _points(2000, seed=4)
    pts[:500, 2] = 0.05  # ground returns: seen, but no obstacle
    first, seen = first_hit_map(pts, 360)
    ref_first, ref_seen = _reference_first_hits(pts, 360)
    assert torch.equal(seen, ref_seen) and seen.sum() < 360  # the cloud covers only part of the circle
    assert torch.equal(torch.isinf(first), torch.isinf(ref_first))
    assert torch.allclose(first[torch.isfinite(first)], ref_first[torch.isfinite(ref_first)].float())
    empty_first, empty_seen = first_hit_map(pts[:0], 360)
    assert torch.isinf(empty_first).all() and not empty_seen.any()


def test_roi_visibility_free_occluded_and_unseen():
    # a wall 10 m ahead (y -3..3, 0.5..1.5 m high), ground returns out to 30 m in the same directions
    wy = torch.linspace(-3, 3, 400)
    wall = torch.stack([torch.full_like(wy, 10.0), wy, torch.full_like(wy, 1.0), torch.zeros_like(wy)], dim=1)
    gx = torch.linspace(2, 30, 400)
    ground = torch.stack([gx, (gx - 16) * 0.2, torch.zeros_like(gx), torch.zeros_like(gx)], dim=1)
    first, seen = first_hit_map(torch.cat([wall, ground]))
    boxes = torch.tensor([[6.0, 0.0, 0.8, 1.0, 0.5, 1.5, 0.0],    # in front of the wall: the rays pass it
                          [14.0, 0.0, 0.8, 1.0, 0.5, 1.5, 0.0],   # behind the wall: hidden
                          [10.0, 20.0, 0.8, 1.0, 0.5, 1.5, 0.0]])  # 63 deg to the left: no return at all
    vis = roi_visibility(first, seen, boxes, (3, 2), extend=(0.2, 0.2))
    d, s = vis[:, :6], vis[:, 6:]
    assert vis.shape == (3, 12) and d.abs().max() <= 1
    assert (s[:2] == 1).all() and (d[0] > 0.9).all() and (d[1] < -0.9).all()  # 4 m from the wall: clipped
    assert (s[2] == 0).all() and (d[2] == 0).all()
    # samples are laid out along the box axis first: turning the box by 90 deg turns the grid with it
    long_box = torch.tensor([[10.0, 0.0, 0.8, 3.0, 0.4, 1.5, 0.0]])  # straddles the wall along x
    along = roi_visibility(first, seen, long_box, (3, 1), extend=(0.0, 0.0))[0, :3]
    assert along[0] > 0 and along[1].abs() < 0.05 and along[2] < 0
    assert roi_visibility(first, seen, boxes[:0], (3, 2)).shape == (0, 12)


def test_warm_start_adds_visibility_inputs_as_zeros(tmp_path):
    """A refiner trained without visibility initialises one with it: same outputs until trained."""
    base = {"points": 16, "point_channels": [8, 16], "hidden": [16]}
    old = ModelConfig.from_dict(_cfg_dict(base), source="t")
    new = ModelConfig.from_dict(_cfg_dict({**base, "visibility": [4, 2]}), source="t")
    assert new.refine.visibility == (4, 2) and new.architecture()["refine"]["visibility"] == [4, 2]
    assert "visibility" not in old.architecture()["refine"] and new.architecture_hash() != old.architecture_hash()
    assert ModelConfig.from_dict(new.to_dict(), source="t") == new
    for bad in ([4], [4, 0], [4, 2, 1], [64, 2], "yes"):
        with pytest.raises(ConfigError, match="visibility"):
            ModelConfig.from_dict(_cfg_dict({**base, "visibility": bad}), source="t")
    torch.manual_seed(0)
    net_old = build_model(old).eval()
    with torch.no_grad():  # a non-trivial residual head, so that the comparison means something
        net_old.refiner.residual.weight.normal_(0, 0.1)
    save_weights(net_old, old, tmp_path / "old.safetensors")
    net_new = build_model(new).eval()
    assert warm_start(net_new, new, tmp_path / "old.safetensors") == ["refiner.head.0.weight"]
    pts = _points()
    scores, labels = torch.tensor([0.9, 0.6, 0.4]), torch.tensor([0, 1, 0])
    a = refine_candidates(net_old.refiner, old.refine, old.num_classes, pts, scores, labels, BOXES, 255.0, passes=2)
    b = refine_candidates(net_new.refiner, new.refine, new.num_classes, pts, scores, labels, BOXES, 255.0, passes=2)
    assert torch.equal(a[1], b[1]) and torch.allclose(a[0], b[0], atol=1e-6) and torch.allclose(a[2], b[2], atol=1e-5)
    assert not torch.equal(a[2], BOXES)  # the boxes did move
    with pytest.raises(WeightsError):  # and not the other way round
        save_weights(net_new, new, tmp_path / "new.safetensors")
        warm_start(build_model(old), old, tmp_path / "new.safetensors")


def test_warm_start_adds_a_fresh_refiner_and_keeps_the_detector(tmp_path):
    plain = ModelConfig.from_dict(_cfg_dict(), source="t")
    cfg = ModelConfig.from_dict(_cfg_dict({"points": 16}), source="t")
    torch.manual_seed(0)
    det = build_model(plain).eval()
    save_weights(det, plain, tmp_path / "det.safetensors")
    with pytest.raises(WeightsError, match="refine"):
        load_weights(build_model(cfg), cfg, tmp_path / "det.safetensors")  # a file without stage 2
    torch.manual_seed(1)
    net = build_model(cfg).eval()
    fresh = {k: v.clone() for k, v in net.refiner.state_dict().items()}
    grown = warm_start(net, cfg, tmp_path / "det.safetensors")
    assert grown and all(k.startswith("refiner.") for k in grown)
    assert all(torch.equal(v, net.refiner.state_dict()[k]) for k, v in fresh.items())
    x = torch.rand(1, *cfg.grid.shape)
    with torch.no_grad():
        a, b = det(x), net(x)
    assert all(torch.equal(a[k], b[k]) for k in a)
    # and back: a file with a refiner does not initialise a network without one
    save_weights(net, cfg, tmp_path / "both.safetensors")
    load_weights(build_model(cfg), cfg, tmp_path / "both.safetensors")
    with pytest.raises(WeightsError):
        warm_start(build_model(plain), plain, tmp_path / "both.safetensors")


# --------------------------------------------------------------------------- livox-infer train --stage refine


def _args(root, cfg_path, *extra):
    p = argparse.ArgumentParser()
    train_mod.add_arguments(p)
    return p.parse_args(["--config", str(cfg_path), "--work-dir", str(root / "work"), "--train-frames", "50",
                         "--val-frames", "10", "--batch", "2", "--threads", "1", "--workers", "0", "--seed", "3",
                         *extra])


@pytest.fixture(scope="module")
def trained_detector(tmp_path_factory):
    """A tiny detector trained for 4 steps on one simulated shard, and its config with a refine section."""
    root = tmp_path_factory.mktemp("refine")
    plain, with_refine = root / "plain.yaml", root / "refine.yaml"
    plain.write_text(yaml.safe_dump(_cfg_dict()))
    with_refine.write_text(yaml.safe_dump(_cfg_dict({"rois": 8, "points": 16, "point_channels": [8, 16], "hidden": [16]})))
    args = _args(root, plain, "--out", str(root / "det.safetensors"), "--steps", "4", "--val-every", "4")
    assert train_mod.main(args) == 0
    return root, plain, with_refine


def _tensors(path):
    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()


@pytest.mark.slow  # trains a tiny detector (module fixture) then the refiner: ~20 s
def test_train_refine_stage_trains_only_the_refiner(trained_detector):
    root, _, cfg_path = trained_detector
    out = root / "both.safetensors"
    args = _args(root, cfg_path, "--stage", "refine", "--init", str(root / "det.safetensors"), "--out", str(out),
                 "--steps", "6", "--val-every", "3", "--lr", "1e-2", "--refine-train-passes", "2")
    assert train_mod.main(args) == 0
    det, _ = _tensors(root / "det.safetensors")
    both, meta = _tensors(out)
    assert meta["trained"] == "yes" and '"stage": "refine"' in meta["train_args"]
    assert set(both) - set(det) and all(k.startswith("refiner.") for k in set(both) - set(det))
    # the detector, BatchNorm statistics included, is exactly the one it started from
    assert all(torch.equal(det[k], both[k]) for k in det)
    fresh = build_model(ModelConfig.load(cfg_path)).refiner.state_dict()
    assert any(not torch.equal(fresh[k[len("refiner."):]], both[k]) for k in both if k.startswith("refiner.")
               and k.endswith("weight"))
    # the pipeline runs both stages from that file, or the detector alone
    from livox_infer.pipeline import DetectionPipeline
    from livox_infer.sim.simulate import simulate_frame

    pts = simulate_frame("avia", 11).points
    pipe = DetectionPipeline(cfg_path, weights=out, compile=False, score_thresholds=0.0)
    with_stage2 = pipe.detect(pts)
    assert len(with_stage2) <= 8 and with_stage2.timings_ms["refine"] > 0  # rois: 8
    pipe.update(refine=False)
    alone = pipe.detect(pts)
    assert alone.timings_ms["refine"] < 0.1 and len(alone) > len(with_stage2)  # nothing ran: no cap of 8 either


@pytest.mark.slow  # shares the trained-detector fixture above; two tiny refiner runs
def test_train_refine_large_stage_trains_only_the_second_refiner(trained_detector):
    root, _, _ = trained_detector
    cfg_path = root / "large.yaml"
    cfg_path.write_text(yaml.safe_dump(_cfg_dict({**THREE, "rois": 8}, {**TWO, "rois": 8})))
    first, second = root / "first.safetensors", root / "second.safetensors"
    common = ("--steps", "4", "--val-every", "4", "--lr", "1e-2")
    assert train_mod.main(_args(root / "a", cfg_path, "--stage", "refine", "--init", str(root / "det.safetensors"),
                                "--out", str(first), *common)) == 0
    assert train_mod.main(_args(root / "b", cfg_path, "--stage", "refine-large", "--init", str(first),
                                "--out", str(second), *common)) == 0
    a, _ = _tensors(first)
    b, meta = _tensors(second)
    assert '"stage": "refine-large"' in meta["train_args"] and set(a) == set(b)
    assert all(torch.equal(a[k], b[k]) for k in a if not k.startswith("refiner_large."))  # detector, first refiner
    assert any(not torch.equal(a[k], b[k]) for k in a if k.startswith("refiner_large.") and k.endswith("weight"))
    # its classes are refine_large's: a --refine-classes it would not use is refused, not ignored
    assert train_mod.main(_args(root / "c", cfg_path, "--stage", "refine-large", "--init", str(first),
                                "--refine-classes", "car", *common)) == 2


@pytest.mark.parametrize("which, message", [("plain", "refine section"), ("refine", "--init")])
@pytest.mark.slow  # shares the trained-detector fixture above
def test_train_refine_stage_errors(trained_detector, which, message, capsys):
    root, plain, with_refine = trained_detector
    args = _args(root / which, plain if which == "plain" else with_refine, "--stage", "refine", "--steps", "2",
                 *(["--init", str(root / "det.safetensors")] if which == "plain" else []))
    assert train_mod.main(args) == 2
    assert message in capsys.readouterr().err


def test_refine_batch_loss_restricted_to_some_classes(monkeypatch):
    """--refine-classes: only those classes' candidates reach the loss, the first refine.rois of them per frame
    (as inference picks refine.classes); none of them in a batch gives a zero loss that still back-propagates."""
    cfg = ModelConfig.from_dict(_cfg_dict({"rois": 4, "points": 16, "point_channels": [8, 16], "hidden": [16]}))
    torch.manual_seed(0)
    net = build_model(cfg).eval()
    net.refiner.train()
    bev = torch.rand(2, *cfg.grid.shape)
    scene = [(_points(seed=k), BOXES[:2], torch.tensor([0, 3])) for k in range(2)]
    seen = []
    real_loss = train_mod.refine_loss
    monkeypatch.setattr(train_mod, "refine_loss", lambda *a, **kw: seen.append(a[3]) or real_loss(*a, **kw))
    with torch.no_grad():
        _, labels, _ = train_mod.topk_decode(net(bev), cfg, max(cfg.top_k, cfg.refine.rois))
    loss, _ = train_mod.refine_batch_loss(net, bev, scene, cfg, passes=1)
    assert seen[-1].tolist() == labels[:, :4].reshape(-1).tolist()  # default: every class, the first rois
    truck, bus = cfg.classes.index("truck"), cfg.classes.index("bus")
    want = [[x for x in frame if x in (truck, bus)][:4] for frame in labels.tolist()]
    assert all(want)  # (random weights: candidates of every class among the top k)
    loss, _ = train_mod.refine_batch_loss(net, bev, scene, cfg, passes=2, classes=("truck", "bus"))
    assert seen[-1].tolist() == [x for w in want for x in w + w] and torch.isfinite(loss)  # each frame, two passes
    stub = torch.zeros(2, 64, dtype=torch.long)
    stub[1, 1::2] = bus  # frame 0: cars only; frame 1: every other candidate a bus
    monkeypatch.setattr(train_mod, "topk_decode", lambda heads, c, k: (torch.rand(2, k), stub[:, :k],
                                                                        BOXES[:1].expand(2, k, 7).clone()))
    loss, _ = train_mod.refine_batch_loss(net, bev, scene, cfg, passes=2, classes=("bus",))  # frame 0 adds nothing
    assert seen[-1].tolist() == [bus] * 8 and torch.isfinite(loss)
    seen.clear()
    loss, parts = train_mod.refine_batch_loss(net, bev, scene, cfg, passes=2, classes=("pedestrian",))
    assert not seen and float(loss.detach()) == 0.0 and parts == {"refine_iou": 0.0, "refine_box": 0.0}
    loss.backward()  # a batch without such candidates must not break the training step


def test_hostile_intensity_and_residuals_stay_bounded():
    """One point with a huge intensity must not carry a refined box (and the maps sized from boxes) away."""
    import math

    from livox_infer.detector.refine import MOVE_LIMIT, apply_residuals, roi_point_features

    box = torch.tensor([[10.0, 0.0, 0.8, 4.0, 1.8, 1.5, 0.0]])
    pts = torch.tensor([[10.0, 0.2, 0.8, 1e30], [10.5, -0.3, 0.5, 3e8], [9.5, 0.1, 1.0, -5.0]])
    feats, valid = roi_point_features(pts, box, 8, 0.5, 255.0)
    assert valid.sum() == 3
    assert feats[..., 6][valid].min() >= 0.0 and feats[..., 6][valid].max() <= 1.0  # clamped like the voxelizer
    wild = torch.tensor([[1e30, -1e30, float("nan"), 50.0, -50.0, float("inf"), 1e9]])
    out = apply_residuals(box, wild)
    assert torch.isfinite(out).all()
    assert (out[0, :2] - box[0, :2]).abs().max() <= MOVE_LIMIT * 4.0 + 1e-4
    assert abs(float(out[0, 6])) <= math.pi / 2 + 1e-6


def test_prefilter_map_is_capped_for_boxes_far_apart():
    from livox_infer.detector.refine import _near_any_box

    boxes = torch.tensor([[0.0, 0.0, 0.0, 4.0, 2.0, 1.5, 0.0], [3e6, 3e6, 0.0, 4.0, 2.0, 1.5, 0.0]])
    pts = torch.tensor([[0.5, 0.0, 0.0, 1.0], [50.0, 50.0, 0.0, 1.0]])
    idx = _near_any_box(pts, boxes, 0.5)  # would otherwise allocate a 3e6 x 3e6 map
    assert set(idx.tolist()) >= {0}


def test_gathering_is_capped_for_a_pile_of_points_on_one_box(monkeypatch):
    """Every point in one box: stage 2 gathers at most MAX_NEAR_POINTS of them (its cost is rois x gathered
    points), the ones with the largest sampling key, so the features are what an uncapped run picks."""
    from livox_infer.detector import refine as refine_mod

    monkeypatch.setattr(refine_mod, "MAX_NEAR_POINTS", 256)
    r = np.random.default_rng(1)
    n = 5000
    pile = torch.from_numpy(np.c_[r.uniform(9.5, 10.5, n), r.uniform(-0.4, 0.4, n), r.uniform(0.3, 1.2, n),
                                  np.full(n, 50.0)].astype(np.float32))
    box = torch.tensor([[10.0, 0.0, 0.8, 4.0, 1.8, 1.5, 0.0]])
    seen = []
    real_box_frame = refine_mod._box_frame
    monkeypatch.setattr(refine_mod, "_box_frame", lambda p, b: seen.append(p.shape[0]) or real_box_frame(p, b))
    feats, valid = roi_point_features(pile, box, 16, 0.5, 255.0)
    assert seen == [256]
    ref_f, ref_v = _reference_features(pile, box, 16, 0.5, 255.0)  # uncapped: the same 16 points
    assert torch.equal(valid, ref_v) and torch.allclose(feats, ref_f, atol=1e-4)


def test_warm_start_grows_classes_keeping_the_old_ones(tmp_path):
    """Weights of a three-class network initialise the five-class one (truck, bus appended): the old classes'
    heatmaps, boxes and refined scores come out the same; the new classes' rows start fresh and their refiner
    class inputs at 0. Classes that are not appended (renamed, reordered) are refused."""
    three = ModelConfig.from_dict({**_cfg_dict({"points": 16, "point_channels": [8, 16], "hidden": [16]}),
                                   "classes": ["car", "pedestrian", "cyclist"]}, source="t")
    five = ModelConfig.from_dict(_cfg_dict({"points": 16, "point_channels": [8, 16], "hidden": [16]}), source="t")
    assert three.num_classes == 3 and five.classes == ("car", "pedestrian", "cyclist", "truck", "bus")
    assert three.score_thresholds == five.score_thresholds[:3]  # lite.yaml's truck / bus entries are ignored
    torch.manual_seed(0)
    old = build_model(three).eval()
    with torch.no_grad():
        old.refiner.residual.weight.normal_(0, 0.1)
    save_weights(old, three, tmp_path / "three.safetensors")
    new = build_model(five).eval()
    grown = warm_start(new, five, tmp_path / "three.safetensors")
    assert sorted(grown) == ["head.heatmap.bias", "head.heatmap.weight", "refiner.head.0.weight"]
    x = torch.rand(1, len(three.grid.channel_names), three.grid.height, three.grid.width)
    with torch.no_grad():
        a, b = old(x), new(x)
    # a 3- and a 5-channel convolution may sum in another order (oneDNN picks kernels by shape; on an AMD EPYC
    # they differ in the last bit), so "the same" is to float precision
    assert torch.allclose(a["heatmap"], b["heatmap"][:, :3], rtol=1e-5, atol=1e-6) and b["heatmap"].shape[1] == 5
    assert all(torch.equal(a[k], b[k]) for k in a if k != "heatmap")
    w = new.refiner.head[0].weight
    start = five.refine.point_channels[-1] + 3
    assert torch.count_nonzero(w[:, start:start + 2]) == 0  # truck / bus one-hot inputs
    scores, labels = torch.tensor([0.9, 0.6, 0.4]), torch.tensor([0, 1, 2])
    ra = refine_candidates(old.refiner, three.refine, 3, _points(), scores, labels, BOXES, 255.0, passes=2)
    rb = refine_candidates(new.refiner, five.refine, 5, _points(), scores, labels, BOXES, 255.0, passes=2)
    assert torch.allclose(ra[0], rb[0], atol=1e-6) and torch.allclose(ra[2], rb[2], atol=1e-5)
    other = ModelConfig.from_dict({**_cfg_dict({"points": 16, "point_channels": [8, 16], "hidden": [16]}),
                                   "classes": ["car", "cyclist", "pedestrian", "truck", "bus"]}, source="t")
    with pytest.raises(WeightsError, match="classes"):
        warm_start(build_model(other), other, tmp_path / "three.safetensors")
