"""The fabric checks moe-preflight runs: a node's devices, nccl-tests, and the torch collectives."""
