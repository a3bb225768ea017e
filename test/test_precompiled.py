"""torch.compile's result saved for the next start (livox_infer.detector.precompiled): a second compile of the same
function, settings and code loads it (same outputs, no tracing); a file that is not in the trusted manifest, was
saved for other settings or from other source code is not loaded but compiled again; inputs outside a saved
function's guards compile one more variant, which the next start loads too (issue 33: warm start ≤ 6 s)."""

from __future__ import annotations

import json

import pytest
import torch

from livox_infer.detector.aoti import MATCH_FIELDS
from livox_infer.detector.precompiled import PRECOMPILED_FORMAT, compile_saved

pytestmark = pytest.mark.slow  # each case compiles small graphs with inductor: ~5-20 s on 2 cores


class Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x)).sum(dim=1)


def scaled_rows(x: torch.Tensor, k: int) -> torch.Tensor:
    return (x * 2.0 + 1.0).topk(k, dim=1).values


FIELDS = {k: "test" for k in MATCH_FIELDS} | {"config_name": "small", "device_type": "cpu"}


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv("LIVOX_INFER_AOTI_MANIFEST", str(tmp_path / "manifest.json"))
    return tmp_path / "precompiled"


def _module():
    torch.manual_seed(0)
    return Small().eval()


def test_a_second_compile_loads_the_saved_function(folder):
    net, x = _module(), torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        first, how = compile_saved(net, (x,), "net", FIELDS, folder=folder)
        assert how == "compiled and saved (the saved one: none saved)"
        again, how = compile_saved(_module(), (x,), "net", FIELDS, folder=folder)  # another instance, same weights
        assert how == "loaded"
        torch.testing.assert_close(again(x), net(x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(first(x), net(x), rtol=1e-5, atol=1e-5)
    saved = json.loads(next(folder.glob("small.net.*.0.json")).read_text())
    assert saved["format"] == PRECOMPILED_FORMAT and __name__ in saved["sources"]
    # the weights are not in the file: a module with other weights gets its own outputs
    other = Small().eval()
    with torch.no_grad():
        run, how = compile_saved(other, (x,), "net", FIELDS, folder=folder)
        assert how == "loaded"
        torch.testing.assert_close(run(x), other(x), rtol=1e-5, atol=1e-5)


def test_untrusted_other_settings_and_changed_source_compile_again(folder, tmp_path, monkeypatch):
    net, x = _module(), torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        compile_saved(net, (x,), "net", FIELDS, folder=folder)
        _, how = compile_saved(net, (x,), "net", {**FIELDS, "weights_sha256": "other"}, folder=folder)
        assert how == "compiled and saved (the saved one: none saved)"  # other settings: another file
        side = next(folder.glob("small.net.*.0.json"))
        doc = json.loads(side.read_text())
        doc["sources"][__name__] = "0" * 64
        side.write_text(json.dumps(doc))
        _, how = compile_saved(net, (x,), "net", FIELDS, folder=folder)
        assert how == f"compiled and saved (the saved one: source changed since saved ({__name__}))"
        monkeypatch.setenv("LIVOX_INFER_AOTI_MANIFEST", str(tmp_path / "another_manifest.json"))
        _, how = compile_saved(net, (x,), "net", FIELDS, folder=folder)
        assert how == "compiled and saved (the saved one: not in the trusted-package manifest)"


def test_inputs_outside_the_guards_compile_a_variant_the_next_start_loads(folder):
    x, one_row = torch.randn(5, 16), torch.randn(1, 16)  # one row: outside a dynamic graph's 0/1 specialisation
    with torch.no_grad():
        run, how = compile_saved(scaled_rows, (x, 4), "rows", FIELDS, dynamic=True, folder=folder)
        assert how.startswith("compiled and saved")
        torch.testing.assert_close(run(torch.randn(7, 16) * 0 + 1, 3), torch.full((7, 3), 3.0))
        assert len(run.variants) == 1  # other sizes share the dynamic graph
        torch.testing.assert_close(run(one_row, 4), scaled_rows(one_row, 4))
        assert len(run.variants) == 2 and len(list(folder.glob("small.rows.*.bin"))) == 2
        again, how = compile_saved(scaled_rows, (x, 4), "rows", FIELDS, dynamic=True, folder=folder)
        assert how == "loaded (2 variants)"
        torch.testing.assert_close(again(one_row, 4), scaled_rows(one_row, 4))
        assert len(again.variants) == 2
