"""Interpreter semantics of the compute ops."""
