"""Prometheus metrics shared by the pipeline and the sinks (served at /metrics)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from streams.observe.loop_metrics import LoopCounter, LoopGauge, LoopHistogram

ACTIONS_IN = Counter("ac_actions_in_total", "Actions applied by the accumulator")
COMPILED_PAYLOADS = Counter(
    "ac_compiled_payloads_total",
    "Payloads the accumulator applied with its compiled transition (the rest: in Python)",
)
COMPILED_REQUESTS = LoopCounter(
    "ac_compiled_requests_total",
    "Summarize requests read by the compiled reader (the rest: decoded and counted in Python)",
    [],
)
REPLAYS_SKIPPED = Counter(
    "ac_replays_skipped_total", "Redelivered messages recognised and skipped", ["stage"]
)
ACTIVE_SESSIONS = Gauge(
    "ac_active_sessions", "Sessions with accumulator state on this worker's partitions"
)
ROCKSDB_MEMORY = Gauge(
    "ac_rocksdb_memory_bytes",
    "RocksDB's own memory in this worker (block cache, memtables, table readers)",
    ["kind"],
)
FETCH_PAUSES = Counter(
    "ac_fetch_pauses_total",
    "Partitions paused because the worker's batch buffer was full",
    ["topic"],
)
RECORDS_ACKNOWLEDGED = Counter(
    "ac_records_acknowledged_total",
    "Input records whose effects are durable (acknowledged: the consumer may commit past them)",
    ["topic"],
)
WRITE_BEHIND_WAITS = Counter(
    "ac_write_behind_wait_seconds_total",
    "Time a stage waited to seal a unit while its write-behind was full: the broker's "
    "acknowledgements, not the stage's CPU, bounded it then",
    ["stage"],
)
SESSIONS_EXPIRED = Counter("ac_sessions_expired_total", "Idle sessions closed and expired")
DEAD_LETTERS = Counter(
    "ac_dead_letters_total", "Messages sent to dead letters", ["stage", "reason"]
)
# Counted per request on the summarize stage's event loop: see LoopCounter.
SUMMARIES = LoopCounter("ac_summaries_total", "Summaries emitted", ["outcome"])
LLM_TOKENS = Counter(
    "ac_llm_tokens_total", "LLM tokens as reported by the provider", ["product", "model", "kind"]
)
LLM_COST = Counter(
    "ac_llm_cost_usd_total", "LLM cost from AC_LLM_PRICES, in US dollars", ["product", "model"]
)
SUMMARIES_OVER_BUDGET = Counter(
    "ac_summaries_over_budget_total",
    "Summaries written offline because their product spent its daily LLM token budget",
    ["product"],
)
SUMMARY_CHAIN_BREAKS = Counter(
    "ac_summary_chain_breaks_total",
    "Summarize requests that did not start right after their generation's previous one "
    "(the summary was prompted without its predecessor); must stay 0",
)
PII_DETECTIONS = Counter(
    "ac_pii_detections_total", "PII values replaced by placeholders (agents/pii)", ["type"]
)
# Per LLM call, on the summarize stage's event loop: see LoopHistogram and LoopGauge.
LLM_LATENCY = LoopHistogram(
    "ac_llm_latency_seconds",
    "LLM call latency",
    [],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
).labels()
LLM_FAILURES = Counter("ac_llm_failures_total", "Failed LLM calls", ["kind"])
LLM_IN_FLIGHT = LoopGauge("ac_llm_in_flight", "LLM calls in flight", []).labels()
BREAKER_STATE = Gauge("ac_llm_breaker_open", "1 while the LLM circuit breaker is open")
BREAKER_TRANSITIONS = Counter("ac_llm_breaker_transitions_total", "Breaker changes", ["to"])
# Counted per operation on a sink's event loop: see LoopCounter.
SINK_OPERATIONS = LoopCounter(
    "ac_sink_operations_total", "Context operations handled by a sink", ["sink", "op", "outcome"]
)
SINK_RETRIES = Counter("ac_sink_retries_total", "Sink delivery retries", ["sink"])
SINK_CONTEXTS_DECODED = Counter(
    "ac_sink_contexts_decoded_total",
    "Stored contexts a sink decoded from its table: not in its cache (AC_SINK_CONTEXT_CACHE)",
    ["sink"],
)
# A sink observes these three per operation, on its event loop: see LoopHistogram.
END_TO_END = LoopHistogram(
    "ac_end_to_end_seconds",
    "From an operation's emission to its application at a sink",
    ["sink"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.075, 0.09, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
# Fine below 250 ms: that is where a healthy pipeline's latency lives (and where the
# benchmark reads p50/p99: 90 ms tells "under 100 ms" from "about 100"); coarse beyond
# for backlogs and replays.
_AGE_BUCKETS = (
    0.01,
    0.02,
    0.03,
    0.04,
    0.05,
    0.06,
    0.075,
    0.09,
    0.1,
    0.125,
    0.15,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    300,
    900,
    3600,
    21600,
    86400,
)
ACTION_AGE_AT_SINK = LoopHistogram(
    "ac_action_age_at_sink_seconds",
    "From when the newest action's input record was written to Kafka (its record timestamp:"
    " a clock this service controls) to its batch's application at a sink",
    ["sink"],
    buckets=_AGE_BUCKETS,
)
ACTION_EVENT_AGE_AT_SINK = LoopHistogram(
    "ac_action_event_age_at_sink_seconds",
    "Event time: from the newest action's own timestamp_end (the user's action time, by the"
    " client's clock) to its batch's application at a sink; replayed, backfilled or"
    " synthetic actions show their true (large) age",
    ["sink"],
    buckets=_AGE_BUCKETS,
)
LANES_STALLED = Gauge(
    "ac_lane_items_stalled",
    "Sessions whose message in progress has been at it for AC_STALL_WARNING_S or more",
    ["stage"],
)
OLDEST_LANE_ITEM = Gauge(
    "ac_lane_oldest_item_seconds",
    "How long the longest-running session message in progress has been at it",
    ["stage"],
)
CONSUMER_LAG = Gauge(
    "ac_consumer_lag",
    "Per input partition assigned to this worker: log end offset minus its consumer"
    " group's committed offset (messages not yet durably processed)",
    ["group", "topic", "partition"],
)
_PAUSE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5, 5)
EVENT_LOOP_LAG = Histogram(
    "ac_event_loop_lag_seconds",
    "How late the worker's event loop woke a task due every 50 ms: time a callback held"
    " the loop (every session of the worker waits that long)",
    buckets=_PAUSE_BUCKETS,
)
GC_PAUSE = Histogram(
    "ac_gc_pause_seconds",
    "Python's cyclic garbage collections, by generation",
    ["generation"],
    buckets=_PAUSE_BUCKETS,
)
