"""Lay compiled objects out as mjModel arrays and build the Model (numpy only).

Mirrors ``mjCModel::CopyTree`` / ``CopyObjects``: addresses (qpos, dof, joint, geom,
actuator activation, sensor data), tree ids, dof parents and ``dof_Madr``, contact
pairs and excludes (sorted by body signature), keyframes and custom data.
"""
from __future__ import annotations

import numpy as np

from simjax import types
from simjax.errors import MJCFError
from simjax.mjcf import bvh
from simjax.mjcf.tree import JOINT_NQ, JOINT_NV, same_frame
from simjax.types import JointType

_PARAM_NAMES = ("body", "joint", "geom", "site", "camera")


def _get(attrs, key, default):
    """attrs[key], or ``default`` when unset (None)."""
    v = attrs.get(key)
    return default if v is None else v


def name_ids(bodies, mesh_names, hfield_names):
    """Name -> id maps for tree objects and assets (MJCFError on repeated names, located
    at the second element carrying the name)."""
    objs = {"body": bodies, "joint": [j for b in bodies for j in b.joints],
            "geom": [g for b in bodies for g in b.geoms],
            "site": [s for b in bodies for s in b.sites],
            "camera": [c for b in bodies for c in b.cams]}
    lists = {k: [o.name if k == "body" else o["name"] for o in v] for k, v in objs.items()}
    lists.update(mesh=mesh_names, hfield=hfield_names)
    ids = {}
    for kind, names in lists.items():
        m = {}
        for i, n in enumerate(names):
            if n:
                if n in m:
                    msg = f"repeated name '{n}' in {kind}"
                    o = objs.get(kind, [None] * (i + 1))[i]
                    el = None if o is None else (o.el if kind == "body" else o.get("el"))
                    raise el.error(msg) if el is not None else MJCFError(msg)
                m[n] = i
        ids[kind] = m
    ids["geom_type"] = [g["type"] for b in bodies for g in b.geoms]
    ids["lists"] = lists
    return ids


def _stack(rows, width, dtype=np.float64):
    if not rows:
        return np.zeros((0, width), dtype=dtype)
    return np.asarray(np.stack([np.asarray(r, dtype=dtype) for r in rows]), dtype=dtype)


def _user(recs, n):
    out = np.zeros((len(recs), n))
    for i, r in enumerate(recs):
        u = r.get("user")
        if u is not None:
            u = np.atleast_1d(np.asarray(u, dtype=np.float64))
            out[i, :len(u)] = u
    return out


def _nuser(recs, size_attrs, key):
    longest = max([len(np.atleast_1d(r["user"])) for r in recs
                   if r.get("user") is not None] + [0])
    n = size_attrs.get(key, -1)
    if n is None or n < 0:
        return longest
    if longest > n:
        raise MJCFError(f"user has more values than {key}")
    return n


def _size_attrs(root):
    out = {}
    for el in root.children:
        if el.tag == "size":
            for k in el.given:
                out[k] = el.attrs[k]
    return out


def _tree_arrays(bodies):
    """Body/joint/dof arrays of the kinematic tree (CopyTree)."""
    nbody = len(bodies)
    out = {k: np.zeros(nbody, np.int32) for k in (
        "body_parentid", "body_rootid", "body_weldid", "body_mocapid", "body_jntnum",
        "body_jntadr", "body_dofnum", "body_dofadr", "body_geomnum", "body_geomadr",
        "body_contype", "body_conaffinity")}
    jnt, dof = [], []
    qpos0, qspring = [], []
    lastdof = {}
    nmocap = 0
    geomadr = 0
    for b in bodies:
        i = b.id
        out["body_parentid"][i] = b.parent
        out["body_weldid"][i] = b.weldid
        out["body_rootid"][i] = i if (i == 0 or b.parent == 0) else out["body_rootid"][b.parent]
        out["body_mocapid"][i] = nmocap if b.mocap else -1
        nmocap += int(b.mocap)
        out["body_jntnum"][i] = len(b.joints)
        out["body_jntadr"][i] = len(jnt) if b.joints else -1
        ndof = sum(JOINT_NV[j["type"]] for j in b.joints)
        out["body_dofnum"][i] = ndof
        out["body_dofadr"][i] = len(dof) if ndof else -1
        out["body_geomnum"][i] = len(b.geoms)
        out["body_geomadr"][i] = geomadr if b.geoms else -1
        geomadr += len(b.geoms)
        ct = ca = 0
        for g in b.geoms:
            ct |= g["contype"]
            ca |= g["conaffinity"]
        out["body_contype"][i], out["body_conaffinity"][i] = ct, ca
        last = lastdof.get(b.parent, -1) if i > 0 else -1
        for j in b.joints:
            j["qposadr"] = sum(JOINT_NQ[x["type"]] for x in jnt)
            j["dofadr"] = len(dof)
            j["bodyid"] = i
            j["id"] = len(jnt)
            jnt.append(j)
            if j["type"] == JointType.FREE:
                q = np.concatenate([b.pos, b.quat])
                qpos0.extend(q)
                qspring.extend(q)
            elif j["type"] == JointType.BALL:
                qpos0.extend([1.0, 0, 0, 0])
                qspring.extend([1.0, 0, 0, 0])
            else:
                qpos0.append(j["ref"])
                qspring.append(j["springref"])
            for _ in range(JOINT_NV[j["type"]]):
                dof.append(dict(bodyid=i, jntid=j["id"], parentid=last, joint=j))
                last = len(dof) - 1
        lastdof[i] = last
    out["nmocap"] = nmocap
    return out, jnt, dof, np.array(qpos0), np.array(qspring)


