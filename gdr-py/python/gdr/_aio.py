"""asyncio glue of ``gdr._gdr``: the callback its asyncio thread schedules on an event loop
(``loop.call_soon_threadsafe``) to hand an outcome to a future, on the loop's own thread."""

from typing import Any, Callable, Optional
import asyncio


def _resolve(
    fut: "asyncio.Future[Any]",
    ok: Optional[bool],
    value: Any,
    requeue: Optional[Callable[[Any], None]] = None,
) -> None:
    """Sets ``value`` as the result (``ok`` true) or the exception (``ok`` false) of ``fut``, or
    ``StopAsyncIteration`` (``ok`` None: the end of a notification stream). A future cancelled
    meanwhile is left alone; a notification it would have received goes to ``requeue`` (the
    agent's backlog), so that the next wait takes it."""
    if fut.done():
        if ok and requeue is not None:
            requeue(value)
        return
    if ok is None:
        fut.set_exception(StopAsyncIteration())
    elif ok:
        fut.set_result(value)
    else:
        fut.set_exception(value)
