"""Model config, target encode/decode round trip, losses, safetensors weights checks, AP."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from livox_infer.errors import ConfigError, WeightsError
from livox_infer import CLASS_NAMES
from livox_infer.detector import InferenceModel, ModelConfig, build_model, load_weights, save_weights
from livox_infer.evaluation.metrics import FrameBoxes, evaluate
from livox_infer.evaluation.metrics import average_precision_r40
from livox_infer.training.losses import detection_loss
from livox_infer.detector.backbone import ResidualBlock
from livox_infer.detector.network import fuse_batchnorm
from livox_infer.detector.postprocess import select_detections, topk_decode
from livox_infer.training.targets import build_targets

torch.set_num_threads(1)
REPO = Path(__file__).resolve().parent.parent


def small_config(**over) -> ModelConfig:
    d = yaml.safe_load((REPO / "models" / "lite.yaml").read_text())
    d["grid"].update(x_range=[0.0, 25.6], y_range=[-12.8, 12.8], cell_size=0.4)
    d["backbone"] = {"stem_channels": 4, "stage_channels": [8, 8, 8], "stage_blocks": [1, 1, 1], "neck_channels": 8}
    d["head"]["head_channels"] = 8
    d["head"].pop("residual_blocks", None)  # the residual-block tests add them explicitly
    d.update(over)
    return ModelConfig.from_dict(d, source="test")


def test_shipped_configs_load():
    for name, classes in (("lite", CLASS_NAMES), ("lite-sim", CLASS_NAMES[:3]), ("full", CLASS_NAMES[:3])):
        cfg = ModelConfig.load(name)
        assert cfg.classes == classes
        assert cfg.grid.shape[0] == cfg.grid.n_channels
        assert cfg.weights.endswith(".safetensors")
    assert ModelConfig.load("full").grid.cell_size < ModelConfig.load("lite").grid.cell_size


@pytest.mark.parametrize(
    "change",
    [
        {"backbone": {"stage_channels": [8, -1, 8]}},
        {"backbone": {"stage_channels": [8, 8], "stage_blocks": [1, 1, 1]}},
        {"head": {"out_stride": 3}},
        {"score_thresholds": {"car": 0.3}},  # classes missing
        {"score_thresholds": 1.5},
        {"nms": {"iou_threshold": "x"}},
        {"nms": {"cross_class_iou": 1.5}},
        {"nms": {"cross_class_iou": "yes"}},
        {"surprise": 1},
        {"grid": {"cell_size": -1}},
    ],
)
def test_bad_configs_raise_config_error(change):
    d = small_config().to_dict()
    for k, v in change.items():
        if k in ("backbone", "head", "grid", "nms"):
            d[k] = {**d[k], **v}
        else:
            d[k] = v
    with pytest.raises(ConfigError):
        ModelConfig.from_dict(d)


def test_missing_config_is_config_error(tmp_path):
    with pytest.raises(ConfigError):
        ModelConfig.load(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("grid: [unclosed")
    with pytest.raises(ConfigError):
        ModelConfig.load(bad)


def _fake_heads(t, cfg):
    """Head maps that reproduce the targets exactly (heatmap = targets, regression at centres)."""
    hh, hw = cfg.head_shape
    heads = {"heatmap": torch.logit(torch.from_numpy(t["heatmap"]).clamp(1e-6, 1 - 1e-6))[None]}
    reg = torch.zeros(1, 8, hh * hw)
    for i in range(int(t["mask"].sum())):
        reg[0, :, t["index"][i]] = torch.from_numpy(t["regression"][i])
    reg = reg.view(1, 8, hh, hw)
    heads.update(offset=reg[:, 0:2], z=reg[:, 2:3], size=reg[:, 3:6], yaw=reg[:, 6:8])
    return heads


def _assert_same_boxes(got: np.ndarray, want: np.ndarray):
    """Decoded boxes == wanted ones (matched by x order); yaw as the box axis modulo pi, in [-pi/2, pi/2).
    Returns the two x orders."""
    order, ref = np.argsort(got[:, 0]), np.argsort(want[:, 0])
    got, want = got[order], want[ref]
    assert np.allclose(got[:, :6], want[:, :6], atol=1e-4)
    assert np.all((got[:, 6] >= -math.pi / 2) & (got[:, 6] < math.pi / 2))
    assert np.allclose(np.sin(2 * got[:, 6]), np.sin(2 * want[:, 6]), atol=1e-4)
    assert np.allclose(np.cos(2 * got[:, 6]), np.cos(2 * want[:, 6]), atol=1e-4)
    return order, ref


def test_targets_decode_round_trip():
    cfg = small_config()
    boxes = np.array([
        [10.3, 2.1, 0.8, 4.2, 1.8, 1.5, 0.4],
        [12.7, -5.3, 0.9, 0.6, 0.7, 1.7, -2.0],
        [20.0, 8.0, 0.8, 1.8, 0.6, 1.7, 3.0],
        [5.05, -11.9, 0.7, 0.5, 0.5, 1.6, 0.0],
    ], np.float32)
    labels = np.array([0, 1, 2, 1])
    t = build_targets(boxes, labels, cfg)
    assert t["mask"].sum() == 4
    s, l, b = topk_decode(_fake_heads(t, cfg), cfg)
    s, l, b = select_detections(s[0], l[0], b[0], cfg.score_thresholds, cfg.nms_iou, 10)
    order, ref = _assert_same_boxes(b.numpy(), boxes)
    assert l.numpy()[order].tolist() == labels[ref].tolist()
    assert np.allclose(s.numpy(), 1.0, atol=1e-4)


def test_targets_skip_boxes_outside_grid_and_bad_labels():
    cfg = small_config()
    boxes = np.array([[-3.0, 0, 0.8, 4, 2, 1.5, 0], [10, 30, 0.8, 4, 2, 1.5, 0], [10, 0, 0.8, 4, 2, 1.5, 0]], np.float32)
    t = build_targets(boxes, np.array([0, 0, 7]), cfg)
    assert t["mask"].sum() == 0 and t["heatmap"].max() == 0


def test_loss_decreases_on_one_batch():
    torch.manual_seed(0)
    cfg = small_config()
    net = build_model(cfg)
    boxes = np.array([[10.3, 2.1, 0.8, 4.2, 1.8, 1.5, 0.4], [12.7, -5.3, 0.9, 0.6, 0.7, 1.7, -2.0]], np.float32)
    t = {k: torch.from_numpy(v)[None] for k, v in build_targets(boxes, np.array([0, 1]), cfg).items()}
    bev = torch.rand(1, *cfg.grid.shape)
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    first = None
    for _ in range(15):
        loss, parts = detection_loss(net(bev), t)
        opt.zero_grad()
        loss.backward()
        opt.step()
        first = first if first is not None else float(loss)
    assert float(loss) < 0.7 * first
    assert set(parts) == ({"heatmap", "regression", "iou"} if cfg.iou_head else {"heatmap", "regression"})


def test_inference_model_has_static_output_shapes():
    cfg = small_config()
    net = build_model(cfg).eval()
    with torch.no_grad():
        s, l, b = InferenceModel(net, cfg)(torch.zeros(1, *cfg.grid.shape))
    assert s.shape == (cfg.top_k,) and l.shape == (cfg.top_k,) and b.shape == (cfg.top_k, 7)


# --------------------------------------------------------------------------- weights


def test_weights_round_trip_and_metadata(tmp_path):
    cfg = small_config()
    net = build_model(cfg)
    p = tmp_path / "w.safetensors"
    save_weights(net, cfg, p, extra={"note": "x"})
    other = build_model(cfg)
    meta = load_weights(other, cfg, p)
    assert meta["note"] == "x" and meta["architecture_hash"] == cfg.architecture_hash()
    for (k, a), (_, b) in zip(net.state_dict().items(), other.state_dict().items()):
        assert torch.equal(a, b), k


def test_weights_rejects_missing_corrupt_and_mismatched(tmp_path):
    cfg = small_config()
    net = build_model(cfg)
    with pytest.raises(WeightsError, match="not found"):
        load_weights(net, cfg, tmp_path / "missing.safetensors")
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x00" * 64)
    with pytest.raises(WeightsError):
        load_weights(net, cfg, junk)
    good = tmp_path / "good.safetensors"
    save_weights(net, cfg, good)
    trunc = tmp_path / "trunc.safetensors"
    trunc.write_bytes(good.read_bytes()[:-100])
    with pytest.raises(WeightsError):
        load_weights(net, cfg, trunc)
    # a pickle file is refused without being unpickled
    pick = tmp_path / "pickle.safetensors"
    torch.save(net.state_dict(), pick)
    with pytest.raises(WeightsError):
        load_weights(net, cfg, pick)
    # weights of a different architecture
    wider = small_config(head={**small_config().to_dict()["head"], "head_channels": 16})
    with pytest.raises(WeightsError, match="different model config"):
        load_weights(build_model(wider), wider, good)


def test_weights_rejects_tampered_tensors(tmp_path):
    from safetensors.torch import save_file

    cfg = small_config()
    net = build_model(cfg)
    good = tmp_path / "good.safetensors"
    save_weights(net, cfg, good)
    from livox_infer.detector.weights import read_metadata

    meta = read_metadata(good)
    state = {k: v.clone() for k, v in net.state_dict().items()}
    state.pop(next(iter(state)))
    bad = tmp_path / "bad.safetensors"
    save_file(state, str(bad), metadata=meta)
    with pytest.raises(WeightsError, match="missing"):
        load_weights(net, cfg, bad)
    state = {k: v.clone() for k, v in net.state_dict().items()}
    k = "head.heatmap.weight"
    state[k] = torch.full_like(state[k], float("nan"))
    save_file(state, str(bad), metadata=meta)
    with pytest.raises(WeightsError, match="NaN"):
        load_weights(net, cfg, bad)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64])
def test_weights_rejects_tensors_of_another_dtype(tmp_path, dtype):
    """Hardening: a file with the right names and shapes but float16 / float64 / int64 tensors was cast silently."""
    from safetensors.torch import save_file

    from livox_infer.detector.weights import read_metadata

    cfg = small_config()
    net = build_model(cfg)
    good = tmp_path / "good.safetensors"
    save_weights(net, cfg, good)
    state = {k: (v.to(dtype) if v.is_floating_point() else v.to(torch.int32)) for k, v in net.state_dict().items()}
    bad = tmp_path / "bad.safetensors"
    save_file(state, str(bad), metadata=read_metadata(good))
    with pytest.raises(WeightsError, match="wrong dtype"):
        load_weights(net, cfg, bad)


def _resave(tmp_path, net, cfg, change, keep_hash=True):
    """The saved weights of ``net`` with ``change(state)`` applied, under the original metadata (content hash
    kept, or recomputed for the changed tensors when keep_hash is False: a forger who knows the scheme)."""
    from safetensors.torch import save_file

    from livox_infer.detector.weights import CONTENT_HASH_KEY, content_sha256, read_metadata

    good = tmp_path / "good.safetensors"
    save_weights(net, cfg, good)
    state = {k: v.clone() for k, v in net.state_dict().items()}
    change(state)
    meta = read_metadata(good)
    if not keep_hash:
        meta[CONTENT_HASH_KEY] = content_sha256(state)
    bad = tmp_path / "bad.safetensors"
    save_file(state, str(bad), metadata=meta)
    return bad


def test_weights_reject_absurd_values_even_with_a_matching_hash(tmp_path):
    cfg = small_config()
    net = build_model(cfg)

    def scaled(state):
        state["head.heatmap.weight"] *= 1e30

    with pytest.raises(WeightsError, match="beyond"):
        load_weights(net, cfg, _resave(tmp_path, net, cfg, scaled, keep_hash=False))
    var = next(k for k in net.state_dict() if k.endswith("running_var"))

    def negative_variance(state):
        state[var][0] = -1.0

    with pytest.raises(WeightsError, match="variance"):
        load_weights(net, cfg, _resave(tmp_path, net, cfg, negative_variance, keep_hash=False))


def test_weights_content_hash_catches_altered_data(tmp_path):
    from livox_infer.detector.weights import CONTENT_HASH_KEY, read_metadata

    cfg = small_config()
    net = build_model(cfg)

    def nudged(state):
        state["head.heatmap.weight"][0, 0, 0, 0] += 0.01  # plausible, finite: only the hash can tell

    with pytest.raises(WeightsError, match="content hash"):
        load_weights(net, cfg, _resave(tmp_path, net, cfg, nudged))
    good = tmp_path / "good.safetensors"
    assert len(read_metadata(good)[CONTENT_HASH_KEY]) == 64
    raw = bytearray(good.read_bytes())
    raw[-9] ^= 0x01  # one bit of the data region
    flipped = tmp_path / "flipped.safetensors"
    flipped.write_bytes(bytes(raw))
    with pytest.raises(WeightsError):
        load_weights(build_model(cfg), cfg, flipped)
    load_weights(build_model(cfg), cfg, good)  # the untouched file still loads


# --------------------------------------------------------------------------- AP


def fb(boxes, labels, scores=None, num_points=None):
    return FrameBoxes(np.asarray(boxes, np.float32).reshape(-1, 7), labels, scores, num_points)


CAR = [10.0, 0.0, 0.8, 4.0, 1.8, 1.5, 0.0]
CAR2 = [20.0, 5.0, 0.8, 4.0, 1.8, 1.5, 0.5]


def test_ap_perfect_and_none():
    gt = [fb([CAR, CAR2], [0, 0]), fb([CAR], [0])]
    perfect = [fb([CAR, CAR2], [0, 0], [0.9, 0.8]), fb([CAR], [0], [0.7])]
    assert evaluate(perfect, gt).ap["car"]["bev@0.7"] == pytest.approx(1.0)
    assert evaluate(perfect, gt).ap["car"]["3d@0.7"] == pytest.approx(1.0)
    nothing = [fb([], []), fb([], [])]
    assert evaluate(nothing, gt).ap["car"]["bev@0.7"] == 0.0
    wrong_place = [fb([[40, 0, 0.8, 4, 1.8, 1.5, 0]], [0], [0.9]), fb([], [])]
    assert evaluate(wrong_place, gt).ap["car"]["bev@0.5"] == 0.0
    assert math.isnan(evaluate(perfect, gt).ap["pedestrian"]["bev@0.5"])  # no GT of that class


def test_ap_half_recall_and_false_positive_ranking():
    gt = [fb([CAR, CAR2], [0, 0])]
    half = [fb([CAR], [0], [0.9])]
    assert evaluate(half, gt).ap["car"]["bev@0.7"] == pytest.approx(0.5)
    # a false positive ranked above both true positives: precision 1/2 at recall 0.5, 2/3 at recall 1;
    # the interpolated precision (best at recall >= r) is 2/3 everywhere
    fp_first = [fb([[40, 0, 0.8, 4, 1.8, 1.5, 0], CAR, CAR2], [0, 0, 0], [0.95, 0.9, 0.8])]
    expected = 2 / 3
    assert evaluate(fp_first, gt).ap["car"]["bev@0.7"] == pytest.approx(expected)
    # duplicates of one GT: the second is a false positive
    dup = [fb([CAR, CAR, CAR2], [0, 0, 0], [0.9, 0.85, 0.8])]
    assert evaluate(dup, gt).ap["car"]["bev@0.7"] == pytest.approx((20 * 1.0 + 20 * (2 / 3)) / 40)


def test_ap_ignores_gt_with_few_points_and_their_detections():
    gt = [fb([CAR, CAR2], [0, 0], num_points=[50, 2])]
    dets = [fb([CAR, CAR2], [0, 0], [0.9, 0.95])]
    res = evaluate(dets, gt, min_points=5)
    assert res.ap["car"]["bev@0.7"] == pytest.approx(1.0)  # CAR2's detection is neither TP nor FP
    assert res.num_gt["car"] == 1 and res.num_ignored["car"] == 1
    only_far = [fb([CAR2], [0], [0.9])]
    assert evaluate(only_far, gt, min_points=5).ap["car"]["bev@0.7"] == 0.0


def test_ap_by_range_bin():
    near, far = [10.0, 0.0, 0.8, 4.0, 1.8, 1.5, 0.0], [45.0, 5.0, 0.8, 4.0, 1.8, 1.5, 0.0]
    gt = [fb([near, far], [0, 0])]
    dets = [fb([near], [0], [0.9])]  # only the near car is found
    assert evaluate(dets, gt).ap["car"]["bev@0.7"] == pytest.approx(0.5)
    res = evaluate(dets, gt, range_bin=(0, 30))
    assert res.ap["car"]["bev@0.7"] == pytest.approx(1.0) and res.num_gt["car"] == 1 and res.num_ignored["car"] == 1
    assert evaluate(dets, gt, range_bin=(30, math.inf)).ap["car"]["bev@0.7"] == 0.0
    # a detection just inside a bin matched to a GT just outside it is neither TP nor FP there
    edge_gt = [fb([[30.2, 0.0, 0.8, 4.0, 1.8, 1.5, 0.0], near], [0, 0])]
    edge_det = [fb([[29.9, 0.0, 0.8, 4.0, 1.8, 1.5, 0.0], near], [0, 0], [0.95, 0.9])]
    assert evaluate(edge_det, edge_gt, range_bin=(0, 30)).ap["car"]["bev@0.7"] == pytest.approx(1.0)
    assert evaluate(edge_det, edge_gt, range_bin=(30, 60)).ap["car"]["bev@0.7"] == pytest.approx(0.0)


def test_range_bins_and_their_errors():
    from livox_infer.evaluation.options import parse_ranges
    from livox_infer.evaluation.metrics import range_bins

    assert range_bins(parse_ranges("0,20,40,inf")) == [("0-20 m", (0.0, 20.0)), ("20-40 m", (20.0, 40.0)),
                                                        ("40+ m", (40.0, math.inf))]
    assert range_bins(None) == [] and parse_ranges(None) is None
    for bad in ("20,10", "0", "-5,10", "0,ten", "0,nan"):
        with pytest.raises(ConfigError, match="ranges"):
            parse_ranges(bad)


def test_ap_class_mismatch_is_not_a_match():
    gt = [fb([CAR], [0])]
    assert evaluate([fb([CAR], [2], [0.9])], gt).ap["car"]["bev@0.7"] == 0.0


def test_average_precision_r40_edge_cases():
    assert math.isnan(average_precision_r40(np.zeros(0), np.zeros(0, bool), 0))
    assert average_precision_r40(np.array([0.5]), np.array([True]), 1) == pytest.approx(1.0)
    assert average_precision_r40(np.array([0.5]), np.array([True]), 4) == pytest.approx(10 / 40)


def test_eval_reads_jsonl(tmp_path):
    from livox_infer.evaluation.metrics import read_jsonl

    p = tmp_path / "d.jsonl"
    rows = [{"stamp": 5, "boxes": [{"label": "car", "score": 0.5, "x": 1, "y": 2, "z": 0, "l": 4, "w": 2, "h": 1.5, "yaw": 0}]},
            {"stamp": 6, "boxes": []}]
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    frames = read_jsonl(p)
    assert [f.stamp_ns for f in frames] == [5, 6]
    assert frames[0].boxes.shape == (1, 7) and frames[1].boxes.shape == (0, 7)
    p.write_text("{not json\n")
    with pytest.raises(ConfigError):
        read_jsonl(p)


def test_flip_merge_decodes_the_boxes_of_both_views():
    """Head maps of a frame and of its mirror image (y -> -y), merged, decode to the frame's boxes."""
    from livox_infer.detector.postprocess import merge_flipped

    cfg = small_config()
    boxes = np.array([
        [10.3, 2.1, 0.8, 4.2, 1.8, 1.5, 0.4],
        [12.7, -5.3, 0.9, 0.6, 0.7, 1.7, -1.0],
        [20.0, 8.05, 0.8, 1.8, 0.6, 1.7, 1.3],
    ], np.float32)
    labels = np.array([0, 1, 2])
    mirrored = boxes.copy()
    mirrored[:, 1] *= -1
    mirrored[:, 6] *= -1
    direct = _fake_heads(build_targets(boxes, labels, cfg), cfg)
    mirror = _fake_heads(build_targets(mirrored, labels, cfg), cfg)
    merged = merge_flipped({k: torch.cat([direct[k], mirror[k]]) for k in direct})
    s, l, b = topk_decode(merged, cfg)
    s, l, b = select_detections(s[0], l[0], b[0], cfg.score_thresholds, cfg.nms_iou, 10)
    _assert_same_boxes(b.numpy(), boxes)
    assert np.allclose(s.numpy(), 1.0, atol=1e-4)