def assemble(root, s, opt, bodies, meshes, hfields, mesh_names, hfield_names, ids,
             tendon_recs, wraps, act_recs, sensor_recs, eq_recs):
    """Build the Model (set0 fields left at zero for ``setconst``)."""
    size_attrs = _size_attrs(root)
    kw, jnt, dof, qpos0, qspring = _tree_arrays(bodies)
    nmocap = kw.pop("nmocap")
    geoms = [g for b in bodies for g in b.geoms]
    sites = [x for b in bodies for x in b.sites]
    cams = [c for b in bodies for c in b.cams]
    for k in range(len(geoms)):
        geoms[k]["bodyid"] = next(b.id for b in bodies if any(g is geoms[k] for g in b.geoms))
    site_body = [b.id for b in bodies for _ in b.sites]
    cam_body = [b.id for b in bodies for _ in b.cams]
    nv = len(dof)
    # dof trees and dof_Madr
    dof_parent = np.array([d["parentid"] for d in dof], np.int32)
    dof_tree = np.cumsum(dof_parent == -1).astype(np.int32) - 1 if nv else np.zeros(0, np.int32)
    ntree = int(np.sum(dof_parent == -1))
    madr, n = [], 0
    for i in range(nv):
        madr.append(n)
        j = i
        while j >= 0:
            n += 1
            j = dof_parent[j]
    body_tree = np.array([dof_tree[kw["body_dofadr"][b.weldid]]
                          if kw["body_dofnum"][b.weldid] else -1 for b in bodies], np.int32)

    counts = dict(nq=len(qpos0), nv=nv, nu=int(sum(r.get("ctrlnum", 1) for r in act_recs)),
                  nactuator=len(act_recs),
                  nout=int(sum(r.get("outnum", 1) for r in act_recs)),
                  na=int(sum(r["actnum"] for r in act_recs)),
                  nbody=len(bodies), njnt=len(jnt), ngeom=len(geoms), nsite=len(sites),
                  ncam=len(cams), nmesh=len(meshes),
                  nmeshvert=int(sum(len(m.vert) for m in meshes)),
                  nmeshframe=int(sum(len(m.frame) for m in meshes if m.frame is not None)),
                  nmeshface=int(sum(len(m.face) for m in meshes)), nhfield=len(hfields),
                  nhfielddata=int(sum(h.nrow * h.ncol for h in hfields)),
                  ntendon=len(tendon_recs), nwrap=len(wraps[0]), nsensor=len(sensor_recs),
                  nsensordata=int(sum(r["dim"] for r in sensor_recs)), nmocap=nmocap,
                  neq=len(eq_recs), ntree=ntree, ngravcomp=int(sum(b.gravcomp > 0
                                                                   for b in bodies)))
    kw.update({n: 0 for n in types.MODEL_COUNTS if n not in kw})
    kw.update(counts)
    hist_act, hist_sens, kw["nhistory"] = _history_layout(act_recs, sensor_recs)
    kw["body_treeid"] = body_tree
    nuser = {f"nuser_{k}": 0 for k in ("body", "jnt", "geom", "site", "cam", "tendon",
                                       "actuator", "sensor")}
    nuser["nuser_jnt"] = _nuser(jnt, size_attrs, "nuser_jnt")
    nuser["nuser_geom"] = _nuser(geoms, size_attrs, "nuser_geom")
    nuser["nuser_site"] = _nuser(sites, size_attrs, "nuser_site")
    nuser["nuser_tendon"] = _nuser(tendon_recs, size_attrs, "nuser_tendon")
    nuser["nuser_actuator"] = _nuser(act_recs, size_attrs, "nuser_actuator")
    nuser["nuser_sensor"] = _nuser(sensor_recs, size_attrs, "nuser_sensor")
    nuser["nuser_body"] = max(0, size_attrs.get("nuser_body", -1) or 0)
    nuser["nuser_cam"] = max(0, size_attrs.get("nuser_cam", -1) or 0)
    kw.update(nuser)
    f = {k: kw.pop(k) for k in list(kw) if k.startswith("body_")}
    _body_fields(f, bodies)
    _joint_fields(f, jnt, dof, madr, dof_parent, dof_tree, nuser)
    _geom_fields(f, geoms, bodies, nuser)
    kw["nmat"] = _material_fields(f, root, geoms, s.discardvisual)
    _site_cam_fields(f, sites, site_body, cams, cam_body, bodies, ids, nuser, _znear(root))
    _mesh_fields(f, meshes, hfields)
    _bvh_fields(f, kw, meshes)
    _tendon_fields(f, tendon_recs, wraps, nuser)
    _plastic_fields(f, kw, jnt, tendon_recs)
    _actuator_fields(f, act_recs, nuser)
    _sensor_fields(f, sensor_recs, nuser)
    f["actuator_historyadr"], f["sensor_historyadr"] = hist_act, hist_sens
    _eq_fields(f, eq_recs)
    npair, nexclude = _contact_fields(f, root, ids, geoms)
    kw.update(npair=npair, nexclude=nexclude)
    f["qpos0"], f["qpos_spring"] = qpos0, qspring
    _tree_ids(f, kw, ntree, nv, dof_tree, body_tree)
    nkey = _key_fields(f, root, kw, qpos0, bodies, size_attrs, act_recs)
    kw["nkey"] = nkey
    _custom_fields(f, kw, root)
    kw["nuserdata"] = int(size_attrs.get("nuserdata", 0) or 0)
    if s.settotalmass > 0:
        _set_total_mass(f, s.settotalmass)
    for name, kind, *_ in types.MODEL_FIELDS:
        shape = types.field_shape(name, kw)
        arr = np.asarray(f.get(name, np.zeros(shape)))
        if arr.size == 0:
            arr = np.zeros(shape)
        arr = arr.reshape(shape)
        arr = arr.astype(np.int32 if kind == "i" else bool if kind == "b" else np.float64)
        kw[name] = arr if types.is_static_field(name) else types.leaf(arr)
    kw.update(types.frictionloss_structure(kw["dof_frictionloss"], kw["tendon_frictionloss"]))
    kw["opt"] = types.Option(**{k: (v if isinstance(v, int) else types.leaf(v))
                                for k, v in opt.items()})
    kw["stat"] = _statistic(root)
    names = {k: list(v) for k, v in ids["lists"].items()}
    names.update(tendon=[t["name"] for t in tendon_recs], actuator=[a["name"] for a in act_recs],
                 sensor=[r["name"] for r in sensor_recs], equality=[e["name"] for e in eq_recs])
    names.update(f.pop("_names", {}))
    kw["names"] = names
    return types.Model(**kw)


