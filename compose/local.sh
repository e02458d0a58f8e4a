#!/usr/bin/env bash
# The compose topology without containers: the same services from local
# binaries on loopback ports, stopped together on Ctrl-C.
#
#   bash compose/local.sh
#
# tansu (a Kafka-protocol broker, SQLite storage) with the four topics,
# redis-server (append-only file), two `hermes run` replicas of one consumer
# group, `hermes gateways` (scenarios/demo.toml: free-a starts failing
# silently a minute in) and Prometheus scraping both replicas with the alert
# rules. Not here, unlike compose: a Schema Registry (Hermes runs with plain
# Avro) and Grafana.
#
# Needs tansu (`cargo install tansu --locked --features libsql`),
# redis-server and prometheus (Debian: `apt-get install redis-server
# prometheus`). Environment, all optional:
#   KAFKA_PORT (19092) REDIS_PORT (16379) HERMES_A_PORT (9464)
#   HERMES_B_PORT (9465) PROMETHEUS_PORT (9090)
#   HERMES_BIN   a hermes binary (default: cargo build --release)
#   STACK_DIR    data, configs and logs (default: a new temporary directory)
#   HERMES_CONTROL_TOKEN  the control API's token (default: generated)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

kafka_port="${KAFKA_PORT:-19092}"
redis_port="${REDIS_PORT:-16379}"
a_port="${HERMES_A_PORT:-9464}"
b_port="${HERMES_B_PORT:-9465}"
prom_port="${PROMETHEUS_PORT:-9090}"
dir="${STACK_DIR:-$(mktemp -d -t hermes-stack.XXXXXX)}"
mkdir -p "$dir"

need() {
    command -v "$1" >/dev/null || { echo "local.sh: $1 not found ($2)" >&2; exit 2; }
}
tansu="$(command -v tansu || echo "${CARGO_HOME:-$HOME/.cargo}/bin/tansu")"
[ -x "$tansu" ] || { echo "local.sh: tansu not found (cargo install tansu --locked --features libsql)" >&2; exit 2; }
need redis-server "apt-get install redis-server"
need prometheus "apt-get install prometheus"
for p in "$kafka_port" "$redis_port" "$a_port" "$b_port" "$prom_port"; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
        echo "local.sh: port $p is taken on 127.0.0.1 (see the port variables at the top of $0)" >&2
        exit 2
    fi
done
hermes="${HERMES_BIN:-}"
if [ -z "$hermes" ]; then
    echo "== building hermes (release)"
    (cd "$root" && cargo build --release --quiet --bin hermes)
    hermes="$root/target/release/hermes"
fi
export HERMES_CONTROL_TOKEN="${HERMES_CONTROL_TOKEN:-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')}"