def test_flip_inference_is_mirror_equivariant():
    """With test-time flipping the output for a mirrored frame is the mirrored output (the mirrored
    BEV of `mirror_bev`: rows flipped and, with the sub-cell channels, y -> 1 - y)."""
    from livox_infer.detector.postprocess import mirror_bev

    torch.manual_seed(0)
    cfg = small_config()
    net = build_model(cfg).eval()
    infer = InferenceModel(net, cfg, flip=True).eval()
    bev = torch.rand(1, *cfg.grid.shape)
    with torch.no_grad():
        s0, l0, b0 = infer(bev)
        s1, l1, b1 = infer(mirror_bev(bev, cfg))
    o0, o1 = torch.argsort(s0, descending=True), torch.argsort(s1, descending=True)
    assert torch.allclose(s0[o0], s1[o1], atol=1e-5) and torch.equal(l0[o0], l1[o1])
    b1m = b1[o1].clone()
    b1m[:, 1] *= -1
    assert torch.allclose(b0[o0][:, :6], b1m[:, :6], atol=1e-4)
    assert torch.allclose(torch.sin(2 * b0[o0][:, 6]), -torch.sin(2 * b1[o1][:, 6]), atol=1e-4)
    # an asymmetric grid cannot be flipped
    d = yaml.safe_load((REPO / "models" / "lite.yaml").read_text())
    d["grid"].update(y_range=[-12.8, 16.0])
    with pytest.raises(ConfigError, match="symmetric"):
        InferenceModel(net, ModelConfig.from_dict(d, source="test"), flip=True)


