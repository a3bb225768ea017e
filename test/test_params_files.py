"""One parameter contract: a parameter file or `-p NAME:=VALUE` is checked against livox_infer.params before the
node starts. An unknown (misspelled) name or a wrong-typed value stops start-up with one line naming the file or
flag and the key; rclpy would otherwise ignore the name, or mix the files' types, and run on a default. Issue 30:
`max_range: far` in a --params-file ran the node with 90.0 without a word."""

from __future__ import annotations

import argparse

import pytest

from livox_infer.errors import ConfigError
from livox_infer.params import check_ros_arguments, read_params_file

BAD = {  # body of ros__parameters -> what the one line must say
    "max_range: far": "max_range must be a number, got 'far'",
    "max_rnge: 50.0": "unknown parameter 'max_rnge' (did you mean 'max_range'?)",
    "use_compile: 'no'": "use_compile must be true or false, got 'no'",
    "accumulate_frames: 2.5": "accumulate_frames must be an integer, got 2.5",
    "bev_extent: [0, 80, a, 40]": "bev_extent must be a list of doubles",
    "input_topics: /livox/lidar": "input_topics must be a list",
    "device: gpu": "device must be one of",
    "score_threshold_cat: 0.5": "unknown parameter 'score_threshold_cat' (did you mean 'score_threshold_car'?)",
    "max_range:": "max_range has no value",
}


def _file(tmp_path, body: str, head: str = "/**") -> str:
    path = tmp_path / "my.param.yaml"
    path.write_text(f"{head}:\n  ros__parameters:\n    {body}\n")
    return str(path)


@pytest.mark.parametrize("body", list(BAD))
def test_a_bad_key_in_a_params_file_is_named_in_one_line(tmp_path, body):
    path = _file(tmp_path, body)
    with pytest.raises(ConfigError) as err:
        check_ros_arguments(["x", "--ros-args", "--params-file", path])
    assert BAD[body] in str(err.value) and path in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("head", ["/**", "livox_detector", "/livox_detector", "/*"])
def test_every_section_that_names_the_node_is_checked(tmp_path, head):
    with pytest.raises(ConfigError, match="max_rnge"):
        check_ros_arguments(["x", "--ros-args", "--params-file", _file(tmp_path, "max_rnge: 1.0", head)])


def test_sections_for_other_nodes_and_rclpy_own_parameters_pass(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("other_node:\n  ros__parameters:\n    whatever: 1\n"
                    "/**:\n  ros__parameters:\n    use_sim_time: true\n    max_range: 100\n"
                    "    bev_extent: [0, 80, -40, 40]\n    score_threshold_car: 0.4\n"
                    "    qos_overrides:\n      /livox/lidar:\n        subscription:\n          depth: 5\n")
    check_ros_arguments(["x", "--ros-args", "--params-file", str(path), "-p", "max_range:=80"])
    assert read_params_file(path)["max_range"] == 100


def test_the_remapped_node_name_picks_the_sections(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("front_detector:\n  ros__parameters:\n    max_rnge: 1.0\n")
    check_ros_arguments(["x", "--ros-args", "--params-file", str(path)])  # another node's section
    with pytest.raises(ConfigError, match="max_rnge"):
        check_ros_arguments(["x", "--ros-args", "--params-file", str(path), "-r", "__node:=front_detector"])


def test_the_shipped_presets_pass():
    from livox_infer.params import SENSOR_PRESETS
    from livox_infer.presets import preset_files

    for sensor in SENSOR_PRESETS:
        check_ros_arguments(["x", "--ros-args", *(a for f in preset_files(sensor) for a in ("--params-file", str(f)))])


def test_class_thresholds_follow_the_model_the_files_or_flags_name(tmp_path):
    # the full model has the same classes as lite: a class only some model has would be refused for lite
    check_ros_arguments(["x", "--ros-args", "-p", "model:=full", "-p", "score_threshold_cyclist:=0.3"])
    with pytest.raises(ConfigError, match="cannot load model config"):
        check_ros_arguments(["x", "--ros-args", "-p", "model:=no_such_model"])


@pytest.mark.parametrize("flag,needle", [("max_rnge:=3", "unknown parameter 'max_rnge'"),
                                         ("max_range:=far", "max_range must be a number"),
                                         ("accumulate_frames:=[1, 2]", "accumulate_frames must be an integer")])
def test_a_bad_ros_args_override_is_named(flag, needle):
    with pytest.raises(ConfigError, match=needle.replace("[", r"\[")):
        check_ros_arguments(["x", "--ros-args", "-p", flag])
    check_ros_arguments(["x", "--ros-args", "-p", "other_node:max_rnge:=3"])  # another node's: not ours


@pytest.mark.parametrize("text,needle", [
    ("/**:\n  ros__parameters:\n    max_range: [1\n", "is not valid YAML (line"),
    ("livox_detector:\n  max_range: 5.0\n", "section 'livox_detector': a ROS 2 parameter file is"),
    ("- a\n- b\n", "a ROS 2 parameter file is"),
])
def test_an_unparsable_params_file_gives_one_clear_line(tmp_path, text, needle):
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        check_ros_arguments(["x", "--ros-args", "--params-file", str(path)])
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_run_with_a_bad_params_file_exits_1_with_one_fatal_line_before_rclpy(tmp_path, capsys):
    pytest.importorskip("rclpy")
    from livox_infer.ros.node import add_arguments, main

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--sensor", "avia", "--device", "cpu", "--params-file", _file(tmp_path, "max_range: far")])
    assert main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"[livox_detector] FATAL: cannot start (ConfigError): {args.params_file}: "
                   "max_range must be a number, got 'far'"]


def test_params_check_says_so_when_it_passes(capsys):
    from livox_infer.tools.params import main

    assert main(argparse.Namespace(yaml=False, schema=False, markdown=False, write=False, check=True)) == 0
    assert "up to date" in capsys.readouterr().out


def test_the_node_itself_refuses_an_undeclared_override(ros):
    """However the node is started (demo, tests, a launch file of one's own), a name it does not have stops it."""
    pytest.importorskip("rclpy")
    from rclpy.parameter import Parameter

    from livox_infer.ros.node import DetectorNode
    from test_node_support import FakeFactory, unique

    with pytest.raises(ConfigError, match="unknown parameter 'max_rnge'"):
        DetectorNode(pipeline_factory=FakeFactory(), node_name=unique("det"), context=ros.context,
                     parameter_overrides=[Parameter("max_rnge", value=1.0)])


def test_numbers_in_scientific_notation_are_numbers_as_for_ros(tmp_path):
    """ROS's parameter parser reads max_range: 1e2 as a double; PyYAML's YAML 1.1 rules would say string."""
    check_ros_arguments(["x", "--ros-args", "-p", "max_range:=1e2", "--params-file",
                         _file(tmp_path, "intensity_scale: 2.55e2")])
    assert read_params_file(_file(tmp_path, "max_range: 1.2e2"))["max_range"] == 120.0


def test_a_yaml_boolean_word_for_a_string_parameter_says_to_quote_it():
    """tag_filter:=off reaches ROS as the boolean false (rclpy: 'expecting type STRING'); the check says why."""
    with pytest.raises(ConfigError, match=r"tag_filter must be a string, got False: YAML reads off, on, yes and no "
                                          r"as booleans; quote the word"):
        check_ros_arguments(["x", "--ros-args", "-p", "tag_filter:=off"])
    check_ros_arguments(["x", "--ros-args", "-p", "tag_filter:='off'"])
