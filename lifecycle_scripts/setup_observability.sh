#!/usr/bin/env bash
# setup_observability.sh: Prometheus exporters on every node and, on the controller, an agent that
# scrapes them all and remote-writes to Amazon Managed Service for Prometheus (AMP).
#
#   compute node     node_exporter (9100); the DCGM exporter (9400) where `nvidia-smi -L` lists a
#                    GPU; the EFA exporter (9109) where an EFA device shows
#   login node       node_exporter
#   controller       node_exporter (127.0.0.1:9100); slurm_exporter.py (127.0.0.1:9341) as the systemd service
#                    moe-cdk-slurm-exporter; scrape_targets.py every minute
#                    (moe-cdk-scrape-targets.timer) writing the agent's target files; and
#                    Prometheus in agent mode, remote-writing to the URL in the SSM parameter
#                    observability.remote_write_url_parameter, signed with SigV4 for the cluster's
#                    region with the instance's credentials
#
# Who listens where: the agent runs on the controller only and scrapes every node over the network,
# so the exporters of compute and login nodes (and the trainer's port) listen on every interface,
# where the controller reaches them. On the controller every listener has the agent beside it on the
# host network as its only client: node_exporter, slurm_exporter.py and the agent's web server take
# 127.0.0.1, and scrape_targets.py names the controller's node_exporter at that same address.
#
# observability: null in provisioning_parameters.json: skipped, nothing changes.
#
# Source: AWS's reference observability scripts for HyperPod Slurm (aws-samples/
# awsome-distributed-training, 1.architectures/5.sagemaker-hyperpod/LifecycleScripts/base-config/
# observability/ at 7217859: install_observability.py picks the exporters per node type;
# install_node_exporter.sh, install_dcgm_exporter.sh and install_efa_exporter.sh run HyperPod's
# images from its ECR account with --restart always on the host network, node_exporter and the EFA
# exporter with the host's root at /host (--path.rootfs=/host) and its PID namespace, DCGM with all
# GPUs and CAP_SYS_ADMIN). What differs, and why:
#   * The images and tags come from observability_images.txt, the one pin manifest; AWS's scripts
#     name them inline. A container is left alone when it runs the same image with the same
#     options (a label holds a hash of both); otherwise it is replaced. AWS's scripts skip any
#     running container of that name, even of another version.
#   * DCGM exports the image's default counters (dcgm-exporter's default-counters.csv, which has
#     DCGM_FI_DEV_XID_ERRORS); AWS's basic CSV is a subset chosen for its dashboards. Like AWS's
#     newer script it reads Slurm's GPU-to-job files (job_mapping_dir), so each GPU series has hpc_job.
#   * The agent is Prometheus in agent mode, scraping every node from the controller through
#     file_sd_configs that scrape_targets.py keeps current from `scontrol show nodes`. AWS runs an
#     OpenTelemetry collector on each node, each scraping localhost.
#   * The Slurm exporter is ours (slurm_exporter.py, standard library only); AWS builds SckyzO's
#     from source at boot.
#
# Downloads: the container images, from the registries the manifest names (HyperPod's ECR with a
# token from `aws ecr get-login-password`, Quay.io for Prometheus), and on a ParallelCluster node
# without Docker, Ubuntu's docker.io (ensure_docker); nothing else. An image already present is not
# pulled again. The digest Docker reports for each is logged and kept in
# /var/lib/moe-cdk/observability/images; a digest pinned in the manifest must match it.
#
# Paths carry ${MOE_LC_ROOT}, so the tests run this in a sandbox with a stand-in docker.
set -euo pipefail

MOE_LC_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "${MOE_LC_DIR}/lib.sh"
# shellcheck source-path=SCRIPTDIR source=packages.sh
source "${MOE_LC_DIR}/packages.sh"

