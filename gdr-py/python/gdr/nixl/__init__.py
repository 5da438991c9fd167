"""NIXL's Python API on gdr's engine: change the import, keep the connector.

::

    from gdr.nixl import nixl_agent, nixl_agent_config     # was: from nixl._api import ...

``nixl_agent`` takes NIXL's calls with their names, arguments, return values and states
(``register_memory``, ``get_agent_metadata`` / ``add_remote_agent``, ``prep_xfer_dlist``,
``make_prepped_xfer``, ``transfer``, ``check_xfer_state``, notifications, ...) and moves the
bytes with :class:`gdr.Agent`. Both sides must use the drop-in: the metadata is gdr's.

Where NIXL's contract is unsafe, gdr's rules apply:

- Releasing a transfer handle while its transfer is in flight cancels the transfer; the memory
  it uses stays registered until the NIC is done with it. (NIXL tries to abort and raises if it
  cannot, and the handle stays.)
- Deregistering memory under a transfer in flight takes it out of new transfers at once; the
  registration itself ends when the transfer's requests are retired, never under the NIC.
- A registered tensor (``register_memory(tensor)`` or a list of tensors) is held by its
  segment: ``del tensor`` during a transfer is harmless. An address (a tuple or an Nx3 array)
  is the caller's promise, as in NIXL: gdr cannot hold memory it only knows the address of.
- ``transfer`` on a handle whose last submission is in flight raises
  ``nixlRepostActiveError``; nothing is posted twice into the same memory.

Refused, with a reason in the error: storage backends and memory types (FILE, BLOCK, OBJ),
loopback transfers, NIXL's metadata listener and server (``send_local_metadata``,
``fetch_remote_metadata``: exchange ``get_agent_metadata()`` bytes yourself), UCX's GPU device
API (``prep_mem_view``), cost estimates. The errors are NIXL's classes
(:mod:`gdr.nixl._errors`), raised from the :class:`gdr.GdrError` behind them.
"""

from ._api import (
    DEFAULT_COMM_PORT,
    NIXL_INIT_AGENT,
    nixl_agent,
    nixl_agent_config,
    nixl_prepped_dlist_handle,
    nixl_thread_sync_t,
    nixl_xfer_handle,
    nixlXferTelemetry,
)
from ._descs import nixlRegDList, nixlXferDList
from ._errors import (
    nixlBackendError,
    nixlCancelledError,
    nixlInvalidParamError,
    nixlMismatchError,
    nixlNoTelemetryError,
    nixlNotAllowedError,
    nixlNotFoundError,
    nixlNotPostedError,
    nixlNotSupportedError,
    nixlRemoteDisconnectError,
    nixlRepostActiveError,
    nixlUnknownError,
)

__all__ = [
    "DEFAULT_COMM_PORT",
    "NIXL_INIT_AGENT",
    "nixl_agent",
    "nixl_agent_config",
    "nixl_prepped_dlist_handle",
    "nixl_thread_sync_t",
    "nixl_xfer_handle",
    "nixlXferTelemetry",
    "nixlRegDList",
    "nixlXferDList",
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