def _statistic(root):
    """Statistic overrides given in XML; the rest is computed by setconst."""
    given = {}
    for el in root.children:
        if el.tag == "statistic":
            for k in el.given:
                given[k] = el.attrs[k]
    st = types.Statistic(meaninertia=types.leaf(given.get("meaninertia", np.nan)),
                         meanmass=types.leaf(given.get("meanmass", np.nan)),
                         meansize=types.leaf(given.get("meansize", np.nan)),
                         extent=types.leaf(given.get("extent", np.nan)),
                         center=types.leaf(np.asarray(given.get("center", [np.nan] * 3),
                                                       dtype=np.float64)))
    return st


def _body_fields(f, bodies):
    f["body_pos"] = _stack([b.pos for b in bodies], 3)
    f["body_quat"] = _stack([b.quat for b in bodies], 4)
    f["body_ipos"] = _stack([b.ipos for b in bodies], 3)
    f["body_iquat"] = _stack([b.iquat for b in bodies], 4)
    f["body_mass"] = np.array([b.mass for b in bodies])
    f["body_inertia"] = _stack([b.inertia for b in bodies], 3)
    f["body_gravcomp"] = np.array([b.gravcomp for b in bodies])
    f["body_margin"] = np.array([max([g["margin"] + g["gap"] for g in b.geoms] + [0.0])
                                 for b in bodies])
    f["body_sameframe"] = np.array([int(same_frame(b.ipos, b.iquat)) if b.id else 1
                                    for b in bodies])
    f["body_plugin"] = np.full(len(bodies), -1)


def _joint_fields(f, jnt, dof, madr, dof_parent, dof_tree, nuser):
    f["jnt_type"] = [j["type"] for j in jnt]
    f["jnt_qposadr"] = [j["qposadr"] for j in jnt]
    f["jnt_dofadr"] = [j["dofadr"] for j in jnt]
    f["jnt_bodyid"] = [j["bodyid"] for j in jnt]
    f["jnt_limited"] = [j["limited"] for j in jnt]
    f["jnt_actfrclimited"] = [j["actfrclimited"] for j in jnt]
    f["jnt_actgravcomp"] = [j["actgravcomp"] for j in jnt]
    f["jnt_solref"] = _stack([j["solreflimit"] for j in jnt], 2)
    f["jnt_solimp"] = _stack([j["solimplimit"] for j in jnt], 5)
    f["jnt_pos"] = _stack([j["pos"] for j in jnt], 3)
    f["jnt_axis"] = _stack([j["axis"] for j in jnt], 3)
    f["jnt_stiffness"] = [j["stiffness"][0] for j in jnt]
    f["jnt_stiffnesspoly"] = _stack([j["stiffness"][1:] for j in jnt], 2)
    f["jnt_range"] = _stack([j["range"] for j in jnt], 2)
    f["jnt_actfrcrange"] = _stack([j["actfrcrange"] for j in jnt], 2)
    f["jnt_margin"] = [j["margin"] for j in jnt]
    f["jnt_springyield"] = [j["springyield"] for j in jnt]
    f["jnt_user"] = _user(jnt, nuser["nuser_jnt"])
    f["jnt_actuatorid"] = np.full(len(jnt), -1)
    f["dof_bodyid"] = [d["bodyid"] for d in dof]
    f["dof_jntid"] = [d["jntid"] for d in dof]
    f["dof_parentid"] = dof_parent
    f["dof_treeid"] = dof_tree
    f["dof_Madr"] = madr
    f["dof_solref"] = _stack([d["joint"]["solreffriction"] for d in dof], 2)
    f["dof_solimp"] = _stack([d["joint"]["solimpfriction"] for d in dof], 5)
    f["dof_frictionloss"] = [d["joint"]["frictionloss"] for d in dof]
    f["dof_armature"] = [d["joint"]["armature"] for d in dof]
    f["dof_damping"] = [d["joint"]["damping"][0] for d in dof]
    f["dof_dampingpoly"] = _stack([d["joint"]["damping"][1:] for d in dof], 2)


