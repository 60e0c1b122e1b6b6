"""Wire models: the connector's payloads and this service's own messages."""

from schemas.actions import ActionsPayload, SlimAction
from schemas.codec import InvalidMessage, decode, encode
from schemas.dead_letter import DeadLetter
from schemas.operations import (
    ActionsWritten,
    ContextOperation,
    SeqRange,
    SessionLink,
    SummarizeRequest,
    SummaryReady,
    SummaryUsage,
    context_operation_adapter,
)

__all__ = [
    "ActionsPayload",
    "ActionsWritten",
    "ContextOperation",
    "DeadLetter",
    "InvalidMessage",
    "SeqRange",
    "SessionLink",
    "SlimAction",
    "SummarizeRequest",
    "SummaryReady",
    "SummaryUsage",
    "context_operation_adapter",
    "decode",
    "encode",
]
