"""Mesh and height-field assets against MuJoCo 4.0.0 (the ``mujoco`` package).

Corpus meshes are located with a tiny lxml reader below (includes, compiler dirs and
mesh defaults), so these tests do not depend on simjax's parser.
"""
from __future__ import annotations

import io
import os
import struct
import time

import numpy as np
import pytest
from lxml import etree

mujoco = pytest.importorskip("mujoco")

from simjax.errors import MJCFError  # noqa: E402
from simjax.mjcf import hfield as hf  # noqa: E402
from simjax.mjcf import mesh as ms  # noqa: E402

from mujoco_oracle import CORPUS  # noqa: E402  (../shared/corpus or SIMJAX_CORPUS)

MESH_MODELS = [
    "mjx_shadow_hand/scene_right.xml",
    "mjx_convex/convex.xml",
    "menagerie_trossen_wx250s/scene.xml",
    "mujoco_car/car.xml",
    "mjx_barkour_v0/assets/barkour_v0_mjx.xml",
]
HFIELD_MODELS = [
    "mjx_barkour_v0/assets/barkour_v0_mjx.xml",
    "mujoco_plugin_touch_grid/touch_grid.xml",
]


# ----------------------------------------------------------------------------------------
# a minimal MJCF reader for the mesh / hfield assets of a model


def _corpus(rel: str) -> str:
    path = os.path.normpath(os.path.join(CORPUS, rel))
    if not os.path.exists(path):
        pytest.skip(f"corpus model {rel} not found (expected shared/corpus beside the repo)")
    return path


def _splice_includes(root, base_dir):
    for inc in list(root.iter("include")):
        sub = etree.parse(os.path.join(base_dir, inc.get("file"))).getroot()
        _splice_includes(sub, base_dir)
        parent = inc.getparent()
        idx = parent.index(inc)
        for k, child in enumerate(list(sub)):
            parent.insert(idx + k, child)
        parent.remove(inc)


def _nums(text, dtype=float):
    return None if text is None else np.array(text.split(), dtype=dtype)


def _default_chain(root):
    """class name -> list of <default> elements from the outermost to that class."""
    chains = {}

    def walk(elem, chain):
        chain = chain + [elem]
        chains[elem.get("class", "main")] = chain
        for child in elem.findall("default"):
            walk(child, chain)

    for top in root.findall("default"):
        walk(top, [])
    return chains


def read_assets(path):
    """(compiler dict, [mesh attrs], [hfield attrs]) of an MJCF file."""
    root = etree.parse(path).getroot()
    _splice_includes(root, os.path.dirname(path))
    comp = {}
    for c in root.iter("compiler"):
        comp.update(c.attrib)
    chains = _default_chain(root)
    meshes, hfields = [], []
    for asset in root.iter("asset"):
        for el in asset:
            if el.tag == "mesh":
                attrs = {}
                for d in chains.get(el.get("class", "main"), []):
                    m = d.find("mesh")
                    if m is not None:
                        attrs.update(m.attrib)
                attrs.update(el.attrib)
                meshes.append(_mesh_attrs(attrs))
            elif el.tag == "hfield":
                a = dict(el.attrib)
                hfields.append({"name": a.get("name"), "file": a.get("file"),
                                "nrow": int(a.get("nrow", 0)), "ncol": int(a.get("ncol", 0)),
                                "elevation": _nums(a.get("elevation")),
                                "size": _nums(a.get("size"))})
    return comp, meshes, hfields


def _mesh_attrs(a):
    return {"name": a.get("name"), "file": a.get("file"), "vertex": _nums(a.get("vertex")),
            "face": _nums(a.get("face"), int), "scale": _nums(a.get("scale", "1 1 1")),
            "refpos": _nums(a.get("refpos", "0 0 0")),
            "refquat": _nums(a.get("refquat", "1 0 0 0")),
            "maxhullvert": int(a.get("maxhullvert", -1)),
            "inertia": a.get("inertia", "legacy"), "content_type": a.get("content_type")}


def _dirs(comp):
    meshdir = comp.get("meshdir", comp.get("assetdir"))
    return meshdir, comp.get("strippath", "false") == "true"


# ----------------------------------------------------------------------------------------
# comparison helpers


def _mesh_slice(m, i):
    va, vn = m.mesh_vertadr[i], m.mesh_vertnum[i]
    fa, fn = m.mesh_faceadr[i], m.mesh_facenum[i]
    return m.mesh_vert[va:va + vn].astype(np.float64), m.mesh_face[fa:fa + fn]


