#!/usr/bin/env bash
# The integration test bed: Debian packages, the test images, two loopback registries (one
# open, one behind htpasswd) and a private containerd (own root, state and socket, its
# built-in CRI plugin disabled).
#
#   scripts/testbed.sh deps     install the packages the build and the tests need
#   scripts/testbed.sh up       start the registries and containerd, build and push the images
#   scripts/testbed.sh down     stop what `up` started and clean its mounts
#   scripts/testbed.sh env      print the environment the integration tests read
#   scripts/testbed.sh test     all of the above around fmt, clippy and every test
#   scripts/testbed.sh bench    the comparison table against containerd's CRI (`bench all`: every benchmark)
#   scripts/testbed.sh cri-containerd   (after up) containerd with its own CRI, for comparing
#
# Two containerds run side by side: Debian bookworm's 1.6 (installed as a package) and 2.1
# from Debian sid, unpacked with dpkg -x under $TB/dist (never installed over 1.6). The
# tests run once against each; `env 2` prints the environment for the second.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
TB=${CRIUS_TESTBED:-$ROOT/.testbed}
# crius's shim, as scripts/build-shim.sh builds it: containerd finds it on its PATH.
SHIM_DIR=$ROOT/target/crius-shim
REGISTRY_ADDR=${CRIUS_TEST_REGISTRY:-127.0.0.1:5010}
AUTH_REGISTRY_ADDR=${CRIUS_TEST_AUTH_REGISTRY:-127.0.0.1:5011}
AUTH_USER=crius
AUTH_PASSWORD=s3cret
CTRD_DIR=$TB/containerd
CTRD_SOCK=$CTRD_DIR/containerd.sock
CTRD2_DIR=$TB/containerd2
CTRD2_SOCK=$CTRD2_DIR/containerd.sock
# containerd 2.x from Debian sid: this version if the mirror still has it, else sid's own.
CTRD2_PIN=2.1.9+ds1-5
DIST=$TB/dist
# The containerd 2.x binaries (containerd, ctr, containerd-shim-runc-v2): sid's package,
# or any other 2.x build's directory (CRIUS_CONTAINERD2_BIN), such as 2.3.x built from
# containerd's source.
CTRD2_BIN=${CRIUS_CONTAINERD2_BIN:-$DIST/containerd2/usr/bin}
CRI_CTRD_DIR=$TB/cri-containerd
CRI_CTRD_SOCK=$CRI_CTRD_DIR/containerd.sock
LAYOUT=$TB/images/oci

PACKAGES=(
  containerd runc containernetworking-plugins protobuf-compiler docker-registry skopeo
  umoci busybox-static iproute2 iptables iputils-ping curl ca-certificates apache2-utils python3
  criu systemd zstd
)

log() { printf '[testbed] %s\n' "$*" >&2; }

# What the tests make on the host, by name: the bridges of their networks (crius's
# `criust<tag>`, containerd's CRI's `cricd<tag>0`, the CNI client's `cricni<tag>`, the
# interfaces that hold a subnet in a test's way `criushold<tag>`, the benchmark's
# `cribench0`), the CNI network names in their iptables rules' comments, and the
# directories of the crius processes they start.
TEST_BRIDGES_RE='^(criust[0-9]+|cricd[0-9]+0|cricni[0-9]+|criushold[0-9]+|cribench0)$'
TEST_NETWORKS_RE='(crius-test-[0-9]+|cricd[0-9]+|cni-test-[0-9]+|cri-bench)'
TEST_DIRS=${TMPDIR:-/tmp}/crius-

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

# $1: name (its directory under the test bed), $2: address, $3: extra config YAML.
registry_up() {
  local name=$1 addr=$2 extra=${3:-}
  local dir=$TB/$name
  mkdir -p "$dir/data"
  cat >"$dir/config.yml" <<YAML
version: 0.1
log:
  level: warn
  accesslog:
    disabled: false
storage:
  filesystem:
    rootdirectory: $dir/data
  delete:
    enabled: true
http:
  addr: $addr
$extra
YAML
  docker-registry serve "$dir/config.yml" >"$dir/log" 2>&1 &
  echo $! >"$dir/pid"
  wait_for "$name on $addr" 100 curl -sS -o /dev/null "http://$addr/v2/"
  log "$name on $addr"
}

