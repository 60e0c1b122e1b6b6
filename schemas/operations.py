"""Internal messages: summarize requests and the ordered context operations.

Every action of a session gets a sequence number (1, 2, 3, ...) when the
accumulator applies it. Ranges ``[seq_from, seq_to]`` are inclusive and let
every later stage recognise a redelivery and skip it.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from schemas.actions import ActionsPayload
from schemas.ledger import SessionLedger

__all__ = [
    "ActionsWritten",
    "ContextOperation",
    "EraseRequest",
    "SeqRange",
    "SessionErased",
    "SessionLink",
    "SummarizeRequest",
    "SummaryReady",
    "SummaryUsage",
    "context_message_adapter",
    "context_operation_adapter",
]


class SeqRange(BaseModel):
    """An inclusive range of one session's action sequence numbers."""

    model_config = ConfigDict(frozen=True)

    seq_from: int = Field(ge=1)
    seq_to: int = Field(ge=1)
    # The input offset where this incarnation of the session began. A session
    # that idles out and comes back starts a new generation with seq 1 again.
    generation: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> SeqRange:
        if self.seq_to < self.seq_from:
            raise ValueError(f"empty range [{self.seq_from}, {self.seq_to}]")
        return self

    def covers(self, other: SeqRange) -> bool:
        return self.seq_from <= other.seq_from and other.seq_to <= self.seq_to


class SummarizeRequest(SeqRange):
    """Compress a closed range of one session's actions into the rolling summary.

    A ``final`` request closes the session's generation at the summarize stage,
    whose state for it ends then and only then. It may carry no batches (the
    session went idle right after a summary): its range is then empty,
    ``seq_from == seq_to + 1``.
    """

    session_id: str
    product_id: str = ""
    batches: list[ActionsPayload]
    final: bool = False  # the session went idle: this closes it
    created_at: float
    ledger: SessionLedger | None = None  # the session's facts up to seq_to

    @model_validator(mode="after")
    def _ordered(self) -> SummarizeRequest:  # replaces SeqRange's: a final may be empty
        if self.seq_to < self.seq_from and not (
            self.final and not self.batches and self.seq_from == self.seq_to + 1
        ):
            raise ValueError(f"empty range [{self.seq_from}, {self.seq_to}]")
        return self

    @property
    def closes_only(self) -> bool:
        """A final request with nothing new to summarise."""
        return self.seq_from > self.seq_to

    @property
    def request_id(self) -> str:
        """Deterministic, so a re-emitted request is recognisable."""
        return f"{self.session_id}:{self.seq_from}-{self.seq_to}"

    @property
    def action_count(self) -> int:
        return self.seq_to - self.seq_from + 1


class ActionsWritten(SeqRange):
    """A batch of raw actions to append to the session's context.

    ``payload`` is None at a sink that declared it does not read it
    (``Sink.reads_payload``): the header and ``text`` are what most sinks need."""

    op: Literal["actions_written"] = "actions_written"
    session_id: str
    product_id: str = ""
    conversation_id: str | None = None
    text: str
    payload: ActionsPayload
    emitted_at: float
    ingested_at: float = 0.0  # the input record's Kafka timestamp (0: not known)
    # The newest action's ``timestamp_end`` (0: no action had one, or an operation
    # written before session 19): the sinks' event age, without reading the payload.
    acted_at: float = 0.0


class SummaryUsage(BaseModel):
    """What the LLM call behind a summary cost (None: the offline summarizer wrote it)."""

    model: str
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float | None = None  # None: no price for the model in AC_LLM_PRICES


class SummaryReady(SeqRange):
    """A rolling summary that replaces every raw batch inside its range.

    ``seq_from`` is 1 for a rolling summary: it covers the whole session so far.
    ``window_from`` is where the actions new to this summary start.
    """

    op: Literal["summary_ready"] = "summary_ready"
    session_id: str
    product_id: str = ""
    conversation_id: str | None = None
    summary: str
    window_from: int
    final: bool = False
    emitted_at: float
    ledger: SessionLedger | None = None  # the session's facts up to seq_to
    usage: SummaryUsage | None = None
    summarized_in_s: float | None = None  # the summarizer's time (the LLM call); None: unknown


ContextOperation = Annotated[ActionsWritten | SummaryReady, Field(discriminator="op")]
context_operation_adapter: TypeAdapter[ActionsWritten | SummaryReady] = TypeAdapter(
    ContextOperation
)


class EraseRequest(BaseModel):
    """On ``actions``, keyed by the session: forget it everywhere (``agent-context erase``).

    Keyed like the session's data, so it comes after everything produced for it.
    """

    type: Literal["erase"] = "erase"
    session_id: str = Field(min_length=1)
    requested_at: float = 0.0
    reason: str = ""  # e.g. a ticket number; never personal data (it goes to the logs)


class SessionErased(BaseModel):
    """On ``summarize`` and ``context``: the session was erased; each stage forgets it."""

    op: Literal["session_erased"] = "session_erased"
    session_id: str
    requested_at: float = 0.0
    reason: str = ""
    emitted_at: float


ContextMessage = Annotated[ActionsWritten | SummaryReady | SessionErased, Field(discriminator="op")]
context_message_adapter: TypeAdapter[ActionsWritten | SummaryReady | SessionErased] = TypeAdapter(
    ContextMessage
)


class SessionLink(BaseModel):
    """A session is now tied to a conversation (e.g. from an Intercom webhook)."""

    session_id: str = Field(min_length=1)
    conversation_id: str = Field(min_length=1)
    linked_at: float = 0.0
