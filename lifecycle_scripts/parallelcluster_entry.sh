#!/usr/bin/env bash
# parallelcluster_entry.sh BUNDLE REGION INSTANCE_GROUP: ParallelCluster's custom action on every node, run as root
# once ParallelCluster has configured the node (OnNodeConfigured), and again on the head and login nodes after each
# update (OnNodeUpdated).
#
# ParallelCluster downloads only this script and passes it the action's Args (ParallelCluster User Guide,
# "Custom bootstrap actions"), which constructs/parallelcluster_cluster.py sets: the lifecycle bundle, the Region and
# the node's instance group, which on_create.sh is told rather than finding it in a file of ParallelCluster's.
# BUNDLE is the bundle's s3:// URI, or the name of the SSM parameter that holds it (starting with /): the head and
# login nodes' OnNodeConfigured names the parameter, because ParallelCluster refuses to update those actions, while
# the bundle's key changes with every change of a script. The node's role reads the parameter and the bundle. A
# second run replaces the unpacked folder and runs the steps again; each step is idempotent.
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
  if (($# != 3)) || [[ "$1" != s3://* && "$1" != /* ]]; then
    log "ERROR: usage: parallelcluster_entry.sh BUNDLE_S3_URI_OR_SSM_PARAMETER REGION INSTANCE_GROUP (got: $*)"
    return 2
  fi
  local bundle="$1" region="$2" group="$3"
  local target="${MOE_LC_TARGET:-/opt/moe-cdk/lifecycle}"
  if [[ "${bundle}" == /* ]]; then
    bundle="$(aws ssm get-parameter --region "${region}" --name "${bundle}" --query Parameter.Value --output text)"
    log "the bundle, from SSM parameter $1: ${bundle}"
  fi
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
