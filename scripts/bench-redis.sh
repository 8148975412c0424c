#!/usr/bin/env bash
# Redis with and without PMNet, side by side, in one run: redis-benchmark -t set,get with 1 and
# 50 clients and 64 and 1024-byte values against
#   always      redis-server, appendonly yes, appendfsync always (each reply after fsync)
#   pmnet       the same Redis, with the PMNet module loaded, behind pmnet gateway -> pmnet
#               device -> the module inside redis-server (SET answered when the device
#               logged it; GET answered by Redis)
#   pmnet-adaptor  the same again with the adaptor (pmnet redis-adaptor, a process of its own
#               speaking RESP to Redis) as the server side, as for a Redis without modules
#   everysec    redis-server, appendfsync everysec (WEAKER: up to ~1 s lost at a power loss)
#   no          redis-server, appendfsync no (WEAKER: the kernel decides when to write back)
# and prints one table: requests/s, p50 and p99 (ms), and PMNet / always ratios.
#
#   scripts/bench-redis.sh                    everything (a few minutes)
#   PMNET_BENCH_REQUESTS=N ...                requests per run with 1 client (default 20000;
#                                             10x that with 50 clients)
#   PMNET_BENCH_BUSY=1 ...                    `pmnet redis-up --busy-poll` (gateway and device spin)
#   PMNET_BENCH_SPIN_US=N ...                 `pmnet redis-up --spin-us N` (default: redis-up's own)
#   PMNET_BENCH_PLACEMENT=user|split ...      user (the default): nothing is pinned but what
#                                             `pmnet redis-up` places itself, as a user runs it;
#                                             split: also redis-benchmark on CPU 0 and every
#                                             redis-server on CPU 1, as separate hosts would be
#
# PMNet is started the way docs/redis.md tells a user: `pmnet redis-up --redis ADDR` (device
# and gateway, with its own CPU placement, --cpu auto; the module it finds loaded in that
# Redis, or with `--server-side adaptor` the adaptor).
#   PMNET_BENCH_CLIENTS="1 50" PMNET_BENCH_SIZES="64 1024"   the grid
#   PMNET_BENCH_DIR=DIR ...                   where the append-only files go (default: a new
#                                             directory under /var/tmp, on disk)
#   PMNET_BENCH_CACHE=1 ...                   also `get-hot`: GETs of one hot key (redis-benchmark
#                                             -t get without -r) against always, pmnet and
#                                             pmnet-cache (`pmnet redis-up --cache`: the device
#                                             answers the key's GETs; measured after its 12 s
#                                             fetch warm-up and a warm-up run)
#
# Needs redis-server and redis-benchmark (apt-get install redis-server redis-tools). The
# device log is in /dev/shm: emulated persistent memory (survives a process crash, not a power
# loss), as in the rest of pmnet's benchmarks; say so when quoting the figures.
set -euo pipefail
cd "$(dirname "$0")/.."

requests="${PMNET_BENCH_REQUESTS:-20000}"
placement="${PMNET_BENCH_PLACEMENT:-user}"
busy="${PMNET_BENCH_BUSY:-0}"
cache="${PMNET_BENCH_CACHE:-0}"
base="${PMNET_BENCH_DIR:-}"
clients_list="${PMNET_BENCH_CLIENTS:-1 50}"
sizes_list="${PMNET_BENCH_SIZES:-64 1024}"
client_cpu=""
backend_cpu=""
if [ "$placement" = split ] && [ "$(nproc)" -ge 2 ]; then
    client_cpu=0
    backend_cpu=1
fi
# on_cpu CPU COMMAND...: run COMMAND pinned to CPU, or as it is when CPU is empty. It replaces
# the (sub)shell it runs in, so that `on_cpu ... &` leaves in $! the command's own pid, which
# cleanup can kill; call it only in the background or in a pipeline.
on_cpu() {
    local cpu="$1"
    shift
    if [ -n "$cpu" ]; then exec taskset -c "$cpu" "$@"; else exec "$@"; fi
}
if [ -z "$base" ]; then
    base="$(mktemp -d /var/tmp/pmnet-bench-redis.XXXXXX)"
fi
mkdir -p "$base"

cargo build --release -q -p pmnet
pmnet="$PWD/target/release/pmnet"

pids=()
cleanup() {
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    wait 2>/dev/null || true
    rm -rf "$base" "/dev/shm/pmnet-bench-redis-$$.log" "/dev/shm/pmnet-bench-redis-$$-adaptor.log"
}
trap cleanup EXIT

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

