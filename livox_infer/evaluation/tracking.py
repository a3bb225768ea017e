"""Tracking accuracy on simulated sequences (`livox-infer eval --tracking --sim-frames N`): MOTA, ID switches and
velocity error per class, with the sensor standing and moving.

Each sequence is one held-out simulated drive (same scene, ``N`` frames at 10 Hz; street / open alternating); the
pipeline detects every frame and `livox_infer.tracking.Tracker` tracks them with the simulator's poses as odometry,
so velocities are over ground, as the simulator's ground truth (object ids stable across the drive, velocities in
the sensor frame's axes). Protocol (CLEAR MOT, nuScenes-style centre distance):

- per frame and class, a confirmed track output matches a ground-truth object within ``MATCH_DISTANCE`` m (BEV
  centre); a correspondence of the previous frame that is still within the distance is kept, the rest are matched
  greedily by distance;
- ground truth with fewer than ``--min-points`` returns or outside the evaluated region is ignored: unmatched it is
  no miss, and a track matched to it is no false positive;
- MOTA = 1 - (misses + false positives + ID switches) / ground-truth boxes; an ID switch is a ground-truth object
  matched to another track id than at its last match; "ID switches per 100 tracks" divides by the number of
  ground-truth objects seen (not ignored) at least once;
- velocity error = |v_track - v_gt| (m/s, BEV) over the matched pairs: median and p90.
"""

from __future__ import annotations

import json
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from livox_infer.errors import ConfigError

MATCH_DISTANCE = 2.0  # m, BEV centre distance (nuScenes tracking)
CONDITIONS: dict[str, dict[str, Any]] = {
    "standing": {"ego_speed": 0.0, "yaw_rate_dps": 0.0},
    "moving": {"ego_speed": [5.0, 15.0], "yaw_rate_dps": [-10.0, 10.0]},
}


@dataclass
class ClassCounts:
    gt: int = 0
    matches: int = 0
    misses: int = 0
    false_positives: int = 0
    id_switches: int = 0
    gt_ids: set = field(default_factory=set)
    track_ids: set = field(default_factory=set)
    velocity_errors: list = field(default_factory=list)
    moving_velocity_errors: list = field(default_factory=list)  # ground truth faster than 0.5 m/s

    def to_dict(self) -> dict[str, Any]:
        ve = np.asarray(self.velocity_errors, float)
        vm = np.asarray(self.moving_velocity_errors, float)
        n_tracks = len(self.gt_ids)

        def q(a, p):
            return float(np.percentile(a, p)) if len(a) else float("nan")

        return {
            "gt_boxes": self.gt, "matches": self.matches, "misses": self.misses,
            "false_positives": self.false_positives, "id_switches": self.id_switches,
            "gt_tracks": n_tracks, "output_tracks": len(self.track_ids),
            "mota": 1.0 - (self.misses + self.false_positives + self.id_switches) / self.gt if self.gt else float("nan"),
            "id_switches_per_100_tracks": 100.0 * self.id_switches / n_tracks if n_tracks else float("nan"),
            "velocity_error_median": q(ve, 50), "velocity_error_p90": q(ve, 90),
            "moving_velocity_error_median": q(vm, 50), "moving_velocity_error_p90": q(vm, 90),
            "velocity_pairs": int(len(ve)),
        }


