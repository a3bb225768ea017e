"""Ray casting: analytic intersections per shape, and angular culling against brute force."""

from __future__ import annotations

import numpy as np
import pytest

from livox_infer.sim.geometry import (
    BOX, CYLINDER, ELLIPSOID, RBOX, Ground, PrimitiveBuilder, _pair_intervals, cast_rays, rot_x, rot_z,
)


def _one(kind, center, half, rot=None):
    b = PrimitiveBuilder()
    b.add(kind, center, half, rot)
    return b.build()


@pytest.mark.parametrize("kind,half,rot,t_expect,normal", [
    (BOX, (1.0, 1.0, 1.0), None, 9.0, (-1, 0, 0)),
    (CYLINDER, (1.0, 1.0, 2.0), None, 9.0, (-1, 0, 0)),
    (ELLIPSOID, (2.0, 1.0, 1.0), None, 8.0, (-1, 0, 0)),
    (RBOX, (1.0, 1.0, 1.0), None, 9.0, (-1, 0, 0)),
    # a wheel: cylinder axis along y, the ray along x meets its tread
    (CYLINDER, (0.5, 0.5, 0.1), rot_x(np.pi / 2), 9.5, (-1, 0, 0)),
    # box seen across its diagonal (yaw 45 deg): the corner is at 10 - sqrt(2)
    (BOX, (1.0, 1.0, 1.0), rot_z(np.pi / 4), 10 - np.sqrt(2), None),
    # the rounded box cuts that corner: the rounded edge is at 10 - 1.2
    (RBOX, (1.0, 1.0, 1.0), rot_z(np.pi / 4), 10 - 1.2, (-1, 0, 0)),
])
def test_analytic_first_hit(kind, half, rot, t_expect, normal):
    prims = _one(kind, (10.0, 0.0, 0.0), half, rot)
    o = np.zeros((1, 3))
    d = np.array([[1.0, 0.0, 0.0]])
    hits = cast_rays(o, d, prims, None, np.random.default_rng(0))
    assert hits.prim[0] == 0
    assert hits.t[0] == pytest.approx(t_expect, abs=1e-9)
    if normal is not None:
        np.testing.assert_allclose(hits.normal[0], normal, atol=1e-9)


def test_misses_and_inside_rays():
    prims = _one(BOX, (10.0, 0.0, 0.0), (1.0, 1.0, 1.0))
    o = np.array([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [10.0, 0.0, 0.0]])
    d = np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 0.3], [1.0, 0.0, 0.0]])
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    hits = cast_rays(o, d, prims, None, np.random.default_rng(0))
    assert hits.prim[0] == -2 and np.isinf(hits.t[0])  # pointing away
    assert hits.prim[1] == -2  # passes above (z at x=9 is 2.6 > 1)
    assert hits.prim[2] == -2  # starts inside: no surface in front is entered


def test_ground_hit_and_sky():
    g = Ground(0.0, 0.0, np.zeros(0), np.zeros((0, 2)), np.zeros(0), 0.1, np.zeros(0), noise_sigma=0.0)
    o = np.array([[0.0, 0.0, 2.0], [0.0, 0.0, 2.0]])
    d = np.array([[1.0, 0.0, -0.2], [1.0, 0.0, 0.1]])
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    hits = cast_rays(o, d, _one(BOX, (100, 100, 0), (1, 1, 1)), g, np.random.default_rng(0))
    p = o[0] + hits.t[0] * d[0]
    assert hits.prim[0] == -1 and p[2] == pytest.approx(0.0, abs=1e-9) and p[0] == pytest.approx(10.0)
    np.testing.assert_allclose(hits.normal[0], (0, 0, 1))
    assert hits.prim[1] == -2 and np.isinf(hits.t[1])


