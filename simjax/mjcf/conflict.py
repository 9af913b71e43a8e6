"""Global attributes of an attached model against the model's (``<compiler
conflict="warning|merge|error">``; MuJoCo's ResolveConflicts, user_resolver.cc).

A field conflicts when the values differ and the child sets it (an option attribute or
flag given in its XML; sizes and the visual fields compared with their defaults when
neither side gives them). By policy:

- ``warning`` (default): the model keeps its values, a warning lists the conflicts;
- ``merge``: a value only the child sets is adopted; both set: the minimum (timestep,
  tolerances, znear, realtime) or maximum (iteration counts, sizes, zfar), an error for
  the other fields (impratio, density, viscosity, o_margin, integrator, cone, jacobian,
  solver, gravity, wind, magnetic and the o_ arrays); flags the child sets are added;
- ``error``: any conflict of fields both set is an error.

Merged values are written as a last ``<option>`` / ``<size>`` element of the model, so
the compiler reads them as it reads the model's own.
"""
from __future__ import annotations

import warnings

import numpy as np

from simjax.mjcf.parse import Element

_MIN = ("timestep", "tolerance", "ls_tolerance", "noslip_tolerance", "ccd_tolerance",
        "sleep_tolerance")
_MAX = ("iterations", "ls_iterations", "noslip_iterations", "ccd_iterations",
        "sdf_iterations", "sdf_initpoints")
_FIXED = ("impratio", "density", "viscosity", "o_margin", "integrator", "cone", "jacobian",
          "solver", "gravity", "wind", "magnetic", "o_solref", "o_solimp", "o_friction")
_SIZES = {"njmax": -1, "nconmax": -1, "nuserdata": 0, "nkey": 0, "nuser_body": -1,
          "nuser_jnt": -1, "nuser_geom": -1, "nuser_site": -1, "nuser_cam": -1,
          "nuser_tendon": -1, "nuser_actuator": -1, "nuser_sensor": -1}
_VISUAL = (("map", "znear", 0.01, "min"), ("global", "realtime", 1.0, "min"),
           ("map", "zfar", 50.0, "max"))


def _fmt(v):
    return " ".join(f"{x:g}" if isinstance(x, float) else str(x)
                    for x in np.atleast_1d(v).tolist())


class _Resolver:
    def __init__(self, mode):
        self.mode, self.errs, self.warns, self.merged = mode, [], [], {}

    def field(self, name, pv, cv, pa, ca, how=None):
        """One field: values and whether each side sets it; how: "min", "max" or None
        (not mergeable)."""
        if np.array_equal(pv, cv) or not ca:
            return
        pre = (f"{name}: parent has {_fmt(pv)}{'' if pa else ' (default)'}, "
               f"child has {_fmt(cv)}")
        if not pa:
            if self.mode == "merge":
                self.merged[name] = cv
                self.warns.append(pre + ", adopting child value")
            else:
                self.warns.append(pre + ", keeping parent value")
        elif self.mode == "warning":
            self.warns.append(pre + ", keeping parent value")
        elif self.mode == "error" or how is None:
            self.errs.append(pre)
        else:
            m = min(pv, cv) if how == "min" else max(pv, cv)
            desc = "the minimum" if how == "min" else "the maximum"
            self.warns.append(pre + (f", taking {desc}" if m == cv
                                     else f", keeping parent value ({desc})"))
            self.merged[name] = m

    def flags(self, names, pv, cv, pa, ca, on):
        """A flag bitfield: bits set by value ``on`` (disable or enable flags)."""
        child_set = cv & ca
        if not child_set:
            return
        if self.mode == "merge":
            for i, n in enumerate(names):
                if (child_set & ~pv) >> i & 1:
                    self.warns.append(f"flag '{n.capitalize()}': added from child")
                if child_set >> i & 1:
                    self.merged.setdefault("flag", {})[n] = on
            return
        diff = (pv ^ cv) & pa & ca
        for i, n in enumerate(names):
            if diff >> i & 1:
                s = pv >> i & 1
                msg = (f"flag '{n.capitalize()}': parent {'set' if s else 'unset'}, "
                       f"child {'unset' if s else 'set'}")
                if self.mode == "error":
                    self.errs.append(msg)
                else:
                    self.warns.append(msg + ", keeping parent")