# --------------------------------------------------------------------------- IoU head


def _old_network_config() -> ModelConfig:
    """small_config without the IoU head and without the sub-cell x/y input channels."""
    d = small_config().to_dict()
    d["head"].pop("iou_head", None)
    d.pop("iou_score_alpha", None)
    d["grid"].pop("xy_offsets", None)
    return ModelConfig.from_dict(d, source="test")


def _new_network_config(**over) -> ModelConfig:
    """small_config with the IoU head and the sub-cell x/y input channels."""
    d = small_config().to_dict()
    d["head"]["iou_head"] = True
    d["grid"]["xy_offsets"] = True
    d.update(over)
    return ModelConfig.from_dict(d, source="test")


def test_iou_head_config_and_architecture():
    with_iou = _new_network_config(iou_score_alpha={"car": 0.5, "pedestrian": 0.2, "cyclist": 0.0, "truck": 0.5,
                                                    "bus": 0.5})
    assert with_iou.iou_head and with_iou.iou_score_alpha == (0.5, 0.2, 0.0, 0.5, 0.5)
    assert with_iou.architecture()["iou_head"] is True
    plain = _old_network_config()
    # weights trained before the IoU head existed keep their architecture hash
    assert "iou_head" not in plain.architecture() and plain.architecture_hash() != with_iou.architecture_hash()
    assert ModelConfig.from_dict(with_iou.to_dict()) == ModelConfig.from_dict(with_iou.to_dict())
    with pytest.raises(ConfigError, match="iou_head"):
        ModelConfig.from_dict({**plain.to_dict(), "iou_score_alpha": 0.5})
    with pytest.raises(ConfigError, match="iou_head"):
        ModelConfig.from_dict({**plain.to_dict(), "head": {**plain.to_dict()["head"], "iou_head": "yes"}})
    out = build_model(with_iou)(torch.zeros(1, *with_iou.grid.shape))
    assert out["iou"].shape == (1, 1, *with_iou.head_shape)
    assert "iou" not in build_model(plain)(torch.zeros(1, *plain.grid.shape))


