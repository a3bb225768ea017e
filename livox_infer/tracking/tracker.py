"""Multi-object tracker in bird's-eye view: one stable id, a velocity and a yaw rate per object (ROS-free).

Per frame, :meth:`Tracker.update` takes the detector's boxes (M, 7) ``[x, y, z, l, w, h, yaw]`` in the cloud's
frame, their class labels and scores, the cloud's stamp and, where known, the cloud frame's pose in a fixed frame
(odometry: 4x4 world-from-cloud). Steps:

1. predict every track to the stamp: constant-velocity Kalman filter on ``[x, y, vx, vy]`` (white-noise
   acceleration, sigma per class) in the fixed frame when a pose is given, else in the cloud's frame;
2. associate greedily by BEV centre distance, same class only, confirmed tracks with a velocity (two hits) before
   the others, nearest pairs first, within the class's gate (a track with one hit has no velocity yet: its gate
   grows by the class's top speed times dt, for a vehicle along its box's axis only and with 0.6 gates of slack);
   a detection about as near
   another established track left without one is held back (two objects merged into one box: both coast); then
   the confirmed tracks with a velocity still without a detection
   take the detections left over that lie within their predicted uncertainty (Mahalanobis, at most two gates away:
   a velocity from few hits, or an occlusion coasted through, put the prediction off by more than the gate);
3. update the matched tracks (position by the filter; z, size and yaw smoothed; the yaw axis made to agree with
   the direction of motion above 1 m/s; yaw rate from the smoothed yaw), start a tentative track per unmatched
   detection, count a miss for every unmatched track; before that, the confirmed tracks still without a detection
   are associated the same way with the frame's *candidates* (boxes that scored below the detector's class
   threshold but at least the node's ``tracking_low_score``: ByteTrack's second association; a one-hit track
   within the plain gate only; with twice the measurement noise), so a track goes on through a frame where its
   object scored low; a candidate never starts a track;
4. a track is confirmed after ``confirm_hits`` hits, or at once by a detection scoring at least ``confirm_score``
   (calibrated scores: the share of such boxes that are right), and deleted after more than ``max_misses`` misses in
   a row (a tentative track at its first miss; a standing one, three hits or more and slower than 1 m/s, after
   twice as many).

Output: :class:`TrackFrame` with the track id of each detection (0 = none, or not confirmed yet) and the confirmed
tracks detected in this frame or missed for at most ``coast_frames`` frames (then predicted), with box, velocity (m/s, in the cloud frame's axes: over ground when poses were given,
relative to the sensor otherwise) and yaw rate. Without poses the tracker says so in ``ego_motion``.
A stamp that goes back or jumps by more than ``max_gap_s`` restarts the tracks (counted in ``resets``; the same
stamp again is a frame without motion);
non-finite boxes are dropped and counted (``rejected_boxes``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

# Per class: BEV association gate (m), acceleration noise (m/s^2), measurement noise (m), top speed (m/s, only for
# the first association of a new track, whose velocity is unknown). Gates are run-time parameters
# (livox_infer/params.py: tracking_gate_<class>); the rest are the filter's fixed model.
# Trucks and buses: longer boxes whose centre jumps more when only one end is seen, slower to change speed.
DEFAULT_GATES: dict[str, float] = {"car": 2.5, "pedestrian": 1.2, "cyclist": 1.8, "truck": 3.5, "bus": 3.5}
ACCEL_SIGMA: dict[str, float] = {"car": 2.0, "pedestrian": 2.0, "cyclist": 3.0, "truck": 1.5, "bus": 1.5}
MEAS_SIGMA: dict[str, float] = {"car": 0.5, "pedestrian": 0.2, "cyclist": 0.25, "truck": 0.8, "bus": 0.8}
TOP_SPEED: dict[str, float] = {"car": 35.0, "pedestrian": 4.0, "cyclist": 12.0, "truck": 30.0, "bus": 25.0}
# prior std of a new track's velocity (m/s): most objects stand or move slowly; a wide prior made the second
# detection's jitter (0.5 m in 0.1 s = 5 m/s) the velocity of a parked car, which then coasted away from it
INIT_SPEED_SIGMA: dict[str, float] = {"car": 8.0, "pedestrian": 2.0, "cyclist": 6.0, "truck": 8.0, "bus": 8.0}
_FALLBACK = "car"  # a class the tables do not name takes the car's model
MAX_GAP_S = 1.0


def default_gate(name: str) -> float:
    """The gate of class ``name`` (the car's for a class the table does not name)."""
    return float(DEFAULT_GATES.get(name, DEFAULT_GATES[_FALLBACK]))

# the recovery association (`Tracker._recover`): chi-square 99 % of 2 degrees of freedom, and a cap in gates
RECOVER_CHI2 = 9.21
RECOVER_GATE_FACTOR = 2.0
# a track with one hit (no velocity yet) of a class that moves along its box's axis may find its second detection
# up to its top speed x dt away along that axis, but across it at most this many gates: a neighbour in the next
# lane, 3 m across, is not its object (a 50 m car took its neighbour's box and a lateral 14 m/s velocity)
FIRST_STEP_LATERAL_GATES = 0.6
AXIAL_CLASSES = frozenset({"car", "cyclist", "truck", "bus"})
# and a vehicle's first step reaches top speed x dt plus this many gates (two boxes' centre error), not plus a whole
# gate: a parked car's one-hit track took the box of the next parked car in the row, 5.6 m ahead (56 m/s)
FIRST_STEP_SLACK_GATES = 0.6
VEHICLE_CLASSES = frozenset({"car", "truck", "bus"})
# a candidate (scored below its class's threshold) places its object less surely: it updates a track with this
# times the class's measurement noise (sigma), so one off-centre low box does not turn a track's velocity
CANDIDATE_NOISE_FACTOR = 2.0
# a confirmed track standing still (slower than STANDING_SPEED m/s) survives STANDING_MISSES_FACTOR x max_misses
# misses: a parked car hidden for 1-1.6 s by passing traffic keeps its id, and its prediction does not drift away
STANDING_SPEED = 1.0
STANDING_MISSES_FACTOR = 2.0
STANDING_MIN_HITS = 3  # a velocity from fewer hits says little
# two objects seen as one box (a car passing a parked one, merged by the detector): an established track's detection
# at least AMBIGUOUS_MIN_DIST m off it that lies less than AMBIGUOUS_RATIO times as far from another established track
# left without a detection updates neither (both coast; it starts no track): taken by the nearer, it pulled the parked
# car's track onto the passing car, three ID switches in one pass
AMBIGUOUS_RATIO = 1.5
AMBIGUOUS_MIN_DIST = 1.0
# A raw (not motion-compensated) cloud places each box where its object was seen from the sensor at its own shot
# time, somewhere in the time the cloud covers, while the pose is the cloud stamp's: with the sensor moving, the box
# lands off in the fixed frame by up to the sensor's motion over a frame. Its measurement noise gets, along that
# motion (at the box, so a turn counts too), SHOT_SPREAD x the motion as a standard deviation (half the motion: a
# shot time at either end of the frame): at 12.5 m/s boxes land 0-1.25 m off, and without it the filter trusted a
# velocity from three such boxes so much that its oncoming car, back 3.4 m off the prediction after one miss, was lost
SHOT_SPREAD = 0.5
HEADING_SPEED = 1.0  # m/s: above this the box's yaw axis is turned to point along the velocity
SIZE_ALPHA = 0.3
Z_ALPHA = 0.5
YAW_ALPHA = 0.5
YAW_RATE_ALPHA = 0.5


@dataclass(frozen=True)
class TrackerConfig:
    gates: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_GATES))
    confirm_hits: int = 2
    max_misses: int = 8
    max_gap_s: float = MAX_GAP_S
    coast_frames: int = 3  # a confirmed track is still output (predicted) this many frames without a detection
    # a detection scoring at least this confirms its track at once (scores are calibrated: the share of such boxes
    # that are right); the others wait for confirm_hits
    confirm_score: float = 0.7

    @classmethod
    def from_params(cls, values: Mapping[str, Any]) -> "TrackerConfig":
        """From the parameter table's values (node / preset): tracking_confirm_hits, tracking_max_misses,
        tracking_coast_frames and tracking_gate_<class>."""
        gates = {k[len("tracking_gate_"):]: float(v) for k, v in values.items() if k.startswith("tracking_gate_")}
        return cls(gates={**DEFAULT_GATES, **gates}, confirm_hits=int(values["tracking_confirm_hits"]),
                   max_misses=int(values["tracking_max_misses"]), coast_frames=int(values["tracking_coast_frames"]),
                   confirm_score=float(values["tracking_confirm_score"]))

    def model(self, name: str) -> tuple[float, float, float, float]:
        key = name if name in ACCEL_SIGMA else _FALLBACK
        gate = float(self.gates.get(name, self.gates.get(_FALLBACK, DEFAULT_GATES[_FALLBACK])))
        return gate, ACCEL_SIGMA[key], MEAS_SIGMA[key], TOP_SPEED[key]