def _quat_mat(q):
    return np.array(ms.quat2mat(list(np.asarray(q, dtype=float)))).reshape(3, 3)


def _same_frame(ours, ref, tol=1e-6):
    """Vertices of the same mesh in two principal frames related by a symmetry rotation.

    When inertia eigenvalues repeat, the principal axes are not unique; then the two vertex
    sets must still match after the relative rotation of the mesh_quat's.
    """
    return np.allclose(ours, ref, atol=tol * max(1.0, np.abs(ref).max()), rtol=0)


def compare_mesh(data, m, i, exact_faces=True):
    vert, face = _mesh_slice(m, i)
    scale = max(1.0, float(np.abs(vert).max()))
    assert data.vert.shape == vert.shape, (data.name, data.vert.shape, vert.shape)
    assert data.face.shape == face.shape, (data.name, data.face.shape, face.shape)
    np.testing.assert_allclose(data.scale, m.mesh_scale[i], rtol=0, atol=0)
    np.testing.assert_allclose(data.pos, m.mesh_pos[i], rtol=1e-9, atol=1e-9 * scale)
    if exact_faces:
        np.testing.assert_array_equal(data.face, face)
    r_ours, r_ref = _quat_mat(data.quat), _quat_mat(m.mesh_quat[i])
    if np.allclose(r_ours, r_ref, atol=1e-6):
        np.testing.assert_allclose(data.vert, vert, rtol=0, atol=1e-6 * scale)
    else:
        # degenerate eigenvalues: same mesh, different (equally valid) principal axes
        back_ours = data.vert @ r_ours.T
        back_ref = vert @ r_ref.T
        np.testing.assert_allclose(back_ours, back_ref, rtol=0, atol=1e-5 * scale)


def _load_corpus_mesh(path, comp, attrs, m):
    meshdir, strip = _dirs(comp)
    name = attrs["name"] or ms._default_name(attrs["file"])
    mid = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_MESH, name)
    assert mid >= 0, name
    data = ms.load_mesh(attrs, os.path.dirname(path), meshdir, strip, None,
                        needs_hull=bool(m.mesh_graphadr[mid] >= 0))
    return data, mid


# ----------------------------------------------------------------------------------------
# corpus meshes


@pytest.mark.parametrize("rel", MESH_MODELS)
def test_corpus_meshes(rel):
    path = _corpus(rel)
    m = mujoco.MjModel.from_xml_path(path)
    comp, meshes, _ = read_assets(path)
    assert len(meshes) == m.nmesh
    exact_quat = 0
    for attrs in meshes:
        data, mid = _load_corpus_mesh(path, comp, attrs, m)
        compare_mesh(data, m, mid)
        exact_quat += np.allclose(data.quat, m.mesh_quat[mid], atol=1e-9)
        if m.mesh_graphadr[mid] >= 0:
            g = m.mesh_graph[m.mesh_graphadr[mid]:]
            nv, nf = g[0], g[1]
            assert (data.graph[0], data.graph[1]) == (nv, nf)
            np.testing.assert_array_equal(np.sort(data.hull_vertid), np.sort(g[2 + nv:2 + 2 * nv]))
            ours = data.graph[2 + 3 * nv + 3 * nf:2 + 3 * nv + 6 * nf]
            np.testing.assert_array_equal(ours, g[2 + 3 * nv + 3 * nf:2 + 3 * nv + 6 * nf])
        else:
            assert data.graph is None
    # the principal axes agree exactly except for meshes with repeated eigenvalues
    assert exact_quat >= m.nmesh - 2


def _geom_of_mesh(m, mid):
    for g in range(m.ngeom):
        if m.geom_dataid[g] == mid and m.geom_type[g] == mujoco.mjtGeom.mjGEOM_MESH:
            return g
    return -1


