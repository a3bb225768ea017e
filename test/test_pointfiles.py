""".pcd / .bin reading and writing, including the real Livox Horizon scans in shared data."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from conftest import SHARED_DATA
from livox_infer.errors import PointCloudError
from livox_infer.decode.pointcloud import DecodeFilter
from livox_infer.decode.pointfiles import (
    lzf_compress,
    lzf_decompress,
    read_bin,
    read_cloud_file,
    read_pcd,
    read_points_file,
    write_bin,
    write_pcd,
)

HORIZON = SHARED_DATA / "livox_horizon"
REAL_SCANS = {
    "livox_source.pcd": (41657, "64372545d011db564e248527e4b90eb34269d998f598b67a5fcfbe37dff19342"),
    "livox_target.pcd": (39783, "5693fffe72b54d26ae4980ce15437ddd3313ecd1330d968f9f5d3b7d0218a66d"),
}


def cloud(n=300, seed=0):
    rng = np.random.default_rng(seed)
    pts = rng.uniform(-50, 50, (n, 4)).astype(np.float32)
    pts[:, 3] = rng.integers(0, 256, n)
    return pts


@pytest.mark.parametrize("name", sorted(REAL_SCANS))
def test_real_livox_horizon_scans(name):
    path = HORIZON / name
    if not path.is_file():
        pytest.skip(f"shared data missing: {path}")
    count, sha = REAL_SCANS[name]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == sha
    pts = read_pcd(path)
    assert pts.shape == (count, 4) and pts.dtype == np.float32
    assert np.isfinite(pts).all()
    assert 0 <= pts[:, 3].min() and pts[:, 3].max() <= 255
    r = np.linalg.norm(pts[:, :3], axis=1)
    assert 0.5 < np.median(r) < 100  # metres, a street scene
    assert -1.5 < np.percentile(pts[:, 2], 5) < -0.5  # ground about 0.9 m below the sensor (data README)
    assert (pts[:, 0] > 0).mean() > 0.95  # Horizon looks forward (+x)
    np.testing.assert_array_equal(read_points_file(path), pts)
    c = read_cloud_file(path, filters=DecodeFilter(max_range=20.0))
    assert 0 < len(c) < count and (np.linalg.norm(c.points[:, :3], axis=1) <= 20.0).all()


@pytest.mark.parametrize("mode", ["ascii", "binary", "binary_compressed"])
def test_pcd_round_trip(tmp_path, mode):
    pts = cloud()
    pts[3, 0] = np.nan  # kept as stored: read_pcd does not filter
    pts[4] = [1e-30, -123456.789, 3.4e38, 0.1]  # extreme float32 values survive ascii
    path = tmp_path / f"c_{mode}.pcd"
    write_pcd(path, pts, data=mode)
    assert f"DATA {mode}\n".encode() in path.read_bytes()[:400]
    back = read_pcd(path)
    np.testing.assert_array_equal(back, pts)
    # the filtered cloud drops the NaN point and the 3.4e38 m one (beyond any sensor's range)
    assert len(read_cloud_file(path)) == len(pts) - 2


def test_pcd_compressed_is_smaller_on_real_structure(tmp_path):
    pts = np.repeat(cloud(50), 20, axis=0)
    write_pcd(tmp_path / "a.pcd", pts, "binary")
    write_pcd(tmp_path / "b.pcd", pts, "binary_compressed")
    assert (tmp_path / "b.pcd").stat().st_size < 0.6 * (tmp_path / "a.pcd").stat().st_size
    np.testing.assert_array_equal(read_pcd(tmp_path / "b.pcd"), pts)


def test_pcd_xyz_only_writes_zero_intensity(tmp_path):
    write_pcd(tmp_path / "a.pcd", cloud()[:, :3])
    np.testing.assert_array_equal(read_pcd(tmp_path / "a.pcd")[:, 3], 0)


# PCD with mixed sizes/types, a COUNT>1 padding field and fields in an unusual order
EXTRA_FIELDS = (
    ("ring", "U", 2, 1), ("x", "F", 8, 1), ("_", "U", 1, 3), ("y", "F", 4, 1), ("reflectivity", "U", 1, 1),
    ("z", "F", 4, 1), ("normal", "F", 4, 3), ("_", "I", 1, 1),
)


def _extra_pcd(pts: np.ndarray, mode: str) -> bytes:
    n = len(pts)
    names = " ".join(f[0] for f in EXTRA_FIELDS)
    header = (f"# test\nVERSION .7\nFIELDS {names}\nSIZE " + " ".join(str(f[2]) for f in EXTRA_FIELDS)
              + "\nTYPE " + " ".join(f[1] for f in EXTRA_FIELDS) + "\nCOUNT " + " ".join(str(f[3]) for f in EXTRA_FIELDS)
              + f"\nWIDTH {n}\nHEIGHT 1\nVIEWPOINT 0 0 0 1 0 0 0\nPOINTS {n}\nDATA {mode}\n").encode()
    np_types = {("U", 2): "<u2", ("F", 8): "<f8", ("U", 1): "u1", ("F", 4): "<f4", ("I", 1): "i1"}
    values = {"ring": np.arange(n) % 16, "x": pts[:, 0], "y": pts[:, 1], "reflectivity": pts[:, 3], "z": pts[:, 2]}
    cols = []
    for k, (name, t, size, count) in enumerate(EXTRA_FIELDS):
        v = values.get(name, np.full((n, count), 7))
        cols.append(np.asarray(v).reshape(n, count).astype(np_types[(t, size)]))
    if mode == "ascii":
        return header + "\n".join(" ".join(" ".join(repr(float(x)) if c.dtype.kind == "f" else str(int(x))
                                                      for x in c[i]) for c in cols) for i in range(n)).encode() + b"\n"
    if mode == "binary":
        rec = np.dtype([(f"f{k}", c.dtype, (c.shape[1],)) for k, c in enumerate(cols)])
        arr = np.zeros(n, rec)
        for k, c in enumerate(cols):
            arr[f"f{k}"] = c
        return header + arr.tobytes()
    raw = b"".join(c.T.tobytes() if c.shape[1] == 1 else c.tobytes() for c in cols)
    packed = lzf_compress(raw)
    return header + np.array([len(packed), len(raw)], "<u4").tobytes() + packed


@pytest.mark.parametrize("mode", ["ascii", "binary", "binary_compressed"])
def test_pcd_any_field_types_and_extra_fields(tmp_path, mode):
    pts = cloud(40, seed=2)
    path = tmp_path / "extra.pcd"
    path.write_bytes(_extra_pcd(pts, mode))
    np.testing.assert_array_equal(read_pcd(path), pts)  # intensity from "reflectivity"


PCD_OK_HEADER = "VERSION .7\nFIELDS x y z\nSIZE 4 4 4\nTYPE F F F\nCOUNT 1 1 1\nWIDTH 2\nHEIGHT 1\nPOINTS 2\n"


@pytest.mark.parametrize("content", [
    PCD_OK_HEADER + "DATA binary\n" + "\0" * 23,  # truncated body
    PCD_OK_HEADER + "DATA lzma\n",  # unknown mode
    PCD_OK_HEADER.replace("FIELDS x y z", "FIELDS x y w") + "DATA ascii\n1 2 3\n4 5 6\n",  # no z
    PCD_OK_HEADER.replace("POINTS 2", "POINTS 3") + "DATA ascii\n1 2 3\n4 5 6\n",  # POINTS != WIDTH*HEIGHT
    PCD_OK_HEADER + "DATA ascii\n1 2 3\n4 5\n",  # ragged ascii
    PCD_OK_HEADER + "DATA ascii\n1 2 3\n",  # too few rows
    PCD_OK_HEADER.replace("COUNT 1 1 1", "COUNT 2 1 1") + "DATA ascii\n1 1 2 3\n4 4 5 6\n",  # x with COUNT 2
    PCD_OK_HEADER.replace("SIZE 4 4 4", "SIZE 4 4 3") + "DATA binary\n" + "\0" * 24,  # F3 type
    PCD_OK_HEADER.replace("SIZE 4 4 4\n", "") + "DATA binary\n" + "\0" * 24,  # no SIZE
    PCD_OK_HEADER + "DATA binary_compressed\n\x10\0\0\0\x18\0\0\0\x05abc",  # truncated LZF
    PCD_OK_HEADER,  # no DATA line
    "",  # empty file
])
def test_malformed_pcd_raises(tmp_path, content):
    path = tmp_path / "bad.pcd"
    path.write_bytes(content.encode("latin-1"))
    with pytest.raises(PointCloudError):
        read_pcd(path)


def test_bin_round_trip_and_errors(tmp_path):
    pts = cloud()
    write_bin(tmp_path / "a.bin", pts)
    assert (tmp_path / "a.bin").stat().st_size == pts.size * 4
    np.testing.assert_array_equal(read_bin(tmp_path / "a.bin"), pts)
    np.testing.assert_array_equal(read_points_file(tmp_path / "a.bin"), pts)
    (tmp_path / "bad.bin").write_bytes(b"\0" * 17)
    with pytest.raises(PointCloudError, match="16"):
        read_bin(tmp_path / "bad.bin")
    with pytest.raises(PointCloudError, match="not found"):
        read_bin(tmp_path / "missing.bin")
    with pytest.raises(PointCloudError, match="unknown point file"):
        read_points_file(tmp_path / "a.ply")
    with pytest.raises(PointCloudError):
        write_bin(tmp_path / "c.bin", np.zeros((3, 5)))


def test_lzf_decodes_hand_built_stream():
    # literal "ab", then a 6-byte back-reference at distance 2 (overlapping), then a 12-byte
    # back-reference (length extension byte) at distance 8, then literal "Z"
    stream = bytes([0x01]) + b"ab" + bytes([(4 << 5) | 0, 0x01]) + bytes([(7 << 5) | 0, 12 - 2 - 7, 7]) + b"\x00Z"
    assert lzf_decompress(stream, 21) == b"abababab" + b"abababababab" + b"Z"
    with pytest.raises(PointCloudError):
        lzf_decompress(stream, 22)  # size mismatch
    with pytest.raises(PointCloudError):
        lzf_decompress(bytes([0x20, 0x05]), 3)  # reference before the start
    with pytest.raises(PointCloudError):
        lzf_decompress(bytes([0x05]) + b"ab", 6)  # literal cut short


@pytest.mark.parametrize("data", [b"", b"a", b"abc" * 3000, bytes(range(256)) * 40,
                                  np.random.default_rng(0).integers(0, 3, 20000, dtype=np.uint8).tobytes(),
                                  np.random.default_rng(1).integers(0, 256, 5000, dtype=np.uint8).tobytes()])
def test_lzf_round_trip(data):
    packed = lzf_compress(data)
    assert lzf_decompress(packed, len(data)) == data
    if data[:3] == b"abc":
        assert len(packed) < len(data) / 20


def test_npy_point_files(tmp_path):
    from livox_infer.errors import PointCloudError
    from livox_infer.decode.pointfiles import read_points_file

    pts = np.arange(12, dtype=np.float64).reshape(4, 3)
    np.save(tmp_path / "a.npy", pts)
    got = read_points_file(tmp_path / "a.npy")
    assert got.dtype == np.float32 and got.shape == (4, 4)
    np.testing.assert_array_equal(got[:, :3], pts.astype(np.float32))
    assert (got[:, 3] == 0).all()
    np.save(tmp_path / "bad.npy", np.zeros(5))
    with pytest.raises(PointCloudError, match="expected a numeric"):
        read_points_file(tmp_path / "bad.npy")
    np.save(tmp_path / "obj.npy", np.array([{"x": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(PointCloudError, match="cannot read"):
        read_points_file(tmp_path / "obj.npy")


def test_a_point_file_without_intensity_is_warned_about_once(tmp_path, caplog, monkeypatch):
    """Issue 30: a .pcd without an intensity field was read with intensity 0 for every point, silently."""
    import logging

    from livox_infer.decode import pointfiles

    monkeypatch.setattr(pointfiles, "_warned_no_intensity", False)
    for i in range(2):
        (tmp_path / f"xyz{i}.pcd").write_text("VERSION 0.7\nFIELDS x y z\nSIZE 4 4 4\nTYPE F F F\nCOUNT 1 1 1\n"
                                               "WIDTH 2\nHEIGHT 1\nPOINTS 2\nDATA ascii\n1 2 3\n4 5 6\n")
    with caplog.at_level(logging.WARNING, logger="livox_infer.pointfiles"):
        pts = pointfiles.read_pcd(tmp_path / "xyz0.pcd")
        pointfiles.read_pcd(tmp_path / "xyz1.pcd")
    assert pts.shape == (2, 4) and not pts[:, 3].any()
    warned = [r.getMessage() for r in caplog.records if r.name == "livox_infer.pointfiles"]
    assert len(warned) == 1 and "xyz0.pcd has no intensity (fields x, y, z" in warned[0]
    monkeypatch.setattr(pointfiles, "_warned_no_intensity", False)
    with caplog.at_level(logging.WARNING, logger="livox_infer.pointfiles"):
        pointfiles.write_pcd(tmp_path / "ok.pcd", np.ones((3, 4), np.float32))
        pointfiles.read_pcd(tmp_path / "ok.pcd")
    assert len([r for r in caplog.records if r.name == "livox_infer.pointfiles"]) == 1  # none for a file with one