def test_iou_loss_target_is_the_iou_of_the_regressed_box():
    """The IoU head's target at a centre is the BEV IoU of the box the head regresses there."""
    from livox_infer.training.losses import gather_regression, iou_loss

    cfg = _new_network_config()
    boxes = np.array([[10.3, 2.1, 0.8, 4.0, 2.0, 1.5, 0.0], [14.1, -5.3, 0.9, 0.6, 0.6, 1.7, 0.0]], np.float32)
    t = {k: torch.from_numpy(v)[None] for k, v in build_targets(boxes, np.array([0, 1]), cfg).items()}
    heads = _fake_heads({k: v[0].numpy() for k, v in t.items()}, cfg)
    pred = gather_regression(heads, t["index"]).clone()
    pred[0, 0, 0] += 1.0 / cfg.head_cell_size  # first entry (the car, larger first): 1 m too far along x
    logits = torch.tensor([0.3, -0.7])
    hh, hw = cfg.head_shape
    iou_map = torch.zeros(1, 1, hh * hw)
    iou_map[0, 0, t["index"][0, :2]] = logits
    heads["iou"] = iou_map.view(1, 1, hh, hw)
    want_iou = torch.tensor([3.0 * 2.0 / (8.0 + 8.0 - 6.0), 1.0])  # shifted car: 0.6; exact pedestrian: 1
    want = torch.nn.functional.binary_cross_entropy_with_logits(logits, want_iou)
    assert float(iou_loss(heads, pred, t, cfg.head_cell_size)) == pytest.approx(float(want), abs=1e-5)