def _geom_fields(f, geoms, bodies, nuser):
    for key in ("type", "contype", "conaffinity", "condim", "bodyid", "dataid", "priority",
                "solmix", "margin", "gap", "adhesion", "rbound", "group"):
        f[f"geom_{key}"] = [g[key] for g in geoms]
    for key, w in (("size", 3), ("aabb", 6), ("pos", 3), ("quat", 4), ("friction", 3),
                   ("solref", 2), ("solimp", 5), ("surfacevel", 6), ("fluid", 12)):
        f[f"geom_{key}"] = _stack([g[key] for g in geoms], w)
    f["geom_user"] = _user(geoms, nuser["nuser_geom"])
    f["geom_plugin"] = np.full(len(geoms), -1)
    f["geom_sameframe"] = [int(same_frame(g["pos"], g["quat"], bodies[g["bodyid"]].ipos,
                                          bodies[g["bodyid"]].iquat)) for g in geoms]


def _material_fields(f, root, geoms, discard=False):
    """mat_rgba and geom_rgba / geom_matid (used by ray casting: invisible geoms);
    ``discard`` (compiler discardvisual): no materials, references forgotten."""
    mats = [el for sec in root.children if sec.tag == "asset" for el in sec.children
            if el.tag == "material" and not discard]
    ids = {}
    for i, el in enumerate(mats):
        name = el.attrs.get("name") or ""
        if name:
            ids[name] = i
    f["mat_rgba"] = _stack([np.asarray(el.attrs.get("rgba", (1.0, 1.0, 1.0, 1.0)),
                                       dtype=np.float64) for el in mats], 4)
    f["geom_rgba"] = _stack([g["rgba"] for g in geoms], 4)
    matid = []
    for g in geoms:
        if g["material"] and g["material"] not in ids and not discard:
            raise g["el"].error(f"unknown material '{g['material']}'")
        matid.append(ids.get(g["material"], -1))
    f["geom_matid"] = matid
    return len(mats)


def _site_cam_fields(f, sites, site_body, cams, cam_body, bodies, ids, nuser, znear):
    f["site_type"] = [x["type"] for x in sites]
    f["site_bodyid"] = site_body
    f["site_size"] = _stack([x["size"] for x in sites], 3)
    f["site_pos"] = _stack([x["pos"] for x in sites], 3)
    f["site_quat"] = _stack([x["quat"] for x in sites], 4)
    f["site_user"] = _user(sites, nuser["nuser_site"])
    f["site_sameframe"] = [int(same_frame(x["pos"], x["quat"], bodies[b].ipos,
                                          bodies[b].iquat)) for x, b in zip(sites, site_body)]
    f["cam_bodyid"] = cam_body
    f["cam_mode"] = [c["mode"] for c in cams]
    f["cam_targetbodyid"] = [ids["body"].get(c["target"], -1) if c["target"] else -1
                             for c in cams]
    f["cam_pos"] = _stack([c["pos"] for c in cams], 3)
    f["cam_quat"] = _stack([c["quat"] for c in cams], 4)
    f["cam_resolution"] = _stack([c["resolution"] for c in cams], 2, np.int32)
    f["cam_projection"] = [c["projection"] for c in cams]
    f["cam_sensorsize"], f["cam_intrinsic"], f["cam_fovy"] = _cam_intrinsics(cams, znear)


def _znear(root):
    """visual/map znear (last given wins; MuJoCo's default 0.01)."""
    z = 0.01
    for vis in root.children:
        if vis.tag == "visual":
            for el in vis.children:
                if el.tag == "map" and "znear" in el.given:
                    z = float(el.attrs["znear"])
    return z


def _cam_intrinsics(cams, znear=0.01):
    """Sensor size, [fx, fy, cx, cy] and fovy (degrees) by mjCCamera::Compile's rules:
    focal / principal values need a sensor size (which needs a resolution); with one,
    pixel values override lengths (through a float pixel density) and fovy follows from
    the sensor height and the vertical focal length; without one, the focal length is
    the near clipping plane visual/map znear."""
    ss, intr, fovys = [], [], []
    for c in cams:
        a, el = c["attrs"], c["el"]
        res = np.asarray(c["resolution"], dtype=np.float64)

        def vec(key):
            v = a.get(key)
            return np.zeros(2) if v is None else np.asarray(v, dtype=np.float64)
        size, focal, fpix = vec("sensorsize"), vec("focal"), vec("focalpixel")
        principal, ppix = vec("principal"), vec("principalpixel")
        has_size = size[0] > 0 and size[1] > 0
        if (focal.any() or fpix.any() or principal.any() or ppix.any()) and not has_size:
            raise el.error(f"focal/principal require sensorsize in camera "
                           f"'{c['name']}'")
        if has_size and (res[0] <= 0 or res[1] <= 0):
            raise el.error(f"sensorsize requires positive resolution in camera "
                           f"'{c['name']}'")
        fovy = c["fovy"]
        if has_size:
            density = (res.astype(np.float32) / size).astype(np.float32).astype(np.float64)
            focal = np.where(fpix != 0, fpix / density, focal)
            principal = np.where(ppix != 0, ppix / density, principal)
            fovy = float(np.arctan2(size[1] / 2, focal[1]) * 360.0 / np.pi)
        else:
            focal = np.array([znear, znear])
        ss.append(size)
        intr.append(np.concatenate([focal, principal]))
        fovys.append(fovy)
    return _stack(ss, 2), _stack(intr, 4), np.asarray(fovys, np.float64)


