"""Free loopback ports for a test's servers, Slurm daemons or torchrun rendezvous (a library,
not a test file).

Ports are drawn at random below the kernel's ephemeral range (net.ipv4.ip_local_port_range,
32768-60999 here), where neither an outgoing connection nor a bind to port 0 is ever given one.
A port the kernel chose for a bind to port 0 was taken once by something else before the daemon
it was meant for started (a Slurm cluster started 60 s late, under 4 xdist workers:
"Unable to bind listen port (41359): Address already in use"). Each port is checked by binding
it on every address; ``reserve_ports`` keeps those sockets open until the caller is about to
start what listens there, so no other test, in this process or another, can take it meanwhile."""

from __future__ import annotations

import random
import socket
from pathlib import Path

_LOWEST = 10000  # above the ports services are registered on (Slurm's 6817-6819, MariaDB's 3306)


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def reserve_ports(count: int) -> list[socket.socket]:
    """``count`` distinct ports, each held by a socket bound to it on every address; close a
    socket just before starting what listens on its port (``getsockname()[1]``)."""
    rng, high = random.SystemRandom(), _ephemeral_start() - 1
    held: list[socket.socket] = []
    while len(held) < count:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind(("", rng.randint(_LOWEST, high)))
        except OSError:  # taken
            s.close()
            continue
        held.append(s)
    return held


def free_port() -> int:
    """A port that was free a moment ago, for a server started right after."""
    [s] = reserve_ports(1)
    with s:
        return s.getsockname()[1]
