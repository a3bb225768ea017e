"""`livox-infer eval --sim-frames`: simulator options (a moving sensor), score floor, argument errors."""

import json

import pytest

from livox_infer.cli import main as cli_main
from livox_infer.model.evaluate import parse_sim_options


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
    assert res["score_threshold"] == "0.1"
    assert set(res["model lite"]) == {"avia", "all"}
    assert "held-out simulated frames" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["--sim-option", "ego_speed"], "KEY=VALUE"),
    (["--score-threshold", "2"], "score-threshold"),
    (["--score-threshold", "high"], "score-threshold"),
    (["--sim-option", "no_such_option=1"], "no_such_option"),
])
def test_eval_sim_argument_errors(args, message, capsys):
    rc = cli_main(["eval", "--sim-frames", "1", "--sensors", "avia", "--no-compile", *args])
    assert rc == 2
    assert message in capsys.readouterr().err
