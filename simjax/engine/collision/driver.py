"""Collision detection driver (MuJoCo's mj_collision, engine_collision_driver.c).

Three steps:

1. **Candidate pairs, at trace time** (numpy, cached per model structure): every geom
   pair MuJoCo could ever test, with mj_collision's filters applied statically: body
   pairs welded together, both dof-less, or parent/child (unless
   ``DisableBit.FILTERPARENT``), contype/conaffinity at body and geom level,
   ``<exclude>`` signatures; explicit ``<pair>`` entries always, replacing the
   automatic pair of the same geoms; type pairs without a collider are dropped. Geom
   order is MuJoCo's (``geom_type[g1] <= geom_type[g2]``). Candidates are grouped by
   collider (height-field pairs by their per-pair collider from
   ``hfield.collider_for``: grid data and sub-grid window are static).
2. **Broadphase, at run time**: per candidate pair the bounding-sphere / plane test of
   mj_filterSphere with margin + gap, and for two convex geoms also a separating-axis
   test of their bounding boxes (the 6 face axes; conservative: a pair it rejects has
   no contact within the margin, so the narrow phase would give none either).
3. **Narrow phase**: each group's collider is vmapped over its pairs; a group none of
   whose pairs passes the broadphase is skipped by a ``lax.cond`` (under ``vmap``: none
   in any world of the batch, :func:`batch_max`), except cheap colliders (their
   broadphase-passing pairs compacted to a pair capacity first when a group has more
   candidates, ``PAIRS_PER_SLOT``; pairs beyond it are dropped, WARN_CONTACTFULL; a
   group run in chunks keeps as many passing pairs). Valid contacts get their
   parameters (mj_contactParam / pair parameters, ``EnableBit.OVERRIDE``, mj_setContact)
   and are compacted into ``Data.contact``: slots grouped by static contact dimension,
   valid slots first in each group, in MuJoCo's contact order (mj_collision's order of
   pairs, :func:`mujoco_rank`; :func:`contact_order` merges the dims), ``Data.ncon``
   valid in all. When a world's valid contacts of a dim exceed
   its slots, the deepest ones (smallest dist, as MJX keeps them) fill the slots, still
   in MuJoCo's order, and ``Data.warning[WARN_CONTACTFULL]`` is raised.

Capacity: ``contact_capacity(model)`` gives the default (sized for moving geoms resting
on partners, far below the sum of per-pair maxima, and at most the model's custom
numeric ``max_contact_points`` per contact dim when it declares one, as MJX reads it);
``make_data(model, ncon_max=...)`` overrides it.
"""
from __future__ import annotations

import dataclasses
import hashlib
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from simjax.engine.collision import convex, hfield, primitive
from simjax.engine.collision.broadphase import (  # noqa: F401 (also driver.<name>)
    _BOXED, _box_filter, _broadphase, _geom_cols, _geom_rows, _geom_table, _pair_cols,
    _pair_rows, _pair_table)
from simjax.engine.collision.chunked import (
    CHUNK, _chunked, _chunks, _pack, _run_or_skip, _zeros, batch_max, first_k)
from simjax.engine.collision.common import make_frame, once
from simjax.engine.collision.primitive import Geom
from simjax.engine.data import WARN_CONTACTFULL, make_contact
from simjax.engine.math import reduce_fused, where
from simjax.errors import UnsupportedFeatureError
from simjax.types import DisableBit, EnableBit, GeomType as GT

#: mjMINMU: lower bound of contact friction coefficients
MINMU = 1e-5
#: smallest default contact capacity of a contact dim (when its pairs allow as many)
MIN_CAPACITY = 8

P = primitive
#: collider per (type1, type2), type1 <= type2 (mjCOLLISIONFUNC); absent: no collision
COLLIDERS = {
    (GT.PLANE, GT.SPHERE): P.plane_sphere,
    (GT.PLANE, GT.CAPSULE): P.plane_capsule,
    (GT.PLANE, GT.ELLIPSOID): convex.PLANE[GT.ELLIPSOID],
    (GT.PLANE, GT.CYLINDER): P.plane_cylinder,
    (GT.PLANE, GT.BOX): P.plane_box,
    (GT.PLANE, GT.MESH): convex.PLANE[GT.MESH],
    (GT.SPHERE, GT.SPHERE): P.sphere_sphere,
    (GT.SPHERE, GT.CAPSULE): P.sphere_capsule,
    (GT.SPHERE, GT.CYLINDER): P.sphere_cylinder,
    (GT.SPHERE, GT.BOX): P.sphere_box,
    (GT.CAPSULE, GT.CAPSULE): P.capsule_capsule,
    (GT.BOX, GT.BOX): P.box_box,
}
for _t in (GT.SPHERE, GT.CAPSULE, GT.ELLIPSOID, GT.CYLINDER, GT.BOX, GT.MESH):
    COLLIDERS[(GT.HFIELD, _t)] = hfield.hfield_convex
_CONVEX = (GT.SPHERE, GT.CAPSULE, GT.ELLIPSOID, GT.CYLINDER, GT.BOX, GT.MESH)
for _a in _CONVEX:
    for _b in _CONVEX:
        if _a <= _b and (_a, _b) not in COLLIDERS:
            COLLIDERS[(_a, _b)] = convex.CONVEX[(_a, _b)]
if hasattr(P, "capsule_box"):
    COLLIDERS[(GT.CAPSULE, GT.BOX)] = P.capsule_box
#: type pairs MuJoCo collides that need an extension (SDF plugins) not available here
_NEEDS_PLUGIN = {GT.SDF}


def sdf_pair(*args):
    """Marker collider for pairs with an SDF geom: the driver recognises it and calls
    :func:`simjax.engine.collision.sdf.collide` per pair instead (mjc_SDF;
    sdf.slots per pair), so it is never called itself."""
    raise RuntimeError("sdf_pair is a dispatch marker; the collision driver calls "
                       "simjax.engine.collision.sdf.collide for SDF pairs")


