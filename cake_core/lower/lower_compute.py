"""Lowering hooks of the compute ops (register with cake_core.lower.cuda.lowering)."""
