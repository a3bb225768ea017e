"""`livox-infer eval --sim-frames`: simulator options (a moving sensor), score floor, argument errors."""

import json

import pytest

from livox_infer.tools.cli import main as cli_main
from livox_infer.evaluation.options import parse_sim_options


def test_parse_sim_options():
    assert parse_sim_options(["ego_speed=[0, 15]", "n_cyclists=7", "deskew=true"]) == {
        "ego_speed": [0, 15], "n_cyclists": 7, "deskew": True}
    for bad in (["ego_speed"], ["=3"], ["x=[1,"]):
        with pytest.raises(Exception, match="sim-option"):
            parse_sim_options(bad)


def test_eval_sim_with_moving_sensor_writes_json(tmp_path, capsys):
    out = tmp_path / "res.json"
    rc = cli_main(["eval", "--sim-frames", "1", "--sensors", "avia", "--seed", "2", "--no-compile",
                   "--sim-option", "ego_speed=[10,10]", "--sim-option", "yaw_rate_dps=[5,5]", "--out", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())
    assert res["sim_options"] == {"ego_speed": [10, 10], "yaw_rate_dps": [5, 5]}
    assert res["score_threshold"] == "0.1" and res["refine"] is True
    assert set(res["model lite"]) == {"avia", "all"}
    assert "held-out simulated frames" in capsys.readouterr().out


def test_eval_sim_stage_one_alone(tmp_path):
    """--no-refine evaluates the detector without its stage-2 refiner: other scores, recorded in the JSON."""
    args = ["eval", "--sim-frames", "2", "--sensors", "avia", "--seed", "2", "--no-compile", "--out"]
    assert cli_main([*args, str(tmp_path / "both.json")]) == 0
    assert cli_main([*args, str(tmp_path / "one.json"), "--no-refine"]) == 0
    both, one = (json.loads((tmp_path / f).read_text()) for f in ("both.json", "one.json"))
    assert both["refine"] is True and one["refine"] is False
    assert both["model lite"]["all"]["ap"] != one["model lite"]["all"]["ap"]


def test_eval_sim_by_range(tmp_path, capsys):
    out = tmp_path / "res.json"
    rc = cli_main(["eval", "--sim-frames", "1", "--sensors", "avia", "--seed", "2", "--no-compile",
                   "--ranges", "0,30,inf", "--out", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())["model lite"]
    assert set(res) == {"avia", "all", "all 0-30 m", "all 30+ m"}
    # the bins split the relevant ground truth of the whole set between them
    for cls in ("car", "pedestrian", "cyclist"):
        assert res["all 0-30 m"]["num_gt"][cls] + res["all 30+ m"]["num_gt"][cls] == res["all"]["num_gt"][cls]
    assert "all 30+ m" in capsys.readouterr().out


def test_eval_bag_by_range_with_baseline(tmp_path, capsys):
    """A simulated bag (clouds + /livox_infer/ground_truth) evaluated whole and per range bin, model and baseline."""
    bag = tmp_path / "drive"
    assert cli_main(["simulate", "--sensor", "horizon", "--frames", "2", "--seed", "4", "--out", str(bag)]) == 0
    out = tmp_path / "res.json"
    rc = cli_main(["eval", str(bag), "--no-compile", "--baseline", "--ranges", "0,25,inf", "--out", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())
    for name in ("model lite", "baseline"):
        whole, bins = res[name], res[name]["by_range"]
        assert set(bins) == {"0-25 m", "25+ m"} and whole["num_frames"] == 2
        for cls in ("car", "pedestrian", "cyclist"):
            assert bins["0-25 m"]["num_gt"][cls] + bins["25+ m"]["num_gt"][cls] == whole["num_gt"][cls]
    assert whole["num_gt"]["car"] > 0
    assert "objects at 25+ m from the sensor" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["--sim-option", "ego_speed"], "KEY=VALUE"),
    (["--score-threshold", "2"], "score-threshold"),
    (["--score-threshold", "high"], "score-threshold"),
    (["--sim-option", "no_such_option=1"], "no_such_option"),
    (["--sim-option", "scene=street"], "the command chooses it"),  # was a TypeError traceback
    (["--ranges", "30,10"], "ranges"),
])
def test_eval_sim_argument_errors(args, message, capsys):
    rc = cli_main(["eval", "--sim-frames", "1", "--sensors", "avia", "--no-compile", *args])
    assert rc == 2
    assert message in capsys.readouterr().err


def test_eval_sim_reliability_reports_every_class_and_its_operating_point(tmp_path, capsys):
    """--reliability on held-out simulated frames (how the truck / bus thresholds were chosen): the table, each
    class's precision / recall at its threshold and best-F1 point, in the output and the JSON."""
    out = tmp_path / "res.json"
    rc = cli_main(["eval", "--sim-frames", "2", "--sensors", "avia", "--seed", "4", "--no-compile", "--reliability",
                   "--sim-option", "large_vehicles=3", "--out", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "reliability on the simulated frames" in text and "tru bev@0.5" in text
    rel = json.loads(out.read_text())["reliability"]
    assert set(rel["best_f1"]) == {"car", "pedestrian", "cyclist", "truck", "bus"}
    car = rel["operating"]["car"]
    assert car["threshold"] == 0.55 and 0.0 <= car["precision"] <= 1.0 and 0.0 <= car["recall"] <= 1.0
