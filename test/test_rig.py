"""Rig files, extrinsics, merging by stamp, accumulation (with and without odometry) and deskew."""

import math

import numpy as np
import pytest

from livox_infer.accumulate import Accumulator, PoseBuffer, deskew, interpolate_pose, pose_matrix
from livox_infer.errors import ConfigError
from livox_infer.decode.pointcloud import Cloud
from livox_infer.rig import (
    FrameAssembler,
    Rig,
    RigMerger,
    rotation_rpy,
    transform_cloud,
    transform_from_xyz_rpy,
)

MS = 1_000_000


def rig_dict(**over):
    d = {"output_frame": "base_link", "merge_tolerance_ms": 30.0, "sensors": [
        {"name": "left", "topic": "/livox/left", "model": "horizon",
         "extrinsic": {"x": 1.0, "y": 2.0, "z": 1.5, "roll": 0.0, "pitch": 0.0, "yaw": 90.0}},
        {"name": "tele", "topic": "/livox/tele", "model": "tele15",
         "matrix": [[1, 0, 0, 0.5], [0, 1, 0, 0], [0, 0, 1, 1.9], [0, 0, 0, 1]]},
    ]}
    d.update(over)
    return d


def cloud(xyz, stamp_ms=0, time=None, frame="sensor"):
    pts = np.zeros((len(xyz), 4), np.float32)
    pts[:, :3] = xyz
    return Cloud(pts, None if time is None else np.asarray(time, np.float64), None, int(stamp_ms * MS), frame)


# ---------------------------------------------------------------- extrinsics
def test_transform_matches_a_hand_computed_point():
    # sensor yawed 90 deg left, 1 m forward, 2 m left, 1.5 m up: its x axis points along the vehicle's +y,
    # so a point 10 m ahead of the sensor (10, 0, 0) lies at (1, 2 + 10, 1.5) in base_link.
    rig = Rig.from_dict(rig_dict())
    out = transform_cloud(cloud([[10.0, 0.0, 0.0], [0.0, 3.0, -1.5]]), rig.sensor("left").extrinsic, "base_link")
    np.testing.assert_allclose(out.points[:, :3], [[1.0, 12.0, 1.5], [-2.0, 2.0, 0.0]], atol=1e-5)
    assert out.frame_id == "base_link"


def test_roll_pitch_yaw_order_is_z_y_x():
    # pitch 90 then yaw 90 (Rz @ Ry): x -> -z under the pitch, then unchanged by the yaw
    r = rotation_rpy(0.0, 90.0, 90.0)
    np.testing.assert_allclose(r @ [1, 0, 0], [0, 0, -1], atol=1e-12)
    np.testing.assert_allclose(r @ [0, 1, 0], [-1, 0, 0], atol=1e-12)
    # roll 90 alone: y -> z
    np.testing.assert_allclose(rotation_rpy(90.0, 0.0, 0.0) @ [0, 1, 0], [0, 0, 1], atol=1e-12)


def test_matrix_extrinsic_is_used_as_given():
    rig = Rig.from_dict(rig_dict())
    out = transform_cloud(cloud([[100.0, 1.0, 0.0]]), rig.sensor("tele").extrinsic, "base_link")
    np.testing.assert_allclose(out.points[0, :3], [100.5, 1.0, 1.9], atol=1e-4)


@pytest.mark.parametrize("change, message", [
    ({"output_frame": ""}, "output_frame"),
    ({"sensors": []}, "non-empty list"),
    ({"bev_extent": [0, 1]}, "bev_extent"),
    ({"merge_tolerance_ms": -1}, "merge_tolerance_ms"),
    ({"frames": 3}, "unknown keys"),
])
def test_bad_rig_files_give_clear_config_errors(change, message):
    with pytest.raises(ConfigError, match=message):
        Rig.from_dict(rig_dict(**change))


