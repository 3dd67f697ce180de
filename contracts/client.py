"""``engram_client.client`` (``EngramClient``, ``SyncEngramClient``), under the name the server's
code has always used: the thin client lives in its own distribution, clients/python
(docs/adr/0090-thin-python-client.md). It is the same module object, not a copy."""

import sys

from engram_client import client as _moved
from engram_client.client import *  # noqa: F403

sys.modules[__name__] = _moved
