"""General convex colliders: plane-convex and convex-convex for ellipsoids, cylinders,
capsules, spheres, boxes and meshes (their convex hulls).

MuJoCo 4.0 uses its native GJK/EPA (engine_collision_gjk.c) with polygon-clipping
multi-contact for box/mesh pairs. simjax uses a different, fixed-shape formulation
that jit/vmap/grad handle well:

- The signed distance of two convex sets along a unit direction ``n`` (from geom1 to
  geom2) is ``sep(n) = -h2(-n) - h1(n)`` with ``h`` the support functions. Its maximum
  over unit directions is the distance when the sets are apart and minus the
  penetration depth when they overlap (minimum translation distance) - the quantity
  GJK and EPA compute. The maximiser is the contact normal.
- Polytopes (boxes, meshes): the maximum is attained at a face normal of either hull
  or at a cross product of hull edges (separating axis theorem), all of which are
  evaluated exactly. Curved shapes: the best of a set of candidate directions (geom
  axes, centre difference, face normals of a polytope partner, 26 fixed directions)
  is refined by projected gradient ascent with step adaptation (fixed iteration count).
- Contact position: midway between the two support points. Box/mesh pairs add the
  vertices of each support face that lie inside the other's support face (projected
  along the normal), reduced to at most 4 spread-out points, each with its own depth.

Differences from MuJoCo (documented, tested with tolerances): the witness point of
single contacts on flat features may sit elsewhere on the contact patch; multi-contact
point sets of box/mesh pairs are the face-overlap corners, not MuJoCo's clipped polygon
reduced by its quad heuristic; cylinders/capsules against meshes give one contact
(MuJoCo's MULTICCD perturbation search adds up to 4 more); separation inside a margin
between polytopes is measured along the best SAT axis. Plane-mesh contacts use hull
polygons from scipy's qhull (coplanar facets merged), so on exact ties (a face resting
flat) the anchor vertex, and with it the chosen quad, may differ from MuJoCo's.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from simjax.engine.collision.common import Pre, cross, dot, normalize, one
from simjax.types import GeomType as GT

#: refinement iterations for curved pairs
REFINE_ITERS = 40
#: maximum number of hull edge pairs evaluated as SAT axes
MAX_EDGE_PAIRS = 4096
#: support-face vertices kept per polytope for multi-contact
FACE_VERTS = 8

_FIXED_DIRS = np.array([(x, y, z) for x in (-1, 0, 1) for y in (-1, 0, 1) for z in (-1, 0, 1)
                        if (x, y, z) != (0, 0, 0)], np.float64)
_FIXED_DIRS /= np.linalg.norm(_FIXED_DIRS, axis=1, keepdims=True)


# --------------------------------------------------------------------------- mesh data
_MESH_CACHE: dict = {}


def _hull(verts):
    """Hull vertices, merged face normals, unique edge directions, vertex adjacency."""
    from scipy.spatial import ConvexHull
    try:
        hull = ConvexHull(verts)
    except Exception:  # degenerate (flat) mesh: keep every vertex, no faces
        return verts, np.zeros((0, 3)), np.zeros((0, 3)), [[] for _ in verts], \
            np.arange(len(verts))
    idx = np.asarray(hull.vertices)
    remap = -np.ones(len(verts), np.int64)
    remap[idx] = np.arange(len(idx))
    normals = []
    for eq in hull.equations:
        n = eq[:3]
        if not any(np.dot(n, q) > 1 - 1e-9 for q in normals):
            normals.append(n)
    edges, adj = set(), [set() for _ in idx]
    for s in hull.simplices:
        for a, b in ((s[0], s[1]), (s[1], s[2]), (s[2], s[0])):
            ra, rb = remap[a], remap[b]
            adj[ra].add(rb)
            adj[rb].add(ra)
            edges.add((min(ra, rb), max(ra, rb)))
    hv = verts[idx]
    dirs = []
    for a, b in sorted(edges):
        e = hv[b] - hv[a]
        e = e / max(np.linalg.norm(e), 1e-300)
        if not any(abs(np.dot(e, q)) > 1 - 1e-9 for q in dirs):
            dirs.append(e)
    return hv, np.asarray(normals).reshape(-1, 3), np.asarray(dirs).reshape(-1, 3), \
        [sorted(a) for a in adj], idx


def _polygons(hv):
    """Hull polygons of hull vertices ``hv``: coplanar facets merged, vertices in
    counter-clockwise order about the outward normal. Returns [(normal, [vertex ids])]."""
    from scipy.spatial import ConvexHull
    hull = ConvexHull(hv)
    groups = []
    for simplex, eq in zip(hull.simplices, hull.equations):
        for g in groups:
            if np.dot(g[0][:3], eq[:3]) > 1 - 1e-9 and abs(g[0][3] - eq[3]) < 1e-9:
                g[1].update(int(i) for i in simplex)
                break
        else:
            groups.append((eq, set(int(i) for i in simplex)))
    out = []
    for eq, ids in groups:
        n = eq[:3]
        ids = np.asarray(sorted(ids))
        c = hv[ids].mean(0)
        u = hv[ids[0]] - c
        u = u / max(np.linalg.norm(u), 1e-300)
        w = np.cross(n, u)
        ang = np.arctan2((hv[ids] - c) @ w, (hv[ids] - c) @ u)
        out.append((n, [int(i) for i in ids[np.argsort(ang)]]))
    return out


def _quad(hv, ids, a):
    """Greedy largest-area quadrilateral of polygon ``ids`` anchored at position ``a``
    (the anchor's three partners; a polygon of at most four vertices is kept whole)."""
    n = len(ids)
    if n <= 4:
        return [ids[(a + k) % n] for k in range(1, n)]

    def area(i, j, k, l):
        return 0.5 * np.linalg.norm(np.cross(hv[ids[i]] - hv[ids[k]], hv[ids[j]] - hv[ids[l]]))

    b, c, d = (a + 1) % n, (a + 2) % n, (a + 3) % n
    best = area(a, b, c, d)
    while True:
        dn = (d + 1) % n
        if area(a, b, c, dn) <= best:
            break
        d, best = dn, area(a, b, c, dn)
        while area(a, b, (c + 1) % n, d) > best:
            c = (c + 1) % n
            best = area(a, b, c, d)
        while area(a, (b + 1) % n, c, d) > best:
            b = (b + 1) % n
            best = area(a, b, c, d)
    return [ids[b], ids[c], ids[d]]


def mesh_table(m):
    """Static padded hull data of every mesh: vert (nmesh, V, 3), normal (nmesh, F, 3),
    edge (nmesh, E, 3), adj (nmesh, V, D) (-1 padded), counts."""
    key = (m.nmesh, hash(np.asarray(m.mesh_vert).tobytes()),
           hash(np.asarray(m.mesh_vertadr).tobytes()))
    tab = _MESH_CACHE.get(key)
    if tab is not None:
        return tab
    verts = np.asarray(m.mesh_vert, np.float64).reshape(-1, 3)
    vadr, vnum = np.asarray(m.mesh_vertadr), np.asarray(m.mesh_vertnum)
    hulls = [_hull(verts[vadr[i]:vadr[i] + vnum[i]]) for i in range(m.nmesh)]
    V = max(len(h[0]) for h in hulls)
    F = max(max(len(h[1]) for h in hulls), 1)
    E = max(max(len(h[2]) for h in hulls), 1)
    D = max(max((len(a) for a in h[3]), default=1) for h in hulls)
    polys = [_polygons(h[0]) if len(h[1]) else [] for h in hulls]
    PV = max([1] + [sum(v in ids for _, ids in pl) for pl, h in zip(polys, hulls)
                    for v in range(len(h[0]))])
    pnorm = np.full((m.nmesh, V, PV, 3), 2.0)          # padding: never the most opposed
    pquad = -np.ones((m.nmesh, V, PV, 3), np.int64)
    for i, pl in enumerate(polys):
        cnt = np.zeros(V, np.int64)
        for n, ids in pl:
            for pos, v in enumerate(ids):
                q = _quad(hulls[i][0], ids, pos)
                pnorm[i, v, cnt[v]] = n
                pquad[i, v, cnt[v], :len(q)] = q
                cnt[v] += 1
    vert = np.zeros((m.nmesh, V, 3))
    nrm = np.zeros((m.nmesh, F, 3))
    edg = np.zeros((m.nmesh, E, 3))
    adj = -np.ones((m.nmesh, V, D), np.int64)
    for i, (hv, hn, he, ha, _) in enumerate(hulls):
        vert[i] = hv[np.minimum(np.arange(V), len(hv) - 1)]        # pad: repeat
        if len(hn):
            nrm[i] = hn[np.minimum(np.arange(F), len(hn) - 1)]
        if len(he):
            edg[i] = he[np.minimum(np.arange(E), len(he) - 1)]
        for v, a in enumerate(ha):
            adj[i, v, :len(a)] = a
    tab = dict(vert=vert, normal=nrm, edge=edg, adj=adj, pnorm=pnorm, pquad=pquad,
               nvert=np.asarray([len(h[0]) for h in hulls]))
    _MESH_CACHE[key] = tab
    return tab


def attach_meshes(m, fn, geo1, geo2, i1, i2, ftype):
    """Give mesh geoms of a convex collider group their hull data (vert, extra)."""
    types = getattr(fn, "types", None)
    if not types or GT.MESH not in types:
        return geo1, geo2
    tab = mesh_table(m)
    dataid = jnp.asarray(np.asarray(m.geom_dataid))
    plane = types[0] == GT.PLANE
    names = ("pnorm", "pquad") if plane else ("normal", "edge")
    out = []
    for t, geo, ig in zip(types, (geo1, geo2), (i1, i2)):
        if t == GT.MESH:
            # only the tables this collider reads; gathered by mesh id at run time
            mid = dataid[ig]
            extra = {k: (jnp.asarray(tab[k], ftype) if tab[k].dtype.kind == "f"
                         else jnp.asarray(tab[k]))[mid] for k in names}
            geo = geo._replace(vert=jnp.asarray(tab["vert"], ftype)[mid], extra=extra)
        out.append(geo)
    return tuple(out)


# --------------------------------------------------------------------------- supports
def _box_verts(size):
    s = jnp.asarray([[(1 if i & 1 else -1), (1 if i & 2 else -1), (1 if i & 4 else -1)]
                     for i in range(8)], size.dtype)
    return s * size


def local_support(t, geo, d):
    """Support point of geom type ``t`` in its own frame for local direction(s) ``d``
    (..., 3)."""
    s = geo.size
    if t == GT.SPHERE:
        u, _ = normalize(d)
        return u * s[0]
    if t == GT.CAPSULE:
        u, _ = normalize(d)
        ez = jnp.asarray([0.0, 0.0, 1.0], d.dtype)
        return u * s[0] + ez * jnp.where(d[..., 2:3] >= 0, s[1], -s[1])
    if t == GT.ELLIPSOID:
        sd = d * s
        u, _ = normalize(sd)
        return u * s
    if t == GT.CYLINDER:
        xy = d * jnp.asarray([1.0, 1.0, 0.0], d.dtype)
        u, n = normalize(xy)
        u = jnp.where((n > 0)[..., None], u, 0.0)
        ez = jnp.asarray([0.0, 0.0, 1.0], d.dtype)
        return u * s[0] + ez * jnp.where(d[..., 2:3] >= 0, s[1], -s[1])
    if t == GT.BOX:
        return jnp.where(d >= 0, s, -s)
    if t == GT.MESH:
        pr = d @ geo.vert.T if d.ndim > 1 else geo.vert @ d
        k = jnp.argmax(pr, axis=-1)
        return geo.vert[k]
    raise ValueError(t)


def support(t, geo, d):
    """World support point(s) for world direction(s) ``d``."""
    return local_support(t, geo, d @ geo.mat) @ geo.mat.T + geo.pos


def _faces_edges(t, geo):
    """World face normals and edge directions used as SAT axes (polytopes, and the
    flat/straight features of cylinders and capsules)."""
    dt = geo.mat.dtype
    if t == GT.BOX:
        return geo.mat.T, geo.mat.T
    if t == GT.MESH:
        return geo.extra["normal"] @ geo.mat.T, geo.extra["edge"] @ geo.mat.T
    if t == GT.CYLINDER:
        return geo.mat[:, 2][None], geo.mat[:, 2][None]
    if t == GT.CAPSULE:
        return jnp.zeros((0, 3), dt), geo.mat[:, 2][None]
    return jnp.zeros((0, 3), dt), jnp.zeros((0, 3), dt)


_POLY = (GT.BOX, GT.MESH)


# --------------------------------------------------------------------------- plane
def plane_convex(g1, g2, margin, t2=None):
    """Plane against ellipsoid or mesh (mjc_PlaneConvex, MuJoCo 4.0): the deepest
    point; for meshes also the other corners of the hull polygon at the deepest vertex
    most opposed to the plane normal, pruned to the largest-area quadrilateral anchored
    at that vertex (greedy, precomputed per polygon and anchor), each kept when below
    the margin and below the mesh centre."""
    normal = g1.mat[:, 2]
    p = support(t2, g2, -normal)
    dist = dot(p - g1.pos, normal)
    pos = p - normal * (0.5 * dist)
    first = one(dist, pos, normal, dist <= margin)
    if t2 != GT.MESH:
        return first
    loc = normal @ g2.mat
    k = jnp.argmax(g2.vert @ -loc)
    pn = g2.extra["pnorm"][k]                                    # (PV, 3)
    best = jnp.argmin(pn @ loc)
    quad = g2.extra["pquad"][k, best]                            # (3,)
    world = g2.vert[jnp.maximum(quad, 0)] @ g2.mat.T + g2.pos
    d2 = (world - g1.pos) @ normal
    ok = (quad >= 0) & (d2 <= margin) & ((world - g2.pos) @ normal <= 0) & (dist <= margin)
    pos2 = world - normal * (0.5 * d2)[:, None]
    return Pre(jnp.concatenate([first.dist, d2]), jnp.concatenate([first.pos, pos2]),
               jnp.broadcast_to(normal, (4, 3)), jnp.zeros((4, 3), dist.dtype),
               jnp.concatenate([first.valid, ok]))


# --------------------------------------------------------------------------- convex
def _sep(t1, g1, t2, g2, n):
    """sep(n) for directions n (..., 3), and the two support points."""
    a = support(t1, g1, n)
    b = support(t2, g2, -n)
    return dot(b - a, n), a, b


def _candidates(t1, g1, t2, g2):
    f1, e1 = _faces_edges(t1, g1)
    f2, e2 = _faces_edges(t2, g2)
    dirs = [f1, -f1, f2, -f2]
    if e1.shape[0] and e2.shape[0] and e1.shape[0] * e2.shape[0] <= MAX_EDGE_PAIRS:
        c = cross(e1[:, None, :], e2[None, :, :]).reshape(-1, 3)
        cn, ln = normalize(c)
        ok = ln > 1e-6
        cn = jnp.where(ok[:, None], cn, f1[:1] if f1.shape[0] else _FIXED_DIRS[:1])
        dirs += [cn, -cn]
    cdif, _ = normalize(g2.pos - g1.pos)
    dirs += [cdif[None], jnp.asarray(_FIXED_DIRS, g1.pos.dtype)]
    for g in (g1, g2):
        dirs += [g.mat.T, -g.mat.T]
    return jnp.concatenate(dirs)


def _refine(t1, g1, t2, g2, n, s, scale):
    """Projected gradient ascent of sep over unit directions (fixed iterations)."""
    def body(carry, _):
        n, s, eta = carry
        _, a, b = _sep(t1, g1, t2, g2, n)
        v = b - a
        vt = v - n * dot(v, n)
        trial, _ = normalize(n + eta * vt)
        st, _, _ = _sep(t1, g1, t2, g2, trial)
        better = st > s
        n = jnp.where(better, trial, n)
        s = jnp.where(better, st, s)
        eta = jnp.where(better, eta * 1.5, eta * 0.3)
        return (n, s, eta), None

    (n, s, _), _ = jax.lax.scan(body, (n, s, 1.0 / scale), None, length=REFINE_ITERS)
    return n, s


def _face_points(t, geo, n, k):
    """World vertices (k, 3) of the support face of a polytope along n, with a mask."""
    if t == GT.BOX:
        v = _box_verts(geo.size)
    else:
        v = geo.vert
    w = v @ geo.mat.T + geo.pos
    pr = w @ n
    top = jnp.max(pr)
    scale = jnp.max(jnp.abs(v)) + 1e-300
    on = pr >= top - 1e-6 * scale
    k = min(k, w.shape[0])
    order = jnp.argsort(~on, stable=True)[:k]          # on-face vertices first
    return w[order], on[order]


def _inside(points, poly, pmask, n):
    """Whether each point (P, 3) projects inside the convex polygon of ``poly`` (K, 3)
    (masked) along n; the polygon is given by unordered vertices."""
    u, _ = normalize(cross(n, jnp.where(jnp.abs(n[0]) < 0.9, jnp.asarray([1.0, 0, 0]),
                                        jnp.asarray([0, 1.0, 0])).astype(n.dtype)))
    v = cross(n, u)
    q = jnp.stack([poly @ u, poly @ v], -1)                      # (K, 2)
    p = jnp.stack([points @ u, points @ v], -1)                  # (P, 2)
    K = q.shape[0]
    qi, qj = q[:, None, :], q[None, :, :]
    e = qj - qi                                                  # (K, K, 2)
    nrm = jnp.stack([-e[..., 1], e[..., 0]], -1)
    scale = jnp.max(jnp.abs(q)) + 1e-300
    tol = 1e-9 * scale * scale
    side = jnp.einsum("ijc,kc->ijk", nrm, q) - jnp.sum(nrm * qi, -1)[..., None]  # (K,K,K)
    valid_pair = pmask[:, None] & pmask[None, :] & (jnp.sum(e * e, -1) > tol)
    hull_edge = valid_pair & jnp.all((side >= -tol) | ~pmask[None, None, :], axis=-1)
    ps = jnp.einsum("ijc,pc->ijp", nrm, p) - jnp.sum(nrm * qi, -1)[..., None]  # (K,K,P)
    ok = jnp.all((ps >= -tol) | ~hull_edge[..., None], axis=(0, 1))
    return ok & jnp.any(hull_edge)


def _spread4(pos, valid, depth):
    """Keep at most 4 spread-out valid points: deepest, farthest from it, farthest from
    their line, farthest on the other side."""
    big = jnp.asarray(1e30, pos.dtype)
    i0 = jnp.argmin(jnp.where(valid, depth, big))
    d0 = jnp.sum((pos - pos[i0]) ** 2, -1)
    i1 = jnp.argmax(jnp.where(valid, d0, -1.0))
    ab = pos[i1] - pos[i0]
    c = cross(ab, pos - pos[i0])
    area = jnp.sum(c * c, -1)
    i2 = jnp.argmax(jnp.where(valid, area, -1.0))
    nrm = cross(ab, pos[i2] - pos[i0])
    sgn = -(c @ nrm)
    i3 = jnp.argmax(jnp.where(valid, sgn, -big))
    keep = jnp.zeros(pos.shape[0], bool).at[jnp.stack([i0, i1, i2, i3])].set(True)
    return keep & valid


def convex_convex(g1, g2, margin, t1=None, t2=None):
    """Convex-convex contact (see the module docstring). Returns 1 slot for curved
    pairs, 1 + 2*FACE_VERTS slots (at most 4 valid) for box/mesh pairs."""
    dirs = _candidates(t1, g1, t2, g2)
    s, _, _ = _sep(t1, g1, t2, g2, dirs)
    k = jnp.argmax(s)
    n, sbest = dirs[k], s[k]
    poly = t1 in _POLY and t2 in _POLY
    if not poly:
        scale = jnp.maximum(jnp.max(g1.size) + jnp.max(g2.size), 1e-9)
        n, sbest = _refine(t1, g1, t2, g2, n, sbest, scale)
    dist, a, b = _sep(t1, g1, t2, g2, n)
    pos = 0.5 * (a + b)
    first = one(dist, pos, n, dist <= margin)
    if not poly:
        return first
    fa, ma = _face_points(t1, g1, n, FACE_VERTS)
    fb, mb = _face_points(t2, g2, -n, FACE_VERTS)
    ina = _inside(fa, fb, mb, n) & ma
    inb = _inside(fb, fa, ma, n) & mb
    topb = jnp.min(fb @ n)
    topa = jnp.max(fa @ n)
    da = topb - fa @ n                       # gap from A's face vertex to B's face plane
    db = fb @ n - topa
    pa = fa + n * (0.5 * da)[:, None]
    pb = fb - n * (0.5 * db)[:, None]
    pts = jnp.concatenate([pa, pb])
    dep = jnp.concatenate([da, db])
    val = jnp.concatenate([ina, inb]) & (dep <= margin)
    keep = _spread4(pts, val, dep)
    # fall back to the single support contact when no face vertex qualifies
    none = ~jnp.any(keep)
    K = pts.shape[0]
    return Pre(jnp.concatenate([first.dist, dep]), jnp.concatenate([first.pos, pts]),
               jnp.broadcast_to(n, (K + 1, 3)), jnp.zeros((K + 1, 3), n.dtype),
               jnp.concatenate([first.valid & none, keep & (dist <= margin)]))


def _make(fn, t1, t2):
    f = functools.partial(fn, t1=t1, t2=t2) if fn is convex_convex else \
        functools.partial(fn, t2=t2)
    f.types = (t1, t2)
    return f


_TYPES = (GT.SPHERE, GT.CAPSULE, GT.ELLIPSOID, GT.CYLINDER, GT.BOX, GT.MESH)
CONVEX = {(a, b): _make(convex_convex, a, b) for a in _TYPES for b in _TYPES if a <= b}
PLANE = {t: _make(plane_convex, GT.PLANE, t) for t in (GT.ELLIPSOID, GT.MESH)}
MAXCON = {f: (4 if (k[0] in _POLY and k[1] in _POLY) else 1) for k, f in CONVEX.items()}
MAXCON.update({PLANE[GT.ELLIPSOID]: 1, PLANE[GT.MESH]: 4})
