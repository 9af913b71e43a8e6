"""Collision detection (narrow-phase pair functions)."""
