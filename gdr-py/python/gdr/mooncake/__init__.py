"""Mooncake's Python ``TransferEngine`` on gdr's engine: change the import, keep the connector.

::

    from gdr.mooncake import TransferEngine      # was: from mooncake.engine import TransferEngine

Same calls, arguments and return codes (0, or -1 with the reason logged and kept in
``last_error``); see :mod:`gdr.mooncake.engine` for how they map onto :class:`gdr.Agent` and
where the drop-in refuses what Mooncake does silently or unsafely (a missing device, a TCP
fallback, a batch id asked twice).
"""

from .engine import Read, TransferEngine, TransferNotify, TransferOpcode, Write

__all__ = ["Read", "TransferEngine", "TransferNotify", "TransferOpcode", "Write"]
