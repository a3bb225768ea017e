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
    # the first frame: only boxes scoring at least tracking_confirm_score (0.7) are confirmed at once
    assert rows[0]["boxes"] and all((b["track_id"] != 0) == (b["score"] >= 0.7) for b in rows[0]["boxes"])
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


def test_simulate_writes_ground_truth_ids_velocities_and_odometry(tmp_path):
    from livox_infer.bags import read_detections, read_poses, read_tracked_objects, typestore, _open_reader
    from livox_infer.sim.simulate import simulate_drive

    bag = tmp_path / "drive"
    assert cli_main(["simulate", "--sensor", "avia", "--frames", "3", "--seed", "4", "--speed", "10",
                     "--out", str(bag)]) == 0
    frames = simulate_drive("avia", seed=4, n_frames=3, speed_mps=10.0, scene="street", period=0.1,
                            yaw_rate_dps=0.0, deskew=False)
    tracks = list(read_tracked_objects(bag))
    dets = list(read_detections(bag))
    poses = read_poses(bag, "/livox_infer/odometry")
    assert len(tracks) == len(dets) == len(poses) == 3
    for f, t, d, (stamp, pose) in zip(frames, tracks, dets, poses):
        keep = f.num_points >= 5
        assert t.ids.tolist() == f.object_ids[keep].tolist() and t.stamp_ns == d.stamp_ns == stamp
        np.testing.assert_allclose(t.velocities, f.velocities[keep], atol=1e-3)
        np.testing.assert_allclose(t.boxes[:, :6], f.boxes[keep, :6], atol=1e-3)
        np.testing.assert_allclose(pose, f.pose, atol=1e-6)
    assert len(set(tracks[0].ids.tolist()) & set(tracks[-1].ids.tolist())) >= 3  # the same objects, the same ids
    assert any(np.hypot(*v) > 1.0 for v in tracks[0].velocities)  # moving traffic
    # Detection3D.id carries the same ids
    store, reader = typestore(), _open_reader(bag)
    try:
        conn = [c for c in reader.connections if c.topic == "/livox_infer/ground_truth"]
        raw = next(iter(reader.messages(connections=conn)))[2]
        msg = store.deserialize_cdr(raw, "vision_msgs/msg/Detection3DArray")
        assert [int(x.id) for x in msg.detections] == tracks[0].ids.tolist()
    finally:
        reader.close()


def test_detect_with_odometry_gives_velocity_over_ground(tmp_path):
    from livox_infer.bags import read_tracked_objects

    bag = tmp_path / "drive"
    assert cli_main(["simulate", "--sensor", "avia", "--frames", "12", "--seed", "5", "--speed", "10",
                     "--out", str(bag)]) == 0
    gt = {t.stamp_ns: t for t in read_tracked_objects(bag)}

    def errors(jsonl):
        out = []
        for r in _rows(jsonl)[6:]:
            g = gt[r["stamp"]]
            for b in r["boxes"]:
                if b["label"] != "car" or "vx" not in b or len(g.ids) == 0:
                    continue
                d = np.hypot(g.boxes[:, 0] - b["x"], g.boxes[:, 1] - b["y"])
                if d.min() < 2.0:
                    out.append(float(np.hypot(*(np.array([b["vx"], b["vy"]]) - g.velocities[d.argmin()]))))
        return np.array(out)

    with_odom, without = tmp_path / "odom.jsonl", tmp_path / "plain.jsonl"
    assert cli_main(["detect", str(bag), "--out", str(with_odom), "--no-compile", "--topic", "/livox/lidar",
                     "--odometry-topic", "/livox_infer/odometry"]) == 0
    assert cli_main(["detect", str(bag), "--out", str(without), "--no-compile", "--topic", "/livox/lidar"]) == 0
    e_odom, e_plain = errors(with_odom), errors(without)
    assert len(e_odom) >= 10
    assert np.median(e_odom) < 1.0, e_odom  # over ground, as the ground truth
    assert np.median(e_plain) > 5.0, e_plain  # relative to a sensor driving 10 m/s


def test_detect_stacks_with_odometry_and_moves_tracked_objects_like_the_node(tmp_path, monkeypatch):
    """--accumulate-frames 3 --odometry-topic on a drive: the stack is motion-compensated with the bag's odometry, and
    (tracking, --track-motion, the default) the older points of tracked moving objects are moved as the node moves
    them; --no-track-motion leaves them."""
    import livox_infer.accumulate as accumulate

    bag = tmp_path / "drive"
    assert cli_main(["simulate", "--sensor", "avia", "--frames", "8", "--seed", "4", "--speed", "10", "--out",
                     str(bag)]) == 0
    moved, compensated = [], []
    real = accumulate.compensate_object_motion
    monkeypatch.setattr(accumulate, "compensate_object_motion",
                        lambda *a: (lambda r: (moved.append(r[1]), r)[1])(real(*a)))
    real_add = accumulate.Accumulator.add
    monkeypatch.setattr(accumulate.Accumulator, "add",
                        lambda self, cloud, pose=None: (compensated.append(pose is not None), real_add(self, cloud, pose))[1])
    out = tmp_path / "stacked.jsonl"
    base = ["detect", str(bag), "--no-compile", "--threads", "1", "--accumulate-frames", "3", "--odometry-topic",
            "/livox_infer/odometry"]
    assert cli_main(base + ["--out", str(out)]) == 0
    assert len(_rows(out)) == 8 and all(compensated) and len(compensated) == 8
    assert len(moved) == 7 and sum(moved) > 0  # every frame after the first (a tracker exists), points moved
    moved.clear()
    assert cli_main(base + ["--out", str(tmp_path / "plain.jsonl"), "--no-track-motion"]) == 0
    assert moved == []
