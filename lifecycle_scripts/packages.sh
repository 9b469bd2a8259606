#!/usr/bin/env bash
# packages.sh: fetch and verify the pinned software of node_packages.txt. Sourced by
# setup_enroot.sh and setup_pyxis.sh, never executed; the only lifecycle file that downloads.
#
#   package_version NAME            the VERSION column of NAME
#   fetch_package_file NAME DIR VAR download NAME's SOURCE into DIR, verify its CHECK; the path into VAR
#   fetch_package_git NAME DIR      clone NAME's SOURCE at tag v<VERSION> into DIR, verify the commit
#   apt_update                      apt-get update (the AMI's package lists may be older than the archive)
#   apt_install PACKAGE...          apt-get install, retried, waiting for another apt's lock
#
# A node reaches GitHub and Ubuntu's archive through the cluster's NAT gateway. A download or a
# check that fails stops the step with a message naming the package, what was expected and what
# came, and that no unverified file was installed.
set -euo pipefail

MOE_LC_PACKAGES="${MOE_LC_PACKAGES:-${MOE_LC_LIB_DIR}/node_packages.txt}"

# package_line NAME: "VERSION SOURCE CHECK" of NAME in the manifest.
package_line() {
  local name="$1" line
  line="$(awk -v name="${name}" '$1 == name && $1 !~ /^#/ { print $2, $3, $4; exit }' "${MOE_LC_PACKAGES}")"
  if [[ -z "${line}" ]]; then
    die "${MOE_LC_PACKAGES}: no package named ${name} (the lifecycle bundle is incomplete: redeploy the cluster stack)"
  fi
  printf '%s' "${line}"
}

package_version() {
  local version source check
  read -r version source check <<<"$(package_line "$1")"
  printf '%s' "${version}"
}

# fetch_package_file NAME DIR VAR
fetch_package_file() {
  local name="$1" dir="$2" variable="$3" version source check arch file got
  read -r version source check <<<"$(package_line "${name}")"
  arch="$(dpkg --print-architecture 2>/dev/null || echo amd64)"
  source="${source//\{arch\}/${arch}}"
  file="${dir}/${source##*/}"
  retry 5 5 curl -fsSL --connect-timeout 20 -o "${file}" "${source}"
  got="sha256:$(sha256sum -- "${file}" | cut -d' ' -f1)"
  case "${check}" in
    -)
      warn "${name} ${version}: ${MOE_LC_PACKAGES} pins no digest, so it is installed pinned by version only; it downloaded as ${got}"
      ;;
    sha256:*)
      if [[ "${got}" != "${check}" ]]; then
        rm -f -- "${file}"
        die "${name} ${version} from ${source} is ${got}, not the pinned ${check}: nothing was installed; check the download (a proxy, a moved release) or the pin in node_packages.txt"
      fi
      log "${name} ${version}: ${got} as pinned"
      ;;
    *) die "${MOE_LC_PACKAGES}: ${name} has CHECK '${check}' (allowed sha256:<64 hex> or -)" ;;
  esac
  printf -v "${variable}" '%s' "${file}"
}

# fetch_package_git NAME DIR: DIR becomes a clone of the pinned commit.
fetch_package_git() {
  local name="$1" dir="$2" version source check head
  read -r version source check <<<"$(package_line "${name}")"
  if [[ ! "${check}" =~ ^commit:[0-9a-f]{40}$ ]]; then
    die "${MOE_LC_PACKAGES}: ${name} has CHECK '${check}' (allowed commit:<40 hex> for a git source)"
  fi
  rm -rf -- "${dir}"
  retry 5 5 git -c advice.detachedHead=false clone --quiet --depth 1 --branch "v${version}" "${source}" "${dir}"
  head="$(git -C "${dir}" rev-parse HEAD)"
  if [[ "commit:${head}" != "${check}" ]]; then
    rm -rf -- "${dir}"
    die "${name} tag v${version} of ${source} is commit ${head}, not the pinned ${check#commit:}: nothing was built; the tag moved or the source is not NVIDIA's"
  fi
  log "${name} ${version}: commit ${head} as pinned"
}

apt_update() {
  retry 5 5 apt-get -y -q -o DPkg::Lock::Timeout=120 update
}

apt_install() {
  DEBIAN_FRONTEND=noninteractive retry 5 5 apt-get -y -q -o DPkg::Lock::Timeout=120 install "$@"
}
