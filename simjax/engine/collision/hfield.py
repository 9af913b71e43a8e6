"""Height-field collisions (mjc_ConvexHField)."""
from __future__ import annotations

from simjax.errors import UnsupportedFeatureError


def hfield_convex(g1, g2, margin):
    raise UnsupportedFeatureError("height-field collisions")


MAXCON = {hfield_convex: 50}
