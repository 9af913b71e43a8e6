"""Mesh assets: decoding (STL, OBJ, MSH, inline) and MuJoCo's mesh processing.

numpy/scipy only. The processing follows MuJoCo 4.0's ``mjCMesh`` (user_mesh.cc):
decode vertices as float32, build the convex hull with qhull on the raw vertices, swap
the winding of faces and hull for left-handed scales, apply refpos / refquat / scale,
compute the volume (or surface area), centre of mass and inertia, then move the vertices
into the principal frame (``mesh_pos`` = centre of mass, ``mesh_quat`` = principal axes).

Sums are accumulated sequentially in MuJoCo's order (``np.cumsum``, not the pairwise
``np.sum``) and every per-face term is evaluated with the same operation order as the C++
code, and the eigen-solver is MuJoCo's quaternion Jacobi with the tolerances of 4.0, so
vertices, faces, mesh_pos and mesh_quat agree with mujoco 4.0.0 bit for bit on the corpus.
That matters for nearly symmetric meshes, whose principal axes hinge on rounding.

For the compiler: a mesh geom's frame absorbs the mesh frame (``mjCGeom::Compile``,
verified against mujoco 4.0.0)::

    geom_pos  = pos + R(quat) @ mesh.pos     # R = rotation matrix of the geom quat
    geom_quat = quat * mesh.quat              # quaternion product (mjuu_frameaccum)
    geom_size = max(|mesh.aamm[:3]|, |mesh.aamm[3:]|)   # per axis
    geom_aabb = mesh.aabb

A primitive geom fitted to a mesh uses :func:`fit_geom_size` and the same frame update,
with the offset ``R(mesh.quat) @ center`` added to ``mesh.pos`` first (``fitaabb``).
A mesh geom's mass is ``density * mesh.volume`` and its diagonal inertia is
:func:`geom_mesh_inertia` (``mjCGeom::SetInertia``).
"""
from __future__ import annotations

import dataclasses
import math
import os
import re

import numpy as np

from simjax import resources
from simjax.mjcf import bvh, mesh_builtin
from simjax.errors import MJCFError, UnsupportedFeatureError

_MINVAL = 1e-15       # mjMINVAL
_MJEPS = 1e-14        # mjEPS of the compiler (user_util.h)
# MuJoCo 4.0 diagonalises mesh inertia with a looser relative tolerance than other
# inertias: iteration stop and eigenvalue sort at 1e-7 max|I| (matched on 42 corpus meshes)
MESH_EIG_TOL = 1e-7
_STL_MAXFACE = 200000  # the STL decoder's limit

_CONTENT_TYPES = {".stl": "model/stl", ".obj": "model/obj", ".msh": "model/vnd.mujoco.msh",
                  ".ply": "model/ply"}


@dataclasses.dataclass
class MeshData:
    """A compiled mesh, as MuJoCo stores it in mjModel.

    Shapes: ``vert`` (nvert, 3) float64 holding float32 values (mesh_vert);
    ``face`` (nface, 3) int32 (mesh_face); ``pos`` (3,) mesh_pos, the centre of mass of
    the vertices after refpos/refquat/scale; ``quat`` (4,) mesh_quat, the principal axes
    (w first); ``scale`` (3,) mesh_scale. ``volume``: volume [m^3], or surface area
    [m^2] for ``inertia="shell"``, used for the geom mass. ``inertia_box`` (3,):
    half-sizes of the box with the same inertia (mjCMesh::boxsz_).
    ``unit_inertia`` (3,): principal inertia at density 1. ``aabb`` (6,): centre and
    half-size of the processed vertices; ``aamm`` (6,): their exact min xyz then max xyz
    (both in double before the float32 rounding, as MuJoCo's aamm_; geom_size of a mesh
    geom is ``max(|aamm[:3]|, |aamm[3:]|)``).

    Convex hull (``None`` unless needed for collision, ``inertia="convex"`` or a mesh
    without faces): ``hull_vert`` (nhv, 3) processed coordinates of the hull vertices,
    ``hull_face`` (nhf, 3) outward-wound triangles in hull-local indices,
    ``hull_vertid`` (nhv,) mesh vertex index of each hull vertex, ``hull_normal``
    (nhf, 3) unit outward normals, ``hull_edge`` (ne, 2) undirected edges (local ids),
    ``graph`` int32 in mjModel.mesh_graph layout (numvert, numface, vert_edgeadr,
    vert_globalid, edge_localid with -1 separators, face_globalid). The hull faces and
    their order equal MuJoCo's; the order of hull vertices and of each vertex's
    neighbours in ``graph`` is ascending (MuJoCo uses qhull's internal order).

    ``bvh``: the faces' bounding volume hierarchy (:class:`simjax.mjcf.bvh.Tree`, built
    from the processed vertices in double precision, as mjCMesh does).

    ``frame`` (nvert, 9): for meshes with three normals per vertex (the builtin wedge
    and plate, or a ``normal`` attribute of 9 nvert numbers), each vertex's normal and
    two tangents as MuJoCo stores them in mesh_normal (float32 values, in the processed
    frame: transformed, normalised and rotated as the vertices); None otherwise.
    """

    vert: np.ndarray
    face: np.ndarray
    pos: np.ndarray
    quat: np.ndarray
    scale: np.ndarray
    volume: float
    inertia_box: np.ndarray
    unit_inertia: np.ndarray
    aabb: np.ndarray
    hull_vert: np.ndarray | None = None
    hull_face: np.ndarray | None = None
    name: str = ""
    inertia: str = "legacy"
    hull_vertid: np.ndarray | None = None
    hull_normal: np.ndarray | None = None
    hull_edge: np.ndarray | None = None
    graph: np.ndarray | None = None
    aamm: np.ndarray | None = None
    bvh: object = None
    frame: np.ndarray | None = None


# ----------------------------------------------------------------------------------------
# public entry points