def _mesh_fields(f, meshes, hfields):
    vadr = np.cumsum([0] + [len(m.vert) for m in meshes])[:-1]
    fadr = np.cumsum([0] + [len(m.face) for m in meshes])[:-1]
    f["mesh_vertadr"], f["mesh_faceadr"] = vadr, fadr
    f["mesh_vertnum"] = [len(m.vert) for m in meshes]
    f["mesh_facenum"] = [len(m.face) for m in meshes]
    f["mesh_vert"] = np.concatenate([m.vert for m in meshes]) if meshes else np.zeros((0, 3))
    f["mesh_face"] = np.concatenate([m.face for m in meshes]) if meshes else np.zeros((0, 3))
    f["mesh_pos"] = _stack([m.pos for m in meshes], 3)
    f["mesh_quat"] = _stack([m.quat for m in meshes], 4)
    f["mesh_scale"] = _stack([m.scale for m in meshes], 3)
    frames = [m.frame for m in meshes if m.frame is not None]
    f["mesh_frameadr"] = np.full(len(meshes), -1, np.int32)
    adr = np.cumsum([0] + [len(x) for x in frames])
    f["mesh_frameadr"][[i for i, m in enumerate(meshes) if m.frame is not None]] = adr[:-1]
    f["mesh_frame"] = np.concatenate(frames) if frames else np.zeros((0, 9))
    if meshes and all(getattr(m, "extrema", None) is not None for m in meshes):
        f["mesh_extrema"] = _stack([m.extrema for m in meshes], 27, np.int32)
    f["hfield_size"] = _stack([h.size for h in hfields], 4)
    f["hfield_nrow"] = [h.nrow for h in hfields]
    f["hfield_ncol"] = [h.ncol for h in hfields]
    f["hfield_adr"] = np.cumsum([0] + [h.nrow * h.ncol for h in hfields])[:-1]
    f["hfield_data"] = np.concatenate([h.data for h in hfields]) if hfields else np.zeros(0)


def _bvh_fields(f, kw, meshes):
    """Bounding volume hierarchies: one per body with colliding geoms, then one per
    mesh, concatenated in that order (mjCModel::CopyTree / CopyObjects)."""
    trees, body_adr, body_num, mesh_adr, mesh_num = [], [], [], [], []
    adr = 0
    geomadr, geomnum = np.asarray(f["body_geomadr"]), np.asarray(f["body_geomnum"])
    for b in range(len(geomadr)):
        g = np.arange(geomadr[b], geomadr[b] + geomnum[b]) if geomnum[b] else \
            np.zeros(0, np.int64)
        t = bvh.body_tree(g, np.asarray(f["geom_contype"])[g],
                          np.asarray(f["geom_conaffinity"])[g], f["geom_pos"][g],
                          f["geom_quat"][g], f["geom_aabb"][g], f["body_ipos"][b],
                          f["body_iquat"][b])
        body_adr.append(adr if t.n else -1)
        body_num.append(t.n)
        trees.append(t)
        adr += t.n
    for mesh in meshes:
        t = mesh.bvh if mesh.bvh is not None else bvh.empty()
        mesh_adr.append(adr if t.n else -1)
        mesh_num.append(t.n)
        trees.append(t)
        adr += t.n
    f["body_bvhadr"], f["body_bvhnum"] = body_adr, body_num
    f["mesh_bvhadr"], f["mesh_bvhnum"] = mesh_adr, mesh_num
    f["bvh_aabb"] = np.concatenate([t.aabb for t in trees]) if trees else np.zeros((0, 6))
    f["bvh_child"] = np.concatenate([t.child for t in trees]) if trees else np.zeros((0, 2))
    f["bvh_nodeid"] = np.concatenate([t.nodeid for t in trees]) if trees else np.zeros(0)
    f["bvh_depth"] = np.concatenate([t.depth for t in trees]) if trees else np.zeros(0)
    kw["nbvh"] = kw["nbvhstatic"] = adr


