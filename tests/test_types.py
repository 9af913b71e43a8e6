"""Model pytree statics: content-hashed once per object, read-only afterwards."""
import jax
import numpy as np
import pytest

import simjax

XML = """<mujoco><worldbody><body><joint type="hinge"/><geom size=".1"/></body>
  <body pos="1 0 0"><joint type="slide"/><geom size=".1"/></body></worldbody></mujoco>"""


def test_static_key_cached_and_arrays_read_only():
    m = simjax.load_model(XML)
    aux1 = jax.tree_util.tree_structure(m)
    aux2 = jax.tree_util.tree_structure(m)
    assert aux1 == aux2
    # the hashed static arrays cannot be edited in place (the cached key would go stale)
    with pytest.raises(ValueError, match="read-only"):
        m.jnt_type[0] = 2
    # replacing an array gives a new key and a new compile, with the new value
    f = jax.jit(lambda m: m.jnt_type.sum() + 0 * m.opt.timestep)
    assert int(f(m)) == 3 + 2
    m2 = m.replace(jnt_type=np.array([3, 3], m.jnt_type.dtype))
    assert jax.tree_util.tree_structure(m2) != aux1
    assert int(f(m2)) == 6
    # an equal copy of the statics hashes equal (same compiled function reused)
    m3 = m.replace(jnt_type=np.array(m.jnt_type))
    assert jax.tree_util.tree_structure(m3) == aux1
