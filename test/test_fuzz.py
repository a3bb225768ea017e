"""Fuzzing with a fixed seed and a bounded count (CI, a few seconds): damaged PointCloud2 messages through the
decoder and the pipeline raise only the package's typed errors (`livox_infer.errors`), never anything else.

Damage: random byte flips and truncations of the data buffer and of the whole serialized (CDR) message,
random header / geometry / field values (including values of the wrong type on a duck-typed message)."""

from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np
import pytest
import torch

from livox_infer.errors import LivoxInferError
from livox_infer.pipeline import DetectionPipeline
from livox_infer.decode.pointcloud import LAYOUTS, PointField, decode_pointcloud2, encode_pointcloud2
from livox_infer.bags import pointcloud2_from_cdr, pointcloud2_to_cdr

from test_pipeline import scene_points, small_model  # noqa: F401 - fixture reuse

torch.set_num_threads(1)
SEED = 19
DECODER_CASES = 1500
PIPELINE_CASES = 60
WEIRD = (None, "x", -1, 0, 2**70, float("nan"), float("inf"), 1.5, object(), b"\xff", [], True)


def valid_messages(rng):
    out = []
    for layout in LAYOUTS:
        pts = scene_points(seed=int(rng.integers(1000)))[:400]
        n = len(pts)
        kw = {"tag": rng.integers(0, 64, n).astype(np.uint8)} if layout.startswith("livox") else {}
        if layout == "livox2":
            kw["time"] = 1.7e18 + np.arange(n) * 1e4
        out.append(encode_pointcloud2(pts, layout, stamp_ns=1_700_000_000_000_000_000, frame_id="f", **kw))
    return out


def damage(msg, rng):
    """One random kind of damage to a copy of ``msg``: a PointCloud2Data, or a rosbags message from CDR."""
    kind = int(rng.integers(6))
    if kind == 0:  # flip bytes in the point data
        data = bytearray(msg.data)
        for i in rng.integers(0, len(data), int(rng.integers(1, 64))):
            data[i] ^= int(rng.integers(1, 256))
        return replace(msg, data=bytes(data))
    if kind == 1:  # truncate (or extend) the point data
        cut = int(rng.integers(0, len(msg.data) + 32))
        return replace(msg, data=bytes(msg.data[:cut]) + b"\0" * max(0, cut - len(msg.data)))
    if kind == 2:  # geometry
        name = ("height", "width", "point_step", "row_step")[int(rng.integers(4))]
        value = int(rng.choice([0, 1, -1, 3, 17, 2**31, int(rng.integers(0, 10_000))]))
        return replace(msg, **{name: value})
    if kind == 3:  # fields: offsets, datatypes, counts, names
        fields = list(msg.fields)
        i = int(rng.integers(len(fields)))
        f = fields[i]
        fields[i] = PointField(rng.choice([f.name, "x", "intensity", "tag", "t", ""]), int(rng.integers(-4, 40)),
                               int(rng.integers(0, 10)), int(rng.integers(-1, 3)))
        if rng.random() < 0.3:
            fields.pop(int(rng.integers(len(fields))))
        return replace(msg, fields=fields)
    if kind == 4:  # duck typing: any attribute may hold any value
        bad = copy.copy(msg)
        setattr(bad, str(rng.choice(["height", "width", "point_step", "row_step", "is_bigendian", "data", "fields",
                                     "stamp_sec", "frame_id"])), WEIRD[int(rng.integers(len(WEIRD)))])
        return bad
    # the serialized message: flips / truncation of the CDR bytes, then deserialized like a bag reader does
    raw = bytearray(pointcloud2_to_cdr(msg))
    if rng.random() < 0.5:
        raw = raw[: int(rng.integers(0, len(raw)))]
    else:
        for i in rng.integers(0, len(raw), int(rng.integers(1, 16))):
            raw[i] ^= int(rng.integers(1, 256))
    return pointcloud2_from_cdr(bytes(raw))


def test_damaged_messages_raise_only_typed_errors_in_the_decoder():
    rng = np.random.default_rng(SEED)
    base = valid_messages(rng)
    outcomes = {"decoded": 0, "refused": 0}
    for i in range(DECODER_CASES):
        try:
            msg = damage(base[i % len(base)], rng)
            cloud = decode_pointcloud2(msg)
        except LivoxInferError:
            outcomes["refused"] += 1
            continue
        except Exception as exc:  # noqa: BLE001 - the point of the test
            pytest.fail(f"case {i}: untyped {type(exc).__name__}: {exc}")
        assert cloud.points.dtype == np.float32 and cloud.points.shape[1] == 4
        assert np.isfinite(cloud.points).all()  # non-finite points never leave the decoder
        outcomes["decoded"] += 1
    assert outcomes["decoded"] > 100 and outcomes["refused"] > 100, outcomes  # both paths exercised


def test_damaged_messages_through_the_pipeline(small_model):  # noqa: F811
    pipe = DetectionPipeline(small_model, compile=False, sensor_height="auto", score_thresholds=0.0)
    rng = np.random.default_rng(SEED + 1)
    base = valid_messages(rng)
    for i in range(PIPELINE_CASES):
        try:
            msg = damage(base[i % len(base)], rng)
            det = pipe.detect(msg)
        except LivoxInferError:
            continue
        except Exception as exc:  # noqa: BLE001 - the point of the test
            pytest.fail(f"case {i}: untyped {type(exc).__name__}: {exc}")
        assert np.isfinite(det.boxes).all() and np.isfinite(det.scores).all()
    assert len(pipe.detect(base[0]).boxes) >= 0  # and it still works on a valid cloud
