"""Entry points called eagerly run as one compiled program (simjax.engine.eager)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import simjax
from simjax.engine import eager

# two hinges, the first past its limit (a constraint row), a motor and sensors
XML = """<mujoco>
  <worldbody>
    <body><joint name="h" type="hinge" axis="0 1 0" range="-.2 .2" limited="true"/>
      <geom type="capsule" size=".03" fromto="0 0 0 .2 0 0"/>
      <body pos=".2 0 0"><joint type="hinge" axis="0 1 0"/>
        <geom type="capsule" size=".03" fromto="0 0 0 .2 0 0"/></body></body>
  </worldbody>
  <actuator><motor name="m" joint="h" gear="2"/></actuator>
  <sensor><jointpos joint="h"/><actuatorfrc actuator="m"/></sensor>
</mujoco>"""


@pytest.fixture(scope="module")
def model():
    m = simjax.load_model(XML)
    d = simjax.make_data(m).replace(qpos=np.array([0.3, 0.1]), qvel=np.array([0.2, -0.1]),
                                   ctrl=np.array([0.3]))
    return m, d


class _Compiles:
    """Counts XLA compiles (jax.monitoring's backend-compile events) while active."""

    def __enter__(self):
        self.n = 0
        self._on = True

        def listen(event, duration, **kw):
            if self._on and event == "/jax/core/compile/backend_compile_duration":
                self.n += 1

        jax.monitoring.register_event_duration_secs_listener(listen)
        return self

    def __exit__(self, *exc):
        self._on = False


def _has_program(fn, m):
    """Whether ``fn`` (an entry point) holds a program for the model ``m``'s arrays."""
    leaves, treedef = jax.tree_util.tree_flatten(m)
    return (treedef, tuple(map(id, leaves))) in fn.programs[()]


def _traced(fn, m, d):
    """fn(m, d) traced in line: under jit(vmap) over a batch of one world."""
    one = jax.tree_util.tree_map(lambda x: jnp.asarray(x)[None], d)
    out = jax.jit(jax.vmap(fn, in_axes=(None, 0)))(m, one)
    return jax.tree_util.tree_map(lambda x: x[0], out)


def _close(a, b, rtol=1e-10, atol=1e-12):
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


@pytest.mark.parametrize("name", ["forward", "step", "inverse"])
def test_eager_call_is_one_program_with_traced_values(model, name):
    m, d = model
    fn = getattr(simjax, name)
    arg = simjax.forward(m, d) if name == "inverse" else d
    with _Compiles() as c:
        out = fn(m, arg)
    # one program (op by op: a program per operation and shape, unless cached); its
    # values those of the in-line trace
    assert _has_program(fn, m)
    assert c.n <= 1, c.n
    assert int(out.nefc) >= 1
    _close(out, _traced(fn, m, arg))
    with _Compiles() as c:
        again = fn(m, d=arg)                # by name too
    assert c.n == 0
    _close(again, out, rtol=0, atol=0)


def test_other_model_values_get_their_own_program(model):
    """The model's arrays are the program's constants (concrete at trace time, as op by
    op): a model of other values compiles its own; the programs used last are kept
    (eager.KEEP), the others dropped."""
    m, d = model
    first = simjax.forward(m, d)
    heavier = m.replace(opt=m.opt.replace(gravity=jnp.asarray([0.0, 0.0, -20.0])))
    with _Compiles() as c:
        out = simjax.forward(heavier, d)
    assert c.n == 1 and _has_program(simjax.forward, heavier)
    assert not np.allclose(out.qacc, first.qacc)
    _close(out, _traced(simjax.forward, heavier, d))
    # the same arrays in another Model object (as vmap rebuilds an unbatched model):
    # the same program
    same = jax.tree_util.tree_map(lambda x: x, heavier)
    assert same is not heavier
    with _Compiles() as c:
        _close(simjax.forward(same, d), out, rtol=0, atol=0)
    assert c.n == 0
    simjax.forward(m, d)                    # m used last
    others = [m.replace(opt=m.opt.replace(timestep=jnp.asarray(0.001 * (k + 1))))
              for k in range(eager.KEEP - 1)]
    for other in others:
        simjax.forward(other, d)
    assert len(simjax.forward.programs[()]) == eager.KEEP
    assert not _has_program(simjax.forward, heavier)
    assert all(_has_program(simjax.forward, x) for x in [m] + others)
    # a model object whose program was dropped gets a new one
    with _Compiles() as c:
        _close(simjax.forward(heavier, d), out, rtol=0, atol=0)
    assert c.n == 1 and _has_program(simjax.forward, heavier)
    assert len(simjax.forward.programs[()]) == eager.KEEP


def test_concrete_model_checks_still_raise(model):
    """A trace-time check on the model's values (a friction loss made non-zero where
    the structure has no row) raises as it did op by op; with the model an argument
    of the program it would have been a tracer and the check skipped."""
    m, d = model
    with pytest.raises(ValueError, match="frictionloss"):
        simjax.forward(m.replace(dof_frictionloss=np.array([0.5, 0.0])), d)


def test_traced_and_disabled_jit_calls_run_in_line(model):
    """Under jit (and scan, a staged trace) and disable_jit the function runs in line;
    under vmap and grad outside jit, with jit enabled, its jit program is batched or
    differentiated whole (the function traced by jit), the model batched too."""
    seen, whole = [], []

    def f(owner, x):
        seen.append(type(x).__name__)
        return x * 2

    # the check runs before the choice: it records the choice the call will make
    plain = eager.compiled_when_eager(
        lambda *args: whole.append(eager.called_eagerly(args)))(f)
    owner = jnp.zeros(1)                    # stands for the model
    plain(owner, jnp.ones(2))               # eager: traced by its jit
    jax.vmap(lambda x: plain(owner, x))(jnp.arange(3.0))
    jax.grad(lambda x: plain(owner, x))(2.0)
    jax.jit(lambda x: plain(owner, x))(jnp.ones(3))
    jax.lax.scan(lambda c, x: (plain(owner, c), None), jnp.ones(4), None, length=1)
    jax.vmap(lambda o, x: plain(o, x))(jnp.zeros((2, 1)), jnp.ones(2))   # batched model
    with jax.disable_jit():
        plain(owner, jnp.ones(2))
    assert whole == [True] * 3 + [False] * 2 + [True, False], whole
    assert seen == ["DynamicJaxprTracer"] * 6 + ["ArrayImpl"], seen
    m, d = model
    out = jax.jit(jax.vmap(lambda q: simjax.forward(m, d.replace(qpos=q))))(
        jnp.stack([d.qpos, d.qpos + 0.01]))
    np.testing.assert_allclose(out.qacc[0], simjax.forward(m, d).qacc, rtol=1e-9,
                               atol=1e-10)
    g = jax.jit(jax.grad(lambda v: simjax.step(m, d.replace(qvel=v)).qpos[1]))(d.qvel)
    assert np.all(np.isfinite(g)) and np.any(g != 0)


def test_vmap_called_eagerly_is_one_program(model):
    """jax.vmap of an entry point outside jit: its program batched whole, compiled on
    the first call only (op by op, every operation batched and dispatched alone), its
    values those of jit(vmap)."""
    m, d = model
    batch = jax.tree_util.tree_map(lambda x: jnp.stack([x, x]), d)
    batch = batch.replace(qvel=batch.qvel.at[1].add(0.5))
    step = jax.vmap(simjax.step, in_axes=(None, 0))
    out = step(m, batch)
    with _Compiles() as c:
        again = step(m, batch)
    assert c.n == 0
    _close(again, out, rtol=0, atol=0)
    _close(out, jax.jit(step)(m, batch))
    assert not np.allclose(out.qpos[0], out.qpos[1])


def test_grad_called_eagerly_is_compiled(model):
    """jax.grad through entry points called outside jit: their programs differentiated
    whole (the forward and backward passes compiled once); the gradient that of
    jit(grad)."""
    m, d = model

    def loss(v):
        x = d.replace(qvel=v)
        for _ in range(2):
            x = simjax.step(m, x)
        return jnp.sum(x.qpos ** 2) + x.qacc[1]

    g = jax.grad(loss)(d.qvel)
    with _Compiles() as c:
        again = jax.grad(loss)(d.qvel)
    assert c.n == 0
    np.testing.assert_array_equal(again, g)
    np.testing.assert_allclose(g, jax.jit(jax.grad(loss))(d.qvel), rtol=1e-10,
                               atol=1e-12)
    assert np.all(g != 0)


def test_bad_data_raises_before_compiling(model):
    m, d = model
    with _Compiles() as c, pytest.raises(ValueError, match="qpos"):
        simjax.forward(m, d.replace(qpos=np.zeros(3)))
    assert c.n == 0


def test_stages_called_eagerly_are_one_program_each(model):
    """simjax.engine's pipeline and sensor stages, as forward runs them in order."""
    from simjax import engine
    m, d = model
    names = ["fwd_position", "sensor_pos", "fwd_velocity", "sensor_vel", "fwd_actuation",
             "fwd_acceleration", "fwd_constraint", "sensor_acc"]
    x = d
    for name in names:
        fn = getattr(engine, name)
        x = fn(m, x)
        assert _has_program(fn, m), name
    _close(x, simjax.forward(m, d), rtol=1e-9, atol=1e-10)
    mujoco = pytest.importorskip("mujoco")
    with pytest.raises(TypeError, match="MuJoCo's MjData"):
        engine.fwd_position(m, mujoco.MjData(mujoco.MjModel.from_xml_string(XML)))


def test_rollout_called_eagerly_compiles_once(model):
    """simjax.rollout called eagerly: compiled on the first call only (op by op, its
    scan's body was traced and compiled again on every call); the trajectory that of
    stepping one step at a time."""
    m, d = model
    ctrl = np.array([[0.1], [-0.2], [0.3]])
    traj = simjax.rollout(m, d, ctrl)
    with _Compiles() as c:
        again = simjax.rollout(m, d, ctrl + 1.0)
        traj2, final = simjax.rollout(m, d, ctrl, return_data=True)
    assert c.n == 1, c.n                    # return_data is static: its own program
    assert not np.allclose(again.qpos, traj.qpos)
    _close(traj2, traj, rtol=0, atol=0)
    x = d
    for t in range(3):
        x = simjax.step(m, x.replace(ctrl=ctrl[t]))
        np.testing.assert_allclose(traj.qpos[t], x.qpos, rtol=1e-12, atol=1e-14)
    _close(final, x, rtol=1e-12, atol=1e-14)


def test_traced_model_arrays_are_the_programs_arguments(model):
    """A model batched by vmap or differentiated by grad outside jit: its traced arrays
    are the program's arguments (its concrete ones still constants): compiled once, the
    values those of jit."""
    m, d = model

    def loss(damping):
        x = simjax.step(m.replace(dof_damping=damping), d)
        return jnp.sum(x.qvel ** 2)

    damping, other = jnp.asarray([0.3, 0.1]), jnp.asarray([0.4, 0.2])
    g = jax.grad(loss)(damping)
    with _Compiles() as c:
        again = jax.grad(loss)(other)
    assert c.n == 0
    np.testing.assert_allclose(g, jax.jit(jax.grad(loss))(damping), rtol=1e-10, atol=1e-12)
    assert np.all(g != 0) and not np.allclose(again, g)

    def fall(z):
        gravity = jnp.stack([0.0, 0.0, z])
        return simjax.forward(m.replace(opt=m.opt.replace(gravity=gravity)), d).qacc

    zs = jnp.asarray([-9.81, -20.0, 0.0])
    out = jax.vmap(fall)(zs)
    with _Compiles() as c:
        jax.vmap(fall)(zs)
    assert c.n == 0
    _close(out, jax.jit(jax.vmap(fall))(zs))
    assert not np.allclose(out[0], out[1])


def test_support_queries_called_eagerly(model):
    """The Jacobian, inertia, force and energy queries called eagerly: one program per
    model and id (the ids static: the same id again compiles nothing), values those of
    the queries traced in line; an id out of range still raises IndexError."""
    from simjax.engine import support
    m, d = model
    d = simjax.forward(m, d)
    vec = np.array([0.3, -0.7])
    force, point = np.array([[0.0, 0.0, 2.0]]), np.array([[0.1, 0.0, 0.0]])
    calls = [(simjax.jac_body, support.jac_body, (2,)),
             (simjax.jac_body_com, support.jac_body_com, (1,)),
             (simjax.jac_geom, support.jac_geom, (np.int32(1),)),
             (simjax.jac, support.jac, (np.array([0.1, 0.2, 0.0]), 2)),
             (simjax.jac, support.jac, (np.array([0, 1, 0]), 2)),    # ints, not ids
             (simjax.jac_subtree_com, support.jac_subtree_com, (jnp.asarray(1),)),
             (simjax.mul_m, support.mul_m, (vec,)),
             (simjax.mul_m, support.mul_m, (np.array([1, -2]),)),
             (simjax.solve_m, support.solve_m, (vec,)),
             (simjax.apply_ft, support.apply_ft, (force, None, point, [2])),
             (simjax.energy_pos, support.energy_pos, ()),
             (simjax.energy_vel, support.energy_vel, ())]
    for fn, inline, args in calls:
        got = fn(m, d, *args)
        ref = jax.jit(lambda m, d: inline(m, d, *args))(m, d)
        _close(got, ref, rtol=1e-12, atol=1e-14)
        with _Compiles() as c:
            fn(m, d, *args)
        assert c.n == 0, fn.__name__
    with _Compiles() as c:
        simjax.jac_body(m, d, 1)                        # another id: its own program
    assert c.n == 1
    with pytest.raises(IndexError, match="body id 3 out of range"):
        simjax.jac_body(m, d, 3)
    with pytest.raises(IndexError, match="body id 5 out of range"):
        simjax.apply_ft(m, d, force, None, point, np.array([5]))
    # under jit the queries trace in line (a traced id as it is)
    jp, _ = jax.jit(lambda b: simjax.jac_body(m, d, b))(2)
    _close(jp, support.jac_body(m, d, 2)[0], rtol=1e-12, atol=1e-14)


def test_checked_model_object_is_not_checked_again(model):
    """check_model passes a model object once; a replaced model (a new object) is
    checked, and a bad one raises."""
    from simjax.engine import io
    m, _ = model
    io.check_model(m)
    assert io._CHECKED_MODELS[id(m)]() is m
    bad = m.replace(dof_damping=np.zeros(3))
    with pytest.raises(ValueError, match="dof_damping"):
        io.check_model(bad)
    assert id(bad) not in io._CHECKED_MODELS


def test_position_maps_called_eagerly(model):
    """integrate_pos and differentiate_pos called eagerly: one program per model (the
    time step an argument), values those traced in line."""
    from simjax.engine import support
    m, d = model
    v = np.array([0.4, -1.2])
    q1 = simjax.integrate_pos(m, d.qpos, v, 0.01)
    _close(q1, jax.jit(support.integrate_pos)(m, d.qpos, v, 0.01), rtol=1e-14, atol=1e-15)
    with _Compiles() as c:
        q2 = simjax.integrate_pos(m, d.qpos, v, 0.02)
        back = simjax.differentiate_pos(m, d.qpos, q2, 0.02)
    assert c.n == 1, c.n                     # differentiate_pos's first call alone
    _close(back, v, rtol=1e-12, atol=1e-12)
    mujoco = pytest.importorskip("mujoco")
    with pytest.raises(TypeError, match="MuJoCo's MjModel"):
        simjax.integrate_pos(mujoco.MjModel.from_xml_string(XML), d.qpos, v, 0.01)
