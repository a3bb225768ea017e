"""PointCloud2 decode/encode: every layout, arbitrary field layouts, filters, malformed input."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from livox_infer.errors import ConfigError, PointCloudError
from livox_infer.decode.pointcloud import (
    FLOAT32,
    FLOAT64,
    INT16,
    LAYOUTS,
    UINT8,
    UINT16,
    UINT32,
    Cloud,
    DecodeFilter,
    PointCloud2Data,
    PointField,
    decode_pointcloud2,
    encode_pointcloud2,
    filter_points,
    from_message,
    tag_keep_mask,
    to_ros_message,
)
from livox_infer.bags import pointcloud2_from_cdr, pointcloud2_to_cdr, to_rosbags_message

STAMP_NS = 1_700_000_000_250_000_000  # an epoch time, like a real driver's header stamp
_NP = {FLOAT32: "<f4", FLOAT64: "<f8", UINT8: "u1", UINT16: "<u2", UINT32: "<u4", INT16: "<i2"}


def random_points(n: int = 500, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    pts = rng.uniform(-40, 40, size=(n, 4)).astype(np.float32)
    pts[:, 3] = rng.integers(0, 256, n)
    return pts


def make_cloud(columns: dict[str, tuple[int, int, np.ndarray]], point_step: int, *, height: int = 1,
               row_pad: int = 0, stamp_ns: int = STAMP_NS, is_dense: bool = True) -> PointCloud2Data:
    """Pack ``{name: (offset, datatype, values)}`` into a PointCloud2Data (values reshaped to height rows)."""
    n = len(next(iter(columns.values()))[2])
    assert n % height == 0
    width = n // height
    dtype = np.dtype({"names": list(columns), "formats": [_NP[dt] for _, dt, _ in columns.values()],
                      "offsets": [off for off, _, _ in columns.values()], "itemsize": point_step})
    rec = np.zeros(n, dtype=dtype)
    for name, (_, _, values) in columns.items():
        rec[name] = values
    rows = rec.tobytes()
    row_len = width * point_step
    data = b"".join(rows[r * row_len:(r + 1) * row_len] + b"\xee" * row_pad for r in range(height))
    fields = [PointField(name, off, dt) for name, (off, dt, _) in columns.items()]
    sec, nsec = divmod(stamp_ns, 1_000_000_000)
    return PointCloud2Data(sec, nsec, "lidar", height, width, fields, False, point_step, row_len + row_pad, data, is_dense)


# --------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_encode_decode_round_trip_every_layout(layout):
    pts = random_points()
    n = len(pts)
    time = np.linspace(0.0, 0.1, n)
    tag = (np.arange(n) % 4 << 4).astype(np.uint8)  # return numbers only: not noise
    data = encode_pointcloud2(pts, layout, time=time, tag=tag, line=np.arange(n) % 6, stamp_ns=STAMP_NS,
                              frame_id="f")
    assert data.point_step == {"livox": 18, "livox2": 26, "xyzi": 16, "xyzirc": 16}[layout]
    assert len(data.data) == data.row_step == n * data.point_step
    cloud = decode_pointcloud2(data)
    assert isinstance(cloud, Cloud) and cloud.frame_id == "f" and cloud.stamp_ns == STAMP_NS
    assert cloud.points.dtype == np.float32 and cloud.points.flags.c_contiguous and cloud.points.flags.writeable
    np.testing.assert_array_equal(cloud.points, pts)  # intensities are integers, so exact even as u8
    if layout == "livox2":
        # float64 absolute ns near 1.7e18 carries ~256 ns resolution
        np.testing.assert_allclose(cloud.time, time, atol=1e-6)
    else:
        assert cloud.time is None
    if layout in ("livox", "livox2"):
        np.testing.assert_array_equal(cloud.tag, tag)
    else:
        assert cloud.tag is None


def test_xyzirc_stores_rounded_intensity_return_and_channel():
    pts = random_points(10)
    pts[:, 3] = [0.4, 0.6, 254.6, 300, -5, 1, 2, 3, 4, 5]
    data = encode_pointcloud2(pts, "xyzirc", tag=np.full(10, 0b100000, np.uint8), line=np.arange(10) * 1000)
    rec = np.frombuffer(data.data, dtype=np.dtype({"names": ["i", "r", "c"], "formats": ["u1", "u1", "<u2"],
                                                    "offsets": [12, 13, 14], "itemsize": 16}))
    np.testing.assert_array_equal(rec["i"], [0, 1, 255, 255, 0, 1, 2, 3, 4, 5])
    np.testing.assert_array_equal(rec["r"], 2)
    np.testing.assert_array_equal(rec["c"], np.arange(10) * 1000)


def test_field_order_permutation_mixed_types_and_unaligned_offsets():
    pts = random_points(300, seed=1)
    offsets_ns = np.arange(300, dtype=np.uint32) * 1000
    cloud_msg = make_cloud({
        "reflectivity": (0, UINT8, pts[:, 3]),
        "z": (1, FLOAT32, pts[:, 2]),           # unaligned
        "offset_time": (5, UINT32, offsets_ns),
        "y": (9, FLOAT64, pts[:, 1]),           # float64 coordinate
        "x": (17, FLOAT32, pts[:, 0]),
        "ring": (21, UINT16, np.zeros(300)),    # ignored extra field
    }, point_step=24)
    cloud = decode_pointcloud2(cloud_msg)
    np.testing.assert_array_equal(cloud.points, pts)
    np.testing.assert_allclose(cloud.time, offsets_ns * 1e-9, rtol=0, atol=1e-15)
    assert cloud.tag is None


def test_generic_xyzi_with_point_padding_like_pcl_point_xyzi():
    pts = random_points(200, seed=2)
    msg = make_cloud({"x": (0, FLOAT32, pts[:, 0]), "y": (4, FLOAT32, pts[:, 1]), "z": (8, FLOAT32, pts[:, 2]),
                      "intensity": (16, FLOAT32, pts[:, 3])}, point_step=32)
    np.testing.assert_array_equal(decode_pointcloud2(msg).points, pts)


def test_missing_intensity_gives_zero_and_int16_coordinates_are_converted():
    xyz = np.array([[1, 2, 3], [-4, 5, 6]], dtype=np.int16)
    msg = make_cloud({"x": (0, INT16, xyz[:, 0]), "y": (2, INT16, xyz[:, 1]), "z": (4, INT16, xyz[:, 2])}, 6)
    out = decode_pointcloud2(msg).points
    np.testing.assert_array_equal(out, np.c_[xyz.astype(np.float32), np.zeros(2, np.float32)])


@pytest.mark.parametrize("height,row_pad", [(2, 0), (4, 7), (1, 13)])
def test_organized_clouds_and_row_padding(height, row_pad):
    pts = random_points(240, seed=3)
    msg = make_cloud({"x": (0, FLOAT32, pts[:, 0]), "y": (4, FLOAT32, pts[:, 1]), "z": (8, FLOAT32, pts[:, 2]),
                      "intensity": (12, FLOAT32, pts[:, 3]), "tag": (16, UINT8, np.arange(240) % 2 * 16)},
                     point_step=18, height=height, row_pad=row_pad)
    assert msg.row_step == msg.width * 18 + row_pad
    cloud = decode_pointcloud2(msg)
    np.testing.assert_array_equal(cloud.points, pts)  # row-major order, padding bytes skipped
    np.testing.assert_array_equal(cloud.tag, np.arange(240) % 2 * 16)


def test_empty_cloud():
    data = encode_pointcloud2(np.zeros((0, 4), np.float32), "livox2")
    cloud = decode_pointcloud2(data)
    assert cloud.points.shape == (0, 4) and cloud.time.shape == (0,) and cloud.tag.shape == (0,)


# --------------------------------------------------------------------------- filtering


def test_zero_and_non_finite_points_dropped_even_when_dense():
    pts = random_points(20, seed=4)
    pts[0, :3] = 0.0
    pts[1, 0] = np.nan
    pts[2, 2] = np.inf
    pts[3, 1] = -np.inf
    pts[4, 3] = np.nan  # intensity
    pts[5, :2] = 0.0  # on the z axis: a real return, kept
    data = encode_pointcloud2(pts, "livox", tag=np.zeros(20, np.uint8))
    data.is_dense = True
    cloud = decode_pointcloud2(data)
    np.testing.assert_array_equal(cloud.points, pts[5:])
    assert len(cloud.tag) == 15


def test_tag_filter_modes_follow_livox_bit_meaning():
    tags = np.arange(64, dtype=np.uint8)  # bits 0-5 every combination
    spatial, intens = tags & 3, (tags >> 2) & 3
    np.testing.assert_array_equal(tag_keep_mask(tags, "off"), True)
    np.testing.assert_array_equal(tag_keep_mask(tags, "strict"), (spatial == 0) & (intens == 0))
    np.testing.assert_array_equal(tag_keep_mask(tags, "high_confidence"), (spatial != 1) & (intens != 1))
    # return number (bits 4-5) never matters
    assert tag_keep_mask(np.array([0b110000], np.uint8), "strict").all()

    pts = random_points(64, seed=5)
    data = encode_pointcloud2(pts, "livox", tag=tags)
    for mode in ("off", "high_confidence", "strict"):
        cloud = decode_pointcloud2(data, filters=DecodeFilter(tag_filter=mode))
        keep = tag_keep_mask(tags, mode)
        np.testing.assert_array_equal(cloud.points, pts[keep])
        np.testing.assert_array_equal(cloud.tag, tags[keep])
    assert len(decode_pointcloud2(data, filters=DecodeFilter(tag_filter="strict"))) == 4  # tags 0, 16, 32, 48
    assert len(decode_pointcloud2(data, filters=DecodeFilter(tag_filter="high_confidence"))) == 36  # 3*3*4


def test_tag_filter_is_noop_without_tag_field():
    pts = random_points(30)
    cloud = decode_pointcloud2(encode_pointcloud2(pts, "xyzi"), filters=DecodeFilter(tag_filter="strict"))
    assert len(cloud) == 30


def test_range_and_roi_crop():
    pts = random_points(2000, seed=6)
    time = np.linspace(0, 0.1, 2000)
    data = encode_pointcloud2(pts, "livox2", time=time, stamp_ns=STAMP_NS)
    f = DecodeFilter(min_range=5.0, max_range=30.0, x_min=-10, x_max=25, y_min=-20, y_max=20, z_min=-2, z_max=3)
    cloud = decode_pointcloud2(data, filters=f)
    r = np.linalg.norm(pts[:, :3].astype(np.float64), axis=1)
    keep = ((r >= 5) & (r <= 30) & (pts[:, 0] >= -10) & (pts[:, 0] <= 25) & (np.abs(pts[:, 1]) <= 20)
            & (pts[:, 2] >= -2) & (pts[:, 2] <= 3))
    assert 0 < keep.sum() < 2000
    np.testing.assert_array_equal(cloud.points, pts[keep])
    np.testing.assert_allclose(cloud.time, time[keep], atol=1e-6)  # time follows the same mask

    roi = DecodeFilter.from_roi((-10, -20, -2, 25, 20, 3), tag_filter="off")
    assert (roi.x_min, roi.y_min, roi.z_min, roi.x_max, roi.y_max, roi.z_max) == (-10, -20, -2, 25, 20, 3)


def test_filter_points_on_arrays():
    pts = random_points(100, seed=7)
    pts[:10, :3] = 0
    out, time, tag = filter_points(pts, np.arange(100.0), np.zeros(100, np.uint8), DecodeFilter(x_min=0))
    keep = (np.arange(100) >= 10) & (pts[:, 0] >= 0)
    np.testing.assert_array_equal(out, pts[keep])
    np.testing.assert_array_equal(time, np.arange(100.0)[keep])
    assert out.base is None or not np.shares_memory(out, pts)


@pytest.mark.parametrize("kwargs", [dict(tag_filter="loose"), dict(min_range=10, max_range=5), dict(x_min=1, x_max=0),
                                    dict(min_range=-1), dict(z_max=float("nan"))])
def test_invalid_filter_rejected(kwargs):
    with pytest.raises(ConfigError):
        DecodeFilter(**kwargs)


# --------------------------------------------------------------------------- time rules


def test_time_livox2_absolute_ns_relative_to_header():
    pts = random_points(50)
    t = np.linspace(0.0, 0.1, 50)
    cloud = decode_pointcloud2(encode_pointcloud2(pts, "livox2", time=t, stamp_ns=STAMP_NS))
    np.testing.assert_allclose(cloud.time, t, atol=1e-6)
    assert cloud.time.dtype == np.float64


def test_time_absolute_seconds_float64_and_foreign_header_clock():
    pts = random_points(50)
    t = np.linspace(0.0, 0.1, 50)
    base = {"x": (0, FLOAT32, pts[:, 0]), "y": (4, FLOAT32, pts[:, 1]), "z": (8, FLOAT32, pts[:, 2])}
    # Hesai/Robosense style: float64 "timestamp" in absolute seconds
    msg = make_cloud({**base, "timestamp": (16, FLOAT64, STAMP_NS * 1e-9 + 0.02 + t)}, 24)
    np.testing.assert_allclose(decode_pointcloud2(msg).time, 0.02 + t, atol=1e-6)
    # header stamped by another clock (ROS time far from the LiDAR clock): relative to the earliest point
    msg = make_cloud({**base, "timestamp": (16, FLOAT64, 1000.0 * 86400 + 5 + t)}, 24, stamp_ns=STAMP_NS)
    np.testing.assert_allclose(decode_pointcloud2(msg).time, t, atol=1e-6)


def test_time_relative_float32_seconds_and_uint32_ns():
    pts = random_points(50)
    t = np.linspace(0.0, 0.1, 50)
    base = {"x": (0, FLOAT32, pts[:, 0]), "y": (4, FLOAT32, pts[:, 1]), "z": (8, FLOAT32, pts[:, 2])}
    msg = make_cloud({**base, "time": (12, FLOAT32, t)}, 16)  # Velodyne-style
    np.testing.assert_allclose(decode_pointcloud2(msg).time, t, atol=1e-7)
    msg = make_cloud({**base, "t": (12, UINT32, np.round(t * 1e9))}, 16)  # Ouster-style
    np.testing.assert_allclose(decode_pointcloud2(msg).time, t, atol=1e-9)


# --------------------------------------------------------------------------- malformed input


def _xyzi(n=4) -> PointCloud2Data:
    return encode_pointcloud2(random_points(n), "xyzi")


def _with(cloud: PointCloud2Data, **changes) -> PointCloud2Data:
    d = PointCloud2Data(**{**cloud.__dict__})
    for k, v in changes.items():
        setattr(d, k, v)
    return d


MALFORMED = {
    "missing z": lambda d: _with(d, fields=[f for f in d.fields if f.name != "z"]),
    "data too short": lambda d: _with(d, data=d.data[:-1]),
    "data too long": lambda d: _with(d, data=d.data + b"\0"),
    "row_step < width*point_step": lambda d: _with(d, row_step=d.row_step - 16, data=d.data[:-16]),
    "point_step smaller than fields": lambda d: _with(d, point_step=12, row_step=48, data=d.data[:48]),
    "field beyond point_step": lambda d: _with(d, fields=[*d.fields, PointField("ring", 15, UINT16)]),
    "unsupported datatype": lambda d: _with(d, fields=[PointField("x", 0, 9), *d.fields[1:]]),
    "datatype 0": lambda d: _with(d, fields=[*d.fields[:3], PointField("intensity", 12, 0)]),
    "big-endian": lambda d: _with(d, is_bigendian=True),
    "count 3 for x": lambda d: _with(d, fields=[PointField("x", 0, FLOAT32, 3), *d.fields[1:]]),
    "count 0 for y": lambda d: _with(d, fields=[d.fields[0], PointField("y", 4, FLOAT32, 0), *d.fields[2:]]),
    "duplicate field": lambda d: _with(d, fields=[*d.fields, PointField("x", 0, FLOAT32)]),
    "point_step 0": lambda d: _with(d, point_step=0),
    "negative width": lambda d: _with(d, width=-1),
    "data not bytes": lambda d: _with(d, data=3.5),
    "float data array": lambda d: _with(d, data=np.zeros(16, np.float32)),
    "not a cloud": lambda d: object(),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_input_raises_point_cloud_error(case):
    bad = MALFORMED[case](_xyzi())
    with pytest.raises(PointCloudError):
        decode_pointcloud2(bad)


def test_error_messages_name_the_problem():
    with pytest.raises(PointCloudError, match="lacks field"):
        decode_pointcloud2(MALFORMED["missing z"](_xyzi()))
    with pytest.raises(PointCloudError, match="row_step"):
        decode_pointcloud2(MALFORMED["data too short"](_xyzi()))
    with pytest.raises(PointCloudError, match="big-endian"):
        decode_pointcloud2(MALFORMED["big-endian"](_xyzi()))
    with pytest.raises(PointCloudError, match="count"):
        decode_pointcloud2(MALFORMED["count 3 for x"](_xyzi()))


@pytest.mark.parametrize("bad", [np.zeros((5, 2)), np.zeros(5), np.zeros((5, 5))])
def test_encode_rejects_bad_shapes(bad):
    with pytest.raises(PointCloudError):
        encode_pointcloud2(bad, "xyzi")


def test_encode_rejects_bad_layout_and_column_length():
    with pytest.raises(ConfigError):
        encode_pointcloud2(random_points(3), "velodyne")
    with pytest.raises(PointCloudError):
        encode_pointcloud2(random_points(3), "livox", tag=np.zeros(4))


# --------------------------------------------------------------------------- ROS-shaped objects


def test_rosbags_message_and_cdr_round_trip():
    pts = random_points(100)
    data = encode_pointcloud2(pts, "livox", tag=np.zeros(100), stamp_ns=STAMP_NS, frame_id="livox_frame")
    msg = to_rosbags_message(data)
    assert isinstance(msg.data, np.ndarray) and msg.data.dtype == np.uint8
    np.testing.assert_array_equal(decode_pointcloud2(msg).points, pts)
    raw = pointcloud2_to_cdr(data)
    back = pointcloud2_from_cdr(raw)
    cloud = decode_pointcloud2(back)
    np.testing.assert_array_equal(cloud.points, pts)
    assert cloud.stamp_ns == STAMP_NS and cloud.frame_id == "livox_frame"
    assert from_message(back).data == data.data
    with pytest.raises(PointCloudError):
        pointcloud2_from_cdr(raw[:40])


def test_decodes_real_rclpy_pointcloud2():
    msg_mod = pytest.importorskip("sensor_msgs.msg")
    pts = random_points(300)
    pts[7, :3] = 0
    t = np.linspace(0, 0.1, 300)
    data = encode_pointcloud2(pts, "livox2", time=t, tag=np.zeros(300), stamp_ns=STAMP_NS, frame_id="livox_frame")
    msg = to_ros_message(data, msg_mod.PointCloud2)
    assert isinstance(msg, msg_mod.PointCloud2) and isinstance(msg.fields[0], msg_mod.PointField)
    assert msg.header.stamp.sec * 10**9 + msg.header.stamp.nanosec == STAMP_NS
    cloud = decode_pointcloud2(msg)
    keep = np.arange(300) != 7
    np.testing.assert_array_equal(cloud.points, pts[keep])
    np.testing.assert_allclose(cloud.time, t[keep], atol=1e-6)
    assert cloud.frame_id == "livox_frame"


def test_bench_decode_cli_runs(capsys, monkeypatch):
    from livox_infer.tools.cli import main

    monkeypatch.setitem(sys.modules, "sensor_msgs_py", None)  # not importable: the comparison is skipped
    assert main(["bench", "decode", "--points", "2000", "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    assert "sensor_msgs_py not importable" in out and "comparison skipped" in out and "target livox" not in out
    for layout in LAYOUTS:
        assert f"| {layout:6} | livox_infer+filters |" in out
    assert "| custom | rosbags deserialize |" in out and "| custom | livox_infer+filters |" in out


def test_bench_decode_compares_with_upstream_sensor_msgs_py(capsys, monkeypatch, tmp_path):
    """The upstream sensor_msgs_py (../shared/ros2_upstream) timed in the same run, with the target verdict."""
    import tarfile

    pytest.importorskip("sensor_msgs.msg")
    source = Path(__file__).resolve().parents[2] / "shared" / "ros2_upstream" / "common_interfaces.tar.gz"
    if not source.is_file():
        pytest.skip(f"{source} not present")
    with tarfile.open(source) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith("common_interfaces/sensor_msgs_py/sensor_msgs_py/")]
        tar.extractall(tmp_path, members=members, filter="data")
    monkeypatch.syspath_prepend(str(tmp_path / "common_interfaces" / "sensor_msgs_py"))
    for name in [m for m in sys.modules if m.startswith("sensor_msgs_py")]:
        monkeypatch.delitem(sys.modules, name)
    from livox_infer.tools.cli import main

    assert main(["bench", "decode", "--points", "2000", "--repeat", "3", "--rosbags-repeat", "0"]) == 0
    out = capsys.readouterr().out
    assert "read_points_numpy(skip_nans=True) in the same run" in out
    rows = {tuple(c.strip() for c in line.split("|")[1:3]): line.split("|")[5].strip() for line in out.splitlines()
            if line.startswith("| ") and not line.startswith("| layout")}
    assert rows[("xyzi", "sensor_msgs_py")] == "1997"  # it keeps the (0,0,0) no-returns; we drop them
    assert int(rows[("xyzi", "livox_infer+filters")]) < 1997
    assert "target livox_infer+filters <= 1.0x sensor_msgs_py's time" in out


def test_cdr_interoperates_with_rclpy_serialization():
    serialization = pytest.importorskip("rclpy.serialization")
    msg_mod = pytest.importorskip("sensor_msgs.msg")
    pts = random_points(200)
    data = encode_pointcloud2(pts, "livox2", time=np.linspace(0, 0.1, 200), tag=np.zeros(200), stamp_ns=STAMP_NS)
    from_ours = serialization.deserialize_message(pointcloud2_to_cdr(data), msg_mod.PointCloud2)
    np.testing.assert_array_equal(decode_pointcloud2(from_ours).points, pts)
    from_rclpy = pointcloud2_from_cdr(serialization.serialize_message(to_ros_message(data, msg_mod.PointCloud2)))
    cloud = decode_pointcloud2(from_rclpy)
    np.testing.assert_array_equal(cloud.points, pts)
    assert cloud.stamp_ns == STAMP_NS


def test_filters_must_be_a_decode_filter():
    with pytest.raises(ConfigError):
        decode_pointcloud2(encode_pointcloud2(random_points(5), "xyzi"), filters={"max_range": 5})
    with pytest.raises(ConfigError):
        filter_points(random_points(5), filters="strict")


def test_filter_accepts_numpy_numbers_and_rejects_bools():
    f = DecodeFilter(max_range=np.float32(50.0), x_min=np.int64(-3))
    assert not f.is_noop and DecodeFilter().is_noop
    with pytest.raises(ConfigError):
        DecodeFilter(max_range=True)


def test_non_contiguous_buffer_rejected():
    data = encode_pointcloud2(random_points(4), "xyzi")
    doubled = np.frombuffer(data.data * 2, np.uint8)[::2]  # a strided view: not a plain byte buffer
    with pytest.raises(PointCloudError):
        decode_pointcloud2(_with(data, data=memoryview(doubled)))


def test_limit_points_keeps_an_even_deterministic_subset():
    from livox_infer.decode.pointcloud import limit_points

    n = 10_007
    pts = np.c_[np.arange(n), np.zeros((n, 3))].astype(np.float32)
    cloud = Cloud(pts, np.arange(n, dtype=np.float64), np.arange(n, dtype=np.uint8), 5, "f")
    small, dropped = limit_points(cloud, 1000)
    assert len(small) == 1000 and dropped == n - 1000
    idx = small.points[:, 0].astype(np.int64)
    assert idx[0] == 0 and np.all(np.diff(idx) >= n // 1000)  # evenly spread over the whole message
    assert np.array_equal(small.time, idx) and np.array_equal(small.tag, (idx % 256).astype(np.uint8))
    assert (small.stamp_ns, small.frame_id) == (5, "f")
    again, _ = limit_points(cloud, 1000)
    assert np.array_equal(again.points, small.points)
    same, dropped = limit_points(cloud, n)
    assert same is cloud and dropped == 0
