"""`livox-infer detect --out-dir`: an archive of inputs, one output each, a resumable manifest (livox_infer/tools/fleet.py);
`livox-infer eval ARCHIVE --detections-dir`: AP per bag and pooled."""

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from livox_infer.tools import detect as detect_cli, detect_io, fleet
from livox_infer.bags import BagWriter, read_detections
from livox_infer.decode.pointcloud import encode_pointcloud2
from livox_infer.decode.pointfiles import write_bin, write_pcd

from test_pipeline import scene_points, small_model  # noqa: F401 - fixture reuse

torch.set_num_threads(1)
TIMING_KEYS = ("latency_ms", "timings_ms")


def run(argv):
    p = argparse.ArgumentParser()
    detect_cli.add_arguments(p)
    return detect_cli.main(p.parse_args(argv))


def make_archive(root: Path) -> Path:
    """Two point files, a two-frame bag in a subfolder and one damaged file."""
    (root / "day1").mkdir(parents=True)
    write_pcd(root / "a.pcd", scene_points(seed=1))
    np.save(root / "day1" / "c.npy", scene_points(seed=3))
    with BagWriter(root / "day1" / "drive") as w:
        for i in range(2):
            w.write_cloud("/livox/lidar", encode_pointcloud2(scene_points(seed=10 + i), "xyzi", stamp_ns=1000 + i,
                                                             frame_id="livox_frame"))
    (root / "day1" / "broken.bin").write_bytes(b"\x00" * 10)  # not a multiple of 16 bytes
    return root


def rows(path: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING_KEYS}
            for line in path.read_text().splitlines()]


def manifest(out: Path) -> dict[str, dict]:
    return {r["name"]: r for r in map(json.loads, (out / fleet.MANIFEST_NAME).read_text().splitlines())}


def test_discover_searches_directories_expands_lists_and_skips_the_output_dir(tmp_path):
    root = tmp_path / "archive"
    (root / "2024" / "bag1").mkdir(parents=True)
    (root / "2024" / "bag1" / "metadata.yaml").write_text("x")
    (root / "2024" / "bag1" / "bag1.db3").write_text("x")  # inside a bag: part of it, not an input
    (root / "2024" / "scan.pcd").write_text("x")
    (root / "2024" / "notes.txt").write_text("x")
    (root / "single.mcap").write_text("x")
    (root / "s.npy").write_text("x")
    (root / "results" / "old").mkdir(parents=True)
    (root / "results" / "old" / "metadata.yaml").write_text("x")  # an annotated output bag of an earlier run
    jobs = fleet.discover([str(root)], skip=(root / "results").resolve())
    assert [j.name for j in jobs] == ["2024/bag1", "2024/scan.pcd", "s.npy", "single.mcap"]
    assert jobs[0].input == str((root / "2024" / "bag1").resolve())
    lst = tmp_path / "list.txt"
    lst.write_text("# my bags\narchive/2024/bag1\n\narchive/s.npy\narchive/missing.bin\n")
    named = fleet.discover([f"@{lst}"])
    assert [j.name for j in named] == ["2024/bag1", "s.npy", "missing.bin"]  # a missing input is a job: it fails
    assert [j.name for j in fleet.discover([], inputs_from=str(lst))] == [j.name for j in named]


