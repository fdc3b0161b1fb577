"""Exceptions to the original's integer return codes.

Our library raises typed errors whose ``code`` already is Mooncake's number (-704 not found,
-705 exists, -706 has lease, -3 address not registered, ...). Anything else that escapes (an OS
error, a bad Python value) becomes INVALID_PARAMS, which is what the original returns for
arguments it cannot use.
"""

from __future__ import annotations

import logging

from mooncake._raw_memory import DeviceMemoryRefused
from transfer.errors import MooncakeError

INVALID_PARAMS = -600
OBJECT_NOT_FOUND = -704
INTERNAL_ERROR = -1000  # the original's catch-all

log = logging.getLogger("mooncake")


def code_of(error: BaseException) -> int:
    if isinstance(error, MooncakeError):
        return error.code
    if isinstance(error, DeviceMemoryRefused):
        return error.code
    if isinstance(error, (ValueError, TypeError, OverflowError)):
        return INVALID_PARAMS
    return INTERNAL_ERROR


def logged(operation: str, error: BaseException) -> int:
    """The code for ``error``, logged once as the original logs failed calls."""
    code = code_of(error)
    log.warning("%s failed (%d): %s", operation, code, error)
    return code
