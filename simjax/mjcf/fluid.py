"""Compile-time coefficients of the ellipsoid fluid model (``geom_fluid``).

The added-mass factors kappa are the integrals of MuJoCo's fluid model
(doc_computation_fluid: Tuckerman's virtual mass of an ellipsoid), evaluated with
15-point Gauss-Kronrod quadrature after the change of variables l = x^3 / (1-x)^2, as
``mjCGeom::SetFluidCoefs`` does. Layout of the 12 entries: [ellipsoid flag, blunt drag,
slender drag, angular drag, Kutta lift, Magnus lift, virtual mass (3), virtual inertia
(3)].
"""
from __future__ import annotations

import numpy as np

from simjax.types import GeomType

# Kronrod 15-point nodes and weights on [-1, 1], mapped to [0, 1]
_XI = np.array([0.99145537112081263921, 0.94910791234275852453, 0.86486442335976907279,
                0.74153118559939443986, 0.58608723546769113029, 0.40584515137739716691,
                0.20778495500789846760, 0.0])
_WI = np.array([0.022935322010529, 0.063092092629979, 0.104790010322250,
                0.140653259715525, 0.169004726639267, 0.190350578064785,
                0.204432940075298, 0.209482141084728])
# as in MuJoCo, the nodes are rounded to 8 decimals before the change of variables
_X = np.round((1 + np.concatenate([-_XI, _XI[-2::-1]])) / 2, 8)
# MuJoCo uses the half-weights rounded to 8 decimals; so do we, to agree to 1e-8
_W = np.round(np.concatenate([_WI, _WI[-2::-1]]) / 2, 8)
_L = _X ** 3 / (1 - _X) ** 2
_DL = _X ** 2 * (3 - _X) / (1 - _X) ** 3
_EPS = 1e-14


def _kappa(dx, dy, dz):
    inv = 1 / np.array([dx * dx, dy * dy, dz * dz])
    scale = (dx ** 3 * dy * dz) ** 0.4   # non-dimensionalise l by the semi-axes
    lam = scale * _L
    denom = (1 + lam * inv[0]) * np.sqrt((1 + lam * inv[0]) * (1 + lam * inv[1]) *
                                         (1 + lam * inv[2]))
    return float(np.sum(scale * _DL / denom * _W) * inv[0])


def fluid_coefs(gtype: int, size, coef) -> np.ndarray:
    """geom_fluid (12,) of a geom with fluidshape="ellipsoid" and ``fluidcoef`` (5,)."""
    if gtype == GeomType.SPHERE:
        d = (size[0], size[0], size[0])
    elif gtype == GeomType.CAPSULE:
        d = (size[0], size[0], size[1] + size[0])
    elif gtype == GeomType.CYLINDER:
        d = (size[0], size[0], size[1])
    else:
        d = (size[0], size[1], size[2])
    dx, dy, dz = d
    vol = 4.0 / 3.0 * np.pi * dx * dy * dz
    kx, ky, kz = _kappa(dx, dy, dz), _kappa(dy, dz, dx), _kappa(dz, dx, dy)

    def ifac(a2, b2, ka, kb):
        return (a2 - b2) ** 2 * abs(kb - ka) / max(_EPS, abs(2 * (a2 - b2) + (a2 + b2) *
                                                          (ka - kb)))
    dx2, dy2, dz2 = dx * dx, dy * dy, dz * dz
    vmass = [vol * k / max(_EPS, 2 - k) for k in (kx, ky, kz)]
    vinert = [vol * ifac(dy2, dz2, ky, kz) / 5, vol * ifac(dz2, dx2, kz, kx) / 5,
              vol * ifac(dx2, dy2, kx, ky) / 5]
    return np.concatenate([[1.0], np.asarray(coef, dtype=np.float64)[:5], vmass, vinert])
