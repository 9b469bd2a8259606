#!/usr/bin/env bash
# mount_fsx.sh: mount the cluster's FSx for Lustre file system and record it in /etc/fstab.
#
# The DNS name and mount name are only known at deploy time, so provisioning_parameters.json
# names two SSM parameters that CloudFormation fills; they are read here with the AWS CLI.
# Idempotent: an existing mount is left alone, and /etc/fstab keeps exactly one line for the
# mount point. Skips (successfully) when fsx_lustre is null.
#
# Source: AWS's reference mount_fsx.sh (aws-samples/awsome-distributed-training,
# 1.architectures/5.sagemaker-hyperpod/LifecycleScripts/base-config/mount_fsx.sh at 7217859):
# load lnet and lustre, mount DNS@tcp:/MOUNTNAME with noatime,flock,_netdev, retried.
# HyperPod mounts FSx itself only when the instance group has an FsxLustreConfig, which the
# construct does not send, so this step owns the mount.
#
# Lustre over EFA: for an EFA-enabled file system the construct lists, per worker group, how
# many EFA interfaces its nodes use (fsx_lustre.efa_interfaces; the FSx default, 8 on the P5
# family). Before mounting, such a node adds them to LNet's efa network, the command the FSx
# for Lustre User Guide gives ("Configuring EFA clients": lnetctl net add --net efa --if
# DEVICE --peer-credits 32), after `lnetctl lnet configure`; the mount still names the @tcp
# NID, as AWS's script does, and LNet multi-rail then uses the EFA interfaces. HyperPod's
# DLAMI-based AMI ships the Lustre client and EFA driver that needs ("If you are using a Deep
# Learning AMI, you can skip this step"). AWS's script downloads the guide's setup.sh at boot
# instead; this downloads nothing. Like that setup.sh, it makes sure LNet has its TCP network on
# the interface of the default route (the mount's @tcp NID needs it once `lnetctl lnet configure`
# has replaced the module's defaults), and makes the configuration survive a reboot, which
# HyperPod does to recover a node: lnetctl's changes live in the kernel only, so a systemd unit
# (moe-cdk-lnet-efa.service, ordered before the remote file systems and so before the fstab
# mount) runs `mount_fsx.sh --lnet-efa COUNT` at every boot. Without lnetctl or EFA devices, or
# when a command fails, the node mounts over TCP with a WARNING: slower, not broken.
#
#   mount_fsx.sh                    (lifecycle step) configure LNet, mount, record in /etc/fstab
#   mount_fsx.sh --lnet-efa COUNT   (the unit, at boot) configure LNet over COUNT EFA devices only
#
# Paths on the command line carry ${MOE_LC_ROOT} (so tests can run in a sandbox); the fstab
# line names the mount point as the node sees it (no prefix).
set -euo pipefail

MOE_LC_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "${MOE_LC_DIR}/lib.sh"

readonly LUSTRE_OPTIONS="noatime,flock,_netdev"
readonly LNET_UNIT="moe-cdk-lnet-efa.service"

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

# lnet_over_efa COUNT: add the first COUNT EFA devices to LNet's efa network (those already
# there are skipped); returns non-zero when it could not.
lnet_over_efa() {
  local count="$1" devices=() device configured
  if ! command -v lnetctl >/dev/null 2>&1; then
    warn "lnetctl is not installed: no Lustre client with EFA support"
    return 1
  fi
  mapfile -t devices < <(find "${MOE_LC_ROOT}/sys/class/infiniband" -mindepth 1 -maxdepth 1 -printf '%f\n' 2>/dev/null | sort)
  if ((${#devices[@]} == 0)); then
    warn "no EFA device under ${MOE_LC_ROOT}/sys/class/infiniband"
    return 1
  fi
  modprobe lnet || return
  lnetctl lnet configure || return
  lnet_over_tcp || return
  configured="$(lnetctl net show --net efa 2>/dev/null || true)"
  for device in "${devices[@]:0:count}"; do
    if grep -qw -- "${device}" <<<"${configured}"; then
      log "LNet efa network already has ${device}"
    else
      lnetctl net add --net efa --if "${device}" --peer-credits 32 || return
      log "LNet efa network: added ${device}"
    fi
  done
}

# lnet_over_tcp: LNet's tcp network on the default route's interface, unless it has one.
lnet_over_tcp() {
  local interface
  if [[ -n "$(lnetctl net show --net tcp 2>/dev/null || true)" ]]; then
    return 0
  fi
  interface="$(ip route show default 2>/dev/null | awk '{ for (i = 1; i < NF; i++) if ($i == "dev") { print $(i + 1); exit } }')"
  if [[ -z "${interface}" ]]; then
    warn "no default route, so LNet's tcp network has no interface"
    return 1
  fi
  lnetctl net add --net tcp --if "${interface}" || return
  log "LNet tcp network: added ${interface}"
}

# install_lnet_unit COUNT: the unit that configures LNet over COUNT EFA devices at every boot.
install_lnet_unit() {
  local count="$1" unit="${MOE_LC_ROOT}/etc/systemd/system/${LNET_UNIT}" tmp
  mkdir -p -- "$(dirname -- "${unit}")"
  tmp="$(mktemp "${unit}.moe-cdk.XXXXXX")"
  cat >"${tmp}" <<EOF
# Written by lifecycle_scripts/mount_fsx.sh: Lustre over EFA again after a reboot (LNet's
# configuration lives in the kernel only), before the fstab mount of ${MOE_FSX_MOUNT_POINT}.
[Unit]
Description=moe-cdk: LNet over ${count} EFA devices for FSx for Lustre
Wants=network-online.target
After=network-online.target
Before=remote-fs-pre.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/bash ${MOE_LC_DIR}/mount_fsx.sh --lnet-efa ${count}

[Install]
WantedBy=remote-fs.target
EOF
  if ! replace_if_changed "${tmp}" "${unit}" 644; then
    log "${LNET_UNIT} is already installed"
    return 0
  fi
  retry 5 2 systemctl daemon-reload
  retry 5 2 systemctl enable "${LNET_UNIT}"
  log "installed and enabled ${LNET_UNIT}: LNet over EFA is configured again at every boot"
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
  if [[ "${1:-}" == "--lnet-efa" ]]; then
    if [[ ! "${2:-}" =~ ^[1-9][0-9]*$ ]]; then
      die "--lnet-efa: not a device count (got '${2:-}'; allowed 1, 2, ...)"
    fi
    lnet_over_efa "$2"
    log "LNet uses up to $2 EFA interfaces"
    return 0
  fi
  load_params
  load_node_facts
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
  if ((MOE_LUSTRE_EFA_INTERFACES > 0)); then
    if lnet_over_efa "${MOE_LUSTRE_EFA_INTERFACES}"; then
      log "Lustre traffic uses up to ${MOE_LUSTRE_EFA_INTERFACES} EFA interfaces"
      install_lnet_unit "${MOE_LUSTRE_EFA_INTERFACES}"
    else
      warn "Lustre over EFA is not configured; ${mount_point} is mounted over TCP"
    fi
  fi
  mkdir -p -- "${target}"
  retry 5 5 mount -t lustre -o "${LUSTRE_OPTIONS}" "${device}" "${target}"
  log "mounted ${device} at ${mount_point}"
  ensure_fstab_line "${device} ${mount_point} lustre ${LUSTRE_OPTIONS} 0 0" "${mount_point}"
}

main "$@"