def load_mesh(attrs: dict, model_dir: str, meshdir: str | None, strippath: bool,
              assets: dict | None, needs_hull: bool) -> MeshData:
    """Decode and process one ``<mesh>`` asset (mjCMesh::TryCompile + Process).

    ``attrs``: the element's resolved attributes (name, file, vertex, face, normal,
    scale, refpos, refquat, maxhullvert, inertia, content_type, builtin, params).
    ``needs_hull``: a geom uses the mesh for collision (type mesh/sdf with contype or
    conaffinity nonzero, or in an explicit pair). Raises MJCFError naming the mesh.
    """
    file = attrs.get("file") or None
    name = attrs.get("name") or (_default_name(file) if file else "")
    label = f"mesh '{name}'" + (f" (file '{file}')" if file else "")
    try:
        return _load(attrs, name, file, model_dir, meshdir, strippath, assets, needs_hull)
    except UnsupportedFeatureError:
        raise
    except MJCFError as err:
        raise MJCFError(f"{label}: {err.message}") from None


def resolve_asset_path(file: str, asset_dir: str | None, strippath: bool) -> str:
    """Name of an asset file to hand to :func:`simjax.resources.read` (digest "Asset paths").

    strippath drops the directories of ``file``; an absolute ``file`` (or one with a
    resource-provider scheme) is used as is; otherwise ``asset_dir`` (meshdir) is
    prefixed. A still-relative result is read relative to the model directory.
    """
    if strippath:
        file = _strip_path(file)
    if _is_absolute(file) or not asset_dir:
        return file if _is_absolute(file) else _path_reduce(file)
    sep = "" if asset_dir.endswith(("/", "\\")) else "/"
    return _path_reduce(asset_dir + sep + file)


def read_asset(file: str, model_dir: str | None, asset_dir: str | None, strippath: bool,
               assets: dict | None) -> bytes:
    """Bytes of an asset file named in the model (path rules of resolve_asset_path)."""
    name = resolve_asset_path(file, asset_dir, strippath)
    return resources.read(name, assets, model_dir or None)


def geom_mesh_inertia(mesh: MeshData, mass: float) -> np.ndarray:
    """(3,) diagonal inertia of a mesh geom of ``mass`` (mjCGeom::SetInertia).

    The compiler computes ``mass = density * mesh.volume`` (or takes the geom's mass);
    the inertia comes from the equivalent inertia box, exactly as MuJoCo does.
    """
    b = mesh.inertia_box
    return np.array([mass * (b[1] * b[1] + b[2] * b[2]) / 3,
                     mass * (b[0] * b[0] + b[2] * b[2]) / 3,
                     mass * (b[0] * b[0] + b[1] * b[1]) / 3])


def fit_geom_size(mesh: MeshData, geom_type: str, fitaabb: bool, fitscale: float = 1.0):
    """Size of a primitive fitted to a mesh (mjCMesh::FitGeom) -> (size (3,), center (3,)).

    ``geom_type``: sphere, capsule, cylinder, ellipsoid or box. ``center`` is the offset of
    the fitted primitive in the mesh frame (zero unless ``fitaabb``); the compiler adds
    ``R(mesh.quat) @ center`` to ``mesh.pos`` before absorbing the mesh frame.
    """
    size = np.zeros(3)
    center = np.zeros(3)
    if not fitaabb:
        b = mesh.inertia_box
        if geom_type == "sphere":
            size[0] = (b[0] + b[1] + b[2]) / 3
        elif geom_type == "capsule":
            size[0] = (b[0] + b[1]) / 2
            size[1] = max(0.0, b[2] - size[0] / 2)
        elif geom_type == "cylinder":
            size[0] = (b[0] + b[1]) / 2
            size[1] = b[2]
        elif geom_type in ("ellipsoid", "box"):
            size[:] = b
        else:
            raise MJCFError(f"invalid geom type in fitting mesh {mesh.name}")
    else:
        lo, hi = mesh.aamm[:3], mesh.aamm[3:]
        center = (lo + hi) / 2
        half = hi - center
        if geom_type == "sphere":
            size[0] = max(max(half[0], half[1]), half[2])
        elif geom_type in ("capsule", "cylinder"):
            size[0] = max(half[0], half[1])
            size[1] = half[2]
            if geom_type == "capsule":  # the curved cap already covers part of the height
                size[1] -= size[0]
        elif geom_type in ("ellipsoid", "box"):
            size[:] = half
        else:
            raise MJCFError(f"invalid fittype in mesh {mesh.name}")
    return size * fitscale, center


# ----------------------------------------------------------------------------------------
# loading


def _load(attrs, name, file, model_dir, meshdir, strippath, assets, needs_hull) -> MeshData:
    if attrs.get("plugin"):
        raise UnsupportedFeatureError(f"mesh plugin (mesh '{name}')")
    scale = _vec(attrs.get("scale"), [1.0, 1.0, 1.0])
    spec_vert = attrs.get("vertex")
    spec_face = attrs.get("face")
    spec_vert = None if spec_vert is None or len(spec_vert) == 0 else \
        np.asarray(spec_vert, dtype=np.float64).ravel()
    spec_face = None if spec_face is None or len(spec_face) == 0 else \
        np.asarray(spec_face, dtype=np.int64).ravel()

    inertia = attrs.get("inertia") or "legacy"
    builtin = attrs.get("builtin") or "none"
    if builtin != "none":
        # made from params in the reader, before the compiler (mjs_makeMesh); the plate
        # is a shell whatever the attribute says
        vert, face, forced, normal = mesh_builtin.make(builtin, attrs.get("params"))
        inertia = forced or inertia
    elif file:
        vert, face = _decode_file(file, attrs.get("content_type") or "", model_dir, meshdir,
                                  strippath, assets, scale)
        if spec_vert is not None:
            raise MJCFError("repeated vertex specification")
        if face is not None and len(face) and spec_face is not None:
            raise MJCFError("repeated face specification")
        if face is None or len(face) == 0:
            face = _check_faces(spec_face)
    else:
        vert = _inline_vertices(spec_vert)
        face = _check_faces(spec_face)
    if builtin == "none":
        normal = attrs.get("normal")
        normal = None if normal is None else np.asarray(normal, np.float32).reshape(-1)
        # only tangent frames (three normals per vertex) are kept: tactile sensors
        normal = normal.reshape(-1, 3) if normal is not None and \
            len(normal) == 9 * len(vert) else None

    _check_initial(vert, face)
    if inertia not in ("legacy", "convex", "exact", "shell"):
        raise MJCFError(f"invalid mesh inertia type '{inertia}'")
    maxhullvert = int(attrs.get("maxhullvert", -1) if attrs.get("maxhullvert") is not None
                      else -1)
    if maxhullvert != -1 and maxhullvert < 4:
        raise MJCFError("maxhullvert must be larger than 3")
    refquat = _vec(attrs.get("refquat"), [1.0, 0.0, 0.0, 0.0])
    data = _process(name, vert, face, scale, _vec(attrs.get("refpos"), [0.0, 0.0, 0.0]),
                    refquat, inertia, maxhullvert, needs_hull or inertia == "convex")
    if normal is not None:
        data.frame = _process_normals(normal, refquat, scale, data.quat).reshape(-1, 9)
    return data


