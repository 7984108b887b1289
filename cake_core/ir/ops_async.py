"""Op registrations: async ops (see ops.py for the registry)."""
from cake_core.ir.ops import REGISTRY, AttrSpec, Op, OpDef, register  # noqa: F401