class TrackingScorer:
    """Accumulates CLEAR-MOT counts per class over sequences (see the module docstring)."""

    def __init__(self, classes: Sequence[str], min_points: int, region, distance: float = MATCH_DISTANCE) -> None:
        self.classes = tuple(classes)
        self.min_points = int(min_points)
        self.region = region
        self.distance = float(distance)
        self.counts = {c: ClassCounts() for c in self.classes}
        self._last: dict[tuple[int, int], int] = {}  # (sequence, gt id) -> track id of its last match
        self._current: dict[tuple[int, int], int] = {}  # correspondences of the previous frame

    def _inside(self, boxes: np.ndarray) -> np.ndarray:
        if self.region is None or len(boxes) == 0:
            return np.ones(len(boxes), bool)
        x0, x1, y0, y1 = self.region
        return (boxes[:, 0] >= x0) & (boxes[:, 0] < x1) & (boxes[:, 1] >= y0) & (boxes[:, 1] < y1)

    def add_frame(self, seq: int, gt_boxes, gt_labels, gt_ids, gt_vel, gt_points, tracks) -> None:
        gt_boxes = np.asarray(gt_boxes, float).reshape(-1, 7)
        valid = (np.asarray(gt_points) >= self.min_points) & self._inside(gt_boxes)
        keep_tracks = self._inside(tracks.boxes.astype(float)) if len(tracks.track_ids) else np.zeros(0, bool)
        current: dict[tuple[int, int], int] = {}
        for ci, name in enumerate(self.classes):
            c = self.counts[name]
            g_idx = np.nonzero(np.asarray(gt_labels) == ci)[0]
            t_idx = np.nonzero((tracks.labels == ci) & keep_tracks)[0] if len(tracks.track_ids) else np.zeros(0, int)
            if len(g_idx) == 0 and len(t_idx) == 0:
                continue
            d = np.full((len(g_idx), len(t_idx)), np.inf)
            if len(g_idx) and len(t_idx):
                d = np.hypot(gt_boxes[g_idx, None, 0] - tracks.boxes[None, t_idx, 0],
                             gt_boxes[g_idx, None, 1] - tracks.boxes[None, t_idx, 1])
            pairs: list[tuple[int, int]] = []
            used_g, used_t = set(), set()
            # keep last frame's correspondences that still hold
            tid_col = {int(tracks.track_ids[t]): j for j, t in enumerate(t_idx)}
            for i, g in enumerate(g_idx):
                prev = self._current.get((seq, int(gt_ids[g])))
                j = tid_col.get(prev) if prev is not None else None
                if j is not None and j not in used_t and d[i, j] <= self.distance:
                    pairs.append((i, j))
                    used_g.add(i)
                    used_t.add(j)
            # valid ground truth first, then ignored (a track on an ignored object is no false positive)
            for want_valid in (True, False):
                cand = sorted((d[i, j], i, j) for i in range(len(g_idx)) for j in range(len(t_idx))
                              if valid[g_idx[i]] == want_valid and d[i, j] <= self.distance)
                for _, i, j in cand:
                    if i in used_g or j in used_t:
                        continue
                    pairs.append((i, j))
                    used_g.add(i)
                    used_t.add(j)
            matched_g = {i: j for i, j in pairs}
            for i, g in enumerate(g_idx):
                if not valid[g]:
                    continue
                key = (seq, int(gt_ids[g]))
                c.gt += 1
                c.gt_ids.add(key)
                j = matched_g.get(i)
                if j is None:
                    c.misses += 1
                    continue
                t = t_idx[j]
                tid = int(tracks.track_ids[t])
                c.matches += 1
                c.track_ids.add((seq, tid))
                if key in self._last and self._last[key] != tid:
                    c.id_switches += 1
                self._last[key] = tid
                current[key] = tid
                err = float(np.hypot(*(tracks.velocities[t].astype(float) - np.asarray(gt_vel[g], float))))
                c.velocity_errors.append(err)
                if float(np.hypot(*np.asarray(gt_vel[g], float))) > 0.5:
                    c.moving_velocity_errors.append(err)
            for i, g in enumerate(g_idx):  # correspondences with ignored GT carry on too (no count)
                if not valid[g] and i in matched_g:
                    current[(seq, int(gt_ids[g]))] = int(tracks.track_ids[t_idx[matched_g[i]]])
            for j in range(len(t_idx)):
                if j not in used_t:
                    c.false_positives += 1
                    c.track_ids.add((seq, int(tracks.track_ids[t_idx[j]])))
        self._current = current

    def result(self) -> dict[str, dict[str, Any]]:
        return {name: c.to_dict() for name, c in self.counts.items()}


def simulated_sequence(sensor: str, seed: int, scene: str, frames: int, sim_options: dict) -> list:
    """``frames`` consecutive SimFrames of one held-out drive."""
    from livox_infer.sim.simulate import simulate_frame

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return [simulate_frame(sensor, seed, frame_index=k, scene=scene, **sim_options) for k in range(frames)]