def _tendon_fields(f, recs, wraps, nuser):
    f["tendon_adr"] = [t["adr"] for t in recs]
    f["tendon_num"] = [t["num"] for t in recs]
    f["tendon_limited"] = [t["limited"] for t in recs]
    f["tendon_actfrclimited"] = [t["actfrclimited"] for t in recs]
    for k in ("solref_lim", "solref_fri"):
        f[f"tendon_{k}"] = _stack([t[k] for t in recs], 2)
    for k in ("solimp_lim", "solimp_fri"):
        f[f"tendon_{k}"] = _stack([t[k] for t in recs], 5)
    f["tendon_range"] = _stack([t["range"] for t in recs], 2)
    f["tendon_actfrcrange"] = _stack([t["actfrcrange"] for t in recs], 2)
    f["tendon_margin"] = [t["margin"] for t in recs]
    f["tendon_springyield"] = [t["springyield"] for t in recs]
    f["tendon_stiffness"] = [t["stiffness"][0] for t in recs]
    f["tendon_stiffnesspoly"] = _stack([t["stiffness"][1:] for t in recs], 2)
    f["tendon_damping"] = [t["damping"][0] for t in recs]
    f["tendon_dampingpoly"] = _stack([t["damping"][1:] for t in recs], 2)
    f["tendon_armature"] = [t["armature"] for t in recs]
    f["tendon_frictionloss"] = [t["frictionloss"] for t in recs]
    f["tendon_lengthspring"] = _stack([t["lengthspring"] for t in recs], 2)
    f["tendon_actuatorid"] = np.full(len(recs), -1)
    f["tendon_user"] = _user(recs, nuser["nuser_tendon"])
    f["wrap_type"], f["wrap_objid"], f["wrap_prm"] = wraps


def _plastic_fields(f, kw, jnt, tendons):
    """Addresses in the plastic state (MuJoCo 4's layout): every joint with a spring
    yield (hinge, slide: its spring reference; ball: its reference quaternion), then
    every tendon with one (its spring length range, 2 numbers)."""
    adr = 0
    for key, recs in (("jnt", jnt), ("tendon", tendons)):
        out = np.full(len(recs), -1, np.int32)
        for i, r in enumerate(recs):
            if r["springyield"] > 0:
                out[i] = adr
                adr += (4 if key == "jnt" and r["type"] == JointType.BALL else
                        2 if key == "tendon" else 1)
        f[f"{key}_plasticadr"] = out
    kw["nplastic"] = adr


def _history_layout(act_recs, sensor_recs):
    """History buffer addresses (MuJoCo 4's layout: actuators first, then sensors; each
    buffer is 2 + nsample * (1 + dim) numbers: cursor, user slot, sample times, values;
    an actuator's dim is its number of controls)."""
    adr, out = 0, []
    for recs, dims in ((act_recs, [r["ctrlnum"] for r in act_recs]),
                       (sensor_recs, [r["dim"] for r in sensor_recs])):
        a = np.full(len(recs), -1, np.int32)
        for i, (r, dim) in enumerate(zip(recs, dims)):
            nsample = r.get("history", [0, 0])[0]
            if nsample > 0:
                a[i] = adr
                adr += 2 + nsample * (1 + dim)
        out.append(a)
    return out[0], out[1], adr


def _actuator_fields(f, recs, nuser):
    for k in ("trntype", "dyntype", "gaintype", "biastype", "actadr", "actnum", "cranklength",
              "actearly", "forcelimited", "actlimited", "armature", "ctrlspec"):
        f[f"actuator_{k}"] = [r[k] for r in recs]
    f["actuator_trnid"] = _stack([r["trnid"] for r in recs], 2, np.int32)
    for k in ("dynprm", "gainprm", "biasprm"):
        f[f"actuator_{k}"] = _stack([r[k] for r in recs], 10)
    for k in ("forcerange", "actrange"):
        f[f"actuator_{k}"] = _stack([r[k] for r in recs], 2)
    # per-control (nu) and per-output (nout) blocks
    ctrlnum = np.array([r.get("ctrlnum", 1) for r in recs], np.int32)
    outnum = np.array([r.get("outnum", 1) for r in recs], np.int32)
    f["actuator_ctrllimited"] = [lim for r in recs
                                 for lim in r.get("ctrllimiteds", [r["ctrllimited"]])]
    f["actuator_ctrlrange"] = _stack([rng for r in recs
                                      for rng in r.get("ctrlranges", [r["ctrlrange"]])], 2)
    per_out = [r for r, k in zip(recs, outnum) for _ in range(k)]
    f["actuator_lengthrange"] = _stack([r["lengthrange"] for r in per_out], 2)
    f["actuator_gear"] = _stack([r["gear"] for r in per_out], 6)
    f["actuator_group"] = [r["group"] for r in recs]
    f["actuator_damping"] = [r["damping"][0] for r in recs]
    f["actuator_dampingpoly"] = _stack([r["damping"][1:] for r in recs], 2)
    n = len(recs)
    f["actuator_ctrladr"] = np.concatenate([[0], np.cumsum(ctrlnum)[:-1]]) if n else ctrlnum
    f["actuator_outadr"] = np.concatenate([[0], np.cumsum(outnum)[:-1]]) if n else outnum
    f["actuator_ctrlnum"] = ctrlnum
    f["actuator_outnum"] = outnum
    f["actuator_history"] = _stack([r.get("history", [0, 0]) for r in recs], 2, np.int32)
    f["actuator_delay"] = [r.get("delay", 0.0) for r in recs]
    f["actuator_plugin"] = np.full(n, -1)
    f["actuator_user"] = _user(recs, nuser["nuser_actuator"])


def _sensor_fields(f, recs, nuser):
    for k in ("type", "datatype", "needstage", "objtype", "objid", "reftype", "refid", "dim",
              "adr", "cutoff", "noise"):
        f[f"sensor_{k}"] = [r[k] for r in recs]
    f["sensor_intprm"] = _stack([r["intprm"] for r in recs], 3, np.int32)
    f["sensor_history"] = _stack([r.get("history", [0, 0]) for r in recs], 2, np.int32)
    f["sensor_delay"] = [r.get("delay", 0.0) for r in recs]
    f["sensor_interval"] = _stack([r.get("interval", [0.0, 0.0]) for r in recs], 2)
    f["sensor_plugin"] = np.full(len(recs), -1)
    f["sensor_user"] = _user(recs, nuser["nuser_sensor"])


