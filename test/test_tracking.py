"""The BEV tracker (livox_infer/tracking): stable ids, velocities, births, deaths, with synthetic detections."""

from __future__ import annotations

import math

import numpy as np
import pytest

from livox_infer.tracking import Tracker, TrackerConfig

CAR, PED, CYC = 0, 1, 2
DT_NS = 100_000_000  # 10 Hz
T0 = 1_700_000_000 * 1_000_000_000


def _box(x, y, yaw=0.0, label=CAR):
    size = {CAR: (4.5, 1.9, 1.6), PED: (0.6, 0.6, 1.7), CYC: (1.8, 0.6, 1.7)}[label]
    return [x, y, -1.0, *size, yaw]


def _arrays(dets, score):
    """[(x, y, yaw, label[, score]), ...] -> boxes, labels, scores (``score`` where a detection names none)."""
    boxes = np.array([_box(*d[:4]) for d in dets], np.float32).reshape(-1, 7)
    labels = np.array([d[3] for d in dets], np.int64)
    scores = np.array([d[4] if len(d) > 4 else score for d in dets], np.float32)
    return boxes, labels, scores


def _run(tracker, frames, poses=None, candidates=None, score=0.5):
    """frames: list of [(x, y, yaw, label[, score]), ...] -> list of TrackFrame; ``candidates``: the same per frame,
    the low-scored boxes of the second association. Detections score 0.5 unless given: below the default
    confirm_score (0.7), so tracks confirm by hits."""
    out = []
    for k, dets in enumerate(frames):
        low = None if candidates is None else _arrays(candidates[k], 0.2)
        out.append(tracker.update(*_arrays(dets, score), T0 + k * DT_NS, None if poses is None else poses[k], low))
    return out


def _ids_of(frame, x, y, tol=1.0):
    """Track id of the output track nearest (x, y) within tol, else 0."""
    if len(frame.track_ids) == 0:
        return 0
    d = np.hypot(frame.boxes[:, 0] - x, frame.boxes[:, 1] - y)
    i = int(np.argmin(d))
    return int(frame.track_ids[i]) if d[i] <= tol else 0


def test_constant_velocity_car_keeps_one_id_and_its_velocity():
    rng = np.random.default_rng(0)
    v = np.array([10.0, -2.0])
    frames = []
    for k in range(40):
        p = np.array([10.0, 5.0]) + v * k * 0.1 + rng.normal(0, 0.1, 2)
        frames.append([(p[0], p[1], math.atan2(v[1], v[0]), CAR)])
    out = _run(Tracker(), frames)
    ids = {int(i) for f in out[2:] for i in f.track_ids}
    assert ids == {1}, ids
    assert all(f.detection_track_ids[0] == 1 for f in out[2:])
    est = np.array([f.velocities[0] for f in out[20:]])
    err = np.linalg.norm(est - v, axis=1)
    assert np.median(err) < 0.5, err
    # heading points along the motion (the detector's yaw axis has no front)
    yaws = np.array([f.boxes[0, 6] for f in out[20:]])
    assert np.all(np.abs(np.angle(np.exp(1j * (yaws - math.atan2(v[1], v[0]))))) < 0.2)


def test_confirmation_needs_hits_and_tentative_ids_stay_off_detections():
    out = _run(Tracker(TrackerConfig(confirm_hits=3)), [[(10, 0, 0, CAR)]] * 4)
    assert [len(f.track_ids) for f in out] == [0, 0, 1, 1]
    assert [int(f.detection_track_ids[0]) for f in out] == [0, 0, 1, 1]


def test_a_high_score_confirms_at_once():
    """A detection scoring at least confirm_score (calibrated: that share of such boxes is right) confirms its track
    in its first frame; lower ones wait for confirm_hits."""
    frames = [[(10, 0, 0, CAR, 0.9), (30, 5, 0, CAR, 0.6)]] * 3
    out = _run(Tracker(TrackerConfig(confirm_hits=2, confirm_score=0.7)), frames)
    assert out[0].track_ids.tolist() == [1] and out[0].detection_track_ids.tolist() == [1, 0]
    assert out[1].track_ids.tolist() == [1, 2] and out[1].detection_track_ids.tolist() == [1, 2]
    out = _run(Tracker(TrackerConfig(confirm_hits=2, confirm_score=1.0)), frames)  # off: hits only
    assert len(out[0].track_ids) == 0 and sorted(out[1].track_ids.tolist()) == [1, 2]