for _t in (GT.SPHERE, GT.CAPSULE, GT.ELLIPSOID, GT.CYLINDER, GT.BOX, GT.MESH, GT.SDF):
    COLLIDERS[(_t, GT.SDF)] = sdf_pair
COLLIDERS[(GT.PLANE, GT.SDF)] = convex.PLANE_SDF     # plane vs the SDF geom's mesh


#: maximum valid contacts of colliders installed with register_collider
MAXCON_EXTRA: dict = {}


def register_collider(type1, type2, fn, maxcon):
    """Install ``fn(g1, g2, margin) -> Pre`` for geom types (type1 <= type2), e.g. an
    SDF plugin's collider (the GeomType.SDF slots are empty until one is registered;
    the plan cache is keyed by model structure, so register before tracing).
    ``maxcon``: maximum number of valid contacts it returns (capacity)."""
    COLLIDERS[(min(type1, type2), max(type1, type2))] = fn
    MAXCON_EXTRA[fn] = int(maxcon)
    _CACHE.clear()


def _maxcon(fn):
    if hasattr(fn, "maxcon"):
        return fn.maxcon
    for table in (primitive.MAXCON, convex.MAXCON, hfield.MAXCON, MAXCON_EXTRA):
        if fn in table:
            return table[fn]
    raise KeyError(fn)


# --------------------------------------------------------------------------- static plan
@dataclasses.dataclass(frozen=True, eq=False)
class Group:
    fn: object              # collider
    cand: np.ndarray        # (n,) candidate indices
    maxcon: int             # max valid contacts per pair


@dataclasses.dataclass(frozen=True, eq=False)
class Plan:
    g1: np.ndarray          # (ncand,) geom ids (MuJoCo order)
    g2: np.ndarray
    ipair: np.ndarray       # (ncand,) explicit pair id or -1
    dim: np.ndarray         # (ncand,) contact dimension (static)
    rank: np.ndarray        # (ncand,) position in mj_collision's pair order
    groups: tuple           # Group per collider
    dims: tuple             # contact dims present, ascending
    full: dict              # dim -> sum of per-pair maxima


_CACHE: dict = {}


def _key(m):
    h = hashlib.sha1()
    for name in ("body_parentid", "body_weldid", "body_dofnum", "body_geomadr",
                 "body_geomnum", "geom_type", "geom_contype", "geom_conaffinity",
                 "geom_bodyid", "geom_condim", "geom_priority", "geom_dataid",
                 "exclude_signature", "pair_geom1", "pair_geom2", "pair_dim",
                 "geom_rbound", "hfield_size", "hfield_nrow", "hfield_ncol", "hfield_adr",
                 "hfield_data", "mesh_facenum"):
        a = getattr(m, name, None)
        a = np.zeros(0) if a is None else np.asarray(a)
        h.update(name.encode())
        h.update(a.tobytes())
    h.update(str((m.nbody, m.ngeom, int(m.opt.disableflags), int(m.opt.enableflags),
                  int(m.opt.sdf_initpoints))).encode())
    if m.nhfield:                  # height-field windows depend on concrete margins
        h.update(hfield.margin_key(m))
    return h.hexdigest()


def _mixed_condim(m, g1, g2):
    pr = np.asarray(m.geom_priority)
    cd = np.asarray(m.geom_condim)
    return np.where(pr[g1] > pr[g2], cd[g1], np.where(pr[g1] < pr[g2], cd[g2],
                                                       np.maximum(cd[g1], cd[g2])))