@pytest.mark.parametrize("rel", ["mjx_convex/convex.xml", "menagerie_trossen_wx250s/scene.xml"])
def test_corpus_geom_frames(rel):
    """geom_pos/quat/size of mesh geoms follow from the mesh frame (module docstring)."""
    path = _corpus(rel)
    m = mujoco.MjModel.from_xml_path(path)
    comp, meshes, _ = read_assets(path)
    root = etree.parse(path).getroot()
    _splice_includes(root, os.path.dirname(path))
    for attrs in meshes:
        data, mid = _load_corpus_mesh(path, comp, attrs, m)
        g = _geom_of_mesh(m, mid)
        if g < 0:
            continue
        size = np.maximum(np.abs(data.aamm[:3]), np.abs(data.aamm[3:]))
        np.testing.assert_allclose(size, m.geom_size[g], rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(data.aabb, m.geom_aabb[g], rtol=1e-12, atol=1e-15)


def test_shadow_hand_speed():
    path = _corpus("mjx_shadow_hand/scene_right.xml")
    comp, meshes, _ = read_assets(path)
    meshdir, strip = _dirs(comp)
    t0 = time.perf_counter()
    for attrs in meshes:
        ms.load_mesh(attrs, os.path.dirname(path), meshdir, strip, None, needs_hull=True)
    elapsed = time.perf_counter() - t0
    print(f"shadow hand: {len(meshes)} meshes in {elapsed:.3f}s")


@pytest.mark.parametrize("rel", HFIELD_MODELS)
def test_corpus_hfields(rel):
    path = _corpus(rel)
    m = mujoco.MjModel.from_xml_path(path)
    comp, _, hfields = read_assets(path)
    meshdir, strip = _dirs(comp)
    assert len(hfields) == m.nhfield >= 1
    for i, attrs in enumerate(hfields):
        data = hf.load_hfield(attrs, os.path.dirname(path), meshdir, strip, None)
        assert (data.nrow, data.ncol) == (m.hfield_nrow[i], m.hfield_ncol[i])
        np.testing.assert_array_equal(data.size, m.hfield_size[i])
        adr = m.hfield_adr[i]
        np.testing.assert_array_equal(data.data, m.hfield_data[adr:adr + data.nrow * data.ncol])


# ----------------------------------------------------------------------------------------
# small meshes compiled by both: inline vertices, transforms, inertia modes


def _fmt(arr):
    return " ".join(repr(float(x)) if isinstance(x, (float, np.floating)) else str(int(x))
                    for x in np.ravel(arr))


def _two_boxes():
    """Two disjoint axis-aligned boxes with outward faces: a non-convex solid."""
    import trimesh
    a = trimesh.creation.box(extents=[0.2, 0.1, 0.05])
    b = trimesh.creation.box(extents=[0.05, 0.1, 0.3])
    b.apply_translation([0.3, 0.05, 0.1])
    v = np.concatenate([a.vertices, b.vertices])
    f = np.concatenate([a.faces, b.faces + len(a.vertices)])
    return v.astype(np.float32).astype(np.float64), f


def _irregular_points(n=30, seed=3):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(n, 3)) * [0.1, 0.05, 0.2]).astype(np.float32).astype(np.float64)


def _compile_one(mesh_attrs: dict, geom_extra: str = "", tmp_path=None):
    """MuJoCo model with one mesh in one free body; returns (MjModel, our attrs)."""
    xml_attrs = " ".join(f'{k}="{v if isinstance(v, str) else _fmt(v)}"'
                         for k, v in mesh_attrs.items() if v is not None)
    xml = (f'<mujoco><asset><mesh name="m" {xml_attrs}/></asset><worldbody>'
           f'<body pos="0.1 0.2 0.3" euler="10 20 30"><freejoint/>'
           f'<geom type="mesh" mesh="m" {geom_extra}/></body></worldbody></mujoco>')
    if tmp_path is not None:
        path = tmp_path / "model.xml"
        path.write_text(xml)
        m = mujoco.MjModel.from_xml_path(str(path))
    else:
        m = mujoco.MjModel.from_xml_string(xml)
    attrs = {"name": "m", "scale": [1, 1, 1], "refpos": [0, 0, 0], "refquat": [1, 0, 0, 0],
             "maxhullvert": -1, "inertia": "legacy"}
    for k, v in mesh_attrs.items():
        if v is None:
            continue
        if k in ("vertex", "scale", "refpos", "refquat"):
            attrs[k] = np.asarray(v, dtype=float).ravel()
        elif k == "face":
            attrs[k] = np.asarray(v, dtype=int).ravel()
        elif k == "maxhullvert":
            attrs[k] = int(v)
        else:
            attrs[k] = v
    return m, attrs


def _mulquat(a, b):
    return np.array([a[0] * b[0] - a[1] * b[1] - a[2] * b[2] - a[3] * b[3],
                     a[0] * b[1] + a[1] * b[0] + a[2] * b[3] - a[3] * b[2],
                     a[0] * b[2] - a[1] * b[3] + a[2] * b[0] + a[3] * b[1],
                     a[0] * b[3] + a[1] * b[2] - a[2] * b[1] + a[3] * b[0]])