def test_low_scored_candidates_continue_confirmed_tracks_only():
    """The second association: a confirmed track goes on through frames where its object scored below the detection
    threshold (same id, no miss, no coasting); a candidate never starts or confirms a track."""
    car = [[(10 + 0.8 * k, 3.0, 0.0, CAR)] for k in range(12)]
    frames = car[:4] + [[] for _ in range(4)] + car[8:]  # four frames without a detection: > max_misses 3
    candidates = [[] for _ in range(4)] + [[c[0]] for c in car[4:8]] + [[] for _ in range(4)]
    cfg = TrackerConfig(max_misses=3, coast_frames=0)
    without = _run(Tracker(cfg), frames)
    assert int(without[-1].track_ids[0]) == 2  # lost, a new id
    out = _run(Tracker(cfg), frames, candidates=candidates)
    assert [f.track_ids.tolist() for f in out[1:]] == [[1]] * 11  # followed through: output in every frame
    assert out[6].boxes[0, 0] == pytest.approx(10 + 0.8 * 6, abs=0.3) and out[6].scores[0] == pytest.approx(0.2)
    assert all(len(f.detection_track_ids) == len(d) for f, d in zip(out, frames))  # candidates get no detection ids
    # candidates alone (a pedestrian that never scores high) and beside a tentative track: no track ever
    ped = [[(5.0, -2.0, 0.0, PED)] for _ in range(6)]
    out = _run(Tracker(TrackerConfig(confirm_hits=2)), [ped[0]] + [[]] * 5, candidates=[[]] + ped[1:])
    assert all(len(f.track_ids) == 0 for f in out)
    out = _run(Tracker(), [[]] * 6, candidates=ped)
    assert all(len(f.track_ids) == 0 for f in out)
    # a track confirmed by one high score has no velocity yet: a candidate continues it within the plain gate only
    # (its gate for detections is widened by the top speed; a low-scored box of another object in there gave it a
    # false velocity)
    cfg = TrackerConfig(confirm_score=0.7, max_misses=0)
    out = _run(Tracker(cfg), [[(10, 0, 0, CAR, 0.9)], []], candidates=[[], [(11.5, 0, 0, CAR)]])
    assert out[0].track_ids.tolist() == [1] and out[1].track_ids.tolist() == [1]
    out = _run(Tracker(cfg), [[(10, 0, 0, CAR, 0.9)], []], candidates=[[], [(14.5, 0, 0, CAR)]])
    assert len(out[1].track_ids) == 0  # 4.5 m: inside the widened gate (6 m), outside the plain one (2.5 m)


def test_a_track_without_velocity_does_not_take_a_nearer_tracks_detection():
    """Tracks with a velocity (two hits) choose first; a track confirmed by one high score does not: its gate is
    widened by the top speed, and taking the detection next to another new track gave it a false velocity and the
    other track's object (an ID switch)."""
    frames = [[(10.0, 0, 0, CAR, 0.9), (15.6, 0, 0, CAR)], [(15.8, 0, 0, CAR)], [(16.0, 0, 0, CAR)]]
    out = _run(Tracker(), frames)
    assert out[1].detection_track_ids.tolist() == [2] and out[2].detection_track_ids.tolist() == [2]
    assert np.abs(out[2].velocities[out[2].track_ids.tolist().index(2)]).max() < 5.0


def test_a_track_finds_its_object_again_within_its_uncertainty(monkeypatch):
    """A fast car seen twice (a velocity from two hits is uncertain), then occluded for three frames, comes back
    further ahead than the gate around the prediction: the recovery association (Mahalanobis) keeps its id, where
    the gate alone starts a new track."""
    from livox_infer.tracking import tracker as tracker_mod

    v = 16.0
    frames = [[(10.0 + v * 0.1 * k, 0.0, 0.0, CAR)] if k in (0, 1, 5, 6, 7) else [] for k in range(8)]
    out = _run(Tracker(), frames)
    assert [f.detection_track_ids.tolist() for f in out[5:]] == [[1]] * 3
    monkeypatch.setattr(tracker_mod, "RECOVER_CHI2", 0.0)
    out = _run(Tracker(), frames)
    assert out[5].detection_track_ids.tolist() != [1]