def _process_normals(normal, refquat, scale, quat) -> np.ndarray:
    """User normals (k, 3) float32 as MuJoCo stores them: refquat's inverse rotation,
    division by the scale (normals are covectors), float normalisation
    (ApplyTransformations), then the rotation into the principal frame (Rotate); each
    step rounded to float32 as mjCMesh's float normals. Returns (k, 3) float64."""
    f32 = np.float32
    n = normal.astype(f32)
    if not (refquat[0] == 1 and refquat[1] == 0 and refquat[2] == 0 and refquat[3] == 0):
        mat = quat2mat(_normvec(list(refquat)))
        n = _mulmat_rows([mat[0], mat[3], mat[6], mat[1], mat[4], mat[7],
                          mat[2], mat[5], mat[8]], n.astype(np.float64)).astype(f32)
    if np.any(scale != 1):
        n = (n.astype(np.float64) / scale).astype(f32)
    length = n[:, 0] * n[:, 0] + n[:, 1] * n[:, 1] + n[:, 2] * n[:, 2]
    ok = length.astype(np.float64) > _MINVAL
    scl = f32(1) / np.sqrt(np.where(ok, length, f32(1)))
    n = np.where(ok[:, None], n * scl[:, None], np.array([0, 0, 1], f32))
    rot = quat2mat([quat[0], -quat[1], -quat[2], -quat[3]])
    return _mulmat_rows(rot, n.astype(np.float64)).astype(f32).astype(np.float64)


def _vec(value, default) -> np.ndarray:
    if value is None:
        return np.array(default, dtype=np.float64)
    arr = np.asarray(value, dtype=np.float64).ravel()
    if arr.size != len(default):
        raise MJCFError(f"expected {len(default)} numbers, got {arr.size}")
    return arr


def _default_name(file: str) -> str:
    base = _strip_path(file)
    dot = base.rfind(".")
    return base if dot < 0 else base[:dot]


def _strip_path(file: str) -> str:
    cut = max(file.rfind("/"), file.rfind("\\"))
    return file[cut + 1:]


def _is_absolute(path: str) -> bool:
    # MuJoCo's FilePath::AbsPrefix: a provider scheme, a leading separator, or "X:/".
    if resources.scheme_of(path) is not None:
        return True
    return path[:1] in ("/", "\\") or ":/" in path or ":\\" in path


def _path_reduce(path: str) -> str:
    """Collapse '.' and 'dir/..' components (FilePath::PathReduce)."""
    parts = re.split(r"[/\\]", path)
    out: list[str] = []
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if not last and part == ".":
            continue
        if not last and part == ".." and out and out[-1] != "..":
            out.pop()
            continue
        out.append(part)
    return "/".join(out)


def _content_type(file: str, content_type: str) -> str:
    if not content_type and file[:5].lower() == "data:":
        content_type = resources.data_uri_mediatype(file)   # RFC 2397 media type
    if content_type:
        return content_type.split(";")[0].strip().lower()
    return _CONTENT_TYPES.get(os.path.splitext(file)[1].lower(), "")


def _decode_file(file, content_type, model_dir, meshdir, strippath, assets, scale):
    data = read_asset(file, model_dir, meshdir, strippath, assets)
    ctype = _content_type(file, content_type)
    if ctype == "model/stl":
        vert, face = _decode_stl(data, file)
    elif ctype == "model/obj":
        vert, face = _decode_obj(data, file)
    elif ctype == "model/vnd.mujoco.msh":
        vert, face = _decode_msh(data, file, scale)
    else:
        raise MJCFError(f"no decoder found for mesh file '{file}'")
    if not np.all(np.isfinite(vert)):
        bad = int(np.argmax(~np.all(np.isfinite(vert), axis=1)))
        raise MJCFError(f"vertex coordinate {bad} is not finite")
    return vert, face


def _inline_vertices(spec_vert) -> np.ndarray:
    if spec_vert is None:
        raise MJCFError("no vertices")
    if spec_vert.size % 3:
        raise MJCFError("vertex data must be a multiple of 3")
    vert = spec_vert.astype(np.float32).reshape(-1, 3)
    if not np.all(np.isfinite(vert)):
        bad = int(np.argmax(~np.all(np.isfinite(vert), axis=1)))
        raise MJCFError(f"vertex coordinate {bad} is not finite")
    return vert


def _check_faces(face):
    if face is None:
        return None
    if face.size % 3:
        raise MJCFError("face data must be a multiple of 3")
    return face.reshape(-1, 3)


def _check_initial(vert, face) -> None:
    """mjCMesh::CheckInitialMesh: at least 4 vertices, face indices in range."""
    if len(vert) < 4:
        raise MJCFError("at least 4 vertices required")
    if face is not None and len(face):
        bad = (face < 0) | (face >= len(vert))
        if bad.any():
            i = int(np.argmax(bad.ravel()))
            raise MJCFError(f"in face {i // 3}, vertex index {int(face.ravel()[i])} "
                            "does not exist")


