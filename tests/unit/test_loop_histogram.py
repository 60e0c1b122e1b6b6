"""``LoopHistogram`` serves what ``prometheus_client``'s ``Histogram`` serves for the same
observations (its ``_created`` series aside)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from streams.observe.loop_histogram import LoopHistogram

BUCKETS = (0.01, 0.05, 0.1, 0.25, 1, 10)


def _exposition(registry: CollectorRegistry) -> list[str]:
    text = generate_latest(registry).decode()
    return [line for line in text.splitlines() if "_created" not in line]


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["null", "view"]),
            st.one_of(st.sampled_from(BUCKETS), st.floats(0, 100, allow_nan=False)),
        ),
        max_size=50,
    )
)
def test_the_same_exposition_as_a_prometheus_histogram(observed: list[tuple[str, float]]) -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    reference = Histogram("ac_x_seconds", "X.", ["sink"], buckets=BUCKETS, registry=theirs)
    loop = LoopHistogram("ac_x_seconds", "X.", ["sink"], buckets=BUCKETS, registry=ours)
    for sink in ("null", "view"):  # a bound child shows with zero counts, as theirs does
        reference.labels(sink)
        loop.labels(sink)
    for sink, value in observed:
        reference.labels(sink).observe(value)
        loop.labels(sink).observe(value)
    assert _exposition(ours) == _exposition(theirs)


def test_its_name_is_claimed_in_the_registry_and_labels_are_checked() -> None:
    registry = CollectorRegistry()
    histogram = LoopHistogram("ac_y_seconds", "Y.", ["sink"], buckets=BUCKETS, registry=registry)
    with pytest.raises(ValueError, match="Duplicated"):
        Histogram("ac_y_seconds", "Y.", registry=registry)
    with pytest.raises(ValueError, match="labels"):
        histogram.labels("a", "b")