def _eq_fields(f, recs):
    for k in ("type", "objtype"):
        f[f"eq_{k}"] = [e[k] for e in recs]
    f["eq_obj1id"] = [e["obj1"] for e in recs]
    f["eq_obj2id"] = [e["obj2"] for e in recs]
    f["eq_active0"] = [e["active"] for e in recs]
    f["eq_solref"] = _stack([e["solref"] for e in recs], 2)
    f["eq_solimp"] = _stack([e["solimp"] for e in recs], 5)
    f["eq_data"] = _stack([e["data"] for e in recs], 12)


def _contact_fields(f, root, ids, geoms):
    pairs, excludes = [], []
    for sec in root.children:
        if sec.tag != "contact":
            continue
        for el in sec.children:
            a = el.attrs
            if el.tag == "pair":
                g1 = ids["geom"].get(a.get("geom1"), -1)
                g2 = ids["geom"].get(a.get("geom2"), -1)
                if g1 < 0 or g2 < 0:
                    bad = a.get("geom1") if g1 < 0 else a.get("geom2")
                    raise el.error(f"geom '{bad}' not found in collision pair")
                if geoms[g1]["bodyid"] > geoms[g2]["bodyid"]:
                    g1, g2 = g2, g1
                sig = (geoms[g1]["bodyid"] << 16) + geoms[g2]["bodyid"]
                pairs.append(dict(name=a.get("name") or "", g1=g1, g2=g2, sig=sig, a=a))
            elif el.tag == "exclude":
                b1 = ids["body"].get(a.get("body1"), -1)
                b2 = ids["body"].get(a.get("body2"), -1)
                if b1 < 0 or b2 < 0:
                    bad = a.get("body1") if b1 < 0 else a.get("body2")
                    raise el.error(f"body '{bad}' not found in exclude")
                b1, b2 = min(b1, b2), max(b1, b2)
                excludes.append(dict(name=a.get("name") or "", sig=(b1 << 16) + b2))
    pairs.sort(key=lambda p: p["sig"])
    excludes.sort(key=lambda e: e["sig"])
    f["pair_geom1"] = [p["g1"] for p in pairs]
    f["pair_geom2"] = [p["g2"] for p in pairs]
    f["pair_signature"] = [p["sig"] for p in pairs]
    f["pair_dim"] = [int(p["a"]["condim"]) for p in pairs]
    for k, w in (("solref", 2), ("solreffriction", 2), ("solimp", 5), ("friction", 5)):
        f[f"pair_{k}"] = _stack([p["a"][k] for p in pairs], w)
    for k in ("margin", "gap"):
        f[f"pair_{k}"] = [float(p["a"][k]) for p in pairs]
    f["pair_adhesion"] = [float(p["a"].get("adhesion", 0.0)) for p in pairs]
    f["exclude_signature"] = [e["sig"] for e in excludes]
    f.setdefault("_names", {}).update(pair=[p["name"] for p in pairs],
                                      exclude=[e["name"] for e in excludes])
    return len(pairs), len(excludes)


def _tree_ids(f, kw, ntree, nv, dof_tree, body_tree):
    f["tree_bodyadr"] = np.zeros(ntree)
    f["tree_bodynum"] = np.zeros(ntree)
    f["tree_dofadr"] = np.zeros(ntree)
    f["tree_dofnum"] = np.zeros(ntree)
    cur = -1
    for i in range(1, kw["nbody"]):
        t = body_tree[i]
        if t != -1:
            if t > cur:
                cur += 1
                f["tree_bodyadr"][cur] = i
            f["tree_bodynum"][cur] += 1
    cur = -1
    for i in range(nv):
        if dof_tree[i] > cur:
            cur += 1
            f["tree_dofadr"][cur] = i
        f["tree_dofnum"][cur] += 1


