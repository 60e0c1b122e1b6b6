"""A sink's calls to its destination, retried until the destination takes them."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_not_exception_type,
    wait_exponential_jitter,
)

from sinks.base import PermanentSinkError
from streams.observe import metrics

__all__ = ["Delivery"]

log = logging.getLogger(__name__)

FIRST_RETRY_DELAY_S = 0.2
RETRY_MAX_WAIT_S = 30.0


class Delivery:
    """``await deliver(call, *args)``: ``call(*args)``, retried with backoff until the
    destination takes it; a :class:`PermanentSinkError` is raised at once (the stage
    dead-letters the operation). Order is kept because the session's lane waits."""

    def __init__(self, sink_name: str) -> None:
        self.sink_name = sink_name
        self.retries = metrics.SINK_RETRIES.labels(sink_name)

    def log_retry(self, state: RetryCallState) -> None:
        self.retries.inc()
        error = state.outcome.exception() if state.outcome else None
        log.warning(
            "sink %s: attempt %d failed (%s: %s); retrying in %.1fs",
            self.sink_name,
            state.attempt_number,
            type(error).__name__,
            error,
            state.next_action.sleep if state.next_action else 0.0,
        )

    async def __call__(self, call: Callable[..., Awaitable[None]], *args: Any) -> None:
        try:
            await call(*args)  # the common case, without the retry machinery's cost per call
            return
        except PermanentSinkError:
            raise
        except Exception as exc:
            log.warning("sink %s: %s: %s; retrying", self.sink_name, type(exc).__name__, exc)
            self.retries.inc()
            await asyncio.sleep(FIRST_RETRY_DELAY_S)  # a backoff: the loop starts with an attempt
        async for attempt in AsyncRetrying(
            retry=retry_if_not_exception_type(PermanentSinkError),
            wait=wait_exponential_jitter(initial=0.2, max=RETRY_MAX_WAIT_S),
            before_sleep=self.log_retry,
            reraise=True,
        ):
            with attempt:
                await call(*args)
