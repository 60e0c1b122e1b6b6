"""Quantiles and stall counts from two scrapes of a worker's Prometheus histograms."""

from __future__ import annotations

import re


def stalls(worker: str, text: str, since: str) -> dict[str, float]:
    """A worker's event-loop stalls and GC pauses over the measured part (streams.observe.stalls)."""
    found = {}
    for key, name, labels in (
        ("loop", "ac_event_loop_lag_seconds", ""),
        ("gc0", "ac_gc_pause_seconds", 'generation="0"'),
        ("gc1", "ac_gc_pause_seconds", 'generation="1"'),
        ("gc2", "ac_gc_pause_seconds", 'generation="2"'),
    ):
        buckets = bucket_deltas(text, name, since, labels)
        total = buckets[-1][1] if buckets else 0.0
        below = dict(buckets)
        found[f"{worker}_{key}_over_25ms"] = total - below.get(0.025, total)
        found[f"{worker}_{key}_max_le_s"] = next(
            (bound for bound, count in buckets if total and count >= total), 0.0
        )
    return found


def bucket_counts(text: str, name: str, labels: str = "") -> dict[float, float]:
    counts: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith(f"{name}_bucket") and labels in line:
            le = re.search(r'le="([^"]+)"', line)
            if le:
                counts[float(le.group(1))] = float(line.rsplit(" ", 1)[1])
    return counts


def bucket_deltas(text: str, name: str, since: str, labels: str = "") -> list[tuple[float, float]]:
    """A histogram's cumulative bucket counts, less those of an earlier scrape, by bound."""
    earlier = bucket_counts(since, name, labels)
    return sorted(
        (bound, count - earlier.get(bound, 0.0))
        for bound, count in bucket_counts(text, name, labels).items()
    )


def histogram_quantiles(text: str, name: str, since: str = "") -> dict[str, float]:
    """p50/p99 as bucket upper bounds, of the observations made after ``since`` (a scrape)."""
    buckets = bucket_deltas(text, name, since)
    total = buckets[-1][1] if buckets else 0

    def quantile(q: float) -> float:
        for bound, count in buckets:
            if count >= q * total:
                return bound
        return float("nan")

    return {"p50_le_s": quantile(0.5), "p99_le_s": quantile(0.99), "samples": total}