def _given(root, tag, sub=None):
    """Attributes given in the model's ``tag`` sections (``sub``: in their ``sub``
    children), last value of each."""
    vals = {}
    for el in root.children:
        if el.tag != tag:
            continue
        for c in ([el] if sub is None else [x for x in el.children if x.tag == sub]):
            vals.update({k: c.attrs[k] for k in c.given})
    return vals


def _flag_bits(root, names, on):
    """(value bits, given bits) of the model's flags in ``names``."""
    given = _given(root, "option", "flag")
    bits = auth = 0
    for i, n in enumerate(names):
        if n in given:
            auth |= 1 << i
            bits |= (given[n] == on) << i
    return bits, auth


def _visit(r, parent, child):
    from simjax.mjcf.compile import _FLAG_DISABLE, _FLAG_ENABLE, _options
    po, co = _options(parent), _options(child)
    pg, cg = _given(parent, "option"), _given(child, "option")
    for how, names in (("min", _MIN), ("max", _MAX), (None, _FIXED)):
        for n in names:
            r.field(n, po[n], co[n], n in pg, n in cg, how)
    for names, on in ((_FLAG_DISABLE, "disable"), (_FLAG_ENABLE, "enable")):
        # every flag bit is clear by default: the given flags are the whole value
        (pv, pa), (cv, ca) = _flag_bits(parent, names, on), _flag_bits(child, names, on)
        r.flags(names, pv, cv, pa, ca, on)
    for sec, name, dval, how in _VISUAL:
        pvis, cvis = _given(parent, "visual", sec), _given(child, "visual", sec)
        r.field(name, float(pvis.get(name, dval)), float(cvis.get(name, dval)),
                name in pvis, name in cvis, how)
    ps, cs = _given(parent, "size"), _given(child, "size")
    for name, dval in _SIZES.items():
        pv, cv = int(ps.get(name, dval)), int(cs.get(name, dval))
        r.field("size:" + name, pv, cv, pv != dval, cv != dval, "max")


def resolve(parent, child, child_name, attach_el):
    """Applies the model's conflict policy to an attachment of ``child`` (parsed root)
    named ``child_name``. Raises MJCFError at ``attach_el`` for an error; warns."""
    mode = "warning"
    for el in parent.children:
        if el.tag == "compiler" and "conflict" in el.given:
            mode = el.attrs["conflict"]
    r = _Resolver(mode)
    _visit(r, parent, child)
    pname = parent.attrs.get("model") or ""
    subject = (f"Attach conflict when attaching '{child_name}'"
               + (f" to '{pname}'" if pname else "") + f", policy is '{mode}'")
    if r.errs:
        raise attach_el.error("\n".join([subject] + r.errs).replace("size:", ""))
    if r.warns:
        warnings.warn("\n".join([subject] + r.warns).replace("size:", ""), stacklevel=2)
    if r.merged:
        _write(parent, attach_el, r.merged)


def _write(parent, at, merged):
    """Appends the merged values to the model as last <option> and <size> elements."""
    def element(tag, vals, children=()):
        return Element(tag=tag, attrs=dict(vals), given=frozenset(vals),
                       children=list(children), file=at.file, line=at.line,
                       path=f"{at.path}/{tag}")
    flags = merged.pop("flag", {})
    sizes = {k[5:]: v for k, v in merged.items() if k.startswith("size:")}
    opts = {k: v for k, v in merged.items()
            if not k.startswith("size:") and k not in ("znear", "zfar", "realtime")}
    enums = {"integrator", "cone", "jacobian", "solver"}
    if any(k in enums for k in opts):        # unmergeable: an adopted child value only
        from simjax.mjcf.compile import _ENUMS
        for k in enums & set(opts):
            opts[k] = {v: kw for kw, v in _ENUMS[k].items()}[opts[k]]
    if opts or flags:
        parent.children.append(element("option", opts,
                                        [element("flag", flags)] if flags else ()))
    if sizes:
        parent.children.append(element("size", sizes))