readonly IMAGES_FILE="${MOE_LC_DIR}/observability_images.txt"
readonly INSTALL_DIR="${MOE_LC_ROOT}/opt/moe-cdk/observability"
readonly PROMETHEUS_DIR="${MOE_LC_ROOT}/etc/moe-cdk/prometheus"
readonly AGENT_CONFIG="${PROMETHEUS_DIR}/agent.yml"
readonly TARGETS_DIR="${PROMETHEUS_DIR}/targets"
readonly AGENT_DATA_DIR="${MOE_LC_ROOT}/var/lib/moe-cdk/prometheus-agent"
readonly STATE_DIR="${MOE_LC_ROOT}/var/lib/moe-cdk/observability"
readonly UNIT_DIR="${MOE_LC_ROOT}/etc/systemd/system"
readonly SPEC_LABEL="moe-cdk.spec"
# Where the agent's own web server listens (not 9090, the trainer's usual port).
readonly AGENT_LISTEN_ADDRESS="127.0.0.1:9095"
readonly SLURM_EXPORTER_ADDRESS="127.0.0.1:9341"
readonly CONTROLLER_NODE_EXPORTER_ADDRESS="127.0.0.1:9100"
# Prometheus's image runs as nobody (its Dockerfile's USER), which must own the agent's WAL folder.
readonly PROMETHEUS_UID=65534
# HyperPod's Slurm commands, for the services (systemd's PATH does not have them).
readonly SERVICE_PATH="/opt/slurm/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# AMP's remote-write endpoint (AMP User Guide, "Ingest Prometheus metrics to the workspace").
readonly AMP_URL_PATTERN='^https://aps-workspaces\.([a-z0-9-]+)\.amazonaws\.com/workspaces/ws-[A-Za-z0-9-]+/api/v1/remote_write$'

