"""The static collision plan (MuJoCo's mj_collision, engine_collision_driver.c, at trace
time; numpy, cached per model structure): the collider of every pair of geom types
(mjCOLLISIONFUNC, extended by :func:`register_collider`), the candidate geom pairs with
mj_collision's static filters (:func:`candidate_pairs`), their position in its order of
narrow-phase calls (:func:`mujoco_rank`), the pairs grouped by collider (:class:`Plan`,
:func:`plan`), and the contact capacity per contact dim (:func:`contact_capacity`,
:func:`dim_split`, :func:`make_contacts`; MJX's ``max_contact_points`` budget). See
:mod:`simjax.engine.collision.driver` for the steps at run time."""
from __future__ import annotations

import dataclasses
import hashlib
import warnings

import numpy as np

from simjax.engine import tables
from simjax.engine.collision import convex, convex_hull, hfield, primitive
from simjax.engine.data import make_contact
from simjax.errors import UnsupportedFeatureError
from simjax.types import DisableBit, EnableBit, GeomType as GT


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
    size2: object = None    # (n, 3) static factors of geom 2's sizes, or None (all ones)
    pairmax: object = None  # (n,) max valid contacts of each pair, or None (maxcon)


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
                 "hfield_data", "mesh_facenum", "mesh_vertnum"):
        a = getattr(m, name, None)
        a = np.zeros(0) if a is None else np.asarray(a)
        h.update(name.encode())
        h.update(a.tobytes())
    h.update(str((m.nbody, m.ngeom, int(m.opt.disableflags), int(m.opt.enableflags),
                  int(m.opt.sdf_initpoints))).encode())
    if m.nhfield:                  # height-field windows depend on concrete margins
        h.update(hfield.margin_key(m))
    h.update(b"margins" if _margins(m) else b"")
    return h.hexdigest()


def _margins(m):
    """Whether a contact's detection margin may be non-zero (traced parameters may):
    the curved convex pairs then take GJK's direction apart (convex.APART)."""
    if m.opt.enableflags & EnableBit.OVERRIDE:
        return tables._nonzero(m.opt, ["o_margin"])
    return tables._nonzero(m, ["geom_margin", "geom_gap", "pair_margin", "pair_gap"])


def _mixed_condim(m, g1, g2):
    pr = np.asarray(m.geom_priority)
    cd = np.asarray(m.geom_condim)
    return np.where(pr[g1] > pr[g2], cd[g1], np.where(pr[g1] < pr[g2], cd[g2],
                                                      np.maximum(cd[g1], cd[g2])))


#: the disable bits that turn every contact off (no candidate pair)
CONTACTS_OFF = int(DisableBit.CONSTRAINT | DisableBit.CONTACT)


def candidate_pairs(m):
    """(g1, g2, ipair) numpy arrays of every geom pair mj_collision may test."""
    nbody, ngeom = m.nbody, m.ngeom
    if ngeom < 2 or nbody < 2 or (m.opt.disableflags & CONTACTS_OFF):
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
    # one contact for the convex pairs with several (MuJoCo's mj_maxContact)
    single = convex.SINGLE if m.opt.disableflags & DisableBit.MULTICCD else {}
    apart = convex.APART if _margins(m) else {}
    groups = {}
    for k in np.argsort(rank, kind="stable"):        # groups list pairs in MuJoCo order
        fn = COLLIDERS[(int(gtype[g1[k]]), int(gtype[g2[k]]))]
        fn = single.get(fn, fn)
        fn = apart.get(fn, fn)
        if fn is hfield.hfield_convex:      # per pair: static grid data and window
            fn = hfield.collider_for(m, int(g1[k]), int(g2[k]), int(ipair[k]))
        groups.setdefault(fn, []).append(k)
    groups = _mesh_buckets(m, g1, g2, groups)
    glist = tuple(Group(fn, np.asarray(ks, np.int64),
                        _sdf_slots(m, g1[ks], g2[ks]) if fn is sdf_pair else _maxcon(fn))
                  for (fn, ks) in groups)
    full = {}
    for grp in glist:
        for k in grp.cand:
            full[int(dim[k])] = full.get(int(dim[k]), 0) + grp.maxcon
    p = Plan(g1, g2, ipair, np.asarray(dim, np.int64), rank, glist, tuple(sorted(full)),
             full)
    _CACHE[key] = p
    return p


