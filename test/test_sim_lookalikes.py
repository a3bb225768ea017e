"""Person-sized non-pedestrians in the simulator (sim/lookalikes.py, scene option lookalikes)."""

import numpy as np
import pytest

from livox_infer.errors import ConfigError
from livox_infer.sim.geometry import PrimitiveBuilder
from livox_infer.sim.lookalikes import LOOKALIKE_KINDS, add_lookalike
from livox_infer.sim.scene import make_scene
from livox_infer.sim.simulate import simulate_frame


@pytest.mark.parametrize("kind", LOOKALIKE_KINDS)
def test_each_lookalike_is_person_sized_background(kind):
    b = PrimitiveBuilder()
    assert add_lookalike(b, np.random.default_rng(3), 10.0, 2.0, 0.0, kind) == kind
    prims = b.build()
    top = prims.center[:, 2] + np.abs(prims.rot[:, 2, :] * prims.half).sum(1)
    assert len(prims.center) >= 1 and 0.5 < top.max() < 3.2
    assert np.all(prims.instance == -1)  # unlabelled


@pytest.mark.parametrize("mode", ["street", "open"])
def test_lookalikes_add_background_and_zero_keeps_the_scene(mode):
    base = make_scene(7, mode)
    zero = make_scene(7, mode, lookalikes=0.0)
    more = make_scene(7, mode, lookalikes=2.0)
    assert np.array_equal(base.static.center, zero.static.center)
    assert [o.label for o in base.objects] == [o.label for o in zero.objects]
    assert len(more.static.center) > len(base.static.center) + 5


def test_lookalikes_is_a_simulate_option_and_rejects_negative():
    f = simulate_frame("avia", 4, scene="street", lookalikes=1.0)
    assert f.points.shape[0] > 0
    with pytest.raises(ConfigError):
        make_scene(1, "street", lookalikes=-1.0)