def candidate_pairs(m):
    """(g1, g2, ipair) numpy arrays of every geom pair mj_collision may test."""
    nbody, ngeom = m.nbody, m.ngeom
    off = DisableBit.CONSTRAINT | DisableBit.CONTACT
    if ngeom < 2 or nbody < 2 or (m.opt.disableflags & off):
        z = np.zeros(0, np.int64)
        return z, z, z
    gtype = np.asarray(m.geom_type)
    gbody = np.asarray(m.geom_bodyid)
    ct, ca = np.asarray(m.geom_contype), np.asarray(m.geom_conaffinity)
    weld = np.asarray(m.body_weldid)
    parent = np.asarray(m.body_parentid)
    dofnum = np.asarray(m.body_dofnum)
    bct = np.zeros(nbody, np.int64)
    bca = np.zeros(nbody, np.int64)
    np.bitwise_or.at(bct, gbody, ct)
    np.bitwise_or.at(bca, gbody, ca)
    excl = set(int(s) for s in np.asarray(m.exclude_signature).ravel()) if m.nexclude else set()
    filterparent = not (m.opt.disableflags & DisableBit.FILTERPARENT)

    pairs = {}
    if m.npair:
        for k, (a, b) in enumerate(zip(np.asarray(m.pair_geom1), np.asarray(m.pair_geom2))):
            a, b = int(a), int(b)
            pairs[(min(a, b), max(a, b))] = (a, b, k)
    out = []
    # automatic pairs, by body pair (b1 < b2) then geoms in order
    gi, gj = np.triu_indices(ngeom, 1)
    b1, b2 = gbody[gi], gbody[gj]
    keep = b1 != b2
    gi, gj, b1, b2 = gi[keep], gj[keep], b1[keep], b2[keep]
    swap = b1 > b2
    gi, gj = np.where(swap, gj, gi), np.where(swap, gi, gj)
    b1, b2 = np.minimum(b1, b2), np.maximum(b1, b2)
    w1, w2 = weld[b1], weld[b2]
    pw1, pw2 = weld[parent[w1]], weld[parent[w2]]
    ok = w1 != w2
    ok &= ~((dofnum[w1] == 0) & (dofnum[w2] == 0))
    if filterparent:
        ok &= ~((w1 != 0) & (w2 != 0) & ((w1 == pw2) | (w2 == pw1)))
    ok &= ((bct[b1] & bca[b2]) != 0) | ((bct[b2] & bca[b1]) != 0)
    ok &= ((ct[gi] & ca[gj]) != 0) | ((ct[gj] & ca[gi]) != 0)
    if excl:
        sig = (b1 << 16) + b2
        ok &= ~np.isin(sig, np.asarray(sorted(excl)))
    order = np.lexsort((gj, gi, b2, b1))
    for k in order:
        if not ok[k]:
            continue
        a, b = int(gi[k]), int(gj[k])
        if (min(a, b), max(a, b)) in pairs:
            continue
        out.append((a, b, -1))
    out += list(pairs.values())
    res = []
    for a, b, k in out:
        if gtype[a] > gtype[b]:
            a, b = b, a
        key = (int(gtype[a]), int(gtype[b]))
        if key == (GT.HFIELD, GT.SDF):
            # MuJoCo 4.0 has no height-field vs SDF collider either: it warns and
            # returns no contacts (mjc_HFieldSDF); so does simjax
            warnings.warn(f"height-field vs SDF collision (geoms {a}, {b}) is not "
                          "supported (as in MuJoCo 4.0): no contacts")
            continue
        if key[0] in _NEEDS_PLUGIN or key[1] in _NEEDS_PLUGIN:
            if key not in COLLIDERS:
                raise UnsupportedFeatureError(
                    f"collision with SDF geoms (geom {a} type {key[0]}, geom {b} type "
                    f"{key[1]}) needs an SDF plugin collider")
        if key in ((GT.PLANE, GT.PLANE), (GT.PLANE, GT.HFIELD), (GT.HFIELD, GT.HFIELD)):
            continue                     # MuJoCo has no collider for these either
        if key not in COLLIDERS:
            raise UnsupportedFeatureError(f"collision between geom types {key}")
        res.append((a, b, k))
    arr = np.asarray(res, np.int64).reshape(-1, 3)
    return arr[:, 0], arr[:, 1], arr[:, 2]


def mujoco_rank(m, g1, g2, ipair):
    """Position of every candidate pair in mj_collision's order of narrow-phase calls,
    which is the order of its contacts in ``d.contact``: body pairs by signature
    ``(b1 << 16) + b2`` (b1 < b2), explicit ``<pair>``s of a signature (in pair order)
    before the automatic pairs of that body pair; automatic pairs of two single-geom
    bodies, or with ``DisableBit.MIDPHASE``, in the geom loop order (geoms of b1, then
    of b2); otherwise the midphase sorts them by (geom1, geom2) as stored in the
    contact (lower geom type first)."""
    n = len(g1)
    if not n:
        return np.zeros(0, np.int64)
    gbody = np.asarray(m.geom_bodyid)
    b1, b2 = gbody[g1], gbody[g2]
    lo, hi = np.minimum(b1, b2), np.maximum(b1, b2)
    sig = (lo << 16) + hi
    auto = ipair < 0
    nb = np.asarray(m.body_geomnum)
    loop = bool(m.opt.disableflags & DisableBit.MIDPHASE) | ((nb[lo] == 1) & (nb[hi] == 1))
    loop = np.broadcast_to(loop, (n,))
    # geom loop order: the geom of the lower body first
    la = np.where(b1 <= b2, g1, g2)
    lb = np.where(b1 <= b2, g2, g1)
    k1 = np.where(auto, np.where(loop, la, g1), ipair)
    k2 = np.where(auto, np.where(loop, lb, g2), 0)
    order = np.lexsort((k2, k1, auto, sig))
    rank = np.empty(n, np.int64)
    rank[order] = np.arange(n)
    return rank


def plan(m) -> Plan:
    """Static collision plan of ``m`` (cached per model structure)."""
    key = _key(m)
    p = _CACHE.get(key)
    if p is not None:
        return p
    g1, g2, ipair = candidate_pairs(m)
    gtype = np.asarray(m.geom_type)
    dim = _mixed_condim(m, g1, g2) if len(g1) else np.zeros(0, np.int64)
    if m.npair and len(g1):
        pd = np.asarray(m.pair_dim)
        dim = np.where(ipair >= 0, pd[np.maximum(ipair, 0)], dim)
    rank = mujoco_rank(m, g1, g2, ipair)
    groups = {}
    for k in np.argsort(rank, kind="stable"):        # groups list pairs in MuJoCo order
        fn = COLLIDERS[(int(gtype[g1[k]]), int(gtype[g2[k]]))]
        if fn is hfield.hfield_convex:      # per pair: static grid data and window
            fn = hfield.collider_for(m, int(g1[k]), int(g2[k]), int(ipair[k]))
        groups.setdefault(fn, []).append(k)
    glist = tuple(Group(fn, np.asarray(ks, np.int64),
                        _sdf_slots(m, g1[ks], g2[ks]) if fn is sdf_pair else _maxcon(fn))
                  for fn, ks in groups.items())
    full = {}
    for grp in glist:
        for k in grp.cand:
            full[int(dim[k])] = full.get(int(dim[k]), 0) + grp.maxcon
    p = Plan(g1, g2, ipair, np.asarray(dim, np.int64), rank, glist, tuple(sorted(full)),
             full)
    _CACHE[key] = p
    return p


def _sdf_slots(m, g1, g2):
    from simjax.engine.collision import sdf
    return sdf.slots(m, g1, g2)


