"""Real-scan evaluation (`livox-infer eval --real DIR`): views, ignore rules, AP; shipped weights on real_dev."""

import json
import math

import numpy as np
import pytest
import torch

from conftest import REPO, SHARED_DATA
from livox_infer.errors import ConfigError
from livox_infer.evaluation.real import (
    bootstrap_intervals, evaluate_views, in_cone, labelled_fov, load_real_dir, scene_of, turn,
)
from livox_infer.evaluation.metrics import FrameBoxes

REAL_DEV = SHARED_DATA / "real_dev"


def _box(label, x, y, yaw=0.0, l=4.0, w=1.8, h=1.5):
    return {"label": label, "x": x, "y": y, "z": -1.0, "l": l, "w": w, "h": h, "yaw": yaw}


def _cloud_around(boxes, n=40, seed=0):
    """Points filling each box (so every box has >= 5 points) plus a ring of far ground points."""
    rng = np.random.default_rng(seed)
    pts = []
    for b in boxes:
        c, s = math.cos(b["yaw"]), math.sin(b["yaw"])
        u = rng.uniform(-0.4, 0.4, (n, 3)) * [b["l"], b["w"], b["h"]]
        pts.append(np.c_[b["x"] + c * u[:, 0] - s * u[:, 1], b["y"] + s * u[:, 0] + c * u[:, 1], b["z"] + u[:, 2]])
    a = np.linspace(-math.pi, math.pi, 200)
    pts.append(np.c_[30 * np.cos(a), 30 * np.sin(a), np.full_like(a, -1.7)])
    p = np.concatenate(pts).astype(np.float32)
    return np.c_[p, np.full(len(p), 50.0, np.float32)]


@pytest.fixture
def real_dir(tmp_path):
    labels = {
        # 360-degree scan: one car ahead, one behind, one to the left; a van ahead-right
        "av2_a": [_box("car", 20, 0), _box("car", -20, 0, 0.3), _box("car", 0, 15, 1.2), _box("van", 25, -8)],
        # front-only labels (90 deg): a car ahead and an unlabelled-region car behind (not scored)
        "kitti_b": [_box("car", 15, 2, 0.1), _box("pedestrian", 12, -3, 0, 0.6, 0.6, 1.7), _box("car", 3, 0.5)],
    }
    labels["kitti_b"][2]["x"] = 2.0  # 2 m ahead: inside the cone, fills the test for points counting
    for name, boxes in labels.items():
        np.save(tmp_path / f"{name}.npy", _cloud_around(boxes))
    (tmp_path / "labels.json").write_text(json.dumps(labels))
    (tmp_path / "meta.json").write_text(json.dumps({
        "av2_a": {"labelled_region": "360 deg (all around)"},
        "kitti_b": {"labelled_region": "front camera field of view only (about 90 deg)"},
    }))
    return tmp_path, labels


def test_turn_moves_a_heading_onto_x():
    p = np.array([[0.0, 10.0, 1.0, 7.0]], np.float32)  # 10 m to the left
    q = turn(p, 90.0)
    np.testing.assert_allclose(q, [[10.0, 0.0, 1.0, 7.0]], atol=1e-5)
    b = turn(np.array([[0.0, 10.0, 0, 4, 2, 1.5, math.pi / 2]], np.float32), 90.0, boxes=True)
    np.testing.assert_allclose(b[0, [0, 1, 6]], [10.0, 0.0, 0.0], atol=1e-5)


def test_cone_and_labelled_region():
    xy = np.array([[10, 0], [10, 8], [10, 9], [90, 0], [-5, 0]], np.float32)  # 38.7 deg, 42 deg
    assert in_cone(xy, 80.0, 80.0).tolist() == [True, True, False, False, False]
    assert labelled_fov({"labelled_region": "front camera (image_2) field of view only (about 90 deg)"}) == 90.0
    assert labelled_fov({"labelled_region": "360 deg (AV2 annotates ...)"}) == 360.0
    assert labelled_fov(None) == 360.0