# containerd 2.x: Debian sid's package, fetched through a private sources list and unpacked
# (its runc is a separate package, so bookworm's runc stays the one on the PATH).
fetch_containerd2() {
  if [ -n "${CRIUS_CONTAINERD2_BIN:-}" ]; then
    "$CTRD2_BIN/containerd" --version | grep -q ' v\?2\.' || {
      log "CRIUS_CONTAINERD2_BIN=$CRIUS_CONTAINERD2_BIN holds no containerd 2.x"
      return 1
    }
    return 0
  fi
  [ -x "$CTRD2_BIN/containerd" ] && return 0
  local apt=$DIST/apt
  mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/sources" "$DIST/debs"
  cat >"$apt/sources/sid.sources" <<SOURCES
Types: deb
URIs: http://deb.debian.org/debian
Suites: sid
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
  local opts=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$apt/sources"
    -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache" -o Debug::NoLocking=1
    -o APT::Sandbox::User=root)
  log "fetching containerd 2.x from Debian sid"
  apt-get "${opts[@]}" update >"$apt/update.log" 2>&1 || { cat "$apt/update.log" >&2; return 1; }
  (cd "$DIST/debs" && { apt-get "${opts[@]}" download "containerd=$CTRD2_PIN" 2>/dev/null ||
    apt-get "${opts[@]}" download containerd; })
  rm -rf "$DIST/containerd2"
  dpkg -x "$DIST"/debs/containerd_*.deb "$DIST/containerd2"
  "$CTRD2_BIN/containerd" --version | grep -q ' v\?2\.' || {
    log "sid's containerd is not 2.x: $("$CTRD2_BIN/containerd" --version)"
    return 1
  }
  log "unpacked $("$CTRD2_BIN/containerd" --version)"
}

# The test bridges on the host.
test_bridges() {
  ip -o link show type bridge 2>/dev/null | awk -F': ' '{sub(/@.*/, "", $2); print $2}' |
    grep -E "$TEST_BRIDGES_RE" || true
}

# iptables rules of the test networks (CNI plugins name the network in each rule's comment).
# $1: table.
test_iptables_rules() {
  iptables-save -t "$1" 2>/dev/null | grep -E '^-A .*name: \\"'"$TEST_NETWORKS_RE" || true
}

# Deletes the test networks' rules and the per-pod CNI- chains they jump to (never portmap's
# shared CNI-HOSTPORT- chains), in one iptables-restore per table.
clear_test_iptables() {
  local table rules chains
  for table in nat filter; do
    rules=$(test_iptables_rules "$table")
    [ -n "$rules" ] || continue
    chains=$(printf '%s\n' "$rules" | awk '{for (i = 1; i < NF; i++) if ($i == "-j" &&
      $(i + 1) ~ /^CNI-/ && $(i + 1) !~ /^CNI-HOSTPORT-/) print $(i + 1)}' | sort -u)
    {
      echo "*$table"
      printf '%s\n' "$rules" | awk -v chains=" $(echo $chains) " \
        'index(chains, " " $2 " ") == 0 {sub(/^-A /, "-D "); print}'
      for c in $chains; do echo "-F $c"; done
      for c in $chains; do echo "-X $c"; done
      echo COMMIT
    } | iptables-restore --noflush -w || log "could not remove the test networks' $table rules"
  done
}

# The directories of crius processes the tests started against this test bed (their config
# names the test bed's containerds).
test_dirs() {
  local dir
  for dir in "$TEST_DIRS"*/; do
    [ -f "$dir/config.toml" ] && grep -qF "$TB/" "$dir/config.toml" && echo "${dir%/}"
  done
  return 0
}

# The network namespaces of the test pods in the test directories.
test_netns() {
  local dir note
  for dir in $(test_dirs); do
    for note in "$dir"/root/sandboxes/*/netns; do
      [ -f "$note" ] && [ -e "$(cat "$note")" ] && cat "$note"
    done
  done
  return 0
}

# What an earlier run of the test bed left on the host when it was killed midway, or what
# this run's tests left: crius processes, the pods' network namespaces, mounts and
# directories of the tests, bridges, iptables rules and pod log directories. Prints what it
# clears, one line each; the registries, containerds and shims are `down`'s.
clear_test_leftovers() {
  local pids dir ns m br
  pids=$(pgrep -f "^$ROOT/target/[a-z0-9_/-]*/crius --config $TEST_DIRS" || true)
  for pid in $pids; do echo "crius process $pid"; kill -9 "$pid" 2>/dev/null || true; done
  for ns in $(test_netns); do
    echo "network namespace $ns"
    umount -l "$ns" 2>/dev/null || true
    rm -f "$ns"
  done
  for dir in $(test_dirs); do
    for m in $(awk -v d="$dir/" 'index($2, d) == 1 {print $2}' /proc/mounts | sort -r); do
      echo "mount $m"
      umount -l "$m" 2>/dev/null || true
    done
    echo "test directory $dir"
    rm -rf "$dir"
  done
  for br in $(test_bridges); do
    echo "bridge $br"
    ip link del "$br" 2>/dev/null || true
  done
  local rules
  rules=$( (test_iptables_rules nat; test_iptables_rules filter) | wc -l)
  if [ "$rules" -gt 0 ]; then
    echo "$rules iptables rules of test networks"
    clear_test_iptables
  fi
  rm -rf "${TMPDIR:-/tmp}/crius-test-logs"
}