def test_iou_aware_scores_and_flip_merge():
    """score = heat^(1-a) * iou^a per class; the IoU map survives the flip merge."""
    from livox_infer.detector.postprocess import merge_flipped

    cfg = _new_network_config(iou_score_alpha={"car": 0.5, "pedestrian": 0.25, "cyclist": 0.0, "truck": 0.5, "bus": 0.5})
    boxes = np.array([[10.3, 2.1, 0.8, 4.2, 1.8, 1.5, 0.4], [12.7, -5.3, 0.9, 0.6, 0.7, 1.7, -1.0],
                      [20.0, 8.05, 0.8, 1.8, 0.6, 1.7, 1.3]], np.float32)
    labels = np.array([0, 1, 2])
    heads = _fake_heads(build_targets(boxes, labels, cfg), cfg)
    heads["heatmap"] = heads["heatmap"] + torch.logit(torch.tensor(0.8))  # peaks at ~0.8 instead of 1
    heads["iou"] = torch.full((1, 1, *cfg.head_shape), float(torch.logit(torch.tensor(0.6))))
    s, l, b = topk_decode(heads, cfg)
    s, l, _ = select_detections(s[0], l[0], b[0], [0.3] * 3, cfg.nms_iou, 10)
    heat = torch.sigmoid(torch.logit(torch.tensor(1 - 1e-6)) + torch.logit(torch.tensor(0.8)))
    want = {0: heat**0.5 * 0.6**0.5, 1: heat**0.75 * 0.6**0.25, 2: heat}
    assert sorted(l.tolist()) == [0, 1, 2]
    for score, label in zip(s.tolist(), l.tolist()):
        assert score == pytest.approx(float(want[label]), abs=1e-4)
    merged = merge_flipped({k: torch.cat([v, v.flip(-2)]) for k, v in heads.items()})
    assert torch.allclose(merged["iou"], heads["iou"])