def _key_fields(f, root, kw, qpos0, bodies, size_attrs, act_recs):
    keys = [el for sec in root.children if sec.tag == "keyframe" for el in sec.children]
    pending = getattr(root, "pending_keys", [])
    nkey = max(len(keys) + len(pending), int(size_attrs.get("nkey", 0) or 0))
    nq, nv, nu, na, nmocap = kw["nq"], kw["nv"], kw["nu"], kw["na"], kw["nmocap"]
    mocap = [b for b in bodies if b.mocap]
    mpos0 = np.concatenate([b.pos for b in mocap]) if mocap else np.zeros(0)
    mquat0 = np.concatenate([b.quat for b in mocap]) if mocap else np.zeros(0)
    out = dict(key_time=np.zeros(nkey), key_qpos=np.tile(qpos0, (nkey, 1)),
               key_qvel=np.zeros((nkey, nv)), key_act=np.zeros((nkey, na)),
               key_ctrl=np.zeros((nkey, nu)), key_mpos=np.tile(mpos0, (nkey, 1)),
               key_mquat=np.tile(mquat0, (nkey, 1)),
               # NaN: the initial plastic state, filled in by reference.set0 once the
               # tendons' spring lengths are known
               key_plastic=np.full((nkey, kw["nplastic"]), np.nan))
    names = []
    for i, el in enumerate(keys):
        a = el.attrs
        names.append(a.get("name") or "")
        out["key_time"][i] = float(_get(a, "time", 0.0))
        for attr, field, n in (("qpos", "key_qpos", nq), ("qvel", "key_qvel", nv),
                               ("act", "key_act", na), ("ctrl", "key_ctrl", nu),
                               ("mpos", "key_mpos", 3 * nmocap),
                               ("mquat", "key_mquat", 4 * nmocap),
                               ("plastic", "key_plastic", kw["nplastic"])):
            v = a.get(attr)
            if v is None:
                continue
            v = np.atleast_1d(np.asarray(v, dtype=np.float64))
            if v.size > n:
                raise el.error(f"invalid {attr} size, expected length {n}")
            # a shorter vector keeps the defaults after it (mjCModel::ExpandKeyframe):
            # qpos0, zeros, the mocap bodies' poses (whole mocap bodies only)
            width = {"mpos": 3, "mquat": 4}.get(attr, 1)
            keep = v.size // width * width
            out[field][i, :keep] = v[:keep]
    for i, info in enumerate(pending, start=len(keys)):
        names.append(info["name"])
        _restore_key(out, i, info, bodies, act_recs)
    names += [""] * (nkey - len(names))
    # MuJoCo normalizes the keys' quaternions (free and ball joints, mocap bodies; a
    # zero one becomes the identity)
    quats = [j["qposadr"] + (3 if j["type"] == JointType.FREE else 0)
             for b in bodies for j in b.joints
             if j["type"] in (JointType.FREE, JointType.BALL)]
    for adr in quats:
        out["key_qpos"][:, adr:adr + 4] = _unit_quats(out["key_qpos"][:, adr:adr + 4])
    if out["key_mquat"].size:
        mq = out["key_mquat"].reshape(-1, 4)
        out["key_mquat"] = _unit_quats(mq).reshape(out["key_mquat"].shape)
    f.update(out)
    f.setdefault("_names", {})["key"] = names
    return nkey


def _unit_quats(q):
    """Rows of ``q`` (n, 4) normalized (mju_normalize4: the identity below 1e-15)."""
    n = np.linalg.norm(q, axis=-1, keepdims=True)
    ident = np.broadcast_to(np.array([1.0, 0, 0, 0]), q.shape)
    return np.where(n < 1e-15, ident, q / np.where(n < 1e-15, 1.0, n))


def _restore_key(out, i, info, bodies, act_recs):
    """Key ``i`` of an attached model (mjCModel::RestoreState): the values its elements
    hold under the key's name (see :mod:`simjax.mjcf.attach`), defaults elsewhere."""
    name, given = info["name"], info["given"]
    out["key_time"][i] = info["time"]
    for b in bodies:
        for j in b.joints:
            entry = getattr(j["el"], "keystore", {}).get(name, {})
            if given["qpos"] and "qpos" in entry:
                q = entry["qpos"]
                out["key_qpos"][i, j["qposadr"]:j["qposadr"] + q.size] = q
            if given["qvel"] and "qvel" in entry:
                v = entry["qvel"]
                out["key_qvel"][i, j["dofadr"]:j["dofadr"] + v.size] = v
    if given["ctrl"]:
        for k, r in enumerate(act_recs):
            entry = getattr(r.get("el"), "keystore", {}).get(name, {})
            out["key_ctrl"][i, k] = entry.get("ctrl", 0.0)
    mocap = [b for b in bodies if b.mocap]
    for k, b in enumerate(mocap):
        entry = getattr(b.el, "keystore", {}).get(name, {})
        if given["mpos"] and "mpos" in entry:
            out["key_mpos"][i, 3 * k:3 * k + 3] = entry["mpos"]
        if given["mquat"] and "mquat" in entry:
            out["key_mquat"][i, 4 * k:4 * k + 4] = entry["mquat"]


def _custom_fields(f, kw, root):
    numerics = [el for sec in root.children if sec.tag == "custom" for el in sec.children
                if el.tag == "numeric"]
    datas = []
    for el in numerics:
        a = el.attrs
        d = np.atleast_1d(np.asarray(a.get("data") if a.get("data") is not None else [],
                                     dtype=np.float64))
        size = int(_get(a, "size", -1) if a.get("size") is not None else -1)
        if size < 0:
            size = d.size
        if d.size > size:
            raise el.error("numeric data longer than size")
        full = np.zeros(size)
        full[:d.size] = d
        datas.append(full)
    kw["nnumeric"] = len(datas)
    kw["nnumericdata"] = int(sum(d.size for d in datas))
    f["numeric_size"] = [d.size for d in datas]
    f["numeric_adr"] = np.cumsum([0] + [d.size for d in datas])[:-1]
    f["numeric_data"] = np.concatenate(datas) if datas else np.zeros(0)
    f.setdefault("_names", {})["numeric"] = [el.attrs.get("name") or "" for el in numerics]


def _set_total_mass(f, total):
    mass = f["body_mass"]
    scale = total / max(mass.sum(), 1e-15)
    f["body_mass"] = mass * scale
    f["body_inertia"] = f["body_inertia"] * scale