def test_views_follow_the_labelled_region(real_dir):
    root, _ = real_dir
    views = load_real_dir(root, fov=80, max_range=80, headings=(0, 90, 180, 270))
    got = [(v.frame, v.heading_deg) for v in views]
    # the 360-degree scan gives 4 views, the front-only one just heading 0 (±40° lies inside ±45°)
    assert got == [("av2_a", 0.0), ("av2_a", 90.0), ("av2_a", 180.0), ("av2_a", 270.0), ("kitti_b", 0.0)]
    behind = views[2]  # heading 180: the car behind is now ahead, at +20 m
    rel = behind.gt.boxes[~behind.gt_ignore]
    np.testing.assert_allclose(rel[:, :2], [[20.0, 0.0]], atol=1e-4)
    assert (behind.points[:, 0] >= 0).all()
    ahead = views[0]
    # the van is an ignored car; the car behind and the one at 90 deg are outside the cone
    assert ahead.gt_ignore.tolist() == [False, True, True, True]
    with pytest.raises(ConfigError, match="no view"):
        load_real_dir(root, fov=80, headings=(180,), frames=["kitti_b"])


def test_perfect_detections_score_one_and_a_box_on_a_van_is_not_false(real_dir):
    root, labels = real_dir
    views = load_real_dir(root, fov=80, max_range=80, headings=(0, 90, 180, 270))
    dets = []
    for v in views:
        keep = ~v.gt_ignore | (v.gt.num_points >= 5) & in_cone(v.gt.boxes, 80, 80)  # the van too
        dets.append(FrameBoxes(v.gt.boxes[keep], v.gt.labels[keep], np.full(int(keep.sum()), 0.9)))
    res = evaluate_views(views, dets)
    assert set(res) == {"av2", "kitti", "all"}
    assert res["all"].ap["car"]["bev@0.7"] == pytest.approx(1.0)
    assert res["all"].ap["pedestrian"]["bev@0.5"] == pytest.approx(1.0)
    assert res["all"].num_gt["car"] == 5  # av2: 3 views with a car ahead; kitti: 2
    # a pedestrian box where the van is: a false positive (wrong class), AP drops
    v0 = views[0]
    van = v0.gt.boxes[3:4]
    dets[0] = FrameBoxes(np.r_[dets[0].boxes, van], np.r_[dets[0].labels, [1]], np.r_[dets[0].scores, [0.95]])
    r = evaluate_views(views, dets)["all"]
    assert r.ap["pedestrian"]["bev@0.5"] < 1.0


def test_bootstrap_resamples_whole_scenes(real_dir):
    root, _ = real_dir
    views = load_real_dir(root, fov=80, max_range=80, headings=(0, 90, 180, 270))
    assert scene_of("av2_7fab2350_315966265259836000") == scene_of("av2_7fab2350_315966265360032000") == "av2_7fab2350"
    assert scene_of("kitti_000016") == "kitti_000016"
    perfect = [FrameBoxes(v.gt.boxes[~v.gt_ignore], v.gt.labels[~v.gt_ignore], np.full(int((~v.gt_ignore).sum()), 0.9))
               for v in views]
    iv = bootstrap_intervals(views, perfect, n=20)
    assert iv["car"]["bev@0.7"] == [1.0, 1.0]
    # find only the kitti scene's cars: the AP depends on which scenes are drawn, so the interval opens up
    half = [d if v.frame.startswith("kitti") else FrameBoxes(np.zeros((0, 7), np.float32), np.zeros(0, np.int64),
                                                              np.zeros(0, np.float32)) for v, d in zip(views, perfect)]
    lo, hi = bootstrap_intervals(views, half, n=50, seed=1)["car"]["bev@0.7"]
    point = evaluate_views(views, half)["all"].ap["car"]["bev@0.7"]
    assert lo < point < hi and lo < 0.2 and hi == 1.0
    assert bootstrap_intervals(views, half, n=50, seed=1)["car"]["bev@0.7"] == [lo, hi]  # seeded
    with pytest.raises(ConfigError):
        bootstrap_intervals(views, half, n=0)


