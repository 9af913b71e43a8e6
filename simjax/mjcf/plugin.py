"""Compiling ``<extension>`` and plugin references (numpy only).

MuJoCo's rules (xml_native_reader.cc ``Extension`` / ``OnePlugin``, user_model.cc
``ResolvePlugin`` / ``CopyPlugins``, mjCPlugin::Compile):

- ``<extension><plugin plugin="name">`` declares (activates) a plugin: a name that is
  not registered is an error at that element;
- ``<instance name=..>`` children create explicit instances, configured by
  ``<config key= value=>`` (duplicate keys are errors);
- an element (body passive force, geom / mesh SDF, actuator, sensor) backed by a
  plugin either names ``instance`` (an explicit instance; one instance may back many
  elements) or names ``plugin`` and gets its own implicit instance configured by its
  own ``<config>`` children. Instances are numbered in document order of creation;
- referencing an undeclared plugin, an unknown instance, giving neither, or a plugin
  without the needed capability are errors at the referencing element;
- config keys not declared by the plugin are errors (``unrecognized attribute
  'plugin:key'``); values are checked by the plugin's ``validate`` / ``nstate`` /
  ``init`` (MuJoCo's ``init`` failures are load errors too).

One deliberate difference: MuJoCo 4.0 silently ignores ``<config>`` children of an
element that names an existing ``instance``; simjax reports them as an error (the
message MuJoCo's reader has for this case), since ignoring a configuration the user
wrote is a silent approximation.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from simjax.errors import MJCFError
from simjax.types import ObjType, SensorType, Stage

#: parent tag of a referencing <plugin> element -> (kind, capability bit, phrase)
_KINDS = {"body": ("body", 4, "passive forces"), "worldbody": ("body", 4, "passive forces"),
          "geom": ("geom", 8, "sign distance fields"),
          "mesh": ("mesh", 8, "signed distance fields"),
          "actuator": ("actuator", 1, "actuators"), "sensor": ("sensor", 2, "sensors")}

_OBJTYPES = {t.name.lower(): t for t in ObjType if t != ObjType.UNKNOWN}


@dataclasses.dataclass
class _Inst:
    name: str
    plugin: str            # plugin name ('' until resolved for an implicit instance)
    config: dict
    el: object             # element that created it (errors are reported there)
    slot: int = -1
    impl: object = None
    elements: dict = dataclasses.field(default_factory=lambda: {
        "actuator": [], "sensor": [], "body": [], "geom": [], "mesh": []})


class PluginTable:
    """Plugin declarations, instances and element references of one model."""

    def __init__(self, root):
        from simjax.plugins import registry
        self.registry = registry
        self.active: dict[str, tuple] = {}   # name -> (slot, Plugin)
        self.instances: list[_Inst] = []
        self.by_name: dict[str, int] = {}
        self.refs: dict[int, tuple] = {}      # id(element) -> (kind, el)
        self._walk(root, None, in_extension=False)

    # ------------------------------------------------------------------ parse pass
    def _walk(self, el, parent, in_extension):
        for ch in el.children:
            if ch.tag == "extension":
                self._extension(ch)
                continue
            if ch.tag == "plugin" and el.tag in _KINDS:
                self._reference(ch, el)
            elif ch.tag == "plugin" and el.tag not in ("extension",):
                # plugins of composite / flexcomp are not supported; those elements
                # raise UnsupportedFeatureError where they are compiled
                pass
            self._walk(ch, el, in_extension)

    def _extension(self, sec):
        for p in sec.children:
            if p.tag != "plugin":
                continue
            name = p.attrs["plugin"]
            found = self.registry.find(name)
            if found is None:
                raise p.error(f"plugin {name} not found")
            self.active[name] = found
            for inst in p.children:
                if inst.tag != "instance":
                    continue
                iname = inst.attrs["name"]
                if iname in self.by_name:
                    raise inst.error(f"repeated name '{iname}' in plugin")
                self.by_name[iname] = len(self.instances)
                self.instances.append(_Inst(iname, name, _configs(inst), inst))

    def _reference(self, el, owner):
        """A <plugin> element backing ``owner`` (or the actuator / sensor itself)."""
        kind = _KINDS[owner.tag][0]
        a = el.attrs
        self.refs[id(el)] = (kind, el)
        if not a.get("instance"):
            inst = _Inst("", a.get("plugin") or "", _configs(el), el)
            self.refs[id(el)] = (kind, el, len(self.instances))
            self.instances.append(inst)
        elif any(c.tag == "config" for c in el.children):
            raise el.error("plugin configuration attributes cannot be used in an element "
                           "that references a predefined plugin instance")

    # ------------------------------------------------------------------ resolution
    def resolve(self, el, kind, index):
        """Instance id backing element ``el`` (a <plugin> element) of ``kind``
        ('actuator', 'sensor', 'body', 'geom', 'mesh') with id ``index``."""
        ref = self.refs.get(id(el))
        a = el.attrs
        pname, iname = a.get("plugin") or "", a.get("instance") or ""
        what = {"body": "body", "geom": "geom", "mesh": "mesh", "actuator": "actuator",
                "sensor": "sensor"}[kind]
        if not pname and not iname:
            raise el.error(f"neither 'plugin' nor 'instance' is specified for {what}")
        if iname:
            if iname not in self.by_name:
                raise el.error(f"unrecognized name '{iname}' for plugin instance")
            iid = self.by_name[iname]
            inst = self.instances[iid]
            if pname and pname != inst.plugin:
                if pname not in self.active:
                    raise el.error(f"unrecognized plugin '{pname}'")
                raise el.error("'plugin' attribute does not match that of the instance")
        else:
            iid = ref[2]
            inst = self.instances[iid]
        if inst.plugin not in self.active:
            raise el.error(f"unrecognized plugin '{inst.plugin}'")
        slot, impl = self.active[inst.plugin]
        cap = {"actuator": 1, "sensor": 2, "body": 4, "geom": 8, "mesh": 8}[kind]
        if not impl.capabilities & cap:
            phrase = {1: "actuators", 2: "sensors", 4: "passive forces",
                      8: "signed distance fields"}[cap]
            raise el.error(f"plugin '{impl.name}' does not support {phrase}")
        inst.slot, inst.impl = slot, impl
        inst.elements[kind].append(index)
        return iid

    def check_configs(self):
        """Unknown config keys (mjCPlugin::Compile); every instance must be resolved."""
        for inst in self.instances:
            if inst.impl is None:
                if inst.plugin not in self.active:
                    raise inst.el.error(f"unrecognized plugin '{inst.plugin}'")
                inst.slot, inst.impl = self.active[inst.plugin]
            for key in inst.config:
                if key not in inst.impl.attributes:
                    raise inst.el.error(f"unrecognized attribute 'plugin:{key}' for plugin "
                                        f"{inst.impl.name}'")

    # ------------------------------------------------------------------ element hooks
    def plugin_child(self, el):
        """The <plugin> child of a body / geom / mesh element, or None."""
        for ch in el.children:
            if ch.tag == "plugin":
                return ch
        return None

    def instance_spec(self, iid, **extra):
        from simjax.plugins.protocol import Config, PluginInstance
        inst = self.instances[iid]
        items = tuple((k, inst.config[k]) for k in inst.impl.attributes if k in inst.config)
        return PluginInstance(
            id=iid, name=inst.name, plugin=inst.impl.name, config=Config(items),
            actuators=tuple(inst.elements["actuator"]), sensors=tuple(inst.elements["sensor"]),
            bodies=tuple(inst.elements["body"]), geoms=tuple(inst.elements["geom"]),
            meshes=tuple(inst.elements["mesh"]), **extra)

    def _call(self, iid, fn, *args):
        """Run a plugin's compile-time function; ValueError -> MJCFError at the
        instance's element."""
        try:
            return fn(*args)
        except MJCFError:
            raise
        except (ValueError, TypeError) as err:
            inst = self.instances[iid]
            raise inst.el.error(f"plugin '{inst.impl.name}': {err}") from None


