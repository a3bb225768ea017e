"""BEV grids at the edges (issue 30): a one-cell grid must detect (top_k larger than the grid's places crashed
`topk` with "selected index k out of range"), and grids are capped at an affordable size with a clear error
(the +-1000 m bounds alone allowed 5000 x 5000 cells: 26 s a frame, 5.6 GB)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from livox_infer.detector.config import MAX_GRID_CELLS, ModelConfig
from livox_infer.detector.postprocess import topk_decode
from livox_infer.errors import ConfigError


def test_topk_decode_on_a_grid_with_fewer_places_than_top_k():
    cfg = ModelConfig.load("lite").with_extent((0.0, 3.2, 0.0, 3.2))
    c = len(cfg.classes)
    heads = {"heatmap": torch.randn(1, c, 2, 2), "offset": torch.zeros(1, 2, 2, 2), "z": torch.zeros(1, 1, 2, 2),
             "size": torch.zeros(1, 3, 2, 2), "yaw": torch.zeros(1, 2, 2, 2)}
    assert cfg.top_k > c * 4
    scores, labels, boxes = topk_decode(heads, cfg)
    assert scores.shape == (1, c * 4) and boxes.shape == (1, c * 4, 7)


def test_a_one_cell_grid_detects():
    from livox_infer.decode.pointcloud import Cloud
    from livox_infer.pipeline import DetectionPipeline

    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    pts = np.column_stack([rng.uniform(0, 3, 2000), rng.uniform(0, 3, 2000), rng.uniform(-1.8, 1, 2000),
                           rng.uniform(0, 100, 2000)]).astype(np.float32)
    pipe = DetectionPipeline("lite", device="cpu", compile=False, sensor_height=1.8, bev_extent=(0.0, 3.2, 0.0, 3.2))
    dets = pipe.detect(Cloud(pts, None, None, 1, "f"))
    assert dets.boxes.shape[1] == 7


def test_grids_are_capped_with_a_clear_error():
    lite = ModelConfig.load("lite")
    side = 1024 * lite.grid.cell_size  # 409.6 m: the largest square allowed
    assert MAX_GRID_CELLS == 1024 * 1024
    lite.with_extent((0.0, side, -side / 2, side / 2))
    with pytest.raises(ConfigError, match=r"is 4992 x 4992 cells of 0.4 m; at most 1,048,576 cells"):
        lite.with_extent((-998.4, 998.4, -998.4, 998.4))
    with pytest.raises(ConfigError, match="at most"):
        lite.with_extent((0.0, side + 3.2, -side / 2, side / 2))
