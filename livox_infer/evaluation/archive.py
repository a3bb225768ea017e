"""`livox-infer eval ARCHIVE --detections-dir DIR`: AP per bag and pooled over an archive.

DIR is the output of ``livox-infer detect ARCHIVE --out-dir DIR`` (locally or on Ray, livox_infer/tools/fleet.py):
``DIR/<name>.jsonl`` holds the detections of the bag found as ``<name>`` below ARCHIVE. Ground truth is each
bag's Detection3DArray topic (``--gt-topic``), with the lidar points inside each box counted from the bag's
clouds (GT with fewer than ``--min-points`` is ignored, as in the one-bag eval). Pooled AP ranks the
detections of every frame of every bag together. A bag without ground truth or detections is reported
and left out of the pool; the others are evaluated.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from livox_infer.errors import ConfigError, LivoxInferError

# the per-bag table's AP columns: each class at its strict BEV threshold
SUMMARY_COLUMNS = (("car", "bev@0.7"), ("pedestrian", "bev@0.5"), ("cyclist", "bev@0.5"))


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("archive (--detections-dir DIR)")
    g.add_argument("--detections-dir", default=None, metavar="DIR",
                   help="INPUT is an archive directory and DIR the output of `livox-infer detect INPUT --out-dir DIR`: "
                        "AP per bag and pooled")


def _bag_frames(job, det_dir: Path, args: argparse.Namespace):
    """(detection frames, GT frames) of one bag, aligned by stamp."""
    from livox_infer.evaluation.simulated import gt_from_bag
    from livox_infer.evaluation.metrics import align_frames, read_jsonl

    det_file = det_dir / f"{job.name}.jsonl"
    if not det_file.is_file():
        raise ConfigError(f"no detections {det_file} (run `livox-infer detect` with --out-dir {det_dir} first)")
    gts, _ = gt_from_bag(job.input, args.gt_topic, args.cloud_topic)
    if not gts:
        raise ConfigError(f"no ground-truth frames on {args.gt_topic}")
    return align_frames(read_jsonl(det_file), gts)


def _summary_line(name: str, res) -> str:
    aps = "".join(f"{res.ap[c].get(k, float('nan')):>18.3f}" for c, k in SUMMARY_COLUMNS)
    gts = "/".join(str(res.num_gt.get(c, 0)) for c, _ in SUMMARY_COLUMNS)
    return f"{name:<32}{res.num_frames:>7}{gts:>14}{aps}"


def main_archive(args: argparse.Namespace) -> int:
    """Exit status 0: every bag evaluated; 1: some bags could not be (listed); 2: bad options / nothing to do."""
    from livox_infer.tools.fleet import discover
    from livox_infer.detector.config import ModelConfig
    from livox_infer.evaluation.metrics import evaluate

    try:
        if not args.input:
            raise ConfigError("give the archive directory (INPUT) with --detections-dir")
        det_dir = Path(args.detections_dir)
        jobs = [j for j in discover([args.input], skip=det_dir.resolve()) if Path(j.input).suffix.lower()
                not in (".pcd", ".bin", ".npy")]  # point files carry no ground truth
        if not jobs:
            raise ConfigError(f"no bags found in {args.input}")
        cfg = ModelConfig.load(args.model)
        region = tuple(args.region) if args.region else cfg.grid.region
    except LivoxInferError as exc:
        print(f"livox-infer eval: {exc}", file=sys.stderr)
        return 2
    header = f"{'bag':<32}{'frames':>7}{'GT c/p/cy':>14}" + "".join(f"{c + ' ' + k:>18}" for c, k in SUMMARY_COLUMNS)
    print(f"== {len(jobs)} bags, AP (R40), GT with < {args.min_points} points ignored ==")
    print(header)
    pooled_d, pooled_g, per_bag, failed = [], [], {}, {}
    for job in jobs:
        try:
            dets, gts = _bag_frames(job, det_dir, args)
            res = evaluate(dets, gts, cfg.classes, args.min_points, region)
        except LivoxInferError as exc:  # one bad bag is reported; the archive is still evaluated
            failed[job.name] = f"{type(exc).__name__}: {exc}"
            print(f"{job.name:<32}  not evaluated: {failed[job.name]}")
            continue
        pooled_d += dets
        pooled_g += gts
        per_bag[job.name] = res.to_dict()
        print(_summary_line(job.name, res))
    out: dict[str, Any] = {"min_points": args.min_points, "region": list(region), "bags": per_bag, "failed": failed}
    if pooled_g:
        pooled = evaluate(pooled_d, pooled_g, cfg.classes, args.min_points, region)
        print(_summary_line(f"pooled ({len(per_bag)} bags)", pooled))
        print(pooled.table(f"== pooled over {len(per_bag)} bags: {pooled.num_frames} frames =="))
        out["pooled"] = pooled.to_dict()
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2, allow_nan=True))
    if failed:
        print(f"{len(failed)} of {len(jobs)} bags not evaluated", file=sys.stderr)
    return 1 if failed else 0