def _saved_network(cfg: ModelConfig, path: Path):
    """An eval-mode network of ``cfg`` with non-trivial BatchNorm statistics, saved to ``path``."""
    net = build_model(cfg).eval()
    for m in net.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 1.5)
    save_weights(net, cfg, path)
    return net


def test_warm_start_grows_the_regression_head_and_the_input(tmp_path):
    """Weights without the IoU head and without the sub-cell x/y channels initialise a network with
    both: box rows copied, the new input channels start at zero weight, so the warm-started network
    computes the same boxes as the old one (and a fresh IoU map) until it is trained."""
    from livox_infer.detector.weights import warm_start

    torch.manual_seed(0)
    plain_cfg = _old_network_config()
    p = tmp_path / "plain.safetensors"
    plain = _saved_network(plain_cfg, p)
    cfg = _new_network_config()
    net = build_model(cfg).eval()
    fresh_iou_row = net.head.regression[1].weight[8:].clone()
    assert sorted(warm_start(net, cfg, p)) == ["backbone.stem.0.0.weight", "head.regression.1.bias", "head.regression.1.weight"]
    assert torch.equal(net.head.regression[1].weight[8:], fresh_iou_row)
    assert not net.backbone.stem[0][0].weight[:, 5:7].any()
    bev_old = torch.rand(1, *plain_cfg.grid.shape)
    bev_new = torch.cat([bev_old[:, :5], torch.rand(1, 2, *plain_cfg.grid.shape[1:]), bev_old[:, 5:]], dim=1)
    with torch.no_grad():
        old, new = plain(bev_old), net(bev_new)
    for name in ("heatmap", "offset", "z", "size", "yaw"):
        assert torch.allclose(old[name], new[name], atol=1e-5), name
    assert warm_start(build_model(plain_cfg), plain_cfg, p) == []  # same network: a plain load
    with pytest.raises(WeightsError):
        load_weights(build_model(cfg), cfg, p)  # a strict load still refuses it
    other = _new_network_config(head={**cfg.to_dict()["head"], "head_channels": 4})
    with pytest.raises(WeightsError, match="head_channels"):
        warm_start(build_model(other), other, p)


def _taller_grid_config(z_top: float, slices: int) -> ModelConfig:
    d = _new_network_config().to_dict()
    d["grid"].update(z_range=[-1.0, z_top], n_height_slices=slices)
    return ModelConfig.from_dict(d, source="test")


