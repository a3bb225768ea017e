"""Sensor presets (config/<sensor>.yaml) and how their parameters become DetectionPipeline options.

One mapping for the node and the offline CLIs (`livox-infer detect/eval --sensor NAME`), so offline results
equal what the node publishes with the same preset. ROS-free: the presets are ROS 2 parameter files, read here
as plain YAML.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from livox_infer.errors import ConfigError
from livox_infer.decode.pointcloud import DEFAULT_MAX_POINTS

SENSOR_PRESETS = ("mid40", "mid70", "tele15", "horizon", "avia")


def preset_path(sensor: str) -> Path:
    from livox_infer.resources import find

    if sensor not in SENSOR_PRESETS:
        raise ConfigError(f"unknown sensor preset {sensor!r}; presets: {list(SENSOR_PRESETS)}")
    return find("config", f"{sensor}.yaml")


def load_preset(sensor: str) -> dict[str, Any]:
    """The preset's parameter values (its ``/**: ros__parameters`` mapping)."""
    import yaml

    path = preset_path(sensor)
    try:
        return dict(yaml.safe_load(path.read_text())["/**"]["ros__parameters"])
    except (OSError, yaml.YAMLError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path}: not a ROS 2 parameter file with '/**: ros__parameters' ({exc})") from None


def pipeline_options(values: dict[str, Any]) -> dict[str, Any]:
    """Node / preset parameters -> DetectionPipeline keyword arguments (constructor and update())."""
    try:
        extent = values.get("bev_extent")
        return {
            "model": values["model"],
            "weights": values["weights"] or None,
            "device": values["device"],
            "compile": bool(values["use_compile"]),
            "aoti_package": values["aoti_package"] or None,
            "test_time_flip": bool(values["test_time_flip"]),
            "refine": bool(values["refine"]),
            "score_thresholds": {
                "car": float(values["score_threshold_car"]),
                "pedestrian": float(values["score_threshold_pedestrian"]),
                "cyclist": float(values["score_threshold_cyclist"]),
            },
            "roi": tuple(float(values[f"roi_{a}_{b}"]) for b in ("min", "max") for a in "xyz"),
            "max_range": float(values["max_range"]),
            "max_points": int(values.get("max_points", DEFAULT_MAX_POINTS)),
            "tag_filter": values["tag_filter"],
            "intensity_scale": float(values["intensity_scale"]),
            "sensor_height": "auto" if values["estimate_ground"] else float(values["sensor_height"]),
            "bev_extent": tuple(float(v) for v in extent) if extent else None,
        }
    except KeyError as exc:
        raise ConfigError(f"sensor parameters lack {exc}") from None
