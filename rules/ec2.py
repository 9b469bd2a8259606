"""Amazon VPC and EC2: whether a subnet holds the addresses its instances take."""

from __future__ import annotations

from collections.abc import Sequence

from moe_cdk.training.schema import problem

# Amazon VPC User Guide, "Subnet CIDR blocks": AWS reserves 5 addresses of every subnet.
SUBNET_RESERVED_ADDRESSES = 5


def usable_addresses(prefix_length: int) -> int:
    return 2 ** (32 - prefix_length) - SUBNET_RESERVED_ADDRESSES


def subnet_capacity_problem(nodes: Sequence[tuple[str, int, int]], *, prefix_length: int) -> str | None:
    """Why a ``/prefix_length`` subnet cannot hold ``nodes`` ((instance type, count, addresses
    each) per group), or None."""
    needed = sum(count * each for _, count, each in nodes)
    usable = usable_addresses(prefix_length)
    if needed <= usable:
        return None
    counts = ", ".join(f"{count} x {name} ({each} each)" for name, count, each in nodes)
    fits = next((p for p in range(prefix_length, 15, -1) if usable_addresses(p) >= needed), None)
    return problem(f"the cluster subnet is too small for the nodes' network interfaces: {counts} take {needed} "
                   f"addresses, a /{prefix_length} has {usable}", got=prefix_length,
                   allowed=f"{fits} or less (a larger subnet)" if fits else "fewer nodes: not even a /16 holds them")
