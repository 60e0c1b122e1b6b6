#!/usr/bin/env bash
# Apache Kafka (KRaft) for the demo and the tests, without Docker: the broker jars
# come from Maven Central and run on the local JDK.
#
#   scripts/kafka.sh start    download (once), format storage (once), start, wait until ready
#   scripts/kafka.sh stop     stop the broker started by this script
#   scripts/kafka.sh status   print whether it runs
#   scripts/kafka.sh config   print the broker's server.properties
#
# With --brokers N (N >= 2) the same commands run a cluster of N combined
# controller+broker nodes on loopback: node i listens on KAFKA_CLUSTER_PORT + 2(i-1)
# (default 19092, 19094, ...; its controller on the next port), with replication
# factor min(N, 3) and min.insync.replicas 2 for the internal topics. --node I acts
# on node I alone (the chaos tests stop, kill and restart single nodes).
#
# Environment: KAFKA_PORT (default 9092), KAFKA_CACHE (jars, default
# ~/.cache/agent-context/kafka), KAFKA_DATA (logs and storage, default
# .kafka-data in the project), KAFKA_HEAP (default 1g, Kafka's own; 384m per cluster node).
set -euo pipefail

KAFKA_VERSION=4.0.0   # keep in step with docker-compose.yml (a test checks)

here=$(cd "$(dirname "$0")" && pwd)
command=${1:-}
shift || true
brokers=1
only_node=""
while (($#)); do
  case "$1" in
    --brokers) brokers=${2:?--brokers needs a number}; shift 2 ;;
    --node) only_node=${2:?--node needs a number}; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
[[ $brokers =~ ^[1-9][0-9]*$ ]] || { echo "--brokers must be a positive number, got $brokers" >&2; exit 2; }
cache=${KAFKA_CACHE:-$HOME/.cache/agent-context/kafka}
lib="$cache/$KAFKA_VERSION/lib"
if ((brokers == 1)); then
  port=${KAFKA_PORT:-9092}
  data=${KAFKA_DATA:-$(dirname "$here")/.kafka-data/$port}
else
  base_port=${KAFKA_CLUSTER_PORT:-19092}
  cluster_data=${KAFKA_DATA:-$(dirname "$here")/.kafka-data/cluster-$base_port}
fi

# Point port, controller_port, data, node_id, pidfile and logfile at node $1 (1-based).
select_node() {
  if ((brokers == 1)); then
    node_id=1
  else
    node_id=$1
    port=$((base_port + 2 * (node_id - 1)))
    data="$cluster_data/node-$node_id"
  fi
  controller_port=$((port + 1))
  pidfile="$data/broker.pid"
  logfile="$data/broker.log"
}
select_node 1

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
  properties >"$data/server.properties"
}

# The selected node's server.properties (docker-compose.yml's cluster profile sets the
# same: tests/integration/test_foundation.py compares them).
properties() {
  local quorum="controller.quorum.bootstrap.servers=127.0.0.1:$controller_port"
  local rf=1 isr=1
  if ((brokers > 1)); then
    rf=$((brokers < 3 ? brokers : 3)); isr=$((rf > 2 ? 2 : 1))
    local voters="" i
    for ((i = 1; i <= brokers; i++)); do
      voters+="${voters:+,}$i@127.0.0.1:$((base_port + 2 * (i - 1) + 1))"
    done
    quorum="controller.quorum.voters=$voters
offsets.topic.num.partitions=10"  # not 50: fewer partitions to move on every restart
  fi
  cat <<PROPS
process.roles=broker,controller
node.id=$node_id
$quorum
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$controller_port
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=$data/logs
num.partitions=1
auto.create.topics.enable=false
offsets.topic.replication.factor=$rf
transaction.state.log.replication.factor=$rf
transaction.state.log.min.isr=$isr
share.coordinator.state.topic.replication.factor=$rf
share.coordinator.state.topic.min.isr=$isr
default.replication.factor=$rf
min.insync.replicas=$isr
group.initial.rebalance.delay.ms=0
PROPS
}

# Every node of a cluster is formatted with the same cluster id (kept beside them).
format_storage() {
  [[ -f "$data/logs/meta.properties" ]] && return
  local cluster_id mode=(--standalone)
  if ((brokers > 1)); then
    mode=()
    [[ -f $cluster_data/cluster.id ]] ||
      java -cp "$lib/*" kafka.tools.StorageTool random-uuid 2>/dev/null >"$cluster_data/cluster.id"
    cluster_id=$(cat "$cluster_data/cluster.id")
  else
    cluster_id=$(java -cp "$lib/*" kafka.tools.StorageTool random-uuid)
  fi
  java -cp "$lib/*" kafka.tools.StorageTool format "${mode[@]}" -t "$cluster_id" \
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

# Launch the selected node (not waiting): prints nothing if it already runs.
launch() {
  if running; then log "already running on 127.0.0.1:$port (pid $(cat "$pidfile"))"; return 1; fi
  write_config
  format_storage
  : >"$logfile"
  # Kafka's own start scripts' JVM options (kafka-server-start.sh, kafka-run-class.sh): at 5,000
  # actions/s a 512m heap paused 4-6x as often, p99 < 100 ms in 5 of 24 runs against 10 (performance.md).
  local heap=${KAFKA_HEAP:-1g}
  local jvm=(-Xms"$heap" -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35
    -XX:+ExplicitGCInvokesConcurrent)
  # Cluster nodes restart often (the chaos tests): C1 alone and the serial collector
  # start them with less CPU on a small machine.
  if ((brokers > 1)); then heap=${KAFKA_HEAP:-384m} jvm=(-Xms128m -XX:+UseSerialGC -XX:TieredStopAtLevel=1); fi
  nohup java "${jvm[@]}" -Xmx"$heap" \
    -cp "$lib/*" kafka.Kafka "$data/server.properties" >>"$logfile" 2>&1 &
  echo $! >"$pidfile"
}

stop_node() {
  if ! running; then log "not running"; rm -f "$pidfile"; return; fi
  local pid deadline=$((SECONDS + 30))
  pid=$(cat "$pidfile")
  kill "$pid"
  while kill -0 "$pid" 2>/dev/null; do
    if ((SECONDS > deadline)); then
      # The last nodes of a cluster may wait for a quorum that has gone: kill, once.
      log "no clean stop in 30 s; killing"; kill -9 "$pid"; deadline=$((SECONDS + 3600))
    fi
    sleep 0.2
  done
  rm -f "$pidfile"
  log "stopped"
}

nodes() { if [[ -n $only_node ]]; then echo "$only_node"; else seq 1 "$brokers"; fi; }

start() {
  command -v java >/dev/null || { log "java not found: install a JDK (17+)"; exit 1; }
  fetch_jars
  local started n launched=()
  started=$(date +%s%3N)
  # A cluster's nodes start together: each waits for a quorum of controllers.
  for n in $(nodes); do select_node "$n"; if launch; then launched+=("$n"); fi; done
  for n in "${launched[@]}"; do select_node "$n"; wait_ready "$started"; done
}

stop() {
  local n
  # A cluster stops last node first (controlled shutdown needs a controller quorum).
  for n in $(nodes | sort -rn); do select_node "$n"; stop_node; done
}

status() {
  local n down=0
  for n in $(nodes); do
    select_node "$n"
    if running; then echo "running on 127.0.0.1:$port"; else echo "stopped${only_node:+ (node $n)}"; down=1; fi
  done
  return $down
}

case "$command" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  config) select_node "${only_node:-1}"; properties ;;
  *) echo "usage: $0 start|stop|status|config [--brokers N] [--node I]" >&2; exit 2 ;;
esac
