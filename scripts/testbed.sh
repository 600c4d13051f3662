#!/usr/bin/env bash
# The integration test bed: Debian packages, the test images, a loopback registry and a
# private containerd (own root, state and socket, its built-in CRI plugin disabled).
#
#   scripts/testbed.sh deps     install the packages the build and the tests need
#   scripts/testbed.sh up       start the registry and containerd, build and push the images
#   scripts/testbed.sh down     stop what `up` started and clean its mounts
#   scripts/testbed.sh env      print the environment the integration tests read
#   scripts/testbed.sh test     all of the above around fmt, clippy and every test
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
TB=${CRIUS_TESTBED:-$ROOT/.testbed}
REGISTRY_ADDR=${CRIUS_TEST_REGISTRY:-127.0.0.1:5010}
CTRD_DIR=$TB/containerd
CTRD_SOCK=$CTRD_DIR/containerd.sock

PACKAGES=(
  containerd runc containernetworking-plugins protobuf-compiler docker-registry skopeo
  umoci busybox-static iproute2 iptables curl ca-certificates
)

log() { printf '[testbed] %s\n' "$*" >&2; }

deps() {
  local missing=() p
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if ((${#missing[@]})); then
    log "installing ${missing[*]}"
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
  fi
  # The Debian packages may start their own services; the test bed runs its own copies.
  command -v cargo >/dev/null || { log "cargo is required"; exit 1; }
}

wait_for() { # description, tries (0.1 s each), command...
  local what=$1 tries=$2
  shift 2
  for ((i = 0; i < tries; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.1
  done
  log "timed out waiting for $what"
  return 1
}

registry_up() {
  mkdir -p "$TB/registry/data"
  cat >"$TB/registry/config.yml" <<YAML
version: 0.1
log:
  level: warn
  accesslog:
    disabled: false
storage:
  filesystem:
    rootdirectory: $TB/registry/data
  delete:
    enabled: true
http:
  addr: $REGISTRY_ADDR
YAML
  docker-registry serve "$TB/registry/config.yml" >"$TB/registry/log" 2>&1 &
  echo $! >"$TB/registry/pid"
  wait_for "registry on $REGISTRY_ADDR" 100 curl -fsS "http://$REGISTRY_ADDR/v2/"
  log "registry on $REGISTRY_ADDR"
}

containerd_up() {
  mkdir -p "$CTRD_DIR"
  cat >"$CTRD_DIR/config.toml" <<TOML
version = 2
root = "$CTRD_DIR/root"
state = "$CTRD_DIR/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$CTRD_SOCK"
[ttrpc]
  address = "$CTRD_SOCK.ttrpc"
[debug]
  level = "info"
[plugins."io.containerd.gc.v1.scheduler"]
  deletion_threshold = 0
TOML
  containerd --config "$CTRD_DIR/config.toml" >"$CTRD_DIR/log" 2>&1 &
  echo $! >"$CTRD_DIR/pid"
  wait_for "containerd at $CTRD_SOCK" 200 ctr --address "$CTRD_SOCK" --connect-timeout 1s version
  log "containerd at $CTRD_SOCK"
}

# A busybox image built from Debian's busybox-static with umoci, pushed with skopeo.
# $1: tag, then umoci config arguments.
push_busybox_image() {
  local tag=$1
  shift
  local layout=$TB/images/oci bundle=$TB/images/bundle-$tag
  [ -d "$layout" ] || umoci init --layout "$layout"
  umoci new --image "$layout:$tag"
  umoci unpack --image "$layout:$tag" "$bundle" >/dev/null
  local rootfs=$bundle/rootfs
  mkdir -p "$rootfs"/{bin,etc,tmp,root,home/user,var/www}
  chmod 1777 "$rootfs/tmp"
  cp /bin/busybox "$rootfs/bin/busybox"
  local applet
  for applet in $(/bin/busybox --list); do
    [ "$applet" = busybox ] || ln -sf busybox "$rootfs/bin/$applet"
  done
  cat >"$rootfs/etc/passwd" <<PASSWD
root:x:0:0:root:/root:/bin/sh
user:x:1000:1000:user:/home/user:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
PASSWD
  cat >"$rootfs/etc/group" <<GROUP
root:x:0:
users:x:100:user
user:x:1000:
nogroup:x:65534:
GROUP
  echo '<h1>crius test page</h1>' >"$rootfs/var/www/index.html"
  umoci repack --image "$layout:$tag" "$bundle" >/dev/null
  umoci config --image "$layout:$tag" --os linux --architecture amd64 \
    --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@"
  skopeo copy --quiet --dest-tls-verify=false "oci:$layout:$tag" "docker://$REGISTRY_ADDR/$tag"
  rm -rf "$bundle"
}

images_up() {
  rm -rf "$TB/images"
  mkdir -p "$TB/images"
  push_busybox_image busybox:latest --config.cmd sh
  push_busybox_image busybox-user:1000 --config.cmd sh --config.user 1000
  push_busybox_image busybox-user:nobody --config.cmd sh --config.user nobody
  log "test images pushed to $REGISTRY_ADDR"
}

up() {
  mkdir -p "$TB"
  registry_up
  images_up
  containerd_up
}

stop_pidfile() {
  local pidfile=$1 pid
  [ -f "$pidfile" ] || return 0
  pid=$(cat "$pidfile")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$pidfile"
}

down() {
  # Shims the tests left behind belong to this containerd: they name its socket.
  pkill -9 -f "containerd-shim.*-address $CTRD_SOCK" 2>/dev/null || true
  stop_pidfile "$CTRD_DIR/pid"
  stop_pidfile "$TB/registry/pid"
  # Snapshot and shm mounts below the test bed would keep its files busy.
  local m
  for m in $(awk -v tb="$TB/" 'index($2, tb) == 1 {print $2}' /proc/mounts | sort -r); do
    umount -l "$m" 2>/dev/null || true
  done
  rm -rf "$CTRD_DIR"
  log "stopped"
}

print_env() {
  echo "export CRIUS_TEST_CONTAINERD_ADDRESS=$CTRD_SOCK"
  echo "export CRIUS_TEST_CONTAINERD_ROOT=$CTRD_DIR/root"
  echo "export CRIUS_TEST_REGISTRY=$REGISTRY_ADDR"
}

run_tests() {
  deps
  cd "$ROOT"
  cargo fmt --check
  cargo clippy --all-targets -- -D warnings
  cargo build --all-targets
  down
  trap down EXIT
  up
  eval "$(print_env)"
  cargo test --all-targets
}

case "${1:-}" in
  deps) deps ;;
  up) up ;;
  down) down ;;
  env) print_env ;;
  test) run_tests ;;
  *) echo "usage: $0 deps|up|down|env|test" >&2; exit 2 ;;
esac
