"""``mooncake.async_store``: every store call as a coroutine, ``await store.async_<name>(...)``.

A method ``async_foo`` runs ``foo`` with the same arguments on the event loop's default thread
pool, so the loop keeps serving while the store waits for the master or a transfer. The
coroutine functions are made on first use and kept on the instance.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any
from collections.abc import Callable

from mooncake.store import MooncakeDistributedStore

PREFIX = "async_"


class MooncakeDistributedStoreAsync(MooncakeDistributedStore):
    def __getattr__(self, name: str) -> Any:
        # Only reached for names the instance and class lack.
        if not name.startswith(PREFIX):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        sync = getattr(self, name[len(PREFIX):], None)
        if not callable(sync):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r} "
                                 f"(nor a method {name[len(PREFIX):]!r})")
        coroutine = _in_thread(sync)
        setattr(self, name, coroutine)
        return coroutine


def _in_thread(sync: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(sync)
    async def run(*args: Any, **kwargs: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(None, functools.partial(sync, *args, **kwargs))
    return run
