"""Constraint rows of each kind (constraint_rows.py): helpers checked on their own; the
rows themselves are compared to MuJoCo 4.0.0 in test_constraint.py."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from simjax.engine import constraint_rows


@pytest.mark.parametrize("rel", ["gym_ant/ant.xml", "mjx_shadow_hand/scene_right.xml"])
def test_anc_mask_matches_table(rel):
    """Dof masks by body-id range compares equal the ancestor-dof table (one tree and
    two trees)."""
    from simjax.engine import tables
    _, m = __import__("engine_helpers").load(rel, constraints=True)
    assert constraint_rows._dof_ranges(m) is not None
    got = np.asarray(constraint_rows._anc_mask(m, jnp.arange(m.nbody), jnp.float64))
    assert np.array_equal(got, tables.get(m).anc_dof)
