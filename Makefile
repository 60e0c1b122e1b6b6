# The two commands of the README: `make demo` and `make test`.
.PHONY: setup broker demo test test-unit test-cluster lint stop

setup:
	@bash scripts/bootstrap.sh

broker: setup
	@bash scripts/kafka.sh start

demo: broker
	@.venv/bin/python scripts/demo.py

lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy
	.venv/bin/lint-imports

# The broker: KAFKA_BOOTSTRAP_SERVERS if set, else Testcontainers when a Docker
# engine answers, else scripts/kafka.sh (see tests/support/broker.py).
test: setup
	.venv/bin/python -m pytest

# No broker needed: models, pure state, plug-ins and loopback fakes (about a minute).
test-unit: setup
	.venv/bin/python -m pytest tests/unit
# The tests of tests/cluster/ against a 3-broker cluster (scripts/kafka.sh --brokers 3,
# ports 19092-19097): started here if not running, and then stopped again.
test-cluster: setup
	@if bash scripts/kafka.sh status --brokers 3 >/dev/null; then \
		.venv/bin/python -m pytest -m cluster tests/cluster; \
	else \
		bash scripts/kafka.sh start --brokers 3 && \
		{ .venv/bin/python -m pytest -m cluster tests/cluster; status=$$?; \
		  bash scripts/kafka.sh stop --brokers 3; exit $$status; }; \
	fi

stop:
	@bash scripts/kafka.sh stop
