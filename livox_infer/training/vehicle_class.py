"""`livox-infer train --stage vehicle-class`: the truck / bus classifier (detector/vehicle_class.py) of a trained
detector, whose other tensors stay as they are.

The frozen detector (stage 1 and both refiners, as inference runs them) makes its truck and bus candidates on the
training frames: the first pass as stored, later passes augmented (`prepare`). A candidate whose BEV IoU with a
labelled truck or bus reaches 0.3 is a sample of that object's class; its side-view features are read from both ends.
The members then train together (each on its own draws, dropout, AdamW), and the validation frames' candidates give
the accuracy and log loss stored with the weights.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path

import numpy as np
import torch

from livox_infer.detector.boxes import bev_iou
from livox_infer.detector.config import ModelConfig
from livox_infer.detector.postprocess import topk_decode
from livox_infer.detector.vehicle_class import side_view_features, view_ceiling
from livox_infer.detector.weights import save_weights
from livox_infer.errors import ConfigError

log = logging.getLogger("livox_infer.train")

MATCH_IOU = 0.3  # a candidate this close (BEV IoU) to a labelled truck / bus learns its class
MIN_SCORE = 0.05  # candidates scored lower are not samples (the AP ranking stops at 0.1)
SAMPLES_PER_STEP = 256  # per member
DROPOUT = 0.3


@torch.no_grad()
def collect_samples(net: torch.nn.Module, cfg: ModelConfig, frames: list, passes: int, seed: int,
                    device: torch.device, prepare, stage2_points) -> tuple[torch.Tensor, torch.Tensor]:
    """Features (2, S, F) of the candidates matched to a truck / bus (read from either end) and their targets
    (S,): 1 for the classifier's second class. Pass 0 sees the frames as stored, pass k > 0 augmented with
    generator seed (seed, k). ``prepare`` / ``stage2_points``: the training loop's."""
    from livox_infer.voxelize.reference import ReferenceConstants

    vc = cfg.vehicle_classifier
    first, second = (cfg.classes.index(c) for c in vc.classes)
    consts = ReferenceConstants(cfg.grid)
    feats: list[torch.Tensor] = []
    targets: list[torch.Tensor] = []
    for k in range(passes):
        rng = None if k == 0 else np.random.default_rng([seed, k])
        for f in frames:
            mount: list = []
            bev, _, boxes, labels, _, points = prepare(f, rng, cfg, consts, mount_out=mount)
            s, lab, b = (t[0] for t in topk_decode(net(bev[None].to(device)), cfg))
            pts = stage2_points(points, cfg).to(device)
            s, lab, b = net.refine(pts, s, lab, b, cfg.grid.intensity_scale, sensor_height=mount[0].height,
                                     classify=False)
            mine = ((lab == first) | (lab == second)) & (s >= MIN_SCORE)
            gl = torch.as_tensor(np.asarray(labels), device=device)
            gt = (gl == first) | (gl == second)
            if not bool(mine.any()) or not bool(gt.any()):
                continue
            cand = b[mine].float()
            gboxes = torch.as_tensor(np.asarray(boxes), device=device)[gt].float()
            best, j = bev_iou(cand, gboxes).max(1)
            ok = best >= MATCH_IOU
            if not bool(ok.any()):
                continue
            cand = cand[ok]
            ceiling = view_ceiling(pts, cand, mount[0].height)
            feats.append(torch.stack([side_view_features(pts, cand, vc, False, ceiling),
                                      side_view_features(pts, cand, vc, True, ceiling)]))
            targets.append((gl[gt][j[ok]] == second).float())
    if not feats:
        return torch.zeros(2, 0, vc.num_features), torch.zeros(0)
    return torch.cat(feats, 1).cpu(), torch.cat(targets).cpu()


