"""Checks of the ROS graph around the detector node, for what otherwise looks like a dead node: the input
topic published with another message type (a CustomMsg publisher and a PointCloud2 subscriber never match, so no
frame arrives and nothing else says why), and clouds arriving while nothing subscribes to the outputs (inference
is skipped then, on purpose)."""

from __future__ import annotations

INPUT_TYPE_FOR = {"PointCloud2": "pointcloud2", "CustomMsg": "custom_msg"}


def type_name(cls) -> str:
    """``pkg/msg/Name`` of an rclpy message class."""
    return f"{cls.__module__.split('.')[0]}/msg/{cls.__name__}"


def input_type_mismatch(node, topic: str, expected_cls) -> str | None:
    """Why ``topic``'s publishers cannot reach the node's subscription, or None (no publisher of another type)."""
    expected = type_name(expected_cls)
    others = sorted({info.topic_type for info in node.get_publishers_info_by_topic(topic)} - {expected})
    if not others:
        return None
    hints = sorted({INPUT_TYPE_FOR[t.rsplit("/", 1)[-1]] for t in others if t.rsplit("/", 1)[-1] in INPUT_TYPE_FOR})
    return (f"{topic} is published as {', '.join(others)} but this node subscribes to {expected}: those messages "
            f"never arrive" + (f" (set input_type:={hints[0]})" if hints else ""))


def no_subscribers_note(skipped: int) -> str:
    return (f"{skipped} clouds received while nothing subscribes to ~/detections or ~/markers: inference runs only "
            "for subscribers (see the output with `livox-infer echo` or RViz)")