def test_warm_start_adds_height_slices_on_top_of_the_z_range(tmp_path):
    """Weights of a grid whose z range ends at 3 m initialise one reaching 5 m with the same 0.5 m slices: on a
    cloud below 3 m the grown network computes what the old one did (its new slices' weights start at 0 and the
    z channels' weights are rescaled to the longer z extent), points above 3 m reach it, and grids whose slices
    would change meaning are refused."""
    from livox_infer.detector.weights import warm_start
    from livox_infer.voxelize import voxelize_reference

    torch.manual_seed(2)
    old_cfg = _taller_grid_config(3.0, 8)
    p = tmp_path / "z3.safetensors"
    old = _saved_network(old_cfg, p)
    cfg = _taller_grid_config(5.0, 12)
    net = build_model(cfg).eval()
    assert warm_start(net, cfg, p) == ["backbone.stem.0.0.weight"]
    start = cfg.grid.slice_channel_start
    assert not net.backbone.stem[0][0].weight[:, start + 8:].any()
    g = torch.Generator().manual_seed(3)
    low = torch.rand(4000, 4, generator=g) * torch.tensor([25.6, 25.6, 3.9, 0.0]) - torch.tensor([0.0, 12.8, 1.0, 0.0])
    tall = low[:500] + torch.tensor([0.0, 0.0, 3.0, 0.0])  # the same cells, 2-5 m up
    with torch.no_grad():
        want = old(voxelize_reference(low, old_cfg.grid)[None])
        got = net(voxelize_reference(low, cfg.grid)[None])
        for name in want:
            assert torch.allclose(got[name], want[name], atol=1e-5), name
        seen = net(voxelize_reference(torch.cat([low, tall]), cfg.grid)[None])
        assert not torch.allclose(seen["heatmap"], want["heatmap"], atol=1e-3)
    for z_top, slices in ((5.0, 8), (4.2, 13)):  # 0.75 m slices; 0.4 m slices
        other = _taller_grid_config(z_top, slices)
        with pytest.raises(WeightsError, match="same height"):
            warm_start(build_model(other), other, p)
    lower = _new_network_config()
    d = lower.to_dict()
    d["grid"].update(z_range=[-0.5, 3.5])
    shifted = ModelConfig.from_dict(d, source="test")
    with pytest.raises(WeightsError, match="same height"):
        warm_start(build_model(shifted), shifted, p)
    with pytest.raises(WeightsError):
        load_weights(build_model(cfg), cfg, p)  # a strict load still refuses it


def test_warm_start_runs_on_another_bev_extent(tmp_path):
    """Weights trained on one BEV extent start a run on another (the network is convolutional; lite trained on 57.6 m
    and runs on 80 m): every tensor loads unchanged, nothing is grown."""
    from livox_infer.detector.weights import warm_start

    torch.manual_seed(4)
    cfg = _new_network_config()
    p = tmp_path / "near.safetensors"
    saved = _saved_network(cfg, p)
    longer = cfg.with_extent((0.0, 38.4, *cfg.grid.y_range))
    assert longer.architecture_hash() != cfg.architecture_hash()
    net = build_model(longer).eval()
    assert warm_start(net, longer, p) == []
    for k, v in saved.state_dict().items():
        assert torch.equal(net.state_dict()[k], v), k


def _residual_config(stages, head) -> ModelConfig:
    d = _new_network_config().to_dict()
    d["backbone"]["residual_blocks"] = list(stages)
    d["head"]["residual_blocks"] = head
    return ModelConfig.from_dict(d, source="test")


def test_residual_block_config_and_architecture():
    plain = _new_network_config()
    grown = _residual_config([1, 2, 0], 1)
    assert grown.residual_blocks == (1, 2, 0) and grown.head_residual_blocks == 1
    assert ModelConfig.from_dict(grown.to_dict()) == ModelConfig.from_dict(grown.to_dict())
    # configs without residual blocks keep their architecture hash (the shipped weights load)
    assert "residual_blocks" not in plain.architecture() and "head_residual_blocks" not in plain.architecture()
    assert _residual_config([0, 0, 0], 0).architecture_hash() == plain.architecture_hash()
    assert grown.architecture_hash() != plain.architecture_hash() != _residual_config([0, 2, 1], 1).architecture_hash()
    n_stages = len(plain.stage_channels)
    for bad in ([1] * (n_stages + 1), [-1] * n_stages, [0.5] * n_stages, "2"):
        with pytest.raises(ConfigError, match="residual_blocks"):
            _residual_config(bad, 0)
    with pytest.raises(ConfigError, match="head.residual_blocks"):
        _residual_config([0] * n_stages, -1)
    net = build_model(grown)
    out = net(torch.zeros(1, *grown.grid.shape))
    assert out["heatmap"].shape == (1, grown.num_classes, *grown.head_shape)
    n_res = sum(isinstance(m, ResidualBlock) for m in net.modules())
    assert n_res == 4


