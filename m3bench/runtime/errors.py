"""Errors of the runtime that name a problem the user can fix (bad checkpoint, bad config)."""


class InputError(ValueError):
    """Base of every error the command line reports as one line with exit code 2."""


class ConfigError(InputError):
    """config.json is missing a field, has an unsupported value or is inconsistent."""


class CheckpointError(InputError):
    """A checkpoint's tensors are missing, extra, mis-shaped or unreadable."""