pids=()
names=()
stop() {
    trap - INT TERM EXIT
    echo
    echo "== stopping"
    # Traffic first, then the replicas (SIGTERM: they leave the group and
    # commit), then what they depend on.
    local i
    for ((i = 0; i < ${#pids[@]}; i++)); do
        kill -TERM "${pids[$i]}" 2>/dev/null || true
        for _ in $(seq 100); do
            kill -0 "${pids[$i]}" 2>/dev/null || break
            sleep 0.2
        done
        kill -KILL "${pids[$i]}" 2>/dev/null || true
        wait "${pids[$i]}" 2>/dev/null || true
        echo "   stopped ${names[$i]}"
    done
    echo "== data and logs kept in $dir"
}
trap stop EXIT
trap 'exit 130' INT TERM

start() { # name, then the command; output to $dir/NAME.log (newest first)
    local name="$1"
    shift
    "$@" >"$dir/$name.log" 2>&1 &
    pids=("$!" "${pids[@]}")
    names=("$name" "${names[@]}")
}
wait_port() { # port, what
    for _ in $(seq 200); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.1
    done
    echo "local.sh: $2 did not listen on $1 (log: $dir/$2.log)" >&2
    exit 1
}

echo "== tansu on 127.0.0.1:$kafka_port"
# (tansu reads a sqlite:// path relative to its working directory.)
start tansu env -C "$dir" RUST_LOG=warn "$tansu" broker \
    --listener-url "tcp://127.0.0.1:$kafka_port" \
    --advertised-listener-url "tcp://127.0.0.1:$kafka_port" \
    --storage-engine "sqlite://tansu.db"
wait_port "$kafka_port" tansu
# The partition counts compose's `topics` service creates.
for t in hermes.requests:12 hermes.health:3 hermes.alerts:3 hermes.dead-letters:3; do
    "$tansu" topic create "${t%%:*}" --partitions "${t##*:}" \
        --broker "tcp://127.0.0.1:$kafka_port" >>"$dir/topics.log" 2>&1 ||
        grep -qi "exists" "$dir/topics.log"
done

echo "== redis-server on 127.0.0.1:$redis_port"
start redis redis-server --port "$redis_port" --bind 127.0.0.1 --dir "$dir" \
    --appendonly yes --save ""
wait_port "$redis_port" redis

# compose/config/hermes.toml with loopback addresses and no registry.
for r in a b; do
    port="$a_port"
    [ "$r" = b ] && port="$b_port"
    mkdir -p "$dir/hermes-$r"
    sed -e "s|^brokers = .*|brokers = \"127.0.0.1:$kafka_port\"|" \
        -e "s|^schema_registry_url = .*|# no Schema Registry here: plain Avro|" \
        -e "s|^url = \"redis://.*|url = \"redis://127.0.0.1:$redis_port/\"|" \
        -e "s|^http_listen = .*|http_listen = \"127.0.0.1:$port\"|" \
        "$root/compose/config/hermes.toml" >"$dir/hermes-$r/hermes.toml"
    echo "== hermes-$r on 127.0.0.1:$port"
    start "hermes-$r" env RUST_LOG="${RUST_LOG:-info}" \
        "$hermes" run --config "$dir/hermes-$r/hermes.toml"
    wait_port "$port" "hermes-$r"
done

echo "== gateways (scenarios/demo.toml)"
start gateways "$hermes" gateways --bootstrap "127.0.0.1:$kafka_port" \
    --redis "redis://127.0.0.1:$redis_port/" --scenario "$root/scenarios/demo.toml" \
    --seconds 0

mkdir -p "$dir/prometheus"
cp "$root/compose/prometheus/hermes-rules.yml" "$dir/prometheus/"
sed -e "s|\"hermes-a:9464\", \"hermes-b:9464\"|\"127.0.0.1:$a_port\", \"127.0.0.1:$b_port\"|" \
    "$root/compose/prometheus/prometheus.yml" >"$dir/prometheus/prometheus.yml"
echo "== prometheus on 127.0.0.1:$prom_port"
start prometheus prometheus --config.file "$dir/prometheus/prometheus.yml" \
    --storage.tsdb.path "$dir/prometheus/data" \
    --web.listen-address "127.0.0.1:$prom_port"
wait_port "$prom_port" prometheus

cat <<EOF

The stack is up (logs and data in $dir). Where to look:
  http://127.0.0.1:$a_port/status  http://127.0.0.1:$b_port/status   each replica's channels (also /metrics, /readyz)
  http://127.0.0.1:$prom_port/alerts                            Prometheus: the alert rules
  $hermes status --redis redis://127.0.0.1:$redis_port/        the published weights
  $hermes ctl --url http://127.0.0.1:$a_port --token $HERMES_CONTROL_TOKEN pin free-a --drain --for 10m --reason test
About a minute in, free-a starts failing silently: watch it go AT_RISK and
DRAINED. Ctrl-C stops everything.
EOF

# Until Ctrl-C; a service that exits is reported, the others keep running.
declare -A reported=()
while sleep 1; do
    for i in "${!pids[@]}"; do
        if [ -z "${reported[$i]:-}" ] && ! kill -0 "${pids[$i]}" 2>/dev/null; then
            echo "!! ${names[$i]} exited; its log: $dir/${names[$i]}.log" >&2
            reported[$i]=1
        fi
    done
done