def fit(classifier: torch.nn.Module, feats: torch.Tensor, targets: torch.Tensor, steps: int, lr: float,
        weight_decay: float, seed: int, lr_at=None) -> float:
    """Train every member on its own draws of (either end of) the samples; returns the last loss. ``lr_at``:
    ``fn(progress, peak) -> learning rate`` (the training loop's `train.lr_at`; None: constant ``lr``)."""
    gen = torch.Generator().manual_seed(seed)
    x = feats.reshape(-1, feats.shape[-1])  # both ends are samples
    y = targets.repeat(2)
    e = classifier.cfg.members
    opt = torch.optim.AdamW(classifier.parameters(), lr=lr, weight_decay=weight_decay)
    classifier.dropout = DROPOUT
    classifier.train()
    loss = torch.zeros(())
    for step in range(steps):
        for grp in opt.param_groups:
            grp["lr"] = lr if lr_at is None else lr_at(step / steps, lr)
        idx = torch.randint(0, y.shape[0], (e, SAMPLES_PER_STEP), generator=gen)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(classifier(x[idx]), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    classifier.eval()
    return float(loss.detach())


@torch.no_grad()
def accuracy(classifier: torch.nn.Module, feats: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    """Accuracy and log loss of the averaged bus probability (both ends, all members) on samples."""
    if targets.numel() == 0:
        return {"samples": 0, "accuracy": math.nan, "log_loss": math.nan}
    p = classifier.probability(feats).clamp(1e-4, 1 - 1e-4)
    return {"samples": int(targets.numel()), "accuracy": float(((p >= 0.5).float() == targets).float().mean()),
            "log_loss": float(torch.nn.functional.binary_cross_entropy(p, targets))}


def train_vehicle_classifier(net: torch.nn.Module, cfg: ModelConfig, train_frames: list, val_frames: list, opts,
                             out: Path, device: torch.device, args_json: str, real_sources: tuple[str, ...],
                             prepare, stage2_points, lr_at) -> float:
    """The stage's run: samples, fit, validation, weights at ``out``; returns the validation accuracy.
    ``prepare``, ``stage2_points``, ``lr_at``: the training loop's (`livox_infer.training.train`), passed in so that
    this module does not import it."""
    if cfg.vehicle_classifier is None:
        raise ConfigError(f"--stage vehicle-class needs a model config with a vehicle_classifier section "
                          f"({cfg.source or cfg.name} has none)")
    t0 = time.time()
    net.eval()
    net.requires_grad_(False)
    feats, targets = collect_samples(net, cfg, train_frames, opts.vehicle_class_passes, opts.seed, device, prepare,
                                     stage2_points)
    val_feats, val_targets = collect_samples(net, cfg, val_frames, 1, opts.seed, device, prepare, stage2_points)
    log.info("vehicle classifier: %d training samples (%.0f %% %s), %d validation samples, %.0f s",
             targets.numel(), 100 * float(targets.mean()), cfg.vehicle_classifier.classes[1], val_targets.numel(),
             time.time() - t0)
    classifier = net.vehicle_classifier
    torch.manual_seed(opts.seed)
    classifier.reset_parameters()  # a fresh start whatever --init held
    if targets.numel():
        classifier.requires_grad_(True)
        loss = fit(classifier, feats, targets, opts.steps, opts.lr, opts.weight_decay, opts.seed, lr_at)
        classifier.requires_grad_(False)
    else:  # e.g. a scaled-down recipe run: a few frames, a barely trained detector
        loss = math.nan
        log.warning("--stage vehicle-class: the detector made no truck / bus candidate on a labelled truck or bus "
                    "in the %d training frames: the classifier stays untrained (its truck / bus choices are noise)",
                    len(train_frames))
    val = accuracy(classifier, val_feats, val_targets)
    log.info("vehicle classifier: loss %.3f, validation %s (%.1f min)", loss, val, (time.time() - t0) / 60)
    meta = {"trained": "yes", "step": str(opts.steps), "val_score": f"{val['accuracy']:.4f}",
            "vehicle_class_val": json.dumps(val), "vehicle_class_samples": str(int(targets.numel())),
            "train_args": args_json, "real_sources": ",".join(real_sources)}
    save_weights(net, cfg, out, extra=meta)
    log.info("saved weights to %s", out)
    return val["accuracy"]
