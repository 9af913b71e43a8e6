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

CORPUS = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "corpus")

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
