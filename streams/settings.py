"""Settings from the environment (prefix ``AC_``), validated at start-up.

A bad value stops the process before it consumes anything, with a message that
names the setting, instead of failing at the first threshold crossing.
"""

from __future__ import annotations

import importlib.util
import re
from functools import lru_cache
from pathlib import Path
from typing import Annotated, TypeVar
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    AliasChoices,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from schemas.ledger import DEFAULT_ERROR_PATTERN, DEFAULT_KEY_PATTERN, LedgerLimits
from streams.errors import ConfigurationError

__all__ = ["ConfigurationError", "HttpURL", "Settings", "from_environment", "load_settings"]


S = TypeVar("S", bound=BaseSettings)


def _http_url(value: str) -> str:
    """An http(s) URL with a host, kept as written (without a trailing slash): checked at
    start-up, or a typo fails every request later and is retried for ever."""
    parsed = urlsplit(value.strip())
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"{value!r} is not an http:// or https:// URL with a host")
    return value.strip().rstrip("/")


HttpURL = Annotated[str, AfterValidator(_http_url)]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AC_", extra="ignore", populate_by_name=True)

    # Kafka
    app_id: str = "agent-context"
    kafka_bootstrap_servers: str = Field(
        default="127.0.0.1:9092",
        validation_alias=AliasChoices("AC_KAFKA_BOOTSTRAP_SERVERS", "KAFKA_BOOTSTRAP_SERVERS"),
    )
    # How long a worker waits at start for the brokers to accept a connection before it
    # stops with one line naming them (a compose stack may start the broker later).
    broker_wait_s: float = Field(default=30.0, ge=0)
    # A killed worker's partitions wait this long before a rebalance gives them to
    # another (Faust's default, 60 s, left them idle a minute; heartbeats go every 3 s,
    # so 10 s tolerates two lost ones). Faust's own BROKER_SESSION_TIMEOUT, if set, wins.
    broker_session_timeout_s: float = Field(default=10.0, ge=6, le=300)
    topic_prefix: str = ""
    partitions: int = Field(default=8, ge=1)
    # Copies of each new topic (changelogs included) and how many must have a write
    # before it is acknowledged; unset: min(3, brokers) and 2 from 3 copies (1 below).
    replication_factor: int | None = Field(default=None, ge=1)
    min_insync_replicas: int | None = Field(default=None, ge=1)
    store: str = "memory://"  # or rocksdb:// for state larger than memory
    # Bound the worker's RSS with the RocksDB store (streams/_faust/rocksdb.py): two write
    # buffers per database (one per table and partition), one block cache per worker.
    rocksdb_write_buffer_bytes: int = Field(default=4 * 1024 * 1024, ge=64 * 1024)
    rocksdb_block_cache_bytes: int = Field(default=64 * 1024 * 1024, ge=1024 * 1024)
    data_dir: Path = Path(".agent-context")
    web_host: str = "127.0.0.1"  # the address the web server binds (and names itself by)
    web_port: int = 6066
    # A bearer token every endpoint that returns or changes session data requires (the
    # pull view, search, enrich); /healthz stays open, /metrics too unless told.
    api_token: SecretStr | None = None
    metrics_require_token: bool = False
    allow_unauthenticated: bool = False  # serve session data beyond loopback with no token
    # Faust runs its Kafka consumer in a thread of its own; here it shares the worker's
    # event loop unless this is true (streams/_faust/consumer.py says why).
    consumer_thread: bool = False
    lag_interval_s: float = Field(default=5.0, gt=0)  # how often /metrics' consumer lag refreshes
    # Producer batching: a few ms of linger turns thousands of one-message produce
    # requests per second into a few dozen (the dominant cost at linger 0).
    producer_linger_ms: float = Field(default=5.0, ge=0)
    # Changelog records behind a WriteBehind gate only their input's ack: they wait up to
    # this long to join the next outputs' round (fewer produce requests at a steady rate).
    changelog_round_ms: float = Field(
        default=20.0,
        ge=0,
        le=1000,
        validation_alias=AliasChoices("AC_CHANGELOG_ROUND_MS", "AC_SINK_CHANGELOG_ROUND_MS"),
    )
    producer_batch_bytes: int = Field(default=256 * 1024, ge=1024)

    # Accumulation
    threshold: int = Field(default=10, description="K: actions per summary")
    debounce_ms: int = Field(default=0, ge=0)
    debounce_max_ms: int = Field(default=2000, ge=1)
    idle_timeout_s: float = Field(default=300.0, gt=0)
    idle_check_interval_s: float = Field(default=5.0, gt=0)
    max_actions_per_batch: int = Field(default=500, ge=1)
    # The session ledger (schemas/ledger.py): facts counted from every action, shown
    # beside the summary. Sized here; AC_LEDGER=false turns it off.
    ledger: bool = True
    ledger_top_pages: int = Field(default=10, ge=1, le=100)
    ledger_key_actions: int = Field(default=8, ge=0, le=100)
    ledger_errors: int = Field(default=5, ge=0, le=100)
    ledger_key_pattern: str = DEFAULT_KEY_PATTERN  # a regex over "type: title description"
    ledger_error_pattern: str = DEFAULT_ERROR_PATTERN

    # Summarizer
    llm_api_key: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("AC_LLM_API_KEY", "OPENAI_API_KEY")
    )
    llm_base_url: HttpURL | None = None
    llm_model: str = "gpt-4o-mini"
    llm_timeout_s: float = Field(default=30.0, gt=0)
    llm_max_tokens: int = Field(default=256, ge=1)
    llm_temperature: float = 0.3
    llm_concurrency: int = Field(default=32, ge=1)
    llm_retry_budget_s: float = Field(default=120.0, gt=0)
    llm_retry_max_wait_s: float = Field(default=10.0, gt=0)
    llm_callable: str | None = None  # dotted path "pkg.mod:func" to any async (prompt) -> str
    breaker_failures: int = Field(default=5, ge=1)
    breaker_reset_s: float = Field(default=15.0, gt=0)
    prompt: str | None = None
    prompt_file: Path | None = None
    format_actions: str | None = None  # dotted path to (list[ActionsPayload]) -> str
    summary_max_chars: int = Field(default=1500, ge=50)
    # USD per million prompt and completion tokens, per model, as JSON:
    # {"gpt-4o-mini": [0.15, 0.6]} (agents/summarizer/costs.py).
    llm_prices: dict[str, tuple[float, float]] = Field(default_factory=dict)
    llm_daily_token_budget: int = Field(default=0, ge=0)  # per product and UTC day; 0: none
    llm_product_budgets: dict[str, int] = Field(default_factory=dict)  # {"product": tokens}
    max_in_flight_requests: int = Field(default=2000, ge=1)
    # Records a worker buffers per input topic before pausing fetching (_faust/batch_source.py).
    batch_buffer: int = Field(default=4096, ge=1)
    # Bytes fetched per partition per request: a fetch's records are decoded and buffered
    # at once, so this and batch_buffer bound what a worker holds (docs/decisions.md).
    fetch_partition_bytes: int = Field(default=256 * 1024, ge=1024)
    # A fetch waits at the broker until it has this many bytes or for this long: a worker's
    # rounds, not its records, cost its CPU at a steady rate (docs/decisions.md, "fetch wait").
    fetch_min_bytes: int = Field(default=64 * 1024, ge=1)
    fetch_max_wait_ms: int = Field(default=10, ge=1, le=1500)
    # A session's message in progress this long is reported (a log warning and
    # ac_lane_items_stalled): a destination or LLM that retries for ever, or a hang.
    stall_warning_s: float = Field(default=60.0, gt=0)
    # On SIGTERM, how long messages in progress may take before they are left to replay.
    stop_grace_s: float = Field(default=10.0, ge=0)
    # Sessions whose context a sink keeps decoded (~9 KiB each at the bench's defaults); a
    # live session beyond them is decoded from the table per operation (~25 µs more).
    sink_context_cache: int = Field(default=10_000, ge=1)
    # Sessions whose summary state the summarize stage keeps decoded (~5 KiB each at the
    # bench's defaults); beyond them a request decodes its session's state (~6 µs more).
    summary_state_cache: int = Field(default=10_000, ge=1)
    # The accumulator's compiled transition (native/, where built): off, every payload takes
    # the Python one, which writes the same bytes (agents/accumulate/compiled.py). Kafka's
    # partitioner, exact either way, is compiled whenever native/ is built (streams/partitions.py).
    compiled: bool = True

    # Privacy (agents/pii): where the PII filter applies ("llm", "llm,destinations", "off"),
    # the key its placeholders are derived from, custom patterns "NAME=regex;...".
    pii: str = "llm"
    pii_key: SecretStr | None = None
    pii_patterns: str = ""
    pii_phone_region: str = "US"  # for phone numbers written without a country code
    pii_ner: bool = False  # names and addresses with Microsoft Presidio (the pii-ner extra)

    # Sinks
    sink: str = "files"  # a built-in name, an entry point name, or "pkg.mod:factory"
    files_dir: Path = Path(".agent-context/context")

    @field_validator("threshold")
    @classmethod
    def _threshold_at_least_one(cls, value: int) -> int:
        if value < 1:
            raise ValueError(f"AC_THRESHOLD must be >= 1 (actions per summary), got {value}")
        return value

    @model_validator(mode="after")
    def _no_open_data_beyond_this_machine(self) -> Settings:
        # Checked at start: a worker bound beyond loopback with no token would hand any
        # session's actions (emails included) to whoever reaches the port.
        loopback = self.web_host in ("localhost", "::1") or self.web_host.startswith("127.")
        if not loopback and self.api_token is None and not self.allow_unauthenticated:
            raise ValueError(
                f"AC_WEB_HOST={self.web_host} serves session data beyond this machine: set "
                "AC_API_TOKEN (clients send it as a bearer token), or "
                "AC_ALLOW_UNAUTHENTICATED=true"
            )
        return self

    @model_validator(mode="after")
    def _insync_within_replicas(self) -> Settings:
        rf, isr = self.replication_factor, self.min_insync_replicas
        if rf is not None and isr is not None and isr > rf:
            raise ValueError(
                f"AC_MIN_INSYNC_REPLICAS={isr} exceeds AC_REPLICATION_FACTOR={rf}: "
                "no write could ever be acknowledged"
            )
        return self

    @field_validator("prompt_file")
    @classmethod
    def _a_readable_file(cls, value: Path | None) -> Path | None:
        # Read at start-up, not at the first summary: a typo stops the worker with
        # this line instead of a traceback (tests/integration/test_pipeline.py, bad configuration).
        if value is not None:
            try:
                value.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
                raise ValueError(f"cannot read {str(value)!r}: {reason}") from None
        return value

    @field_validator("ledger_key_pattern", "ledger_error_pattern")
    @classmethod
    def _a_regex(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a regular expression ({exc})") from None
        return value

    @field_validator("store")
    @classmethod
    def _store_kind(cls, value: str) -> str:
        if value not in ("memory://", "rocksdb://"):
            raise ValueError(f"{value!r}: must be memory:// or rocksdb://")
        if value == "rocksdb://" and importlib.util.find_spec("rocksdict") is None:
            raise ValueError(
                "rocksdb:// needs the rocksdb extra: pip install 'agent-context-streams[rocksdb]'"
            )
        return value

    @field_validator("pii")
    @classmethod
    def _pii_scope(cls, value: str) -> str:
        parts = {p.strip().lower() for p in value.split(",") if p.strip()}
        for allowed in ({"llm"}, {"llm", "destinations"}, {"off"}):
            if parts == allowed:
                return ",".join(sorted(allowed, key=["llm", "destinations", "off"].index))
        raise ValueError(f"{value!r}: must be llm, llm,destinations or off")

    @field_validator("pii_key")
    @classmethod
    def _pii_key_length(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < 16:
            raise ValueError("must be at least 16 characters (it keys the PII placeholders)")
        return value

    @field_validator("pii_patterns")
    @classmethod
    def _pii_patterns_parse(cls, value: str) -> str:
        _parse_pii_patterns(value)
        return value

    @field_validator("pii_phone_region")
    @classmethod
    def _a_phone_region(cls, value: str) -> str:
        import phonenumbers

        if value.upper() not in phonenumbers.SUPPORTED_REGIONS:
            raise ValueError(f"{value!r} is not a region code libphonenumber knows (e.g. US, GB)")
        return value.upper()

    def pii_pattern_list(self) -> list[tuple[str, re.Pattern[str]]]:
        return _parse_pii_patterns(self.pii_patterns)

    def ledger_limits(self) -> LedgerLimits | None:
        if not self.ledger:
            return None
        return LedgerLimits(
            top_pages=self.ledger_top_pages,
            key_actions=self.ledger_key_actions,
            errors=self.ledger_errors,
            key_pattern=self.ledger_key_pattern,
            error_pattern=self.ledger_error_pattern,
        )

    @property
    def broker_url(self) -> str:
        return ",".join(f"kafka://{h.strip()}" for h in self.kafka_bootstrap_servers.split(","))

    def topic(self, name: str) -> str:
        return f"{self.topic_prefix}{name}"

    def prompt_template(self) -> str | None:
        if self.prompt_file is not None:
            return self.prompt_file.read_text(encoding="utf-8")
        return self.prompt


_PII_NAME = re.compile(r"[A-Z][A-Z0-9_]*")


def _parse_pii_patterns(value: str) -> list[tuple[str, re.Pattern[str]]]:
    """``NAME=regex;NAME2=regex``: a ``;`` splits only before ``NAME=``, so a regex may hold one."""
    patterns = []
    for item in re.split(r";(?=\s*[A-Z][A-Z0-9_]*=)", value.strip()):
        if not item.strip():
            continue
        name, sep, regex = item.strip().partition("=")
        if not sep or not _PII_NAME.fullmatch(name) or not regex:
            raise ValueError(f"{item.strip()!r} is not NAME=regex (NAME in capitals)")
        try:
            patterns.append((name, re.compile(regex)))
        except re.error as exc:
            raise ValueError(f"{name}: not a regular expression ({exc})") from None
    return patterns


def from_environment(cls: type[S], prefix: str = "AC_") -> S:
    """Read ``cls`` from the environment, or stop with one line per bad value, naming
    the variable: ``invalid setting AC_THRESHOLD: must be >= 1 ...``. The one place
    settings errors are worded (tests/integration/test_cli.py checks the line)."""
    try:
        return cls()
    except ValidationError as exc:
        problems = []
        for item in exc.errors(include_url=False, include_input=False):
            field_name = "_".join(str(p) for p in item["loc"]).upper()
            name = field_name if field_name.startswith(prefix) else prefix + field_name
            missing = item["type"] == "missing"
            reason = "required (set it in the environment)" if missing else item["msg"]
            reason = reason.removeprefix("Value error, ")
            # A rule across settings has no one field: its message names them.
            problems.append(f"invalid setting {name}: {reason}" if field_name else reason)
        raise ConfigurationError("\n".join(problems)) from None


@lru_cache(maxsize=1)
def load_settings() -> Settings:
    """Read settings from the environment once; exit with a clear message if invalid."""
    return from_environment(Settings)
