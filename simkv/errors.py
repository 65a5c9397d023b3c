"""Errors a user can cause. The CLI prints their message as one line, exit code 2."""


class SimkvError(Exception):
    """Base of every error caused by bad input rather than by a bug."""


class ConfigError(SimkvError, ValueError):
    """A model, precision, policy option or workload that makes no sense."""


class PolicyError(SimkvError):
    """A scenario that the chosen policy cannot run (e.g. a prompt larger than a static cache)."""
