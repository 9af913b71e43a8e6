"""Height-field collisions (MuJoCo's mjc_ConvexHField): not implemented yet.

The driver raises UnsupportedFeatureError at trace time (from static model data) for
any candidate pair with a height field, so models with height-field contacts fail
loudly instead of falling through the floor. The dispatch slot exists so the collider
(per-cell triangular prisms against the convex geom, up to 50 contacts) slots in.
"""
from __future__ import annotations

from simjax.errors import UnsupportedFeatureError


def hfield_convex(g1, g2, margin):
    """Placeholder collider: never traced (the driver raises first)."""
    raise UnsupportedFeatureError("height-field collisions")


MAXCON = {hfield_convex: 50}