@pytest.mark.parametrize("sensor_change, message", [
    ({"model": "velodyne"}, "model must be one of"),
    ({"topic": "livox"}, "absolute topic"),
    ({"extrinsic": {"x": 0, "y": 0, "z": 0, "roll": 0, "pitch": 0}}, "extrinsic needs exactly"),
    ({"extrinsic": {"x": 0, "y": 0, "z": "high", "roll": 0, "pitch": 0, "yaw": 0}}, "extrinsic.z"),
    ({"matrix": [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]}, "exactly one of"),
])
def test_bad_sensor_entries_name_the_sensor(sensor_change, message):
    d = rig_dict()
    d["sensors"][0].update(sensor_change)
    with pytest.raises(ConfigError, match=message) as info:
        Rig.from_dict(d)
    assert "left" in str(info.value)


def test_matrix_must_be_a_rigid_transform():
    d = rig_dict()
    d["sensors"][1]["matrix"] = [[2, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]
    with pytest.raises(ConfigError, match="not a rotation"):
        Rig.from_dict(d)


def test_duplicate_names_and_missing_file(tmp_path):
    d = rig_dict()
    d["sensors"][1]["name"] = "left"
    with pytest.raises(ConfigError, match="unique"):
        Rig.from_dict(d)
    with pytest.raises(ConfigError, match="not found"):
        Rig.load(tmp_path / "none.yaml")


# ---------------------------------------------------------------- merging by stamp
def test_clouds_within_tolerance_merge_into_one_frame():
    m = RigMerger(["a", "b"], "base_link", tolerance_ms=30.0)
    assert m.add("a", cloud([[1, 0, 0]], stamp_ms=1000)) == []
    (frame,) = m.add("b", cloud([[2, 0, 0], [3, 0, 0]], stamp_ms=1020))
    assert frame.sensors == ("a", "b") and frame.missing == ()
    assert frame.cloud.frame_id == "base_link" and frame.cloud.stamp_ns == 1000 * MS and len(frame.cloud) == 3


def test_cloud_outside_tolerance_starts_the_next_frame_and_the_open_one_goes_out_partial():
    m = RigMerger(["a", "b"], "base_link", tolerance_ms=30.0)
    m.add("a", cloud([[1, 0, 0]], stamp_ms=1000))
    (partial,) = m.add("b", cloud([[2, 0, 0]], stamp_ms=1100))  # 100 ms later: not the same frame
    assert partial.sensors == ("a",) and partial.missing == ("b",) and len(partial.cloud) == 1
    (full,) = m.add("a", cloud([[3, 0, 0]], stamp_ms=1110))
    assert full.sensors == ("a", "b") and full.cloud.stamp_ns == 1100 * MS
    assert m.stats.partial == 1 and m.stats.missing == {"a": 0, "b": 1} and m.stats.frames == 2


def test_late_sensor_is_counted_and_dropped():
    m = RigMerger(["a", "b"], "base_link", tolerance_ms=30.0)
    m.add("a", cloud([[1, 0, 0]], stamp_ms=1000))
    m.add("b", cloud([[1, 0, 0]], stamp_ms=1005))  # frame 1000 complete
    assert m.add("b", cloud([[9, 9, 9]], stamp_ms=1010)) == []  # its frame is gone: late
    m.add("a", cloud([[1, 0, 0]], stamp_ms=1100))
    assert m.add("b", cloud([[9, 9, 9]], stamp_ms=1000)) == []  # older than the open frame: late
    (frame,) = m.add("b", cloud([[2, 0, 0]], stamp_ms=1098))
    assert m.stats.late == 2 and frame.sensors == ("a", "b")
    assert not np.any(frame.cloud.points[:, 0] == 9)
    assert m.flush() == []


def test_merged_times_are_rebased_on_the_earliest_stamp():
    m = RigMerger(["a", "b"], "base_link", tolerance_ms=30.0)
    m.add("a", cloud([[1, 0, 0]], stamp_ms=1010, time=[0.05]))
    (frame,) = m.add("b", cloud([[2, 0, 0]], stamp_ms=1000, time=[0.01]))
    assert frame.cloud.stamp_ns == 1000 * MS
    np.testing.assert_allclose(frame.cloud.time, [0.06, 0.01])


# ---------------------------------------------------------------- accumulation
def wall_scan(ego_x: float, stamp_ms: float, n: int = 200, seed: int = 0):
    """A wall at x = 20 (world) across y, seen from a sensor standing at x = ego_x (sensor frame = world - ego)."""
    rng = np.random.default_rng(seed)
    y = rng.uniform(-5, 5, n)
    z = rng.uniform(0, 2, n)
    return cloud(np.stack([np.full(n, 20.0 - ego_x), y, z], 1), stamp_ms=stamp_ms)


def pose_x(x):
    p = np.eye(4)
    p[0, 3] = x
    return p


def test_accumulation_without_poses_stacks_frames_as_they_are():
    acc = Accumulator(frames=3)
    for i in range(3):
        out = acc.add(wall_scan(0.0, 100 * i, seed=i))
    assert len(out) == 600 and out.stamp_ns == 200 * MS
    np.testing.assert_allclose(out.points[:, 0], 20.0)  # standing sensor: plain stacking is right
    assert acc.plain == 1 + 2 and acc.compensated == 0  # older frames stacked, summed over the calls


def test_a_static_wall_stays_sharp_when_the_ego_moves_and_poses_are_given():
    speed = 10.0  # m/s: 1 m per 100 ms frame
    with_poses, plain = Accumulator(frames=5), Accumulator(frames=5)
    for i in range(5):
        scan = wall_scan(speed * 0.1 * i, 100 * i, seed=i)
        sharp = with_poses.add(scan, pose_x(speed * 0.1 * i))
        smeared = plain.add(scan)
    # newest pose: x = 4 m, so the wall is 16 m ahead; every older frame lands there too
    np.testing.assert_allclose(sharp.points[:, 0], 16.0, atol=1e-4)
    assert np.ptp(smeared.points[:, 0]) == pytest.approx(4.0, abs=1e-4)  # without poses: a 4 m smear
    assert with_poses.compensated == 1 + 2 + 3 + 4


def test_frame_count_and_time_window_limit_the_history():
    acc = Accumulator(frames=10, window_ms=250.0)
    for i in range(6):
        out = acc.add(wall_scan(0.0, 100 * i, n=10, seed=i))
    assert len(out) == 30  # 300, 400, 500 ms: within 250 ms of the newest
    acc = Accumulator(frames=2)
    for i in range(6):
        out = acc.add(wall_scan(0.0, 100 * i, n=10, seed=i))
    assert len(out) == 20
    out = acc.add(wall_scan(0.0, 0, n=10))  # time went back (bag loop): start over
    assert len(out) == 10


def test_a_stalled_stream_restarts_the_stack_instead_of_stacking_stale_frames():
    # issue 30: with no time limit (accumulate_ms 0, the default) frames from before a 1000 s gap were stacked
    acc = Accumulator(frames=3)
    acc.add(wall_scan(0.0, 0, n=10, seed=0))
    acc.add(wall_scan(0.0, 100, n=10, seed=1))
    out = acc.add(wall_scan(0.0, 1_000_100, n=10, seed=2))
    assert len(out) == 10 and acc.gap_resets == 1
    assert len(acc.add(wall_scan(0.0, 1_000_200, n=10, seed=3))) == 20  # stacking goes on after the gap
    acc = Accumulator(frames=3)
    acc.add(wall_scan(0.0, 0, n=10, seed=0))
    assert len(acc.add(wall_scan(0.0, 1000, n=10, seed=1))) == 20 and acc.gap_resets == 0  # 1 s: still stacked


@pytest.mark.parametrize("position", [(float("nan"), 0.0, 0.0), (0.0, float("inf"), 0.0), (0.0, 0.0, -float("inf")),
                                      (1e308, 0.0, 0.0)])
def test_a_non_finite_odometry_position_is_refused(position):
    # issue 30: only the quaternion was checked; a NaN position left 0 usable points in the stacked cloud
    with pytest.raises(ConfigError, match="position is not finite or beyond"):
        pose_matrix(position, (0.0, 0.0, 0.0, 1.0))


@pytest.mark.parametrize("frames, ms", [(0, 0.0), (1.5, 0.0), (1, -1.0), (1, float("nan")), (True, 0.0)])
def test_bad_accumulation_settings_are_config_errors(frames, ms):
    with pytest.raises(ConfigError, match="accumulate_"):
        Accumulator(frames, ms)


def test_deskew_moves_points_to_the_pose_at_the_stamp():
    # ego drives +x at 10 m/s; a point measured 50 ms into the frame was seen from 0.5 m further on, so the
    # wall at 20 m looked 19.5 m away; deskewed it is 20 m from the pose at the stamp.
    motion = pose_x(1.0)  # the last 100 ms
    skewed = cloud([[20.0, 0, 0], [19.5, 1, 0]], stamp_ms=100, time=[0.0, 0.05])
    out = deskew(skewed, motion, 0.1)
    np.testing.assert_allclose(out.points[:, 0], [20.0, 20.0], atol=1e-5)


def test_deskew_with_rotation_follows_the_turn():
    # turning left 90 deg/s: after 0.5 s of a 1 s motion the sensor has turned 45 deg
    turn = transform_from_xyz_rpy(0, 0, 0, 0, 0, 90)
    out = deskew(cloud([[10.0, 0, 0]], time=[0.5]), turn, 1.0)
    np.testing.assert_allclose(out.points[0, :3], [10 / math.sqrt(2), 10 / math.sqrt(2), 0], atol=1e-4)


def test_accumulator_deskews_when_poses_and_point_times_are_known():
    acc = Accumulator(frames=1)
    acc.add(cloud([[20.0, 0, 0]], stamp_ms=0, time=[0.0]), pose_x(0.0))
    out = acc.add(cloud([[18.5, 0, 0]], stamp_ms=100, time=[0.05]), pose_x(1.0))  # seen from x = 1.5
    np.testing.assert_allclose(out.points[0, 0], 19.0, atol=1e-5)  # the wall 19 m from the pose at x = 1


def test_pose_buffer_interpolates_and_refuses_far_stamps():
    buf = PoseBuffer()
    assert buf.at(0) is None
    buf.add(0, pose_x(0.0))
    buf.add(100 * MS, pose_matrix((1.0, 0.0, 0.0), (0.0, 0.0, math.sin(math.pi / 8), math.cos(math.pi / 8))))
    mid = buf.at(50 * MS)
    np.testing.assert_allclose(mid[:3, 3], [0.5, 0, 0], atol=1e-9)
    np.testing.assert_allclose(mid[:3, :3], rotation_rpy(0, 0, 22.5), atol=1e-9)
    assert buf.at(2000 * MS) is None
    np.testing.assert_allclose(interpolate_pose(pose_x(0), pose_x(2), 0.25)[0, 3], 0.5)


# ---------------------------------------------------------------- assembler: transform + merge + accumulate
def test_assembler_moves_sensors_into_the_output_frame_merges_and_accumulates():
    rig = Rig.from_dict(rig_dict())
    asm = FrameAssembler(rig, accumulate_frames=2)
    assert asm.add("left", cloud([[10.0, 0, 0]], stamp_ms=0)) == []
    (first,) = asm.add("tele", cloud([[100.0, 0, 0]], stamp_ms=10))
    np.testing.assert_allclose(first.points[:, :3], [[1, 12, 1.5], [100.5, 0, 1.9]], atol=1e-4)
    assert first.frame_id == "base_link"
    asm.add("left", cloud([[10.0, 0, 0]], stamp_ms=100))
    (second,) = asm.add("tele", cloud([[100.0, 0, 0]], stamp_ms=100))
    assert len(second) == 4 and second.stamp_ns == 100 * MS
    with pytest.raises(ConfigError, match="unknown rig sensor"):
        asm.add("rear", cloud([[1, 0, 0]]))


def test_a_resent_frame_replaces_itself():
    acc = Accumulator(frames=3)
    acc.add(wall_scan(0.0, 0, n=10))
    acc.add(wall_scan(0.0, 100, n=10))
    assert len(acc.add(wall_scan(0.0, 100, n=10))) == 20


def test_the_first_frame_is_deskewed_once_the_next_pose_gives_its_motion():
    acc = Accumulator(frames=2)
    acc.add(cloud([[19.5, 0, 0]], stamp_ms=0, time=[0.05]), pose_x(0.0))  # seen from x = 0.5: wall 20 m from x = 0
    out = acc.add(cloud([[19.0, 0, 0]], stamp_ms=100, time=[0.0]), pose_x(1.0))
    np.testing.assert_allclose(out.points[:, 0], [19.0, 19.0], atol=1e-5)  # both: the wall 19 m from x = 1


def test_time_going_back_restarts_merging_instead_of_dropping_everything_as_late():
    m = RigMerger(["a", "b"], "base_link", tolerance_ms=30.0)
    for stamp in (5000, 5100):
        m.add("a", cloud([[1, 0, 0]], stamp_ms=stamp))
        m.add("b", cloud([[1, 0, 0]], stamp_ms=stamp))
    m.add("a", cloud([[1, 0, 0]], stamp_ms=0))  # the bag starts again
    (frame,) = m.add("b", cloud([[1, 0, 0]], stamp_ms=5))
    assert frame.cloud.stamp_ns == 0 and m.stats.restarts == 1 and m.stats.late == 0


def test_tags_survive_a_merge_with_a_sensor_without_them():
    from livox_infer.rig import merge_clouds

    a = cloud([[1, 0, 0], [2, 0, 0]])
    a.tag = np.array([0, 1], np.uint8)  # the second point is flagged as noise
    merged = merge_clouds([a, cloud([[3, 0, 0]])], "base_link")
    np.testing.assert_array_equal(merged.tag, [0, 1, 0])


# ---------------------------------------------------------------- hostile rig files (issue 30)
def test_a_rig_file_that_is_not_utf8_is_one_clear_error(tmp_path):
    path = tmp_path / "rig.yaml"
    path.write_bytes("output_frame: base_link  # Fahrzeug-Mitte, gemessen in Längsrichtung\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"rig file .* is not UTF-8 text \(byte \d+"):
        Rig.load(path)


@pytest.mark.parametrize("name", ["../x", "a/b", "..", ".", "a\\\\b"])
def test_a_sensor_name_that_is_not_a_plain_folder_is_refused(name):
    d = rig_dict()
    d["sensors"][0]["name"] = name
    with pytest.raises(ConfigError, match="name must be a plain folder name"):
        Rig.from_dict(d)


def test_a_rig_directory_is_never_read_outside_the_input(tmp_path):
    from livox_infer.errors import PointCloudError
    from livox_infer.rig import RigSensor, read_rig_directory

    (tmp_path / "x").mkdir()  # ../x of the input: must not be read even when a Rig is built by hand
    (tmp_path / "input").mkdir()
    rig = Rig("base_link", (RigSensor("../x", "/a", "horizon", np.eye(4)),))
    with pytest.raises(PointCloudError, match="not a folder inside the input"):
        list(read_rig_directory(rig, tmp_path / "input"))


@pytest.mark.parametrize("where", ["extrinsic", "matrix"])
def test_an_absurd_extrinsic_offset_names_the_sensor(where):
    d = rig_dict()
    if where == "extrinsic":
        d["sensors"][0]["extrinsic"]["x"] = 1500.0  # millimetres typed as metres
    else:
        d["sensors"][1]["matrix"][2][3] = 1909.0
    with pytest.raises(ConfigError, match=r"\((left|tele)\): the extrinsic puts the sensor .* m from the output"):
        Rig.from_dict(d)


def test_a_sensor_whose_points_land_off_the_grid_is_counted_by_name():
    d = rig_dict(bev_extent=[-51.2, 51.2, -51.2, 51.2])
    d["sensors"][0]["extrinsic"]["z"] = 0.0
    d["sensors"][0]["extrinsic"]["x"] = 900.0  # finite, allowed, but 900 m away: nothing of it reaches the grid
    asm = FrameAssembler(Rig.from_dict(d))
    asm.add("left", cloud([[10.0, 0.0, 0.0]] * 5, stamp_ms=0))
    asm.add("tele", cloud([[10.0, 0.0, 0.0]] * 5, stamp_ms=0))
    assert asm.outside_grid == {"left": 1, "tele": 0}
    assert "rig sensor 'left': none of its points land on the rig's grid" in asm.outside_grid_warning("left")
