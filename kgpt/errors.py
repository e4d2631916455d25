"""Errors about a user's data, shared by readers, heads and tasks."""


class DataError(ValueError):
    """A malformed input row or file; the message starts with `file:line`."""


class ConfigError(ValueError):
    """Settings (flags, config fields, arguments) that cannot run; the message names the setting."""
