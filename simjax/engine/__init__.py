"""The simulation pipeline, pure JAX (one module per MuJoCo stage).

Re-exports the functions a user calls: :func:`make_data`, :func:`reset`,
:func:`reset_keyframe`, :func:`forward`, :func:`step`, :func:`inverse`, the pipeline
and sensor stages, the Jacobian, inertia, force and energy queries of
:mod:`simjax.engine.support` and its joint-space position maps (each, called eagerly,
one compiled program: :mod:`simjax.engine.eager`), and the :class:`Data` type.
"""
from simjax.engine.data import Data
from simjax.engine.forward import (euler, forward, fwd_acceleration, fwd_actuation,
                                   fwd_constraint, fwd_position, fwd_velocity, implicit,
                                   rk4, step)
from simjax.engine.inverse import inverse
from simjax.engine.io import make_data, reset, reset_keyframe
from simjax.engine.rne_post import rne_post_constraint
from simjax.engine.sensor import sensor_acc, sensor_pos, sensor_vel
from simjax.engine.support import (apply_ft, differentiate_pos, energy_pos, energy_vel,
                                   full_m, integrate_pos, jac, jac_body, jac_body_com,
                                   jac_geom, jac_site, jac_subtree_com, mul_m, pack_m,
                                   solve_m)

from simjax.engine import eager as _eager, io as _io


def _check(m, d, *_):
    _io.check_data(m, d)


# the stages called eagerly run as one compiled program each, as step, forward and
# inverse do (simjax.engine.eager); the engine's own calls use the modules' functions
(fwd_position, fwd_velocity, fwd_actuation, fwd_acceleration, fwd_constraint, euler,
 rk4, implicit, sensor_pos, sensor_vel, sensor_acc, rne_post_constraint) = (
    _eager.compiled_when_eager(_check)(f) for f in (
        fwd_position, fwd_velocity, fwd_actuation, fwd_acceleration, fwd_constraint,
        euler, rk4, implicit, sensor_pos, sensor_vel, sensor_acc, rne_post_constraint))

# the support queries too: their ids (bodies, geoms, sites) static, concrete in the
# program as op by op (the humanoid's solve_m: 120-175 ms a call op by op, 0.1-0.2 ms)
jac, jac_body, jac_body_com, jac_subtree_com = (
    _eager.compiled_when_eager(_check, ids=("body",))(f)
    for f in (jac, jac_body, jac_body_com, jac_subtree_com))
jac_geom = _eager.compiled_when_eager(_check, ids=("geom",))(jac_geom)
jac_site = _eager.compiled_when_eager(_check, ids=("site",))(jac_site)
apply_ft = _eager.compiled_when_eager(_check, ids=("bodies",))(apply_ft)
mul_m, solve_m, energy_pos, energy_vel = (
    _eager.compiled_when_eager(_check)(f) for f in (mul_m, solve_m, energy_pos, energy_vel))


def _check_model(m, *_):
    _io.check_model(m)


# and the joint-space position maps (the humanoid's integrate_pos: 4.7 ms a call op by op)
integrate_pos, differentiate_pos = (
    _eager.compiled_when_eager(_check_model)(f) for f in (integrate_pos, differentiate_pos))

__all__ = [
    "Data", "make_data", "reset", "reset_keyframe", "forward", "step", "euler", "rk4",
    "implicit", "fwd_position", "fwd_velocity", "fwd_actuation", "fwd_acceleration",
    "fwd_constraint", "jac", "jac_body", "jac_body_com", "jac_geom", "jac_site",
    "jac_subtree_com", "full_m", "mul_m", "solve_m", "pack_m", "apply_ft",
    "integrate_pos", "differentiate_pos", "energy_pos", "energy_vel",
    "inverse", "sensor_pos", "sensor_vel", "sensor_acc", "rne_post_constraint",
]