def _decode_stl(data: bytes, file: str):
    """Binary STL (MuJoCo's stl_decoder): exact duplicate vertices are merged.

    Duplicates are detected on the float32 bit patterns and numbered in order of first
    appearance. ASCII STL is rejected, as MuJoCo 4.0 does.
    """
    if len(data) < 84:
        raise MJCFError(f"invalid header in STL file '{file}'")
    nface = int(np.frombuffer(data, dtype="<i4", count=1, offset=80)[0])
    if nface < 1 or nface > _STL_MAXFACE:
        raise MJCFError(f"number of faces should be between 1 and {_STL_MAXFACE} in STL "
                        f"file '{file}'; perhaps this is an ASCII file?")
    if nface * 50 != len(data) - 84:
        raise MJCFError(f"STL file '{file}' has wrong size; perhaps this is an ASCII file?")
    rec = np.dtype([("n", "<f4", 3), ("v", "<f4", (3, 3)), ("attr", "<u2")])
    tri = np.frombuffer(data, dtype=rec, count=nface, offset=84)["v"].reshape(-1, 3)
    if np.any(np.abs(tri) > 2.0 ** 30):
        raise MJCFError(f"vertex in STL file '{file}' exceeds maximum bounds")
    # the 96-bit key of a vertex as two integers, sorted stably: equal vertices are
    # neighbours, the first of a run is the first appearance (np.unique on 12-byte void
    # keys took ten times as long: barkour's 14 meshes, 0.69 -> 0.07 s)
    bits = np.ascontiguousarray(tri).view(np.uint32).astype(np.uint64)
    hi, lo = (bits[:, 0] << np.uint64(32)) | bits[:, 1], bits[:, 2]
    order = np.lexsort((lo, hi))
    run = np.empty(len(order), bool)
    run[0] = True
    run[1:] = (hi[order[1:]] != hi[order[:-1]]) | (lo[order[1:]] != lo[order[:-1]])
    group = np.empty(len(order), np.int64)
    group[order] = np.cumsum(run) - 1            # each vertex's key, in sorted order
    first = order[run]                           # its first appearance
    by_first = np.argsort(first, kind="stable")
    rank = np.empty_like(by_first)
    rank[by_first] = np.arange(len(by_first))
    vert = tri[first[by_first]].astype(np.float32)
    face = rank[group].reshape(-1, 3)
    return vert, face


def _decode_msh(data: bytes, file: str, scale):
    """Legacy MuJoCo MSH: int32 nv, nn, nt, nf; float32 vert, normal, texcoord; int32 face."""
    if len(data) < 16:
        raise MJCFError(f"missing header in MSH file '{file}'")
    nv, nn, nt, nf = (int(x) for x in np.frombuffer(data, dtype="<i4", count=4))
    if nv < 4 or nf < 0 or nn < 0 or nt < 0 or (nn > 0 and nn != nv) or (nt > 0 and nt != nv):
        raise MJCFError(f"invalid sizes in MSH file '{file}'")
    if len(data) != 16 + 4 * (3 * nv + 3 * nn + 2 * nt + 3 * nf):
        raise MJCFError(f"unexpected file size in MSH file '{file}'")
    vert = np.frombuffer(data, dtype="<f4", count=3 * nv, offset=16).reshape(-1, 3)
    off = 16 + 4 * (3 * nv + 3 * nn + 2 * nt)
    face = np.frombuffer(data, dtype="<i4", count=3 * nf, offset=off).reshape(-1, 3)
    face = face.astype(np.int64)
    return vert.astype(np.float32), (face if nf else None)


# ----------------------------------------------------------------------------------------
# OBJ (MuJoCo's obj_decoder on tinyobjloader)


def _decode_obj(data: bytes, file: str):
    """Wavefront OBJ as MuJoCo reads it through tinyobjloader.

    All ``v`` lines give vertices (extra components such as colours are ignored); only
    the faces of the first shape (shapes are split by ``g`` and ``o`` lines) are used;
    polygons are triangulated by tinyobjloader's ear clipping. No de-duplication.
    """
    text = data.decode("utf-8", errors="replace")
    vlines: list[str] = []
    shapes: list[list] = [[]]  # per shape: (vertex count so far, face tokens)
    for raw in text.splitlines():
        line = raw.lstrip(" \t")
        if not line or line[0] == "#":
            continue
        head = line[:2]
        if head in ("v ", "v\t"):
            vlines.append(line)
        elif head in ("f ", "f\t"):
            shapes[-1].append((len(vlines), line.split()[1:]))
        elif head in ("g ", "g\t", "o ", "o\t") and shapes[-1]:
            shapes.append([])
    vert = _parse_obj_vertices(vlines)
    for shape in shapes:
        tris = _obj_shape_faces(shape, vert, file)
        if len(tris):
            return vert, tris
    return vert, None


def _parse_obj_vertices(vlines: list[str]) -> np.ndarray:
    rows = [ln.split()[1:4] for ln in vlines]
    try:
        arr = np.array(rows, dtype=np.float64)
        if arr.ndim != 2 or (len(arr) and arr.shape[1] != 3):
            raise ValueError
    except ValueError:
        arr = np.array([[_obj_float(t) for t in (r + ["", "", ""])[:3]] for r in rows],
                       dtype=np.float64).reshape(-1, 3)
    return arr.astype(np.float32).reshape(-1, 3)


