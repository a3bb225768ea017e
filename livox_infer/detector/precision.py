"""Arithmetic of stage 1's backbone and neck at inference: fp32, or bfloat16 autocast where the CPU has AMX.

On a CPU with AMX tiles (Intel Sapphire Rapids and newer) oneDNN runs the backbone's and neck's convolutions in
bfloat16 about twice as fast as in fp32 (Avia grid, 1 thread: 34.6 -> 22.6 ms eager, 32.1 -> 16.5 ms compiled;
docs/performance.md). The weights were trained under the same autocast (training/train.py resolve_precision). The
head's last convolutions stay fp32: with them in bf16 too, simulated car BEV AP@0.7 fell 0.027 (box sizes and
offsets lose bits); with them in fp32 every AP stayed within 0.001 of fp32 (docs/detector.md, Precision).
Elsewhere bf16 would be emulated (slower), so "auto" keeps fp32 there and on CUDA (not measured)."""

from __future__ import annotations

import torch

from livox_infer.errors import ConfigError
from livox_infer.params import PRECISIONS


def cpu_has_amx() -> bool:
    return bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)())


def resolve_precision(precision: str, device: torch.device) -> str:
    """"fp32" or "bf16" for ``precision`` ("auto", "fp32", "bf16") on ``device``."""
    if precision not in PRECISIONS:
        raise ConfigError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision != "auto":
        return precision
    return "bf16" if device.type == "cpu" and cpu_has_amx() else "fp32"


def amp_dtype(precision: str) -> torch.dtype | None:
    """The autocast dtype of a resolved precision (None: plain fp32)."""
    return torch.bfloat16 if precision == "bf16" else None