@dataclass
class _Track:
    track_id: int
    label: int
    name: str
    x: np.ndarray  # (4,) x, y, vx, vy in the tracking frame
    P: np.ndarray  # (4, 4)
    z: float
    size: np.ndarray  # (3,) l, w, h
    yaw: float  # tracking frame
    yaw_rate: float = 0.0
    score: float = 0.0
    hits: int = 1
    misses: int = 0
    age: int = 1
    confirmed: bool = False

    @property
    def established(self) -> bool:
        """Confirmed, with a velocity (two hits or more)."""
        return self.confirmed and self.hits >= 2


@dataclass
class TrackFrame:
    """One frame's output; arrays in the cloud's frame (see the module docstring)."""

    detection_track_ids: np.ndarray  # (M,) int64 per input detection: its confirmed track's id, else 0
    track_ids: np.ndarray  # (K,) int64 confirmed tracks updated in this frame
    boxes: np.ndarray  # (K, 7) float32 smoothed box
    labels: np.ndarray  # (K,) int64
    scores: np.ndarray  # (K,) float32 the latest detection's score
    velocities: np.ndarray  # (K, 2) float32 m/s, vx vy in the cloud frame's axes
    yaw_rates: np.ndarray  # (K,) float32 rad/s
    ages: np.ndarray  # (K,) int64 frames since birth
    ego_motion: bool  # poses were given: velocities are over ground
    covariances: np.ndarray | None = None  # (K, 4, 4) filter covariance of x, y, vx, vy in the cloud frame's axes