def _obj_float(token: str) -> float:
    # tinyobjloader returns 0 for a number it cannot parse
    m = re.match(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", token)
    return float(m.group(0)) if m else 0.0


def _obj_index(token: str, nvert: int, file: str) -> int:
    m = re.match(r"\s*[+-]?\d+", token)
    idx = int(m.group(0)) if m else 0
    if idx == 0:
        raise MJCFError(f"could not parse OBJ file '{file}' (zero face index)")
    return idx - 1 if idx > 0 else nvert + idx


def _obj_shape_faces(shape, vert: np.ndarray, file: str) -> np.ndarray:
    tris: list = []
    simple = all(len(tok) == 3 for _, tok in shape)
    if simple and shape:
        # fast path: all triangles, plain or slash-separated indices
        nv = np.array([n for n, _ in shape], dtype=np.int64)[:, None]
        try:
            idx = np.array([[t.split("/", 1)[0] for t in tok] for _, tok in shape],
                           dtype=np.int64)
        except ValueError:
            idx = np.array([[_obj_index(t, n, file) + 1 for t in tok] for n, tok in shape],
                           dtype=np.int64)
        if np.any(idx == 0):
            raise MJCFError(f"could not parse OBJ file '{file}' (zero face index)")
        return np.where(idx > 0, idx - 1, nv + idx)
    for n, tok in shape:
        poly = [_obj_index(t, n, file) for t in tok]
        if len(poly) < 3:
            continue
        tris.extend(_ear_clip(poly, vert) if len(poly) > 3 else [poly])
    return np.array(tris, dtype=np.int64).reshape(-1, 3)


def _ear_clip(poly: list[int], vert: np.ndarray) -> list[list[int]]:
    """tinyobjloader's triangulation of one polygon, in its float32 arithmetic.

    Quads are split along the shorter diagonal (0-2 if strictly shorter, else 1-3);
    larger polygons go through its projected ear clipping. This is the behaviour of
    the tinyobjloader in MuJoCo 4.0 (checked on quads against mujoco 4.0.0).
    """
    f32 = np.float32
    v = vert.astype(f32)
    if len(poly) == 4:
        e02, e13 = v[poly[2]] - v[poly[0]], v[poly[3]] - v[poly[1]]
        sqr02 = e02[0] * e02[0] + e02[1] * e02[1] + e02[2] * e02[2]
        sqr13 = e13[0] * e13[0] + e13[1] * e13[1] + e13[2] * e13[2]
        a, b, c, d = poly
        return [[a, b, c], [a, c, d]] if sqr02 < sqr13 else [[a, b, d], [b, c, d]]
    n = len(poly)
    eps = np.finfo(f32).eps
    axes = (1, 2)
    for k in range(n):
        p0, p1, p2 = v[poly[k]], v[poly[(k + 1) % n]], v[poly[(k + 2) % n]]
        e0, e1 = p1 - p0, p2 - p1
        c = np.abs(np.array([e0[1] * e1[2] - e0[2] * e1[1], e0[2] * e1[0] - e0[0] * e1[2],
                             e0[0] * e1[1] - e0[1] * e1[0]], dtype=f32))
        if c[0] > eps or c[1] > eps or c[2] > eps:
            if not (c[0] > c[1] and c[0] > c[2]):
                axes = (0, 1) if (c[2] > c[0] and c[2] > c[1]) else (0, 2)
            break
    a0, a1 = axes
    rem = list(poly)
    out: list[list[int]] = []
    guess, left, prev_n = 0, n, n
    while len(rem) > 3 and left > 0:
        npoly = len(rem)
        if guess >= npoly:
            guess -= npoly
        if prev_n != npoly:
            prev_n, left = npoly, npoly
        else:
            left -= 1
        ind = [rem[(guess + k) % npoly] for k in range(3)]
        vx = [v[i][a0] for i in ind]
        vy = [v[i][a1] for i in ind]
        cross = (vx[1] - vx[0]) * (vy[2] - vy[1]) - (vy[1] - vy[0]) * (vx[2] - vx[1])
        area = (vx[0] * vy[1] - vy[0] * vx[1]) * f32(0.5)  # sic: tinyobjloader's test
        if cross * area < 0:
            guess += 1
            continue
        inside = any(_pnpoly(vx, vy, v[rem[(guess + o) % npoly]][a0],
                             v[rem[(guess + o) % npoly]][a1]) for o in range(3, npoly))
        if inside:
            guess += 1
            continue
        out.append(ind)
        del rem[(guess + 1) % npoly]
    if len(rem) == 3:
        out.append(rem)
    return out


def _pnpoly(vx, vy, tx, ty) -> bool:
    inside = False
    j = 2
    for i in range(3):
        if ((vy[i] > ty) != (vy[j] > ty)) and \
                tx < (vx[j] - vx[i]) * (ty - vy[i]) / (vy[j] - vy[i]) + vx[i]:
            inside = not inside
        j = i
    return inside


# ----------------------------------------------------------------------------------------
# processing (mjCMesh::Process)


def _triangles(dv: np.ndarray, f: np.ndarray):
    """Per-face area, unit normal and centre, as MuJoCo's ``triangle()`` computes them."""
    p1, p2, p3 = dv[f[:, 0]], dv[f[:, 1]], dv[f[:, 2]]
    center = (p1 + p2 + p3) / 3
    b = p2 - p1
    c = p3 - p1
    n = np.stack([b[:, 1] * c[:, 2] - b[:, 2] * c[:, 1],
                  b[:, 2] * c[:, 0] - b[:, 0] * c[:, 2],
                  b[:, 0] * c[:, 1] - b[:, 1] * c[:, 0]], axis=1)
    length = np.sqrt(n[:, 0] * n[:, 0] + n[:, 1] * n[:, 1] + n[:, 2] * n[:, 2])
    small = length < _MINVAL
    area = np.where(small, 0.0, 0.5 * length)
    with np.errstate(invalid="ignore", divide="ignore"):
        normal = np.where(small[:, None], n, n / np.where(small, 1.0, length)[:, None])
    return area, normal, center


def _seqsum(x: np.ndarray) -> np.ndarray:
    """Sum along axis 0 in sequential order (a C loop ``total += x[i]``)."""
    if len(x) == 0:
        return np.zeros(x.shape[1:])
    return np.cumsum(x, axis=0)[-1]


def _dot3(a, b):
    return a[..., 0] * b[..., 0] + a[..., 1] * b[..., 1] + a[..., 2] * b[..., 2]


def process_generated(name, vert32, face, attrs, needs_hull) -> MeshData:
    """Process a mesh generated by the compiler (an SDF plugin's marching-cubes mesh):
    as a file mesh, but kept in its own frame (no move to the centre of mass, no
    rotation to principal axes; mjCMesh's needreorient_ = false)."""
    _check_initial(vert32, face)
    inertia = attrs.get("inertia") or "legacy"
    maxhullvert = int(attrs.get("maxhullvert") if attrs.get("maxhullvert") is not None
                      else -1)
    one = np.ones(3)
    return _process(name, vert32, np.asarray(face, np.int64), one, np.zeros(3),
                    np.array([1.0, 0, 0, 0]), inertia, maxhullvert,
                    needs_hull or inertia == "convex", reorient=False)


def _process(name, vert32, face, scale, refpos, refquat, inertia, maxhullvert,
             needs_hull, reorient=True) -> MeshData:
    dvert = vert32.astype(np.float64)
    has_faces = face is not None and len(face) > 0
    if has_faces and inertia == "exact":
        _check_orientation(name, dvert, face)
    hull = None
    if needs_hull or not has_faces:
        hull = _convex_hull(name, dvert, maxhullvert)
    if not has_faces:
        face = hull.copy()
    face = np.asarray(face, dtype=np.int64)
    if scale[0] * scale[1] * scale[2] <= 0:
        # a left-handed scale mirrors the mesh: swap the winding (of the hull too, as
        # MuJoCo 4.0 does) so that faces stay outward
        face = face[:, [0, 2, 1]]
        if hull is not None:
            hull = hull[:, [0, 2, 1]]

    dvert = _apply_transforms(dvert, refpos, refquat, scale)
    area, _, center = _triangles(dvert, face)
    total_area = _seqsum(area)
    if total_area < _MINVAL:
        raise MJCFError(f"mesh surface area is too small: {name}")
    facecen = _seqsum(area[:, None] * center) / total_area

    vol_faces = hull if inertia == "convex" else face
    com, measure = _center_of_mass(dvert, vol_faces, facecen, inertia)
    if inertia == "shell":
        if measure < _MINVAL:
            raise MJCFError(f"mesh surface area is too small: {name}")
    elif measure < _MINVAL:
        if measure < 0:
            raise MJCFError(f"mesh volume is negative (misoriented triangles): {name}")
        raise MJCFError(f"mesh volume is too small: {name} . Try setting inertia to shell")

    inert, measure = _inertia(dvert, vol_faces, com, inertia)
    full = [inert[0], inert[3], inert[4], inert[3], inert[1], inert[5],
            inert[4], inert[5], inert[2]]
    eigval, quat = eig3(full, MESH_EIG_TOL, MESH_EIG_TOL)
    _check_eigenvalues(name, eigval)
    with np.errstate(invalid="ignore"):
        box = 0.5 * np.sqrt(6 * np.array([eigval[1] + eigval[2] - eigval[0],
                                          eigval[0] + eigval[2] - eigval[1],
                                          eigval[0] + eigval[1] - eigval[2]]) / measure)

    if not reorient:
        com, quat = np.zeros(3), [1.0, 0.0, 0.0, 0.0]
    rot = quat2mat([quat[0], -quat[1], -quat[2], -quat[3]])
    dvert = dvert - com
    dvert = _mulmat_rows(rot, dvert)
    lo, hi = dvert.min(axis=0), dvert.max(axis=0)
    vert = dvert.astype(np.float32).astype(np.float64)

    data = MeshData(
        vert=vert, face=face.astype(np.int32), pos=np.array(com, dtype=np.float64),
        quat=np.array(quat), scale=np.array(scale, dtype=np.float64), volume=float(measure),
        inertia_box=box, unit_inertia=np.array([
            measure * (box[1] * box[1] + box[2] * box[2]) / 3,
            measure * (box[0] * box[0] + box[2] * box[2]) / 3,
            measure * (box[0] * box[0] + box[1] * box[1]) / 3]),
        aabb=np.concatenate([(lo + hi) / 2, (hi - lo) / 2]), name=name, inertia=inertia,
        aamm=np.concatenate([lo, hi]), bvh=bvh.mesh_tree(dvert, face))
    if hull is not None:
        _attach_hull(data, hull)
    return data


def _check_orientation(name, dvert, face) -> None:
    """Exact inertia needs every directed edge once (consistent winding)."""
    area, _, _ = _triangles(dvert, face)
    good = face[area > math.sqrt(_MINVAL)]
    if len(good) == 0:
        return
    edges = np.concatenate([good[:, [0, 1]], good[:, [1, 2]], good[:, [2, 0]]])
    edges = edges[np.lexsort((edges[:, 1], edges[:, 0]))]
    dup = np.all(edges[1:] == edges[:-1], axis=1)
    if dup.any():
        a, b = edges[int(np.argmax(dup))]
        raise MJCFError(f"faces of mesh '{name}' have inconsistent orientation. Please check "
                        f"the faces containing the vertices {a + 1} and {b + 1}.")


def _apply_transforms(dvert, refpos, refquat, scale) -> np.ndarray:
    """refpos (subtracted), refquat (inverse rotation), then scale (ApplyTransformations)."""
    if np.any(refpos != 0):
        dvert = dvert - refpos
    if not (refquat[0] == 1 and refquat[1] == 0 and refquat[2] == 0 and refquat[3] == 0):
        mat = quat2mat(_normvec(list(refquat)))
        # mjuu_mulvecmatT: transpose(mat) @ v
        dvert = _mulmat_rows([mat[0], mat[3], mat[6], mat[1], mat[4], mat[7],
                              mat[2], mat[5], mat[8]], dvert)
    if np.any(scale != 1):
        dvert = dvert * scale
    return dvert


def _mulmat_rows(mat, v: np.ndarray) -> np.ndarray:
    """mat (9, row-major) @ each row of v, in mjuu_mulvecmat's order."""
    m = [float(x) for x in mat]
    return np.stack([m[0] * v[:, 0] + m[1] * v[:, 1] + m[2] * v[:, 2],
                     m[3] * v[:, 0] + m[4] * v[:, 1] + m[5] * v[:, 2],
                     m[6] * v[:, 0] + m[7] * v[:, 1] + m[8] * v[:, 2]], axis=1)


def _center_of_mass(dvert, faces, facecen, inertia):
    """Volume (or area) and centre of mass (ComputeVolume / ComputeSurfaceArea)."""
    area, normal, center = _triangles(dvert, faces)
    if inertia == "shell":
        weight = area
    else:
        weight = _dot3(center - facecen, normal) * area / 3
        if inertia == "legacy":
            weight = np.abs(weight)
    total = _seqsum(weight)
    com = _seqsum(weight[:, None] * (center * 3.0 / 4.0 + facecen / 4.0))
    if total >= _MINVAL:
        com = com / total
    return com, float(total)


_PAIRS = ((0, 0), (1, 1), (2, 2), (0, 1), (0, 2), (1, 2))


def _inertia(dvert, faces, com, inertia):
    """Unit-density inertia about the centre of mass (ComputeInertia) -> (inert[6], total)."""
    vc = dvert - com
    d, e, f = vc[faces[:, 0]], vc[faces[:, 1]], vc[faces[:, 2]]
    area, normal, center = _triangles(vc, faces)
    if inertia == "shell":
        vol = area
    else:
        vol = _dot3(center, normal) * area / 3
        if inertia == "legacy":
            vol = np.abs(vol)
    c = 12 if inertia == "shell" else 20
    terms = []
    for a, b in _PAIRS:
        s = 2 * (d[:, a] * d[:, b] + e[:, a] * e[:, b] + f[:, a] * f[:, b])
        s = s + d[:, a] * e[:, b] + d[:, b] * e[:, a] + d[:, a] * f[:, b] + d[:, b] * f[:, a]
        s = s + e[:, a] * f[:, b] + e[:, b] * f[:, a]
        terms.append(vol / c * s)
    p = _seqsum(np.stack(terms, axis=1))
    inert = [p[1] + p[2], p[0] + p[2], p[0] + p[1], -p[3], -p[4], -p[5]]
    return inert, float(_seqsum(vol))


def _check_eigenvalues(name, ev) -> None:
    if ev[2] <= 0:
        raise MJCFError(f"eigenvalue of mesh inertia must be positive: {name}")
    rtol, atol = 1e-6, 1e-9
    if (ev[0] + ev[1] < ev[2] * (1 - rtol) - atol or ev[0] + ev[2] < ev[1] * (1 - rtol) - atol
            or ev[1] + ev[2] < ev[0] * (1 - rtol) - atol):
        raise MJCFError(f"eigenvalues of mesh inertia violate A + B >= C: {name}")


# ----------------------------------------------------------------------------------------
# convex hull (mjCMesh::MakeGraph)


def _convex_hull(name, dvert, maxhullvert) -> np.ndarray:
    """(nface, 3) outward hull triangles (vertex ids), in qhull's facet order.

    qhull runs with MuJoCo's options (``Qt``, plus ``Q9 TA<n-4>`` for maxhullvert);
    scipy gives the same facets in the same order, and orienting each triangle along its
    facet's outward normal reproduces MuJoCo's ``toporient`` swap.
    """
    from scipy.spatial import ConvexHull, QhullError

    _check_hull_degeneracy(name, dvert)
    opts = "Qt" + (f" Q9 TA{maxhullvert - 4}" if maxhullvert > -1 else "")
    try:
        hull = ConvexHull(dvert, qhull_options=opts)
    except QhullError as err:
        raise MJCFError(f"qhull error: {str(err).splitlines()[0]}") from None
    tri = hull.simplices.astype(np.int64)
    a, b, c = dvert[tri[:, 0]], dvert[tri[:, 1]], dvert[tri[:, 2]]
    flip = _dot3(np.cross(b - a, c - a), hull.equations[:, :3]) < 0
    tri[flip, 0], tri[flip, 1] = tri[flip, 1], tri[flip, 0].copy()
    return tri


def _check_hull_degeneracy(name, dvert) -> None:
    """MakeGraph's checks for colocated, collinear and coplanar vertices."""
    d = np.sqrt(np.sum((dvert[1:] - dvert[0]) ** 2, axis=1))
    far = np.nonzero(d > _MINVAL)[0]
    if len(far) == 0:
        raise MJCFError(f"mesh '{name}' has colocated vertices, cannot compute convex hull. "
                        "Consider using a small sphere instead")
    v1 = far[0] + 1
    len1 = d[far[0]]
    e1 = dvert[v1] - dvert[0]
    e2 = dvert - dvert[0]
    len2 = np.sqrt(_dot3(e2, e2))
    n = np.cross(e1, e2)
    norm = np.sqrt(_dot3(n, n))
    ok = (norm > _MINVAL * len1 * len2) & (len2 >= _MINVAL)
    ok[0] = ok[v1] = False
    if not ok.any():
        raise MJCFError(f"mesh '{name}' has collinear vertices, cannot compute convex hull. "
                        "Consider using a thin capsule instead")
    i = int(np.argmax(ok))
    normal = n[i] / norm[i]
    dist = np.abs(dvert @ normal - dvert[0] @ normal)
    if not np.any(dist > _MINVAL * len1):
        raise MJCFError(f"mesh '{name}' has coplanar vertices, cannot compute convex hull. "
                        "Consider using a primitive geom type (plane or thin box) instead")


def _attach_hull(data: MeshData, tri: np.ndarray) -> None:
    """Fill the hull fields of ``data`` from hull triangles in mesh vertex ids."""
    vid = np.unique(tri)
    local = np.searchsorted(vid, tri)
    data.hull_vertid = vid.astype(np.int32)
    data.hull_vert = data.vert[vid]
    data.hull_face = local.astype(np.int32)
    data.hull_normal = _triangles(data.vert, tri)[1]
    edges = np.concatenate([local[:, [0, 1]], local[:, [1, 2]], local[:, [2, 0]]])
    both = np.unique(np.concatenate([edges, edges[:, ::-1]]), axis=0)  # sorted by (v, nbr)
    data.hull_edge = both[both[:, 0] < both[:, 1]].astype(np.int32)
    data.graph = _graph_layout(len(vid), vid, both, tri)


def _graph_layout(nv, vid, directed, tri) -> np.ndarray:
    """mjModel.mesh_graph layout: per vertex its neighbours (local ids) then -1."""
    deg = np.bincount(directed[:, 0], minlength=nv)
    edgeadr = np.concatenate([[0], np.cumsum(deg + 1)[:-1]])
    edges = np.full(int(np.sum(deg + 1)), -1, dtype=np.int64)
    pos = edgeadr[directed[:, 0]] + (np.arange(len(directed)) -
                                     np.concatenate([[0], np.cumsum(deg)[:-1]])[directed[:, 0]])
    edges[pos] = directed[:, 1]
    return np.concatenate([[nv, len(tri)], edgeadr, vid, edges, tri.ravel()]).astype(np.int32)


# ----------------------------------------------------------------------------------------
# small quaternion helpers, bit-compatible with MuJoCo's user_util.cc


def _normvec(v: list) -> list:
    """mjuu_normvec: leave vectors within 1e-14 of unit length untouched."""
    nrm = 0.0
    for x in v:
        nrm += x * x
    if nrm < _MJEPS:
        return v
    nrm = math.sqrt(nrm)
    if abs(nrm - 1) > _MJEPS:
        v = [x / nrm for x in v]
    return v


def quat2mat(q) -> list:
    """Rotation matrix (9, row-major) of a unit quaternion (mjuu_quat2mat)."""
    if q[0] == 1 and q[1] == 0 and q[2] == 0 and q[3] == 0:
        return [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    q00, q01, q02, q03 = q[0] * q[0], q[0] * q[1], q[0] * q[2], q[0] * q[3]
    q11, q12, q13 = q[1] * q[1], q[1] * q[2], q[1] * q[3]
    q22, q23, q33 = q[2] * q[2], q[2] * q[3], q[3] * q[3]
    return [q00 + q11 - q22 - q33, 2 * (q12 - q03), 2 * (q13 + q02),
            2 * (q12 + q03), q00 - q11 + q22 - q33, 2 * (q23 - q01),
            2 * (q13 - q02), 2 * (q23 + q01), q00 - q11 - q22 + q33]


def mulvecmat(v, mat) -> np.ndarray:
    """mat (9, row-major) @ v (3,) in mjuu_mulvecmat's order."""
    return _mulmat_rows(mat, np.asarray(v, np.float64).reshape(1, 3))[0]


def frameaccum(pos, quat, cpos, cquat):
    """(pos + R(quat) cpos, quat * cquat) in mjuu_frameaccum's arithmetic."""
    q = [float(x) for x in quat]
    return (np.asarray(pos, np.float64) + mulvecmat(cpos, quat2mat(q)),
            np.array(mulquat(q, [float(x) for x in cquat])))


def mulquat(a, b) -> list:
    """Quaternion product a * b, normalised (mjuu_mulquat)."""
    return _normvec([a[0] * b[0] - a[1] * b[1] - a[2] * b[2] - a[3] * b[3],
                     a[0] * b[1] + a[1] * b[0] + a[2] * b[3] - a[3] * b[2],
                     a[0] * b[2] - a[1] * b[3] + a[2] * b[0] + a[3] * b[1],
                     a[0] * b[3] + a[1] * b[2] - a[2] * b[1] + a[3] * b[0]])


def _mulmat(a, b) -> list:
    return [a[3 * r] * b[c] + a[3 * r + 1] * b[3 + c] + a[3 * r + 2] * b[6 + c]
            for r in range(3) for c in range(3)]


def eig3(mat, stop_rel: float = 16 * 2.0 ** -52,
         sort_rel: float = 1e-12) -> tuple[list, list]:
    """Eigenvalues (descending) and frame quaternion of a symmetric 3x3 (mjuu_eig3).

    ``mat``: 9 numbers, row-major. Quaternion-Jacobi iteration as in MuJoCo 4.0: it stops
    when the largest off-diagonal element is at most ``stop_rel * max|mat|`` (so the
    result does not depend on the scale of the matrix), rotates by the half-angle
    computed from tan(theta/2), and sorts eigenvalues that differ by more than
    ``sort_rel * max|mat|``. The defaults reproduce mujoco 4.0.0 for ``fullinertia``;
    mesh inertia uses ``stop_rel = sort_rel = 1e-7`` (:data:`MESH_EIG_TOL`). Both were
    matched bit for bit against mujoco 4.0.0. With repeated eigenvalues the axes are
    arbitrary and may differ from MuJoCo's. Returns (eigval[3], quat[4]).
    """
    mat = [float(x) for x in mat]
    scale = max(abs(x) for x in mat)
    quat = [1.0, 0.0, 0.0, 0.0]
    ev = [0.0, 0.0, 0.0]
    for _ in range(500):
        vec = quat2mat(quat)
        vt = [vec[0], vec[3], vec[6], vec[1], vec[4], vec[7], vec[2], vec[5], vec[8]]
        dm = _mulmat(_mulmat(vt, mat), vec)
        ev = [dm[0], dm[4], dm[8]]
        if abs(dm[1]) > abs(dm[2]) and abs(dm[1]) > abs(dm[5]):
            rk, ck, rotk = 0, 1, 2
        elif abs(dm[2]) > abs(dm[5]):
            rk, ck, rotk = 0, 2, 1
        else:
            rk, ck, rotk = 1, 2, 0
        off = dm[3 * rk + ck]
        if abs(off) <= stop_rel * scale or off == 0:
            break
        tau = (dm[4 * ck] - dm[4 * rk]) / (2 * off)
        if tau >= 0:
            t = 1.0 / (tau + math.sqrt(1 + tau * tau))
        else:
            t = -1.0 / (-tau + math.sqrt(1 + tau * tau))
        half = t / (1 + math.sqrt(1 + t * t))  # tan(theta/2), free of cancellation
        rot = [1 / math.sqrt(1 + half * half), 0.0, 0.0, 0.0]
        rot[rotk + 1] = (half if rotk == 1 else -half) * rot[0]
        quat = mulquat(quat, rot)
    for j in range(3):  # bubble sort, descending, rotating the frame along
        j1 = j % 2
        if ev[j1] + sort_rel * scale < ev[j1 + 1]:
            ev[j1], ev[j1 + 1] = ev[j1 + 1], ev[j1]
            rot = [0.707106781186548, 0.0, 0.0, 0.0]
            rot[(j1 + 2) % 3 + 1] = rot[0]
            quat = mulquat(quat, rot)
    return ev, quat