def contact_capacity(m) -> int:
    """Default contact capacity, per contact dim: every moving geom lying on the static
    geoms (floor, terrain) at its largest per-pair contact count there, plus half of
    the moving geoms resting on another moving geom (the sum over moving geoms of their
    largest per-pair count against moving partners, halved); at least ``MIN_CAPACITY``,
    at most the sum of per-pair maxima. A model that declares its contact budget, the
    custom numeric ``max_contact_points`` that MJX reads (contacts per contact dim; e.g.
    15 in MJX's shadow hand), gets at most that many slots per dim. SDF pairs always
    get their full ``sdf.slots`` each (``opt.sdf_initpoints``; a mesh against an SDF:
    min(50, nface * sdf_initpoints)) (a resting SDF contact patch fills many of them:
    MuJoCo reports ~200 for the torus scene). A world with more valid contacts of a
    dim than its slots keeps the deepest ones (smallest dist; MJX's rule), in MuJoCo's
    order, and raises ``Data.warning[WARN_CONTACTFULL]``; ``make_data(model,
    ncon_max=...)`` sets any capacity."""
    return int(sum(_default_split(m).values()))


def _default_split(m) -> dict:
    """Default slots per contact dim (see :func:`contact_capacity`)."""
    p = plan(m)
    moving = np.asarray(m.body_weldid)[np.asarray(m.geom_bodyid)] != 0
    budget = _numeric(m, "max_contact_points")
    out = {}
    for dim in p.dims:
        on_static = np.zeros(m.ngeom, np.int64)
        on_moving = np.zeros(m.ngeom, np.int64)
        sdf = 0
        for grp in p.groups:
            k = grp.cand[p.dim[grp.cand] == dim]
            if grp.fn is sdf_pair:
                sdf += grp.maxcon * len(k)
                continue
            a, b = p.g1[k], p.g2[k]
            both = moving[a] & moving[b]
            np.maximum.at(on_moving, a[both], grp.maxcon)
            np.maximum.at(on_moving, b[both], grp.maxcon)
            np.maximum.at(on_static, np.where(moving[a], a, b)[~both], grp.maxcon)
        need = int(np.sum(on_static)) + int(np.sum(on_moving)) // 2
        out[dim] = min(p.full[dim] - sdf, max(MIN_CAPACITY, need)) + sdf
        if budget >= 0:
            out[dim] = min(out[dim], budget)
    return out


def _numeric(m, name) -> int:
    """First value of the model's custom numeric ``name`` as an int, or -1 when absent
    (MJX's ``collision_driver._numeric``)."""
    if not getattr(m, "nnumeric", 0):
        return -1
    i = m.name2id("numeric", name)
    if i < 0:
        return -1
    return int(np.asarray(m.numeric_data)[int(np.asarray(m.numeric_adr)[i])])