def test_crossing_pedestrians_keep_their_ids():
    # two pedestrians crossing at right angles, meeting at (10, 0) at frame 20
    frames = []
    for k in range(40):
        s = (k - 20) * 0.1 * 1.4
        frames.append([(10 + s, 0.0, 0.0, PED), (10.0, s, math.pi / 2, PED)])
    out = _run(Tracker(), frames)
    first_a, first_b = _ids_of(out[5], 10 + (5 - 20) * 0.14, 0), _ids_of(out[5], 10, (5 - 20) * 0.14)
    assert first_a and first_b and first_a != first_b
    for k in range(25, 40):
        s = (k - 20) * 0.14
        assert _ids_of(out[k], 10 + s, 0) == first_a, k
        assert _ids_of(out[k], 10, s) == first_b, k
    va = out[35].velocities[list(out[35].track_ids).index(first_a)]
    assert np.allclose(va, [1.4, 0.0], atol=0.3)


def test_missed_detections_are_bridged_then_the_track_dies():
    frames = [[(10 + 0.8 * k, 3.0, 0.0, CAR)] for k in range(10)]
    frames += [[] for _ in range(3)]  # three misses: within max_misses = 3
    frames += [[(10 + 0.8 * k, 3.0, 0.0, CAR)] for k in range(13, 20)]
    out = _run(Tracker(TrackerConfig(max_misses=3, coast_frames=0)), frames)
    assert {int(i) for f in out[13:] for i in f.track_ids} == {1}
    assert all(len(out[k].track_ids) == 0 for k in (10, 11, 12))  # coast_frames 0: missed tracks are not output
    # coast_frames 2: output for two missed frames, at the predicted place (8 m/s along x)
    out = _run(Tracker(TrackerConfig(max_misses=3, coast_frames=2)), frames)
    assert [len(out[k].track_ids) for k in (10, 11, 12)] == [1, 1, 0]
    assert out[11].boxes[0, 0] == pytest.approx(10 + 0.8 * 11, abs=0.3)
    # five misses > max_misses (3) for a moving car: a new object (new id)
    frames = [[(10 + 0.8 * k, 3.0, 0.0, CAR)] for k in range(5)] + [[]] * 5
    frames += [[(10 + 0.8 * k, 3.0, 0.0, CAR)] for k in range(10, 13)]
    out = _run(Tracker(TrackerConfig(max_misses=3)), frames)
    assert int(out[-1].track_ids[0]) == 2


def test_a_standing_track_survives_longer():
    """A parked car hidden by passing traffic: a confirmed track standing still (three hits or more, slower than
    STANDING_SPEED) survives STANDING_MISSES_FACTOR x max_misses misses (here 6), a moving one max_misses (3)."""
    from livox_infer.tracking.tracker import STANDING_MISSES_FACTOR

    assert STANDING_MISSES_FACTOR == 2.0
    parked = [(10.0, 3.0, 0.0, CAR)]
    out = _run(Tracker(TrackerConfig(max_misses=3)), [parked] * 5 + [[]] * 6 + [parked] * 3)
    assert out[-1].track_ids.tolist() == [1] and out[-1].detection_track_ids.tolist() == [1]
    out = _run(Tracker(TrackerConfig(max_misses=3)), [parked] * 5 + [[]] * 7 + [parked] * 3)
    assert int(out[-1].track_ids[0]) == 2  # 7 misses > 6: a new object
    # two hits say too little about standing still: max_misses
    out = _run(Tracker(TrackerConfig(max_misses=3)), [parked] * 2 + [[]] * 4 + [parked] * 3)
    assert int(out[-1].track_ids[0]) == 2


def test_a_new_vehicle_track_moves_along_its_axis():
    """A track with one hit has no velocity: its gate is widened by the class's top speed, but for a vehicle along
    its box's axis only. A car 3 m across (the next lane) is not its object; 3 m ahead along the axis may be."""
    cfg = TrackerConfig(confirm_score=0.7)
    out = _run(Tracker(cfg), [[(50.0, 2.0, 0.0, CAR, 0.9)], [(50.5, 5.0, 0.0, CAR, 0.9)]])
    assert out[1].detection_track_ids.tolist() == [2]  # across: a track of its own
    out = _run(Tracker(cfg), [[(50.0, 2.0, 0.0, CAR, 0.9)], [(53.2, 2.4, 0.0, CAR, 0.9)]])
    assert out[1].detection_track_ids.tolist() == [1]  # along (32 m/s): the same car
    # the same box turned across the road: the first detection is along its axis now
    out = _run(Tracker(cfg), [[(50.0, 2.0, math.pi / 2, CAR, 0.9)], [(50.5, 5.0, math.pi / 2, CAR, 0.9)]])
    assert out[1].detection_track_ids.tolist() == [1]
    # pedestrians have no axis of motion: within the widened gate (1.2 + 0.4 m) in any direction
    out = _run(Tracker(cfg), [[(10.0, 0.0, 0.0, PED, 0.9)], [(10.0, 1.5, 0.0, PED, 0.9)]])
    assert out[1].detection_track_ids.tolist() == [1]


