#!/usr/bin/env bash
# mount_fsx.sh: mount the cluster's FSx for Lustre file system and record it in /etc/fstab.
#
# The DNS name and mount name are only known at deploy time, so provisioning_parameters.json
# names two SSM parameters that CloudFormation fills; they are read here with the AWS CLI.
# Idempotent: an existing mount is left alone, and /etc/fstab keeps exactly one line for the
# mount point. Skips (successfully) when fsx_lustre is null.
#
# Paths on the command line carry ${MOE_LC_ROOT} (so tests can run in a sandbox); the fstab
# line names the mount point as the node sees it (no prefix).
set -euo pipefail

MOE_LC_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "${MOE_LC_DIR}/lib.sh"

readonly LUSTRE_OPTIONS="noatime,flock,_netdev"

# ssm_get VARIABLE PARAMETER_NAME: the parameter's value into VARIABLE (a global).
ssm_get() {
  local variable="$1" name="$2" value
  value="$(aws ssm get-parameter --name "${name}" --query Parameter.Value --output text --region "${MOE_REGION}")" || return
  if [[ -z "${value}" || "${value}" == "None" ]]; then
    log "SSM parameter ${name} is empty"
    return 1
  fi
  printf -v "${variable}" '%s' "${value}"
}

load_lustre_module() {
  if [[ -d "${MOE_LC_ROOT}/sys/module/lustre" ]]; then
    return 0
  fi
  if modprobe lustre; then
    log "loaded the lustre kernel module"
  else
    warn "modprobe lustre failed; continuing in case the Lustre client is built into the kernel"
  fi
}

# ensure_fstab_line LINE MOUNT_POINT: LINE becomes the only fstab entry for MOUNT_POINT.
ensure_fstab_line() {
  local line="$1" mount_point="$2" fstab="${MOE_LC_ROOT}/etc/fstab" tmp
  mkdir -p -- "$(dirname -- "${fstab}")"
  touch -- "${fstab}"
  if grep -qxF -- "${line}" "${fstab}" \
    && [[ "$(awk -v mp="${mount_point}" '$1 !~ /^#/ && $2 == mp' "${fstab}" | wc -l)" -eq 1 ]]; then
    log "${fstab} already has: ${line}"
    return 0
  fi
  tmp="$(mktemp "${fstab}.moe-cdk.XXXXXX")"
  awk -v mp="${mount_point}" '$1 ~ /^#/ || $2 != mp' "${fstab}" >"${tmp}"
  printf '%s\n' "${line}" >>"${tmp}"
  chmod 644 -- "${tmp}"
  mv -f -- "${tmp}" "${fstab}"
  log "${fstab}: ${line}"
}

main() {
  install_err_trap
  load_params
  if [[ "${MOE_FSX_ENABLED}" != "true" ]]; then
    log "fsx_lustre is null in provisioning_parameters.json; no FSx for Lustre to mount, skipping"
    return 0
  fi
  local mount_point="${MOE_FSX_MOUNT_POINT}" target="${MOE_LC_ROOT}${MOE_FSX_MOUNT_POINT}"
  if mountpoint -q "${target}"; then
    log "${mount_point} is already mounted; nothing to do"
    return 0
  fi

  FSX_DNS_NAME=""
  FSX_MOUNT_NAME=""
  retry 5 2 ssm_get FSX_DNS_NAME "${MOE_FSX_DNS_NAME_PARAMETER}"
  retry 5 2 ssm_get FSX_MOUNT_NAME "${MOE_FSX_MOUNT_NAME_PARAMETER}"
  if [[ ! "${FSX_DNS_NAME}" =~ ^[A-Za-z0-9.-]+$ ]]; then
    die "fsx dns name: invalid (got '${FSX_DNS_NAME}' from ${MOE_FSX_DNS_NAME_PARAMETER}; allowed a DNS name)"
  fi
  if [[ ! "${FSX_MOUNT_NAME}" =~ ^[A-Za-z0-9_]+$ ]]; then
    die "fsx mount name: invalid (got '${FSX_MOUNT_NAME}' from ${MOE_FSX_MOUNT_NAME_PARAMETER}; allowed letters and digits)"
  fi
  local device="${FSX_DNS_NAME}@tcp:/${FSX_MOUNT_NAME}"
  log "mounting ${device} at ${mount_point}"

  load_lustre_module
  mkdir -p -- "${target}"
  retry 5 5 mount -t lustre -o "${LUSTRE_OPTIONS}" "${device}" "${target}"
  log "mounted ${device} at ${mount_point}"
  ensure_fstab_line "${device} ${mount_point} lustre ${LUSTRE_OPTIONS} 0 0" "${mount_point}"
}

main "$@"
