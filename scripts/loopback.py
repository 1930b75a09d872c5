"""Loopback helpers for the Python measurement scripts (scripts/soak, scripts/flood-memory),
the same two that scripts/loopback.sh gives the shell ones. Nothing on loopback is fixed:
other runs may share the machine."""

import socket
import time


def free_ports(n):
    """N distinct ports on 127.0.0.1 the kernel handed out as free (all bound at once, so
    they differ; released on return, so a server may bind them next)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def wait_port(port, timeout=20.0):
    """Return once something accepts a connection on 127.0.0.1:PORT; end the script with a
    message after TIMEOUT seconds."""
    end = time.time() + timeout
    while time.time() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing accepted connections on 127.0.0.1:{port} within {timeout}s")
