"""`livox-infer detect BAG` tracks: track_id, vx, vy, yaw_rate per box in the JSONL; --no-tracking and point files
go without."""

import json

import numpy as np

from livox_infer.tools.cli import main as cli_main


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_detect_on_a_bag_writes_track_ids_and_velocities(tmp_path):
    bag = tmp_path / "drive"
    # a standing sensor: velocities relative to the sensor are over ground
    assert cli_main(["simulate", "--sensor", "avia", "--frames", "10", "--seed", "4", "--speed", "0", "--out",
                     str(bag)]) == 0
    out = tmp_path / "dets.jsonl"
    assert cli_main(["detect", str(bag), "--out", str(out), "--no-compile", "--threads", "1"]) == 0
    rows = _rows(out)
    assert len(rows) == 10
    assert all("track_id" in b for r in rows for b in r["boxes"])
    assert all(b["track_id"] == 0 for b in rows[0]["boxes"])  # nothing confirmed in the first frame
    ids = [b["track_id"] for r in rows for b in r["boxes"] if b["track_id"]]
    counts = np.bincount(ids)
    assert counts.max() >= 8  # an object followed over (nearly) the whole drive under one id
    # a box of a confirmed track has a velocity; one id per box within a frame
    for r in rows:
        tracked = [b for b in r["boxes"] if b["track_id"]]
        assert all({"vx", "vy", "yaw_rate"} <= set(b) for b in tracked)
        assert len({b["track_id"] for b in tracked}) == len(tracked)
    speeds = [np.hypot(b["vx"], b["vy"]) for r in rows[5:] for b in r["boxes"] if b["track_id"]]
    assert np.all(np.isfinite(speeds)) and np.median(speeds) < 20.0

    plain = tmp_path / "plain.jsonl"
    assert cli_main(["detect", str(bag), "--out", str(plain), "--no-compile", "--no-tracking", "--max-frames", "2"]) == 0
    assert all("track_id" not in b for r in _rows(plain) for b in r["boxes"])


def test_point_files_are_not_tracked(tmp_path):
    from livox_infer.sim.simulate import simulate_frame

    for k in range(2):
        f = simulate_frame("avia", seed=4, frame_index=k)
        np.save(tmp_path / f"scan_{k}.npy", f.points[f.valid])
    out = tmp_path / "files.jsonl"
    assert cli_main(["detect", str(tmp_path), "--out", str(out), "--no-compile"]) == 0
    assert all("track_id" not in b for r in _rows(out) for b in r["boxes"])