#: a mesh-mesh SAT group of at least MESH_BUCKET_MIN candidates splits by hull size:
#: the pairs whose larger hull has at most MESH_BUCKET_FRACTION of the vertices of the
#: largest hull among them form a group of their own, their tables padded to their own
#: meshes, and so again among those, up to MESH_BUCKETS groups (0 fraction: one group
#: per collider). The Trossen arm (33 candidates, hulls of 67-194 vertices): 23 pairs up
#: to 194 vertices, 9 up to 99 and the gripper fingers (67 each), the pair in contact,
#: alone. Float32, batch 64, settled states, alternating separate processes: one group
#: -> two (fraction 1/2, at most two groups) step 957 and 934 -> 487 and 465 us per
#: world-step, compile 11.4 and 10.7 -> 15.4 and 14.5 s wall; two -> three (three runs
#: each) collision 542, 405, 414 -> 354, 214, 229 us, step 681, 476, 589 -> 371, 478,
#: 430 us, compile 19.1, 17.2, 17.6 -> 24.1, 23.5, 23.6 s wall. Small groups are left
#: whole: mjx_convex's three mesh-mesh pairs split 1 + 2 compiled 9 s longer and ran no
#: faster (its pair in contact in the larger part)
MESH_BUCKET_FRACTION = 0.75
MESH_BUCKET_MIN = 16
MESH_BUCKETS = 3


def _mesh_buckets(m, g1, g2, groups):
    """The plan's groups as (collider, candidates) pairs, a mesh-mesh SAT group split
    by hull size (:data:`MESH_BUCKET_FRACTION`).

    Why: a group's hull tables are padded to its largest mesh, and the SAT search's
    cost grows with the padded sizes (face normals against vertices, edges against
    edges): the Trossen arm's gripper fingers (67-vertex hulls), the one pair in
    contact, paid for the shoulder's 194 vertices. The price is one more compile of
    the collider per group (several seconds), paid back where the pairs in contact are
    among the small hulls (a robot's fingers and pads, more often than its large link
    shells): so only large groups split, into three at most."""
    out = []
    for fn, ks in groups.items():
        types = getattr(fn, "types", None)
        if (MESH_BUCKET_FRACTION <= 0 or types != (GT.MESH, GT.MESH)
                or len(ks) < MESH_BUCKET_MIN):
            out.append((fn, ks))
            continue
        nv = convex_hull.hull_sizes(m)
        did = np.asarray(m.geom_dataid)
        ks = np.asarray(ks)
        size = np.maximum(nv[did[g1[ks]]], nv[did[g2[ks]]])
        rest = np.ones(len(ks), bool)
        for _ in range(MESH_BUCKETS - 1):
            small = rest & (size <= MESH_BUCKET_FRACTION * size[rest].max())
            if not small.any() or small.sum() == rest.sum():
                break
            out.append((fn, list(ks[rest & ~small])))       # the larger hulls
            rest = small
        out.append((fn, list(ks[rest])))
    return out


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


def _moving(m):
    """Per geom, whether its body moves (is not welded to the world), (ngeom,) bool."""
    return np.asarray(m.body_weldid)[np.asarray(m.geom_bodyid)] != 0


def _default_split(m) -> dict:
    """Default slots per contact dim (see :func:`contact_capacity`)."""
    p = plan(m)
    moving = _moving(m)
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


def resting_rows(m) -> int:
    """Scalar constraint rows (pyramidal or frictionless contacts) of rigid objects,
    trees of one moving body, resting on static geoms: per body, the largest contact
    count of one of its pairs against a static geom, times that pair's rows per
    contact (pyramidal 2 (dim - 1), frictionless 1; elliptic contacts none), summed."""
    p = plan(m)
    gb = np.asarray(m.geom_bodyid)
    root = np.asarray(m.body_rootid)
    moving = _moving(m)
    single = moving & (np.bincount(root, minlength=m.nbody)[root[gb]] == 1)
    elliptic = int(m.opt.cone) == 1
    per = {}
    for grp in p.groups:
        if grp.fn is sdf_pair:
            # an SDF pair's slots (opt.sdf_initpoints) are no count of resting contacts
            continue
        for k in grp.cand:
            a, b = int(p.g1[k]), int(p.g2[k])
            if moving[a] == moving[b]:
                continue
            g = a if moving[a] else b
            dim = int(p.dim[k])
            if not single[g] or (elliptic and dim > 1):
                continue
            rows = grp.maxcon * (1 if dim == 1 else 2 * (dim - 1))
            per[root[gb[g]]] = max(per.get(root[gb[g]], 0), rows)
    return int(sum(per.values()))


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
    """Empty contact buffer for ``m`` with ``ncon_max`` slots (default capacity if None).

    The slots are those of ``m`` with contacts on, whatever its ``DisableBit.CONTACT``
    and ``DisableBit.CONSTRAINT`` (MuJoCo's contact arena does not depend on them
    either): a Data made with contacts off keeps its slots, so that the model with them
    on gives it other constraint rows, which :func:`~simjax.engine.constraint_layout.
    data_layout` reports, rather than silently no contacts."""
    if m.opt.disableflags & CONTACTS_OFF:
        m = m.replace(opt=m.opt.replace(
            disableflags=int(m.opt.disableflags) & ~CONTACTS_OFF))
    if ncon_max is None:
        ncon_max = contact_capacity(m)
    split = dim_split(m, int(ncon_max))
    dims = np.concatenate([np.full(n, d, np.int32) for d, n in sorted(split.items())] +
                          [np.zeros(0, np.int32)])
    return make_contact(len(dims), dims, ftype)
