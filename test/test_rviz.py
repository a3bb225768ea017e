"""rviz/detect.rviz and rviz/detect.foxglove.json: they parse, and name the topics a running detector node really
has (its publishers, its default input topic) and the driver's frame."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
RVIZ = REPO / "rviz" / "detect.rviz"
FOXGLOVE = REPO / "rviz" / "detect.foxglove.json"


@pytest.fixture
def node_topics(ros):
    """{'detections': ..., 'markers': ..., 'input': ...} of a DetectorNode started with the defaults."""
    pytest.importorskip("vision_msgs.msg")
    from livox_infer.params import DEFAULTS
    from livox_infer.ros.node import NODE_NAME, DetectorNode
    from rclpy.parameter import Parameter
    from test_node_support import FakeFactory

    node = ros.add(DetectorNode(pipeline_factory=FakeFactory(), context=ros.context,
                                parameter_overrides=[Parameter("use_compile", value=False)]))
    assert node.get_name() == NODE_NAME
    published = {name for name, _ in node.get_publisher_names_and_types_by_node(NODE_NAME, "/")}
    return {"detections": next(t for t in published if t.endswith("/detections")),
            "markers": next(t for t in published if t.endswith("/markers")), "input": DEFAULTS["input_topic"]}


def test_rviz_config_parses_and_names_the_nodes_topics(node_topics):
    config = yaml.safe_load(RVIZ.read_text())
    manager = config["Visualization Manager"]
    displays = {d["Class"]: d for d in manager["Displays"]}
    assert displays["rviz_default_plugins/PointCloud2"]["Topic"]["Value"] == node_topics["input"]
    assert displays["rviz_default_plugins/PointCloud2"]["Topic"]["Reliability Policy"] == "Best Effort"
    assert displays["rviz_default_plugins/MarkerArray"]["Topic"]["Value"] == node_topics["markers"]
    assert displays["vision_msgs_rviz_plugins/Detection3DArray"]["Topic"]["Value"] == node_topics["detections"]
    assert manager["Global Options"]["Fixed Frame"] == "livox_frame"  # the launch sets it (-f and the copy)


def test_foxglove_layout_parses_and_names_the_nodes_topics(node_topics):
    layout = json.loads(FOXGLOVE.read_text())
    panels = layout["configById"]
    three_d = panels["3D!livox"]
    assert set(three_d["topics"]) == {node_topics["input"], node_topics["markers"], node_topics["detections"]}
    assert panels["RawMessages!livox"]["topicPath"] == node_topics["detections"]
    assert three_d["followTf"] == "livox_frame"
    named = {layout["layout"]["first"], layout["layout"]["second"]["first"], layout["layout"]["second"]["second"]}
    assert named == set(panels)


def test_the_configs_are_installed_with_the_package():
    """setup.py's data_files (pip, colcon) and make setup's share/ layout (editable venv) hold both files."""
    from livox_infer.resources import share_dir

    assert 'f"share/{PACKAGE}/rviz"' in (REPO / "setup.py").read_text()
    for path in (RVIZ, FOXGLOVE):
        installed = share_dir() / "rviz" / path.name
        assert installed.is_file() and installed.read_bytes() == path.read_bytes(), installed