def _check_body(data, m, geom_pos=np.zeros(3), geom_quat=np.array([1.0, 0, 0, 0]),
                density=1000.0):
    """Body 1 holds only the mesh geom: mass, inertia tensor, COM, geom frame."""
    mass = density * data.volume
    inertia = ms.geom_mesh_inertia(data, mass)
    np.testing.assert_allclose(m.body_mass[1], mass, rtol=1e-12)
    gpos = geom_pos + _quat_mat(geom_quat) @ data.pos
    gquat = _mulquat(geom_quat, data.quat)
    np.testing.assert_allclose(m.geom_pos[0], gpos, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(_quat_mat(m.geom_quat[0]), _quat_mat(gquat), atol=1e-12)
    np.testing.assert_allclose(m.body_ipos[1], gpos, rtol=1e-12, atol=1e-14)
    full_ref = _quat_mat(m.body_iquat[1]) @ np.diag(m.body_inertia[1]) @ _quat_mat(
        m.body_iquat[1]).T
    full = _quat_mat(gquat) @ np.diag(inertia) @ _quat_mat(gquat).T
    np.testing.assert_allclose(full, full_ref, rtol=1e-10, atol=1e-12 * np.abs(full).max())
    size = np.maximum(np.abs(data.aamm[:3]), np.abs(data.aamm[3:]))
    np.testing.assert_allclose(m.geom_size[0], size, rtol=1e-12)


def test_inline_vertices_without_faces():
    v = _irregular_points()
    m, attrs = _compile_one({"vertex": v})
    data = ms.load_mesh(attrs, "", None, False, None, needs_hull=True)
    compare_mesh(data, m, 0)
    assert data.hull_face is not None and len(data.face) == len(data.hull_face)
    _check_body(data, m)


def test_inline_vertices_with_faces():
    v, f = _two_boxes()
    m, attrs = _compile_one({"vertex": v, "face": f})
    data = ms.load_mesh(attrs, "", None, False, None, needs_hull=True)
    compare_mesh(data, m, 0)
    _check_body(data, m)


@pytest.mark.parametrize("scale", [[-1, 1, 1], [0.5, -2, 1.5], [-1, -1, -1], [2, 3, 4]])
@pytest.mark.parametrize("with_faces", [True, False])
@pytest.mark.parametrize("inertia", ["legacy", "convex"])
def test_scale(scale, with_faces, inertia):
    v, f = _two_boxes()
    if not with_faces:
        v, f = _irregular_points(), None
    m, attrs = _compile_one({"vertex": v, "face": f, "scale": scale, "inertia": inertia})
    data = ms.load_mesh(attrs, "", None, False, None, needs_hull=True)
    compare_mesh(data, m, 0)
    _check_body(data, m)
    g = m.mesh_graph[m.mesh_graphadr[0]:]
    nv, nf = g[0], g[1]
    np.testing.assert_array_equal(data.graph[2 + 3 * nv + 3 * nf:2 + 3 * nv + 6 * nf],
                                  g[2 + 3 * nv + 3 * nf:2 + 3 * nv + 6 * nf])


def test_refpos_refquat_and_geom_frame():
    v, f = _two_boxes()
    m, attrs = _compile_one({"vertex": v, "face": f, "refpos": [0.1, -0.2, 0.05],
                             "refquat": [0.9, 0.1, -0.3, 0.2], "scale": [1.5, 1, 0.5]},
                            geom_extra='pos="0.3 -0.1 0.2" quat="0.5 0.5 -0.5 0.5"')
    data = ms.load_mesh(attrs, "", None, False, None, needs_hull=True)
    compare_mesh(data, m, 0)
    _check_body(data, m, geom_pos=np.array([0.3, -0.1, 0.2]),
                geom_quat=np.array([0.5, 0.5, -0.5, 0.5]))


@pytest.mark.parametrize("inertia", ["legacy", "convex", "exact", "shell"])
def test_inertia_modes(inertia):
    v, f = _two_boxes()
    m, attrs = _compile_one({"vertex": v, "face": f, "inertia": inertia},
                            geom_extra='density="700"')
    data = ms.load_mesh(attrs, "", None, False, None, needs_hull=True)
    compare_mesh(data, m, 0)
    _check_body(data, m, density=700.0)
    if inertia == "shell":
        assert data.volume == pytest.approx(2 * (0.02 + 0.01 + 0.005) + 2 * (0.005 + 0.03
                                                                            + 0.015))


def test_inertia_modes_differ():
    v, f = _two_boxes()
    vols = {}
    for mode in ("legacy", "convex", "exact", "shell"):
        _, attrs = _compile_one({"vertex": v, "face": f, "inertia": mode})
        vols[mode] = ms.load_mesh(attrs, "", None, False, None, needs_hull=False).volume
    assert vols["exact"] == pytest.approx(0.2 * 0.1 * 0.05 + 0.05 * 0.1 * 0.3)
    assert vols["convex"] > vols["exact"]
    assert len(set(vols.values())) == 4


def test_maxhullvert():
    v = _irregular_points(200, seed=9)
    m, attrs = _compile_one({"vertex": v, "maxhullvert": 12})
    data = ms.load_mesh(attrs, "", None, False, None, needs_hull=True)
    compare_mesh(data, m, 0)
    assert len(data.hull_vert) <= 12


def test_exact_inconsistent_orientation_is_an_error():
    v, f = _two_boxes()
    f = f.copy()
    f[0] = f[0, [0, 2, 1]]
    _, attrs = _compile_one({"vertex": v, "face": f, "inertia": "legacy"})
    attrs["inertia"] = "exact"
    with pytest.raises(ValueError, match="inconsistent orientation"):
        _compile_one({"vertex": v, "face": f, "inertia": "exact"})
    with pytest.raises(MJCFError, match="inconsistent orientation"):
        ms.load_mesh(attrs, "", None, False, None, needs_hull=False)


@pytest.mark.parametrize("points, message", [
    (np.zeros((5, 3)), "colocated"),
    (np.outer(np.arange(5.0), [1, 2, 3]), "collinear"),
    (np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0], [1, 1, 0], [2, 3, 0.0]]), "coplanar"),
    (np.zeros((3, 3)), "at least 4 vertices"),
])
def test_degenerate_meshes_are_errors(points, message):
    attrs = {"name": "bad", "vertex": points.ravel()}
    with pytest.raises(ValueError, match=message):
        _compile_one({"vertex": points})
    with pytest.raises(MJCFError, match=message):
        ms.load_mesh(attrs, "", None, False, None, needs_hull=True)