@pytest.mark.parametrize("ego_motion", [0.0, 1.2])
def test_culling_finds_the_same_first_hits_as_brute_force(ego_motion):
    rng = np.random.default_rng(1)
    b = PrimitiveBuilder()
    kinds = (BOX, CYLINDER, ELLIPSOID, RBOX)
    for i in range(150):
        r = rng.uniform(3, 80)
        a = rng.uniform(-1.2, 1.2)
        c = (r * np.cos(a), r * np.sin(a), rng.uniform(-2, 6))
        half = rng.uniform(0.05, 3.0, 3)
        if i % 2:  # arbitrary orientation (a random proper rotation)
            q, _ = np.linalg.qr(rng.normal(size=(3, 3)))
            q *= np.sign(np.linalg.det(q))
        else:  # upright, yawed: tight angular windows, where a culling error would show first
            q = rot_z(rng.uniform(-np.pi, np.pi))
        b.add(kinds[i % 4], c, half, q)
    prims = b.build()
    n = 20000
    # a moving origin (ego motion within the frame) and directions over a wide FOV
    o = np.stack([np.linspace(0, ego_motion, n), np.zeros(n), np.full(n, 1.5)], 1)
    az = rng.uniform(-1.2, 1.2, n)
    el = rng.uniform(-0.6, 0.6, n)
    d = np.stack([np.cos(el) * np.cos(az), np.cos(el) * np.sin(az), np.sin(el)], 1)
    hits = cast_rays(o, d, prims, None, np.random.default_rng(0))

    # brute force: every ray against every primitive
    best = np.full(n, np.inf)
    for p in range(len(prims)):
        m = prims.rot[p].T / prims.half[p][:, None]
        os_ = (o - prims.center[p]) @ m.T
        ds_ = d @ m.T
        ti, to = _pair_intervals(os_[:, 0], os_[:, 1], os_[:, 2], ds_[:, 0], ds_[:, 1], ds_[:, 2],
                                 np.full(n, prims.kind[p]))
        ok = (ti <= to) & (ti > 0)
        best = np.where(ok, np.minimum(best, ti), best)
    assert np.isfinite(best).sum() > 500  # the scene is actually hit
    np.testing.assert_allclose(hits.t, best, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("ego_motion", [0.0, 1.2])
def test_moving_primitives_match_brute_force_at_each_ray_time(ego_motion):
    """Primitives with velocities: every ray sees each primitive at center + velocity x ray time
    (chunked, padded angular culling must agree with checking every ray against every moved primitive)."""
    rng = np.random.default_rng(2)
    b = PrimitiveBuilder()
    kinds = (BOX, CYLINDER, ELLIPSOID, RBOX)
    for i in range(120):
        r = rng.uniform(3, 60)
        a = rng.uniform(-1.2, 1.2)
        b.add(kinds[i % 4], (r * np.cos(a), r * np.sin(a), rng.uniform(-2, 4)), rng.uniform(0.05, 2.5, 3),
              rot_z(rng.uniform(-np.pi, np.pi)))
    prims = b.build()
    vel = np.zeros((len(prims), 3))
    vel[::2, :2] = rng.uniform(-25, 25, (len(vel[::2]), 2))  # half of them move, up to ~35 m/s
    n = 20000
    tau = np.linspace(0.0, 0.1, n)
    o = np.stack([ego_motion / 0.1 * tau, np.zeros(n), np.full(n, 1.5)], 1)
    az = rng.uniform(-1.2, 1.2, n)
    el = rng.uniform(-0.6, 0.6, n)
    d = np.stack([np.cos(el) * np.cos(az), np.cos(el) * np.sin(az), np.sin(el)], 1)
    hits = cast_rays(o, d, prims, None, np.random.default_rng(0), ray_time=tau, prim_velocity=vel)

    best = np.full(n, np.inf)
    for p in range(len(prims)):
        m = prims.rot[p].T / prims.half[p][:, None]
        os_ = (o - prims.center[p] - vel[p] * tau[:, None]) @ m.T
        ds_ = d @ m.T
        ti, to = _pair_intervals(os_[:, 0], os_[:, 1], os_[:, 2], ds_[:, 0], ds_[:, 1], ds_[:, 2],
                                 np.full(n, prims.kind[p]))
        ok = (ti <= to) & (ti > 0)
        best = np.where(ok, np.minimum(best, ti), best)
    assert np.isfinite(best).sum() > 500
    np.testing.assert_allclose(hits.t, best, rtol=1e-9, atol=1e-9)
    # the same primitives standing still give different first hits: the motion is really applied
    still = cast_rays(o, d, prims, None, np.random.default_rng(0))
    assert np.sum(np.isfinite(still.t) != np.isfinite(hits.t)) > 50
    # zero velocities are the static cast exactly
    same = cast_rays(o, d, prims, None, np.random.default_rng(0), ray_time=tau, prim_velocity=np.zeros_like(vel))
    np.testing.assert_array_equal(same.t, still.t)
