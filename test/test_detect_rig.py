"""`livox-infer detect --rig / --sensor / --accumulate-frames`: merged rigs offline, presets as the node uses them,
and the real Livox Dataset rig (config/rigs/livox_dataset_v1.yaml) on its synchronised frame in ../shared."""

import argparse
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from conftest import REPO, SHARED_DATA
from livox_infer.tools import detect as detect_cli, detect_io
from livox_infer.decode.pointfiles import write_pcd
from livox_infer.params import pipeline_options
from livox_infer.presets import SENSOR_PRESETS, load_preset

torch.set_num_threads(1)
DATASET = SHARED_DATA / "livox_dataset_v1"
DATASET_RIG = REPO / "config" / "rigs" / "livox_dataset_v1.yaml"


def parse(argv):
    p = argparse.ArgumentParser()
    detect_cli.add_arguments(p)
    return p.parse_args(argv)


def test_sensor_option_applies_the_preset_as_the_node_does():
    args = parse(["x.pcd", "--out", "-", "--sensor", "tele15", "--device", "cpu", "--no-compile"])
    opts = detect_io.pipeline_kwargs(args)
    node = pipeline_options(load_preset("tele15"))
    for key in ("roi", "max_range", "tag_filter", "intensity_scale", "score_thresholds", "sensor_height", "bev_extent",
                "model", "refine", "test_time_flip"):
        assert opts[key] == node[key], key
    assert opts["device"] == "cpu" and opts["compile"] is False  # the machine's choices stay the CLI's
    assert opts["bev_extent"][1] >= 150.0  # Tele-15: its grid reaches 150 m


def test_options_given_on_the_command_line_win_over_the_preset(tmp_path):
    """`--sensor avia --no-refine --sensor-height 1.5 --tag-filter off` runs stage 1 alone at 1.5 m without the tag
    filter (the preset used to override them silently); options not given come from the preset."""
    args = parse(["x.pcd", "--out", "-", "--sensor", "avia", "--no-refine", "--sensor-height", "1.5", "--tag-filter",
                  "off", "--test-time-flip", "--model", str(tmp_path / "m.yaml")])
    opts = detect_io.pipeline_kwargs(args)
    preset = pipeline_options(load_preset("avia"))
    assert opts["refine"] is False and opts["sensor_height"] == 1.5 and opts["tag_filter"] == "off"
    assert opts["test_time_flip"] is True and opts["model"] == str(tmp_path / "m.yaml")
    assert opts["roi"] == preset["roi"] and opts["bev_extent"] == preset["bev_extent"]
    plain = detect_io.pipeline_kwargs(parse(["x.pcd", "--out", "-"]))  # no preset: the CLI's defaults
    assert plain["refine"] is True and plain["sensor_height"] == "auto" and plain["tag_filter"] == "high_confidence"
    assert "roi" not in plain


def test_eval_options_given_on_the_command_line_win_over_the_preset(monkeypatch):
    from livox_infer.evaluation import evaluate as evaluate_cli

    seen = {}
    monkeypatch.setattr("livox_infer.pipeline.DetectionPipeline", lambda **kw: seen.update(kw) or kw)
    p = argparse.ArgumentParser()
    evaluate_cli.add_arguments(p)
    evaluate_cli._pipeline(p.parse_args(["--sim-frames", "1", "--sensor", "avia", "--no-refine"]))
    assert seen["refine"] is False and seen["sensor_height"] == pipeline_options(load_preset("avia"))["sensor_height"]
    assert seen["score_thresholds"] == 0.1  # the AP ranking threshold stays the command line's
    evaluate_cli._pipeline(p.parse_args(["--sim-frames", "1", "--sensor", "avia"]))
    assert seen["refine"] is True