def test_eval_cli_real_writes_json(real_dir, tmp_path, capsys):
    from livox_infer.tools.cli import main

    root, _ = real_dir
    out = tmp_path / "real.json"
    rc = main(["eval", "--real", str(root), "--no-compile", "--headings", "0,180", "--out", str(out),
               "--bev-dir", str(tmp_path / "bev"), "--bootstrap", "5"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "real scans" in text and "car bev@0.5" in text and "90% interval, 5 scene resamples" in text
    data = json.loads(out.read_text())
    assert [v["heading"] for v in data["views"]] == [0.0, 180.0, 0.0]
    assert set(data["model lite"]) == {"av2", "kitti", "all"}
    assert len(list((tmp_path / "bev").glob("*.png"))) == 3
    assert data["bootstrap"]["resamples"] == 5 and data["bootstrap"]["unit"] == "scene"
    lo, hi = data["bootstrap"]["all"]["car"]["bev@0.5"]
    assert 0.0 <= lo <= hi <= 1.0


def test_eval_cli_real_fit_calibration_judges_the_fit_per_source(real_dir, tmp_path, capsys):
    """--fit-calibration writes the table and, per class, the fit judged on each source's detections by a fit on
    the other sources' (here too few detections to fit on: said so, nothing invented)."""
    from livox_infer.tools.cli import main

    root, _ = real_dir
    out, fit = tmp_path / "real.json", tmp_path / "fit.yaml"
    assert main(["eval", "--real", str(root), "--no-compile", "--headings", "0,180", "--out", str(out),
                 "--fit-calibration", str(fit)]) == 0
    text = capsys.readouterr().out
    assert "the fit judged on held-out detections" in text and "too few detections to fit" in text
    assert fit.read_text().startswith("# fitted by livox-infer eval --real --fit-calibration")
    assert json.loads(out.read_text())["reliability"]["held_out_fit"] == {}


def test_eval_cli_real_confusion_counts_every_scored_object_once(real_dir, tmp_path, capsys):
    """--confusion with --real: one outcome per labelled object the AP counts (not the ignored ones)."""
    from livox_infer.tools.cli import main

    root, _ = real_dir
    out = tmp_path / "real.json"
    assert main(["eval", "--real", str(root), "--no-compile", "--headings", "0,180", "--confusion",
                 "--out", str(out)]) == 0
    assert "labelled objects on the real views" in capsys.readouterr().out
    res = json.loads(out.read_text())
    views = load_real_dir(root, fov=80, max_range=80, headings=(0, 180))
    for k, c in enumerate(("car", "pedestrian")):
        want = sum(int(((v.gt.labels == k) & ~v.gt_ignore).sum()) for v in views)
        assert want > 0 and res["confusion"][c]["objects"] == want
        assert sum(n for key, n in res["confusion"][c].items() if key != "objects") == want


def test_eval_cli_real_by_range_and_beyond_the_grid(real_dir, tmp_path, capsys):
    """--ranges scores each range bin of the real views (it was ignored with --real); the objects beyond the
    detection grid, which no detection can reach, are counted; --region, which --real cannot honour, is refused."""
    from livox_infer.evaluation.real import beyond_grid
    from livox_infer.tools.cli import main

    root, _ = real_dir
    views = load_real_dir(root, fov=80, max_range=80, headings=(0, 90, 180, 270))
    perfect = [FrameBoxes(v.gt.boxes[~v.gt_ignore], v.gt.labels[~v.gt_ignore], np.full(int((~v.gt_ignore).sum()), 0.9))
               for v in views]
    near, far = (evaluate_views(views, perfect, range_bin=b)["all"] for b in ((0.0, 16.0), (16.0, math.inf)))
    assert near.num_gt["car"] == 3 and far.num_gt["car"] == 2  # at 15 m (twice) and 2 m; at 20 m ahead and behind
    assert near.ap["car"]["bev@0.7"] == pytest.approx(1.0) == far.ap["car"]["bev@0.7"]
    # a 16 m grid reaches the cars at 15 m and 2 m, not the two at 20 m (the pedestrian at 12.4 m: yes)
    assert beyond_grid(views, ["car", "pedestrian"], (0.0, 16.0, -8.0, 8.0)).endswith("car 2 of 5, pedestrian 0 of 1")
    out = tmp_path / "real.json"
    assert main(["eval", "--real", str(root), "--no-compile", "--headings", "0,180", "--ranges", "0,16,inf",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "objects at 0-16 m" in text and "objects at 16+ m" in text and "beyond the detection grid" in text
    assert set(json.loads(out.read_text())["by_range"]) == {"0-16 m", "16+ m"}
    assert main(["eval", "--real", str(root), "--no-compile", "--region", "0", "10", "-5", "5"]) == 2
    assert "--region does not apply to --real" in capsys.readouterr().err


# Cross-validated (issue 29): real_dev's KITTI frames are scored by the weights trained without them
# (models/cv/lite.trained-on-av2.safetensors) and its AV2 sweeps by models/cv/lite.trained-on-kitti.safetensors, the
# same recipe as the shipped weights on one fold (docs/evaluation.md, "Real labelled scans"). The shipped weights saw
# every real_dev frame: a number of theirs there is a training fit, never guarded as accuracy. Measured 2026-12-07
# for stage 19 on the model grid (0..80 m; calibrated scores, floor 0.1, fp32): car BEV@0.5 0.721, @0.7 0.515,
# pedestrian @0.25 0.178 (on the 57.6 m grid before: 0.609 / 0.477 / 0.176); minus a margin: a regression on real
# points, or a grid that no longer reaches the far cars, shows up here. Real trucks (6) and buses (1) are too few to
# guard.
REAL_MIN_AP = {("car", "bev@0.5"): 0.66, ("car", "bev@0.7"): 0.46, ("pedestrian", "bev@0.25"): 0.12}
CV_WEIGHTS = {"av2": "lite.trained-on-kitti.safetensors", "kitti": "lite.trained-on-av2.safetensors"}


@pytest.mark.skipif(not (REAL_DEV / "labels.json").is_file(), reason="../shared/data/real_dev absent (CI has it)")
@pytest.mark.slow  # two fold weights over all of real_dev: ~20 s
def test_cross_validated_weights_on_real_dev():
    from livox_infer.evaluation.real import cross_validated_detections, evaluate_views, load_real_dir
    from livox_infer.pipeline import DetectionPipeline

    torch.set_num_threads(2)
    cv_dir = REPO / "models" / "cv"
    folds = {src: str(cv_dir / name) for src, name in CV_WEIGHTS.items()}
    views = load_real_dir(REAL_DEV)
    assert sum(int((~v.gt_ignore & (v.gt.labels == 0)).sum()) for v in views) == 96  # cars scored (issue 16)
    dets = cross_validated_detections(
        views, folds, lambda weights: DetectionPipeline("lite", weights=weights, compile=False, sensor_height="auto",
                                                        score_thresholds=0.1))
    res = evaluate_views(views, dets)["all"]
    for (cls, key), lo in REAL_MIN_AP.items():
        assert res.ap[cls][key] >= lo, f"{cls} {key} {res.ap[cls][key]:.3f} < {lo}"
    # the guard is real: the shipped weights saw both folds and are refused as a fold's scorer
    with pytest.raises(ConfigError, match="trained on kitti frames"):
        cross_validated_detections(views, {"kitti": str(REPO / "models" / "lite.safetensors"), "av2": folds["av2"]},
                                   lambda weights: None)


def test_shipped_weights_run_on_a_larger_bev_extent():
    """The network is convolutional: the same weights load for a per-sensor extent (80 m, ±40° cone)."""
    from livox_infer.detector.config import ModelConfig
    from livox_infer.pipeline import DetectionPipeline

    pipe = DetectionPipeline("lite", compile=False, bev_extent=(0, 80, -51.2, 51.2))
    assert pipe.cfg.grid.shape[1:] == (256, 200)
    pts = _cloud_around([_box("car", 70, 0)])
    det = pipe.detect(pts)
    assert det.boxes.shape[1] == 7
    cfg = ModelConfig.load("lite")
    with pytest.raises(ConfigError, match="multiples of 3.2"):
        cfg.with_extent((0, 81, -51.2, 51.2))
    with pytest.raises(ConfigError, match="x_min < x_max"):
        cfg.with_extent((80, 0, -51.2, 51.2))


def test_recall_and_the_truck_bus_block_of_the_real_table():
    """EvalResult.recall: share of the relevant GT any detection matched; real_table prints trucks and buses (too
    few real labels for an AP to mean much) as GT, recall and AP when the results have them."""
    from livox_infer.evaluation.metrics import FrameBoxes, evaluate
    from livox_infer.evaluation.real import real_table

    gt = FrameBoxes(np.array([[10, 0, 1.5, 8, 2.5, 3.4, 0], [30, 5, 1.5, 11, 2.5, 3.1, 0]], np.float32),
                    np.array([3, 3]), None, np.array([100, 100]))
    det = FrameBoxes(np.array([[10.2, 0, 1.5, 8, 2.5, 3.4, 0]], np.float32), np.array([3]), np.array([0.4], np.float32))
    res = evaluate([det], [gt], ("car", "pedestrian", "cyclist", "truck", "bus"))
    assert res.recall["truck"]["bev@0.5"] == 0.5 and res.num_gt["truck"] == 2 and np.isnan(res.recall["bus"]["bev@0.5"])
    text = real_table({"all": res}, "t")
    assert "truck recall@0.5" in text and "bus GT" in text
    three = evaluate([det], [gt], ("car", "pedestrian", "cyclist"))
    assert "truck" not in real_table({"all": three}, "t")


# ---- fewer beams (--thin-beams): rings read from a scan stored in laser order ----

def _spinning_scan(boxes, n_rings=64, az_step=0.5, height=1.7, laser=False):
    """A 64-beam scan stored as KITTI stores one: laser after laser, top to bottom, each a sweep of rising azimuth
    starting at 0 deg (so the +-180 deg wrap splits every sweep in two runs); rays hit the ground (z = -height) or
    the axis-aligned ``boxes`` (x, y, z centre, l, w, h), whichever is nearer, within 70 m (the upper lasers'
    rays mostly miss). ``laser``: also return each point's laser index."""
    el = np.radians(np.linspace(2.0, -24.8, n_rings))
    az = np.radians(np.r_[np.arange(0, 180, az_step), np.arange(-180, 0, az_step)])
    e, a = np.meshgrid(el, az, indexing="ij")  # laser-major: the file order
    d = np.stack([np.cos(e) * np.cos(a), np.cos(e) * np.sin(a), np.sin(e)], -1).reshape(-1, 3)
    t = np.where(d[:, 2] < -1e-6, -height / np.minimum(d[:, 2], -1e-6), np.inf)
    for b in boxes:
        lo = np.array([b["x"] - b["l"] / 2, b["y"] - b["w"] / 2, b["z"] - b["h"] / 2])
        hi = lo + [b["l"], b["w"], b["h"]]
        with np.errstate(divide="ignore", invalid="ignore"):
            t0, t1 = lo / d, hi / d
        near = np.nanmax(np.minimum(t0, t1), axis=1)
        far = np.nanmin(np.maximum(t0, t1), axis=1)
        t = np.where((near <= far) & (near > 0), np.minimum(t, near), t)
    keep = t < 70
    p = d[keep] * t[keep, None]
    pts = np.c_[p, np.full(len(p), 50.0)].astype(np.float32)
    return (pts, np.repeat(np.arange(n_rings), len(az))[keep]) if laser else pts


def test_scan_rings_reads_a_laser_ordered_scan_and_thinning_partitions_it():
    from livox_infer.evaluation.beams import scan_rings, thin_beams

    pts, laser = _spinning_scan([_box("car", 15, 0, 0, 4.0, 1.8, 1.5)], laser=True)
    rings = scan_rings(pts)
    # each laser that hit something is one ring, in file order, although every sweep crosses the +-180 deg wrap
    assert rings is not None and len(np.unique(laser)) > 40
    np.testing.assert_array_equal(rings, np.unique(laser, return_inverse=True)[1])
    # the same scan cropped to the camera's +-45 deg (KITTI's velodyne_reduced): each sweep now starts at -45 deg
    front = np.abs(np.degrees(np.arctan2(pts[:, 1], pts[:, 0]))) <= 45
    np.testing.assert_array_equal(scan_rings(pts[front]), np.unique(laser[front], return_inverse=True)[1])
    el = np.degrees(np.arctan2(pts[:, 2], np.hypot(pts[:, 0], pts[:, 1])))
    halves = thin_beams(pts, 2)
    assert len(halves) == 2 and sum(len(h) for h in halves) == len(pts)
    assert set(np.round(el[rings % 2 == 1], 2)).isdisjoint(np.round(el[rings % 2 == 0], 2))
    assert thin_beams(pts, 1)[0] is pts
    holed = pts.copy()
    holed[::97, 0] = np.nan  # a broken return has no azimuth: dropped, the rings still read
    assert sum(len(h) for h in thin_beams(holed, 2)) == len(pts) - len(pts[::97])
    # another file order (AV2 stores firing columns, two lidars interleaved): no rings, not a wrong guess
    shuffled = pts[np.random.default_rng(0).permutation(len(pts))]
    assert scan_rings(shuffled) is None and thin_beams(shuffled, 2) is None
    with pytest.raises(ValueError):
        thin_beams(pts, 0)


def test_eval_cli_real_thin_beams_scores_each_half_and_names_the_frames_left_out(tmp_path, capsys):
    from livox_infer.tools.cli import main

    labels = {"kitti_s": [_box("car", 15, 2, 0, 4.0, 1.8, 1.5), _box("car", 30, -4, 0, 4.0, 1.8, 1.5)],
              "av2_u": [_box("car", 20, 0)]}
    labels["kitti_s"][0]["z"] = labels["kitti_s"][1]["z"] = -0.95
    np.save(tmp_path / "kitti_s.npy", _spinning_scan(labels["kitti_s"]))
    np.save(tmp_path / "av2_u.npy", _cloud_around(labels["av2_u"]))  # not in laser order
    (tmp_path / "labels.json").write_text(json.dumps(labels))
    out_full, out_thin = tmp_path / "full.json", tmp_path / "thin.json"
    assert main(["eval", "--real", str(tmp_path), "--no-compile", "--headings", "0", "--out", str(out_full)]) == 0
    assert main(["eval", "--real", str(tmp_path), "--no-compile", "--headings", "0", "--thin-beams", "2",
                 "--out", str(out_thin)]) == 0
    text = capsys.readouterr().out
    assert "1 laser ring in 2 kept (--thin-beams 2)" in text and "1 frame(s) left out" in text and "av2_u" in text
    full, thin = json.loads(out_full.read_text()), json.loads(out_thin.read_text())
    assert [v["frame"] for v in full["views"]] == ["av2_u", "kitti_s"]
    assert thin["views"] == [{"frame": "kitti_s", "heading": 0.0, "rings_from": 0},
                             {"frame": "kitti_s", "heading": 0.0, "rings_from": 1}]
    assert thin["thin_beams"] == 2 and thin["left_out"] == ["av2_u"]
    assert set(thin["model lite"]) == {"kitti", "all"}
    assert thin["model lite"]["kitti"]["num_gt"]["car"] == 2 * full["model lite"]["kitti"]["num_gt"]["car"]
    with pytest.raises(ConfigError, match="no frame with laser rings"):
        load_real_dir(tmp_path, headings=(0,), frames=["av2_u"], thin_beams=2)
    assert main(["eval", "--sim-frames", "1", "--no-compile", "--thin-beams", "2"]) != 0  # real scans only
    assert "--thin-beams thins the laser rings of real scans" in capsys.readouterr().err
