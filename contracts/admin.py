"""``engram_client.contracts.admin``, under the name the server's code has always used: the thin
client's distribution (clients/python) holds the wire contracts, so there is one source
(docs/adr/0090-thin-python-client.md). It is the same module object, not a copy."""

import sys

from engram_client.contracts import admin as _moved
from engram_client.contracts.admin import *  # noqa: F403

sys.modules[__name__] = _moved
