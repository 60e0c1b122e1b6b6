"""Wire models: the connector's payloads and this service's own messages."""

from schemas.actions import ActionsPayload, SlimAction
from schemas.codec import InvalidMessage, decode, encode
from schemas.dead_letter import DeadLetter
from schemas.operations import (
    ActionsWritten,
    ContextOperation,
    EraseRequest,
    SeqRange,
    SessionErased,
    SessionLink,
    SummarizeRequest,
    SummaryReady,
    SummaryUsage,
    context_message_adapter,
    context_operation_adapter,
)

__all__ = [
    "ActionsPayload",
    "ActionsWritten",
    "ContextOperation",
    "DeadLetter",
    "EraseRequest",
    "InvalidMessage",
    "SeqRange",
    "SessionErased",
    "SessionLink",
    "SlimAction",
    "SummarizeRequest",
    "SummaryReady",
    "SummaryUsage",
    "context_message_adapter",
    "context_operation_adapter",
    "decode",
    "encode",
]
