"""Errors about a user's data, shared by readers, heads and tasks."""


class DataError(ValueError):
    """A malformed input row or file; the message starts with `file:line`."""
