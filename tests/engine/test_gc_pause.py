"""The collector pause around simjax.step / forward / inverse (simjax.engine.gc_pause)."""
import gc

import jax
import numpy as np
import pytest

import simjax
from simjax.engine import gc_pause

XML = """<mujoco><worldbody><body><joint type="hinge"/><geom size="0.1" mass="1"/>
</body></worldbody></mujoco>"""


@pytest.fixture
def gc_restored():
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()


def test_paused_inside_and_restored(gc_restored):
    seen = []

    @gc_pause.gc_paused
    def f(x):
        seen.append(gc.isenabled())
        return x + 1

    gc.enable()
    assert f(1) == 2
    assert seen == [False] and gc.isenabled()
    gc.disable()            # a caller's own pause is left as it is
    assert f(2) == 3
    assert seen == [False, False] and not gc.isenabled()


def test_restored_after_exception(gc_restored):
    @gc_pause.gc_paused
    def bad():
        raise ValueError("boom")

    gc.enable()
    with pytest.raises(ValueError, match="boom"):
        bad()
    assert gc.isenabled()


def test_nested_calls_keep_the_pause(gc_restored):
    inner_state = []

    @gc_pause.gc_paused
    def inner():
        inner_state.append(gc.isenabled())

    @gc_pause.gc_paused
    def outer():
        inner()
        inner_state.append(gc.isenabled())   # still paused after the inner call

    gc.enable()
    outer()
    assert inner_state == [False, False] and gc.isenabled()


def test_step_forward_inverse_run_with_gc_paused(gc_restored, monkeypatch):
    """The collector is off while step (traced under jit), forward and inverse run their
    stages, back on after; the results are those of the stages."""
    import importlib
    fwd_mod = importlib.import_module("simjax.engine.forward")
    inv_mod = importlib.import_module("simjax.engine.inverse")
    seen = {}

    def spy(name, fn):
        def wrapped(*args, **kwargs):
            seen.setdefault(name, []).append(gc.isenabled())
            return fn(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(fwd_mod, "_step", spy("step", fwd_mod._step))
    monkeypatch.setattr(fwd_mod, "_forward", spy("forward", fwd_mod._forward))
    monkeypatch.setattr(inv_mod, "inv_position", spy("inverse", inv_mod.inv_position))
    m = simjax.load_model(XML)
    d = simjax.make_data(m).replace(qvel=np.array([0.3]))
    gc.enable()
    out = jax.jit(lambda d: simjax.step(m, d))(d)
    assert gc.isenabled()
    fwd = simjax.forward(m, d)
    assert gc.isenabled()
    inv = simjax.inverse(m, fwd)
    assert gc.isenabled()
    # (step's trace runs _forward too)
    assert set(seen) == {"step", "forward", "inverse"}
    assert not any(any(v) for v in seen.values())
    assert simjax.step.__name__ == "step" and "mj_step" in simjax.step.__doc__
    np.testing.assert_allclose(out.qvel, fwd.qvel + m.opt.timestep * fwd.qacc, rtol=1e-6)
    np.testing.assert_allclose(inv.qfrc_inverse, fwd.qfrc_actuator + fwd.qfrc_passive
                               + fwd.qfrc_applied, atol=1e-6)