def test_hull_fields_are_consistent():
    v = _irregular_points(60)
    _, attrs = _compile_one({"vertex": v})
    data = ms.load_mesh(attrs, "", None, False, None, needs_hull=True)
    hv, hf_ = data.hull_vert, data.hull_face
    # outward normals: every hull vertex lies behind every face plane
    dist = np.einsum("fk,fvk->fv", data.hull_normal, hv[None] - hv[hf_[:, 0]][:, None])
    assert dist.max() < 1e-6
    nv = len(hv)
    g = data.graph
    assert g[0] == nv and g[1] == len(hf_)
    np.testing.assert_array_equal(g[2 + nv:2 + 2 * nv], data.hull_vertid)
    assert len(data.hull_edge) == 3 * len(hf_) // 2  # closed triangulated surface


# ----------------------------------------------------------------------------------------
# file formats and paths


def _stl_bytes(v, f, header=b"binary stl"):
    tri = v[f].astype("<f4")
    rec = np.zeros(len(f), dtype=[("n", "<f4", 3), ("v", "<f4", (3, 3)), ("a", "<u2")])
    rec["v"] = tri
    return header.ljust(80, b" ") + struct.pack("<i", len(f)) + rec.tobytes()


def _file_model(tmp_path, mesh_xml, compiler=""):
    xml = (f'<mujoco><compiler {compiler}/><asset>{mesh_xml}</asset><worldbody>'
           f'<body><freejoint/><geom type="mesh" mesh="m"/></body></worldbody></mujoco>')
    path = tmp_path / "model.xml"
    path.write_text(xml)
    return mujoco.MjModel.from_xml_path(str(path))


def _attrs(**kw):
    base = {"name": "m", "scale": np.ones(3), "refpos": np.zeros(3),
            "refquat": np.array([1.0, 0, 0, 0]), "maxhullvert": -1, "inertia": "legacy"}
    base.update(kw)
    return base


def test_stl_binary_meshdir_and_assets(tmp_path):
    v, f = _two_boxes()
    (tmp_path / "meshes").mkdir()
    data = _stl_bytes(v, f)
    (tmp_path / "meshes" / "boxes.stl").write_bytes(data)
    m = _file_model(tmp_path, '<mesh name="m" file="boxes.stl" scale="1 2 1"/>',
                    'meshdir="meshes"')
    attrs = _attrs(file="boxes.stl", scale=np.array([1.0, 2, 1]))
    ours = ms.load_mesh(attrs, str(tmp_path), "meshes", False, None, needs_hull=True)
    compare_mesh(ours, m, 0)
    assert len(ours.vert) == 16  # the STL repeats each corner; MuJoCo merges them
    # the same bytes from an assets dictionary, and strippath dropping a bogus directory
    from_assets = ms.load_mesh(_attrs(file="nowhere/boxes.stl", scale=np.array([1.0, 2, 1])),
                               "/nonexistent", None, True, {"boxes.stl": data},
                               needs_hull=True)
    np.testing.assert_array_equal(from_assets.vert, ours.vert)