declare -A redis_pid
# start_redis NAME FSYNC [ARG...]: starts it (with these further arguments) and sets $port (its
# pid in redis_pid[NAME])
start_redis() {
    local name="$1" fsync="$2" dir
    shift 2
    port="$(free_port)"
    dir="$base/redis-$name"
    mkdir -p "$dir"
    on_cpu "$backend_cpu" redis-server --port "$port" --bind 127.0.0.1 --dir "$dir" --appendonly yes \
        --appendfsync "$fsync" --save '' --daemonize no --logfile "$dir/redis.log" "$@" \
        </dev/null >/dev/null 2>&1 &
    pids+=($!)
    redis_pid[$name]=$!
    for _ in $(seq 1 200); do
        if [ "$(redis-cli -p "$port" ping 2>/dev/null)" = "PONG" ]; then
            return
        fi
        sleep 0.05
    done
    echo "redis-server $name did not start; see $dir/redis.log" >&2
    exit 1
}

# wait_line FILE PATTERN: until the process's banner says it listens
wait_line() {
    for _ in $(seq 1 400); do
        if grep -q "$2" "$1" 2>/dev/null; then
            return
        fi
        sleep 0.05
    done
    echo "no '$2' in $1:" >&2
    cat "$1" >&2
    exit 1
}

adaptor_port="$(free_port)"
device_port="$(free_port)"
gateway_port="$(free_port)"
module="$PWD/target/release/deps/libpmnet_redis_module.so"
start_redis always always
always_port="$port"
start_redis pmnet always --loadmodule "$module" listen "127.0.0.1:$adaptor_port" device "127.0.0.1:$device_port"
pmnet_redis_port="$port"
start_redis pmnet-adaptor always
pmnet_adaptor_redis_port="$port"
adaptor2_port="$(free_port)"
start_redis everysec everysec
everysec_port="$port"
start_redis no no
no_port="$port"

busy_flags=()
if [ "$busy" = 1 ]; then busy_flags=(--busy-poll); fi
if [ -n "${PMNET_BENCH_SPIN_US:-}" ]; then busy_flags+=(--spin-us "$PMNET_BENCH_SPIN_US"); fi
# PMNet runs only while it is measured, so that an idle (or, with --busy-poll, spinning)
# gateway and device take nothing from Redis alone. start_pmnet [adaptor] [ARG...] fills
# part_pid: the gateway's, the device's (and the adaptor's) pids, whose CPU time each PMNet
# request costs; the module's is Redis's own.
declare -A part_pid
start_pmnet() {
    local redis_port="$pmnet_redis_port" server_port="$adaptor_port" log="/dev/shm/pmnet-bench-redis-$$.log"
    if [ "${1:-}" = adaptor ]; then
        shift
        redis_port="$pmnet_adaptor_redis_port"
        server_port="$adaptor2_port"
        log="/dev/shm/pmnet-bench-redis-$$-adaptor.log"
        set -- --server-side adaptor "$@"
    fi
    "$pmnet" redis-up --redis "127.0.0.1:$redis_port" --listen "127.0.0.1:$gateway_port" \
        --device-listen "127.0.0.1:$device_port" --adaptor-listen "127.0.0.1:$server_port" \
        --log-file "$log" "${busy_flags[@]}" "$@" </dev/null >"$base/redis-up.out" 2>&1 &
    redis_up_pid=$!
    pids+=("$redis_up_pid")
    wait_line "$base/redis-up.out" "clients connect to"
    part_pid=()
    for child in $(pgrep -P "$redis_up_pid"); do
        part_pid[$(tr '\0' ' ' <"/proc/$child/cmdline" | awk '{print $2}')]=$child
    done
}
stop_pmnet() {
    kill "$redis_up_pid" 2>/dev/null || true
    wait "$redis_up_pid" 2>/dev/null || true
}
start_pmnet

echo "machine: $(nproc) vCPUs; $(uptime | sed 's/.*load average/load average/')"
echo "append-only files under $base ($(df -P "$base" | awk 'NR==2 {print $1}'))"
echo "placement: $placement; pmnet redis-up${busy_flags[*]:+ ${busy_flags[*]}}; redis-servers: CPU ${backend_cpu:-unpinned}; redis-benchmark: CPU ${client_cpu:-unpinned}"
grep -h "server side:" "$base/redis-up.out" | sed 's/^ */  pmnet redis-up /'
grep -h "placement (" "$base/redis-up.out" | sed 's/^ */  pmnet redis-up /'
grep -h "medium:" "$base/redis-up.out" | sed 's/^ */  /'
echo
stop_pmnet

# cpu_ticks PID: user + system CPU time of the process (all its threads), in clock ticks.
cpu_ticks() {
    awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$1/stat" 2>/dev/null || echo 0
}
tick_hz="$(getconf CLK_TCK)"
# part_ticks TARGET PART: cpu_ticks of the target's redis-server or of a PMNet part.
part_ticks() {
    if [ "$2" = redis ]; then cpu_ticks "${redis_pid[$1]}"; else cpu_ticks "${part_pid[$2]:-0}"; fi
}

