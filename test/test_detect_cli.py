"""`livox-infer detect` on point files: JSONL rows, BEV PNGs, Detection3DArray bag; errors."""

import argparse
import json
import re

import numpy as np
import pytest
import torch

from livox_infer.tools import detect as detect_cli, detect_io
from livox_infer.decode.pointfiles import write_bin, write_pcd

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
    from livox_infer.bags import read_clouds, read_detections

    dets = list(read_detections(tmp_path / "bag", detect_io.DETECTIONS_TOPIC))
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
    with pytest.raises(SystemExit) as exit_:  # refused while parsing, with the range (livox_infer.params)
        run([str(tmp_path / "x.txt"), "--out", str(tmp_path / "o.jsonl"), "--sensor-height", "tall"])
    assert exit_.value.code == 2 and "metres in [0.0, 9.5] or 'auto'" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: cuda is a valid device here")
def test_cuda_without_a_gpu_is_one_line_not_a_traceback(capsys):
    from livox_infer.tools.cli import main

    assert main(["bench", "voxelize", "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("livox-infer bench voxelize: ") and "no GPU" in err[0]


def _bad_weights(small_model, tmp_path, kind):  # noqa: F811
    from safetensors.torch import save_file

    from livox_infer.detector import ModelConfig, build_model
    from livox_infer.detector.weights import read_metadata

    cfg = ModelConfig.load(small_model)
    good = small_model.parent / "tiny.safetensors"
    state = {k: v.clone() for k, v in build_model(cfg).state_dict().items()}
    if kind == "int64":
        state = {k: v.to(torch.int64) for k, v in state.items()}
    else:
        state = {k: v * 1e30 if v.is_floating_point() else v for k, v in state.items()}
    meta = {k: v for k, v in read_metadata(good).items() if k != "content_sha256"}
    out = tmp_path / f"{kind}.safetensors"
    save_file(state, str(out), metadata=meta)
    return out


@pytest.mark.parametrize("kind", ["int64", "scaled"])
def test_detect_on_bad_weights_is_one_line(small_model, tmp_path, capsys, kind):  # noqa: F811
    write_bin(tmp_path / "a.bin", scene_points(seed=1))
    bag = tmp_path / "out_bag"
    argv = [str(tmp_path / "a.bin"), "--out", str(tmp_path / "o.jsonl"), "--model", str(small_model), "--no-compile",
            "--weights", str(_bad_weights(small_model, tmp_path, kind)), "--out-bag", str(bag)]
    assert run(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("livox-infer detect: ") and "Traceback" not in err[0]
    assert not bag.exists()


def test_detect_on_a_non_utf8_model_yaml_is_one_line(tmp_path, capsys):
    cfg = tmp_path / "latin1.yaml"
    cfg.write_bytes("name: caf\xe9\nclasses: [car]\n".encode("latin-1"))
    write_bin(tmp_path / "a.bin", scene_points(seed=1))
    assert run([str(tmp_path / "a.bin"), "--out", str(tmp_path / "o.jsonl"), "--model", str(cfg)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"livox-infer detect: cannot load model config {str(cfg)!r}: neither a name in models/ nor a "
                   "readable UTF-8 YAML file"]


def test_a_failed_detect_leaves_no_bag_that_blocks_the_rerun(small_model, tmp_path, capsys):  # noqa: F811
    bag = tmp_path / "out_bag"
    write_bin(tmp_path / "a.bin", scene_points(seed=1))
    common = ["--out", str(tmp_path / "o.jsonl"), "--model", str(small_model), "--no-compile", "--out-bag", str(bag)]
    assert run([str(tmp_path / "missing.bin")] + common) == 2  # fails after the bag was opened
    assert not bag.exists()
    assert run([str(tmp_path / "a.bin")] + common) == 0
    assert bag.is_dir()


def test_out_bag_storage_follows_the_name(tmp_path, small_model):  # noqa: F811
    """`--out-bag with_dets.mcap` writes an mcap bag (it used to write sqlite3 into a directory named .mcap);
    a name contradicting --out-bag-storage is refused before anything runs."""
    from livox_infer.tools.detect import out_bag_storage

    assert out_bag_storage("x.mcap", None) == "mcap"
    assert out_bag_storage("x", None) == "sqlite3" and out_bag_storage("x.db3", None) == "sqlite3"
    assert out_bag_storage("x", "mcap") == "mcap"
    pts = tmp_path / "f.npy"
    np.save(pts, np.random.default_rng(0).uniform(0, 30, (500, 4)).astype(np.float32))
    bag = tmp_path / "with_dets.mcap"
    common = ["--out", str(tmp_path / "o.jsonl"), "--model", str(small_model), "--no-compile"]
    assert run([str(pts), *common, "--out-bag", str(bag)]) == 0
    assert list(bag.glob("*.mcap")) and not list(bag.glob("*.db3"))
    assert run([str(pts), *common, "--out-bag", str(tmp_path / "b.mcap"), "--out-bag-storage", "sqlite3"]) == 2
    assert not (tmp_path / "b.mcap").exists()


def test_a_wrong_input_or_output_folder_is_one_line_before_the_pipeline_is_built(tmp_path, capsys, monkeypatch):
    """Issue 30: a wrong input path was reported after the 9-14 s pipeline build; --out into a missing folder
    gave a raw traceback."""
    from livox_infer.tools import detect as detect_tool

    def no_build(*a, **k):
        raise AssertionError("the pipeline was built before the paths were checked")

    monkeypatch.setattr(detect_tool, "build_pipeline", no_build)
    write_bin(tmp_path / "a.bin", scene_points(seed=1))
    assert run([str(tmp_path / "typo.bin"), "--out", str(tmp_path / "o.jsonl")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"livox-infer detect: input not found: {tmp_path / 'typo.bin'}"]
    for flag in ("--out", "--out-bag"):
        argv = [str(tmp_path / "a.bin"), "--out", str(tmp_path / "o.jsonl")]
        if flag == "--out":
            argv[2] = str(tmp_path / "no" / "o.jsonl")
        else:
            argv += ["--out-bag", str(tmp_path / "no" / "bag")]
        assert run(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"folder {tmp_path / 'no'} does not exist" in err[0] and flag in err[0], err


def test_a_bag_that_does_not_open_is_one_line_before_the_pipeline_is_built(tmp_path, capsys, monkeypatch):
    """Issue 30: a damaged metadata.yaml gave a 4-line message, after the pipeline build."""
    from livox_infer.tools import detect as detect_tool

    monkeypatch.setattr(detect_tool, "build_pipeline", lambda *a, **k: pytest.fail("built before the check"))
    bag = tmp_path / "drive"
    bag.mkdir()
    (bag / "metadata.yaml").write_text("rosbag2_bagfile_information: [\n")
    assert run([str(bag), "--out", str(tmp_path / "o.jsonl")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"livox-infer detect: cannot open bag {bag}: "), err


def test_a_sensor_height_far_from_the_clouds_ground_is_one_warning(small_model, tmp_path, capsys):  # noqa: F811
    write_bin(tmp_path / "low.bin", scene_points(height=0.8, seed=3))  # a sensor 0.8 m above the ground
    out = tmp_path / "det.jsonl"
    base = [str(tmp_path / "low.bin"), "--out", str(out), "--model", str(small_model), "--no-compile"]
    assert run(base + ["--sensor-height", "1.8"]) == 0
    err = capsys.readouterr().err
    assert re.search(r"WARNING: 1 of 1 frames: sensor_height is 1\.80 m but the clouds' ground lies 0\.8\d m below", err), err
    assert re.search(r"pass --sensor-height 0\.8\d or auto", err), err
    assert run(base + ["--sensor-height", "auto"]) == 0  # estimated: nothing to warn about
    assert "WARNING" not in capsys.readouterr().err
    assert run(base + ["--sensor-height", "1.1"]) == 0  # 0.3 m off: within what the network tolerates
    assert "WARNING" not in capsys.readouterr().err
