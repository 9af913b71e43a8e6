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


def test_traced_call_holds_the_pause_until_lowered(gc_restored):
    """Traced inside a jit, the pause outlasts the call (jax re-batches and lowers the
    enclosing program after it) and ends once jax has lowered that program."""
    after = []

    @gc_pause.gc_paused
    def f(x):
        return x * 2

    def outer(x):
        y = jax.vmap(f)(x)
        after.append(gc.isenabled())      # still inside the jit trace
        return y + 1

    gc.enable()
    out = jax.jit(outer)(np.arange(3.0))
    np.testing.assert_allclose(out, [1.0, 3.0, 5.0])
    assert after == [False] and gc.isenabled()
    # an eager call is not held
    assert f(np.float64(2.0)) == 4.0 and gc.isenabled()


def test_hold_switch_off_and_errors_resume_at_once(gc_restored, monkeypatch):
    after = []

    @gc_pause.gc_paused
    def f(x):
        return x * 2

    @gc_pause.gc_paused
    def bad(x):
        raise ValueError("boom")

    def outer(x):
        y = f(x)
        after.append(gc.isenabled())
        return y

    gc.enable()
    monkeypatch.setattr(gc_pause, "HOLD", False)
    jax.jit(outer)(1.0)
    monkeypatch.setattr(gc_pause, "HOLD", True)
    with pytest.raises(ValueError, match="boom"):
        jax.jit(bad)(1.0)
    assert after == [True] and gc.isenabled()


def test_hold_without_lowering_ends_by_the_fallback(gc_restored, monkeypatch):
    """A trace that is never lowered (make_jaxpr) ends the hold by the fallback timer."""
    import time

    @gc_pause.gc_paused
    def f(x):
        return x * 2

    monkeypatch.setattr(gc_pause, "_FALLBACK_S", 0.05)
    gc.enable()
    jax.make_jaxpr(lambda x: f(x) + 1)(1.0)
    for _ in range(100):
        if gc.isenabled():
            break
        time.sleep(0.02)
    assert gc.isenabled()


def test_eager_vmap_is_paused_for_the_call_alone(gc_restored):
    """Outside a jit trace (an eager vmap: no lowering follows) nothing is held."""
    @gc_pause.gc_paused
    def f(x):
        return x * 2

    gc.enable()
    np.testing.assert_allclose(jax.vmap(f)(np.arange(3.0)), [0.0, 2.0, 4.0])
    assert gc.isenabled() and not gc_pause._state["held"]


def _generation_of(obj):
    for g in range(3):
        if any(o is obj for o in gc.get_objects(generation=g)):
            return g
    return None


def test_hold_end_moves_the_traced_objects_to_the_oldest_generation(gc_restored,
                                                                    monkeypatch):
    """Objects allocated while a hold paused the collector are in its oldest generation
    once the program is lowered (not walked by a young collection); with PROMOTE off
    they are left in the young ones; a caller's frozen objects stay frozen."""
    def traced(promote):
        monkeypatch.setattr(gc_pause, "PROMOTE", promote)
        kept = []

        @gc_pause.gc_paused
        def f(x):
            kept.append([[]])           # a tracked object made while paused
            return x * 2

        gc.enable()
        jax.jit(lambda x: jax.vmap(f)(x) + 1)(np.arange(3.0 + promote))
        assert gc.isenabled() and not gc_pause._state["held"]
        return kept[0]

    thresholds = gc.get_threshold()
    # no middle-generation collection (which would move the object to the oldest)
    gc.set_threshold(thresholds[0], 10 ** 9, thresholds[2])
    try:
        gc.collect()
        assert _generation_of(traced(True)) == 2
        gc.collect()
        assert _generation_of(traced(False)) in (0, 1)
        frozen = [[]]
        gc.collect()
        gc.freeze()
        try:
            count = gc.get_freeze_count()
            assert count > 0
            assert _generation_of(traced(True)) in (0, 1)
            assert gc.get_freeze_count() == count
            assert _generation_of(frozen) is None      # still in the permanent generation
        finally:
            gc.unfreeze()
    finally:
        gc.set_threshold(*thresholds)