def test_archive_run_one_output_per_input_failures_recorded_and_resumed(small_model, tmp_path, capsys):  # noqa: F811
    archive = make_archive(tmp_path / "archive")
    out = tmp_path / "out"
    argv = [str(archive), "--out-dir", str(out), "--model", str(small_model), "--no-compile", "--score-threshold",
            "0.0", "--sensor-height", "1.6", "--annotated-bags"]
    assert run(argv) == 1  # one input failed: reported, the others done
    m = manifest(out)
    assert set(m) == {"a.pcd", "day1/c.npy", "day1/drive", "day1/broken.bin"}
    assert m["day1/broken.bin"]["status"] == "failed" and "PointCloudError" in m["day1/broken.bin"]["error"]
    assert not (out / "day1" / "broken.bin.jsonl").exists() and not list(out.rglob("*.part"))
    drive = m["day1/drive"]
    assert drive["status"] == "ok" and drive["frames"] == 2 and drive["model"] == "tiny"
    assert len(drive["weights_sha256"]) == 64
    assert drive["boxes"] == sum(len(r["boxes"]) for r in rows(out / "day1" / "drive.jsonl"))
    assert [r["stamp"] for r in rows(out / "day1" / "drive.jsonl")] == [1000, 1001]
    assert len(list(read_detections(out / "day1" / "drive.annotated", detect_io.DETECTIONS_TOPIC))) == 2
    assert "failed: day1/broken.bin" in capsys.readouterr().err

    # the same rows as the one-input command on that input
    assert run([str(archive / "a.pcd"), "--out", str(tmp_path / "a.jsonl"), "--model", str(small_model),
                "--no-compile", "--score-threshold", "0.0", "--sensor-height", "1.6"]) == 0
    assert rows(out / "a.pcd.jsonl") == rows(tmp_path / "a.jsonl")

    # rerun: done inputs are skipped, the failed one is retried
    (archive / "day1" / "broken.bin").unlink()
    write_bin(archive / "day1" / "broken.bin", scene_points(seed=4))
    before = (out / "a.pcd.jsonl").stat().st_mtime_ns
    assert run(argv) == 0
    assert "3 already done" in capsys.readouterr().err
    assert manifest(out)["day1/broken.bin"]["status"] == "ok"
    assert (out / "a.pcd.jsonl").stat().st_mtime_ns == before
    lines = (out / fleet.MANIFEST_NAME).read_text().splitlines()
    assert len(lines) == 5

    # other settings: everything is detected again
    assert run(argv[:-4] + ["0.5", "--sensor-height", "1.6", "--annotated-bags"]) == 0
    assert "0 already done" in capsys.readouterr().err
    assert len((out / fleet.MANIFEST_NAME).read_text().splitlines()) == 9


@pytest.mark.slow  # builds the pipeline for each option set: ~6 s
def test_archive_options_are_checked(small_model, tmp_path, capsys, monkeypatch):  # noqa: F811
    (tmp_path / "a.pcd").write_text("x")
    monkeypatch.setitem(sys.modules, "ray", None)  # as if the optional extra were not installed
    assert run([str(tmp_path), "--out-dir", str(tmp_path / "o"), "--ray"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install -r requirements-ray.txt" in err[0]
    monkeypatch.undo()
    assert run([str(tmp_path), "--ray"]) == 2
    assert "need --out-dir" in capsys.readouterr().err
    assert run([str(tmp_path), "--out-dir", str(tmp_path / "o"), "--out", "x.jsonl"]) == 2
    assert run([str(tmp_path / "empty"), "--out-dir", str(tmp_path / "o"), "--model", str(small_model)]) == 1
    assert run([str(tmp_path), "--out-dir", str(tmp_path / "o"), "--threads", "0"]) == 2
    assert run([str(tmp_path), "--out-dir", str(tmp_path / "o"), "--weights", str(tmp_path / "none.safetensors"),
                "--model", str(small_model)]) == 2
    assert "weights not found" in capsys.readouterr().err
    assert run(["--out", str(tmp_path / "x.jsonl")]) == 2  # no input at all


def _gt_bag(path: Path, stamps, box) -> None:
    with BagWriter(path) as w:
        for stamp in stamps:
            w.write_cloud("/livox/lidar", encode_pointcloud2(scene_points(seed=stamp), "xyzi", stamp_ns=stamp,
                                                             frame_id="livox_frame"))
            w.write_detections("/livox_infer/ground_truth", stamp, "livox_frame", np.asarray([box], np.float32), [0])


def _detections(path: Path, stamps, box, score: float) -> None:
    keys = ("x", "y", "z", "l", "w", "h", "yaw")
    row = lambda s: {"stamp": s, "boxes": [{"label": "car", "score": score, **dict(zip(keys, box))}]}  # noqa: E731
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row(s)) + "\n" for s in stamps))


def test_eval_over_an_archive_per_bag_and_pooled(tmp_path, capsys):
    from livox_infer.tools.cli import main as cli_main

    car = [12.0, 2.0, -0.75, 4.0, 2.0, 1.5, 0.0]  # around the car points of scene_points (height 1.6)
    elsewhere = [20.0, -8.0, -0.75, 4.0, 2.0, 1.5, 0.0]
    archive, dets = tmp_path / "archive", tmp_path / "dets"
    _gt_bag(archive / "good", [1, 2], car)
    _gt_bag(archive / "site2" / "bad", [3, 4], car)
    _gt_bag(archive / "undetected", [5], car)
    write_pcd(archive / "scan.pcd", scene_points())  # no ground truth: not part of the evaluation
    _detections(dets / "good.jsonl", [1, 2], car, 0.9)  # every car found
    _detections(dets / "site2" / "bad.jsonl", [3, 4], elsewhere, 0.5)  # every car missed, lower scores
    out = tmp_path / "res.json"
    rc = cli_main(["eval", str(archive), "--detections-dir", str(dets), "--out", str(out)])
    assert rc == 1  # one bag could not be evaluated: reported, the others were
    res = json.loads(out.read_text())
    assert set(res["bags"]) == {"good", "site2/bad"} and "no detections" in res["failed"]["undetected"]
    assert res["bags"]["good"]["ap"]["car"]["bev@0.7"] == 1.0
    assert res["bags"]["site2/bad"]["ap"]["car"]["bev@0.7"] == 0.0
    # pooled: 4 cars, the 2 found rank first (score 0.9): precision 1 up to recall 0.5 -> AP R40 = 20/40
    assert res["pooled"]["num_frames"] == 4 and res["pooled"]["num_gt"]["car"] == 4
    assert res["pooled"]["ap"]["car"]["bev@0.7"] == 0.5
    assert "pooled (2 bags)" in capsys.readouterr().out


