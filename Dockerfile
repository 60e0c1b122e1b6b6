FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY schemas schemas
COPY streams streams
COPY agents agents
COPY sinks sinks
RUN pip install --no-cache-dir '.[rocksdb]'
ENV PYTHONUNBUFFERED=1
EXPOSE 6066
CMD ["faust", "-A", "agents.app", "worker", "-l", "info"]