def test_a_new_vehicle_track_does_not_jump_to_the_next_parked_car():
    """A vehicle's widened first gate is top speed x dt plus FIRST_STEP_SLACK_GATES gates (5 m for a car at 10 Hz),
    not plus a whole gate (6 m): a parked car missed in its second frame leaves the next car in the row, 5.5 m
    ahead, to a track of its own, and both keep their ids."""
    a, b = (20.0, 3.0, 0.0, CAR, 0.8), (25.5, 3.0, 0.0, CAR, 0.8)
    out = _run(Tracker(), [[a], [b]] + [[a, b]] * 6)
    assert [f.detection_track_ids.tolist() for f in out] == [[1], [2]] + [[1, 2]] * 6
    assert np.abs(out[-1].velocities).max() < 0.5


def test_a_moving_sensor_trusts_boxes_less_along_its_motion():
    """A raw cloud's box is where its object was at its shot time, anywhere in the frame: with the sensor moving,
    the box's measurement noise grows along the sensor's motion over a frame (SHOT_SPREAD of it), not across it.
    The same parked car, the same world positions: standing, the track's covariance is round; driving +x at 15 m/s,
    its position and velocity are less certain along x, as certain across."""
    def track_cov(speed):
        poses = []
        for k in range(6):
            pose = np.eye(4)
            pose[0, 3] = speed * 0.1 * k
            poses.append(pose)
        frames = [[(30.0 - p[0, 3], 2.0, 0.0, CAR)] for p in poses]
        return _run(Tracker(), frames, poses)[-1].covariances[0]

    still, moving = track_cov(0.0), track_cov(15.0)
    assert moving[0, 0] > 1.5 * still[0, 0] and moving[2, 2] > 1.5 * still[2, 2], (still, moving)
    assert np.isclose(moving[1, 1], still[1, 1]) and np.isclose(moving[3, 3], still[3, 3])


def test_a_low_scored_candidate_turns_a_velocity_less_than_a_detection():
    """An off-centre box continues a track either way; scored below the threshold (a candidate) it counts with
    CANDIDATE_NOISE_FACTOR x the measurement noise, so the track's velocity turns less."""
    car = [[(10 + 1.0 * k, 0.0, 0.0, CAR)] for k in range(8)]
    off = (18.0, 1.5, 0.0, CAR)  # frame 8, 1.5 m off the lane
    as_detection = _run(Tracker(), car + [[off]])
    as_candidate = _run(Tracker(), car + [[]], candidates=[[]] * 8 + [[off]])
    v_det, v_cand = as_detection[8].velocities[0], as_candidate[8].velocities[0]
    assert as_candidate[8].track_ids.tolist() == [1] and as_detection[8].track_ids.tolist() == [1]
    assert v_det[1] > 0.8 and 0.0 < v_cand[1] < 0.5 * v_det[1], (v_det, v_cand)


def test_clutter_does_not_steal_or_confirm():
    rng = np.random.default_rng(1)
    frames, previous = [], []
    for k in range(30):
        dets = [(20 + 0.5 * k, -4.0, 0.0, CAR)]
        clutter = []
        while len(clutter) < 3:  # one-frame clutter elsewhere, never within 3 m of the last frame's
            p = (rng.uniform(5, 60), rng.uniform(10, 30))
            if all(math.dist(p, q) > 3.0 for q in previous):
                clutter.append(p)
        dets += [(x, y, 0.0, PED) for x, y in clutter]
        previous = clutter
        frames.append(dets)
    out = _run(Tracker(), frames)
    car_ids = {_ids_of(f, 20 + 0.5 * k, -4.0) for k, f in enumerate(out) if k >= 2}
    assert car_ids == {1}
    # clutter points never repeat: no pedestrian track is confirmed
    assert all(set(f.labels.tolist()) <= {CAR} for f in out)


def test_other_classes_are_never_associated():
    out = _run(Tracker(), [[(10, 0, 0, CAR)], [(10, 0, 0, CAR)], [(10, 0, 0, CYC)], [(10, 0, 0, CYC)]])
    assert out[1].track_ids.tolist() == [1]
    assert out[2].track_ids.tolist() == [1] and out[2].labels.tolist() == [CAR]  # the car coasts, the cyclist tentative
    assert out[3].track_ids.tolist() == [1, 2] and out[3].labels.tolist() == [CAR, CYC]  # a track of its own


