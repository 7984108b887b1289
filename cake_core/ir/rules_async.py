"""Verifier rules for the async ops."""
