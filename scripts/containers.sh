#!/usr/bin/env bash
# Container images and engine for limen (docs/DEPLOY.md): docker where its engine answers, podman otherwise.
#   scripts/containers.sh engine   print the engine (docker|podman); exit 3 with the reason when there is none
#   scripts/containers.sh base     print the base image to build on (made locally where no registry answers)
#   scripts/containers.sh images   build limen-env:$LIMEN_VERSION and the CPU trainer limen-train:$LIMEN_VERSION-cpu
# Where no registry answers, the Dockerfiles' official base (python:3.11-slim-bookworm) is replaced by a local
# Debian 12 image made with mmdebstrap (limen-python:3.11-bookworm). Podman without systemd (CI, sandboxes)
# gets deploy/podman/containers.conf. As root, missing Debian packages (podman, mmdebstrap, ...) are installed.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=${LIMEN_VERSION:-0.1.0}
OFFICIAL_BASE=python:3.11-slim-bookworm
LOCAL_BASE=localhost/limen-python:3.11-bookworm
CACHE=.cache/containers  # git- and docker-ignored: the base rootfs tarball and the torch wheel live here
# netavark runs iptables to wire each network, yet no package of the set depends on it: without it every container
# with a network fails "netavark: No such file or directory (os error 2)" (a fresh machine here, 2026-12-06).
PODMAN_PACKAGES=(podman runc catatonit uidmap slirp4netns fuse-overlayfs netavark aardvark-dns iptables)

log() { echo "containers: $*" >&2; }

apt_install() {  # Debian packages, as root only; false when they cannot be had
  [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null || return 1
  log "installing $*"
  { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@"; } \
    >"$CACHE/apt.log" 2>&1 || { tail -5 "$CACHE/apt.log" >&2; return 1; }
}

engine() {
  mkdir -p "$CACHE"
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
    echo docker
    return
  fi
  # What of podman's set is missing (a preinstalled podman may lack netavark, aardvark-dns and iptables, without
  # which containers get no network or resolve no service names); where it cannot be installed, a podman already
  # here still runs.
  local missing=() package
  for package in "${PODMAN_PACKAGES[@]}"; do
    command -v dpkg >/dev/null && ! dpkg -s "$package" >/dev/null 2>&1 && missing+=("$package")
  done
  if [ ${#missing[@]} -gt 0 ] && ! apt_install "${missing[@]}" && ! command -v podman >/dev/null; then
    log "no container engine: docker answers not, podman is missing, and it cannot be installed (needs root and apt-get)"
    return 3
  fi
  if ! command -v podman >/dev/null; then
    log "no container engine: docker answers not and podman is missing"
    return 3
  fi
  if ! podman info >/dev/null 2>&1; then
    log "podman is installed but does not run here: $(podman info 2>&1 | tail -1)"
    return 3
  fi
  echo podman
}

podman_env() {
  # No systemd as init: runc, cgroupfs and ulimits that fit this kind of machine (deploy/podman/containers.conf).
  if [ ! -d /run/systemd/system ] && [ -z "${CONTAINERS_CONF:-}" ]; then
    export CONTAINERS_CONF="$PWD/deploy/podman/containers.conf"
  fi
}

# The base image: the official one where a registry answers, else a local Debian 12 with Python 3.11.
base_image() {
  local tool=$1
  if "$tool" image inspect "$OFFICIAL_BASE" >/dev/null 2>&1 || "$tool" pull -q "$OFFICIAL_BASE" >/dev/null 2>&1; then
    echo "$OFFICIAL_BASE"
    return
  fi
  if ! "$tool" image inspect "$LOCAL_BASE" >/dev/null 2>&1; then
    log "no registry answers for $OFFICIAL_BASE: making $LOCAL_BASE with mmdebstrap"
    command -v mmdebstrap >/dev/null || apt_install mmdebstrap || { log "mmdebstrap is missing"; return 1; }
    local start=$SECONDS
    # The host's extra CA certificates (a TLS-inspecting proxy's) go in, so apt and pip in builds trust what
    # the host trusts; /etc/pip.conf points pip's own certifi at the system bundle. The hooks' $1 (the rootfs) is
    # mmdebstrap's to expand.
    # shellcheck disable=SC2016
    mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,python-is-python3,ca-certificates \
      --customize-hook='mkdir -p "$1/usr/local/share/ca-certificates"' \
      --customize-hook='for c in /usr/local/share/ca-certificates/*.crt; do [ -e "$c" ] && cp "$c" "$1/usr/local/share/ca-certificates/"; done; true' \
      --customize-hook='chroot "$1" update-ca-certificates >/dev/null' \
      --customize-hook='printf "[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n" > "$1/etc/pip.conf"' \
      bookworm "$CACHE/base.tar"
    "$tool" import -q --change 'CMD ["python3"]' "$CACHE/base.tar" "$LOCAL_BASE" >/dev/null
    rm -f "$CACHE/base.tar"
    log "$LOCAL_BASE made in $((SECONDS - start)) s"
  fi
  echo "$LOCAL_BASE"
}

# The CPU torch wheel for the trainer image, found as the host's pip finds it (its find-links or index).
torch_wheel() {
  local dir="$CACHE/wheels"
  if ! ls "$dir"/torch-2.13.0+cpu-cp311-*.whl >/dev/null 2>&1; then
    rm -rf "$dir"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 --implementation cp \
      --platform manylinux_2_28_x86_64 -d "$dir" "torch==2.13.0+cpu"
  fi
  echo "$dir"
}

build() {  # build TAG DOCKERFILE ARGS...: timed, sized
  local tool=$1 tag=$2 file=$3 start=$SECONDS
  shift 3
  local format=()
  [ "$tool" = podman ] && format=(--format docker)  # OCI format drops HEALTHCHECK
  "$tool" build "${format[@]}" -f "$file" -t "$tag" "$@" .
  local bytes
  bytes=$("$tool" image inspect --format '{{.Size}}' "$tag")
  log "$tag built in $((SECONDS - start)) s, $((bytes / 1000000)) MB"
}

images() {
  local tool base wheels
  tool=$(engine)
  [ "$tool" = podman ] && podman_env
  base=$(base_image "$tool")
  wheels=$(torch_wheel)
  build "$tool" "limen-env:$VERSION" Dockerfile.env --build-arg "PYTHON_IMAGE=$base"
  build "$tool" "limen-train:$VERSION-cpu" Dockerfile.train --build-arg "PYTHON_IMAGE=$base" --build-arg TORCH=cpu \
    --build-context "wheels=$wheels"
}

case "${1:-}" in
  engine) engine ;;
  images) images ;;
  base) tool=$(engine); [ "$tool" = podman ] && podman_env; base_image "$tool" ;;
  *) echo "usage: $0 engine|base|images" >&2; exit 2 ;;
esac
