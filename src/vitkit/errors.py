"""Exceptions raised for bad input: each message names the problem and the fix."""

from __future__ import annotations


class VitkitError(Exception):
    """Base class of every error vitkit raises on purpose."""


class ConfigError(VitkitError, ValueError):
    """A model configuration, variant name or config file that cannot be used."""


class InputError(VitkitError, ValueError):
    """A tensor given to a model whose rank, channels or size do not fit its config."""
