"""A realistic synthetic stream of a SaaS app's sessions, for the demo, tests and benchmarks.

Deterministic for a seed: sessions of varying length walk through pages,
click, submit forms, hit errors; their batches (1-5 actions) are interleaved.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["SessionPlan", "interleaved_payloads", "plan_sessions"]

APP = "https://app.example.com"
PAGES = {
    "/dashboard": ["Viewed usage chart", "Opened date range picker", "Switched to weekly view"],
    "/projects": ["Opened project Apollo", "Sorted projects by date", "Searched projects for 'q3'"],
    "/projects/:id/tasks": ["Created task 'Fix login bug'", "Assigned task to Dana", "Closed task"],
    "/reports": ["Opened revenue report", "Clicked Export CSV", "Changed report filter to EMEA"],
    "/settings/billing": [
        "Opened billing settings",
        "Clicked Upgrade plan",
        "Entered card details",
    ],
    "/settings/team": [
        "Clicked Invite teammate",
        "Entered teammate email",
        "Changed role to Admin",
    ],
    "/integrations": ["Opened Slack integration", "Clicked Connect", "Saw error 'OAuth failed'"],
    "/help": ["Searched help for 'export limits'", "Opened article 'CSV exports'"],
}
TYPES = {"Clicked": "click", "Entered": "input", "Created": "submit", "Saw": "error"}


@dataclass(frozen=True)
class SessionPlan:
    session_id: str
    user_id: str
    email: str
    length: int


def plan_sessions(
    count: int, *, mean_length: int = 60, seed: int = 7, prefix: str = "ps"
) -> list[SessionPlan]:
    rng = random.Random(seed)
    low, high = max(1, mean_length // 3), mean_length * 5 // 3
    return [
        SessionPlan(
            session_id=f"{prefix}_{i:05d}_{rng.randrange(16**6):06x}",
            user_id=f"user_{i}",
            email=f"user{i}@example.com",
            length=rng.randint(low, high),
        )
        for i in range(count)
    ]


def _action(
    rng: random.Random, plan: SessionPlan, index: int, page: str, ts: float
) -> dict[str, object]:
    description = rng.choice(PAGES[page])
    kind = next((t for word, t in TYPES.items() if description.startswith(word)), "click")
    if index == 0 or rng.random() < 0.25:
        kind, description = "pageview", f"User landed on {page}"
    url = f"{APP}{page}"
    return {
        "index": index,
        "type": kind,
        "title": description.split(" '")[0],
        "description": description,
        "canonical_url": url,
        "raw_url": url.replace(":id", str(rng.randint(100, 999))),
        "timestamp_start": ts,
        "timestamp_end": ts + rng.uniform(0.2, 4.0),
        "session_id": plan.session_id,
        "user_id": plan.user_id,
        "email": plan.email,
        "conversation_id": None,
    }


def _session_payloads(
    plan: SessionPlan, seed: int, product_id: str, start: float
) -> Iterator[dict[str, object]]:
    rng = random.Random(f"{seed}:{plan.session_id}")
    page = "/dashboard"
    index, ts = 0, start
    while index < plan.length:
        size = min(rng.randint(1, 5), plan.length - index)
        actions = []
        for _ in range(size):
            if rng.random() < 0.3:
                page = rng.choice(list(PAGES))
            actions.append(_action(rng, plan, index, page, ts))
            index += 1
            ts += rng.uniform(1, 20)
        yield {
            "type": "actions",
            "product_id": product_id,
            "session_id": plan.session_id,
            "user_id": plan.user_id,
            "email": plan.email,
            "count": len(actions),
            "forwarded_at": ts,
            "conversation_id": None,
            "actions": actions,
        }


def interleaved_payloads(
    plans: list[SessionPlan], *, seed: int = 7, product_id: str = "prod_demo", start: float = 1.7e9
) -> Iterator[dict[str, object]]:
    """All sessions' payloads, interleaved at random, each session's in order."""
    rng = random.Random(seed)
    streams = {p.session_id: _session_payloads(p, seed, product_id, start) for p in plans}
    live = list(streams)
    while live:
        sid = rng.choice(live)
        try:
            yield next(streams[sid])
        except StopIteration:
            live.remove(sid)
