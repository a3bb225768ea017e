"""One colour per class, shared by the RViz markers (livox_infer.ros.messages) and the BEV pictures
(livox_infer.tools.bev_plot), so a car is the same colour in both (ROS-free)."""

from __future__ import annotations

# RGBA, 0-1. Blue cars, red pedestrians, green cyclists (the markers' colours since the first node), orange trucks,
# purple buses.
CLASS_COLORS: dict[str, tuple[float, float, float, float]] = {
    "car": (0.10, 0.55, 1.00, 1.0),
    "pedestrian": (1.00, 0.25, 0.20, 1.0),
    "cyclist": (0.20, 0.90, 0.30, 1.0),
    "truck": (1.00, 0.65, 0.10, 1.0),
    "bus": (0.75, 0.30, 0.95, 1.0),
}
UNKNOWN_COLOR: tuple[float, float, float, float] = (0.7, 0.7, 0.7, 1.0)  # a class name not in the table


def class_color(name: str) -> tuple[float, float, float, float]:
    """RGBA (0-1) of a class name; grey for a name the table does not know."""
    return CLASS_COLORS.get(str(name), UNKNOWN_COLOR)


def class_color_hex(name: str) -> str:
    """'#rrggbb' of a class name (matplotlib, Foxglove)."""
    r, g, b, _ = class_color(name)
    return "#{:02x}{:02x}{:02x}".format(*(round(255 * v) for v in (r, g, b)))