# Before anything starts: clear what an earlier run left, and say what on the host that is
# not the test bed's is in its way.
preflight() {
  local left
  left=$(clear_test_leftovers)
  [ -z "$left" ] || log "cleared what an earlier run left: $(echo "$left" | paste -sd, - | sed 's/,/, /g')"
  local addr port owner
  for addr in "$REGISTRY_ADDR" "$AUTH_REGISTRY_ADDR"; do
    port=${addr##*:}
    owner=$(ss -Hltnp "sport = :$port" 2>/dev/null | grep -o 'users:(([^)]*' | head -n 1 || true)
    if [ -n "$owner" ]; then
      log "port $port (for the test registry $addr) is taken: ${owner#users:((}"
      log "stop that program, or run with CRIUS_TEST_REGISTRY / CRIUS_TEST_AUTH_REGISTRY set to free loopback addresses"
      exit 1
    fi
  done
  # A containerd or CNI configuration of the host's own is left alone: the test bed runs its
  # own containerds on their own sockets, and every test its own CNI conf dir.
}

# The pod network namespaces on the host (crius and containerd's CRI pin them alike).
pod_netns() {
  ls /var/run/netns 2>/dev/null | grep '^cni-' || true
}

# After the tests: anything of theirs still on the host is a leak. It is cleared, and fails
# the run. $1: the pod network namespaces there were before the tests.
leak_check() {
  local left ns
  left=$(clear_test_leftovers)
  for ns in $(comm -13 <(echo "$1" | sort) <(pod_netns | sort)); do
    left+=$'\n'"network namespace /var/run/netns/$ns"
    umount -l "/var/run/netns/$ns" 2>/dev/null || true
    rm -f "/var/run/netns/$ns"
  done
  left=$(echo "$left" | sed '/^$/d')
  if [ -n "$left" ]; then
    log "the tests left on the host (now cleared):"
    echo "$left" | sed 's/^/  /' >&2
    return 1
  fi
  log "the tests left nothing on the host"
}

# $1: its directory, $2: the directory of its binaries (empty: the installed ones).
containerd_up() {
  local dir=$1 bin=${2:-} sock=$1/containerd.sock path=$SHIM_DIR:$PATH
  [ -z "$bin" ] || path=$bin:$path
  mkdir -p "$dir"
  cat >"$dir/config.toml" <<TOML
version = 2
root = "$dir/root"
state = "$dir/state"
# crius serves the CRI: containerd's own CRI plugins (one in 1.x, three in 2.x) stay off.
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images"]
[grpc]
  address = "$sock"
[ttrpc]
  address = "$sock.ttrpc"
[debug]
  level = "info"
[plugins."io.containerd.gc.v1.scheduler"]
  deletion_threshold = 0
TOML
  # Its shims are found on the PATH, so 2.x runs its own shim.
  PATH=$path containerd --config "$dir/config.toml" >"$dir/log" 2>&1 &
  echo $! >"$dir/pid"
  wait_for "containerd at $sock" 200 env PATH="$path" ctr --address "$sock" --connect-timeout 1s version
  log "$(PATH=$path containerd --version) at $sock"
}

# A busybox image built from Debian's busybox-static with umoci, pushed with skopeo.
# $1: tag, then umoci config arguments.
push_busybox_image() {
  local tag=$1
  shift
  local bundle=$TB/images/bundle-$tag
  [ -d "$LAYOUT" ] || umoci init --layout "$LAYOUT"
  umoci new --image "$LAYOUT:$tag"
  umoci unpack --image "$LAYOUT:$tag" "$bundle" >/dev/null
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
daemon:x:1:1:daemon:/usr/sbin:/bin/false
user:x:1000:1000:user:/home/user:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
PASSWD
  cat >"$rootfs/etc/group" <<GROUP
root:x:0:
daemon:x:1:
wheel:x:10:root
users:x:100:user
user:x:1000:
nogroup:x:65534:
GROUP
  echo '<h1>crius test page</h1>' >"$rootfs/var/www/index.html"
  umoci repack --image "$LAYOUT:$tag" "$bundle" >/dev/null
  umoci config --image "$LAYOUT:$tag" --os linux --architecture amd64 \
    --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@"
  skopeo copy --quiet --dest-tls-verify=false "oci:$LAYOUT:$tag" "docker://$REGISTRY_ADDR/$tag"
  rm -rf "$bundle"
}

# An image index for linux/amd64 and linux/arm64 (the arm64 entry differs in its config).
push_multiarch_image() {
  umoci tag --image "$LAYOUT:busybox:latest" busybox-arm64
  umoci config --image "$LAYOUT:busybox-arm64" --architecture arm64
  python3 - "$LAYOUT" <<'PY'
import hashlib, json, os, sys
layout = sys.argv[1]
with open(os.path.join(layout, "index.json")) as f:
    top = json.load(f)
def by_ref(name):
    return next(m for m in top["manifests"]
                if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == name)
manifests = []
for ref, arch in (("busybox:latest", "amd64"), ("busybox-arm64", "arm64")):
    d = dict(by_ref(ref))
    d.pop("annotations", None)
    d["platform"] = {"architecture": arch, "os": "linux"}
    manifests.append(d)
index = json.dumps({"schemaVersion": 2,
                    "mediaType": "application/vnd.oci.image.index.v1+json",
                    "manifests": manifests}).encode()
digest = hashlib.sha256(index).hexdigest()
with open(os.path.join(layout, "blobs", "sha256", digest), "wb") as f:
    f.write(index)
top["manifests"].append({"mediaType": "application/vnd.oci.image.index.v1+json",
                         "digest": "sha256:" + digest, "size": len(index),
                         "annotations": {"org.opencontainers.image.ref.name": "multiarch"}})
with open(os.path.join(layout, "index.json"), "w") as f:
    json.dump(top, f)
PY
  skopeo copy --quiet --all --dest-tls-verify=false "oci:$LAYOUT:multiarch" \
    "docker://$REGISTRY_ADDR/multiarch:latest"
}

# A data-only image of two layers for image volumes: the second adds a file and deletes
# one of the first, and the first has symlinks that point out of the image.
push_volume_image() {
  local tag=volume:latest bundle=$TB/images/bundle-volume
  umoci new --image "$LAYOUT:$tag"
  umoci unpack --image "$LAYOUT:$tag" "$bundle" >/dev/null
  local rootfs=$bundle/rootfs
  mkdir -p "$rootfs/data/dir" "$rootfs/etc"
  echo 'layer one' >"$rootfs/data/one.txt"
  echo 'nested' >"$rootfs/data/dir/nested.txt"
  echo 'to be deleted' >"$rootfs/data/gone.txt"
  echo 'image etc' >"$rootfs/etc/marker"
  echo 'a file' >"$rootfs/file.txt"
  ln -s /etc "$rootfs/data/abs-link"
  ln -s ../../../../.. "$rootfs/data/up-link"
  umoci repack --image "$LAYOUT:$tag" "$bundle" >/dev/null
  rm -rf "$bundle"
  umoci unpack --image "$LAYOUT:$tag" "$bundle" >/dev/null
  echo 'layer two' >"$bundle/rootfs/data/two.txt"
  rm "$bundle/rootfs/data/gone.txt"
  umoci repack --image "$LAYOUT:$tag" "$bundle" >/dev/null
  rm -rf "$bundle"
  umoci config --image "$LAYOUT:$tag" --os linux --architecture amd64
  skopeo copy --quiet --dest-tls-verify=false "oci:$LAYOUT:$tag" "docker://$REGISTRY_ADDR/$tag"
}

# busybox with volumes in its config: /data/db (owned by 65534, seeded), /var/log/app
# (mode 0750, seeded), /empty (nothing in the image) and two odd but legal names.
push_declared_volumes_image() {
  local tag=declared-volumes:latest bundle=$TB/images/bundle-declared-volumes
  umoci tag --image "$LAYOUT:busybox:latest" "$tag"
  umoci unpack --image "$LAYOUT:$tag" "$bundle" >/dev/null
  local rootfs=$bundle/rootfs
  mkdir -p "$rootfs/data/db/nested" "$rootfs/var/log/app"
  echo 'seeded by the image' >"$rootfs/data/db/seed.txt"
  echo 'deeper' >"$rootfs/data/db/nested/deep.txt"
  ln -s seed.txt "$rootfs/data/db/link"
  chown -R 65534:65534 "$rootfs/data/db"
  echo 'app log' >"$rootfs/var/log/app/app.log"
  chmod 0750 "$rootfs/var/log/app"
  umoci repack --image "$LAYOUT:$tag" "$bundle" >/dev/null
  rm -rf "$bundle"
  umoci config --image "$LAYOUT:$tag" --config.volume /data/db --config.volume /var/log/app \
    --config.volume /empty --config.volume /:colon_prefixed --config.volume C:/weird_test_dir
  skopeo copy --quiet --dest-tls-verify=false "oci:$LAYOUT:$tag" "docker://$REGISTRY_ADDR/$tag"
}

# busybox variants whose account files attack whoever reads them: /etc/passwd a symlink to
# a host path (with a user only that host file has), /etc/group a symlink to /dev/zero, a
# FIFO, or larger than crius reads.
push_hostile_account_images() {
  local variant
  for variant in hostlink devzero fifo huge; do
    local tag=hostile-accounts:$variant bundle=$TB/images/bundle-hostile-$variant
    rm -rf "$bundle"
    umoci tag --image "$LAYOUT:busybox:latest" "$tag"
    umoci unpack --image "$LAYOUT:$tag" "$bundle" >/dev/null
    local etc=$bundle/rootfs/etc
    local user=()
    case $variant in
      hostlink)
        rm "$etc/passwd"
        ln -s /etc/crius-test-host-passwd "$etc/passwd"
        user=(--config.user hostonly)
        ;;
      devzero) rm "$etc/group" && ln -s /dev/zero "$etc/group" ;;
      fifo) rm "$etc/group" && mkfifo "$etc/group" ;;
      huge) python3 -c "print('group:x:4242:member\n' * 300000, end='')" >"$etc/group" ;;
    esac
    umoci repack --image "$LAYOUT:$tag" "$bundle" >/dev/null
    rm -rf "$bundle"
    umoci config --image "$LAYOUT:$tag" "${user[@]}"
    skopeo copy --quiet --dest-tls-verify=false "oci:$LAYOUT:$tag" "docker://$REGISTRY_ADDR/$tag"
  done
}

