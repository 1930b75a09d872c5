# Sourced by the measurement scripts (not run on its own; they cd to the repository root
# first): `wait_port PORT [SECONDS]` returns once something accepts a connection on
# 127.0.0.1:PORT, and fails with a message after SECONDS (default 60), which ends a
# script under `set -e`.
wait_port() {
    local port=$1 secs=${2:-60} i
    for ((i = 0; i < secs * 10; i++)); do
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return 0
        sleep 0.1
    done
    echo "nothing accepted connections on 127.0.0.1:$port within ${secs}s" >&2
    return 1
}
