"""Interpreter semantics of the async ops."""