@pytest.mark.parametrize("sensor", SENSOR_PRESETS)
def test_every_preset_grid_is_valid_for_its_model_and_covers_its_roi(sensor):
    from livox_infer.detector.config import ModelConfig

    opts = pipeline_options(load_preset(sensor))
    cfg = ModelConfig.load(opts["model"]).with_extent(opts["bev_extent"])  # ConfigError if not a whole number of cells
    x0, x1, y0, y1 = cfg.grid.region
    rx0, ry0, _, rx1, ry1, _ = opts["roi"]
    q = cfg.extent_quantum  # the grid follows the ROI to within one coarse cell
    assert x0 <= rx0 + q and y0 <= ry0 + q and rx1 <= x1 + q and ry1 <= y1 + q


def write_rig(tmp_path: Path) -> Path:
    rig = {"output_frame": "base_link", "sensor_height": 0.0, "bev_extent": [-25.6, 25.6, -25.6, 25.6], "sensors": [
        {"name": "front", "topic": "/front", "model": "avia",
         "extrinsic": {"x": 0.0, "y": 0.0, "z": 1.6, "roll": 0.0, "pitch": 0.0, "yaw": 0.0}},
        {"name": "rear", "topic": "/rear", "model": "avia",
         "extrinsic": {"x": 0.0, "y": 0.0, "z": 1.6, "roll": 0.0, "pitch": 0.0, "yaw": 180.0}}]}
    path = tmp_path / "rig.yaml"
    path.write_text(yaml.safe_dump(rig))
    return path


def blob(centre, n=50, seed=0):
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.normal(centre, 0.2, (n, 3)), np.full((n, 1), 100.0)], 1).astype(np.float32)


def record_pipeline_input(monkeypatch) -> list:
    """Replace DetectionPipeline by a recorder of the clouds it would detect on."""
    seen = []

    class Recorder:  # stands in for the network: records what the pipeline would see
        def __init__(self, **kw):
            self.kw = kw
            from livox_infer.detector.config import ModelConfig

            self.cfg = ModelConfig.load("lite")
            if kw.get("bev_extent"):
                self.cfg = self.cfg.with_extent(kw["bev_extent"])
            self.compile_error = None

        def detect(self, cloud):
            seen.append(cloud)
            from livox_infer.pipeline import Detections

            return Detections(np.zeros((0, 7), np.float32), np.zeros(0, np.int64), np.zeros(0, np.float32), [],
                              {"total": 1.0}, stamp_ns=cloud.stamp_ns, frame_id=cloud.frame_id, sensor_height=0.0)

    import livox_infer.pipeline

    monkeypatch.setattr(livox_infer.pipeline, "DetectionPipeline", Recorder)
    return seen


def test_rig_directory_is_merged_into_the_output_frame(tmp_path, monkeypatch):
    root = tmp_path / "lidar"
    for name in ("front", "rear"):
        (root / name).mkdir(parents=True)
    write_pcd(root / "front" / "000.pcd", blob((10.0, 0.0, -1.0)))
    write_pcd(root / "rear" / "000.pcd", blob((10.0, 2.0, -1.0), seed=1))  # 10 m behind, 2 m to the right
    write_pcd(root / "front" / "001.pcd", blob((11.0, 0.0, -1.0)))  # the rear sensor missed frame 1
    seen = record_pipeline_input(monkeypatch)
    out = tmp_path / "det.jsonl"
    args = parse([str(root), "--out", str(out), "--rig", str(write_rig(tmp_path)), "--no-compile"])
    assert detect_cli.main(args) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["frame_id"] for r in rows] == ["base_link", "base_link"]
    assert len(seen[0]) == 100 and len(seen[1]) == 50  # frame 1 goes out without the rear sensor
    front, rear = seen[0].points[:50, :3].mean(0), seen[0].points[50:, :3].mean(0)
    np.testing.assert_allclose(front, (10.0, 0.0, 0.6), atol=0.1)
    np.testing.assert_allclose(rear, (-10.0, -2.0, 0.6), atol=0.1)


