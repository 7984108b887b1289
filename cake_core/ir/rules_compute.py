"""Verifier rules for the compute ops."""
