# Sourced by .ci/consumers/<job>/run: a fresh venv from the job's lock, our master (and store
# service) on free local ports, and a trap that stops every process the job started and fails the
# job on a /dev/shm segment left behind. A job sets JOB_DIR before sourcing this.
set -euo pipefail
ROOT=$(cd "$JOB_DIR/../../.." && pwd)
unset PYTHONPATH PYTHONHOME PYTHONUSERBASE VIRTUAL_ENV
export PYTHONNOUSERSITE=1 PIP_REQUIRE_VIRTUALENV=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# Our own settings read MOONCAKE_* variables: none from the caller may leak into the daemons.
for name in $(compgen -e | grep '^MOONCAKE_' || true); do unset "$name"; done

VENV="$JOB_DIR/.venv"
SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/mooncake-consumer.XXXXXX")
# The consumers' own processes (drivers, engines through compat/) resolve our settings too: with
# no workdir of their own they would read ~/.mooncake, whose secret (left by any `mooncake up` on
# this machine) authenticates them to a master that runs without one, and no call gets an answer.
export MOONCAKE_WORKDIR="$SCRATCH/consumer"
STARTED=()            # pids of the daemons this job started (each its own process group)
SHM_BEFORE="$SCRATCH/shm-before"
ls /dev/shm > "$SHM_BEFORE" 2>/dev/null || true

cleanup() {
    local rc=$? pid leaked=0 name owner
    for pid in "${STARTED[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
    for pid in "${STARTED[@]}"; do
        for _ in $(seq 50); do  # gone, or a zombie (it exited; only its status is left)
            case $(ps -o stat= -p "$pid" 2>/dev/null) in ""|Z*) break;; esac
            sleep 0.2
        done
        kill -KILL -- "-$pid" 2>/dev/null || true
    done
    # Segments are /dev/shm/mooncake-<cluster>-<pid>-...: one made during this job whose process
    # is gone was leaked by it. Under CI=true nothing else runs, so it is removed and fails the
    # job; elsewhere (a shared machine) it may be another run's, so it is only named.
    for name in $(ls /dev/shm 2>/dev/null | grep '^mooncake-' || true); do
        grep -qx "$name" "$SHM_BEFORE" && continue
        owner=$(echo "$name" | cut -d- -f3)
        kill -0 "$owner" 2>/dev/null && continue
        if [ "${CI:-}" = true ]; then
            echo "leaked shared memory: /dev/shm/$name (removed)" >&2
            rm -f "/dev/shm/$name"; leaked=1
        else
            echo "note: /dev/shm/$name appeared during this job and its process is gone" >&2
        fi
    done
    rm -rf "$SCRATCH"
    if [ "$rc" -eq 0 ] && [ "$leaked" -ne 0 ]; then rc=1; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

make_venv() {  # the lock, then this project and compat on top, neither pulling anything else
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --no-deps -r "$JOB_DIR/lock.txt"
    "$VENV/bin/pip" install -q --no-deps -e "$ROOT" -e "$ROOT/compat"
    export PATH="$VENV/bin:$PATH"
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

start_daemon() {  # start_daemon LOG CMD...: in its own session, so the trap ends all of it
    local log=$1; shift
    setsid "$@" > "$log" 2>&1 < /dev/null &
    STARTED+=("$!")
}

wait_port() {  # wait_port PORT WHAT: up to 60 s
    for _ in $(seq 300); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.2
    done
    echo "$2 did not listen on port $1 within 60 s" >&2
    return 1
}

start_master() {  # the official CI's master line, on free ports; sets MASTER and METADATA
    local rpc http
    rpc=$(free_port); http=$(free_port)
    start_daemon "$SCRATCH/master.log" env MOONCAKE_WORKDIR="$SCRATCH/cluster" \
        mooncake_master --rpc_port="$rpc" --default_kv_lease_ttl=500 \
        --enable_http_metadata_server=true --http_metadata_server_port="$http" --metrics_port="$(free_port)"
    wait_port "$rpc" mooncake_master || { cat "$SCRATCH/master.log" >&2; return 1; }
    wait_port "$http" "mooncake_master's HTTP metadata server" || { cat "$SCRATCH/master.log" >&2; return 1; }
    MASTER="127.0.0.1:$rpc"
    METADATA="http://127.0.0.1:$http/metadata"
}
