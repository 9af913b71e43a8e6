"""Compiled Model arrays against MuJoCo C's mjModel on every corpus model (float64)."""
import os

import mujoco
import pytest

import simjax
from compare import CORPUS, compare

# Models whose comparable physics fields must all match.
ALL_FIELDS = ["mujoco_humanoid/humanoid.xml", "gym_ant/ant.xml", "mjx_pendula/pendula.xml",
              "mjx_humanoid/humanoid.xml", "mjx_sensor/sensor.xml", "gym_humanoid/humanoid.xml",
              "gym_walker2d/walker2d.xml", "gym_half_cheetah/half_cheetah.xml",
              "gym_swimmer/swimmer.xml", "gym_reacher/reacher.xml",
              "warp_jdotv_weld_3d/weld_3d.xml", "warp_jdotv_connect_3d/connect_3d.xml",
              "mjx_actuator_tendon_force_clamp/tendon_force_clamp.xml",
              "mjx_shadow_hand/scene_right.xml", "mjx_barkour_v0/assets/barkour_v0_mjx.xml",
              "mjx_convex/convex.xml", "mujoco_car/car.xml"]
# Known gaps, asserted so that a fix shows up: geom-wrapping spatial tendons and the
# simulated muscle lengthrange are not computed at load time yet.
BELOW_98 = {"mujoco_arm26/arm26.xml"}
PLUGIN_MODELS = {"mujoco_plugin_pid/pid.xml", "mujoco_plugin_touch_grid/touch_grid.xml",
                 "mujoco_plugin_sdf_torus/torus.xml", "mujoco_plugin_sdf_nutbolt/nutbolt.xml"}


def _models():
    path = os.path.join(CORPUS, "manifest.csv")
    if not os.path.exists(path):
        return []
    import csv
    with open(path) as f:
        return [row["path"] for row in csv.DictReader(f)]


MODELS = _models()


def _load(rel):
    path = os.path.join(CORPUS, rel)
    if not os.path.exists(path):
        pytest.skip(f"corpus model {rel} not found (expected ../shared/corpus)")
    return path


@pytest.mark.skipif(not MODELS, reason="../shared/corpus is absent")
@pytest.mark.parametrize("rel", MODELS)
def test_corpus_model_fields(rel):
    path = _load(rel)
    mjm = mujoco.MjModel.from_xml_path(path)
    if rel in PLUGIN_MODELS:
        with pytest.raises(simjax.UnsupportedFeatureError):
            simjax.load_model(path)
        return
    model = simjax.load_model(path)
    matched, bad, n = compare(model, mjm)
    frac = len(matched) / n
    if rel in BELOW_98:
        assert frac >= 0.97, f"{rel}: {len(matched)}/{n} fields match; mismatched: {bad}"
        assert set(bad) <= {"tendon_lengthspring", "tendon_length0", "tendon_invweight0",
                            "actuator_acc0", "actuator_length0", "actuator_lengthrange"}
    else:
        assert frac >= 0.98, f"{rel}: {len(matched)}/{n} fields match; mismatched: {bad}"
    if rel in ALL_FIELDS:
        assert not bad, f"{rel}: mismatched fields {bad}"
