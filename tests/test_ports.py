"""tests/ports.py: the ports the Slurm, Prometheus and torchrun tests listen on."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from ports import free_port, reserve_ports


def test_ports_are_drawn_below_the_kernels_ephemeral_range():
    # where no outgoing connection and no bind to port 0 is ever given one
    ephemeral_start = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    held = reserve_ports(20)
    try:
        assert all(s.getsockname()[1] < ephemeral_start for s in held)
        assert len({s.getsockname()[1] for s in held}) == 20
    finally:
        for s in held:
            s.close()
    assert free_port() < ephemeral_start


def test_a_reserved_port_cannot_be_taken_until_it_is_released():
    [held] = reserve_ports(1)
    port = held.getsockname()[1]
    with socket.socket() as other:
        with pytest.raises(OSError):
            other.bind(("127.0.0.1", port))
    held.close()
    with socket.socket() as other:
        other.bind(("127.0.0.1", port))