def evaluate_tracking(pipe, tracker_config, sensors: Sequence[str], sequences: int, frames: int, seed: int = 0,
                      sim_options: dict | None = None, min_points: int = 5, region=None,
                      conditions: Sequence[str] = tuple(CONDITIONS)) -> dict[str, Any]:
    """Tracking metrics per condition (standing / moving sensor) and class; see the module docstring."""
    from livox_infer.decode.pointcloud import Cloud
    from livox_infer.evaluation.simulated import SIM_EVAL_SEED_BASE
    from livox_infer.tracking import Tracker, candidates_of

    classes = tuple(pipe.cfg.classes)
    out: dict[str, Any] = {}
    for cond in conditions:
        options = {**CONDITIONS[cond], **(sim_options or {})}
        scorer = TrackingScorer(classes, min_points, region)
        seq = 0
        for sensor in sensors:
            for i in range(sequences):
                sim_seed = SIM_EVAL_SEED_BASE + seed * 10_007 + i
                drive = simulated_sequence(sensor, sim_seed, ("street", "open")[i % 2], frames, options)
                tracker = Tracker(tracker_config, classes)
                pipe.reset_ground()
                for f in drive:
                    valid = f.valid
                    stamp = int(round(f.stamp * 1e9))
                    cloud = Cloud(np.ascontiguousarray(f.points[valid]), None, f.tag[valid], stamp, "sensor")
                    d = pipe.detect(cloud)
                    tracks = tracker.update(_np(d.boxes), _np(d.labels), _np(d.scores), stamp, f.pose,
                                            candidates_of(d))
                    scorer.add_frame(seq, f.boxes, f.labels, f.object_ids, f.velocities, f.num_points, tracks)
                seq += 1
        out[cond] = {"sim_options": options, "classes": scorer.result()}
    return out


def _np(x) -> np.ndarray:
    return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)


def table(results: dict[str, Any], title: str) -> str:
    lines = [title, f"{'condition':<10} {'class':<11} {'MOTA':>6} {'IDsw':>5} {'IDsw/100':>8} {'GT trk':>6} "
                    f"{'GT box':>6} {'miss':>5} {'FP':>5} {'v med':>6} {'v p90':>6} {'v med mov':>9}"]
    for cond, res in results.items():
        for name, m in res["classes"].items():
            lines.append(f"{cond:<10} {name:<11} {m['mota']:>6.3f} {m['id_switches']:>5d} "
                         f"{m['id_switches_per_100_tracks']:>8.2f} {m['gt_tracks']:>6d} {m['gt_boxes']:>6d} "
                         f"{m['misses']:>5d} {m['false_positives']:>5d} {m['velocity_error_median']:>6.2f} "
                         f"{m['velocity_error_p90']:>6.2f} {m['moving_velocity_error_median']:>9.2f}")
    return "\n".join(lines)


def main_tracking(args, pipe) -> int:
    from livox_infer.evaluation.options import eval_region, parse_sim_options, sim_sensors
    from livox_infer.params import DEFAULTS, class_params
    from livox_infer.tracking import TrackerConfig

    if not args.sim_frames or args.sim_frames < 2:
        raise ConfigError("--tracking needs --sim-frames N (frames per sequence, at least 2)")
    if args.sim_sequences < 1:
        raise ConfigError(f"--sim-sequences must be >= 1, got {args.sim_sequences}")
    values = {**DEFAULTS, **{p.name: p.default for p in class_params(pipe.cfg)}}
    config = TrackerConfig.from_params(values)
    pipe.update(candidate_score=values["tracking_low_score"])  # as the node: low-scored boxes continue tracks
    region = eval_region(args, pipe.cfg)
    sensors = sim_sensors(args)
    t0 = time.perf_counter()
    res = evaluate_tracking(pipe, config, sensors, args.sim_sequences, args.sim_frames, args.seed,
                            parse_sim_options(args.sim_option), args.min_points, region)
    print(table(res, f"== tracking: {args.sim_sequences} sequences x {args.sim_frames} frames per sensor "
                     f"({', '.join(sensors)}), confirmed tracks vs GT within {MATCH_DISTANCE:g} m, GT with < "
                     f"{args.min_points} points ignored ({time.perf_counter() - t0:.0f} s) =="))
    out = {"sequences_per_sensor": args.sim_sequences, "frames_per_sequence": args.sim_frames, "seed": args.seed,
           "sensors": sensors, "min_points": args.min_points, "region": list(region),
           "match_distance_m": MATCH_DISTANCE, "score_threshold": args.score_threshold,
           "tracker": {"confirm_hits": config.confirm_hits, "max_misses": config.max_misses,
                       "gates": dict(config.gates), "low_score": values["tracking_low_score"]},
           "conditions": res}
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2, allow_nan=True))
    return 0
