"""Amazon VPC and EC2: whether a subnet holds the addresses its instances take."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence

from moe_cdk.core.problems import Problem, problem

# Amazon VPC User Guide, "Subnet CIDR blocks": AWS reserves 5 addresses of every subnet.
SUBNET_RESERVED_ADDRESSES = 5


def usable_addresses(prefix_length: int) -> int:
    return 2 ** (32 - prefix_length) - SUBNET_RESERVED_ADDRESSES


def subnet_capacity_problem(nodes: Sequence[tuple[str, int, int]], *, prefix_length: int) -> Problem | None:
    """Why a ``/prefix_length`` subnet cannot hold ``nodes`` ((instance type, count, addresses
    each) per group), or None."""
    needed = sum(count * each for _, count, each in nodes)
    usable = usable_addresses(prefix_length)
    if needed <= usable:
        return None
    counts = ", ".join(f"{count} x {name} ({each} each)" for name, count, each in nodes)
    fits = next((p for p in range(prefix_length, 15, -1) if usable_addresses(p) >= needed), None)
    return problem(
        f"the cluster subnet is too small for the nodes' network interfaces: {counts} take {needed} "
        f"addresses, a /{prefix_length} has {usable}",
        got=prefix_length,
        allowed=f"{fits} or less (a larger subnet)" if fits else "fewer nodes: not even a /16 holds them",
    )


AVAILABILITY_ZONE = re.compile(r"^[a-z]{2}(-gov)?-[a-z]+-\d[a-z]$")


def availability_zone_problem(zone: str, region: str) -> Problem | None:
    """Why ``zone`` is not an availability-zone name of ``region``, or None."""
    if AVAILABILITY_ZONE.match(zone) and zone[:-1] == region:
        return None
    return problem("not an availability zone of the region", got=zone, allowed=f"{region}a, {region}b, ...")


def cidr_problems(vpc_cidr: str, *, public_mask: int, private_mask: int, zones: int) -> list[Problem]:
    """Problems keyed by prop for a VPC range that is malformed or too small for its subnets."""
    try:
        network = ipaddress.IPv4Network(vpc_cidr)
    except ValueError:
        return [problem("not an IPv4 CIDR block", got=vpc_cidr, allowed="e.g. 10.0.0.0/16").at("vpc_cidr")]
    found = []
    # Amazon VPC User Guide, "VPC CIDR blocks": IPv4 blocks are /16 to /28.
    if not 16 <= network.prefixlen <= 28:
        found.append(problem("prefix length out of range", got=vpc_cidr, allowed="/16 to /28").at("vpc_cidr"))
    for key, mask in (("public_subnet_cidr_mask", public_mask), ("private_subnet_cidr_mask", private_mask)):
        if not network.prefixlen < mask <= 28:
            found.append(problem("out of range", got=mask, allowed=f"{network.prefixlen + 1} to 28").at(key))
    if not found:
        needed = zones * (2 ** (32 - public_mask) + 2 ** (32 - private_mask))
        if needed > network.num_addresses:
            found.append(
                problem(
                    f"too small for {zones} zone(s) of one /{public_mask} public and one /{private_mask} private "
                    f"subnet",
                    got=vpc_cidr,
                    allowed=f"at least {needed} addresses",
                ).at("vpc_cidr")
            )
    return found
