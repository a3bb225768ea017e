"""Fuzzing with fixed seeds and bounded counts (a few seconds): the inputs besides clouds that issue 30 found
holes in. Rig files, odometry poses, parameter files and archives (bags with damaged messages) raise only the
package's typed errors (`livox_infer.errors`), and what they accept is usable: a loaded rig moves clouds, an
accepted pose is finite, an accepted parameter file's values pass the parameter model, an archive keeps every
message that decodes."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import yaml

from livox_infer.errors import ConfigError, LivoxInferError

from test_pipeline import scene_points

REPO_RIG = "config/rigs/livox_dataset_v1.yaml"
WEIRD = (None, "x", "../x", -1, 0, 2**70, 1e300, float("nan"), float("inf"), 1.5, [], {}, [1, 2], True, "é",
         "a/b", "\x00")


def _mutate(value, rng, depth: int = 0):
    """A copy of a YAML-like value with one random change somewhere inside it."""
    if isinstance(value, dict) and value and depth < 4:
        out = dict(value)
        key = list(out)[int(rng.integers(len(out)))]
        kind = int(rng.integers(4))
        if kind == 0:
            del out[key]
        elif kind == 1:
            out[key] = WEIRD[int(rng.integers(len(WEIRD)))]
        elif kind == 2:
            out[str(key) + "_"] = out.pop(key)  # a misspelled key
        else:
            out[key] = _mutate(out[key], rng, depth + 1)
        return out
    if isinstance(value, list) and value and depth < 4:
        out = list(value)
        i = int(rng.integers(len(out)))
        kind = int(rng.integers(3))
        if kind == 0:
            out.pop(i)
        elif kind == 1:
            out[i] = WEIRD[int(rng.integers(len(WEIRD)))]
        else:
            out[i] = _mutate(out[i], rng, depth + 1)
        return out
    return WEIRD[int(rng.integers(len(WEIRD)))]


def _damage_text(text: str, rng) -> bytes:
    data = bytearray(text.encode())
    kind = int(rng.integers(3))
    if kind == 0:
        return bytes(data[: int(rng.integers(len(data)))])
    for i in rng.integers(0, len(data), int(rng.integers(1, 8))):
        data[i] = int(rng.integers(256)) if kind == 1 else ord(rng.choice(list(":-[]{}'\"\n #&*!|>%@`")))
    return bytes(data)


def test_rig_files_fuzzed_raise_config_errors_or_load_a_usable_rig(tmp_path):
    from livox_infer.decode.pointcloud import Cloud
    from livox_infer.resources import find
    from livox_infer.rig import FrameAssembler, Rig

    text = find("config", "rigs/livox_dataset_v1.yaml").read_text()
    base = yaml.safe_load(text)
    rng = np.random.default_rng(30)
    pts = scene_points(seed=1)[:300]
    loaded = 0
    for case in range(240):
        path = tmp_path / "rig.yaml"
        if case % 4 == 0:
            path.write_bytes(_damage_text(text, rng))
        else:
            d = copy.deepcopy(base)
            for _ in range(int(rng.integers(1, 4))):
                d = _mutate(d, rng)
            try:
                path.write_text(yaml.safe_dump(d, allow_unicode=True))
            except yaml.YAMLError:
                continue
        try:
            rig = Rig.load(path)
        except ConfigError:
            continue
        loaded += 1
        asm = FrameAssembler(rig, accumulate_frames=2)
        for s in rig.sensors:
            assert s.name not in (".", "..") and "/" not in s.name and "\\" not in s.name
            assert np.isfinite(s.extrinsic).all()
            for out in asm.add(s.name, Cloud(pts.copy(), None, None, 1_000_000_000, s.name)):
                assert np.isfinite(out.points).all()
    assert loaded >= 20  # the fuzzing also reached the accepting side


def test_odometry_fuzzed_gives_finite_poses_or_config_errors():
    from livox_infer.accumulate import Accumulator, PoseBuffer, pose_matrix
    from livox_infer.decode.pointcloud import Cloud

    rng = np.random.default_rng(31)
    odd = (float("nan"), float("inf"), -float("inf"), 1e308, -1e308, 0.0, 1e-320)
    buf, acc = PoseBuffer(), Accumulator(frames=3)
    stamp = 10**18
    pts = scene_points(seed=2)[:200]
    for _ in range(1500):
        pos = [float(rng.choice(odd)) if rng.random() < 0.2 else float(rng.normal(0, 50)) for _ in range(3)]
        quat = [float(rng.choice(odd)) if rng.random() < 0.1 else float(rng.normal()) for _ in range(4)]
        stamp += int(rng.choice([-2 * 10**9, 0, 10**7, 10**8, 3 * 10**9]))
        try:
            pose = pose_matrix(pos, quat)
        except ConfigError:
            continue
        assert np.isfinite(pose).all()
        buf.add(stamp, pose)
        got = buf.at(stamp + int(rng.integers(-10**8, 10**8)))
        assert got is None or np.isfinite(got).all()
        out = acc.add(Cloud(pts.copy(), None, None, stamp, "f"), got)
        assert len(out) <= 3 * len(pts)
        assert np.isfinite(out.points).all()  # a position of 1e308 was accepted and stacked clouds became inf


def test_parameter_files_fuzzed_are_refused_in_one_line_or_pass_the_model(tmp_path):
    from livox_infer.params import check_ros_arguments, check_value, is_ros_own, parameters, read_params_file
    from livox_infer.resources import find

    text = find("config", "avia.param.yaml").read_text()
    base = yaml.safe_load(text)
    rng = np.random.default_rng(32)
    accepted = 0
    for case in range(240):
        path = tmp_path / "p.yaml"
        if case % 3 == 0:
            path.write_bytes(_damage_text(text, rng))
        else:
            d = copy.deepcopy(base)
            params = d["/**"]["ros__parameters"]
            name = str(rng.choice(["sensor", "max_range", "bev_extent", "accumulate_frames", "use_compile",
                                   "input_topics", "model", "score_threshold_car", "max_rnge", "tag_filter"]))
            params[name] = WEIRD[int(rng.integers(len(WEIRD)))] if rng.random() < 0.7 else _mutate(params, rng)
            d = _mutate(d, rng) if rng.random() < 0.2 else d
            try:
                path.write_text(yaml.safe_dump(d, allow_unicode=True))
            except (yaml.YAMLError, TypeError):
                continue
        try:
            check_ros_arguments(["x", "--ros-args", "--params-file", str(path)])
        except ConfigError as exc:
            assert "\n" not in str(exc)
            continue
        accepted += 1
        declared = {p.name: p for p in parameters()}
        for name, value in read_params_file(path).items():
            if is_ros_own(name):
                continue
            assert name in declared, name
            assert check_value(declared[name], value) is None, (name, value)
    assert accepted >= 20


def test_archives_with_damaged_messages_keep_every_good_frame(tmp_path):
    from livox_infer.bags import POINTCLOUD2, BagWriter, pointcloud2_to_cdr, read_clouds
    from livox_infer.decode.pointcloud import encode_pointcloud2

    rng = np.random.default_rng(33)
    for case in range(8):
        n = int(rng.integers(3, 8))
        bad_at = set(int(i) for i in rng.choice(n, size=int(rng.integers(1, n)), replace=False))
        bag = tmp_path / f"bag{case}"
        with BagWriter(bag) as w:
            for i in range(n):
                raw = pointcloud2_to_cdr(encode_pointcloud2(scene_points(seed=i)[:100], "xyzi", stamp_ns=1000 + i))
                if i in bad_at:
                    data = bytearray(raw)
                    if rng.random() < 0.5:
                        data = data[: int(rng.integers(0, 60))]  # truncated inside the header / geometry
                    else:
                        for j in rng.integers(4, 60, 6):  # the header and geometry fields scrambled
                            data[j] = int(rng.integers(256))
                    raw = bytes(data)
                w.write_raw("/livox/lidar", POINTCLOUD2, raw, 1000 + i)
        bad: list[str] = []
        try:
            got = [c.stamp_ns for _, c in read_clouds(bag, on_bad_message=bad.append)]
        except LivoxInferError as exc:  # only a bag that cannot be opened / read as a whole
            pytest.fail(f"case {case}: a damaged message failed the whole bag: {exc}")
        good = [1000 + i for i in range(n) if i not in bad_at]
        assert set(good) <= set(got), (case, got, bad)  # every intact message is kept
        assert len(got) + len(bad) == n  # each damaged one is either decoded as it is or counted


@pytest.mark.parametrize("kind", ["str", "none", "int", "list", "object array", "strided", "float array", "2d"])
def test_decoders_take_any_buffer_or_raise_a_typed_error(kind):
    """Issue 30: two duck-typed inputs still raised untyped errors: a CustomMsg given as something that is not a
    byte buffer (TypeError) or as a strided numpy view (ValueError), and PointCloud2 data as a strided view."""
    from dataclasses import replace

    from livox_infer.decode.custom_msg import decode_custom_msg_cdr, encode_custom_msg_cdr
    from livox_infer.decode.pointcloud import decode_pointcloud2, encode_pointcloud2

    pts = scene_points(seed=3)[:50]
    raw = np.frombuffer(encode_custom_msg_cdr(pts, stamp_ns=1, frame_id="f"), np.uint8)
    cloud = encode_pointcloud2(pts, "xyzi", stamp_ns=1, frame_id="f")
    data = np.frombuffer(cloud.data, np.uint8)
    odd = {"str": lambda b: "abc", "none": lambda b: None, "int": lambda b: 5, "list": lambda b: list(b),
           "object array": lambda b: b.astype(object), "strided": lambda b: np.repeat(b, 2)[::2],
           "float array": lambda b: b.astype(np.float32), "2d": lambda b: b.reshape(1, -1)}[kind]
    for decode, value in ((decode_custom_msg_cdr, odd(raw)), (lambda d: decode_pointcloud2(replace(cloud, data=d)),
                                                             odd(data))):
        try:
            out = decode(value)
        except LivoxInferError:
            continue
        if kind in ("strided", "2d"):  # the same bytes, so the same points
            assert len(out.points) == len(pts)
        else:
            pytest.fail(f"{kind} decoded: {out!r}")
