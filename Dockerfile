# The compiled hot paths (native/: Rust through PyO3; the transition, Kafka's partitioner),
# built into a wheel here; the workers run without it too (their Python twins do the same).
FROM rust:1-slim-bookworm AS native
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*
COPY native /native
RUN python3 -m venv /build && /build/bin/pip install --no-cache-dir 'maturin>=1.5,<2' \
    && /build/bin/maturin build --release --manifest-path /native/Cargo.toml --out /wheels

FROM python:3.11-slim
WORKDIR /app
COPY --from=native /wheels /wheels
COPY pyproject.toml README.md ./
COPY schemas schemas
COPY streams streams
COPY agents agents
COPY sinks sinks
RUN pip install --no-cache-dir '.[rocksdb]' /wheels/*.whl
ENV PYTHONUNBUFFERED=1
EXPOSE 6066
CMD ["faust", "-A", "agents.app", "worker", "-l", "info"]