# A 50 MB image of five layers of incompressible data, for the pull benchmark.
push_big_image() {
  local tag=big:latest bundle=$TB/images/bundle-big
  [ -d "$LAYOUT" ] || umoci init --layout "$LAYOUT"
  umoci new --image "$LAYOUT:$tag"
  local i
  for i in 1 2 3 4 5; do
    rm -rf "$bundle"
    umoci unpack --image "$LAYOUT:$tag" "$bundle" >/dev/null
    mkdir -p "$bundle/rootfs/data"
    head -c 10M /dev/urandom >"$bundle/rootfs/data/layer$i"
    umoci repack --image "$LAYOUT:$tag" "$bundle" >/dev/null
  done
  rm -rf "$bundle"
  umoci config --image "$LAYOUT:$tag" --os linux --architecture amd64 --config.cmd /bin/true
  skopeo copy --quiet --dest-tls-verify=false "oci:$LAYOUT:$tag" "docker://$REGISTRY_ADDR/bench/big:latest"
  log "pushed $REGISTRY_ADDR/bench/big:latest"
}

# A many-layer image (scripts/layered-image.py) as <repo>:gzip and <repo>:zstd. Its layout
# is kept under $TB/cache across test beds: the benchmark's 1.1 GiB one takes a minute to
# make.
push_layered_image() {
  local name=$1 scale=$2 repo=$3 layout kind
  # Made again when the script changes.
  layout=$TB/cache/layered-$name-$scale-$(md5sum <"$ROOT/scripts/layered-image.py" | cut -c1-8)
  if [ ! -f "$layout/index.json" ]; then
    rm -rf "$layout.tmp"
    mkdir -p "$TB/cache"
    python3 "$ROOT/scripts/layered-image.py" "$layout.tmp" "$name" "$scale" >&2
    mv "$layout.tmp" "$layout"
  fi
  for kind in gzip zstd; do
    skopeo copy --quiet --dest-tls-verify=false "oci:$layout:$name-$kind" \
      "docker://$REGISTRY_ADDR/$repo:$kind"
  done
  log "pushed $REGISTRY_ADDR/$repo:gzip and :zstd"
}

