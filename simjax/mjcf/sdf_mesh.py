"""Meshing an SDF plugin's shape for a ``<mesh>`` asset (mjCMesh::LoadSDF).

As MuJoCo: the plugin's bounding box is sampled on a regular grid of about 300 points
along its three sizes together (n_i = floor(300 size_i / sum(size)) + 1), the static
distance is evaluated at every grid point (stored in float32), and the zero level set
is extracted by marching cubes with the cube/edge conventions and triangle table of the
public-domain MarchingCubeCpp library MuJoCo uses, so that vertices, faces and their
order are MuJoCo's. The mesh is then processed like any mesh, except that it is not
moved to its centre of mass nor rotated to its principal axes (mesh_pos = 0,
mesh_quat = identity), as MuJoCo does for generated meshes.
"""
from __future__ import annotations

import numpy as np

from simjax.errors import MJCFError

#: triangle table of MarchingCubeCpp (public domain, after github.com/nsf/mc): for each
#: of the 256 corner sign configurations, the low 4 bits give the triangle count and
#: each following 4-bit group an edge index (0-3 x edges, 4-7 y edges, 8-11 z edges)
_TRIS = np.array([
    0, 33793, 36945, 159668546, 18961, 144771090, 5851666, 595283255635, 20913, 67640146,
    193993474, 655980856339, 88782242, 736732689667, 797430812739, 194554754, 26657,
    104867330, 136709522, 298069416227, 109224258, 8877909667, 318136408323,
    1567994331701604, 189884450, 350847647843, 559958167731, 3256298596865604,
    447393122899, 651646838401572, 2538311371089956, 737032694307, 29329, 43484162,
    91358498, 374810899075, 158485010, 178117478419, 88675058979, 433581536604804,
    158486962, 649105605635, 4866906995, 3220959471609924, 649165714851, 3184943915608436,
    570691368417972, 595804498035, 124295042, 431498018963, 508238522371, 91518530,
    318240155763, 291789778348404, 1830001131721892, 375363605923, 777781811075,
    1136111028516116, 3097834205243396, 508001629971, 2663607373704004, 680242583802939237,
    333380770766129845, 179746658, 42545, 138437538, 93365810, 713842853011, 73602098,
    69575510115, 23964357683, 868078761575828, 28681778, 713778574611, 250912709379,
    2323825233181284, 302080811955, 3184439127991172, 1694042660682596, 796909779811,
    176306722, 150327278147, 619854856867, 1005252473234484, 211025400963, 36712706,
    360743481544788, 150627258963, 117482600995, 1024968212107700, 2535169275963444,
    4734473194086550421, 628107696687956, 9399128243, 5198438490361643573, 194220594,
    104474994, 566996932387, 427920028243, 2014821863433780, 492093858627, 147361150235284,
    2005882975110676, 9671606099636618005, 777701008947, 3185463219618820, 482784926917540,
    2900953068249785909, 1754182023747364, 4274848857537943333, 13198752741767688709,
    2015093490989156, 591272318771, 2659758091419812, 1531044293118596, 298306479155,
    408509245114388, 210504348563, 9248164405801223541, 91321106, 2660352816454484,
    680170263324308757, 8333659837799955077, 482966828984116, 4274926723105633605,
    3184439197724820, 192104450, 15217, 45937, 129205250, 129208402, 529245952323,
    169097138, 770695537027, 382310500883, 2838550742137652, 122763026, 277045793139,
    81608128403, 1991870397907988, 362778151475, 2059003085103236, 2132572377842852,
    655681091891, 58419234, 239280858627, 529092143139, 1568257451898804, 447235128115,
    679678845236084, 2167161349491220, 1554184567314086709, 165479003923, 1428768988226596,
    977710670185060, 10550024711307499077, 1305410032576132, 11779770265620358997,
    333446212255967269, 978168444447012, 162736434, 35596216627, 138295313843,
    891861543990356, 692616541075, 3151866750863876, 100103641866564, 6572336607016932133,
    215036012883, 726936420696196, 52433666, 82160664963, 2588613720361524,
    5802089162353039525, 214799000387, 144876322, 668013605731, 110616894681956,
    1601657732871812, 430945547955, 3156382366321172, 7644494644932993285,
    3928124806469601813, 3155990846772900, 339991010498708, 10743689387941597493,
    5103845475, 105070898, 3928064910068824213, 156265010, 1305138421793636, 27185,
    195459938, 567044449971, 382447549283, 2175279159592324, 443529919251, 195059004769796,
    2165424908404116, 1554158691063110021, 504228368803, 1436350466655236, 27584723588724,
    1900945754488837749, 122971970, 443829749251, 302601798803, 108558722, 724700725875,
    43570095105972, 2295263717447940, 2860446751369014181, 2165106202149444, 69275726195,
    2860543885641537797, 2165106320445780, 2280890014640004, 11820349930268368933,
    8721082628082003989, 127050770, 503707084675, 122834978, 2538193642857604, 10129,
    801441490467, 2923200302876740, 1443359556281892, 2901063790822564949,
    2728339631923524, 7103874718248233397, 12775311047932294245, 95520290,
    2623783208098404, 1900908618382410757, 137742672547, 2323440239468964, 362478212387,
    727199575803140, 73425410, 34337, 163101314, 668566030659, 801204361987, 73030562,
    591509145619, 162574594, 100608342969108, 5553, 724147968595, 1436604830452292,
    176259090, 42001, 143955266, 2385, 18433, 0,
], dtype=np.uint64)