def test_stl_merges_duplicates_in_order_of_first_appearance():
    """_decode_stl against a dictionary of float32 bit patterns: 300 triangles over 40
    distinct corners in scrambled order, 0.0 and -0.0 kept apart (different bits)."""
    rng = np.random.default_rng(3)
    cells = rng.permutation(343)[:40]                 # 40 distinct grid points
    corners = np.stack([cells // 49, cells // 7 % 7, cells % 7], 1).astype(np.float32) - 3
    corners[5] = [0.0, 9.0, 9.0]
    corners[6] = [-0.0, 9.0, 9.0]
    f = rng.integers(0, 40, (300, 3))
    f[0, 0], f[1, 1] = 6, 5
    vert, face = ms._decode_stl(_stl_bytes(corners, f), "t.stl")
    seen = {}
    for c in corners[f].reshape(-1, 3):
        seen.setdefault(c.tobytes(), len(seen))
    want = [seen[c.tobytes()] for c in corners[f].reshape(-1, 3)]
    np.testing.assert_array_equal(face.ravel(), want)
    expect = np.array([np.frombuffer(k, np.float32) for k in seen])
    np.testing.assert_array_equal(vert.view(np.uint32), expect.view(np.uint32))
    assert vert.dtype == np.float32 and len(vert) == len(np.unique(f)) == 40


def test_stl_ascii_is_rejected_like_mujoco(tmp_path):
    (tmp_path / "a.stl").write_text("solid a\nfacet normal 0 0 1\nouter loop\nvertex 0 0 0\n"
                                    "vertex 1 0 0\nvertex 0 1 0\nendloop\nendfacet\nendsolid a\n")
    with pytest.raises(ValueError, match="ASCII"):
        _file_model(tmp_path, '<mesh name="m" file="a.stl"/>')
    with pytest.raises(MJCFError, match="ASCII"):
        ms.load_mesh(_attrs(file="a.stl"), str(tmp_path), None, False, None, False)


OBJ_TEXT = """# test
mtllib nothing.mtl
o first
v 0 0 0 1 0 0
v 1 0 0
v 1 1 0
v 0 1 0
v 0 0 1
v 1 0 1
v 1 1 1
v 0 1 1
usemtl red
f 4 3 2 1
f 5 6 7 8
f 1 2 6 5
g second
f 2 3 7
f -6 -2 -1
usemtl blue
f 2 3 7 6
f 3 4 8 7
f 4 1 5 8
"""


def test_obj_quads_groups_and_negative_indices(tmp_path):
    (tmp_path / "cube.obj").write_text(OBJ_TEXT)
    m = _file_model(tmp_path, '<mesh name="m" file="cube.obj"/>')
    ours = ms.load_mesh(_attrs(file="cube.obj"), str(tmp_path), None, False, None, True)
    compare_mesh(ours, m, 0)
    assert len(ours.face) == 6  # only the first shape ('o first') gives faces


def test_obj_polygon_triangulation(tmp_path):
    # a concave pentagon prism side: tinyobjloader's ear clipping decides the triangles
    text = ("v 0 0 0\nv 2 0 0\nv 2 2 0\nv 1 0.5 0\nv 0 2 0\nv 1 1 1\n"
            "f 1 2 3 4 5\nf 1 2 6\nf 2 3 6\nf 3 4 6\nf 4 5 6\nf 5 1 6\n")
    (tmp_path / "p.obj").write_text(text)
    m = _file_model(tmp_path, '<mesh name="m" file="p.obj"/>')
    ours = ms.load_mesh(_attrs(file="p.obj"), str(tmp_path), None, False, None, True)
    compare_mesh(ours, m, 0)


@pytest.mark.parametrize("seed", range(4))
def test_obj_random_quads_and_polygons(tmp_path, seed):
    """Quads split along the shorter diagonal; larger polygons by ear clipping."""
    rng = np.random.default_rng(seed)
    nring = 6
    ang = np.sort(rng.uniform(0, 2 * np.pi, nring))
    radius = rng.uniform(0.5, 1, (nring, 1))
    ring = np.stack([np.cos(ang), np.sin(ang), np.zeros(nring)], 1) * radius
    top = ring + [0, 0, 1] + rng.normal(scale=0.05, size=ring.shape)
    v = np.concatenate([ring, top])
    lines = [f"v {x:.6f} {y:.6f} {z:.6f}" for x, y, z in v]
    lines.append("f " + " ".join(str(i + 1) for i in range(nring)[::-1]))
    lines.append("f " + " ".join(str(nring + i + 1) for i in range(nring)))
    for i in range(nring):
        j = (i + 1) % nring
        lines.append(f"f {i + 1} {j + 1} {nring + j + 1} {nring + i + 1}")
    (tmp_path / "r.obj").write_text("\n".join(lines) + "\n")
    m = _file_model(tmp_path, '<mesh name="m" file="r.obj"/>')
    ours = ms.load_mesh(_attrs(file="r.obj"), str(tmp_path), None, False, None, True)
    compare_mesh(ours, m, 0)


def test_msh_file(tmp_path):
    v, f = _two_boxes()
    blob = struct.pack("<4i", len(v), 0, 0, len(f)) + v.astype("<f4").tobytes() + \
        f.astype("<i4").tobytes()
    (tmp_path / "b.msh").write_bytes(blob)
    for scale in ("1 1 1", "-1 1 1"):
        m = _file_model(tmp_path, f'<mesh name="m" file="b.msh" scale="{scale}"/>')
        ours = ms.load_mesh(_attrs(file="b.msh", scale=np.array(scale.split(), float)),
                            str(tmp_path), None, False, None, True)
        compare_mesh(ours, m, 0)


def test_missing_file_names_the_mesh(tmp_path):
    with pytest.raises(MJCFError, match="gone.stl"):
        ms.load_mesh(_attrs(name="", file="gone.stl"), str(tmp_path), None, False, None, False)


def test_resolve_asset_path():
    assert ms.resolve_asset_path("a/b.stl", "meshes", False) == "meshes/a/b.stl"
    assert ms.resolve_asset_path("a/b.stl", "meshes/", True) == "meshes/b.stl"
    assert ms.resolve_asset_path("/abs/b.stl", "meshes", False) == "/abs/b.stl"
    assert ms.resolve_asset_path("b.stl", "../x/./y", False) == "../x/y/b.stl"
    assert ms.resolve_asset_path("b.stl", None, False) == "b.stl"


# ----------------------------------------------------------------------------------------
# height fields


def _hfield_model(tmp_path, hfield_xml):
    xml = (f'<mujoco><asset>{hfield_xml}</asset><worldbody><geom type="hfield" hfield="h"/>'
           f'</worldbody></mujoco>')
    path = tmp_path / "model.xml"
    path.write_text(xml)
    return mujoco.MjModel.from_xml_path(str(path))


def _compare_hfield(ours, m):
    assert (ours.nrow, ours.ncol) == (m.hfield_nrow[0], m.hfield_ncol[0])
    np.testing.assert_array_equal(ours.size, m.hfield_size[0])
    np.testing.assert_array_equal(ours.data, m.hfield_data[:ours.nrow * ours.ncol])


def test_hfield_inline_elevation(tmp_path):
    elev = np.array([[1, 2, 3, 9], [4, 5, 7, 0], [2, 2, 2, 2.5]])
    m = _hfield_model(tmp_path, f'<hfield name="h" nrow="3" ncol="4" elevation="{_fmt(elev)}" '
                                'size="1 2 0.5 0.1"/>')
    ours = hf.load_hfield({"name": "h", "nrow": 3, "ncol": 4, "elevation": elev.ravel(),
                           "size": np.array([1, 2, 0.5, 0.1])}, str(tmp_path), None, False, None)
    _compare_hfield(ours, m)


def test_hfield_flat_without_elevation(tmp_path):
    m = _hfield_model(tmp_path, '<hfield name="h" nrow="2" ncol="3" size="1 1 1 1"/>')
    ours = hf.load_hfield({"name": "h", "nrow": 2, "ncol": 3, "size": np.ones(4)},
                          str(tmp_path), None, False, None)
    _compare_hfield(ours, m)


def test_hfield_custom_binary(tmp_path):
    rng = np.random.default_rng(0)
    z = rng.normal(size=(5, 7)).astype("<f4")
    (tmp_path / "t.bin").write_bytes(struct.pack("<2i", 5, 7) + z.tobytes())
    m = _hfield_model(tmp_path, '<hfield name="h" file="t.bin" size="1 1 1 1"/>')
    ours = hf.load_hfield({"name": "h", "file": "t.bin", "size": np.ones(4)}, str(tmp_path),
                          None, False, None)
    _compare_hfield(ours, m)


@pytest.mark.parametrize("mode", ["L", "RGB", "RGBA", "P", "I;16"])
def test_hfield_png_modes(tmp_path, mode):
    from PIL import Image
    rng = np.random.default_rng(1)
    if mode == "I;16":
        img = Image.fromarray(rng.integers(0, 65535, size=(6, 9)).astype(np.uint16))
    elif mode == "P":
        img = Image.fromarray(rng.integers(0, 255, size=(6, 9, 3)).astype(np.uint8)).convert(
            "P", palette=Image.Palette.ADAPTIVE, colors=16)
    else:
        ch = {"L": 1, "RGB": 3, "RGBA": 4}[mode]
        arr = rng.integers(0, 255, size=(6, 9, ch)).astype(np.uint8)
        img = Image.fromarray(arr[..., 0] if ch == 1 else arr, mode)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    (tmp_path / "h.png").write_bytes(buf.getvalue())
    m = _hfield_model(tmp_path, '<hfield name="h" file="h.png" size="1 1 1 1"/>')
    ours = hf.load_hfield({"name": "h", "file": "h.png", "size": np.ones(4)}, str(tmp_path),
                          None, False, None)
    _compare_hfield(ours, m)


_TETRA_V = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1.0]])
_TETRA_F = np.array([[0, 2, 1], [0, 1, 3], [0, 3, 2], [1, 2, 3]])
_TETRA_CASES = {"good": _TETRA_F, "inverted": _TETRA_F[:, [0, 2, 1]],
                "oneflip": np.vstack([_TETRA_F[:3], _TETRA_F[3:, [0, 2, 1]]]),
                "open": _TETRA_F[:3]}


