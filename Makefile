# The two commands of the README: `make demo` and `make test`.
.PHONY: setup broker demo test test-unit lint stop

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

stop:
	@bash scripts/kafka.sh stop
