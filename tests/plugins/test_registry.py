"""Plugin registration: slots, register, load_library (module, path), entry points,
protocol validation."""
import importlib.metadata
import sys
import textwrap
import types

import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

import simjax
from simjax.plugins import Capability, Plugin, registry


def test_first_party_slots_match_mujoco():
    """Model.plugin holds registry slots; first-party plugins take MuJoCo's slots."""
    for name in ("mujoco.pid", "mujoco.sensor.touch_grid", "mujoco.sdf.bolt",
                 "mujoco.sdf.bowl", "mujoco.sdf.gear", "mujoco.sdf.nut", "mujoco.sdf.torus"):
        xml = f'<mujoco><extension><plugin plugin="{name}"/></extension></mujoco>'
        mujoco.MjModel.from_xml_string(xml)
        assert simjax.plugins.find(name) is not None
    assert [simjax.plugins.find(n)[0] for n in ("mujoco.pid", "mujoco.sensor.touch_grid",
                                                "mujoco.sdf.bolt", "mujoco.sdf.torus")] == \
        [0, 1, 2, 6]


def _const_sensor(name, value=3.0):
    return Plugin(name=name, capabilities=Capability.SENSOR, attributes=("v",),
                  nstate=lambda inst: 0, nsensordata=lambda inst, s: 2,
                  init=lambda inst, m: {"v": np.float64(inst.config.float("v", value))},
                  compute=lambda m, d, inst, p, s, cap: jnp.full(2, p["v"]),
                  needstage=simjax.Stage.POS)


def _model(name):
    return simjax.load_model(f"""<mujoco><extension><plugin plugin="{name}"/></extension>
      <worldbody><body><freejoint/><geom size=".1"/></body></worldbody>
      <sensor><plugin plugin="{name}"><config key="v" value="7"/></plugin></sensor>
      </mujoco>""")


def test_register_and_use():
    p = _const_sensor("test.const_sensor")
    slot = simjax.plugins.register(p)
    assert simjax.plugins.register(p) == slot            # same object: no-op
    with pytest.raises(ValueError, match="already registered"):
        simjax.plugins.register(_const_sensor("test.const_sensor"))
    m = _model("test.const_sensor")
    assert m.nsensordata == 2 and int(m.plugin[0]) == slot
    from simjax.plugins import engine
    d = engine.compute_sensors(m, simjax.engine.make_data(m))
    np.testing.assert_array_equal(d.sensordata, [7.0, 7.0])


def test_load_library_module_and_path(tmp_path):
    src = textwrap.dedent('''
        import jax.numpy as jnp
        from simjax.plugins import Capability, Plugin
        LIBSENSOR = Plugin(name="test.lib_{k}", capabilities=Capability.SENSOR,
                           attributes=("v",), nstate=lambda inst: 0,
                           nsensordata=lambda inst, s: 1,
                           compute=lambda m, d, inst, p, s, cap: jnp.ones(1))
    ''')
    path = tmp_path / "mylib.py"
    path.write_text(src.replace("{k}", "path"))
    assert simjax.plugins.load_library(str(path)) == ["test.lib_path"]
    mod = types.ModuleType("test_plugin_module")
    exec(src.replace("{k}", "module"), mod.__dict__)
    sys.modules["test_plugin_module"] = mod
    assert simjax.plugins.load_library("test_plugin_module") == ["test.lib_module"]
    assert _model("test.lib_path").nsensordata == 1
    with pytest.raises(FileNotFoundError):
        simjax.plugins.load_library(str(tmp_path / "missing.py"))


def test_entry_points_discovered(monkeypatch):
    calls = []

    class EP:
        name = "fake"

        def load(self):
            def factory():
                calls.append(1)
                return [_const_sensor("test.entry_point")]
            return factory
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda group=None: [EP()] if group == "simjax.plugins" else [])
    monkeypatch.setitem(registry._STATE, "entry_points", False)
    assert simjax.plugins.find("test.entry_point") is not None and calls == [1]
    assert _model("test.entry_point").nsensordata == 2


def test_protocol_validation():
    with pytest.raises(ValueError, match="needs a compute"):
        Plugin(name="x", capabilities=Capability.ACTUATOR)
    with pytest.raises(ValueError, match="needs nsensordata"):
        Plugin(name="x", capabilities=Capability.SENSOR, compute=lambda *a: 0)
    with pytest.raises(ValueError, match="sdf_distance and sdf_aabb"):
        Plugin(name="x", capabilities=Capability.SDF)
    with pytest.raises(ValueError, match="no capability"):
        Plugin(name="x", capabilities=0)
