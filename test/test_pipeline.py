"""DetectionPipeline: inputs, parameters, errors, frame handling (small random-weight model, eager)."""

import logging

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from livox_infer.errors import BackendError, ConfigError, PointCloudError, WeightsError
from livox_infer.detector import ModelConfig, build_model, save_weights
from livox_infer.ground import Mount
from livox_infer.pipeline import DetectionPipeline, Detections
from livox_infer.decode.pointcloud import Cloud, encode_pointcloud2

torch.set_num_threads(1)
STAGES = {"decode", "ground", "voxelize", "network", "refine", "postprocess", "total"}


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    """A tiny config + random weights in a temp dir (same layout as models/)."""
    from pathlib import Path

    d = tmp_path_factory.mktemp("models")
    cfg = yaml.safe_load((Path(__file__).resolve().parent.parent / "models" / "lite.yaml").read_text())
    cfg["name"] = "tiny"
    # lite's calibration map and operating thresholds are fitted to lite's weights, not to these random ones
    cfg.pop("score_calibration", None)
    cfg["score_thresholds"] = {"car": 0.45, "pedestrian": 0.4, "cyclist": 0.4, "truck": 0.4, "bus": 0.4}
    cfg["grid"].update(x_range=[0.0, 25.6], y_range=[-12.8, 12.8])
    cfg["backbone"].update(stem_channels=4, stage_channels=[8, 8], stage_blocks=[1, 1], neck_channels=8)
    cfg["head"]["head_channels"] = 8
    cfg["weights"] = "tiny.safetensors"
    path = d / "tiny.yaml"
    path.write_text(yaml.safe_dump(cfg))
    mc = ModelConfig.load(path)
    torch.manual_seed(0)
    save_weights(build_model(mc), mc, d / "tiny.safetensors")
    return path


def scene_points(height=1.6, seed=0):
    rng = np.random.default_rng(seed)
    n = 6000
    ground = np.c_[rng.uniform(2, 25, n), rng.uniform(-12, 12, n), np.full(n, -height) + rng.normal(0, 0.02, n)]
    car = np.c_[rng.uniform(10, 14, 800), rng.uniform(1, 3, 800), rng.uniform(0.2, 1.5, 800) - height]
    pts = np.r_[ground, car]
    return np.c_[pts, rng.uniform(0, 120, len(pts))].astype(np.float32)


def test_detect_accepts_array_cloud_tensor_and_pointcloud2(small_model):
    pipe = DetectionPipeline(small_model, compile=False, sensor_height=1.6, score_thresholds=0.0)
    pts = scene_points()
    outs = [
        pipe.detect(pts),
        pipe.detect(torch.from_numpy(pts)),
        pipe.detect(Cloud(pts, stamp_ns=7, frame_id="f")),
        pipe.detect(encode_pointcloud2(pts, "xyzi", stamp_ns=9, frame_id="lidar")),
    ]
    for d in outs:
        assert isinstance(d, Detections)
        assert d.boxes.dtype == np.float32 and d.boxes.shape == (len(d), 7)
        assert d.labels.shape == d.scores.shape == (len(d),)
        assert set(d.timings_ms) == STAGES and all(v >= 0 for v in d.timings_ms.values())
        assert d.label_names == [pipe.cfg.classes[i] for i in d.labels]
        assert np.array_equal(d.boxes, outs[0].boxes) and np.array_equal(d.scores, outs[0].scores)
        assert np.all(np.diff(d.scores) <= 0)
    assert len(outs[0]) > 0  # threshold 0: the top-k candidates survive NMS partly
    assert outs[2].stamp_ns == 7 and outs[3].frame_id == "lidar" and outs[3].stamp_ns == 9
    assert pts.flags.writeable and np.array_equal(pts, scene_points())  # input untouched


def test_bad_inputs_raise_point_cloud_error(small_model):
    pipe = DetectionPipeline(small_model, compile=False)
    with pytest.raises(PointCloudError):
        pipe.detect(np.zeros((10, 3), np.float32))
    with pytest.raises(PointCloudError):
        pipe.detect("cloud.pcd")
    with pytest.raises(PointCloudError):
        pipe.detect(np.zeros((4, 4), complex))
    d = pipe.detect(np.zeros((0, 4), np.float32))  # an empty scan is valid: no boxes
    assert len(d) == 0 and d.num_points == 0
    nan = scene_points()
    nan[::7, 0] = np.nan
    assert pipe.detect(nan).num_points < len(nan)


