"""Names and addresses with Microsoft Presidio (the optional ``pii-ner`` extra).

Off by default (``AC_PII_NER=true`` turns it on): it needs a spaCy model download and
costs milliseconds per text, where the built-in detectors need neither.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from agents.pii.detectors import Detector, Span

__all__ = ["presidio_detectors"]

# Presidio's entity -> our placeholder type.
ENTITIES = {"PERSON": "PERSON", "LOCATION": "ADDRESS"}


def presidio_detectors(analyzer: Any = None, min_score: float = 0.6) -> list[tuple[str, Detector]]:
    """One detector per entity; raises ImportError when Presidio is not installed."""
    if analyzer is None:
        from presidio_analyzer import AnalyzerEngine

        analyzer = AnalyzerEngine()

    def detector(entity: str) -> Detector:
        def detect(text: str) -> Iterator[Span]:
            for result in analyzer.analyze(text=text, entities=[entity], language="en"):
                if result.score >= min_score:
                    yield result.start, result.end, text[result.start : result.end].lower()

        return detect

    return [(kind, detector(entity)) for entity, kind in ENTITIES.items()]