results="$base/results.csv"
: >"$results"
# run TARGET PORT CLIENTS SIZE: SET, then GET, each with the CPU µs per request of the target's
# processes (10 ms clock ticks: with 20 000 requests, a resolution of 0.5 µs per request).
run() {
    local target="$1" port="$2" clients="$3" size="$4" n="$requests" test parts part cpu
    if [ "$clients" -gt 1 ]; then n=$((requests * 10)); fi
    case "$target" in
        pmnet) parts="redis gateway device" ;;
        pmnet-adaptor) parts="redis gateway device redis-adaptor" ;;
        *) parts=redis ;;
    esac
    for test in set get; do
        declare -A before=()
        for part in $parts; do
            before[$part]=$(part_ticks "$target" "$part")
        done
        on_cpu "$client_cpu" redis-benchmark -p "$port" -t "$test" -n "$n" -c "$clients" -d "$size" -r 100000 --csv 2>/dev/null |
            awk -F'"' -v t="$target" -v c="$clients" -v d="$size" \
                'NR > 1 && NF > 10 { printf "%s,%s,%s,%s,%s,%s,%s,", t, $2, c, d, $4, $10, $14 }' >>"$results"
        cpu=""
        for part in $parts; do
            cpu="$cpu${cpu:+ }${part#redis-}=$(awk -v a="${before[$part]}" -v b="$(part_ticks "$target" "$part")" -v hz="$tick_hz" -v n="$n" \
                'BEGIN { printf "%.1f", (b - a) * 1e6 / hz / n }')"
        done
        echo "$cpu" >>"$results"
    done
}

for clients in $clients_list; do
    for size in $sizes_list; do
        run always "$always_port" "$clients" "$size"
        start_pmnet
        run pmnet "$gateway_port" "$clients" "$size"
        stop_pmnet
        start_pmnet adaptor
        run pmnet-adaptor "$gateway_port" "$clients" "$size"
        stop_pmnet
        run everysec "$everysec_port" "$clients" "$size"
        run no "$no_port" "$clients" "$size"
    done
done

# run_hot TARGET PORT CLIENTS SIZE: GETs of one key (redis-benchmark's `key:__rand_int__`
# without -r), set first; recorded as test `get-hot`.
run_hot() {
    local target="$1" port="$2" clients="$3" size="$4" n="$requests"
    if [ "$clients" -gt 1 ]; then n=$((requests * 10)); fi
    redis-benchmark -p "$port" -t set -n 1 -c 1 -d "$size" >/dev/null 2>&1
    on_cpu "$client_cpu" redis-benchmark -p "$port" -t get -n "$n" -c "$clients" -d "$size" --csv 2>/dev/null |
        awk -F'"' -v t="$target" -v c="$clients" -v d="$size" \
            'NR > 1 && NF > 10 { printf "%s,get-hot,%s,%s,%s,%s,%s,\n", t, c, d, $4, $10, $14 }' >>"$results"
}
if [ "$cache" = 1 ]; then
    for clients in $clients_list; do
        for size in $sizes_list; do
            run_hot always "$always_port" "$clients" "$size"
            start_pmnet
            run_hot pmnet "$gateway_port" "$clients" "$size"
            stop_pmnet
            start_pmnet --cache
            # The device fetches nothing in its first 12 s (a read sent to an earlier
            # incarnation could still be answered); then the key is hot at once.
            redis-benchmark -p "$gateway_port" -t set -n 1 -c 1 -d "$size" >/dev/null 2>&1
            sleep 13
            redis-benchmark -p "$gateway_port" -t get -n 2000 -c 1 -d "$size" >/dev/null 2>&1
            run_hot pmnet-cache "$gateway_port" "$clients" "$size"
            stop_pmnet
        done
    done
fi

echo "load after the runs: $(uptime | sed 's/.*load average/load average/')"
echo
awk -F, '
    { key = $2 "," $3 "," $4; rps[$1 "," key] = $5; p50[$1 "," key] = $6; p99[$1 "," key] = $7;
      cpu[$1 "," key] = $8;
      if (!(key in seen)) { seen[key] = 1; order[++count] = key } }
    END {
        printf "%-4s %7s %5s | %-13s %9s %7s %7s | %-19s | %s\n", "test", "clients", "bytes",
            "target", "req/s", "p50 ms", "p99 ms", "vs always: req/s p99", "CPU us per request"
        for (i = 1; i <= count; i++) {
            split(order[i], part, ",")
            n = split("always pmnet pmnet-adaptor pmnet-cache everysec no", targets, " ")
            for (j = 1; j <= n; j++) {
                t = targets[j]; k = t "," order[i]
                if (!(k in rps)) continue
                base_rps = rps["always," order[i]]; base_p99 = p99["always," order[i]]
                ratio = (t == "always") ? "" : sprintf("%6.2fx  %6.2fx", rps[k] / base_rps, p99[k] / base_p99)
                note = (t == "everysec" || t == "no") ? " (weaker)" : ""
                printf "%-4s %7s %5s | %-13s %9.0f %7.3f %7.3f | %-19s | %s%s\n", part[1], part[2], part[3],
                    t, rps[k], p50[k], p99[k], ratio, cpu[k], note
            }
        }
    }' "$results"
