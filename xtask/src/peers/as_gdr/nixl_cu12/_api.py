"""nixl_cu12._api answered by gdr.nixl._api (see ../README.md)."""

from gdr.nixl._api import *  # noqa: F401,F403
from gdr.nixl._api import nixl_agent, nixl_agent_config  # noqa: F401