def test_warm_start_adds_residual_blocks_as_the_identity(tmp_path):
    """Weights without residual blocks initialise a network with them: the new blocks start as the
    identity, so the grown network gives the old outputs exactly (also with BatchNorm folded, as the
    pipeline runs it); a file with more blocks than the network is refused."""
    from livox_infer.detector.weights import warm_start

    torch.manual_seed(1)
    p = tmp_path / "small.safetensors"
    small = _saved_network(_new_network_config(), p)
    cfg = _residual_config([1, 2, 0], 1)
    grown = build_model(cfg).eval()
    added = warm_start(grown, cfg, p)
    assert added and all(".body." in k for k in added)
    assert {k.split(".body.")[0] for k in added} == {"backbone.stages.0.1", "backbone.stages.1.1", "backbone.stages.1.2", "head.blocks.0"}
    bev = torch.rand(1, *cfg.grid.shape) * (torch.rand(1, 1, *cfg.grid.shape[1:]) < 0.2)
    with torch.no_grad():
        want = small(bev)
        got = grown(bev)
        for name in want:
            assert torch.equal(got[name], want[name]), name
        # a trained block is no longer the identity, and folding BatchNorm keeps what it computes
        for m in grown.modules():
            if isinstance(m, ResidualBlock):
                m.body[4].weight.uniform_(0.5, 1.5)
        trained = grown(bev)
        assert not torch.allclose(trained["heatmap"], want["heatmap"])
        folded = fuse_batchnorm(grown)(bev)
        for name in trained:
            assert torch.allclose(folded[name], trained[name], atol=1e-4), name
    p_grown = tmp_path / "grown.safetensors"
    save_weights(build_model(cfg), cfg, p_grown)
    fewer = _residual_config([1, 1, 0], 1)
    with pytest.raises(WeightsError, match="unexpected"):
        warm_start(build_model(fewer), fewer, p_grown)
    with pytest.raises(WeightsError):
        load_weights(build_model(cfg), cfg, p)  # a strict load still refuses weights of the smaller network


def test_mirror_bev_equals_voxelizing_the_mirrored_cloud():
    """Test-time flip mirrors the BEV tensor; with the sub-cell y channel that is 1 - y in occupied
    cells, within one 1/256 step of voxelizing the mirrored cloud (rounding of the mean)."""
    from livox_infer.detector.postprocess import mirror_bev
    from livox_infer.voxelize import voxelize_reference

    for cfg in (_old_network_config(), _new_network_config()):
        g = cfg.grid
        gen = torch.Generator().manual_seed(3)
        pts = torch.rand(4000, 4, generator=gen) * torch.tensor([g.x_range[1], g.y_range[1] * 2, 2.5, 255.0])
        pts[:, 1] += g.y_range[0]
        mirrored = pts * torch.tensor([1.0, -1.0, 1.0, 1.0])
        got = mirror_bev(voxelize_reference(pts, g)[None], cfg)[0]
        want = voxelize_reference(mirrored, g)
        occupied = want[0] > 0
        assert torch.equal(got[0] > 0, occupied)
        assert torch.allclose(got, want, atol=2.0 / 512 + 1e-6)
        assert not got[:, ~occupied].any()


def test_weights_saved_before_the_backbone_neck_head_split_load_unchanged(tmp_path):
    """Files written with the pre-split tensor names (stem., stages., laterals., fuse., head_blocks., heatmap.,
    regression.) load into today's modules with the same outputs; their content hash covers the saved names."""
    from safetensors.torch import load_file, save_file

    from livox_infer.detector.network import LEGACY_PREFIXES
    from livox_infer.detector.weights import CONTENT_HASH_KEY, content_sha256, read_metadata

    cfg = ModelConfig.load("lite")
    net = build_model(cfg).eval()
    new = tmp_path / "new.safetensors"
    save_weights(net, cfg, new)
    state = load_file(str(new))
    back = {new_p: old_p for old_p, new_p in LEGACY_PREFIXES}
    legacy = {}
    for k, v in state.items():
        for new_p, old_p in back.items():
            if k.startswith(new_p):
                k = old_p + k[len(new_p):]
                break
        legacy[k] = v
    assert any(k.startswith("stem.") for k in legacy) and not any(k.startswith("backbone.") for k in legacy)
    meta = {**read_metadata(new), CONTENT_HASH_KEY: content_sha256(legacy)}
    old = tmp_path / "old.safetensors"
    save_file(legacy, str(old), metadata=meta)
    other = build_model(cfg).eval()
    load_weights(other, cfg, old)
    bev = torch.rand(1, *cfg.grid.shape)
    with torch.no_grad():
        a, b = net(bev), other(bev)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_weights_without_a_content_hash_are_refused(tmp_path):
    """Issue 30: deleting content_sha256 from the metadata let altered (sign-flipped, random) weights load."""
    from safetensors.torch import save_file

    from livox_infer.detector.weights import CONTENT_HASH_KEY, read_metadata, warm_start

    cfg = small_config()
    net = build_model(cfg)
    good = tmp_path / "good.safetensors"
    save_weights(net, cfg, good)
    meta = {k: v for k, v in read_metadata(good).items() if k != CONTENT_HASH_KEY}
    state = {k: (-v if v.is_floating_point() and not k.endswith("running_var") else v.clone())
             for k, v in net.state_dict().items()}
    bad = tmp_path / "no_hash.safetensors"
    save_file(state, str(bad), metadata=meta)
    with pytest.raises(WeightsError, match="no content hash"):
        load_weights(build_model(cfg), cfg, bad)
    assert warm_start(build_model(cfg), cfg, bad) == []  # training from an older checkpoint still works
    load_weights(build_model(cfg), cfg, good)
