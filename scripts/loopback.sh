# Sourced by the measurement scripts (not run on its own; they cd to the repository root
# first). Nothing on loopback is fixed: other runs may share the machine.
#
# `free_ports N` prints N distinct ports on 127.0.0.1 that the kernel handed out as free
# (all bound at once, so they differ; released on exit, so a server may bind them next):
#     read -r UP NG < <(free_ports 2)
# `wait_port PORT [SECONDS]` returns once something accepts a connection on
# 127.0.0.1:PORT, and fails with a message after SECONDS (default 60), which ends a
# script under `set -e`.
free_ports() {
    python3 - "$1" <<'PY'
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}

wait_port() {
    local port=$1 secs=${2:-60} i
    for ((i = 0; i < secs * 10; i++)); do
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return 0
        sleep 0.1
    done
    echo "nothing accepted connections on 127.0.0.1:$port within ${secs}s" >&2
    return 1
}
