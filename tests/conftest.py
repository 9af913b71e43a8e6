"""Test configuration: conformance against MuJoCo C runs in float64."""
import os
import sys

import jax

jax.config.update("jax_enable_x64", True)
sys.path.insert(0, os.path.dirname(__file__))
