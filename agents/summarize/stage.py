"""The summarize stage: ``summarize`` requests -> rolling summaries -> ``context``.

Per session one LLM call at a time, in order; across sessions concurrently
(:class:`streams.lanes.Lanes`). A request is acknowledged only after the summary
it produced and its table entry are durable (the commit protocol,
``streams._faust.commit``), and Faust commits only the contiguous acknowledged
prefix, so a crash re-runs unfinished requests; the table's high-water mark skips
those already done.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable
from typing import Any, NamedTuple

import msgspec
from faust.types import Message

from agents.summarize.compiled import ReadRequest, RequestReader, request_of_read
from agents.summarize.state import (
    CARRY_MAX_BYTES,
    SummaryState,
    conversation_id,
    count_facts,
    decode_request,
    fold_large_carry,
    offline_fold,
    summary_operation,
)
from agents.summarizer import Accounting, LLMError, Summarizer, llm_session, usage_of
from schemas import ActionsPayload, SessionErased
from schemas.fast import Request
from streams._faust import changelog, stores
from streams._faust.batch_source import BatchSource
from streams._faust.commit import Commits, Write
from streams.app import ContextApp
from streams.dead_letters import DeadLetterWriter, from_message
from streams.lanes import InOrderAcks, Lanes, feed_lanes
from streams.observe import metrics
from streams.tables import DecodedEntries, session_items, session_table
from streams.topics import Topics

__all__ = ["SummarizeStage"]

log = logging.getLogger(__name__)


class Taken(NamedTuple):
    """A request as the stage takes it: decoded, and read compiled (None: the Python passes)."""

    request: Request
    read: ReadRequest | None

    @property
    def session_id(self) -> str:  # its lane's
        return self.request.session_id  # type: ignore[no-any-return]


LaneItem = tuple[Any, Taken | SessionErased]  # (an InOrderAcks ticket, request)


class SummarizeStage:
    """The summaries table, the LLM and the lanes of one worker; ``register`` wires them."""

    def __init__(self, app: ContextApp, topics: Topics, summarizer: Summarizer) -> None:
        settings = self.settings = app.settings
        self.app, self.summarizer = app, summarizer
        self.ledger_limits = settings.ledger_limits()
        # A request's actions read once for the ledger, the prompt and the PII pass.
        self.read = RequestReader(self.ledger_limits, enabled=settings.compiled)
        self.compiled_requests = metrics.COMPILED_REQUESTS.labels()
        self.table = session_table(app, "summaries")
        # Each session's state kept decoded between its requests: 5.7 µs a decode (decisions.md).
        self.decoded = DecodedEntries(SummaryState.from_bytes, settings.summary_state_cache)
        self.accounting = Accounting(
            settings.llm_prices, settings.llm_daily_token_budget, settings.llm_product_budgets
        )
        self.dead_letters = DeadLetterWriter(topics.dead_letters, stage="summarize")
        self.context_topic = topics.context.get_topic_name()
        self.lanes: Lanes[LaneItem] = Lanes(
            self.handle,
            max_pending=settings.max_in_flight_requests,
            on_error=app.crash_on_lane_error,
        )
        app.manage_lanes(self.lanes, "summarize")
        # Lanes finish out of order; Faust must see acks in offset order (see InOrderAcks).
        self.acks = InOrderAcks()
        self.commits = Commits(app)  # what lanes finishing together make durable at once
        self.source = BatchSource(app, topics.summarize, max_buffered=settings.batch_buffer)

    async def run(self) -> None:
        """The agent: requests into per-session lanes."""
        await feed_lanes(self.source, self.lanes, self.acks, self.take, self.dead_letters.write)

    def take(self, raw: bytes | None) -> Taken | SessionErased:
        """A request read compiled, its batches decoded only where a Python pass reads them;
        else decoded whole (or refused: ``InvalidMessage``)."""
        read = self.read(raw)
        if read is not None and raw is not None:
            request = request_of_read(raw, read.head, read.batches)
            if request is not None:
                self.compiled_requests.inc()
                return Taken(request, read)
        decoded = decode_request(raw)
        return decoded if isinstance(decoded, SessionErased) else Taken(decoded, None)

    def load(self, session_id: str, generation: int) -> SummaryState | None:
        """The state for this generation; ``None`` if the request is from an older one."""
        state = self.decoded.take(session_id, stores.read(self.table, session_id))
        if state is None or state.generation < generation:
            return SummaryState(generation=generation)
        return state if state.generation == generation else None

    def check_chain(self, request: Request, state: SummaryState) -> None:
        """Each request starts right after the previous one of its generation, so each
        summary is prompted with its predecessor (or the carried actions)."""
        if request.seq_from == state.requested_to + 1:
            return
        metrics.SUMMARY_CHAIN_BREAKS.inc()
        log.warning(
            "session %s (generation %d): summary chain break: request for actions %d-%d, "
            "but the last one taken ended at %d; this summary starts without its predecessor",
            request.session_id,
            request.generation,
            request.seq_from,
            request.seq_to,
            state.requested_to,
        )

    async def emit_summary(
        self,
        request: Request,
        state: SummaryState,
        text: str,
        took_s: float,
        read: ReadRequest | None,
    ) -> Awaitable[Any]:
        """Produce the summary; the result resolves when the broker has it."""
        usage = self.accounting.record(request.product_id, usage_of(text))
        carried = [ActionsPayload.model_validate(b) for b in state.carry]
        if read is not None:  # the batches' last, else the carried actions'
            conversation = read.conversation or conversation_id(carried)
        else:
            conversation = conversation_id([*carried, *request.batches])
        op = summary_operation(
            request,
            state,
            text,
            conversation=conversation,
            usage=usage,
            took_s=took_s,
            now=time.time(),
        )
        return await self.app.append(self.context_topic, request.session_id.encode(), op)

    async def give_up(
        self, message: Message, request: Request, state: SummaryState, error: LLMError
    ) -> None:
        """Keep the raw context, record the failure, and carry the actions forward."""
        await self.dead_letters.write_letter(
            from_message(
                message,
                f"summarize failed after the retry budget: {error}",
                "summarize",
                key=request.session_id,
            )
        )
        if state.carry_from is None:
            state.carry_from = request.seq_from
        state.carry.extend(msgspec.to_builtins(b) for b in request.batches)
        metrics.SUMMARIES.labels("failed").inc()
        if fold_large_carry(state, self.settings.summary_max_chars, total=request.seq_to):
            log.warning(
                "session %s: actions carried since %s passed %d bytes; folded into the "
                "summary by the offline summarizer",
                request.session_id,
                state.carry_from,
                CARRY_MAX_BYTES,
            )

    async def summarise(
        self, message: Message, request: Request, state: SummaryState, read: ReadRequest | None
    ) -> str | None:
        """The next summary of the session, or None when there is none to emit.

        A final request whose LLM call fails is summarised offline instead, so every
        generation ends with a summary that covers all of it (its raw notes go).
        """
        max_chars = self.settings.summary_max_chars
        payloads = request.batches  # maybe decoded when first read (LazyBatches)
        if state.carry:
            payloads = [*(ActionsPayload.model_validate(b) for b in state.carry), *payloads]
        if not payloads:  # a close right after a summary: that summary becomes the final
            return state.summary
        if self.accounting.over_budget(request.product_id):  # logged once a day per product
            return offline_fold(state.summary, payloads, request.seq_to, max_chars)
        self.lanes.mark(request.session_id, "summarizing (LLM)")
        llm_session.set(request.session_id)  # for the LLM's failure log lines
        try:
            # The default prompt's actions made already: of the request's batches alone.
            formatted = read.formatted if read is not None and not state.carry else None
            return await self.summarizer.summarize(
                state.summary, payloads, total=request.seq_to, formatted=formatted
            )
        except LLMError as exc:
            if not request.final:
                self.lanes.mark(request.session_id, "recording a failed summary")
                await self.give_up(message, request, state, exc)
                return None
            log.warning(
                "session %s: final summary of actions %d-%d failed in the LLM (%s); "
                "summarised offline so the session closes with its whole history",
                request.session_id,
                state.carry_from or request.seq_from,
                request.seq_to,
                exc,
            )
            metrics.SUMMARIES.labels("offline_fallback").inc()
            return offline_fold(state.summary, payloads, request.seq_to, max_chars)

    async def handle(self, session_id: str, item: LaneItem) -> None:
        ticket, taken = item
        acks, table = self.acks, self.table
        if isinstance(taken, SessionErased):  # the summary state goes, whatever it held
            await self.commits.commit(lambda: acks.done(ticket), writes=[(table, session_id, None)])
            return
        request, read = taken
        state = self.load(session_id, request.generation)
        if state is None or state.replayed(request):
            metrics.REPLAYS_SKIPPED.labels("summarize").inc()
            await acks.done(ticket)
            return
        self.check_chain(request, state)
        count_facts(state, request, self.ledger_limits, read.facts if read is not None else None)
        started = time.monotonic()
        text = await self.summarise(ticket.message, request, state, read)
        outputs = []
        if text is not None:
            self.lanes.mark(session_id, "emitting its summary")
            took = time.monotonic() - started
            outputs.append(await self.emit_summary(request, state, text, took, read))
            state.summary, state.covered_to = str(text), request.seq_to
            state.carry, state.carry_from = [], None
            metrics.SUMMARIES.labels("final" if request.final else "rolling").inc()
        state.requested_to = max(state.requested_to, request.seq_to)
        state.updated_at = time.time()
        if request.final:  # the generation is over: only a small closed record stays
            state = state.closed_record(state.updated_at)
        self.lanes.mark(session_id, "waiting for its summary and changelog record")
        # Only then, and in offset order, may Faust commit past the request.
        value = stores.compact(state.to_bytes())  # kept: a copy, not orjson's buffer
        self.decoded.keep(session_id, value, state)
        writes: list[Write] = [(table, session_id, value)]
        await self.commits.commit(lambda: acks.done(ticket), outputs=outputs, writes=writes)

    async def forget_closed(self) -> None:
        """Timer: closed records go, and only on partitions read to their end: no
        replay of their final request can still come (tests/integration/test_fidelity.py)."""
        horizon = time.time() - self.settings.idle_timeout_s

        def expired(raw: bytes | None) -> bool:
            state = None if raw is None else SummaryState.from_bytes(raw)
            return state is not None and state.closed and state.updated_at < horizon

        current = await self.source.caught_up()
        candidates = [sid async for sid, raw in session_items(self.table, current) if expired(raw)]
        for sid in candidates:
            if expired(self.table.get(sid)):  # checked again: a request may have come since
                changelog.write(self.app, self.table, sid, None)
