"""SDF shape plugins ``mujoco.sdf.bolt`` / ``bowl`` / ``gear`` / ``nut`` / ``torus``.

Signed distance functions of MuJoCo's plugin/sdf shapes (same formulas, attributes and
defaults, written once for numpy and jax.numpy). Distances are in the mesh frame of the
geom (the SDF's own frame). ``sdf_gradient`` is ``jax.grad`` of the distance (MuJoCo's
torus gradient is the same analytic gradient; its other shapes use forward differences
with step 1e-8, which differ from the exact gradient by O(1e-8)).

Parameters (Model.plugin_params[i]): ``{"attr": (nattribute,)}`` float array in the
order of ``attributes`` (differentiable: e.g. the torus radii). Attribute values must be
numbers (MuJoCo's CheckAttr); missing ones take the shape's defaults.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from simjax.engine import math as smath
from simjax.plugins.protocol import Capability, Plugin
from simjax.types import Stage


class _Jax:
    """jax.numpy for the shapes, with simjax's maximum, minimum and clip: their
    derivatives compare the operands, where jnp's test the result against an operand
    that XLA may recompute and round otherwise in the derivative's kernel (the gear's
    gradient came out zero 5e-8 off its surface, at XLA's backend optimisation 0)."""

    maximum = staticmethod(smath.maximum)
    minimum = staticmethod(smath.minimum)
    clip = staticmethod(smath.clip)

    def __getattr__(self, name):
        return getattr(jnp, name)


_JX = _Jax()


def _fract(xp, x):
    return x - xp.floor(x)


def _norm2(xp, x, y):
    # safe at the axis: d sqrt / dx is finite (0) where x = y = 0
    r2 = x * x + y * y
    if xp is np:
        return np.sqrt(r2)
    safe = jnp.where(r2 > 0, r2, 1.0)
    return jnp.where(r2 > 0, jnp.sqrt(safe), 0.0)


def torus(xp, p, a):
    q = _norm2(xp, p[..., 0], p[..., 1]) - a[0]
    return _norm2(xp, q, p[..., 2]) - a[1]


def bowl(xp, p, a):
    height, radius, thick = a[0], a[1], a[2]
    width = xp.sqrt(radius * radius - height * height)
    q0 = _norm2(xp, p[..., 0], p[..., 1])
    q1 = p[..., 2]
    rim = _norm2(xp, q0 - width, q1 - height)
    shell = xp.abs(_norm2(xp, q0, q1) - radius)
    return xp.where(height * q0 < width * q1, rim, shell) - thick


def _hex_head(xp, p, radius):
    """Hexagonal head (shared by nut and bolt): rotate into the nearest sector."""
    sqrt12 = math.sqrt(2.0) / 2.0
    k = 6.0 / math.pi / 2.0
    angle = -xp.floor(xp.arctan2(p[..., 1], p[..., 0]) * k + 0.5) / k
    s0, s1 = xp.sin(angle), xp.sin(angle + math.pi * 0.5)
    x = s1 * p[..., 0] - s0 * p[..., 1]
    head = x - 0.5
    head = xp.maximum(head, xp.abs(p[..., 2] + 0.25) - 0.25)
    return xp.maximum(head, (p[..., 2] + radius - 0.22) * sqrt12)


def _thread(xp, p, a):
    screw = 12.0
    radius = _norm2(xp, p[..., 0], p[..., 1]) - a[0]
    azimuth = xp.arctan2(p[..., 1], p[..., 0])
    triangle = xp.abs(_fract(xp, p[..., 2] * screw - azimuth / math.pi / 2.0) - 0.5)
    return radius, (radius - triangle / screw) * (math.sqrt(2.0) / 2.0)


def nut(xp, p, a):
    sqrt12 = math.sqrt(2.0) / 2.0
    radius, thread = _thread(xp, p, a)
    cone = (p[..., 2] - radius) * sqrt12
    hole = xp.maximum(thread, -(cone + 0.5 * sqrt12))
    hole = xp.minimum(hole, -cone - 0.05 * sqrt12)
    return xp.maximum(_hex_head(xp, p, radius), -hole)


def bolt(xp, p, a):
    sqrt12 = math.sqrt(2.0) / 2.0
    radius, thread = _thread(xp, p, a)
    body = xp.maximum(thread, -(0.5 - xp.abs(p[..., 2] + 0.5)))
    cone = (p[..., 2] - radius) * sqrt12
    body = xp.maximum(body, -(cone + 1.0 * sqrt12))
    return xp.minimum(body, _hex_head(xp, p, radius))


def _smooth_union(xp, a, b, k):
    h = xp.clip(0.5 + 0.5 * (b - a) / k, 0.0, 1.0)
    return b * (1.0 - h) + a * h - k * h * (1.0 - h)


def _smooth_intersection(xp, a, b, k):
    return xp.maximum(xp.maximum(a, b), -_smooth_union(xp, xp.maximum(a, -b),
                                                       xp.maximum(b, -a), k))


def _mod(xp, x, y):
    return x - y * xp.floor(x / y)


