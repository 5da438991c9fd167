"""mooncake.engine answered by gdr.mooncake.engine (see ../README.md)."""

from gdr.mooncake.engine import *  # noqa: F401,F403
from gdr.mooncake.engine import TransferEngine  # noqa: F401