def test_rig_input_must_hold_a_folder_per_sensor(tmp_path, capsys):
    (tmp_path / "lidar" / "front").mkdir(parents=True)
    write_pcd(tmp_path / "lidar" / "front" / "0.pcd", blob((5.0, 0.0, 0.0)))
    args = parse([str(tmp_path / "lidar"), "--out", str(tmp_path / "o.jsonl"), "--rig", str(write_rig(tmp_path)),
                  "--no-compile"])
    assert detect_cli.main(args) == 2
    assert "no sub-folder 'rear'" in capsys.readouterr().err


@pytest.mark.skipif(not DATASET.is_dir(), reason="../shared/data/livox_dataset_v1 (real rig frame) is not present")
def test_livox_dataset_rig_gives_boxes_all_around_the_vehicle_in_base_link(tmp_path):
    out = tmp_path / "det.jsonl"
    args = parse([str(DATASET / "lidar"), "--out", str(out), "--rig", str(DATASET_RIG), "--no-compile",
                  "--device", "cpu"])
    assert detect_cli.main(args) == 0
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["frame_id"] == "base_link"
    cars = np.array([[b["x"], b["y"]] for b in row["boxes"] if b["label"] == "car"])
    # the camera images show cars ahead, beside and behind the vehicle (docs/rigs.md)
    assert (cars[:, 0] > 10).any() and (cars[:, 0] < -10).any(), cars
    assert (cars[:, 1] > 3).any() and (cars[:, 1] < -3).any(), cars
    # the close car on the left, rear-left camera: about 9 m behind, 6 m left
    assert (np.hypot(cars[:, 0] + 8.7, cars[:, 1] - 6.1) < 1.5).any(), cars


def test_eval_sensor_runs_and_scores_on_the_preset_grid():
    from livox_infer.evaluation import evaluate as evaluate_cli
    from livox_infer.detector.config import ModelConfig

    p = argparse.ArgumentParser()
    evaluate_cli.add_arguments(p)
    args = p.parse_args(["--sim-frames", "1", "--sensor", "tele15"])  # was "ambiguous option" (--sensors)
    assert evaluate_cli.eval_region(args, ModelConfig.load("lite")) == (0.0, 153.6, -19.2, 19.2)
    args = p.parse_args(["--sim-frames", "1"])
    assert evaluate_cli.eval_region(args, ModelConfig.load("lite")) == (0.0, 80.0, -28.8, 28.8)


def test_accumulate_frames_stacks_point_files(tmp_path, monkeypatch):
    for i in range(3):
        write_pcd(tmp_path / f"{i:03d}.pcd", blob((10.0 + i, 0.0, -1.0), n=20, seed=i))
    seen = record_pipeline_input(monkeypatch)
    args = parse([str(tmp_path), "--out", str(tmp_path / "o.jsonl"), "--accumulate-frames", "2", "--no-compile"])
    assert detect_cli.main(args) == 0
    assert [len(c) for c in seen] == [20, 40, 40]
    args = parse([str(tmp_path), "--out", str(tmp_path / "o.jsonl"), "--accumulate-frames", "0", "--no-compile"])
    assert detect_cli.main(args) == 2  # a ConfigError, reported


def test_eval_region_follows_the_grid_the_network_runs_on():
    """An explicit --bev-extent wins over the preset's grid for the evaluated region too (as for the pipeline)."""
    from livox_infer.detector.config import ModelConfig
    from livox_infer.evaluation import evaluate as evaluate_cli
    from livox_infer.evaluation.options import eval_region

    p = argparse.ArgumentParser()
    evaluate_cli.add_arguments(p)
    cfg = ModelConfig.load("lite")
    given = eval_region(p.parse_args(["--sim-frames", "1", "--sensor", "avia", "--bev-extent", "0", "51.2", "-25.6",
                                      "25.6"]), cfg)
    assert given == (0.0, 51.2, -25.6, 25.6)
    preset = eval_region(p.parse_args(["--sim-frames", "1", "--sensor", "avia"]), cfg)
    assert preset == cfg.with_extent(pipeline_options(load_preset("avia"))["bev_extent"]).grid.region