def _gear2d(xp, p, a):
    """Involute spur gear profile (MuJoCo's gear.cc, after shadertoy 3lG3WR)."""
    alpha, diam, teeth = a[0], a[1], a[2]
    psi = 3.096e-5 * teeth * teeth - 6.557e-3 * teeth + 0.551     # pressure angle
    r_pitch = diam / 2.0
    rho = _norm2(xp, p[..., 0], p[..., 1])
    pd = teeth / diam
    pitch = math.pi / pd
    addendum = 1.0 / pd
    r_out = (diam + 2.0 * addendum) / 2.0
    h = 2.2 / pd
    inner = xp.where(a[4] >= 0.0, a[4] / 2.0, r_out - h - 0.14 * diam)
    rb = diam * xp.cos(psi) / 2.0
    fi = xp.arctan2(p[..., 1], p[..., 0]) + alpha
    stride = pitch / r_pitch
    inv_alpha = xp.arccos(rb / r_pitch)
    inv_phi = xp.tan(inv_alpha) - inv_alpha
    shift = stride / 2.0 - 2.0 * inv_phi
    fia = _mod(xp, fi + shift / 2.0, stride) - shift / 2.0
    fib = _mod(xp, -fi - shift + shift / 2.0, stride) - shift / 2.0
    outside = rb < rho
    rho_s = xp.where(outside, rho, rb + 1.0)
    acos_r = xp.arccos(rb / rho_s)
    ta = xp.sqrt(xp.maximum(rho_s * rho_s - rb * rb, 0.0))
    dista = xp.where(outside, ta - rb * (fia + acos_r), -1.0e6)
    distb = xp.where(outside, ta - rb * (fib + acos_r), -1.0e6)
    cogs = xp.maximum(dista, distb)
    walls = xp.maximum(fia - (stride - shift), fib - (stride - shift))
    cogs = xp.maximum(walls, cogs)
    cogs = _smooth_intersection(xp, rho - r_out, cogs, 0.0035 * diam)
    cogs = _smooth_union(xp, rho - (r_out - h), cogs, rb - r_out + h)
    cogs = xp.maximum(cogs, -(rho - inner))
    # early exits of the reference: inside the crown hole, far outside the teeth
    cogs = xp.where(inner - rho > 0.0, inner - rho, cogs)
    return xp.where(r_out - rho < -0.2, rho - r_out, cogs)


def gear(xp, p, a):
    d2 = _gear2d(xp, p, a)
    w0, w1 = d2, xp.abs(p[..., 2]) - a[3] / 2.0
    return xp.minimum(xp.maximum(w0, w1), 0.0) + _norm2(xp, xp.maximum(w0, 0.0),
                                                       xp.maximum(w1, 0.0))


# name, attributes, defaults, distance, aabb(attr) -> (center 3, half sizes 3)
_SHAPES = {
    "bolt": (("radius",), (0.26,), bolt, lambda a: (0, 0, 0, .6, .6, 1.0)),
    "bowl": (("height", "radius", "thickness"), (.4, 1.0, .02), bowl,
             lambda a: (0, 0, 0, a[1] + a[2], a[1] + a[2], a[1] + a[2])),
    "gear": (("alpha", "diameter", "teeth", "thickness", "innerdiameter"),
             (0.0, 2.8, 25.0, .2, -1.0), gear,
             lambda a: (0, 0, 0, a[1] / 2 * 1.25, a[1] / 2 * 1.25, a[3] / 2 * 1.1)),
    "nut": (("radius",), (0.26,), nut, lambda a: (0, 0, 0, .6, .6, 1.0)),
    "torus": (("radius1", "radius2"), (.35, .15), torus,
              lambda a: (0, 0, 0, a[0] + a[1], a[0] + a[1], a[1])),
}


def attributes(shape, inst) -> np.ndarray:
    """(nattribute,) float values: config (which must parse as numbers) or defaults."""
    names, defaults, _, _ = _SHAPES[shape]
    out = []
    for name, default in zip(names, defaults):
        raw = inst.config.get(name, "")
        text = "".join(raw.split())
        if not text:
            out.append(default)
            continue
        try:
            out.append(float(text))
        except ValueError:
            raise ValueError(f"invalid value '{raw}' for attribute '{name}' of the "
                             f"{shape} SDF") from None
    return np.asarray(out, np.float64)


def _make(shape):
    names, _, dist, aabb = _SHAPES[shape]

    def distance(params, point):
        return dist(_JX, jnp.asarray(point), params["attr"])

    def gradient(params, point):
        return jax.grad(lambda x: dist(_JX, x, params["attr"]))(jnp.asarray(point))

    return Plugin(
        name=f"mujoco.sdf.{shape}", capabilities=Capability.SDF, attributes=names,
        needstage=Stage.NONE, nstate=lambda inst: 0,
        validate=lambda inst, model: attributes(shape, inst),
        init=lambda inst, model: {"attr": attributes(shape, inst)},
        sdf_distance=distance, sdf_gradient=gradient,
        sdf_aabb=lambda inst: np.asarray(aabb(attributes(shape, inst)), np.float64),
        sdf_staticdistance=lambda inst, pts: dist(np, np.asarray(pts, np.float64),
                                                  attributes(shape, inst)))


# slot order of MuJoCo's sdf library registration
PLUGINS = [_make(s) for s in ("bolt", "bowl", "gear", "nut", "torus")]
BY_NAME = {p.name: p for p in PLUGINS}
