#!/usr/bin/env bash
# parallelcluster_entry.sh BUNDLE_S3_URI REGION INSTANCE_GROUP: ParallelCluster's OnNodeConfigured action
# (and the head node's OnNodeUpdated), run as root on each node once ParallelCluster has configured it.
#
# ParallelCluster downloads only this script and passes it the action's Args (ParallelCluster User Guide,
# "Custom bootstrap actions"), which constructs/parallelcluster_cluster.py sets: the lifecycle bundle this
# script fetches with the node's role (the nodes' policy allows reading exactly that object), the Region,
# and the node's instance group, which on_create.sh is told rather than finding it in a file of
# ParallelCluster's. A second run (an update) replaces the unpacked folder and runs the steps again; each
# step is idempotent.
#
# Environment (optional; the tests use them): MOE_LC_TARGET, where the bundle is unpacked
# (default /opt/moe-cdk/lifecycle).
set -euo pipefail

log() {
  local ts
  TZ=UTC printf -v ts '%(%Y-%m-%dT%H:%M:%SZ)T' -1
  printf '%s [parallelcluster_entry] %s\n' "${ts}" "$*"
}

staging=""

main() {
  if (($# != 3)) || [[ "$1" != s3://* ]]; then
    log "ERROR: usage: parallelcluster_entry.sh BUNDLE_S3_URI REGION INSTANCE_GROUP (got: $*)"
    return 2
  fi
  local bundle="$1" region="$2" group="$3"
  local target="${MOE_LC_TARGET:-/opt/moe-cdk/lifecycle}"
  staging="$(mktemp -d "${TMPDIR:-/tmp}/moe-cdk-bundle.XXXXXX")"
  trap 'rm -rf -- "${staging}"' EXIT
  log "fetching ${bundle} for instance group ${group}"
  aws s3 cp --only-show-errors --region "${region}" "${bundle}" "${staging}/bundle.zip"
  python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' \
    "${staging}/bundle.zip" "${staging}/lifecycle"
  rm -rf -- "${target}"
  mkdir -p -- "$(dirname -- "${target}")"
  mv -- "${staging}/lifecycle" "${target}"
  bash "${target}/on_create.sh" --group "${group}"
}

main "$@"