# crius's pause program as a registry image, so that crius and containerd's built-in CRI
# run the same sandbox in the lifecycle benchmark.
push_pause_image() {
  local tag=pause:bench bundle=$TB/images/bundle-pause
  [ -d "$LAYOUT" ] || umoci init --layout "$LAYOUT"
  umoci new --image "$LAYOUT:$tag"
  umoci unpack --image "$LAYOUT:$tag" "$bundle" >/dev/null
  cc -static -Os -s -o "$bundle/rootfs/pause" "$ROOT/pause/pause.c"
  umoci repack --image "$LAYOUT:$tag" "$bundle" >/dev/null
  umoci config --image "$LAYOUT:$tag" --os linux --architecture amd64 --config.entrypoint /pause
  skopeo copy --quiet --dest-tls-verify=false "oci:$LAYOUT:$tag" "docker://$REGISTRY_ADDR/bench/pause:1"
  rm -rf "$bundle"
  log "pushed $REGISTRY_ADDR/bench/pause:1"
}

# containerd with its own CRI plugin, for the comparison benchmark. $1: which containerd
# (1: bookworm's 1.6, config version 2; 2: the 2.x binaries, config version 3, where the CRI
# is split into an images and a runtime plugin).
cri_containerd_up() {
  local which=${1:-1} dir=$CRI_CTRD_DIR bin=containerd path=$PATH
  if [ "$which" = 2 ]; then
    bin=$CTRD2_BIN/containerd
    path=$CTRD2_BIN:$PATH
  fi
  # As crius's "auto": where the OOM score may not be lowered (no CAP_SYS_RESOURCE, as in
  # a container), keep the pause container's at containerd's own.
  local restrict
  restrict=$(if capsh --has-p=cap_sys_resource 2>/dev/null; then echo false; else echo true; fi)
  mkdir -p "$dir/net.d" "$dir/certs.d/$REGISTRY_ADDR"
  cat >"$dir/net.d/10-bench.conflist" <<JSON
{"cniVersion": "1.0.0", "name": "cri-bench",
 "plugins": [{"type": "bridge", "bridge": "cribench0", "isGateway": true, "ipMasq": true,
              "ipam": {"type": "host-local", "dataDir": "$dir/ipam",
                       "ranges": [[{"subnet": "198.19.251.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
             {"type": "portmap", "capabilities": {"portMappings": true}}]}
JSON
  cat >"$dir/certs.d/$REGISTRY_ADDR/hosts.toml" <<TOML
server = "http://$REGISTRY_ADDR"

[host."http://$REGISTRY_ADDR"]
  capabilities = ["pull", "resolve"]
TOML
  # Two containerds must not share NRI's socket: the test bed's own 2.x runs beside this one.
  local version=2
  [ "$which" = 1 ] || version=3
  cat >"$dir/config.toml" <<TOML
version = $version
root = "$dir/root"
state = "$dir/state"
disabled_plugins = ["io.containerd.nri.v1.nri"]
[grpc]
  address = "$CRI_CTRD_SOCK"
[ttrpc]
  address = "$CRI_CTRD_SOCK.ttrpc"
TOML
  if [ "$which" = 2 ]; then
    cat >>"$dir/config.toml" <<TOML
[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "$REGISTRY_ADDR/bench/pause:1"
[plugins."io.containerd.cri.v1.images".registry]
  config_path = "$dir/certs.d"
[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = $restrict
[plugins."io.containerd.cri.v1.runtime".cni]
  bin_dirs = ["/usr/lib/cni"]
  conf_dir = "$dir/net.d"
TOML
    # CRIUS_BENCH_CTRD_UNPACKS: layers its pulls unpack at once (2.2+; 1, its default, is
    # one after the other), to compare crius's pulls with containerd's parallel unpack.
    if [ -n "${CRIUS_BENCH_CTRD_UNPACKS:-}" ]; then
      cat >>"$dir/config.toml" <<TOML
[plugins."io.containerd.transfer.v1.local"]
  max_concurrent_unpacks = $CRIUS_BENCH_CTRD_UNPACKS
TOML
    fi
  else
    cat >>"$dir/config.toml" <<TOML
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$REGISTRY_ADDR/bench/pause:1"
  restrict_oom_score_adj = $restrict
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$dir/net.d"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$dir/certs.d"
TOML
  fi
  PATH=$path "$bin" --config "$dir/config.toml" >"$dir/log" 2>&1 &
  echo $! >"$dir/pid"
  wait_for "containerd with CRI at $CRI_CTRD_SOCK" 200 env PATH="$path" ctr --address "$CRI_CTRD_SOCK" --connect-timeout 1s version
  log "$(PATH=$path "$bin" --version) with its CRI plugin at $CRI_CTRD_SOCK"
}

# Stops the containerd of cri_containerd_up, its pods' shims and its network, and removes
# its directory, so that the other containerd line can take its place.
cri_containerd_down() {
  kill_shims "containerd-shim.*-address $CRI_CTRD_SOCK"
  stop_pidfile "$CRI_CTRD_DIR/pid"
  ip link del cribench0 2>/dev/null || true
  local m
  for m in $(awk -v d="$CRI_CTRD_DIR/" 'index($2, d) == 1 {print $2}' /proc/mounts | sort -r); do
    umount -l "$m" 2>/dev/null || true
  done
  rm -rf "$CRI_CTRD_DIR"
}

images_up() {
  rm -rf "$TB/images"
  mkdir -p "$TB/images"
  push_busybox_image busybox:latest --config.cmd sh
  push_busybox_image busybox-user:1000 --config.cmd sh --config.user 1000
  push_busybox_image busybox-user:nobody --config.cmd sh --config.user nobody
  push_busybox_image busybox-entry:latest --config.entrypoint /bin/echo --config.cmd image-cmd \
    --config.stopsignal SIGUSR1
  push_multiarch_image
  push_volume_image
  push_declared_volumes_image
  push_hostile_account_images
  push_layered_image layered 0.002 test/layered
  # The sandbox image containerd's own CRI pulls in the tests that run pods inside it.
  push_pause_image
  skopeo copy --quiet --dest-tls-verify=false --dest-creds "$AUTH_USER:$AUTH_PASSWORD" \
    "oci:$LAYOUT:busybox:latest" "docker://$AUTH_REGISTRY_ADDR/private/busybox:latest"
  log "test images pushed to $REGISTRY_ADDR and $AUTH_REGISTRY_ADDR"
}

up() {
  mkdir -p "$TB/auth-registry"
  registry_up registry "$REGISTRY_ADDR"
  htpasswd -Bbn "$AUTH_USER" "$AUTH_PASSWORD" >"$TB/auth-registry/htpasswd"
  registry_up auth-registry "$AUTH_REGISTRY_ADDR" "auth:
  htpasswd:
    realm: crius-test
    path: $TB/auth-registry/htpasswd"
  images_up
  containerd_up "$CTRD_DIR"
  fetch_containerd2
  containerd_up "$CTRD2_DIR" "$CTRD2_BIN"
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

# Kills the shims matching $1 and, first, the containers they parent: without their shim
# those would run on, reparented to init.
kill_shims() {
  local shim
  for shim in $(pgrep -f "$1"); do
    pkill -9 -P "$shim" 2>/dev/null || true
    kill -9 "$shim" 2>/dev/null || true
  done
}

down() {
  # Shims the tests left behind belong to this containerd: they name its socket.
  kill_shims "containerd-shim.*-address $CTRD_SOCK"
  kill_shims "containerd-shim.*-address $CTRD2_SOCK"
  kill_shims "containerd-shim.*-address $CRI_CTRD_SOCK"
  stop_pidfile "$CRI_CTRD_DIR/pid"
  ip link del cribench0 2>/dev/null || true
  # Tests that restart containerd run their own under $TB/private.
  pkill -9 -f "containerd --config $TB/private/" 2>/dev/null || true
  kill_shims "containerd-shim.*-address $TB/private/"
  stop_pidfile "$CTRD_DIR/pid"
  stop_pidfile "$CTRD2_DIR/pid"
  stop_pidfile "$TB/registry/pid"
  stop_pidfile "$TB/auth-registry/pid"
  # Ones an interrupted or repeated `up` left without a pid file.
  pkill -f "containerd --config $CTRD_DIR/config.toml" 2>/dev/null || true
  pkill -f "containerd --config $CTRD2_DIR/config.toml" 2>/dev/null || true
  pkill -f "docker-registry serve $TB/" 2>/dev/null || true
  sleep 0.5
  # Snapshot and shm mounts below the test bed would keep its files busy.
  local m
  for m in $(awk -v tb="$TB/" 'index($2, tb) == 1 {print $2}' /proc/mounts | sort -r); do
    umount -l "$m" 2>/dev/null || true
  done
  rm -rf "$CTRD_DIR" "$CTRD2_DIR" "$CRI_CTRD_DIR" "$TB/registry" "$TB/auth-registry" "$TB/private"
  log "stopped"
}

# $1: which containerd the tests use: 1 (bookworm's 1.6, the default) or 2 (sid's 2.x).
print_env() {
  local dir=$CTRD_DIR name="containerd $(containerd --version | awk '{print $3}')"
  if [ "${1:-1}" = 2 ]; then
    dir=$CTRD2_DIR
    name="containerd $("$CTRD2_BIN/containerd" --version | awk '{print $3}')"
    # containerd, ctr and the shims the tests start come from the 2.x package.
    echo "export PATH=$CTRD2_BIN:\$PATH"
  fi
  # containerds the tests start themselves find crius's shim too.
  echo "export PATH=$SHIM_DIR:\$PATH"
  cat <<ENV
export CRIUS_TEST_CONTAINERD_ADDRESS=$dir/containerd.sock
export CRIUS_TEST_CONTAINERD_ROOT=$dir/root
export CRIUS_TEST_CONTAINERD_NAME="$name"
export CRIUS_TEST_REGISTRY=$REGISTRY_ADDR
export CRIUS_TEST_REGISTRY_LOG=$TB/registry/log
export CRIUS_TEST_AUTH_REGISTRY=$AUTH_REGISTRY_ADDR
export CRIUS_TEST_AUTH_CREDENTIALS=$AUTH_USER:$AUTH_PASSWORD
export CRIUS_TEST_IMAGES=$LAYOUT
ENV
}

# The integration tests against one containerd ($1: 1 or 2), in a subshell of their own.
test_against() {
  (
    eval "$(print_env "$1")"
    log "integration tests against $CRIUS_TEST_CONTAINERD_NAME"
    local rc=0
    if cargo test --features failpoints --test '*' --no-fail-fast; then
      log "passed against $CRIUS_TEST_CONTAINERD_NAME"
    else
      log "FAILED against $CRIUS_TEST_CONTAINERD_NAME (its log: ${CRIUS_TEST_CONTAINERD_ADDRESS%/*}/log)"
      rc=1
    fi
    # Containers a test left running would compete with the next run for the cores.
    local leftover
    leftover=$(pgrep -fc "containerd-shim.*-address $CRIUS_TEST_CONTAINERD_ADDRESS" || true)
    if [ "${leftover:-0}" -gt 0 ]; then
      log "killing $leftover shim(s) the tests left against $CRIUS_TEST_CONTAINERD_NAME"
      kill_shims "containerd-shim.*-address $CRIUS_TEST_CONTAINERD_ADDRESS"
    fi
    return $rc
  )
}

build_shim() {
  "$ROOT/scripts/build-shim.sh"
}

run_tests() {
  deps
  cd "$ROOT"
  # A build that runs out of disk fails with a bare compiler exit status: say what there was.
  log "free disk for the build: $(df -h --output=avail "$ROOT" | tail -n 1 | tr -d ' ')"
  cargo fmt --all --check
  # The integration tests drive crius through its failpoints; a release build has none.
  cargo clippy --all-targets --features failpoints -- -D warnings
  cargo clippy -p crius-shim -p crius-common -p crius-testkit --all-targets -- -D warnings
  cargo build --all-targets --features failpoints
  build_shim
  # Unit tests need no test bed; they run as the release binary is built (no failpoints).
  cargo test --lib --bins
  cargo test -p crius-shim -p crius-common
  # The shim as a plain `cargo build` links it (dynamically): a test shows it refuses pods.
  cargo build -p crius-shim
  down
  preflight
  trap down EXIT
  up
  local failed=() netns_before
  netns_before=$(pod_netns)
  test_against 1 || failed+=("containerd 1.6")
  test_against 2 || failed+=("containerd 2.x")
  leak_check "$netns_before" || failed+=("the leak check")
  if ((${#failed[@]})); then
    log "integration tests failed against: ${failed[*]}"
    return 1
  fi
}

# The soak (tests/soak.rs, ignored by `make test`): SOAK_MINUTES (default 10) beside each
# containerd of SOAK_CONTAINERDS (default "1 2": 1.6 and 2.x). Its summary goes to the log
# and to target/soak-summary-<containerd>.txt.
run_soak() {
  deps
  cd "$ROOT"
  cargo build --all-targets --features failpoints
  build_shim
  down
  preflight
  trap down EXIT
  up
  local failed=() which
  for which in ${SOAK_CONTAINERDS:-1 2}; do
    (
      eval "$(print_env "$which")"
      log "soak of ${SOAK_MINUTES:-10} min beside $CRIUS_TEST_CONTAINERD_NAME"
      rc=0
      SOAK_MINUTES=${SOAK_MINUTES:-10} cargo test --features failpoints --test soak -- \
        --ignored --nocapture || rc=1
      cp target/soak-summary.txt "target/soak-summary-$which.txt" 2>/dev/null || true
      cp target/soak-crius.log "target/soak-crius-$which.log" 2>/dev/null || true
      exit $rc
    ) || failed+=("containerd $which")
  done
  if ((${#failed[@]})); then
    log "the soak failed beside: ${failed[*]}"
    return 1
  fi
}

run_benches() {
  deps
  cd "$ROOT"
  build_shim
  # The benchmarks measure crius as `make release` links it (scripts/build-release.sh):
  # statically, for the host target only (the bench profile is the release profile).
  local target
  target="--target $(rustc -vV | sed -n 's/^host: //p')"
  export RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static"
  down
  preflight
  trap down EXIT
  up
  push_big_image
  [ "${1:-}" != all ] || push_layered_image huge 1 bench/huge
  # First, while the test bed's containerds hold nothing but the test images: the table of
  # every operation against containerd's CRI, crius beside each containerd line against that
  # line's own CRI (`make bench` stops after it). BENCH_CONTAINERDS="2" with
  # CRIUS_CONTAINERD2_BIN runs it beside another 2.x build only, such as 2.3 built by hand.
  local which failed=() all=${1:-}
  for which in ${BENCH_CONTAINERDS:-1 2}; do
    cri_containerd_up "$which"
    (
      eval "$(print_env "$which")"
      local dir=$CTRD_DIR
      [ "$which" = 1 ] || dir=$CTRD2_DIR
      export CRIUS_BENCH_CRI_CONTAINERD=$CRI_CTRD_SOCK CRIUS_BENCH_CONTAINERD_PID=$dir/pid
      export CRIUS_BENCH_CRI_CONTAINERD_PID=$CRI_CTRD_DIR/pid
      # shellcheck disable=SC2086 # $target is two words
      cargo bench $target --bench lifecycle
      # Cold pulls against the same CRI (`bench all`).
      # shellcheck disable=SC2086
      [ "$all" != all ] || cargo bench $target --bench pull
    ) || failed+=("containerd $which")
    cri_containerd_down
  done
  if ((${#failed[@]})); then
    log "the lifecycle benchmark failed beside: ${failed[*]}"
    return 1
  fi
  [ "${1:-}" = all ] || return 0
  eval "$(print_env 1)"
  # shellcheck disable=SC2086
  cargo bench $target --bench shim
  # shellcheck disable=SC2086
  cargo bench $target --bench stats
  # Inside containerd 2.x: its CRI's runc handler against crius's two modes and crius's CRI.
  # shellcheck disable=SC2086
  (eval "$(print_env 2)" && cargo bench $target --bench inside)
}

case "${1:-}" in
  deps) deps ;;
  up) down; preflight; up ;;
  down) down ;;
  env) print_env "${2:-1}" ;;
  test) run_tests ;;
  soak) run_soak ;;
  bench) run_benches "${2:-}" ;;
  big-image) push_big_image; push_layered_image huge 1 bench/huge ;;
  layered-image) push_layered_image "$2" "$3" "$4" ;;
  volume-image) push_volume_image; push_declared_volumes_image; push_hostile_account_images ;;
  cri-containerd) push_pause_image; cri_containerd_up "${2:-1}" ;;
  cri-containerd-down) cri_containerd_down ;;
  *) echo "usage: $0 deps|up|down|env|test|soak|bench|big-image|layered-image|volume-image|cri-containerd [1|2]|cri-containerd-down" >&2; exit 2 ;;
esac