@pytest.mark.parametrize("case", sorted(_TETRA_CASES))
@pytest.mark.parametrize("inertia", ["legacy", "convex", "exact", "shell"])
def test_tetrahedron_orientations(case, inertia):
    """Misoriented and open meshes: same result or same error as MuJoCo."""
    f = _TETRA_CASES[case]
    attrs = _attrs(vertex=_TETRA_V.ravel(), face=f.ravel(), inertia=inertia)
    try:
        m, _ = _compile_one({"vertex": _TETRA_V, "face": f, "inertia": inertia})
    except ValueError as err:
        message = str(err).splitlines()[0].removeprefix("Error: ")
        with pytest.raises(MJCFError) as ours:
            ms.load_mesh(attrs, "", None, False, None, needs_hull=True)
        assert message in ours.value.message
        return
    data = ms.load_mesh(attrs, "", None, False, None, needs_hull=True)
    compare_mesh(data, m, 0)
    _check_body(data, m)


@pytest.mark.parametrize("gtype", ["sphere", "capsule", "cylinder", "ellipsoid", "box"])
@pytest.mark.parametrize("fitaabb", [False, True])
def test_fitted_primitives(gtype, fitaabb):
    v, f = _two_boxes()
    xml = (f'<mujoco><compiler fitaabb="{str(fitaabb).lower()}"/><asset>'
           f'<mesh name="m" vertex="{_fmt(v)}" face="{_fmt(f)}"/></asset><worldbody><body>'
           f'<freejoint/><geom type="{gtype}" mesh="m" fitscale="1.2" pos="0.1 0 0" '
           f'quat="0 1 0 0"/></body></worldbody></mujoco>')
    m = mujoco.MjModel.from_xml_string(xml)
    data = ms.load_mesh(_attrs(vertex=v.ravel(), face=f.ravel()), "", None, False, None, False)
    size, center = ms.fit_geom_size(data, gtype, fitaabb, 1.2)
    nsize = {"sphere": 1, "capsule": 2, "cylinder": 2}.get(gtype, 3)
    np.testing.assert_allclose(m.geom_size[0][:nsize], size[:nsize], rtol=1e-12)
    q = np.array([0.0, 1, 0, 0])
    pos = np.array([0.1, 0, 0]) + _quat_mat(q) @ (_quat_mat(data.quat) @ center + data.pos)
    np.testing.assert_allclose(m.geom_pos[0], pos, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(_quat_mat(m.geom_quat[0]), _quat_mat(_mulquat(q, data.quat)),
                               atol=1e-12)
