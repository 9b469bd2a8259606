"""A free loopback port for a test's server or torchrun rendezvous (a library, not a test file).

The kernel picks it, so tests running side by side under pytest-xdist do not collide the way
ports drawn from fixed ranges can."""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