def test_parameters_update_and_validation(small_model):
    pipe = DetectionPipeline(small_model, compile=False, score_thresholds=0.0)
    pts = scene_points()
    assert len(pipe.detect(pts)) > 0
    pipe.update(score_thresholds=1.0)
    assert len(pipe.detect(pts)) == 0
    pipe.update(score_thresholds={"car": 0.0})  # others keep the config's value
    assert pipe.params["score_thresholds"][0] == 0.0
    old_vox = pipe.voxelizer
    pipe.update(intensity_scale=1.0)
    assert pipe.voxelizer is not old_vox and pipe.grid.intensity_scale == 1.0
    for bad in (
        {"score_thresholds": 2.0}, {"score_thresholds": {"tractor": 0.1}}, {"score_thresholds": [0.1]},
        {"sensor_height": "high"}, {"sensor_height": float("nan")}, {"sensor_tilt": (1,)},
        {"intensity_scale": 0}, {"max_detections": 0}, {"tag_filter": "some"}, {"roi": (0, 1)}, {"colour": 1},
    ):
        with pytest.raises(ConfigError):
            pipe.update(**bad)
    with pytest.raises(ConfigError):
        DetectionPipeline(small_model, compile=False, device="tpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_cuda_without_gpu_is_backend_error(small_model):
    with pytest.raises(BackendError):
        DetectionPipeline(small_model, compile=False, device="cuda")


def test_missing_or_foreign_weights_raise_weights_error(small_model, tmp_path):
    with pytest.raises(WeightsError, match="not found"):
        DetectionPipeline(small_model, weights=tmp_path / "none.safetensors", compile=False)
    lite = ModelConfig.load("lite")
    other = tmp_path / "lite.safetensors"
    save_weights(build_model(lite), lite, other)
    with pytest.raises(WeightsError, match="different model config"):
        DetectionPipeline(small_model, weights=other, compile=False)


class FixedRunner:
    """Stands in for the network: one car 0.75 m above the levelled ground at (12, 2)."""

    def __init__(self, k):
        self.k = k

    def __call__(self, bev):
        scores = torch.zeros(self.k)
        scores[0] = 0.9
        boxes = torch.zeros(self.k, 7)
        boxes[:, 3:6] = 1.0
        boxes[0] = torch.tensor([12.0, 2.0, 0.75, 4.0, 1.8, 1.5, 0.1])
        return scores, torch.zeros(self.k, dtype=torch.long), boxes


def test_boxes_come_back_in_the_cloud_frame(small_model):
    pipe = DetectionPipeline(small_model, compile=False, sensor_height=1.6, sensor_tilt=None)
    pipe._runner = FixedRunner(pipe.cfg.top_k)
    d = pipe.detect(scene_points(height=1.6))
    assert len(d) == 1 and d.boxes[0, 2] == pytest.approx(0.75 - 1.6, abs=1e-5)
    assert d.boxes[0, 0] == pytest.approx(12.0) and d.boxes[0, 6] == pytest.approx(0.1)
    # auto: the ground of this cloud is 1.1 m below the sensor
    pipe.update(sensor_height="auto", sensor_tilt="auto")
    d = pipe.detect(scene_points(height=1.1))
    assert d.sensor_height == pytest.approx(1.1, abs=0.05)
    assert d.boxes[0, 2] == pytest.approx(0.75 - 1.1, abs=0.05)
    # a known tilt: the box is rotated back into the tilted sensor frame
    pipe.update(sensor_height=1.6, sensor_tilt=(3.0, 0.0))
    d = pipe.detect(scene_points())
    m = Mount.from_pitch_roll(1.6, 3.0, 0.0)
    centre = m.rotation().T @ np.array([12.0, 2.0, 0.75 - 1.6])
    assert np.allclose(d.boxes[0, :3], centre, atol=1e-4)


def test_compile_failure_falls_back_to_eager(small_model, monkeypatch, caplog, tmp_path):
    def broken(*a, **k):
        raise RuntimeError("no compiler here")

    monkeypatch.setenv("LIVOX_INFER_CACHE_DIR", str(tmp_path))  # nothing an earlier start saved to load instead
    monkeypatch.setattr(torch, "compile", broken)
    with caplog.at_level(logging.WARNING):
        pipe = DetectionPipeline(small_model, compile=True)
    assert not pipe.compiled and "no compiler here" in pipe.compile_error
    assert any("running the network eagerly" in r.message for r in caplog.records)
    assert len(pipe.detect(scene_points()).timings_ms) == len(STAGES)


@pytest.mark.parametrize("xy_offsets", [False, True], ids=["plain", "xy"])
def test_test_time_flip_mirrors_consistently(small_model, tmp_path, xy_offsets):
    """With test_time_flip a cloud and its mirror image (y -> -y) give mirrored detections: exactly
    without the sub-cell x/y channels; with them the mirrored cloud's y channel equals 1 - y only to
    within one 1/256 step (the rounded mean), so the random test network's outputs may move a little.
    Stage 1 only: the stage-2 refiner sees each box's points in the box frame and is not mirror-symmetric."""
    from livox_infer.detector import ModelConfig, build_model, save_weights

    d = yaml.safe_load(Path(small_model).read_text())
    d["grid"]["xy_offsets"] = xy_offsets
    model = tmp_path / "flip.yaml"
    model.write_text(yaml.safe_dump({**d, "weights": "flip.safetensors"}))
    torch.manual_seed(0)
    cfg = ModelConfig.load(model)
    save_weights(build_model(cfg), cfg, tmp_path / "flip.safetensors")
    # fp32: bf16 (auto on an AMX CPU) rounds the two halves of the batch differently, moving near-equal top-k picks
    pipe = DetectionPipeline(str(model), compile=False, sensor_height=1.6, sensor_tilt=None, score_thresholds=0.0,
                             test_time_flip=True, refine=False, precision="fp32")
    pts = scene_points()
    mirrored = pts.copy()
    mirrored[:, 1] *= -1
    a, b = pipe.detect(pts), pipe.detect(mirrored)
    assert len(a) > 0 and len(a) == len(b)
    if xy_offsets:  # near-equal scores may swap order: match each box to the nearest mirrored one
        assert np.allclose(np.sort(a.scores), np.sort(b.scores), atol=1e-3)
        mirrored_b = b.boxes[:, :2] * np.array([1.0, -1.0])
        dist = np.linalg.norm(a.boxes[:, None, :2] - mirrored_b[None], axis=-1)
        assert dist.min(1).max() < 0.02 and dist.min(0).max() < 0.02
    else:
        oa, ob = np.lexsort((a.boxes[:, 1], a.scores)), np.lexsort((-b.boxes[:, 1], b.scores))
        assert np.allclose(a.scores[oa], b.scores[ob], atol=1e-5)
        assert np.allclose(a.boxes[oa, 1], -b.boxes[ob, 1], atol=1e-3)
    pipe = DetectionPipeline(small_model, compile=False, sensor_height=1.6, sensor_tilt=None, score_thresholds=0.0,
                             test_time_flip=True)
    a = pipe.detect(pts)
    plain = DetectionPipeline(small_model, compile=False, sensor_height=1.6, sensor_tilt=None, score_thresholds=0.0)
    assert not np.allclose(np.sort(plain.detect(pts).scores)[-5:], np.sort(a.scores)[-5:])  # it does change scores
    pipe.update(test_time_flip=False)
    assert np.allclose(np.sort(pipe.detect(pts).scores), np.sort(plain.detect(pts).scores))


@pytest.mark.parametrize("value", [1e30, -1e30, 1e9, 3e8])
def test_one_point_with_a_huge_intensity_leaves_the_frame_intact(value):
    """Hardening: one byte-flipped intensity on a car once broke stage 2 (IndexError, or a 9.7 GB map)."""
    from livox_infer.sim.simulate import simulate_frame

    f = simulate_frame("avia", 5, scene="street")
    pipe = DetectionPipeline("lite", compile=False, sensor_height=float(f.sensor_height))
    ref = pipe.detect(f.points)
    car = f.boxes[f.labels == 0][0]
    pts = f.points[(f.points[:, :3] != 0).any(axis=1)].copy()
    near = np.argmin(np.linalg.norm(pts[:, :2] - car[:2], axis=1))
    pts[near, 3] = value
    det = pipe.detect(pts)
    assert np.isfinite(det.boxes).all()
    assert abs(len(det) - len(ref)) <= 2
    if value > 0:
        pts[:, 3] = value  # every point
        assert np.isfinite(pipe.detect(pts).boxes).all()


def test_point_budget_thins_deterministically_and_reports_it(small_model):
    from livox_infer.decode.pointcloud import DEFAULT_MAX_POINTS, MAX_POINTS_RANGE

    pipe = DetectionPipeline(small_model, compile=False, sensor_height=1.6, score_thresholds=0.0, max_points=2000)
    pts = scene_points()  # 6800 points
    a, b = pipe.detect(pts), pipe.detect(pts)
    assert a.num_points == 2000 and a.points_over_budget == len(pts) - 2000
    assert np.array_equal(a.boxes, b.boxes) and np.array_equal(a.scores, b.scores)  # same subset every run
    pipe.update(max_points=len(pts))
    full = pipe.detect(pts)
    assert full.num_points == len(pts) and full.points_over_budget == 0
    assert pipe.params["max_points"] == len(pts)
    for bad in (0, MAX_POINTS_RANGE[1] + 1, 2.5, True, "many"):
        with pytest.raises(ConfigError, match="max_points"):
            pipe.update(max_points=bad)
    assert pipe.params["max_points"] == len(pts)  # a rejected value changes nothing
    assert DetectionPipeline(small_model, compile=False).params["max_points"] == DEFAULT_MAX_POINTS


def test_a_pipeline_whose_network_computes_garbage_is_refused(small_model, tmp_path):
    """Weights that pass every file check (plausible magnitudes, matching hash) but overflow the network."""
    from livox_infer.pipeline import synthetic_frame

    cfg = ModelConfig.load(small_model)
    net = build_model(cfg)
    with torch.no_grad():
        for name, t in net.state_dict().items():
            if t.is_floating_point() and not name.endswith(("running_var", "running_mean")):
                t.fill_(9e4)  # within MAX_ABS_VALUE; layer after layer the activations overflow
    bad = tmp_path / "overflow.safetensors"
    save_weights(net, cfg, bad)
    with pytest.raises(WeightsError, match="non-finite outputs"):
        DetectionPipeline(small_model, weights=bad, compile=False)
    good = DetectionPipeline(small_model, compile=False, sensor_height=1.6)
    with pytest.raises(WeightsError, match="non-finite outputs"):
        good.update(weights=bad)
    pts = synthetic_frame(good.grid)
    assert pts.dtype == np.float32 and np.array_equal(pts, synthetic_frame(good.grid))


def test_candidates_below_the_thresholds_leave_the_detections_as_they_are():
    """candidate_score (the tracker's second association): the same detections as without it, and beside them the
    boxes scoring in [candidate_score, their class's threshold) that survive the NMS after the detections."""
    from livox_infer.sim.simulate import simulate_frame

    f = simulate_frame("avia", 5, scene="street")
    pipe = DetectionPipeline("lite", compile=False, sensor_height=float(f.sensor_height))
    plain = pipe.detect(f.points)
    assert plain.candidate_boxes is None
    pipe.update(candidate_score=0.05)
    both = pipe.detect(f.points)
    assert np.array_equal(both.boxes, plain.boxes) and np.array_equal(both.scores, plain.scores)
    assert np.array_equal(both.labels, plain.labels)
    thr = np.asarray(pipe.params["score_thresholds"])[both.candidate_labels]
    assert len(both.candidate_scores) > 0 and both.candidate_boxes.shape == (len(both.candidate_scores), 7)
    assert np.all(both.candidate_scores >= 0.05) and np.all(both.candidate_scores < thr)
    with pytest.raises(ConfigError, match="candidate_score"):
        pipe.update(candidate_score=1.5)


def test_candidates_never_suppress_a_detection_of_another_class():
    """Cross-class NMS: a car box at 0.5 (below the car threshold 0.55: a candidate) over a pedestrian detection at
    0.3 (threshold 0.1) leaves the pedestrian; the candidate, suppressed by it, is not returned either."""
    from livox_infer.detector.postprocess import select_detections, select_detections_and_candidates

    boxes = torch.tensor([[10.0, 0.0, 0.0, 4.0, 1.8, 1.5, 0.0], [10.0, 0.0, 0.0, 4.0, 1.8, 1.5, 0.0],
                          [30.0, 5.0, 0.0, 4.0, 1.8, 1.5, 0.0], [20.0, -5.0, 0.0, 4.0, 1.8, 1.5, 0.0]])
    scores, labels = torch.tensor([0.5, 0.3, 0.4, 0.9]), torch.tensor([0, 1, 0, 0])
    args = ((0.55, 0.1), (0.5, 0.5), 100, 0.3)
    plain = select_detections(scores, labels, boxes, *args)
    (s, l, b), (cs, cl, cb) = select_detections_and_candidates(scores, labels, boxes, (0.55, 0.1), 0.2, *args[1:])
    assert torch.equal(s, plain[0]) and torch.equal(l, plain[1]) and torch.equal(b, plain[2])
    assert sorted(s.tolist()) == pytest.approx([0.3, 0.9])
    assert cs.tolist() == pytest.approx([0.4]) and cl.tolist() == [0] and float(cb[0, 0]) == 30.0
