"""Engine tests import their helpers from this directory."""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
