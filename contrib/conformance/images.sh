#!/usr/bin/env bash
# Builds look-alikes of the images the CRI conformance suite (critest v1.26 and v1.36) pulls,
# pushes them to a registry and writes a hosts.toml directory that mirrors registry.k8s.io,
# k8s.gcr.io, gcr.io and public.ecr.aws to it. Point crius's `registry.config_path` at that
# directory.
#
#   contrib/conformance/images.sh <registry host:port> <hosts dir>
#
# Needs: gcc (static libc), umoci, skopeo, apt-get download (for Debian's dynamic busybox,
# whose sh runs applets through PATH as the upstream busybox image does).
set -euo pipefail
REG=${1:?registry host:port}
HOSTS=${2:?hosts.toml directory}
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
LAYOUT=$WORK/oci

(cd "$WORK" && apt-get download busybox >/dev/null && dpkg-deb -x busybox_*.deb "$WORK/bb")
gcc -static -O2 -o "$WORK/nginx" "$HERE/nginx.c"
gcc -static -O2 -o "$WORK/nnp" "$HERE/nnp.c"

base_rootfs() {
  local rootfs=$1 a
  mkdir -p "$rootfs"/{bin,etc,tmp,root,var/run,var/www,usr/sbin,usr/local/bin,usr/share/nginx/html}
  mkdir -p "$rootfs/lib/x86_64-linux-gnu" "$rootfs/lib64"
  chmod 1777 "$rootfs/tmp"
  cp "$WORK/bb/bin/busybox" "$rootfs/bin/busybox"
  cp /lib/x86_64-linux-gnu/libresolv.so.2 /lib/x86_64-linux-gnu/libc.so.6 \
    "$rootfs/lib/x86_64-linux-gnu/"
  cp /lib64/ld-linux-x86-64.so.2 "$rootfs/lib64/"
  # Hard links, as in the upstream image: masking /bin/ls must not mask busybox itself.
  for a in $("$rootfs/bin/busybox" --list); do
    [ "$a" = busybox ] || ln -f "$rootfs/bin/busybox" "$rootfs/bin/$a"
  done
  # Debian's busybox has neither ipcs nor pgrep: enough of them for the suite.
  cat >"$rootfs/bin/ipcs" <<'SH'
#!/bin/sh
cat /proc/sysvipc/shm
SH
  cat >"$rootfs/bin/pgrep" <<'SH'
#!/bin/sh
found=1
for d in /proc/[0-9]*; do
  read -r comm <"$d/comm" 2>/dev/null || continue
  case "$comm" in *"$1"*) echo "${d#/proc/}"; found=0 ;; esac
done
exit $found
SH
  chmod 755 "$rootfs/bin/ipcs" "$rootfs/bin/pgrep"
  cat >"$rootfs/etc/passwd" <<'P'
root:x:0:0:root:/root:/bin/sh
www-data:x:33:33:www-data:/var/www:/bin/sh
default-user:x:1000:1000:default:/tmp:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
P
  cat >"$rootfs/etc/group" <<'G'
root:x:0:
www-data:x:33:
default-user:x:1000:
group-defined-in-image:x:50000:default-user
nogroup:x:65534:
G
  echo '<h1>Welcome to nginx!</h1>' >"$rootfs/usr/share/nginx/html/index.html"
  echo '<h1>It works!</h1>' >"$rootfs/var/www/index.html"
}

# $1: repository:tag in the registry, $2: extra set-up, then umoci config arguments.
make_image() {
  local ref=$1 setup=$2 tag=img bundle=$WORK/bundle
  shift 2
  rm -rf "$bundle" "$LAYOUT"
  umoci init --layout "$LAYOUT"
  umoci new --image "$LAYOUT:$tag"
  umoci unpack --image "$LAYOUT:$tag" "$bundle" >/dev/null
  base_rootfs "$bundle/rootfs"
  $setup "$bundle/rootfs"
  umoci repack --image "$LAYOUT:$tag" "$bundle" >/dev/null
  umoci config --image "$LAYOUT:$tag" --os linux --architecture amd64 \
    --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@"
  skopeo copy --quiet --dest-tls-verify=false "oci:$LAYOUT:$tag" "docker://$REG/$ref"
  echo "pushed $REG/$ref"
}
plain() { :; }
nginx() { cp "$WORK/nginx" "$1/usr/sbin/nginx"; }
nnp() { install -m 4755 "$WORK/nnp" "$1/usr/local/bin/nnp"; }
marker1() { echo 1 >"$1/marker"; }
marker2() { echo 2 >"$1/marker"; }
marker3() { echo 3 >"$1/marker"; }

K=e2e-test-images
G=k8s-staging-cri-tools
NGINX_CMD=(--config.cmd nginx --config.cmd -g --config.cmd "daemon off;")
make_image $K/busybox:1.29-2 plain --config.cmd sh
make_image $K/nginx:1.14-2 nginx "${NGINX_CMD[@]}"
make_image $G/hostnet-nginx-amd64:latest nginx --config.env NGINX_PORT=12003 "${NGINX_CMD[@]}"
make_image $K/nonewprivs:1.3 nnp --config.cmd /usr/local/bin/nnp
# The suite looks for Apache's start-up line in the log.
make_image $K/httpd:2.4.39-4 plain --config.cmd sh --config.cmd -c --config.cmd \
  "echo \"AH00094: Command line: 'httpd -D FOREGROUND'\" >&2; exec httpd -f -p 80 -h /var/www"
make_image $G/test-image-user-uid:latest plain --config.cmd sh --config.user 1002
make_image $G/test-image-user-username:latest plain --config.cmd sh --config.user www-data
make_image $G/test-image-user-uid-group:latest plain --config.cmd sh --config.user 1003:1003
make_image $G/test-image-user-username-group:latest plain --config.cmd sh \
  --config.user www-data:www-data
make_image $G/test-image-predefined-group:latest plain --config.cmd sh --config.user default-user
make_image $G/test-image-latest:latest plain --config.cmd sh
make_image $G/test-image-tag:test plain --config.cmd sh
make_image $G/test-image-tag:all plain --config.cmd sh
make_image $G/test-image-1:latest marker1 --config.cmd sh
make_image $G/test-image-2:latest marker2 --config.cmd sh
make_image $G/test-image-3:latest marker3 --config.cmd sh
make_image $G/test-image-tags:1 plain --config.cmd sh
# v1.36 pulls one image under two registries' names (registry.k8s.io and k8s.gcr.io).
make_image pause:3.9 plain --config.cmd sh
for t in 2 3; do
  skopeo copy --quiet --src-tls-verify=false --dest-tls-verify=false \
    "docker://$REG/$G/test-image-tags:1" "docker://$REG/$G/test-image-tags:$t"
done

for host in registry.k8s.io k8s.gcr.io gcr.io public.ecr.aws; do
  mkdir -p "$HOSTS/$host"
  cat >"$HOSTS/$host/hosts.toml" <<TOML
server = "https://$host"

[host."http://$REG"]
  capabilities = ["pull", "resolve"]
TOML
done
echo "hosts.toml files for the mirrors are in $HOSTS"
