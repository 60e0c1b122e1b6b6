"""``LoopHistogram``, ``LoopCounter`` and ``LoopGauge`` serve what ``prometheus_client``'s
``Histogram``, ``Counter`` and ``Gauge`` serve for the same observations (their ``_created``
series aside), labelled or not."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from streams.observe.loop_metrics import LoopCounter, LoopGauge, LoopHistogram

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
        if sink == "view":
            loop.labels(sink).observe(value)
    # A null sink's run of batches: their ages observed at once.
    loop.labels("null").observe_all([value for sink, value in observed if sink == "null"])
    assert _exposition(ours) == _exposition(theirs)


def test_its_name_is_claimed_in_the_registry_and_labels_are_checked() -> None:
    registry = CollectorRegistry()
    histogram = LoopHistogram("ac_y_seconds", "Y.", ["sink"], buckets=BUCKETS, registry=registry)
    with pytest.raises(ValueError, match="Duplicated"):
        Histogram("ac_y_seconds", "Y.", registry=registry)
    with pytest.raises(ValueError, match="labels"):
        histogram.labels("a", "b")


@given(
    st.lists(
        st.tuples(
            st.sampled_from([("null", "applied"), ("view", "refused")]),
            st.one_of(st.just(1), st.integers(0, 10**6), st.floats(0, 1e6, allow_nan=False)),
        ),
        max_size=50,
    )
)
def test_the_same_exposition_as_a_prometheus_counter(
    counted: list[tuple[tuple[str, str], float]],
) -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    reference = Counter("ac_ops_total", "Ops.", ["sink", "outcome"], registry=theirs)
    loop = LoopCounter("ac_ops_total", "Ops.", ["sink", "outcome"], registry=ours)
    reference.labels("null", "applied")  # a bound child shows at zero, as theirs does
    loop.labels("null", "applied")
    for labels, amount in counted:
        reference.labels(*labels).inc(amount)
        loop.labels(*labels).inc(amount)
    assert _exposition(ours) == _exposition(theirs)
    with pytest.raises(ValueError, match="non-negative"):
        loop.labels("null", "applied").inc(-1)


def test_a_counter_s_name_is_claimed_and_its_labels_are_checked() -> None:
    registry = CollectorRegistry()
    counter = LoopCounter("ac_z_total", "Z.", ["sink"], registry=registry)
    with pytest.raises(ValueError, match="Duplicated"):
        Counter("ac_z_total", "Z.", registry=registry)
    with pytest.raises(ValueError, match="labels"):
        counter.labels("a", "b")


@given(st.lists(st.tuples(st.booleans(), st.sampled_from([1, 2, 0.5])), max_size=30))
def test_the_same_exposition_as_a_prometheus_gauge_and_unlabelled_metrics_too(
    changes: list[tuple[bool, float]],
) -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    gauge, loop_gauge = (
        Gauge("ac_g", "G.", registry=theirs),
        LoopGauge("ac_g", "G.", [], registry=ours),
    )
    level = loop_gauge.labels()  # shows at zero before any change, as theirs does
    histogram = Histogram("ac_h_seconds", "H.", buckets=BUCKETS, registry=theirs)
    loop_histogram = LoopHistogram("ac_h_seconds", "H.", [], buckets=BUCKETS, registry=ours)
    loop_histogram.labels()
    for up, amount in changes:
        (gauge.inc if up else gauge.dec)(amount)
        (level.inc if up else level.dec)(amount)
        histogram.observe(amount)
        loop_histogram.labels().observe(amount)
    assert _exposition(ours) == _exposition(theirs)
    with pytest.raises(ValueError, match="Duplicated"):
        Gauge("ac_g", "G.", registry=ours)
