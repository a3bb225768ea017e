"""Weights I/O: safetensors only (no pickle, loading runs no code), tied to the model config.

The metadata holds the architecture dict of the config (JSON) and its hash; `load_weights` refuses a
file whose architecture differs from the config, whose tensors are missing/extra/mis-shaped, or that
is not a readable safetensors file, always with a `WeightsError` saying which and why.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from livox_infer.errors import WeightsError
from livox_infer.model.config import ModelConfig

FORMAT = "livox_infer.bev_detector.v1"


def save_weights(model: nn.Module, cfg: ModelConfig, path: str | Path, extra: dict[str, str] | None = None) -> None:
    from safetensors.torch import save_file

    state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    meta = {
        "format": FORMAT,
        "config_name": cfg.name,
        "architecture": json.dumps(cfg.architecture(), sort_keys=True),
        "architecture_hash": cfg.architecture_hash(),
    }
    for k, v in (extra or {}).items():
        meta[str(k)] = str(v)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(str(path) + ".tmp")
    save_file(state, str(tmp), metadata=meta)
    tmp.replace(path)


def read_metadata(path: str | Path) -> dict[str, str]:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return dict(f.metadata() or {})
    except FileNotFoundError as exc:
        raise WeightsError(f"weights file not found: {path}") from exc
    except Exception as exc:  # noqa: BLE001 - safetensors raises several types for a bad header
        raise WeightsError(f"weights file {path} is not a valid safetensors file: {exc}") from exc


def load_weights(model: nn.Module, cfg: ModelConfig, path: str | Path, map_location: str = "cpu") -> dict[str, str]:
    """Load ``path`` into ``model`` after checking it belongs to ``cfg``. Returns the file's metadata."""
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise WeightsError(
            f"weights file not found: {path} (config {cfg.source or cfg.name}); train one with "
            f"`livox-infer train --config {cfg.name}` or pass weights=<file.safetensors>"
        )
    meta = read_metadata(path)
    if meta.get("format") != FORMAT:
        raise WeightsError(f"{path}: not a livox_infer detector weights file (format={meta.get('format')!r})")
    if meta.get("architecture_hash") != cfg.architecture_hash():
        try:
            theirs = json.loads(meta.get("architecture", "{}"))
        except json.JSONDecodeError:
            theirs = {}
        ours = cfg.architecture()
        diff = sorted(k for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k))
        raise WeightsError(
            f"{path} was trained for a different model config than {cfg.source or cfg.name} "
            f"(differs in: {', '.join(diff) or 'hash'}); use the config it was trained with"
        )
    try:
        state = load_file(str(path), device=map_location)
    except Exception as exc:  # noqa: BLE001
        raise WeightsError(f"weights file {path} is corrupt: {exc}") from exc
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    extra = sorted(set(state) - set(expected))
    bad = sorted(k for k in set(expected) & set(state) if tuple(expected[k].shape) != tuple(state[k].shape))
    if missing or extra or bad:
        raise WeightsError(
            f"{path} does not match the network of {cfg.source or cfg.name}: "
            f"missing {missing[:5]}, unexpected {extra[:5]}, wrong shape {bad[:5]}"
        )
    for k, v in state.items():
        if v.is_floating_point() and not torch.isfinite(v).all():
            raise WeightsError(f"{path}: tensor {k} holds NaN/inf values")
    model.load_state_dict(state)
    return meta