def dim_split(m, ncon_max) -> dict:
    """Slots per contact dim for a capacity of ``ncon_max``: the default split
    (:func:`contact_capacity`) scaled down in proportion, or, for a larger capacity,
    the default split plus the rest water-filled (every dim gets min(its sum of per-pair
    maxima, an equal share of what is left))."""
    p = plan(m)
    need = _default_split(m)
    total, ncon_max = sum(need.values()), int(ncon_max)
    if ncon_max <= total:
        out = {dim: n * ncon_max // max(total, 1) for dim, n in need.items()}
        left = ncon_max - sum(out.values())
        for dim in sorted(need, key=lambda dim: -need[dim]):
            take = min(left, need[dim] - out[dim])
            out[dim] += take
            left -= take
    else:
        out, left = dict(need), ncon_max - total
        dims = sorted(p.dims, key=lambda dim: p.full[dim] - need[dim])
        for i, dim in enumerate(dims):
            take = min(p.full[dim] - need[dim], left // (len(dims) - i))
            out[dim] += take
            left -= take
    return {dim: n for dim, n in sorted(out.items()) if n > 0}


def make_contacts(m, ncon_max, ftype):
    """Empty contact buffer for ``m`` with ``ncon_max`` slots (default capacity if None)."""
    if ncon_max is None:
        ncon_max = contact_capacity(m)
    split = dim_split(m, int(ncon_max))
    dims = np.concatenate([np.full(n, d, np.int32) for d, n in sorted(split.items())] +
                          [np.zeros(0, np.int32)])
    return make_contact(len(dims), dims, ftype)


# --------------------------------------------------------------------------- parameters
def _override(m):
    return bool(m.opt.enableflags & EnableBit.OVERRIDE)


def pair_params(m, p: Plan, dtype):
    """Per candidate pair: margin, gap, friction (5), solref, solreffriction, solimp
    (mj_contactParam, explicit pair parameters, mj_assign* with override)."""
    g1, g2, ip = p.g1, p.g2, p.ipair
    f = lambda x: jnp.asarray(x, dtype)
    margin = f(m.geom_margin)[g1] + f(m.geom_margin)[g2]
    gap = f(m.geom_gap)[g1] + f(m.geom_gap)[g2]
    pr = np.asarray(m.geom_priority)
    hi1 = (pr[g1] > pr[g2])[:, None]
    hi2 = (pr[g1] < pr[g2])[:, None]
    sm = f(m.geom_solmix)
    s1, s2 = sm[g1], sm[g2]
    both = (s1 >= 1e-15) & (s2 >= 1e-15)
    mix = where(both, s1 / where(both, s1 + s2, 1.0),
                where((s1 < 1e-15) & (s2 < 1e-15), 0.5,
                      where(s1 < 1e-15, 0.0, 1.0)))[:, None]
    sr = f(m.geom_solref)
    r1, r2 = sr[g1], sr[g2]
    solref = where(((r1[:, :1] > 0) & (r2[:, :1] > 0)), mix * r1 + (1 - mix) * r2,
                   jnp.minimum(r1, r2))
    si = f(m.geom_solimp)
    i1, i2 = si[g1], si[g2]
    solimp = mix * i1 + (1 - mix) * i2
    fr = f(m.geom_friction)
    fr1, fr2 = fr[g1], fr[g2]
    fri = jnp.maximum(fr1, fr2)
    solref = where(hi1, r1, where(hi2, r2, solref))
    solimp = where(hi1, i1, where(hi2, i2, solimp))
    fri = where(hi1, fr1, where(hi2, fr2, fri))
    friction = fri[:, jnp.asarray([0, 0, 1, 2, 2])]
    solreffriction = jnp.zeros_like(solref)
    if m.npair and np.any(ip >= 0):
        isp = ip >= 0
        k = np.maximum(ip, 0)
        sel = lambda a, b: where(isp.reshape((-1,) + (1,) * (a.ndim - 1)), a, b)
        margin = sel(f(m.pair_margin)[k], margin)
        gap = sel(f(m.pair_gap)[k], gap)
        friction = sel(f(m.pair_friction)[k], friction)
        solref = sel(f(m.pair_solref)[k], solref)
        solimp = sel(f(m.pair_solimp)[k], solimp)
        srf = f(m.pair_solreffriction)[k]
        srf = where(jnp.any(srf != 0, axis=1, keepdims=True), srf, 0.0)
        solreffriction = sel(srf, solreffriction)
    n = len(g1)
    if _override(m):
        margin = jnp.broadcast_to(f(m.opt.o_margin), (n,))
        friction = jnp.broadcast_to(f(m.opt.o_friction), (n, 5))
        solref = jnp.broadcast_to(f(m.opt.o_solref), (n, 2))
        solreffriction = jnp.broadcast_to(f(m.opt.o_solref), (n, 2))
        solimp = jnp.broadcast_to(f(m.opt.o_solimp), (n, 5))
    friction = jnp.maximum(MINMU, friction)
    return dict(margin=margin, gap=gap, friction=friction, solref=solref,
                solreffriction=solreffriction, solimp=solimp)


def _check_adhesion(m):
    ad = getattr(m, "geom_adhesion", None)
    for arr in (ad, getattr(m, "pair_adhesion", None)):
        if arr is None:
            continue
        try:
            a = np.asarray(arr)
        except Exception:          # traced: cannot check, MuJoCo default is 0
            continue
        if a.size and np.any(a != 0):
            raise UnsupportedFeatureError("contact adhesion (geom/pair adhesion != 0)")


# --------------------------------------------------------------------------- run time
def _geoms(m, d, g, sel, ftype):
    """Geom tuples of the geoms ``g[sel]``."""
    gg = jnp.asarray(g)[sel]
    size = jnp.asarray(m.geom_size, ftype)[gg]
    return gg, Geom(d.geom_xpos[gg], d.geom_xmat[gg], size)


def _sdf_group(m, d, g1, g2):
    """SDF pairs: sdf.collide_pairs (one vmapped descent per kind of pair)."""
    from simjax.engine.collision import sdf
    from simjax.engine.collision.common import Pre
    dist, pos, frame, valid = sdf.collide_pairs(m, d, g1, g2)
    return Pre(dist, pos, frame[..., 0, :], frame[..., 1, :], valid)


#: colliders within a few times the bounding-box filter's cost (~50 ns per pair, batched
#: on CPU): they always run, without the filter (it would cost about what skipping saves)
#: cheap colliders' narrow-phase pairs per contact slot: when a cheap group has more
#: candidates than PAIRS_PER_SLOT * (slots of its contact dims) + 16, its
#: broadphase-passing pairs are compacted to that many first; pairs beyond are dropped
#: (WARN_CONTACTFULL)
PAIRS_PER_SLOT = 2
CHEAP = (P.plane_sphere, P.plane_capsule, P.sphere_sphere, P.sphere_capsule, P.sphere_box,
         P.capsule_capsule)


def _group_args(m, d, fn, g1, g2, dm, ftype):
    """The collider's arguments for every pair of a group (geoms with their mesh data)."""
    return _pose_args(m, fn, g1, g2, dm, (d.geom_xpos[g1], d.geom_xmat[g1]),
                      (d.geom_xpos[g2], d.geom_xmat[g2]), ftype)


def _pair_cap(m, p, grp, split):
    """Narrow-phase pairs of a cheap collider group: PAIRS_PER_SLOT per contact slot of
    the group's contact dims (plus 16)."""
    nslot = sum(split.get(int(dim), 0) for dim in np.unique(p.dim[grp.cand]))
    return PAIRS_PER_SLOT * nslot + 16


def _pose_args(m, fn, g1, g2, dm, pose1, pose2, ftype, sizes=None):
    """The collider's arguments from the pairs' gathered poses and sizes (``sizes``:
    (size1, size2) when already gathered)."""
    if sizes is None:
        size = jnp.asarray(m.geom_size, ftype)
        sizes = size[g1], size[g2]
    geo1, geo2 = Geom(*pose1, sizes[0]), Geom(*pose2, sizes[1])
    geo1, geo2 = convex.attach_meshes(m, fn, geo1, geo2, jnp.asarray(g1), jnp.asarray(g2),
                                      ftype, geoms=(g1, g2))
    return geo1, geo2, dm


def narrow_group(m, d, p, grp, det_margin, split):
    """Broadphase and narrow phase of one collider group.

    The collider runs on every candidate pair of the group (vmapped), unless no pair
    passes the broadphase: then a ``lax.cond`` skips it (under ``vmap``: no pair in
    any world, :func:`batch_max`). Cheap colliders (``CHEAP``) and SDF pairs always run;
    a cheap group of more candidates than its pair capacity (:func:`_pair_cap`) runs on
    its broadphase-passing pairs compacted to that capacity (pairs beyond are dropped);
    a chunked group keeps as many (``_CHUNK_CAP``).
    Returns (pre, ok, count, overflow, sel): collider output with a leading pair axis,
    which of its rows are broadphase-passing pairs (rows of the others are not
    contacts, whatever their ``valid``), how many pass, whether passing pairs were
    dropped, and the group-local pair of each row when compacted (traced; else None:
    one row per candidate in ``grp.cand`` order). The group gathers its own geom
    poses: gathered once for all groups and sliced, they cost run time (humanoid
    collision ~2x). A pair table (:func:`_pair_table`) is written for a collider that
    runs on every pair; for a group of geoms with box bounds whose collider runs on few
    pairs (compacted, chunked or skipped) the broadphase gathers from the per-geom
    poses (fused into its arithmetic) and the collider takes the rows of the pairs it
    runs on from the per-geom table (:func:`_geom_table`; shadow_hand's step ~0.9x:
    its 120-pair capsule-box table was written every step)."""
    ftype = d.geom_xpos.dtype
    g1, g2 = p.g1[grp.cand], p.g2[grp.cand]
    dm = det_margin[grp.cand]
    n = len(grp.cand)
    cap = _pair_cap(m, p, grp, split) if grp.fn in CHEAP else None
    every = grp.fn is sdf_pair or (cap is not None and cap >= n)
    gtype = np.asarray(m.geom_type)
    boxed = bool(np.all(np.isin(gtype[g1], _BOXED) & np.isin(gtype[g2], _BOXED)))
    if every or not boxed or not _GEOM_ROWS:
        # the collider runs on every pair: the pair table feeds it and the broadphase.
        # So do groups with a plane or height field: plane-box through the per-geom
        # table gave wrong reverse-mode contact derivatives when compiled with
        # --xla_backend_optimization_level=0 (right at the default level; the cause
        # was not found), test_collision.test_grad_vs_finite_differences
        table = _pair_table(m, d, g1, g2, ftype)
        cols = _pair_cols(table)
        rows = lambda sel=None: _pair_rows(table, sel)
    else:
        # it runs on few pairs (compacted, or skipped when none passes): the broadphase
        # gathers its operands itself (fused, no pair table) and the collider its pairs'
        # rows from the per-geom table (passed whole into branches and loops)
        gtable = _geom_table(m, d, ftype)
        cols = _geom_cols(m, d, g1, g2, ftype)
        rows = lambda sel=None: _geom_rows(gtable, g1, g2, sel)
    ok = _broadphase(m, d, g1, g2, dm, cols)

    def args():          # sliced where used (inside the branches below)
        r1, r2 = rows()
        return _pose_args(m, grp.fn, g1, g2, dm, r1[:2], r2[:2], ftype,
                          sizes=(r1[2], r2[2]))

    def take(idx):       # the arguments of pairs idx (a collider without mesh data)
        r1, r2 = rows(idx)
        return Geom(*r1[:3]), Geom(*r2[:3]), dm[idx]
    no = jnp.zeros((), bool)
    if grp.fn is sdf_pair:
        return _sdf_group(m, d, g1, g2), ok, reduce_fused(ok, 0), no, None
    group = getattr(grp.fn, "group", None)    # takes ``ok`` as it is when run is called
    run = lambda: group(*args(), ok) if group else jax.vmap(grp.fn)(*args())
    if grp.fn in CHEAP:
        count = reduce_fused(ok, 0)
        if cap >= n:
            return run(), ok, count, no, None
        ar = np.arange(n)
        sel = first_k(where(ok, ar, n + ar), cap)    # passing pairs, in order
        r1, r2 = rows(sel)
        pre = jax.vmap(grp.fn)(Geom(*r1[:3]), Geom(*r2[:3]), dm[sel])
        return pre, jnp.arange(cap) < count, count, count > cap, sel
    chunks = _chunks(grp.fn, len(grp.cand))
    if boxed:
        ok = ok & _box_filter(m, d, g1, g2, dm, cols)
        if _ONCE_OK and not chunks and not group and not getattr(grp.fn, "hfield", False):
            # the passing pairs stored once: the pair count and the contacts' validity
            # (two consumers) each evaluated the broadphase and the bounding-box
            # filter again, the per-component gathers of the geom poses (shadow hand's
            # box-box group) as 24 kernels of their own
            ok = once(ok)
    count = reduce_fused(ok, 0)
    if chunks:
        # the chunk scan skipped whole when no world has a passing pair (its rows
        # are then zeros, and those of the pairs past the passing ones the last pair)
        nrow = -(-min(n, _pair_cap(m, p, grp, split) if _CHUNK_CAP else n) // CHUNK) * CHUNK
        idx = np.minimum(np.arange(nrow), len(grp.cand) - 1)

        found = {}

        def skip(types):
            return (jnp.zeros(types[0].shape, types[0].dtype), jnp.zeros(nrow, bool),
                    jnp.asarray(idx, jnp.int32))
        out, rows, sel = _run_or_skip(batch_max(count) > 0,
                                      lambda: _chunked(grp.fn, take, ok, count, found,
                                                       ftype, nrow),
                                      skip)
        return found["unpack"](out), rows, count, count > nrow if nrow < n else no, sel
    if getattr(grp.fn, "hfield", False) and not _PACK_HFIELD:
        # height-field colliders return their leaves as they are (a zero fill each when
        # skipped): packed, the concatenation of the leaves was one kernel that cost
        # barkour's collision about a third of its time
        return _run_or_skip(batch_max(count) > 0, run, _zeros), ok, count, no, None
    # the branches return the collider output packed in one array: the skip branch is
    # one zero fill, not one per output leaf
    found = {}

    def packed():
        out, found["unpack"] = _pack(run())
        return out
    out = _run_or_skip(batch_max(count) > 0, packed, _zeros)
    return found["unpack"](out), ok, count, no, None


#: boxed groups whose collider runs on few pairs gather from the per-geom table, not a
#: pair table (off: the pair table for every group; for paired measurements)
_GEOM_ROWS = True

#: a chunked group keeps at most its pair capacity (:func:`_pair_cap`) of passing pairs,
#: as a compacted cheap group does (pairs beyond it dropped, WARN_CONTACTFULL): its
#: output rows are that many, not one per candidate (the shadow hand's capsule-box
#: group: 48 rows, not 120, of which the bench states pass at most one; its step:
#: without / with 1.043 [0.969, 1.083] and 1.068 [0.992, 1.123], with / without 0.972
#: [0.821, 1.009], 8-12 pairs in one process; compile 1.015 [0.964, 1.051] without /
#: with). Off: a row per candidate, every passing pair runs
_CHUNK_CAP = True

#: a boxed group run whole in a branch gets its passing pairs stored once (off: the
#: former way; for paired measurements)
_ONCE_OK = True

#: pack height-field colliders' outputs too (the former way; for paired measurements)
_PACK_HFIELD = False


#: use the collider's proven bound on valid contacts (``fn.bound``) to take the
#: selection without overflow when a dim's valid entries can never exceed its slots
_PROVEN = True


def _select(pos, mine, dist, over, k, fits=False):
    """Indices of the ``k`` entries of a contact dim that fill its slots, in MuJoCo's
    order: ``pos`` (E,) the entries' table positions (distinct ints below 2**24, the
    dim's valid entries ``mine`` first), ``dist`` (E,) their depths, ``over`` whether the
    dim's valid entries exceed its ``k`` slots. Without overflow: the ``k`` smallest
    positions (:func:`first_k`). With overflow (MJX's rule): the ``k`` deepest valid
    entries (smallest dist; a tie by entry order, which is MuJoCo's order within a
    collider group), then sorted by position. One ``top_k`` over the entries either way
    (its key picked per world) and one over the ``k`` picks; without overflow the picks
    already are in position order, so the output is the :func:`first_k` one. Invalid
    entries get key -inf and are never picked with overflow (more than ``k`` valid);
    a NaN depth of a valid entry counts as the largest depth. ``fits`` (static): the
    dim's valid entries can never exceed ``k`` (a bound from the colliders, e.g. the
    height-field disc cover), so the selection without overflow is taken."""
    if k >= pos.shape[-1] or (fits and _PROVEN):          # no overflow possible
        return first_k(pos, k)
    kt = dist.dtype if dist.dtype == jnp.float64 else jnp.float32
    big = jnp.finfo(kt).max
    depth = jax.lax.stop_gradient(dist).astype(kt)
    depth = where(jnp.isnan(depth), big, jnp.clip(depth, -big, big))
    kf = where(over, -where(mine, depth, jnp.inf), -pos.astype(kt))
    idx = jax.lax.top_k(kf, k)[1]
    return idx[first_k(pos[idx], k)]


def _table_start(p, parts):
    """Start of every candidate pair's run of entries in a table laid out in MuJoCo's
    pair order (:func:`mujoco_rank`; run length: its collider's slot count), and the
    table's length. One order over all contact dims: entries are only compared within
    a dim, where it is mj_collision's order."""
    width = np.zeros(len(p.g1), np.int64)
    for pre, vd, cand, members in parts:
        width[members] = vd.shape[1]
    order = np.argsort(p.rank, kind="stable")
    start = np.zeros(len(p.g1), np.int64)
    start[order] = np.concatenate([[0], np.cumsum(width[order])[:-1]])
    return start, int(np.sum(width))


def _entries(p, parts):
    """Concatenated candidate contacts of all groups (entry ``e``): (fields (E, 10):
    dist, pos, normal, tangent; dist (E,) again, its own concatenation (a second
    consumer of ``fields`` would materialise all E rows where the slots' gather reads
    only theirs); valid (E,); table position (E,); contact dim (E,) (None with one dim);
    candidate pair (E,)), numpy where static."""
    start, total = _table_start(p, parts)
    one_dim = len(np.unique(p.dim)) == 1
    fields, depths, valids, keys, dims, cands = [], [], [], [], [], []
    for pre, vd, cand, members in parts:
        n, k = vd.shape
        fields.append(jnp.concatenate([pre.dist.reshape(n * k, 1), pre.pos.reshape(-1, 3),
                                       pre.normal.reshape(-1, 3),
                                       pre.tangent.reshape(-1, 3)], axis=1))
        depths.append(pre.dist.reshape(n * k))
        valids.append(vd.reshape(-1))
        lib = np if isinstance(cand, np.ndarray) else jnp
        keys.append((lib.asarray(start)[cand][:, None] + np.arange(k)).reshape(-1))
        gd = p.dim[members]
        if one_dim or np.all(gd == gd[0]):     # static: the group has one dim
            dims.append(np.full(n * k, gd[0]))
        else:
            dims.append(lib.broadcast_to(lib.asarray(p.dim)[cand][:, None],
                                         (n, k)).reshape(-1))
        cands.append(lib.broadcast_to(cand[:, None], (n, k)).reshape(-1))
    return (jnp.concatenate(fields), jnp.concatenate(depths), jnp.concatenate(valids),
            _cat(keys), None if one_dim else _cat(dims), _cat(cands), total)


def _cat(xs):
    """Concatenation of 1-d int arrays, numpy (static) or traced: the static parts as
    one constant and each traced part padded into place and added (under vmap a
    concatenation broadcasts every static part to the batch, a kernel each)."""
    if all(isinstance(x, np.ndarray) for x in xs):
        return np.concatenate(xs)
    static = np.concatenate([x if isinstance(x, np.ndarray) else np.zeros(x.shape, x.dtype)
                             for x in xs])
    out, off = jnp.asarray(static), 0
    for x in xs:
        if not isinstance(x, np.ndarray):
            out = out + jnp.pad(x.astype(out.dtype), (off, len(static) - off - len(x)))
        off += len(x)
    return out


def _contact_params(m, p, prm, ftype):
    """Per candidate pair, one row: includemargin, friction (5), solref (2),
    solreffriction (2), solimp (5), geom1, geom2 (as floats: exact below 2**24), so
    that the contacts' parameters are one gather."""
    n = len(p.g1)
    return jnp.concatenate([prm["margin"].reshape(n, 1), prm["friction"], prm["solref"],
                            prm["solreffriction"], prm["solimp"],
                            jnp.asarray(np.stack([p.g1, p.g2], 1), ftype)], axis=1)


def collision(m, d):
    """Collision detection (mj_collision): fills ``d.contact`` and ``d.ncon``.

    Shapes: ``d.contact`` keeps its capacity (``ncon_max`` slots, grouped by contact
    dim as made by ``make_data``). Frames: contact pos and frame are global; the frame's
    first row is the normal from geom[0] to geom[1]. Raises UnsupportedFeatureError at
    trace time for geom pairs without a collider here (e.g. SDF without its plugin) or
    contact adhesion.

    Every group's candidate contacts go into one entry table; per contact dim, the
    valid entries of the dim fill the dim's slots ordered by table position (MuJoCo's
    pair order, slot order within a pair); in a world with more of them than slots,
    the deepest ones (:func:`_select`). Then one gather takes their fields and one
    their pair parameters.
    """
    ftype = d.geom_xpos.dtype
    cap = d.contact.dist.shape[0]
    p = plan(m)
    if not len(p.g1) or cap == 0:
        return d.replace(ncon=jnp.zeros((), jnp.int32))
    _check_adhesion(m)
    split = dim_split(m, cap)
    prm = pair_params(m, p, ftype)
    det_margin = prm["margin"] + prm["gap"]
    overflow = jnp.zeros((), bool)
    parts = []
    most = {}               # contact dim -> most valid entries (static)
    for grp in p.groups:
        pre, ok, _, over, sel = narrow_group(m, d, p, grp, det_margin, split)
        overflow = overflow | over
        cand = grp.cand if sel is None else jnp.asarray(grp.cand)[sel]
        mine = np.isin(p.dim[grp.cand], list(split))
        if not np.any(mine):
            continue
        vd = pre.valid & ok[:, None]
        if not np.all(mine):          # dims without slots (capacity split to zero)
            m_ = mine[:, None] if sel is None else jnp.asarray(mine)[sel][:, None]
            vd = vd & m_
        parts.append((pre, vd, cand, grp.cand[mine]))
        per = min(vd.shape[1], getattr(grp.fn, "bound", vd.shape[1]))
        for dm, nd in zip(*np.unique(p.dim[grp.cand[mine]], return_counts=True)):
            most[int(dm)] = most.get(int(dm), 0) + per * min(int(nd), vd.shape[0])
    fields, depth, valid, key, dim, cand, total = _entries(p, parts)
    nent = valid.shape[0]
    ar = np.arange(nent)
    idx, vtake = [], []
    for dm in sorted(split):
        nslot = split[dm]
        mine = valid if dim is None else valid & (dim == dm)
        count = reduce_fused(mine, 0)
        overflow = overflow | (count > nslot)
        idx.append(_select(where(mine, key, total + ar), mine, depth,
                           count > nslot, nslot, most.get(dm, 0) <= nslot))
        vtake.append(jnp.arange(nslot) < count)
    idx = jnp.minimum(jnp.concatenate(idx), nent - 1)
    valid = jnp.concatenate(vtake)
    row = fields[idx]
    cand = jnp.asarray(cand)[idx]
    par = _contact_params(m, p, prm, ftype)[cand]
    dist, includemargin = row[:, 0], par[:, 0]
    zero = lambda x: where(valid.reshape((-1,) + (1,) * (x.ndim - 1)), x, 0)
    con = d.contact.replace(
        dist=zero(dist), pos=zero(row[:, 1:4]), frame=zero(make_frame(row[:, 4:7],
                                                                      row[:, 7:10])),
        includemargin=zero(includemargin), friction=zero(par[:, 1:6]),
        solref=zero(par[:, 6:8]), solreffriction=zero(par[:, 8:10]),
        solimp=zero(par[:, 10:15]),
        geom=where(valid[:, None], par[:, 15:17].astype(jnp.int32), -1),
        exclude=(valid & (dist >= includemargin)).astype(jnp.int32),
        efc_address=jnp.full(valid.shape, -1, jnp.int32),
        valid=valid)
    warning = d.warning.at[WARN_CONTACTFULL].add(overflow.astype(jnp.int32))
    return d.replace(contact=con, ncon=reduce_fused(valid, 0).astype(jnp.int32), warning=warning)


def contact_order(m, d):
    """(ncon_max,) int32 slot indices of ``d.contact`` in MuJoCo's contact order: slot
    ``contact_order(m, d)[i]`` holds MuJoCo's ``d.contact[i]`` for i < ``d.ncon``, the
    empty slots follow. Within a contact dim the slots already are in this order; with
    several dims (slots grouped by dim) the groups interleave by geom pair
    (:func:`mujoco_rank` of the contact's geom pair)."""
    n = d.contact.dist.shape[0]
    slots = jnp.arange(n, dtype=jnp.int32)
    p = plan(m)
    if len(set(d.contact.slot_dim)) <= 1:
        return slots
    table = np.full((m.ngeom, m.ngeom), len(p.g1), np.int32)
    table[p.g1, p.g2] = p.rank
    valid = d.contact.valid
    g = where(valid[:, None], d.contact.geom, 0)
    rank = where(valid, jnp.asarray(table)[g[:, 0], g[:, 1]], len(p.g1))
    return jnp.lexsort((slots, rank)).astype(jnp.int32)
