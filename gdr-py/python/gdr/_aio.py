"""asyncio glue of ``gdr._gdr``: the callback its asyncio thread schedules on an event loop
(``loop.call_soon_threadsafe``) to hand an outcome to a future, on the loop's own thread."""

from typing import Any, Optional
import asyncio


def _resolve(fut: "asyncio.Future[Any]", ok: Optional[bool], value: Any) -> None:
    """Sets ``value`` as the result (``ok`` true) or the exception (``ok`` false) of ``fut``, or
    ``StopAsyncIteration`` (``ok`` None). A future cancelled meanwhile is left alone: what it
    waited for carried nothing that could be lost (a notification step takes its notification
    itself, in :func:`_next_notification`)."""
    if fut.done():
        return
    if ok is None:
        fut.set_exception(StopAsyncIteration())
    elif ok:
        fut.set_result(value)
    else:
        fut.set_exception(value)


async def _next_notification(stream: Any) -> Any:
    """One step of ``Agent.notifications()``: the next notification, taken in the awaiting task
    once one is queued (as ``asyncio.Queue.get`` takes its item). A task cancelled while it
    waits took nothing, so a cancel never loses a notification; ``StopAsyncIteration`` once the
    agent is shut down and none is left."""
    while True:
        note = stream._take()
        if note is not None:
            return note
        await stream._ready()
