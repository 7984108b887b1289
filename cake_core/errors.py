"""Errors that reach a person: each message says what was wrong, where, and what to do."""


class CakeError(Exception):
    """An error whose message tells the user what was wrong and what to do."""
