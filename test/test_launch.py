"""launch/detect.launch.py with the upstream launch / launch_ros packages.

launch and launch_ros are not on PyPI, so these tests skip where they are not importable (a ROS 2
install has them; docs/node.md describes how the file was verified against upstream sources).
"""

from __future__ import annotations

import importlib.util
import os
import threading
from pathlib import Path

import sys

import pytest

from ros_upstream import PREFIX

# launch and launch_ros as scripts/setup_ros_upstream.sh installs them (make setup): on the path in-process too, so
# these tests run wherever the live `ros2 launch` tests run (without it they were skipped everywhere, CI included)
_UPSTREAM_SITE = PREFIX / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
if _UPSTREAM_SITE.is_dir() and str(_UPSTREAM_SITE) not in sys.path:
    sys.path.insert(0, str(_UPSTREAM_SITE))
pytest.importorskip("launch_ros")
launch = pytest.importorskip("launch")
if not hasattr(launch, "LaunchDescription"):  # the repo's launch/ folder seen as a namespace package
    pytest.skip("the ROS 2 launch package is not installed", allow_module_level=True)

REPO = Path(__file__).resolve().parent.parent
LAUNCH_FILE = REPO / "launch" / "detect.launch.py"


def load_launch_module():
    spec = importlib.util.spec_from_file_location("detect_launch", LAUNCH_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def node_for(**arguments) -> dict:
    """The keyword arguments detect.launch.py gives launch_ros's Node for ``arguments``."""
    from launch import LaunchContext

    module = load_launch_module()
    captured = {}
    module.Node = lambda **kwargs: captured.update(kwargs) or kwargs  # record instead of building the action
    ld = module.generate_launch_description()
    context = LaunchContext()
    for action in ld.entities:
        if isinstance(action, launch.actions.DeclareLaunchArgument):
            default = "".join(s.perform(context) for s in action.default_value) if action.default_value else ""
            context.launch_configurations[action.name] = arguments.get(action.name, default)
    opaque = [a for a in ld.entities if isinstance(a, launch.actions.OpaqueFunction)][0]
    opaque.execute(context)
    return captured


def test_defaults_load_the_avia_preset_without_overrides():
    node = node_for()
    assert node["package"] == "livox_infer" and node["executable"] == "detector_node"
    assert node["name"] == "livox_detector"
    base, params_file = node["parameters"]
    assert Path(base).name == "detector.param.yaml" and Path(base).is_file()
    assert Path(params_file).name == "avia.param.yaml" and Path(params_file).is_file()


def test_overrides_are_passed_only_when_given():
    node = node_for(sensor="horizon", input_topic="/points", use_compile="false", device="cpu")
    base, params_file, overrides = node["parameters"]
    assert Path(base).name == "detector.param.yaml" and Path(params_file).name == "horizon.param.yaml"
    assert overrides == {"input_topic": "/points", "device": "cpu", "use_compile": False}
    custom = REPO / "config" / "tele15.param.yaml"
    assert node_for(params_file=str(custom))["parameters"] == [base, str(custom)]


def test_bad_arguments_are_refused():
    with pytest.raises(RuntimeError, match="use_compile"):
        node_for(use_compile="maybe")
    with pytest.raises(RuntimeError, match="params_file"):
        node_for(params_file="/nonexistent.yaml")
    with pytest.raises(RuntimeError, match="device must be one of"):  # checked against livox_infer.params
        node_for(device="gpu")


def test_arguments_derive_from_the_parameter_table():
    from livox_infer.params import BY_NAME, SENSOR_PRESETS

    module = load_launch_module()
    declared = {a.name: a for a in module.generate_launch_description().entities
                if isinstance(a, launch.actions.DeclareLaunchArgument)}
    assert set(module.OVERRIDES) <= set(BY_NAME) and set(module.OVERRIDES) <= set(declared)
    assert declared["sensor"].choices == list(SENSOR_PRESETS)
    assert BY_NAME["device"].doc in declared["device"].description
    assert node_for(model="full")["parameters"][-1] == {"model": "full"}


def test_launch_starts_the_node_with_the_preset(monkeypatch):
    """Full `ros2 launch` path; needs livox_infer installed in the ament index (colcon install, or make setup's
    venv index with the upstream tools' environment)."""
    from ament_index_python.packages import PackageNotFoundError, get_package_prefix

    from ros_upstream import ros_env, skip_reason

    if skip_reason() is None:  # the environment `source <prefix>/setup.sh` gives, as a ROS user's shell has it
        for key, value in ros_env().items():
            if key in ("AMENT_PREFIX_PATH", "PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "ROS_DOMAIN_ID",
                       "ROS_AUTOMATIC_DISCOVERY_RANGE"):
                monkeypatch.setenv(key, value)

    try:
        prefix = get_package_prefix("livox_infer")
    except (PackageNotFoundError, OSError):  # OSError: AMENT_PREFIX_PATH unset (no ROS environment)
        pytest.skip("livox_infer is not installed in the ament index (colcon build)")
    if not (Path(prefix) / "lib" / "livox_infer" / "detector_node").exists():
        pytest.skip("no detector_node executable in the ament prefix")
    import rclpy
    from launch import LaunchService
    from launch.actions import IncludeLaunchDescription
    from launch.launch_description_sources import PythonLaunchDescriptionSource
    from rcl_interfaces.srv import GetParameters
    from rclpy.context import Context

    service = LaunchService()
    service.include_launch_description(IncludeLaunchDescription(
        PythonLaunchDescriptionSource(str(LAUNCH_FILE)),
        launch_arguments=[("sensor", "horizon"), ("use_compile", "false"), ("device", "cpu"),
                          ("input_topic", "/launch_test_points"), ("node_name", "launch_test_detector")]))
    result = {}

    def query():
        ctx = Context()
        rclpy.init(context=ctx)
        n = rclpy.create_node("launch_test_client", context=ctx)
        try:
            client = n.create_client(GetParameters, "/launch_test_detector/get_parameters")
            if client.wait_for_service(timeout_sec=45):
                names = ["sensor", "input_topic", "use_compile", "roi_y_max"]
                fut = client.call_async(GetParameters.Request(names=names))
                from rclpy.executors import SingleThreadedExecutor

                ex = SingleThreadedExecutor(context=ctx)
                ex.add_node(n)
                ex.spin_until_future_complete(fut, timeout_sec=10)
                v = fut.result().values
                result.update(sensor=v[0].string_value, input_topic=v[1].string_value, use_compile=v[2].bool_value,
                              roi_y_max=v[3].double_value)
        finally:
            n.destroy_node()
            ctx.try_shutdown()
            service.shutdown()

    threading.Thread(target=query, daemon=True).start()
    assert service.run() == 0
    assert result == {"sensor": "horizon", "input_topic": "/launch_test_points", "use_compile": False,
                      "roi_y_max": 40.0}


def test_rig_argument_is_passed_to_the_node():
    node = node_for(sensor="horizon", rig="rigs/livox_dataset_v1.yaml")
    assert node["parameters"][2] == {"rig": "rigs/livox_dataset_v1.yaml"}


@pytest.mark.parametrize("body,needle", [
    ("    max_range: far\n", "max_range must be a number, got 'far'"),
    ("    max_rnge: 50.0\n", "unknown parameter 'max_rnge' (did you mean 'max_range'?)"),
    ("    max_range: [1\n", "not valid YAML"),
])
def test_a_bad_params_file_stops_the_launch_with_one_line(tmp_path, body, needle):
    path = tmp_path / "my.yaml"
    path.write_text("/**:\n  ros__parameters:\n" + body)
    with pytest.raises(RuntimeError) as err:
        node_for(params_file=str(path))
    assert needle in str(err.value) and "\n" not in str(err.value)


def launch_actions(module, **arguments) -> list:
    """The actions detect.launch.py's OpaqueFunction returns for ``arguments`` (launch_ros Node recorded as a dict)."""
    from launch import LaunchContext

    module.Node = lambda **kwargs: kwargs
    ld = module.generate_launch_description()
    context = LaunchContext()
    for action in ld.entities:
        if isinstance(action, launch.actions.DeclareLaunchArgument):
            default = "".join(s.perform(context) for s in action.default_value) if action.default_value else ""
            context.launch_configurations[action.name] = arguments.get(action.name, default)
    opaque = [a for a in ld.entities if isinstance(a, launch.actions.OpaqueFunction)][0]
    return opaque.execute(context)


def test_input_type_output_frame_and_use_sim_time_are_passed_to_the_node():
    node = node_for(sensor="horizon", input_type="custom_msg", output_frame="base_link", use_sim_time="true")
    assert node["parameters"][2] == {"input_type": "custom_msg", "output_frame": "base_link", "use_sim_time": True}
    assert len(node_for(use_sim_time="")["parameters"]) == 2  # empty: the files' value
    with pytest.raises(RuntimeError, match="input_type must be one of"):
        node_for(input_type="pcl")
    with pytest.raises(RuntimeError, match="use_sim_time must be true or false"):
        node_for(use_sim_time="sometimes")


def test_rviz_without_rviz2_is_one_warning_and_the_node_still_starts(monkeypatch):
    module = load_launch_module()
    monkeypatch.setattr(module.shutil, "which", lambda name: None)
    monkeypatch.setattr(module, "_has_package", lambda name: False)
    warnings = []
    monkeypatch.setattr(module, "get_logger", lambda name: type("L", (), {"warning": lambda self, m: warnings.append(m)})())
    monkeypatch.setenv("AMENT_PREFIX_PATH", "/nonexistent")
    actions = launch_actions(module, rviz="true")
    assert len(actions) == 1 and actions[0]["executable"] == "detector_node"
    assert len(warnings) == 1 and "rviz2 is not installed" in warnings[0]
    assert launch_actions(module, rviz="false") and warnings == warnings[:1]


def test_rviz_gets_a_config_with_this_launchs_topics_and_fixed_frame(monkeypatch, tmp_path):
    import yaml

    module = load_launch_module()
    fake = tmp_path / "rviz2"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setattr(module.shutil, "which", lambda name: str(fake))
    monkeypatch.setattr(module, "_has_package", lambda name: False)  # no vision_msgs_rviz_plugins here
    actions = launch_actions(module, rviz="true", output_frame="base_link", input_topic="/points", node_name="det")
    rviz = actions[1]
    cmd = ["".join(s.perform(None) for s in part) for part in rviz.cmd]
    assert cmd[0] == str(fake) and cmd[1] == "-d" and cmd[3:] == ["-f", "base_link"]
    config = yaml.safe_load(Path(cmd[2]).read_text())
    displays = {d["Class"]: d for d in config["Visualization Manager"]["Displays"]}
    assert config["Visualization Manager"]["Global Options"]["Fixed Frame"] == "base_link"
    assert displays["rviz_default_plugins/PointCloud2"]["Topic"]["Value"] == "/points"
    assert displays["rviz_default_plugins/MarkerArray"]["Topic"]["Value"] == "/det/markers"
    assert "vision_msgs_rviz_plugins/Detection3DArray" not in displays  # dropped: the plugin is not installed
    # the rig's frame when no output_frame is given, else the driver's livox_frame
    rig_cmd = launch_actions(module, rviz="true", sensor="horizon", rig="rigs/livox_dataset_v1.yaml")[1].cmd
    assert "".join(s.perform(None) for s in rig_cmd[-1]) == "base_link"
    plain_cmd = launch_actions(module, rviz="true")[1].cmd
    assert "".join(s.perform(None) for s in plain_cmd[-1]) == "livox_frame"


def test_lifecycle_argument_starts_a_managed_node():
    module = load_launch_module()
    recorded = {}
    module.LifecycleNode = lambda **kwargs: recorded.update(kwargs) or kwargs
    action = launch_actions(module, lifecycle="true")[0]
    assert recorded and action == recorded  # the LifecycleNode action, not Node
    assert recorded["arguments"] == ["--lifecycle"] and recorded["namespace"] == ""
    assert recorded["executable"] == "detector_node" and recorded["name"] == "livox_detector"
    plain = launch_actions(load_launch_module())[0]
    assert "arguments" not in plain
    with pytest.raises(RuntimeError, match="lifecycle must be true or false"):
        launch_actions(load_launch_module(), lifecycle="maybe")
