"""(d) The peer: the accumulate job written the natural way with Quix Streams.

Per session, in Quix's RocksDB state (one store per partition, with its changelog
topic): number the actions, emit each batch as ``actions_written``, keep the actions
not yet summarised, and at K emit a ``summarize`` request holding them. Quix's
defaults otherwise (at-least-once, a checkpoint every 5 s).

Runs in an interpreter with ``quixstreams`` (the ``bench`` extra), started by
``scripts/bench/peer.py`` with its settings in ``QUIX_PEER_*``; imports nothing
of the project. Prints ``READY`` when it has taken the probe record (it is
assigned and its state recovered), then runs until it is stopped.
"""

from __future__ import annotations

import os
from typing import Any

from quixstreams import Application, State

PROBE = "__probe__"
K = int(os.environ["QUIX_PEER_THRESHOLD"])
PREFIX = os.environ["QUIX_PEER_PREFIX"]

app = Application(
    broker_address=os.environ["QUIX_PEER_BOOTSTRAP"],
    consumer_group=PREFIX + "peer",
    auto_offset_reset="earliest",
    state_dir=os.environ["QUIX_PEER_STATE_DIR"],
    loglevel="WARNING",
)
actions = app.topic(os.environ["QUIX_PEER_INPUT"], value_deserializer="json")
written = app.topic(PREFIX + "peer-actions_written", value_serializer="json")
summarize = app.topic(PREFIX + "peer-summarize", value_serializer="json")
summaries = app.topic(PREFIX + "peer-summaries", value_serializer="json")


def not_probe(payload: dict[str, Any]) -> bool:
    if payload["session_id"] == PROBE:
        print("READY", flush=True)
        return False
    return True


def accumulate(payload: dict[str, Any], state: State) -> dict[str, Any]:
    """Number the payload's actions and keep them until K have accumulated."""
    count: int = state.get("count", 0)
    pending: list[dict[str, Any]] = state.get("pending", [])
    batch = payload["actions"]
    first, count = count + 1, count + len(batch)
    pending.extend(batch)
    request = None
    if len(pending) >= K:
        request = {"session_id": payload["session_id"], "first": count - len(pending) + 1}
        request.update(last=count, actions=pending)
        pending = []
    state.set("count", count)
    state.set("pending", pending)
    out = {"session_id": payload["session_id"], "first": first, "last": count, "actions": batch}
    return {"written": out, "summarize": request}


sdf = app.dataframe(actions).filter(not_probe).apply(accumulate, stateful=True)
sdf.apply(lambda result: result["written"]).to_topic(written)
requests = sdf.filter(lambda result: result["summarize"] is not None)
requests.apply(lambda result: result["summarize"]).to_topic(summarize)


def summarise(request: dict[str, Any], state: State) -> dict[str, Any]:
    """The rolling summary: the previous one and the new actions, one prompt."""
    lines = [state.get("summary", "")] + [action["title"] for action in request["actions"]]
    summary = f"summary of {len(lines)} lines"
    state.set("summary", summary)
    return {"session_id": request["session_id"], "last": request["last"], "summary": summary}


app.dataframe(summarize).apply(summarise, stateful=True).to_topic(summaries)

if __name__ == "__main__":
    app.run()