def _configs(el):
    """{key: value} of the <config> children of ``el`` (duplicate keys are errors)."""
    out = {}
    for ch in el.children:
        if ch.tag != "config":
            continue
        key, value = ch.attrs["key"], ch.attrs["value"]
        if key in out:
            raise ch.error(f"duplicate config key: {key}")
        out[key] = str(value)
    return out


# ----------------------------------------------------------------------------- compile
def sensor_record(el, ids):
    """Record of a <plugin> sensor: object / reference (any object type), dim and stage
    are filled in by :func:`finish` once the instance is known."""
    a = el.attrs
    r = dict(type=SensorType.PLUGIN, dim=0, objtype=ObjType.UNKNOWN, objid=-1,
             reftype=ObjType.UNKNOWN, refid=-1, intprm=[0, 0, 0], el=el)
    for which in ("obj", "ref"):
        t, n = a.get(f"{which}type"), a.get(f"{which}name")
        if t and not n:
            raise el.error(f"{which}type is specified but {which}name is not")
        if n and not t:
            raise el.error(f"{which}name is specified but {which}type is not")
        if not t:
            continue
        if t not in _OBJTYPES:
            raise el.error(f"invalid {which}type '{t}' in sensor")
        otype = _OBJTYPES[t]
        key = {"xbody": "body"}.get(t, t)
        table = ids.get(key)
        if table is None or n not in table:
            raise el.error(f"unrecognized name '{n}' of {which} object in sensor")
        r[f"{which}type"] = otype
        r[f"{which}id"] = table[n]
    return r


def actuator_checks(el, a, dyn):
    """actnum of a plugin actuator (MuJoCo skips the built-in actdim rules for them)."""
    actdim = a.get("actdim")
    actdim = -1 if actdim is None else int(actdim)
    return actdim if actdim >= 0 else int(dyn != 0)


