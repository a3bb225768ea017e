"""`livox-infer detect` on point files: JSONL rows, BEV PNGs, Detection3DArray bag; errors."""

import argparse
import json

import numpy as np
import pytest
import torch

from livox_infer import detect_cli
from livox_infer.pointfiles import write_bin, write_pcd

from test_pipeline import scene_points, small_model  # noqa: F401 - fixture reuse

torch.set_num_threads(1)


def run(argv):
    p = argparse.ArgumentParser()
    detect_cli.add_arguments(p)
    return detect_cli.main(p.parse_args(argv))


def test_detect_point_files_to_jsonl_png_and_bag(small_model, tmp_path, capsys):  # noqa: F811
    d = tmp_path / "scans"
    d.mkdir()
    write_pcd(d / "a.pcd", scene_points(seed=1))
    write_bin(d / "b.bin", scene_points(seed=2))
    out = tmp_path / "det.jsonl"
    rc = run([str(d), "--out", str(out), "--model", str(small_model), "--no-compile", "--score-threshold", "0.0",
              "--sensor-height", "1.6", "--bev-dir", str(tmp_path / "bev"), "--out-bag", str(tmp_path / "bag")])
    assert rc == 0
    assert "pipeline ready (weights " in capsys.readouterr().err  # start-up phases with their seconds
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["source"] for r in rows] == ["a.pcd", "b.bin"]
    for r in rows:
        assert {"stamp", "frame_id", "latency_ms", "boxes"} <= set(r)
        assert r["boxes"] and set(r["boxes"][0]) == {"label", "score", "x", "y", "z", "l", "w", "h", "yaw"}
    assert sorted(p.name for p in (tmp_path / "bev").iterdir()) == ["frame_000000.png", "frame_000001.png"]
    from livox_infer.bag import read_clouds, read_detections

    dets = list(read_detections(tmp_path / "bag", detect_cli.DETECTIONS_TOPIC))
    assert len(dets) == 2 and len(dets[0].boxes) == len(rows[0]["boxes"])
    assert np.allclose(dets[0].boxes[:, 0], [b["x"] for b in rows[0]["boxes"]], atol=1e-3)
    assert len(list(read_clouds(tmp_path / "bag"))) == 2


def test_detect_errors_are_reported_not_raised(small_model, tmp_path, capsys):  # noqa: F811
    assert run([str(tmp_path / "missing.pcd"), "--out", str(tmp_path / "o.jsonl"), "--model", str(small_model),
                "--no-compile"]) == 2
    assert "not found" in capsys.readouterr().err
    (tmp_path / "x.txt").write_text("hello")
    assert run([str(tmp_path / "x.txt"), "--out", str(tmp_path / "o.jsonl"), "--model", str(small_model),
                "--no-compile"]) == 2
    assert run([str(tmp_path / "x.txt"), "--out", str(tmp_path / "o.jsonl"), "--sensor-height", "tall"]) == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: cuda is a valid device here")
def test_cuda_without_a_gpu_is_one_line_not_a_traceback(capsys):
    from livox_infer.cli import main

    assert main(["bench", "voxelize", "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("livox-infer bench voxelize: ") and "no GPU" in err[0]
