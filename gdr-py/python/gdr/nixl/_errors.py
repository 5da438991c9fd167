"""NIXL's exception classes, by the names its bindings raise (``nixl._bindings``), so that a
connector's ``except nixlNotFoundError`` catches the drop-in's errors too.

Each is raised ``from`` the gdr error behind it, when there is one (``err.__cause__``: the
matchable :class:`gdr.GdrError` with its fields and ``hint``).
"""

__all__ = [
    "nixlBackendError",
    "nixlCancelledError",
    "nixlInvalidParamError",
    "nixlMismatchError",
    "nixlNoTelemetryError",
    "nixlNotAllowedError",
    "nixlNotFoundError",
    "nixlNotPostedError",
    "nixlNotSupportedError",
    "nixlRemoteDisconnectError",
    "nixlRepostActiveError",
    "nixlUnknownError",
]


class nixlBackendError(Exception):
    """The engine (gdr's, standing for NIXL's backend) failed: ``NIXL_ERR_BACKEND``."""


class nixlCancelledError(Exception):
    """``NIXL_ERR_CANCELED``."""


class nixlInvalidParamError(Exception):
    """An argument is invalid; nothing was done: ``NIXL_ERR_INVALID_PARAM``."""


class nixlMismatchError(Exception):
    """``NIXL_ERR_MISMATCH``: the two sides of a transfer do not match (lengths, counts)."""


class nixlNoTelemetryError(Exception):
    """``NIXL_ERR_NO_TELEMETRY``: the agent does not capture telemetry."""


class nixlNotAllowedError(Exception):
    """``NIXL_ERR_NOT_ALLOWED``."""


class nixlNotFoundError(Exception):
    """``NIXL_ERR_NOT_FOUND``: no such agent, registration or descriptor."""


class nixlNotPostedError(Exception):
    """``NIXL_ERR_NOT_POSTED``: the transfer was never posted."""


class nixlNotSupportedError(Exception):
    """``NIXL_ERR_NOT_SUPPORTED``: gdr's drop-in does not do this (the message says why)."""


class nixlRemoteDisconnectError(Exception):
    """``NIXL_ERR_REMOTE_DISCONNECT``: the remote agent is gone."""


class nixlRepostActiveError(Exception):
    """``NIXL_ERR_REPOST_ACTIVE``: the transfer is still in flight; wait for it first."""


class nixlUnknownError(Exception):
    """``NIXL_ERR_UNKNOWN``."""
