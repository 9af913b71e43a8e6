"""A neural-network actuator plugin: one explicit instance backs all N motors of a
robot and computes their torques in one batched MLP forward pass per step.

Each motor's features are (ctrl, actuator_length, actuator_velocity); the MLP (weights
in Model.plugin_params, so they can be trained with jax.grad or randomised with vmap)
maps the (N, 3) feature batch to N torques::

    import simjax
    from examples import nn_actuator
    nn_actuator.register()
    model = simjax.load_model(nn_actuator.robot_xml(n=6))
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

import simjax
from simjax.plugins import Capability, Plugin

NAME = "example.nn_actuator"


def _init(inst, model):
    """MLP weights: features (3) -> hidden -> 1, He-initialised from ``seed``."""
    hidden = inst.config.int("hidden", 16)
    seed = inst.config.int("seed", 0)
    rng = np.random.default_rng(seed)
    return {"w1": rng.normal(size=(3, hidden)) * np.sqrt(2 / 3),
            "b1": np.zeros(hidden),
            "w2": rng.normal(size=(hidden, 1)) * np.sqrt(1 / hidden),
            "b2": np.zeros(1),
            "gain": np.full(1, inst.config.float("gain", 1.0))}


def mlp(params, features):
    """(N, 3) -> (N,) torques; one batched forward pass."""
    h = jnp.tanh(features @ params["w1"] + params["b1"])
    return params["gain"][0] * (h @ params["w2"] + params["b2"])[:, 0]


def _compute(m, d, inst, params, state, capability):
    a = np.asarray(inst.actuators)
    feats = jnp.stack([d.ctrl[a], d.actuator_length[a], d.actuator_velocity[a]], axis=1)
    return mlp(params, feats)


def _validate(inst, model):
    if inst.config.int("hidden", 16) <= 0:
        raise ValueError("hidden must be positive")
    if not inst.actuators:
        raise ValueError("the instance backs no actuator")


PLUGIN = Plugin(name=NAME, capabilities=Capability.ACTUATOR,
                attributes=("hidden", "seed", "gain"), nstate=lambda inst: 0,
                validate=_validate, init=_init, compute=_compute)
PLUGINS = [PLUGIN]


def register():
    """Register the plugin (idempotent)."""
    if simjax.plugins.find(NAME) is None:
        simjax.plugins.register(PLUGIN)
    return PLUGIN


def robot_xml(n=6, hidden=16):
    """A planar chain of ``n`` hinge links, every joint driven by the same network."""
    bodies, close, acts = "", "", ""
    for i in range(n):
        bodies += (f'<body name="l{i}" pos="{0.0 if i == 0 else 0.2} 0 0">'
                   f'<joint name="j{i}" axis="0 1 0" damping=".05"/>'
                   f'<geom type="capsule" fromto="0 0 0 .2 0 0" size=".03"/>')
        close += "</body>"
        acts += f'<plugin joint="j{i}" instance="brain"/>'
    return f"""<mujoco>
  <option timestep="0.005"><flag contact="disable"/></option>
  <extension><plugin plugin="{NAME}"><instance name="brain">
    <config key="hidden" value="{hidden}"/><config key="seed" value="1"/>
  </instance></plugin></extension>
  <worldbody><body pos="0 0 1">{bodies}{close}</body></worldbody>
  <actuator>{acts}</actuator>
</mujoco>"""
