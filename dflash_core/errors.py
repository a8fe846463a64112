"""Errors the lab raises on bad input. Each message names the problem and the fix."""

from __future__ import annotations


class DFlashError(ValueError):
    """Base class: a user-facing error with an actionable message."""


class BadInputError(DFlashError):
    """An argument is out of range (width, budget, prompt, ...)."""


class DeviceError(DFlashError):
    """A device or dtype was asked for that this machine cannot give."""


class TargetNotFoundError(DFlashError):
    """The target name is neither a known alias, a local checkpoint nor a reachable hub id."""


class ArtifactError(DFlashError):
    """A prepared artifact is missing, corrupt or belongs to another target."""


class UnknownMethodError(DFlashError):
    """A method id is not in the registry."""


class BundleError(ArtifactError):
    """A prepared bundle (export/import) is corrupt, truncated, unsafe or does not match its manifests."""