# corners of a cube (x, y, z offsets); bit i of the configuration is corner i < 0
_CORNERS = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0], [1, 1, 0],
                     [0, 0, 1], [1, 0, 1], [0, 1, 1], [1, 1, 1]])
# the 12 cube edges: (axis, offset of the edge origin); index = table edge number
_EDGES = [(0, (0, 0, 0)), (0, (0, 1, 0)), (0, (0, 0, 1)), (0, (0, 1, 1)),
          (1, (0, 0, 0)), (1, (1, 0, 0)), (1, (0, 0, 1)), (1, (1, 0, 1)),
          (2, (0, 0, 0)), (2, (1, 0, 0)), (2, (0, 1, 0)), (2, (1, 1, 0))]
# order in which a cube creates the vertices of its edges, with the cube-position
# condition under which it is the cube that creates them (x0: x == 0, ...)
_EMIT = [(0, ("y0", "z0")), (1, ("z0",)), (2, ("y0",)), (3, ()),
         (4, ("x0", "z0")), (5, ("z0",)), (6, ("x0",)), (7, ()),
         (8, ("x0", "y0")), (9, ("y0",)), (10, ("x0",)), (11, ())]


def marching_cubes(field: np.ndarray):
    """Zero level set of ``field`` (nz, ny, nx) float32 (value at grid point x, y, z).

    Returns ``vert`` (nv, 3) float32 in grid units (x, y, z) and ``face`` (nf, 3) int,
    in MarchingCubeCpp's order (cubes z-major, then y, then x; within a cube its new
    edge vertices in _EMIT order; triangles in table order).
    """
    f = np.asarray(field, np.float32)
    nz, ny, nx = f.shape
    neg = f < 0
    cfg = np.zeros((nz - 1, ny - 1, nx - 1), np.int64)
    for bit, (dx, dy, dz) in enumerate(_CORNERS):
        cfg |= neg[dz:nz - 1 + dz, dy:ny - 1 + dy, dx:nx - 1 + dx].astype(np.int64) << bit
    active = (cfg != 0) & (cfg != 255)
    cz, cy, cx = np.nonzero(active)              # lexicographic: z, then y, then x
    ccfg = cfg[cz, cy, cx]
    ncube = len(cz)
    cond = {"x0": cx == 0, "y0": cy == 0, "z0": cz == 0}

    # global edge id = axis * (nz*ny*nx) + flat index of the edge origin
    npt = nx * ny * nz

    def edge_id(e):
        axis, (dx, dy, dz) = _EDGES[e]
        return axis * npt + ((cz + dz) * ny + (cy + dy)) * nx + (cx + dx)

    def crossing(e):
        axis, (dx, dy, dz) = _EDGES[e]
        a = f[cz + dz, cy + dy, cx + dx]
        step = np.eye(3, dtype=int)[axis]
        b = f[cz + dz + step[2], cy + dy + step[1], cx + dx + step[0]]
        return a, b, (a < 0) != (b < 0)

    emit = np.zeros((ncube, 12), bool)
    ids = np.zeros((ncube, 12), np.int64)
    pos = np.zeros((ncube, 12, 3), np.float32)
    for slot, (e, conds) in enumerate(_EMIT):
        a, b, change = crossing(e)
        ok = change.copy()
        for c in conds:
            ok &= cond[c]
        emit[:, slot] = ok
        ids[:, slot] = edge_id(e)
        axis, (dx, dy, dz) = _EDGES[e]
        p = np.stack([cx + dx, cy + dy, cz + dz], axis=1).astype(np.float32)
        with np.errstate(divide="ignore", invalid="ignore"):
            t = (a / (a - b)).astype(np.float32)
        p[:, axis] = (p[:, axis] + t).astype(np.float32)
        pos[:, slot] = p
    order = emit.ravel()
    vert = pos.reshape(-1, 3)[order]
    vid = np.full(3 * npt, -1, np.int64)
    vid[ids.ravel()[order]] = np.arange(int(order.sum()))

    # triangles: edge numbers from the packed table
    entry = _TRIS[ccfg]
    ntri = (entry & np.uint64(0xF)).astype(np.int64)
    cube_edge = np.stack([edge_id(e) for e in range(12)], axis=1)       # (ncube, 12)
    maxidx = 15
    shifts = np.uint64(4) * (np.arange(maxidx, dtype=np.uint64) + np.uint64(1))
    nib = ((entry[:, None] >> shifts[None, :]) & np.uint64(0xF)).astype(np.int64)
    nidx = 3 * ntri
    keep = np.arange(maxidx)[None, :] < nidx[:, None]
    rows = np.repeat(np.arange(ncube), nidx)
    edges = nib[keep]
    face = vid[cube_edge[rows, edges]].reshape(-1, 3)
    if np.any(face < 0):
        raise MJCFError("marching cubes produced an edge without a vertex")
    return vert, face