def compile_plugins(table, bodies, geom_els, meshes_els, act_recs, sensor_recs):
    """Resolve every reference; returns per-kind instance id arrays and the instance
    list, and fixes plugin sensors' dims, stages and all sensor addresses."""
    out = {}
    body_plugin = np.full(len(bodies), -1, np.int32)
    for b in bodies:
        ch = table.plugin_child(b.el) if b.el is not None else None
        if ch is not None:
            body_plugin[b.id] = table.resolve(ch, "body", b.id)
    geom_plugin = np.full(len(geom_els), -1, np.int32)
    for i, el in enumerate(geom_els):
        ch = table.plugin_child(el)
        if ch is not None:
            geom_plugin[i] = table.resolve(ch, "geom", i)
    # meshes were resolved when they were meshed (simjax.mjcf.sdf_mesh)
    act_plugin = np.full(len(act_recs), -1, np.int32)
    for i, r in enumerate(act_recs):
        if r["el"].tag == "plugin":
            act_plugin[i] = table.resolve(r["el"], "actuator", i)
    sensor_plugin = np.full(len(sensor_recs), -1, np.int32)
    for i, r in enumerate(sensor_recs):
        if r["type"] == SensorType.PLUGIN:
            sensor_plugin[i] = table.resolve(r["el"], "sensor", i)
    table.check_configs()
    # sensor dimensions and stages (CopyPlugins: nsensordata, needstage)
    adr = 0
    for i, r in enumerate(sensor_recs):
        if sensor_plugin[i] >= 0:
            iid = int(sensor_plugin[i])
            impl = table.instances[iid].impl
            spec = table.instance_spec(iid)
            r["dim"] = int(table._call(iid, impl.nsensordata, spec, i))
            r["needstage"] = Stage(impl.needstage)
        r["adr"] = adr
        adr += r["dim"]
    out.update(body_plugin=body_plugin, geom_plugin=geom_plugin, actuator_plugin=act_plugin,
               sensor_plugin=sensor_plugin)
    return out


def finish_model(table, model):
    """Instance specs, state addresses, plugin actdim checks, params and the Model
    fields nplugin / plugin / plugin_stateadr / plugin_statenum / npluginstate."""
    import jax
    n = len(table.instances)
    if not n:
        return model
    adr = np.asarray(model.sensor_adr)
    dim = np.asarray(model.sensor_dim)
    specs, stateadr, statenum = [], [], []
    cursor = 0
    for iid, inst in enumerate(table.instances):
        impl = inst.impl
        pre = table.instance_spec(iid)
        nstate = int(table._call(iid, impl.nstate, pre)) if impl.nstate else 0
        if nstate < 0:
            raise inst.el.error(f"plugin '{impl.name}': negative nstate")
        actdim = int(table._call(iid, impl.actdim, pre)) if impl.actdim else 0
        spec = dataclasses.replace(
            pre, stateadr=cursor, statenum=nstate, actdim=actdim,
            sensor_adr=tuple(int(adr[s]) for s in pre.sensors),
            sensor_dim=tuple(int(dim[s]) for s in pre.sensors))
        _check_actnum(inst, spec, model)
        specs.append(spec)
        stateadr.append(cursor)
        statenum.append(nstate)
        cursor += nstate
    model = model.replace(
        nplugin=n, npluginstate=cursor, plugin_specs=tuple(specs),
        plugin=np.array([inst.slot for inst in table.instances], np.int32),
        plugin_stateadr=np.array(stateadr, np.int32),
        plugin_statenum=np.array(statenum, np.int32))
    params = []
    for iid, (inst, spec) in enumerate(zip(table.instances, specs)):
        if inst.impl.validate is not None:
            table._call(iid, inst.impl.validate, spec, model)
        p = table._call(iid, inst.impl.init, spec, model) if inst.impl.init else ()
        params.append(jax.tree_util.tree_map(_as_leaf, p))
    return model.replace(plugin_params=tuple(params))


def _as_leaf(x):
    """Float numpy values become jax arrays (differentiable, vmappable leaves)."""
    if isinstance(x, (np.ndarray, np.floating, float)) and \
            np.issubdtype(np.asarray(x).dtype, np.floating):
        from simjax.types import leaf
        return leaf(x)
    return x


def _check_actnum(inst, spec, model):
    """Each backed actuator's act slots: the plugin's actdim, plus one for a stateful
    built-in dyntype (the check mujoco.pid's init makes, generalised)."""
    if not spec.actuators:
        return
    actnum = np.asarray(model.actuator_actnum)
    dyn = np.asarray(model.actuator_dyntype)
    for a in spec.actuators:
        expected = spec.actdim + int(dyn[a] in (1, 2, 3))
        if actnum[a] != expected:
            raise inst.el.error(
                f"actuator {a} has actdim {actnum[a]}, expected {expected}. Add "
                f"actdim=\"{expected}\" to the actuator plugin element.")
