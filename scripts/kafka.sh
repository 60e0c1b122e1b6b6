#!/usr/bin/env bash
# A single-node Apache Kafka broker (KRaft) for the demo and the tests, without
# Docker: the broker jars come from Maven Central and run on the local JDK.
#
#   scripts/kafka.sh start    download (once), format storage (once), start, wait until ready
#   scripts/kafka.sh stop     stop the broker started by this script
#   scripts/kafka.sh status   print whether it runs
#
# Environment: KAFKA_PORT (default 9092), KAFKA_CACHE (jars, default
# ~/.cache/agent-context/kafka), KAFKA_DATA (logs and storage, default
# .kafka-data in the project), KAFKA_HEAP (default 512m).
set -euo pipefail

KAFKA_VERSION=4.0.0   # keep in step with docker-compose.yml (a test checks)

here=$(cd "$(dirname "$0")" && pwd)
port=${KAFKA_PORT:-9092}
controller_port=$((port + 1))
cache=${KAFKA_CACHE:-$HOME/.cache/agent-context/kafka}
lib="$cache/$KAFKA_VERSION/lib"
data=${KAFKA_DATA:-$(dirname "$here")/.kafka-data/$port}
pidfile="$data/broker.pid"
logfile="$data/broker.log"

log() { printf '[kafka] %s\n' "$*" >&2; }

running() { [[ -f $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

fetch_jars() {
  if [[ -f "$lib/.complete" ]]; then
    log "using cached Kafka $KAFKA_VERSION jars in $lib (no download)"
    return
  fi
  log "downloading Kafka $KAFKA_VERSION and its runtime jars from Maven Central into $lib"
  mkdir -p "$lib"
  mvn -q -B -f "$here/kafka/pom.xml" -Dkafka.version="$KAFKA_VERSION" \
    dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$lib"
  touch "$lib/.complete"
}

write_config() {
  mkdir -p "$data/logs"
  cat >"$data/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:$controller_port
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$controller_port
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=$data/logs
num.partitions=1
auto.create.topics.enable=false
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
default.replication.factor=1
min.insync.replicas=1
group.initial.rebalance.delay.ms=0
PROPS
}

format_storage() {
  [[ -f "$data/logs/meta.properties" ]] && return
  local cluster_id
  cluster_id=$(java -cp "$lib/*" kafka.tools.StorageTool random-uuid)
  java -cp "$lib/*" kafka.tools.StorageTool format --standalone -t "$cluster_id" \
    -c "$data/server.properties" >/dev/null 2>&1
  log "formatted KRaft storage in $data/logs (cluster $cluster_id)"
}

wait_ready() {
  local started=$1 deadline=$((SECONDS + 90))
  until grep -q "Kafka Server started" "$logfile" 2>/dev/null; do
    if ! running; then log "broker exited; last lines of $logfile:"; tail -20 "$logfile" >&2; exit 1; fi
    if ((SECONDS > deadline)); then log "broker not ready after 90 s; see $logfile"; exit 1; fi
    sleep 0.2
  done
  local ms=$(( $(date +%s%3N) - started ))
  log "broker ready on 127.0.0.1:$port, start to ready: ${ms} ms"
}

start() {
  if running; then log "already running on 127.0.0.1:$port (pid $(cat "$pidfile"))"; return; fi
  command -v java >/dev/null || { log "java not found: install a JDK (17+)"; exit 1; }
  fetch_jars
  write_config
  format_storage
  local started
  started=$(date +%s%3N)
  : >"$logfile"
  nohup java -Xms256m -Xmx"${KAFKA_HEAP:-512m}" -XX:+UseG1GC \
    -cp "$lib/*" kafka.Kafka "$data/server.properties" >>"$logfile" 2>&1 &
  echo $! >"$pidfile"
  wait_ready "$started"
}

stop() {
  if ! running; then log "not running"; rm -f "$pidfile"; return; fi
  local pid deadline=$((SECONDS + 30))
  pid=$(cat "$pidfile")
  kill "$pid"
  while kill -0 "$pid" 2>/dev/null; do
    if ((SECONDS > deadline)); then log "no clean stop in 30 s; killing"; kill -9 "$pid"; fi
    sleep 0.2
  done
  rm -f "$pidfile"
  log "stopped"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) if running; then echo "running on 127.0.0.1:$port"; else echo "stopped"; exit 1; fi ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
