"""Lowering hooks of the async ops (register with cake_core.lower.cuda.lowering)."""