def candidates_of(det) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """A pipeline's ``Detections`` candidates as `Tracker.update`'s ``candidates``; None when it gave none."""
    boxes = getattr(det, "candidate_boxes", None)
    return None if boxes is None else (boxes, det.candidate_labels, det.candidate_scores)


def _wrap(a: float) -> float:
    return (a + math.pi) % (2 * math.pi) - math.pi


def _near_axis(yaw: float, ref: float) -> float:
    """``yaw`` or ``yaw + pi``, whichever lies within pi/2 of ``ref`` (a box's axis has no front)."""
    d = _wrap(yaw - ref)
    if d > math.pi / 2:
        d -= math.pi
    elif d < -math.pi / 2:
        d += math.pi
    return ref + d


def _greedy(pairs: list[tuple], used_t: set[int], used_d: set[int]) -> list[tuple[int, int]]:
    """Greedy one-to-one matching: ``pairs`` (sort key..., track index, detection index) taken in sorted order, each
    track and detection at most once and none of ``used_t`` / ``used_d`` (updated in place)."""
    out = []
    for *_, ti, di in sorted(pairs):
        if ti in used_t or di in used_d:
            continue
        used_t.add(ti)
        used_d.add(di)
        out.append((ti, di))
    return out


class Tracker:
    """See the module docstring. ``class_names[label]`` names each label (the model config's classes)."""

    def __init__(self, config: TrackerConfig | None = None, class_names: Sequence[str] = ("car", "pedestrian",
                                                                                              "cyclist")) -> None:
        self.config = config or TrackerConfig()
        self.class_names = tuple(class_names)
        self._tracks: list[_Track] = []
        self._next_id = 1
        self._last_stamp: int | None = None
        self._last_pose_given: bool | None = None
        self._last_pose: np.ndarray | None = None
        self.resets = 0
        self.rejected_boxes = 0
        self.frames = 0
        self.frames_without_ego_motion = 0

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        self._tracks = []
        self._last_stamp = None
        self._last_pose_given = None
        self._last_pose = None

    @property
    def active_tracks(self) -> int:
        return len(self._tracks)

    @property
    def ego_motion(self) -> bool | None:
        """Whether the last frame came with a pose (None before the first frame)."""
        return self._last_pose_given

    @property
    def confirmed_tracks(self) -> int:
        return sum(t.confirmed for t in self._tracks)

    def _name(self, label: int) -> str:
        return self.class_names[label] if 0 <= label < len(self.class_names) else f"class_{label}"

    # ------------------------------------------------------------------ update
    def update(self, boxes: Any, labels: Any, scores: Any, stamp_ns: int,
               pose: np.ndarray | None = None, candidates: tuple[Any, Any, Any] | None = None) -> TrackFrame:
        """``candidates``: (boxes, labels, scores) below the detection threshold, only to continue confirmed tracks."""
        boxes, labels, scores, finite = self._checked(boxes, labels, scores)
        if candidates is not None:
            c_boxes, c_labels, c_scores, c_finite = self._checked(*candidates)
        pose_given = pose is not None
        if pose_given:
            pose = np.asarray(pose, dtype=np.float64)
            if pose.shape != (4, 4) or not np.isfinite(pose).all():
                raise ValueError(f"pose must be a finite 4x4 matrix, got shape {pose.shape}")
        self.frames += 1
        if not pose_given:
            self.frames_without_ego_motion += 1

        stamp_ns = int(stamp_ns)
        dt = 0.0
        if self._last_stamp is not None:
            dt = (stamp_ns - self._last_stamp) * 1e-9
            if dt < 0.0 or dt > self.config.max_gap_s or pose_given != self._last_pose_given:
                # time went back (a looped bag), the stream stalled, or the frame of the states changed
                self.resets += 1
                self._tracks = []
                dt = 0.0
        # the sensor's motion over the last frame (cloud frame at this stamp -> at the last), for the shot spread
        motion = None
        if pose_given and dt > 0.0 and self._last_pose is not None:
            last = self._last_pose  # rigid: its inverse is [R^T, -R^T t] (never a singular solve on a bad pose)
            motion = np.eye(4)
            motion[:3, :3] = last[:3, :3].T @ pose[:3, :3]
            motion[:3, 3] = last[:3, :3].T @ (pose[:3, 3] - last[:3, 3])
        self._last_stamp = stamp_ns
        self._last_pose_given = pose_given
        self._last_pose = pose if pose_given else None

        # detections into the tracking frame (the fixed frame of the poses, else the cloud's own)
        centres, yaws = self._in_tracking_frame(boxes, pose)
        spread = self._shot_spread(boxes, pose, motion)

        for t in self._tracks:
            self._predict(t, dt)

        matches = self._associate(centres, labels, finite, dt)
        held = self._ambiguous(centres, matches)
        matches = [m for m in matches if m not in held]
        matches += self._recover(centres, labels, finite, matches + held)
        matched_tracks = {ti for ti, _ in matches}
        det_track = np.zeros(len(boxes), np.int64)
        det_track_obj: dict[int, _Track] = {}
        for ti, di in matches:
            t = self._tracks[ti]
            self._correct(t, centres[di], boxes[di], yaws[di], float(scores[di]), dt, spread=spread[di])
            det_track_obj[di] = t
        if candidates is not None and len(c_boxes):  # second association: confirmed tracks left over, candidates
            c_centres, c_yaws = self._in_tracking_frame(c_boxes, pose)
            c_spread = self._shot_spread(c_boxes, pose, motion)
            # a track with one hit takes a candidate only within the plain gate (not widened by the top speed: a
            # low-scored box of another object within the widened one gave it a false velocity)
            held_tracks = {ti for ti, _ in held}
            open_tracks = [i for i, t in enumerate(self._tracks)
                           if t.confirmed and i not in matched_tracks and i not in held_tracks]
            for ti, ci in self._associate(c_centres, c_labels, c_finite, dt, open_tracks, widen=False):
                t = self._tracks[ti]
                self._correct(t, c_centres[ci], c_boxes[ci], c_yaws[ci], float(c_scores[ci]), dt,
                              CANDIDATE_NOISE_FACTOR, c_spread[ci])
                matched_tracks.add(ti)
        survivors = []
        for i, t in enumerate(self._tracks):
            if i not in matched_tracks:
                t.misses += 1
                t.age += 1
                if (not t.confirmed) or t.misses > self._max_misses(t):
                    continue
            survivors.append(t)
        matched_dets = {di for _, di in matches} | {di for _, di in held}
        for di in np.nonzero(finite)[0]:
            if int(di) in matched_dets:
                continue
            t = self._birth(centres[di], boxes[di], yaws[di], int(labels[di]), float(scores[di]))
            survivors.append(t)
            det_track_obj[int(di)] = t
        self._tracks = survivors
        for di, t in det_track_obj.items():
            if t.confirmed:
                det_track[di] = t.track_id
        return self._output(det_track, pose if pose_given else None)

    def _checked(self, boxes: Any, labels: Any, scores: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """As float64 / int64 arrays, and which rows are finite (the others are counted as rejected)."""
        boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 7)
        labels = np.asarray(labels, dtype=np.int64).reshape(-1)
        scores = np.asarray(scores, dtype=np.float64).reshape(-1)
        if len(labels) != len(boxes) or len(scores) != len(boxes):
            raise ValueError(f"boxes ({len(boxes)}), labels ({len(labels)}) and scores ({len(scores)}) disagree")
        finite = np.isfinite(boxes).all(1) & np.isfinite(scores)
        self.rejected_boxes += int((~finite).sum())
        return boxes, labels, scores, finite

    @staticmethod
    def _in_tracking_frame(boxes: np.ndarray, pose: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """BEV centres (M, 2) and yaws (M,) in the tracking frame (the poses' fixed frame, else the cloud's)."""
        centres, yaws = boxes[:, :2].copy(), boxes[:, 6].copy()
        if pose is not None:
            centres = centres @ pose[:2, :2].T + pose[:2, 3]
            yaws = yaws + math.atan2(pose[1, 0], pose[0, 0])
        return centres, yaws

    @staticmethod
    def _shot_spread(boxes: np.ndarray, pose: np.ndarray | None, motion: np.ndarray | None) -> np.ndarray:
        """(M, 2) per box, in the tracking frame: SHOT_SPREAD x how far the sensor's motion over the last frame
        (``motion``: this cloud's frame in the last one's) moves the box's centre; zeros without that motion."""
        out = np.zeros((len(boxes), 2))
        if motion is None or not len(boxes):
            return out
        c = np.c_[boxes[:, :3], np.ones(len(boxes))]
        moved = c @ motion.T - c  # the centre seen one frame's motion later, in the cloud's own axes
        return SHOT_SPREAD * (moved[:, :2] @ pose[:2, :2].T)

    def _predict(self, t: _Track, dt: float) -> None:
        if dt <= 0.0:
            return
        _, accel, _, _ = self.config.model(t.name)
        F = np.eye(4)
        F[0, 2] = F[1, 3] = dt
        q = accel ** 2
        dt2, dt3, dt4 = dt * dt, dt ** 3, dt ** 4
        Q = q * np.array([[dt4 / 4, 0, dt3 / 2, 0], [0, dt4 / 4, 0, dt3 / 2],
                          [dt3 / 2, 0, dt2, 0], [0, dt3 / 2, 0, dt2]])
        t.x = F @ t.x
        t.P = F @ t.P @ F.T + Q
        t.yaw = t.yaw + t.yaw_rate * dt

    def _associate(self, centres: np.ndarray, labels: np.ndarray, finite: np.ndarray,
                   dt: float, tracks: Sequence[int] | None = None, widen: bool = True) -> list[tuple[int, int]]:
        """(track index, detection index) pairs; ``tracks``: only these track indices (default all)."""
        pairs = []
        for ti in range(len(self._tracks)) if tracks is None else tracks:
            t = self._tracks[ti]
            gate, _, _, top_speed = self.config.model(t.name)
            lateral = math.inf
            if t.hits == 1 and widen:  # no velocity yet
                if t.name in AXIAL_CLASSES:
                    lateral = FIRST_STEP_LATERAL_GATES * gate
                if t.name in VEHICLE_CLASSES:
                    gate *= FIRST_STEP_SLACK_GATES
                gate += top_speed * dt
            across = np.array([-math.sin(t.yaw), math.cos(t.yaw)]) if lateral < math.inf else None
            for di in np.nonzero(finite & (labels == t.label))[0]:
                r = centres[di] - t.x[:2]
                d = float(np.hypot(*r))
                if d <= gate and (across is None or abs(float(r @ across)) <= lateral):
                    pairs.append((0 if t.established else 1, d, ti, int(di)))
        return _greedy(pairs, set(), set())

    def _ambiguous(self, centres: np.ndarray, matches: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Matches to hold back: an established track's detection that lies about as near another established
        track left without a detection (two objects seen as one box, e.g. a car passing a parked one)."""
        matched = {ti for ti, _ in matches}
        est = [i for i, t in enumerate(self._tracks) if t.established]
        held = []
        for ti, di in matches:
            t = self._tracks[ti]
            if not t.established:
                continue
            d = float(np.hypot(*(centres[di] - t.x[:2])))
            if d < AMBIGUOUS_MIN_DIST:
                continue
            for tj in est:
                if tj == ti or tj in matched or self._tracks[tj].label != t.label:
                    continue
                o = self._tracks[tj]
                d2 = float(np.hypot(*(centres[di] - o.x[:2])))
                if d2 <= self.config.model(o.name)[0] and d2 < AMBIGUOUS_RATIO * d:
                    held.append((ti, di))
                    break
        return held

    def _recover(self, centres: np.ndarray, labels: np.ndarray, finite: np.ndarray,
                 matches: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Pairs of confirmed tracks with a velocity and detections that the gate left apart, where the detection
        lies within the track's predicted uncertainty (Mahalanobis distance squared <= RECOVER_CHI2, and at most
        RECOVER_GATE_FACTOR gates away), most likely first: a track whose velocity came from few hits, or that
        coasted through an occlusion, finds its object again instead of a new track starting on it."""
        used_t, used_d = {ti for ti, _ in matches}, {di for _, di in matches}
        pairs = []
        for ti, t in enumerate(self._tracks):
            if ti in used_t or not t.established:
                continue
            gate, _, meas, _ = self.config.model(t.name)
            s_inv = np.linalg.inv(t.P[:2, :2] + np.eye(2) * meas ** 2)
            for di in np.nonzero(finite & (labels == t.label))[0]:
                if int(di) in used_d:
                    continue
                r = centres[di] - t.x[:2]
                m2 = float(r @ s_inv @ r)
                if m2 <= RECOVER_CHI2 and float(np.hypot(*r)) <= RECOVER_GATE_FACTOR * gate:
                    pairs.append((m2, ti, int(di)))
        return _greedy(pairs, used_t, used_d)

    def _max_misses(self, t: _Track) -> float:
        """Misses in a row a confirmed track survives: longer while it stands still (STANDING_SPEED)."""
        standing = t.hits >= STANDING_MIN_HITS and float(np.hypot(t.x[2], t.x[3])) < STANDING_SPEED
        return self.config.max_misses * (STANDING_MISSES_FACTOR if standing else 1.0)

    def _correct(self, t: _Track, centre: np.ndarray, box: np.ndarray, yaw: float, score: float, dt: float,
                 noise_factor: float = 1.0, spread: np.ndarray | None = None) -> None:
        """Kalman update with ``centre``; ``noise_factor`` scales the measurement sigma (candidates); ``spread``
        (2,): a standard deviation along its direction on top (`_shot_spread`)."""
        _, _, meas, _ = self.config.model(t.name)
        H = np.zeros((2, 4))
        H[0, 0] = H[1, 1] = 1.0
        R = np.eye(2) * (meas * noise_factor) ** 2
        if spread is not None:
            R = R + np.outer(spread, spread)
        S = H @ t.P @ H.T + R
        K = t.P @ H.T @ np.linalg.inv(S)
        t.x = t.x + K @ (centre - H @ t.x)
        t.P = (np.eye(4) - K @ H) @ t.P
        t.z = (1 - Z_ALPHA) * t.z + Z_ALPHA * float(box[2])
        t.size = (1 - SIZE_ALPHA) * t.size + SIZE_ALPHA * box[3:6]
        prev = t.yaw
        measured = _near_axis(yaw, t.yaw)
        new_yaw = _wrap(t.yaw + YAW_ALPHA * (measured - t.yaw))
        speed = float(np.hypot(t.x[2], t.x[3]))
        if speed > HEADING_SPEED and t.hits >= 2:
            new_yaw = _near_axis(new_yaw, math.atan2(t.x[3], t.x[2]))  # the axis, pointing where it goes
            prev = _near_axis(prev, new_yaw)
        if dt > 0.0:
            rate = _wrap(new_yaw - prev) / dt if abs(_wrap(new_yaw - prev)) < math.pi / 2 else 0.0
            t.yaw_rate = (1 - YAW_RATE_ALPHA) * t.yaw_rate + YAW_RATE_ALPHA * rate
        t.yaw = _wrap(new_yaw)
        t.score = score
        t.hits += 1
        t.age += 1
        t.misses = 0
        if t.hits >= self.config.confirm_hits or score >= self.config.confirm_score:
            t.confirmed = True

    def _birth(self, centre: np.ndarray, box: np.ndarray, yaw: float, label: int, score: float) -> _Track:
        name = self._name(label)
        _, _, meas, top_speed = self.config.model(name)
        v0 = INIT_SPEED_SIGMA[name if name in INIT_SPEED_SIGMA else _FALLBACK]
        P = np.diag([meas ** 2, meas ** 2, v0 ** 2, v0 ** 2])
        t = _Track(track_id=self._next_id, label=label, name=name, x=np.array([centre[0], centre[1], 0.0, 0.0]),
                   P=P, z=float(box[2]), size=box[3:6].astype(np.float64).copy(), yaw=_wrap(float(yaw)), score=score)
        self._next_id += 1
        if self.config.confirm_hits <= 1 or score >= self.config.confirm_score:
            t.confirmed = True
        return t

    def _output(self, det_track: np.ndarray, pose: np.ndarray | None) -> TrackFrame:
        shown = [t for t in self._tracks if t.confirmed and t.misses <= self.config.coast_frames]
        k = len(shown)
        boxes = np.zeros((k, 7), np.float64)
        vel = np.zeros((k, 2), np.float64)
        cov = np.zeros((k, 4, 4), np.float64)
        for i, t in enumerate(shown):
            xy, v, yaw, P = t.x[:2], t.x[2:4], t.yaw, t.P
            if pose is not None:  # back into the cloud's frame
                rot, trans = pose[:2, :2], pose[:2, 3]
                xy = rot.T @ (xy - trans)
                v = rot.T @ v
                yaw = _wrap(yaw - math.atan2(pose[1, 0], pose[0, 0]))
                r4 = np.zeros((4, 4))
                r4[:2, :2] = r4[2:, 2:] = rot.T
                P = r4 @ P @ r4.T
            boxes[i] = [xy[0], xy[1], t.z, *t.size, yaw]
            vel[i] = v
            cov[i] = P
        return TrackFrame(
            detection_track_ids=det_track,
            track_ids=np.array([t.track_id for t in shown], np.int64),
            boxes=boxes.astype(np.float32),
            labels=np.array([t.label for t in shown], np.int64),
            scores=np.array([t.score for t in shown], np.float32),
            velocities=vel.astype(np.float32),
            yaw_rates=np.array([t.yaw_rate for t in shown], np.float32),
            ages=np.array([t.age for t in shown], np.int64),
            ego_motion=pose is not None,
            covariances=cov,
        )

    def predict(self, stamp_ns: int, pose: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The confirmed tracks with a velocity (two hits or more) predicted to ``stamp_ns``, without changing any
        state: boxes (K, 7) and velocities (K, 2) m/s in the cloud frame of ``pose`` (as `update` outputs them;
        ``pose``: that frame in the tracking frame, None when tracking without poses). Empty before the first
        frame, after a stamp that goes back or jumps past ``max_gap_s``, or when poses start or stop."""
        empty = np.zeros((0, 7), np.float32), np.zeros((0, 2), np.float32)
        if self._last_stamp is None or (pose is not None) != self._last_pose_given:
            return empty
        dt = (int(stamp_ns) - self._last_stamp) * 1e-9
        if dt < 0.0 or dt > self.config.max_gap_s:
            return empty
        shown = [t for t in self._tracks if t.established]
        boxes = np.zeros((len(shown), 7), np.float64)
        vel = np.zeros((len(shown), 2), np.float64)
        if pose is not None:
            pose = np.asarray(pose, np.float64)
            rot, trans, heading = pose[:2, :2], pose[:2, 3], math.atan2(pose[1, 0], pose[0, 0])
        for i, t in enumerate(shown):
            xy, v, yaw = t.x[:2] + t.x[2:4] * dt, t.x[2:4], t.yaw + t.yaw_rate * dt
            if pose is not None:  # back into the cloud's frame
                xy, v, yaw = rot.T @ (xy - trans), rot.T @ v, yaw - heading
            boxes[i] = [xy[0], xy[1], t.z, *t.size, _wrap(yaw)]
            vel[i] = v
        return boxes.astype(np.float32), vel.astype(np.float32)

    def diagnostics(self) -> dict[str, Any]:
        """Counters for the node's /diagnostics (keys tracking_*)."""
        ego = ("odometry" if self._last_pose_given else
               "none: velocities are relative to the sensor (set odometry_topic)") if self.frames else "no frame yet"
        return {"tracking_ego_motion": ego, "tracking_active_tracks": self.active_tracks,
                "tracking_confirmed_tracks": self.confirmed_tracks, "tracking_next_id": self._next_id,
                "tracking_resets": self.resets, "tracking_rejected_boxes": self.rejected_boxes,
                "tracking_frames_without_ego_motion": self.frames_without_ego_motion}