def test_ego_motion_gives_velocity_over_ground_in_the_cloud_axes():
    # the sensor drives +x at 10 m/s and turns at 10 deg/s; a parked car and a car moving +y at 5 m/s (world)
    poses, frames = [], []
    for k in range(40):
        t = 0.1 * k
        yaw = math.radians(10) * t
        pose = np.eye(4)
        pose[:2, :2] = [[math.cos(yaw), -math.sin(yaw)], [math.sin(yaw), math.cos(yaw)]]
        pose[:2, 3] = [10 * t, 0.0]
        poses.append(pose)
        dets = []
        for world in ((60.0, 5.0), (40.0, -10.0 + 5 * t)):
            local = pose[:2, :2].T @ (np.array(world) - pose[:2, 3])
            dets.append((local[0], local[1], 0.0, CAR))
        frames.append(dets)
    tracker = Tracker()
    out = _run(tracker, frames, poses)
    assert tracker.diagnostics()["tracking_ego_motion"] == "odometry"
    last, pose = out[-1], poses[-1]
    assert sorted(last.track_ids.tolist()) == [1, 2]
    for tid, v_world in ((1, (0.0, 0.0)), (2, (0.0, 5.0))):
        i = last.track_ids.tolist().index(tid)
        assert np.allclose(last.velocities[i], pose[:2, :2].T @ np.array(v_world), atol=0.5), (tid, last.velocities[i])
    # the same clouds without poses: velocities relative to the sensor, and the diagnostics say so
    t2 = Tracker()
    rel = _run(t2, frames)
    assert "none" in t2.diagnostics()["tracking_ego_motion"]
    i = rel[-1].track_ids.tolist().index(1)
    assert np.linalg.norm(rel[-1].velocities[i]) > 8.0  # the parked car approaches at ~ the ego speed


def test_bad_input_is_counted_and_time_going_back_restarts():
    tracker = Tracker()
    boxes = np.array([_box(10, 0), [np.nan] * 7], np.float32)
    f = tracker.update(boxes, [CAR, CAR], [0.5, 0.5], T0)
    assert tracker.rejected_boxes == 1 and f.detection_track_ids.tolist() == [0, 0]
    tracker.update(boxes[:1], [CAR], [0.5], T0 + DT_NS)
    assert tracker.confirmed_tracks == 1
    tracker.update(boxes[:1], [CAR], [0.5], T0)  # a looped bag
    assert tracker.resets == 1 and tracker.confirmed_tracks == 0
    with pytest.raises(ValueError):
        tracker.update(boxes, [CAR], [0.5], T0 + 2 * DT_NS)
    # candidates are checked the same way: non-finite rows counted and skipped, lengths that disagree refused
    tracker.update(boxes[:1], [CAR], [0.5], T0 + 3 * DT_NS, candidates=(boxes[1:], [CAR], [0.2]))
    assert tracker.rejected_boxes == 2
    with pytest.raises(ValueError):
        tracker.update(boxes[:1], [CAR], [0.5], T0 + 4 * DT_NS, candidates=(boxes, [CAR], [0.2]))


def test_two_objects_merged_into_one_box_keep_their_ids():
    """A car passing a parked car: for four frames the detector gives one box between them, then the passing car
    hides the parked one for three. The merged box lies about as near both established tracks, so it updates
    neither (both coast, it starts no track); taken by one of them, the parked car's track was pulled onto the
    passing car and the objects changed ids (seed 19 of the tracking eval: three switches in one pass)."""
    parked = (20.0, 2.5, 0.0, CAR)
    frames = []
    for k in range(18):
        mover = (30.0 - 0.8 * k, 0.0, 0.0, CAR)  # 8 m/s towards the parked car's row, 2.5 m across
        if 7 <= k <= 10:  # merged: one box half way
            frames.append([((mover[0] + parked[0]) / 2, 1.25, 0.4, CAR)])
        elif 11 <= k <= 13:  # the parked car hidden behind the passing one
            frames.append([mover])
        else:
            frames.append([parked, mover])
    out = _run(Tracker(), frames)
    ids_before = (_ids_of(out[6], *parked[:2]), _ids_of(out[6], 30.0 - 0.8 * 6, 0.0))
    ids_after = (_ids_of(out[17], *parked[:2]), _ids_of(out[17], 30.0 - 0.8 * 17, 0.0))
    assert all(ids_before) and ids_before == ids_after, (ids_before, ids_after)
    assert {int(i) for f in out for i in f.track_ids} == set(ids_before)  # no third track
