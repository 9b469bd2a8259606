#!/usr/bin/env bash
# shellcheck shell=sh
# efa_env.sh: the EFA / NCCL environment for jobs on this cluster. Sourced, never executed.
#
# on_create.sh installs this file as /etc/profile.d/moe-cdk-efa.sh, so login shells get it;
# batch scripts can `. /etc/profile.d/moe-cdk-efa.sh` explicitly. /etc/profile sources
# profile.d with /bin/sh too, so this file is plain POSIX sh and sets no shell options
# (no `set -euo pipefail`: that would change every user's login shell).
#
# Source: AWS's EFA cheatsheet (aws-samples/awsome-distributed-training,
# 1.architectures/efa-cheatsheet.md at 7217859), whose table gives each variable below.
# Written for aws-ofi-nccl >= 1.7 with libfabric >= 1.18 (what HyperPod's AMI ships). Those
# versions pick the EFA provider and GPUDirect RDMA by themselves, so these obsolete settings
# are deliberately NOT set here:
#   FI_PROVIDER=efa            the plugin selects the efa provider itself
#   FI_EFA_USE_DEVICE_RDMA=1   libfabric >= 1.18 enables device RDMA where the hardware has it
#   NCCL_PROTO=simple          needed only by old plugins; it costs bandwidth with current ones
# RDMAV_* (e.g. RDMAV_FORK_SAFE) is left unset too: rdma-core and libfabric handle fork
# safety themselves on current kernels.

# Huge pages for EFA bounce buffers make fork() (PyTorch data-loader workers) fail with ENOMEM.
export FI_EFA_USE_HUGE_PAGE=0
# Keep NCCL's bootstrap and socket traffic off container bridges, loopback and veth pairs.
export NCCL_SOCKET_IFNAME='^docker,lo,veth'
# Quiet by default; a job can still ask for NCCL_DEBUG=INFO.
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