# pinned_image NAME: the manifest's reference for NAME ("IMAGE:TAG", or "IMAGE:TAG@DIGEST" when a
# digest is pinned) into PINNED_REF, and the digest ("" when none) into PINNED_DIGEST.
PINNED_REF="" PINNED_DIGEST=""
pinned_image() {
  local wanted="$1" name image tag digest
  while read -r name image tag digest _; do
    [[ -n "${name}" && "${name}" != \#* ]] || continue
    [[ "${name}" == "${wanted}" ]] || continue
    image="${image//\{region\}/${MOE_REGION}}"
    if [[ ! "${image}" =~ ^[a-z0-9.-]+(/[a-z0-9._-]+)+$ || ! "${tag}" =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$ \
      || ! "${digest}" =~ ^(-|sha256:[0-9a-f]{64})$ ]]; then
      die "${IMAGES_FILE}: invalid line for ${wanted} (got '${image} ${tag} ${digest}'; allowed IMAGE TAG and - or sha256:<64 hex digits>)"
    fi
    PINNED_REF="${image}:${tag}"
    PINNED_DIGEST=""
    if [[ "${digest}" != "-" ]]; then
      PINNED_REF+="@${digest}"
      PINNED_DIGEST="${digest}"
    fi
    return 0
  done <"${IMAGES_FILE}"
  die "${IMAGES_FILE}: no image named ${wanted}"
}

# ecr_login REGISTRY: log Docker in to an ECR registry with a token for this node's role.
ecr_login() {
  local registry="$1" password
  password="$(aws ecr get-login-password --region "${MOE_REGION}")" || return
  docker login --username AWS --password-stdin "${registry}" <<<"${password}" >/dev/null
}

# docker_pull REF: pull REF, printing nothing but errors (retry's log lines stay on stdout).
docker_pull() {
  docker pull --quiet "$1" >/dev/null
}

# record_digests NAME REF DIGESTS: one line per image in the state file.
record_digests() {
  local name="$1" ref="$2" digests="$3" file="${STATE_DIR}/images" tmp
  mkdir -p -- "${STATE_DIR}"
  tmp="$(mktemp "${file}.moe-cdk.XXXXXX")"
  if [[ -f "${file}" ]]; then
    awk -v name="${name}" '$1 != name' "${file}" >"${tmp}"
  fi
  printf '%s %s %s\n' "${name}" "${ref}" "${digests:--}" >>"${tmp}"
  replace_if_changed "${tmp}" "${file}" 644 || true
}

# ensure_image NAME: the manifest's image for NAME, pulled unless Docker has it, into PINNED_REF.
ensure_image() {
  local name="$1" digests
  pinned_image "${name}"
  if docker image inspect "${PINNED_REF}" >/dev/null 2>&1; then
    log "${PINNED_REF} is already pulled"
  else
    if [[ "${PINNED_REF}" == *.dkr.ecr.*.amazonaws.com/* ]]; then
      retry 5 5 ecr_login "${PINNED_REF%%/*}"
    fi
    retry 5 5 docker_pull "${PINNED_REF}"
    log "pulled ${PINNED_REF}"
  fi
  digests="$(docker image inspect --format '{{join .RepoDigests " "}}' "${PINNED_REF}")"
  if [[ -n "${PINNED_DIGEST}" && " ${digests} " != *"@${PINNED_DIGEST} "* ]]; then
    die "${PINNED_REF}: Docker reports digests '${digests}', not the pinned ${PINNED_DIGEST}"
  fi
  record_digests "${name}" "${PINNED_REF}" "${digests// /,}"
  log "${name}: ${PINNED_REF} has digest ${digests:-(none reported)}${PINNED_DIGEST:+ (pinned)}"
}

# start_container NAME SPEC REF OPTIONS... -- ARGS...: a fresh `docker run` of REF.
start_container() {
  local name="$1" spec="$2" ref="$3" options=()
  shift 3
  while (($# > 0)) && [[ "$1" != "--" ]]; do
    options+=("$1")
    shift
  done
  (($# > 0)) && shift
  docker rm -f "${name}" >/dev/null 2>&1 || true
  docker run -d --restart always --name "${name}" --label "${SPEC_LABEL}=${spec}" "${options[@]}" "${ref}" "$@" >/dev/null
}

# run_container NAME OPTIONS... -- ARGS...: run PINNED_REF as container NAME with docker-run
# OPTIONS and the image's ARGS, unless it already runs with exactly these.
run_container() {
  local name="$1" spec current
  shift
  spec="$(printf '%s\n' "${PINNED_REF}" "$@" | sha256sum | cut -c1-16)"
  current="$(docker inspect --type container --format "{{.Config.Image}} {{index .Config.Labels \"${SPEC_LABEL}\"}} {{.State.Running}}" "${name}" 2>/dev/null || true)"
  current="${current//$'\n'/}"
  if [[ "${current}" == "${PINNED_REF} ${spec} true" ]]; then
    log "container ${name} already runs ${PINNED_REF} with these options; leaving it alone"
    return 0
  fi
  if [[ -n "${current}" ]]; then
    log "replacing container ${name} (image, spec, running: ${current}; wanted ${PINNED_REF} ${spec})"
  fi
  retry 3 2 start_container "${name}" "${spec}" "${PINNED_REF}" "$@"
  log "started container ${name}: ${PINNED_REF} $*"
}

# node_exporter [ARGS...]: node_exporter with --path.rootfs=/host and ARGS (default: port 9100 on
# every interface).
node_exporter() {
  ensure_image node_exporter
  # The host's file systems (FSx for Lustre included) seen through /host, as node_exporter's
  # README runs it in Docker.
  run_container node-exporter --net host --pid host -v "${MOE_LC_ROOT}/:/host:ro,rslave" -- --path.rootfs=/host "$@"
}

# The folder where Slurm's prolog writes one file per GPU holding the job that has it; the DCGM
# exporter reads it (--hpc-job-mapping-dir) and labels that GPU's series hpc_job="<job id>", so GPU
# metrics join Slurm jobs. AWS's sources disagree on its name: the observability extension's README
# and install_dcgm_exporter.sh (awslabs/awsome-distributed-ai at 95b939c, 1.architectures/
# 5.sagemaker-hyperpod/Extensions/observability/) say /run/slurm/dcgm-job-mapping, written by the
# AMI's /opt/slurm/etc/prolog.d/700_dcgm_job_map_register.sh under OnInitComplete; base-config's
# prolog.sh, which start_slurm.sh installs as /opt/slurm/etc/scripts/prolog.sh, writes
# /run/slurm/dcgm_job_mapping. So the folder is the one this node's prolog scripts name, and the
# README's when none does (with a WARNING: then no job label).
readonly JOB_MAPPING_DEFAULT="/run/slurm/dcgm-job-mapping"
readonly JOB_MAPPING_IN_CONTAINER="/etc/dcgm-exporter/hpc"

# job_mapping_dir VAR: the mapping folder (as the node sees it) into VAR.
job_mapping_dir() {
  local prologs=("${MOE_LC_ROOT}/opt/slurm/etc/prolog.d" "${MOE_LC_ROOT}/opt/slurm/etc/scripts/prolog.sh") found
  found="$(grep -rhoE '/run/slurm/dcgm[-_]job[-_]mapping' "${prologs[@]}" 2>/dev/null | head -n 1 || true)"
  if [[ -z "${found}" ]]; then
    warn "no Slurm prolog under /opt/slurm/etc/prolog.d or /opt/slurm/etc/scripts names a DCGM job mapping folder, so GPU series will carry no hpc_job label (HyperPod's AMI ships prolog.d/700_dcgm_job_map_register.sh with OnInitComplete); the exporter reads ${JOB_MAPPING_DEFAULT}"
    found="${JOB_MAPPING_DEFAULT}"
  fi
  printf -v "$1" '%s' "${found}"
}

dcgm_exporter() {
  local mapping
  ensure_image dcgm_exporter
  job_mapping_dir mapping
  mkdir -p -- "${MOE_LC_ROOT}${mapping}"
  log "DCGM labels GPU series with the Slurm job from ${mapping} (written by Slurm's prolog)"
  run_container dcgm-exporter --net host --gpus all --cap-add SYS_ADMIN \
    -v "${MOE_LC_ROOT}${mapping}:${JOB_MAPPING_IN_CONTAINER}:ro" -- --hpc-job-mapping-dir "${JOB_MAPPING_IN_CONTAINER}"
}

efa_exporter() {
  ensure_image efa_exporter
  run_container efa-exporter --net host --pid host -v "${MOE_LC_ROOT}/:/host:ro,rslave" -- \
    --path.rootfs=/host --web.listen-address=:9109
}

# gpus_visible: nvidia-smi lists at least one GPU.
gpus_visible() {
  local listed
  command -v nvidia-smi >/dev/null 2>&1 || return 1
  listed="$(nvidia-smi -L 2>/dev/null)" || return 1
  grep -q '^GPU ' <<<"${listed}"
}

# efa_visible: an EFA device shows under /sys/class/infiniband.
efa_visible() {
  local devices=("${MOE_LC_ROOT}"/sys/class/infiniband/*)
  [[ -e "${devices[0]}" ]]
}

# install_file SOURCE TARGET MODE: copy SOURCE over TARGET when they differ; 0 when it changed.
install_file() {
  local source="$1" target="$2" mode="$3" tmp
  mkdir -p -- "$(dirname -- "${target}")"
  tmp="$(mktemp "${target}.moe-cdk.XXXXXX")"
  cat -- "${source}" >"${tmp}"
  replace_if_changed "${tmp}" "${target}" "${mode}"
}

# write_file TARGET MODE: stdin to TARGET when it differs; 0 when it changed.
write_file() {
  local target="$1" mode="$2" tmp
  mkdir -p -- "$(dirname -- "${target}")"
  tmp="$(mktemp "${target}.moe-cdk.XXXXXX")"
  cat >"${tmp}"
  replace_if_changed "${tmp}" "${target}" "${mode}"
}

# ssm_value NAME: the SSM parameter's value into SSM_VALUE.
SSM_VALUE=""
ssm_value() {
  local value
  value="$(aws ssm get-parameter --name "$1" --query Parameter.Value --output text --region "${MOE_REGION}")" || return
  if [[ -z "${value}" || "${value}" == "None" ]]; then
    log "SSM parameter $1 is empty"
    return 1
  fi
  SSM_VALUE="${value}"
}

# remote_write_url: the AMP URL from SSM, checked, into REMOTE_WRITE_URL.
REMOTE_WRITE_URL=""
remote_write_url() {
  local parameter="${MOE_OBSERVABILITY_REMOTE_WRITE_URL_PARAMETER}"
  retry 5 2 ssm_value "${parameter}"
  if [[ ! "${SSM_VALUE}" =~ ${AMP_URL_PATTERN} ]]; then
    die "remote-write URL: invalid (got '${SSM_VALUE}' from ${parameter}; allowed https://aps-workspaces.REGION.amazonaws.com/workspaces/ws-ID/api/v1/remote_write)"
  fi
  if [[ "${BASH_REMATCH[1]}" != "${MOE_REGION}" ]]; then
    die "remote-write URL: workspace in ${BASH_REMATCH[1]}, but the cluster's region is ${MOE_REGION} (got '${SSM_VALUE}' from ${parameter}; allowed a workspace in ${MOE_REGION}, the region SigV4 signs for)"
  fi
  REMOTE_WRITE_URL="${SSM_VALUE}"
}

# The agent's configuration: one job per exporter, each reading its file of targets (paths
# relative to this file, so the same file works inside the container and in the tests).
agent_config() {
  local job
  cat <<EOF
# Written by moe-cdk's setup_observability.sh; the next run replaces it.
# Prometheus in agent mode: scrape every node's exporters, remote-write to Amazon Managed
# Service for Prometheus (SigV4 with the instance's credentials).
global:
  scrape_interval: ${MOE_OBSERVABILITY_SCRAPE_INTERVAL_S}s
scrape_configs:
EOF
  for job in node dcgm efa slurm ${MOE_OBSERVABILITY_TRAINER_METRICS_PORT:+moe-trainer}; do
    cat <<EOF
  - job_name: ${job}
    file_sd_configs:
      - files: [targets/${job}.json]
        refresh_interval: 1m
EOF
  done
  cat <<EOF
remote_write:
  - url: ${REMOTE_WRITE_URL}
    sigv4:
      region: ${MOE_REGION}
EOF
}

# Arguments of scrape_targets.py, shared by the first run here and the timer's service.
SCRAPE_TARGETS_ARGS=()
scrape_targets_args() {
  SCRAPE_TARGETS_ARGS=("${INSTALL_DIR}/scrape_targets.py" --params "${INSTALL_DIR}/provisioning_parameters.json")
  # ParallelCluster writes no resource_config.json: the head node is then named by its host name.
  if [[ "${MOE_CLUSTER_MANAGER}" != parallelcluster ]]; then
    SCRAPE_TARGETS_ARGS+=(--resource-config "${MOE_LC_RESOURCE_CONFIG}")
  fi
  SCRAPE_TARGETS_ARGS+=(
    --out "${TARGETS_DIR}" --slurm-exporter-address "${SLURM_EXPORTER_ADDRESS}"
    --controller-node-exporter-address "${CONTROLLER_NODE_EXPORTER_ADDRESS}"
  )
}

slurm_exporter_unit() {
  cat <<EOF
# Written by moe-cdk's setup_observability.sh.
[Unit]
Description=moe-cdk Slurm exporter for Prometheus (moe_slurm_* on ${SLURM_EXPORTER_ADDRESS})
After=network-online.target
Wants=network-online.target

[Service]
Environment=PATH=${SERVICE_PATH}
Environment=PYTHONDONTWRITEBYTECODE=1
ExecStart=${PYTHON} ${INSTALL_DIR}/slurm_exporter.py --listen-address ${SLURM_EXPORTER_ADDRESS}
Restart=always
RestartSec=10
NoNewPrivileges=yes
ProtectSystem=full
PrivateTmp=yes

[Install]
WantedBy=multi-user.target
EOF
}

scrape_targets_service() {
  cat <<EOF
# Written by moe-cdk's setup_observability.sh; started by moe-cdk-scrape-targets.timer.
[Unit]
Description=moe-cdk: refresh the Prometheus agent's scrape targets from Slurm

[Service]
Type=oneshot
Environment=PATH=${SERVICE_PATH}
Environment=PYTHONDONTWRITEBYTECODE=1
ExecStart=${PYTHON} ${SCRAPE_TARGETS_ARGS[*]}
EOF
}

scrape_targets_timer() {
  cat <<EOF
# Written by moe-cdk's setup_observability.sh.
[Unit]
Description=moe-cdk: refresh the Prometheus agent's scrape targets every minute

[Timer]
OnActiveSec=60s
OnUnitActiveSec=60s
AccuracySec=5s

[Install]
WantedBy=timers.target
EOF
}

PYTHON=""
controller_node() {
  local changed_units=0 restart_exporter=0
  PYTHON="$(command -v python3)"
  node_exporter --web.listen-address="${CONTROLLER_NODE_EXPORTER_ADDRESS}"

  # Our scripts and the parameters, where the services find them after the lifecycle folder goes.
  if install_file "${MOE_LC_DIR}/slurm_exporter.py" "${INSTALL_DIR}/slurm_exporter.py" 644; then restart_exporter=1; fi
  install_file "${MOE_LC_DIR}/scrape_targets.py" "${INSTALL_DIR}/scrape_targets.py" 644 || true
  install_file "${MOE_LC_PARAMS}" "${INSTALL_DIR}/provisioning_parameters.json" 644 || true
  scrape_targets_args
  if slurm_exporter_unit | write_file "${UNIT_DIR}/moe-cdk-slurm-exporter.service" 644; then
    changed_units=1 restart_exporter=1
  fi
  if scrape_targets_service | write_file "${UNIT_DIR}/moe-cdk-scrape-targets.service" 644; then changed_units=1; fi
  if scrape_targets_timer | write_file "${UNIT_DIR}/moe-cdk-scrape-targets.timer" 644; then changed_units=1; fi
  if ((changed_units)); then
    systemctl daemon-reload
  fi
  systemctl enable --now moe-cdk-slurm-exporter.service
  if ((restart_exporter)); then
    systemctl restart moe-cdk-slurm-exporter.service
    log "moe-cdk-slurm-exporter serves http://${SLURM_EXPORTER_ADDRESS}/metrics"
  fi

  # The target lists before the agent starts; then the timer keeps them current.
  mkdir -p -- "${TARGETS_DIR}"
  retry 6 5 env PATH="${PATH}:${SERVICE_PATH}" "${PYTHON}" "${SCRAPE_TARGETS_ARGS[@]}"
  systemctl enable --now moe-cdk-scrape-targets.timer
  log "scrape targets in ${TARGETS_DIR}, refreshed every minute by moe-cdk-scrape-targets.timer"

  remote_write_url
  if agent_config | write_file "${AGENT_CONFIG}" 644; then
    log "wrote ${AGENT_CONFIG} (scrape every ${MOE_OBSERVABILITY_SCRAPE_INTERVAL_S}s, remote-write to ${REMOTE_WRITE_URL})"
  else
    log "${AGENT_CONFIG} is already up to date"
  fi
  mkdir -p -- "${AGENT_DATA_DIR}"
  chown "${PROMETHEUS_UID}:${PROMETHEUS_UID}" "${AGENT_DATA_DIR}"
  ensure_image prometheus
  # The configuration's hash is an option, so a changed configuration replaces the container.
  run_container prometheus-agent --net host \
    --label "moe-cdk.config=$(sha256sum "${AGENT_CONFIG}" | cut -c1-16)" \
    -v "${PROMETHEUS_DIR}:/etc/moe-cdk/prometheus:ro" -v "${AGENT_DATA_DIR}:/prometheus" -- \
    --agent --config.file=/etc/moe-cdk/prometheus/agent.yml --storage.agent.path=/prometheus \
    --web.listen-address="${AGENT_LISTEN_ADDRESS}"
}

compute_node() {
  node_exporter
  if gpus_visible; then
    dcgm_exporter
  else
    log "nvidia-smi -L lists no GPU on this ${MOE_INSTANCE_TYPE} node: no DCGM exporter"
  fi
  if efa_visible; then
    efa_exporter
  else
    log "no EFA device under ${MOE_LC_ROOT}/sys/class/infiniband: no EFA exporter"
  fi
}

# ensure_docker: Docker, which runs every exporter. HyperPod's AMI-based configuration installs it. ParallelCluster's
# AMIs do not ship it: AWS's reference ParallelCluster clusters install it in OnNodeConfigured
# (aws-samples/aws-parallelcluster-post-install-scripts, docker/postinstall.sh, as awslabs/awsome-distributed-ai's
# cluster templates run it), from Docker's own apt repository. This takes Ubuntu's docker.io from the archive the
# node already reaches (packages.sh), with no third-party key, and is skipped where docker is already there (an
# AMI of your own that has it).
ensure_docker() {
  if command -v docker >/dev/null 2>&1; then
    return 0
  fi
  if [[ "${MOE_CLUSTER_MANAGER}" != parallelcluster ]]; then
    die "docker is not installed: HyperPod's AMI-based configuration installs it (OnInitComplete runs after it)"
  fi
  log "docker is not installed (ParallelCluster's AMIs ship none): installing Ubuntu's docker.io"
  apt_update
  apt_install docker.io
  systemctl enable --now docker.service
  command -v docker >/dev/null 2>&1 || die "apt-get installed docker.io, but no docker command is on PATH"
}

main() {
  install_err_trap
  load_params
  load_node_facts
  if [[ "${MOE_WORKLOAD_MANAGER}" == "eks" ]]; then
    log "workload_manager is eks: no Slurm nodes to scrape; skipping"
    return 0
  fi
  if [[ "${MOE_OBSERVABILITY_ENABLED}" != "true" ]]; then
    log "observability is null in provisioning_parameters.json; skipped"
    return 0
  fi
  ensure_docker
  case "${MOE_NODE_ROLE}" in
    controller) controller_node ;;
    compute) compute_node ;;
    login) node_exporter ;;
    *) die "setup_observability.sh: unexpected node role '${MOE_NODE_ROLE}' (allowed controller, login, compute)" ;;
  esac
  log "observability is set up on this ${MOE_NODE_ROLE} node"
}

main "$@"
