"""Convex colliders."""
from __future__ import annotations

from simjax.errors import UnsupportedFeatureError


def plane_convex(g1, g2, margin):
    raise UnsupportedFeatureError("plane-convex")


def convex_convex(g1, g2, margin):
    raise UnsupportedFeatureError("convex-convex")


def attach_meshes(m, fn, geo1, geo2, i1, i2, ftype):
    return geo1, geo2


MAXCON = {plane_convex: 3, convex_convex: 4}
