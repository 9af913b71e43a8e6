"""General convex colliders: plane-convex and convex-convex for ellipsoids, cylinders,
capsules, spheres, boxes and meshes (their convex hulls).

MuJoCo 4.0 finds the penetration of a convex pair with GJK + EPA (mjc_ccd,
engine_collision_gjk.c) and, for box/mesh pairs, recovers a contact patch from the
final EPA face (multicontact / polygonClip). simjax computes the same quantities with
a fixed-shape formulation that jit/vmap/grad handle well:

- **Normal and depth.** The signed distance of two convex sets along a unit direction
  ``n`` (geom1 to geom2) is ``sep(n) = -h2(-n) - h1(n)`` (``h``: support functions);
  its maximum over directions is the distance (apart) or minus the penetration depth
  (overlapping): the optimum EPA converges to. Polytopes (boxes, meshes): the maximum
  is attained at a hull face normal or a cross product of hull edges (separating axis
  theorem), all evaluated exactly. Curved shapes: the best of a set of candidate
  directions is refined by projected gradient ascent (fixed iteration count), with a
  second trial step kept on the ridge where a capsule's or cylinder's support
  switches ends (the optimum when its side crosses the other geom).
  A mesh's support value along its own face normals is static (precomputed per hull,
  ``hface``), and its other support points are found in bounded chunks of (direction,
  vertex) products, so hulls of thousands of vertices cost little memory per world.
- **Witness point (single contact).** The support features along ``n`` play the role
  of the final EPA face: a vertex of either side gives the unique witness (the
  vertex, moved half the distance along the normal); two edges give their closest
  points. For curved shapes the curved geom's support point is the witness (what
  MuJoCo's inflated point/segment GJK gives for spheres).
- **Box/mesh multi-contact (MuJoCo's multicontact).** Support features (vertex, edge
  or face: vertices within FEATURE_TOL of the support plane) give candidate polygons
  (those containing the feature) and edges (the feature's edge, or every edge at the
  vertex). Two polygons facing each other (cosine < -FACE_TOL) give a face-face
  patch: geom2's polygon clipped by geom1's side planes (Sutherland-Hodgman as
  polygonClip), points below geom1's face kept, more than 4 reduced by MuJoCo's greedy
  polygonQuad. Each kept point and its projection onto the reference plane (along the
  reference normal) are the witnesses; the normal is minus geom2's face normal
  (face-face) or the reference normal, the depth the witnesses' separation along it,
  the position geom1's witness moved half the depth along the normal (MuJoCo 4.0.0,
  matched to 1e-12). Otherwise an edge in a face (|cosine| < EDGE_TOL) clips the edge
  by the face (at most its two farthest points). With a positive margin the patch is
  built whenever the pair is within the margin, points up to the margin above the
  reference face kept (as MuJoCo 4.0.0). Hull polygons are formed as MuJoCo's
  compiler does (hull triangles grouped by normal angles rounded to 0.01 rad, boundary
  traced per island).
- **Plane-mesh** (MuJoCo 4.0's mjc_PlaneConvex): the deepest vertex, then the other
  corners of the largest-area quadrilateral of the hull polygon at that vertex most
  opposed to the plane normal (greedy, precomputed per polygon and anchor), each kept
  when below the margin and below the mesh centre. A plane against an SDF geom uses
  the same collider on the SDF geom's mesh (as MuJoCo 4.0; hull tables built by
  ``plane_table``, light enough for meshes of ~5e4 vertices).

Measured against MuJoCo 4.0.0 on the corpus (tests/engine/test_collision.py, 20 states
with contacts per model): same contacting pairs and contact counts everywhere;
plane-mesh, box-mesh and mesh-mesh (mjx convex scene) positions and depths to ~1e-8;
trossen wx250s finger meshes (merged, slightly non-planar polygons) within 2e-2 in
position (one patch corner in 3 states of 20), depths to 1e-6.

Differences from MuJoCo (deliberate or not yet implemented):

- Where several polygon pairs (or edge/face pairs) qualify, MuJoCo takes the first in
  its polygon order, simjax the best aligned; polygon vertex order (start vertex) may
  differ from MuJoCo's, which can change polygonQuad's pick on polygons of more than
  4 clipped points (the trossen tolerance above).
- A sphere against a mesh does not go through the SAT candidates: the exact distance
  of its centre to the hull (closest triangle or edge, or the shallowest face when the
  centre is inside) is in convex_sphere.py.
- Cylinder patches (a cylinder against a box, mesh or cylinder, MuJoCo 4.0's
  multicontact with the cap as a 16-gon) and a capsule lying on a mesh face or a
  cylinder cap (2 contacts) are in convex_cylinder.py. Deep penetrations where EPA
  stops on a non-optimal face (its tolerance) report simjax's exact optimum.
- Polygons of more than 4 clipped points: polygonQuad's pick depends on the polygon's
  start vertex, which MuJoCo takes from its compiler's hull triangle order (qhull's
  face order, mjCMesh::MakePolygons); simjax starts at the smallest hull vertex id, so
  e.g. a hexagonal prism face resting on a box may give 4 other corners than MuJoCo.
  Some edge-face cases of mesh pairs give 2 contacts in MuJoCo and 1 here (seen with a
  cube mesh vertex on a hexagonal prism mesh near its rim): MuJoCo reports the same
  point twice (equal position and depth), simjax once.
- Meshes whose hull MuJoCo does not build (no mesh_graph) get polygons here; MuJoCo
  skips multi-contact for them.
- The refine can stop short of the optimum where sep(n) has a ridge it does not step
  along: a sphere against a mesh hull whose nearest feature is an edge or a vertex
  (shadow hand object on finger meshes: 1.1e-5 too deep, normal 0.03 rad off, in 2
  of 5 such contacts; MuJoCo's GJK is exact there), and deep random capsule-cylinder
  overlaps with several local optima (3 of 108 poses off by up to 3.6e-3 in depth).
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from simjax.engine import inline
from simjax.engine.collision.common import (Pre, argmax, argmin, cross, dot, normalize, one,
                                            safe_norm, first_where as _first)
from simjax.types import GeomType as GT

#: refinement iterations for curved pairs
REFINE_ITERS = 40
#: maximum number of hull edge pairs evaluated as SAT axes
MAX_EDGE_PAIRS = 4096
#: (direction, vertex) products a mesh support evaluation holds at once
SUPPORT_CHUNK = 1 << 15

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


def _cross3(u, w):
    """Cross product of two 3-vectors in plain floats (np.cross costs microseconds per
    call, too slow for the hulls of large meshes)."""
    u0, u1, u2 = (float(x) for x in u)
    w0, w1, w2 = (float(x) for x in w)
    return (u1 * w2 - u2 * w1, u2 * w0 - u0 * w2, u0 * w1 - u1 * w0)


def _quad(hv, ids, a):
    """Greedy largest-area quadrilateral of polygon ``ids`` anchored at position ``a``
    (the anchor's three partners; a polygon of at most four vertices is kept whole)."""
    n = len(ids)
    if n <= 4:
        return [ids[(a + k) % n] for k in range(1, n)]

    pts = [tuple(float(x) for x in hv[v]) for v in ids]

    def area(i, j, k, l):
        u = [x - y for x, y in zip(pts[i], pts[k])]
        w = [x - y for x, y in zip(pts[j], pts[l])]
        return 0.5 * math.sqrt(sum(c * c for c in _cross3(u, w)))

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


#: MuJoCo's polygon grouping tolerance (radians) for hull triangles (mjCMesh::MakePolygons)
POLY_ANGLE_TOL = 0.01


def _mj_polygons(hv):
    """Hull polygons as MuJoCo's compiler forms them (mjCMesh::MakePolygons): hull
    triangles grouped by their normal's azimuth/polar angles rounded to POLY_ANGLE_TOL,
    each group's boundary traced into counter-clockwise vertex cycles (one per connected
    island). The normal is that of the first three cycle vertices.
    Returns [(normal, [vertex ids])]."""
    from scipy.spatial import ConvexHull
    try:
        hull = ConvexHull(hv)
    except Exception:
        return []
    # every hull triangle at once (vectorised: meshes of SDF geoms have ~1e5)
    tri = np.asarray(hull.simplices, np.int64).copy()
    n = np.cross(hv[tri[:, 1]] - hv[tri[:, 0]], hv[tri[:, 2]] - hv[tri[:, 0]])
    flip = np.sum(n * hull.equations[:, :3], axis=1) < 0
    tri[flip] = tri[flip][:, [0, 2, 1]]
    n[flip] = -n[flip]
    norm = np.linalg.norm(n, axis=1)
    keep = norm >= 1e-15
    tri, n = tri[keep], n[keep] / norm[keep, None] + 0.0
    polar = np.abs(n[:, 2]) > 1 - 1e-7
    k0 = np.where(polar, 0.0, np.round(np.arctan2(n[:, 1], n[:, 0]) / POLY_ANGLE_TOL))
    k1 = np.where(polar, np.where(n[:, 2] < 0, np.round(np.pi / POLY_ANGLE_TOL), 0.0),
                  np.round(np.arccos(np.clip(n[:, 2], -1, 1)) / POLY_ANGLE_TOL))
    groups = {}
    for key, t in zip(zip(k0.tolist(), k1.tolist()), tri.tolist()):
        groups.setdefault(key, []).append(tuple(t))
    paths = []
    for tris in groups.values():
        if len(tris) == 1:                   # most groups: one triangle, from its min
            t = tris[0]
            k = t.index(min(t))
            paths.append([t[k], t[(k + 1) % 3], t[(k + 2) % 3]])
            continue
        edges = set()
        for a, b, c in tris:
            edges.update(((a, b), (b, c), (c, a)))
        succ = {}
        for u, v in edges:
            if (v, u) not in edges:
                succ.setdefault(u, []).append(v)
        seen = set()
        for start in sorted(succ):
            if start in seen:
                continue
            path, u = [start], start
            seen.add(start)
            while True:
                nxt = [v for v in succ.get(u, []) if v not in seen or v == start]
                if not nxt:
                    break
                u = nxt[0]
                if u == start:
                    break
                path.append(u)
                seen.add(u)
            if len(path) >= 3:
                paths.append(path)
    if not paths:
        return []
    first = np.asarray([p[:3] for p in paths])
    p0, p1, p2 = hv[first[:, 0]], hv[first[:, 1]], hv[first[:, 2]]
    nrm = np.cross(p1 - p0, p2 - p0)
    nrm = nrm / np.maximum(np.sqrt(np.sum(nrm * nrm, axis=1)), 1e-300)[:, None]
    return list(zip(nrm, paths))


def _clip_tables(hulls, V):
    """Per-mesh polygon tables for multi-contact: fvert (nmesh, F, PV) hull-vertex ids
    in clipping order (clockwise about the outward normal, as MuJoCo walks them), fnum
    (nmesh, F), fnormal (nmesh, F, 3), vface (nmesh, V, D) polygons at each vertex
    (-1 padded), npoly (nmesh,)."""
    polys = [_mj_polygons(hv) for hv in hulls]
    F = max([1] + [len(p) for p in polys])
    PV = max([3] + [len(ids) for p in polys for _, ids in p])
    D = 1
    vf = []
    for hv, p in zip(hulls, polys):
        lst = [[] for _ in range(len(hv))]
        for k, (_, ids) in enumerate(p):
            for v in ids:
                lst[v].append(k)
        D = max([D] + [len(x) for x in lst])
        vf.append(lst)
    nm = len(hulls)
    fvert = -np.ones((nm, F, PV), np.int64)
    fnum = np.zeros((nm, F), np.int64)
    fnormal = np.zeros((nm, F, 3))
    vface = -np.ones((nm, V, D), np.int64)
    for i, p in enumerate(polys):
        for k, (n, ids) in enumerate(p):
            fvert[i, k, :len(ids)] = ids[::-1]
            fnum[i, k] = len(ids)
            fnormal[i, k] = n
        for v, lst in enumerate(vf[i]):
            vface[i, v, :len(lst)] = lst
    return dict(fvert=fvert, fnum=fnum, fnormal=fnormal, vface=vface,
                npoly=np.asarray([len(p) for p in polys], np.int64))


def _mesh_key(m):
    """Cache key of a model's mesh vertex data (the static tables depend on nothing else)."""
    return (m.nmesh, hash(np.asarray(m.mesh_vert).tobytes()),
            hash(np.asarray(m.mesh_vertadr).tobytes()))


def _mesh_vertices(m):
    """Each mesh's vertices (float64, (vertnum, 3)), in mesh order."""
    verts = np.asarray(m.mesh_vert, np.float64).reshape(-1, 3)
    vadr, vnum = np.asarray(m.mesh_vertadr), np.asarray(m.mesh_vertnum)
    return [verts[vadr[i]:vadr[i] + vnum[i]] for i in range(m.nmesh)]


def _mesh_ids(m, ids):
    """The mesh ids a table covers, as a tuple (every mesh when ``ids`` is None)."""
    return tuple(range(m.nmesh)) if ids is None else tuple(int(i) for i in ids)


def mesh_table(m, ids=None):
    """Static padded hull data of the meshes ``ids`` (every mesh when None), row k for
    mesh ``ids[k]``, padded to the largest of these meshes only (so a collider group
    pays for its own meshes, not the model's largest): vert (n, V, 3), normal
    (n, F, 3), edge (n, E, 3), adj (n, V, D) (-1 padded), counts."""
    ids = _mesh_ids(m, ids)
    key = (_mesh_key(m), ids)
    tab = _MESH_CACHE.get(key)
    if tab is not None:
        return tab
    allv = _mesh_vertices(m)
    hulls = [_hull(allv[i]) for i in ids]
    nmesh = len(ids)
    V = max(len(h[0]) for h in hulls)
    F = max(max(len(h[1]) for h in hulls), 1)
    E = max(max(len(h[2]) for h in hulls), 1)
    D = max(max((len(a) for a in h[3]), default=1) for h in hulls)
    polys = [_mj_polygons(h[0]) if len(h[1]) else [] for h in hulls]
    PV = max([1] + [sum(v in ids for _, ids in pl) for pl, h in zip(polys, hulls)
                    for v in range(len(h[0]))])
    pnorm = np.zeros((nmesh, V, PV, 3))              # padding: masked by pquad < 0
    pquad = -np.ones((nmesh, V, PV, 3), np.int64)
    for i, pl in enumerate(polys):
        cnt = np.zeros(V, np.int64)
        for n, ids in pl:
            for pos, v in enumerate(ids):
                q = _quad(hulls[i][0], ids, pos)
                pnorm[i, v, cnt[v]] = n
                pquad[i, v, cnt[v], :len(q)] = q
                cnt[v] += 1
    vert = np.zeros((nmesh, V, 3))
    nrm = np.zeros((nmesh, F, 3))
    edg = np.zeros((nmesh, E, 3))
    adj = -np.ones((nmesh, V, D), np.int64)
    for i, (hv, hn, he, ha, _) in enumerate(hulls):
        vert[i] = hv[np.minimum(np.arange(V), len(hv) - 1)]        # pad: repeat
        if len(hn):
            nrm[i] = hn[np.minimum(np.arange(F), len(hn) - 1)]
        if len(he):
            edg[i] = he[np.minimum(np.arange(E), len(he) - 1)]
        for v, a in enumerate(ha):
            adj[i, v, :len(a)] = a
    # support values of each hull along its own face normals (+n, -n): static in the
    # mesh frame, so SAT scoring of these directions needs no (directions x vertices)
    # product at run time
    hface = np.zeros((nmesh, F, 2))
    for i in range(nmesh):
        pr = nrm[i] @ hulls[i][0].T                                 # (F, nv)
        hface[i] = np.stack([pr.max(1), (-pr).max(1)], 1)
    tab = dict(vert=vert, normal=nrm, edge=edg, adj=adj, pnorm=pnorm, pquad=pquad,
               hface=hface, nvert=np.asarray([len(h[0]) for h in hulls]))
    tab.update(_clip_tables([h[0] for h in hulls], V))
    _MESH_CACHE[key] = tab
    return tab


_PLANE_CACHE: dict = {}


def _hull_vertices(verts):
    from scipy.spatial import ConvexHull
    try:
        return verts[np.asarray(ConvexHull(verts).vertices)]
    except Exception:  # degenerate (flat) mesh: keep every vertex
        return verts


def plane_table(m, ids=None):
    """Static padded hull data for plane-mesh contacts only (what plane_convex reads),
    row k for mesh ``ids[k]`` (every mesh when None): vert (n, V, 3) hull vertices,
    and per vertex and hull polygon at it the polygon's normal pnorm (n, V, PV, 3) and
    the three partners of its greedy quadrilateral pquad (n, V, PV, 3) (-1 padded). Lighter than mesh_table (no
    edge or face-normal deduplication), so it serves large meshes such as the meshes
    of SDF geoms (tens of thousands of vertices)."""
    ids = _mesh_ids(m, ids)
    key = (_mesh_key(m), ids)
    tab = _PLANE_CACHE.get(key)
    if tab is not None:
        return tab
    allv = _mesh_vertices(m)
    hulls = [_hull_vertices(allv[i]) for i in ids]
    nmesh = len(ids)
    polys = [_mj_polygons(hv) for hv in hulls]
    V = max(len(hv) for hv in hulls)
    cnt = [np.zeros(len(hv), np.int64) for hv in hulls]
    for c, pl in zip(cnt, polys):
        for _, ids in pl:
            np.add.at(c, np.asarray(ids), 1)
    PV = max([1] + [int(c.max(initial=0)) for c in cnt])
    pnorm = np.zeros((nmesh, V, PV, 3))              # padding: masked by pquad < 0
    pquad = -np.ones((nmesh, V, PV, 3), np.int64)
    vert = np.zeros((nmesh, V, 3))
    for i, (hv, pl) in enumerate(zip(hulls, polys)):
        vert[i] = hv[np.minimum(np.arange(V), len(hv) - 1)]        # pad: repeat
        c = np.zeros(V, np.int64)
        for n, ids in pl:
            for pos, v in enumerate(ids):
                q = _quad(hv, ids, pos)
                pnorm[i, v, c[v]] = n
                pquad[i, v, c[v], :len(q)] = q
                c[v] += 1
    tab = dict(vert=vert, pnorm=pnorm, pquad=pquad)
    _PLANE_CACHE[key] = tab
    return tab


def attach_meshes(m, fn, geo1, geo2, i1, i2, ftype, geoms=None):
    """Give mesh geoms of a convex collider group their hull data (vert, extra).

    ``geoms``: the group's candidate geom ids (g1, g2) (static numpy); the tables then
    cover the group's meshes only (padded to the largest of them), else every mesh.
    A collider with a ``mesh_tables`` attribute (``(table builder, names)``) gets
    those tables instead of the SAT ones."""
    types = getattr(fn, "types", None)
    if not types or GT.MESH not in types:
        return geo1, geo2
    dataid_np = np.asarray(m.geom_dataid)
    ids = None
    if geoms is not None:
        ids = sorted({int(dataid_np[g]) for t, gs in zip(types, geoms) if t == GT.MESH
                      for g in np.asarray(gs)})
    local = np.zeros(max(m.nmesh, 1), np.int64)
    local[list(_mesh_ids(m, ids))] = np.arange(len(_mesh_ids(m, ids)))
    plane = types[0] == GT.PLANE
    if hasattr(fn, "mesh_tables"):
        build, names = fn.mesh_tables
        tab = build(m, ids)
    elif plane:
        tab, names = plane_table(m, ids), ("pnorm", "pquad")
    else:
        tab = mesh_table(m, ids)
        names = ("normal", "edge", "hface", "fvert", "fnum", "fnormal", "vface", "npoly",
                 "nvert")
    # row of each geom's mesh in the tables (static when the geoms are)
    lid = jnp.asarray(local[np.maximum(dataid_np, 0)])
    out = []
    for t, geo, ig in zip(types, (geo1, geo2), (i1, i2)):
        if t == GT.MESH:
            # only the tables this collider reads; gathered by mesh row at run time
            mid = lid[ig]
            extra = {k: (jnp.asarray(tab[k], ftype) if tab[k].dtype.kind == "f"
                         else jnp.asarray(tab[k]))[mid] for k in names}
            vert = jnp.asarray(tab["vert"], ftype)[mid] if "vert" in tab else None
            geo = geo._replace(vert=vert, extra={**(geo.extra or {}), **extra})
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
        k = argmax(pr)
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
    k = argmax(g2.vert @ -loc)
    pn = g2.extra["pnorm"][k]                                    # (PV, 3)
    best = argmin(jnp.where(g2.extra["pquad"][k, :, 0] >= 0, pn @ loc, jnp.inf))
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


def mesh_support(vert, mat, pos, d):
    """Support points (K, 3) of a mesh (hull vertices ``vert`` (V, 3) in its frame,
    rotation ``mat``, position ``pos``) for directions d (K, 3) of the outer frame. The
    vertex argmax is taken in chunks of at most SUPPORT_CHUNK (direction, vertex)
    products (lax.map), so memory stays bounded for large hulls and many directions;
    the points are those of the unchunked argmax."""
    def idx(dk):
        return argmax((dk @ mat) @ vert.T)
    if d.shape[0] * vert.shape[0] <= SUPPORT_CHUNK:
        k = idx(d)
    else:
        k = inline.map(idx, d, batch_size=max(1, SUPPORT_CHUNK // vert.shape[0]))
    return vert[k] @ mat.T + pos


def _support_pts(t, geo, d):
    """World support points for world directions d (K, 3) (meshes: mesh_support)."""
    if t != GT.MESH:
        return support(t, geo, d)
    return mesh_support(geo.vert, geo.mat, geo.pos, d)


def _face_dirs(t, geo):
    """World face normals of a geom used as SAT axes, and for meshes their support
    values (+n, -n) from the static hull table (None otherwise)."""
    f, _ = _faces_edges(t, geo)
    if t == GT.MESH:
        off = f @ geo.pos
        return f, (off + geo.extra["hface"][:, 0], -off + geo.extra["hface"][:, 1])
    return f, None


def _candidates(t1, g1, t2, g2):
    """SAT candidate directions (K, 3) and their separation sep (K,) (no gradient:
    only the best direction's index is used). Mesh face normals are scored with the
    hull's static support values on their own side; every other support value is
    evaluated (meshes in bounded chunks, see mesh_support)."""
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
    dirs = jnp.concatenate(dirs)
    return dirs, _scores(t1, g1, t2, g2, dirs, f1.shape[0], f2.shape[0])


def _scores(t1, g1, t2, g2, dirs, nf1, nf2):
    """sep of _candidates' directions (its order: f1, -f1, f2, -f2, the rest): a
    mesh's support value along its own face normals from its hull table, every other
    support point evaluated (as _sep)."""
    g1, g2, dirs = jax.lax.stop_gradient((g1, g2, dirs))
    n1 = 2 * nf1
    n2 = n1 + 2 * nf2
    m1, m2 = t1 == GT.MESH, t2 == GT.MESH
    if not (m1 or m2):
        return _sep(t1, g1, t2, g2, dirs)[0]

    def evaluated(d):                             # as _sep
        return dot(_support_pts(t2, g2, -d) - _support_pts(t1, g1, d), d)
    d1, d2 = dirs[:n1], dirs[n1:n2]
    if m1:                                        # h1 along f1, -f1 from the table
        _, (hp, hm) = _face_dirs(t1, g1)
        s1 = dot(_support_pts(t2, g2, -d1), d1) - jnp.concatenate([hp, hm])
    else:
        s1 = evaluated(d1)
    if m2:                                        # h2 along -f2 (n = f2), f2 (n = -f2)
        _, (hp, hm) = _face_dirs(t2, g2)
        s2 = -jnp.concatenate([hm, hp]) - dot(_support_pts(t1, g1, d2), d2)
    else:
        s2 = evaluated(d2)
    return jnp.concatenate([s1, s2, evaluated(dirs[n2:])])


def _refine(t1, g1, t2, g2, n, s, scale):
    """Projected gradient ascent of sep over unit directions (fixed iterations). A
    capsule's support jumps from one end to the other where n crosses the plane
    normal to its axis, so sep has a ridge there (the optimum when the capsule's side
    crosses the other geom); plain steps zigzag across it and stall, so each capsule
    adds a trial step kept on its ridge (the step with the axis component removed)."""
    axes = [g.mat[:, 2] for t, g in ((t1, g1), (t2, g2)) if t in (GT.CAPSULE, GT.CYLINDER)]

    def body(carry, _):
        n, s, eta = carry
        _, a, b = _sep(t1, g1, t2, g2, n)
        v = b - a
        vt = v - n * dot(v, n)
        step = n + eta * vt
        trials = [normalize(step)[0]]
        for ax in axes:
            trials.append(normalize(step - dot(step, ax) * ax)[0])
        anyb = False
        for trial in trials:
            st, _, _ = _sep(t1, g1, t2, g2, trial)
            better = st > s
            n, s, anyb = jnp.where(better, trial, n), jnp.where(better, st, s), anyb | better
        eta = jnp.where(anyb, eta * 1.5, eta * 0.3)
        return (n, s, eta), None

    (n, s, _), _ = inline.scan(body, (n, s, 1.0 / scale), None, length=REFINE_ITERS)
    return n, s


# --------------------------------------------------------------------------- multi-contact
#: MuJoCo's feature alignment tolerances (engine_collision_gjk.h): faces facing each
#: other (cosine), and an edge lying in a face (|cosine| with the face normal)
FACE_TOL = 0.996
EDGE_TOL = 0.0888
#: support values within this distance of the maximum belong to one support feature
#: (the EPA tolerance, opt.ccd_tolerance's default)
FEATURE_TOL = 1e-6

# box faces in MuJoCo's order (+x, -x, +y, -y, +z, -z) and corner order (clockwise about
# the outward normal); corner index bits x = 1, y = 2, z = 4 (as _box_verts)
_BOX_FACES = np.array([[7, 3, 1, 5], [2, 6, 4, 0], [2, 3, 7, 6],
                       [4, 5, 1, 0], [6, 7, 5, 4], [3, 2, 0, 1]])
_BOX_NORMALS = np.array([[1, 0, 0], [-1, 0, 0], [0, 1, 0], [0, -1, 0], [0, 0, 1],
                         [0, 0, -1]], np.float64)
_BOX_VFACE = np.array([[0 if v & 1 else 1, 2 if v & 2 else 3, 4 if v & 4 else 5]
                       for v in range(8)])


def _polytope(t, geo):
    """World vertices (V, 3), polygons (F, PV) in clipping order, their vertex counts
    (F,), world normals (F, 3), polygons at each vertex (V, D) and whether polygon data
    exists (MuJoCo skips multi-contact for meshes without it)."""
    if t == GT.BOX:
        v = _box_verts(geo.size) @ geo.mat.T + geo.pos
        return (v, jnp.asarray(_BOX_FACES), jnp.full(6, 4),
                jnp.asarray(_BOX_NORMALS, v.dtype) @ geo.mat.T, jnp.asarray(_BOX_VFACE),
                jnp.asarray(True), jnp.asarray(8))
    ex = geo.extra
    return (geo.vert @ geo.mat.T + geo.pos, ex["fvert"], ex["fnum"],
            ex["fnormal"] @ geo.mat.T, ex["vface"], ex["npoly"] > 0, ex["nvert"])


def _feature(poly, u):
    """Support feature of a polytope along u: its 3 best vertex ids and dimension
    (1 vertex, 2 edge, 3 face), as the vertices of the final EPA face on that side."""
    vw, nvert = poly[0], poly[6]
    pr = jnp.where(jnp.arange(vw.shape[0]) < nvert, vw @ u, -jnp.inf)
    _, idx = jax.lax.top_k(pr, 3)
    close = pr[idx] >= pr[idx[0]] - FEATURE_TOL
    dim = 1 + close[1].astype(jnp.int32) + (close[1] & close[2]).astype(jnp.int32)
    return idx, dim


def _feature_faces(poly, idx, dim):
    """Polygons adjacent to a support feature (meshNormals/boxNormals): ids (D,), mask."""
    fvert, vface = poly[1], poly[4]
    cand = vface[idx[0]]
    ok = cand >= 0
    fv = fvert[jnp.maximum(cand, 0)]                               # (D, PV)
    has1 = jnp.any(fv == idx[1], axis=-1)
    has2 = jnp.any(fv == idx[2], axis=-1)
    ok = ok & ((dim < 2) | has1) & ((dim < 3) | has2)
    return jnp.maximum(cand, 0), ok


def _feature_edges(poly, idx, dim):
    """Edges at a support feature (meshEdgeNormals/boxEdgeNormals): the edge itself, or
    every edge at the vertex. Returns unit directions (D, 3), end vertex ids, mask."""
    vw, fvert, fnum, vface = poly[0], poly[1], poly[2], poly[4]
    cand = vface[idx[0]]
    ok = cand >= 0
    fv = fvert[jnp.maximum(cand, 0)]                               # (D, PV)
    n = fnum[jnp.maximum(cand, 0)]
    j = jnp.argmax(fv == idx[0], axis=-1)
    # the neighbour that precedes the vertex counter-clockwise: next in clipping order
    end = fv[jnp.arange(fv.shape[0]), jnp.where(j + 1 >= n, 0, j + 1)]
    end = jnp.where(dim == 2, jnp.full_like(end, idx[1]), end)
    ok = jnp.where(dim == 2, jnp.arange(ok.shape[0]) == 0, ok)
    e, _ = normalize(vw[end] - vw[idx[0]])
    return e, end, ok


def _clip(ref, kref, nref, inc, kinc, size, margin=0.0):
    """Sutherland-Hodgman clipping of polygon ``inc`` (kinc vertices) by the side planes
    of polygon ``ref`` (kref vertices, normal nref), then only points at most ``margin``
    above ref's plane kept (polygonClip). Returns points (size, 3) and their count."""
    K = ref.shape[0]
    i = jnp.arange(K)
    nxt = jnp.where(i + 1 >= kref, 0, i + 1)
    pn, _ = normalize(cross(ref[nxt] - ref, nref[None]))
    pd = dot(pn, ref)
    poly = jnp.zeros((size, 3), ref.dtype).at[:inc.shape[0]].set(inc)
    slot = jnp.arange(size)

    def edge(carry, e):
        poly, cnt = carry
        P = poly
        Q = jnp.where((slot < cnt - 1)[:, None], jnp.roll(poly, -1, axis=0), poly[0])
        in1 = dot(P - ref[e], pn[e]) > -1e-15
        in2 = dot(Q - ref[e], pn[e]) > -1e-15
        live = slot < cnt
        PQ = Q - P
        tmp = dot(PQ, pn[e])
        t = (pd[e] - dot(P, pn[e])) / jnp.where(tmp != 0, tmp, 1.0)
        s0 = live & (in1 != in2) & (tmp != 0) & (t >= 0) & (t <= 1)
        s1 = live & in2
        pts = jnp.stack([P + t[:, None] * PQ, Q], 1).reshape(-1, 3)
        val = jnp.stack([s0, s1], 1).reshape(-1)
        pos = jnp.where(val, jnp.cumsum(val) - 1, 2 * size)
        new = jnp.zeros_like(poly).at[pos].set(pts, mode="drop")
        use = e < kref
        return (jnp.where(use, new, poly),
                jnp.where(use, jnp.minimum(jnp.sum(val), size), cnt)), None

    (poly, cnt), _ = inline.scan(edge, (poly, kinc), jnp.arange(K))
    below = (slot < cnt) & (dot(poly - ref[0], nref) <= jnp.maximum(margin, 0.0))
    pos = jnp.where(below, jnp.cumsum(below) - 1, 2 * size)
    poly = jnp.zeros_like(poly).at[pos].set(poly, mode="drop")
    return poly, jnp.sum(below)


def _area4(a, b, c, d):
    """Area of the quadrilateral abcd (half its diagonals' cross product), the measure
    MuJoCo 4.0.0's polygonQuad maximises."""
    return 0.5 * safe_norm(cross(a - c, b - d))


def _polygon_quad(poly, n, tie=0.0):
    """Indices (4,) of the greedy maximum-area quadrilateral of polygon ``poly`` (n
    vertices, n > 4) as MuJoCo's polygonQuad walks it (index choice only: no gradient).
    A step is taken when it grows the area by more than ``tie`` (relative)."""
    p = jax.lax.stop_gradient(poly)
    nx = lambda i: jnp.where(i >= n - 1, 0, i + 1)
    ar = lambda a, b, c, d: _area4(p[a], p[b], p[c], p[d])

    def grow(a, b, c, d, m, which):
        def cond(s):
            b, c, d, m = s
            nb, nc = (nx(b), c) if which == "b" else (b, nx(c))
            return ar(a, nb, nc, d) > m * (1.0 + tie)

        def body(s):
            b, c, d, m = s
            b, c = (nx(b), c) if which == "b" else (b, nx(c))
            return b, c, d, ar(a, b, c, d)
        return inline.while_loop(cond, body, (b, c, d, m))

    def outer(a, st):
        b, c, d, m, res = st

        def cond(s):
            b, c, d, m, res = s
            return ar(a, b, c, nx(d)) > m * (1.0 + tie)

        def body(s):
            b, c, d, m, res = s
            d = nx(d)
            m = ar(a, b, c, d)
            b, c, d, m = grow(a, b, c, d, m, "c")
            b, c, d, m = grow(a, b, c, d, m, "b")
            return b, c, d, m, jnp.stack([a, b, c, d])
        b, c, d, m, res = inline.while_loop(cond, body, (b, c, d, m, res))
        bb = jnp.where(b == a, nx(b), b)
        cc = jnp.where((b == a) & (c == bb), nx(c), c)
        dd = jnp.where((b == a) & (c == bb) & (d == cc), nx(d), d)
        return bb, cc, dd, m, res

    i0 = jnp.asarray(0, jnp.int32)
    st = (i0 + 1, i0 + 2, i0 + 3, ar(0, 1, 2, 3), jnp.arange(4, dtype=jnp.int32))
    _, _, _, _, res = inline.fori_loop(0, n.astype(jnp.int32), outer, st)
    return res


def _farthest2(poly, n):
    """The two most distant points of the first n (first pair wins ties)."""
    P = poly.shape[0]
    dp = poly[:, None] - poly[None]
    d2 = dot(dp, dp)
    i, j = jnp.arange(P)[:, None], jnp.arange(P)[None]
    d2 = jnp.where((i < j) & (j < n), d2, -1.0)
    a, b = jnp.unravel_index(argmax(d2.reshape(-1)), d2.shape)
    return jnp.stack([a, b])


def _segments(a0, a1, b0, b1):
    """Closest points of segments a0a1 and b0b1."""
    u, v, w = a1 - a0, b1 - b0, a0 - b0
    uu, uv, vv, uw, vw = dot(u, u), dot(u, v), dot(v, v), dot(u, w), dot(v, w)
    den = uu * vv - uv * uv
    s = jnp.clip(jnp.where(den > 1e-30, (uv * vw - vv * uw) / jnp.where(den > 1e-30, den, 1),
                           0.0), 0, 1)
    t = jnp.clip((uv * s + vw) / jnp.where(vv > 1e-30, vv, 1), 0, 1)
    s = jnp.clip((uv * t - uw) / jnp.where(uu > 1e-30, uu, 1), 0, 1)
    return a0 + s * u, b0 + t * v


def poly_contacts(t1, g1, t2, g2, n, dist, margin):
    """Contacts of two polytopes (boxes, meshes) given the penetration normal ``n`` and
    signed distance ``dist``: MuJoCo's multicontact (face-face or edge-face: the
    incident feature clipped by the reference face, at most 4 points by polygonQuad),
    else the single EPA witness of the support features. Returns a Pre of 5 slots."""
    A, B = _polytope(t1, g1), _polytope(t2, g2)
    ia, da = _feature(A, n)
    ib, db = _feature(B, -n)
    fa, oka = _feature_faces(A, ia, da)
    fb, okb = _feature_faces(B, ib, db)
    na, nb = A[3][fa], B[3][fb]                                   # (D, 3)
    # MuJoCo takes the first qualifying pair in its polygon order; simjax the best
    # aligned (the same whenever one pair qualifies)
    cosf = na @ nb.T
    (i, j), ff = _first((cosf < -FACE_TOL) & oka[:, None] & okb[None], cosf)
    # edge of A lying in a face of B, or the other way round
    ea, enda, okea = _feature_edges(A, ia, da)
    eb, endb, okeb = _feature_edges(B, ib, db)
    cosa, cosb = jnp.abs(nb @ ea.T), jnp.abs(na @ eb.T)
    (jb, iea), ef = _first((cosa < EDGE_TOL) & okb[:, None] & okea[None], cosa)
    (ja, ieb), fe = _first((cosb < EDGE_TOL) & oka[:, None] & okeb[None], cosb)
    ef = ~ff & (da < 3) & (da <= db) & ef
    fe = ~ff & ~((da < 3) & (da <= db)) & (db < 3) & fe
    # MuJoCo 4.0 builds the patch whenever the pair is within the margin (points up to
    # the margin above the reference face kept)
    multi = (ff | ef | fe) & A[5] & B[5] & (dist < margin)

    def face(P, f):
        vw, fvert, fnum = P[0], P[1], P[2]
        return vw[jnp.maximum(fvert[f], 0)], fnum[f]

    # reference polygon: A's face (face-face, face-edge) or B's face (edge-face)
    fa_ref = jnp.where(ff, fa[i], fa[ja])
    ra, ka = face(A, fa_ref)
    rb, kb = face(B, fb[jb])
    K = max(ra.shape[0], rb.shape[0])
    pad = lambda x: jnp.concatenate([x, jnp.zeros((K - x.shape[0], 3), x.dtype)])
    ref = jnp.where(ef, pad(rb), pad(ra))
    kref = jnp.where(ef, kb, ka)
    nref = jnp.where(ef, B[3][fb[jb]], A[3][fa_ref])
    # incident polygon: B's face, A's edge or B's edge
    ib_face, kb_face = face(B, fb[j])
    L = max(ib_face.shape[0], 2)
    pad = lambda x: jnp.concatenate([x, jnp.zeros((L - x.shape[0], 3), x.dtype)])
    edge_a = jnp.stack([A[0][ia[0]], A[0][enda[iea]]])
    edge_b = jnp.stack([B[0][ib[0]], B[0][endb[ieb]]])
    inc = jnp.where(ff, pad(ib_face), jnp.where(ef, pad(edge_a), pad(edge_b)))
    kinc = jnp.where(ff, kb_face, 2)
    # witness direction: B's face normal (face-face), minus the reference normal
    wit = jnp.where(ff, nb[j], -nref)
    pts, cnt = _clip(ref, kref, nref, inc, kinc, K + L, margin)
    sel = jnp.where(cnt > 4, _polygon_quad(pts, cnt),
                    jnp.where((kinc == 2) & (cnt > 2),
                              jnp.concatenate([_farthest2(pts, cnt), jnp.zeros(2, jnp.int32)]),
                              jnp.arange(4)))
    nsel = jnp.where(cnt > 4, 4, jnp.where((kinc == 2) & (cnt > 2), 2, cnt))
    v = pts[sel]
    dd = dot(v - ref[0], nref)
    # witnesses (MuJoCo 4.0): the clipped point and its projection onto the reference
    # plane along the reference normal; the normal is minus the incident face's normal
    # (face-face) or the reference normal pointing from geom1 to geom2; the depth is
    # the witnesses' separation along the normal, the position geom1's witness moved
    # half of it along the normal
    proj = v - dd[:, None] * nref
    x1, x2 = jnp.where(ef, v, proj), jnp.where(ef, proj, v)
    mnrm = jnp.broadcast_to(jnp.where(ff, -wit, jnp.where(ef, -nref, nref)), v.shape)
    dd = dot(x2 - x1, mnrm)
    mpos = x1 + 0.5 * dd[:, None] * mnrm
    mvalid = multi & (cnt >= 1) & (jnp.arange(4) < nsel) & (jnp.min(
        jnp.where(jnp.arange(4) < nsel, dd, jnp.inf)) < margin)
    # single witness (EPA): vertex against anything, or the closest points of two edges
    a0, b0 = A[0][ia[0]], B[0][ib[0]]
    ca, cb = _segments(a0, A[0][ia[1]], b0, B[0][ib[1]])
    spos = jnp.where(da == 1, a0 + 0.5 * dist * n,
                     jnp.where(db == 1, b0 - 0.5 * dist * n, 0.5 * (ca + cb)))
    svalid = ~(multi & (cnt >= 1)) & (dist <= margin)
    return Pre(jnp.concatenate([dist[None], dd]), jnp.concatenate([spos[None], mpos]),
               jnp.concatenate([n[None], jnp.where(multi, mnrm, n)]),
               jnp.zeros((5, 3), n.dtype), jnp.concatenate([svalid[None], mvalid]))


def convex_convex(g1, g2, margin, t1=None, t2=None):
    """Convex-convex contact (see the module docstring). Returns 1 slot for curved
    pairs, 5 slots (at most 4 valid) for box/mesh pairs."""
    dirs, s = _candidates(t1, g1, t2, g2)
    k = argmax(s)
    n, sbest = dirs[k], s[k]
    poly = t1 in _POLY and t2 in _POLY
    if not poly:
        scale = jnp.maximum(jnp.max(g1.size) + jnp.max(g2.size), 1e-9)
        n, sbest = _refine(t1, g1, t2, g2, n, sbest, scale)
    dist, a, b = _sep(t1, g1, t2, g2, n)
    if poly:
        return poly_contacts(t1, g1, t2, g2, n, dist, margin)
    if (t1, t2) in _CYL_PATCH:
        from simjax.engine.collision.convex_cylinder import cylinder_contacts
        return cylinder_contacts(t1, g1, t2, g2, n, dist, margin)
    if t1 == GT.CAPSULE:
        a = _capsule_witness(g1, n, a, b)
    return _witness(t1, t2, n, dist, a, b, margin)


def _capsule_witness(g, n, a, b):
    """A capsule's witness: its support point ``a``, unless the normal is perpendicular
    to its axis (the capsule's side crossing the other geom: the whole surface line
    supports); then the point of that line nearest the other geom's support point
    ``b`` (where EPA's final face puts it)."""
    axis = g.mat[:, 2]
    flat = jnp.abs(dot(n, axis)) < np.sqrt(np.finfo(n.dtype).eps)
    t = jnp.clip(dot(b - g.pos, axis), -g.size[1], g.size[1])
    return jnp.where(flat, g.pos + t * axis + g.size[0] * n, a)


def _witness(t1, t2, n, dist, a, b, margin):
    """Single contact of a curved pair: the curved geom's (unique) support point moved
    half the distance along the normal."""
    pos = a + 0.5 * dist * n if t1 not in _POLY else b - 0.5 * dist * n
    return one(dist, pos, n, dist <= margin)


def _make(fn, t1, t2):
    f = functools.partial(fn, t1=t1, t2=t2) if fn is convex_convex else \
        functools.partial(fn, t2=t2)
    f.types = (t1, t2)
    return f


_TYPES = (GT.SPHERE, GT.CAPSULE, GT.ELLIPSOID, GT.CYLINDER, GT.BOX, GT.MESH)
CONVEX = {(a, b): _make(convex_convex, a, b) for a in _TYPES for b in _TYPES if a <= b}
# sphere-mesh: the exact point-to-hull distance (convex_sphere.py), not SAT + refinement
from simjax.engine.collision.convex_sphere import sphere_mesh as _sphere_mesh  # noqa: E402
CONVEX[(GT.SPHERE, GT.MESH)] = _sphere_mesh
PLANE = {t: _make(plane_convex, GT.PLANE, t) for t in (GT.ELLIPSOID, GT.MESH)}
#: plane against an SDF geom: MuJoCo 4.0 collides the plane with the SDF geom's mesh
#: (mjc_PlaneConvex on its convex hull), so the geom gets its mesh's hull data
PLANE_SDF = _make(plane_convex, GT.PLANE, GT.MESH)
#: cylinder and capsule pairs with contact patches (convex_cylinder.py)
_CYL_PATCH = ((GT.CYLINDER, GT.CYLINDER), (GT.CYLINDER, GT.BOX), (GT.CYLINDER, GT.MESH),
              (GT.CAPSULE, GT.CYLINDER), (GT.CAPSULE, GT.MESH))
MAXCON = {f: (4 if (k[0] in _POLY and k[1] in _POLY) or k in _CYL_PATCH else 1)
          for k, f in CONVEX.items()}
MAXCON.update({PLANE[GT.ELLIPSOID]: 1, PLANE[GT.MESH]: 4, PLANE_SDF: 4})