def test_bench_fleet_prints_frames_per_second(small_model, tmp_path, capsys):  # noqa: F811
    from livox_infer.tools.cli import main as cli_main

    write_pcd(tmp_path / "a.pcd", scene_points(seed=1))
    write_bin(tmp_path / "b.bin", scene_points(seed=2))
    assert cli_main(["bench", "fleet", str(tmp_path), "--workers", "1", "--no-ray", "--model", str(small_model)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "2 inputs, 2 frames" in out[-3]
    executor, workers, threads, _, _, rate = out[-1].rsplit(maxsplit=5)
    assert executor == "this process" and (workers, threads) == ("1", "1") and float(rate) > 0


def test_file_options_reach_the_workers_as_absolute_paths(small_model, tmp_path, monkeypatch):  # noqa: F811
    """A worker on another node has another working directory; the settings hash must not depend on it either."""
    p = argparse.ArgumentParser()
    detect_cli.add_arguments(p)
    absolute = fleet.settings_for(p.parse_args([str(tmp_path), "--out-dir", "o", "--model", str(small_model)]))
    monkeypatch.chdir(small_model.parent)
    relative = fleet.settings_for(p.parse_args([str(tmp_path), "--out-dir", "o", "--model", small_model.name]))
    assert relative.detect_args["model"] == str(small_model.resolve())
    assert relative.identity == absolute.identity


def test_one_corrupt_message_keeps_the_good_frames_of_a_recording(small_model, tmp_path, capsys):  # noqa: F811
    """Issue 30: one undecodable message marked the whole recording failed with 0 frames."""
    from livox_infer.bags import POINTCLOUD2, read_clouds
    from livox_infer.errors import PointCloudError

    archive = tmp_path / "archive"
    archive.mkdir()
    with BagWriter(archive / "drive") as w:
        for i in range(4):
            if i == 1:  # a damaged message between good ones: not even a CDR header
                w.write_raw("/livox/lidar", POINTCLOUD2, b"\x00\x01garbage", 1000 + i)
                continue
            w.write_cloud("/livox/lidar", encode_pointcloud2(scene_points(seed=20 + i), "xyzi", stamp_ns=1000 + i,
                                                             frame_id="livox_frame"))
    with pytest.raises(PointCloudError, match="cannot deserialize"):  # by default a bad message still raises
        list(read_clouds(archive / "drive"))
    out = tmp_path / "out"
    assert run([str(archive), "--out-dir", str(out), "--model", str(small_model), "--no-compile",
                "--sensor-height", "1.6"]) == 0
    row = manifest(out)["drive"]
    assert row["status"] == "ok" and row["frames"] == 3 and row["bad_messages"] == 1
    assert "message 1" in row["first_bad_message"] and "cannot deserialize PointCloud2" in row["first_bad_message"]
    assert [r["stamp"] for r in rows(out / "drive.jsonl")] == [1000, 1002, 1003]
    assert "kept the good frames of drive: 1 bad messages skipped" in capsys.readouterr().err


def test_a_manifest_line_cut_by_a_killed_run_costs_only_its_own_job(tmp_path):
    """Issue 30: the next row was appended to the cut line, so that job's row was unreadable too (one more redo)."""
    path = tmp_path / fleet.MANIFEST_NAME
    path.write_text(json.dumps({"name": "a", "status": "ok"}) + "\n" + '{"name": "b", "sta')  # killed mid-line
    m = fleet.Manifest(path)
    assert m.unreadable == 1 and set(m.last) == {"a"}
    m.append({"name": "c", "status": "ok"})
    again = fleet.Manifest(path)
    assert again.unreadable == 1 and set(again.last) == {"a", "c"}
