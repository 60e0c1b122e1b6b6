"""Histograms, counters and gauges changed from the event loop's thread only, without a lock.

``prometheus_client``'s ``Histogram.observe`` takes a mutex for its bucket and another for
its sum: 0.74-0.79 µs an observation against 0.11-0.15 here (docs/performance.md, "Tried"),
three per operation at a sink; its ``Counter.inc``, one per operation, was 3% of a null
sink (py-spy); the summarize stage's three per request (a counter's ``labels``, the LLM's
gauge and latency) cost 5.4 µs against 1.1. These keep plain numbers for a custom
collector, which ``prometheus_client`` serves as it serves its own
(``registry.register``); the exposition is the same but for the ``_created`` series
(tests/unit/test_loop_metrics.py).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from typing import Generic, Protocol, TypeVar

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.utils import INF, floatToGoString

__all__ = ["LoopCounter", "LoopGauge", "LoopHistogram"]

C = TypeVar("C")


class _Labelled(Generic[C]):
    """A metric's name in ``registry`` and its children by label values, each made by
    ``child()`` when first asked for (a bound child shows at zero, as prometheus_client's)."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        child: Callable[[], C],
        registry: CollectorRegistry,
    ) -> None:
        self._name, self._documentation = name, documentation
        self._labelnames = tuple(labelnames)
        self._child = child
        self._children: dict[tuple[str, ...], C] = {}
        registry.register(self)  # type: ignore[arg-type]  # a Collector: collect() in each subclass

    def labels(self, *values: str) -> C:
        if len(values) != len(self._labelnames):
            raise ValueError(f"{self._name}: labels {self._labelnames}, got {values}")
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._child()
        return child


class _Child:
    __slots__ = ("_bounds", "counts", "sum")

    def __init__(self, bounds: list[float]) -> None:
        self._bounds = bounds
        self.counts = [0] * len(bounds)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        """As ``Histogram.observe``: the first bucket whose bound is >= ``value``."""
        self.counts[bisect_left(self._bounds, value)] += 1
        self.sum += value

    def observe_all(self, values: Sequence[float]) -> None:
        """``observe`` each of ``values``."""
        counts, bounds = self.counts, self._bounds
        for value in values:
            counts[bisect_left(bounds, value)] += 1
        self.sum += sum(values)


class LoopHistogram(_Labelled[_Child]):
    """A labelled histogram (``labels(*values).observe(v)``) for one thread's observations."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        *,
        buckets: Sequence[float],
        registry: CollectorRegistry = REGISTRY,
    ) -> None:
        bounds = sorted(float(b) for b in buckets)
        self._bounds = bounds if bounds[-1] == INF else [*bounds, INF]
        super().__init__(name, documentation, labelnames, lambda: _Child(self._bounds), registry)

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self._name, self._documentation, labels=self._labelnames)
        for values, child in list(self._children.items()):
            cumulative, buckets = 0, []
            for bound, count in zip(self._bounds, child.counts, strict=True):
                cumulative += count
                buckets.append((floatToGoString(bound), float(cumulative)))
            family.add_metric(list(values), buckets, child.sum)
        yield family

    def describe(self) -> Iterator[HistogramMetricFamily]:
        """Registered before any observation: the name is claimed, as a Histogram's is."""
        yield HistogramMetricFamily(self._name, self._documentation, labels=self._labelnames)


class _Count:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1) -> None:
        """As ``Counter.inc``: a counter only goes up."""
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self.value += amount


class _Level:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1) -> None:
        self.value += amount

    def dec(self, amount: float = 1) -> None:
        self.value -= amount


class _Number(Protocol):
    value: float


V = TypeVar("V", bound=_Number)


class _Valued(_Labelled[V]):
    """Children of one number each (``child``), served as a ``family`` of metrics."""

    child: Callable[[], V]
    family: type[CounterMetricFamily] | type[GaugeMetricFamily]

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        *,
        registry: CollectorRegistry = REGISTRY,
    ) -> None:
        super().__init__(name, documentation, labelnames, self.child, registry)

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        family = self.family(self._name, self._documentation, labels=self._labelnames)
        for values, child in list(self._children.items()):
            family.add_metric(list(values), child.value)
        yield family

    def describe(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        """Registered before any change: the name is claimed, as prometheus_client's is."""
        yield self.family(self._name, self._documentation, labels=self._labelnames)


class LoopCounter(_Valued[_Count]):
    """A labelled counter (``labels(*values).inc(n)``) for one thread's increments."""

    child, family = _Count, CounterMetricFamily


class LoopGauge(_Valued[_Level]):
    """A labelled gauge (``labels(*values).inc()``, ``.dec()``) for one thread's changes."""

    child, family = _Level, GaugeMetricFamily
