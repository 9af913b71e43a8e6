"""Collision detection: driver (candidate pairs, broadphase, dispatch, contact
parameters), analytic primitive colliders, convex colliders, height fields, SDF pairs."""
from simjax.engine.collision.driver import (collision, contact_capacity, contact_order,
                                            make_contacts, register_collider)

__all__ = ["collision", "contact_capacity", "contact_order", "make_contacts",
           "register_collider"]
