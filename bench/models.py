"""The models the benchmark runs, with the option changes each run uses.

Paths point into the corpus beside the repository (../shared/corpus, or the folder
named by the SIMJAX_CORPUS environment variable) or into models/.
``disableflags`` are set on every backend alike (e.g. the smooth-dynamics runs disable
constraints in MuJoCo C, MJX and simjax).
"""
from __future__ import annotations

import dataclasses
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: the corpus folder; SIMJAX_CORPUS overrides it (e.g. a copy taken to another machine)
CORPUS = os.environ.get("SIMJAX_CORPUS") or os.path.normpath(
    os.path.join(ROOT, "..", "shared", "corpus"))

# mjtDisableBit values (MuJoCo 4.0)
DSBL_CONSTRAINT = 1 << 0
DSBL_CONTACT = 1 << 4


@dataclasses.dataclass(frozen=True)
class BenchModel:
    path: str
    disableflags: int = 0
    note: str = ""


MODELS = {
    "pendulum-smooth": BenchModel(
        os.path.join(CORPUS, "gym_inverted_pendulum/inverted_pendulum.xml"),
        DSBL_CONSTRAINT, "Gymnasium inverted pendulum, constraints off"),
    "humanoid-smooth": BenchModel(
        os.path.join(CORPUS, "mujoco_humanoid/humanoid.xml"), DSBL_CONSTRAINT,
        "MuJoCo humanoid, constraints off"),
    "ant-smooth": BenchModel(
        os.path.join(CORPUS, "gym_ant/ant.xml"), DSBL_CONSTRAINT,
        "Gymnasium ant, constraints off"),
    "shadow_hand-smooth": BenchModel(
        os.path.join(CORPUS, "mjx_shadow_hand/scene_right.xml"), DSBL_CONSTRAINT,
        "MJX shadow hand (meshes), constraints off"),
    "barkour-smooth": BenchModel(
        os.path.join(CORPUS, "mjx_barkour_v0/assets/barkour_v0_mjx.xml"), DSBL_CONSTRAINT,
        "MJX barkour (hfield), constraints off"),
    "humanoid": BenchModel(os.path.join(CORPUS, "mujoco_humanoid/humanoid.xml"),
                           note="MuJoCo humanoid, contacts and constraints on"),
    "ant": BenchModel(os.path.join(CORPUS, "gym_ant/ant.xml"), note="Gymnasium ant"),
    "barkour": BenchModel(os.path.join(CORPUS, "mjx_barkour_v0/assets/barkour_v0_mjx.xml"),
                          note="MJX barkour (hfield)"),
    "shadow_hand": BenchModel(os.path.join(CORPUS, "mjx_shadow_hand/scene_right.xml"),
                              note="MJX shadow hand (meshes)"),
    "contact_stress": BenchModel(os.path.join(ROOT, "models", "contact_stress.xml"),
                                 note="our bin of boxes, capsules and spheres"),
}


def mj_model(spec: BenchModel):
    """The MuJoCo C model of a benchmark entry, with its option changes applied."""
    import mujoco
    if not os.path.exists(spec.path):
        raise FileNotFoundError(f"{spec.path} (the corpus is expected beside the repo)")
    mjm = mujoco.MjModel.from_xml_path(spec.path)
    mjm.opt.disableflags |= spec.disableflags
    return mjm
