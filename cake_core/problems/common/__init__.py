"""Pieces that several problem packages share (named for what they are, not for a problem)."""
