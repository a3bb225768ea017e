"""Option parsers shared by `livox-infer eval` and `train`: --sim-option KEY=VALUE, --ranges, the evaluated region."""

from __future__ import annotations

import argparse
from typing import Any, Sequence


from livox_infer.errors import ConfigError
from livox_infer.evaluation.metrics import range_bins


RESERVED_SIM_KEYS = ("sensor", "seed", "frame_index", "scene")  # simulate_frame arguments the commands set


def parse_sim_options(items: Sequence[str]) -> dict[str, Any]:
    """``["KEY=VALUE", ...]`` (VALUE in YAML: numbers, [lo, hi] ranges, true/false) -> dict."""
    import yaml

    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--sim-option must be KEY=VALUE, got {item!r}")
        if key.strip() in RESERVED_SIM_KEYS:
            raise ConfigError(f"--sim-option {key.strip()}: the command chooses it (held-out and training frames "
                              "alternate street / open scenes and draw their own seeds; sensors: --sensors)")
        try:
            out[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            raise ConfigError(f"--sim-option {item!r}: value is not valid YAML ({exc})") from exc
    return out


def parse_ranges(value: str | None) -> list[float] | None:
    """'0,20,40,inf' -> [0.0, 20.0, 40.0, inf] (checked by `range_bins`); None stays None."""
    if value is None:
        return None
    try:
        edges = [float(v) for v in str(value).split(",") if v.strip()]
    except ValueError as exc:
        raise ConfigError(f"--ranges must be comma-separated distances in metres, got {value!r}") from exc
    range_bins(edges)
    return edges


def eval_region(args: argparse.Namespace, cfg) -> tuple[float, float, float, float]:
    """--region, else the grid the detector runs on (--bev-extent, the --sensor preset's, or the model's own)."""
    if args.region:
        return tuple(args.region)
    extent = getattr(args, "bev_extent", None)
    if extent is None and getattr(args, "sensor", None):  # as the pipeline: a given --bev-extent wins
        from livox_infer.presets import preset_pipeline_options

        extent = preset_pipeline_options(args.sensor)["bev_extent"]
    return cfg.with_extent(extent).grid.region if extent else cfg.grid.region


def sim_sensors(args: argparse.Namespace) -> list[str]:
    """The sensors --sim-frames simulates: --sensor alone, else the --sensors list."""
    return [args.sensor] if args.sensor else [s.strip() for s in args.sensors.split(",") if s.strip()]