def load_sdf_mesh(el, attrs, plugins, mesh_id, needs_hull):
    """MeshData of a <mesh> backed by an SDF plugin instance (its <plugin> child)."""
    from simjax.mjcf import mesh as ms
    ch = plugins.plugin_child(el)
    iid = plugins.resolve(ch, "mesh", mesh_id)
    impl = plugins.instances[iid].impl
    name = attrs.get("name") or ""
    scale = attrs.get("scale")
    if scale is not None and np.any(np.asarray(scale, float) != 1):
        raise el.error(f"attribute scale is not compatible with SDFs in mesh '{name}'")
    if impl.sdf_staticdistance is None:
        raise el.error(f"plugin '{impl.name}' has no static distance to mesh '{name}'")
    spec = plugins.instance_spec(iid)
    aabb = np.asarray(plugins._call(iid, impl.sdf_aabb, spec), np.float64)
    total = aabb[3] + aabb[4] + aabb[5]
    n = [int(np.floor(300.0 / total * aabb[3 + i])) + 1 for i in range(3)]
    axes = [aabb[i] - aabb[3 + i] + 2 * aabb[3 + i] * np.arange(n[i]) / (n[i] - 1)
            for i in range(3)]
    z, y, x = np.meshgrid(axes[2], axes[1], axes[0], indexing="ij")
    pts = np.stack([x, y, z], axis=-1).reshape(-1, 3)
    dist = plugins._call(iid, impl.sdf_staticdistance, spec, pts)
    field = np.asarray(dist, np.float64).astype(np.float32).reshape(n[2], n[1], n[0])
    grid, face = marching_cubes(field)
    g = grid.astype(np.float64)
    vert = np.empty_like(g)
    for i in range(3):
        vert[:, i] = 2 * aabb[3 + i] * g[:, i] / (n[i] - 1) + aabb[i] - aabb[3 + i]
    vert = vert.astype(np.float32)
    a = dict(attrs)
    for key in ("file", "vertex", "face", "normal", "texcoord", "refpos", "refquat"):
        a.pop(key, None)
    try:
        return ms.process_generated(name, vert, face, a, needs_hull)
    except MJCFError as e:
        raise el.error(e.message) from None
