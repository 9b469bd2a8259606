"""FSx for Lustre: which clients an EFA-enabled file system serves over EFA, and how many."""

from __future__ import annotations

from moe_cdk.training.schema import problem

# FSx for Lustre User Guide, "Configuring EFA clients": the EFA interfaces a client sets up
# by default, and "Each FSx for Lustre file system has a maximum limit of 1024 EFA connections
# across all client instances" (one per configured interface). "Working with EFA-enabled file
# systems": clients are Nitro v4 or newer EFA instances, "excluding the trn2 instance family".
# Of the catalog's types only these families appear in the guide's table; the others (p4de,
# trn2, m5) reach an EFA-enabled file system over TCP.
EFA_CLIENT_INTERFACES = {"p5": 8, "p5e": 8, "p5en": 8, "p6-b200": 8, "p6e-gb200": 8, "p6-b300": 16}
MAX_EFA_CONNECTIONS = 1024


def efa_client_interfaces(instance_type: str) -> int:
    """EFA interfaces a node of ``instance_type`` (EC2 or ``ml.`` name) uses to an EFA-enabled
    file system by default; 0 when it is not an EFA client."""
    return EFA_CLIENT_INTERFACES.get(instance_type.removeprefix("ml.").split(".")[0], 0)


def efa_client_problems(clients: dict[str, int]) -> list[str]:
    """For an EFA-enabled file system and its clients (instance type -> node count): why it would
    not serve them over EFA, or exceed the file system's EFA connections."""
    if not any(efa_client_interfaces(t) for t in clients):
        return [problem("no compute node can use EFA to the file system: FSx EFA clients are Nitro v4 "
                        "EFA instances other than trn2 (FSx for Lustre User Guide)", got=sorted(clients),
                        allowed="compute groups of " + ", ".join(f"ml.{f}.*" for f in EFA_CLIENT_INTERFACES)
                        + ", or efa_enabled: false")]
    connections = sum(efa_client_interfaces(t) * n for t, n in clients.items())
    if connections > MAX_EFA_CONNECTIONS:
        return [problem("more EFA connections than one file system accepts", got=connections,
                        allowed=f"at most {MAX_EFA_CONNECTIONS} (8 per P5-family node by default)")]
    return []
