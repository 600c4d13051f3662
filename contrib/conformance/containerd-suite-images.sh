#!/usr/bin/env bash
# Builds look-alikes of the images containerd's own CRI integration suite (`integration/` in
# containerd's source tree, v2.1 and v2.3) pulls, pushes them to a registry under
# <registry>/containerd/... and writes the suite's `-image-list` TOML naming them. The registry
# should be on 127.0.0.1 or localhost: some tests pull with containerd's client from the test
# process, which allows plain HTTP only there.
#
#   contrib/conformance/containerd-suite-images.sh <registry host:port> <image-list.toml>
#
# Needs what images.sh needs.
set -euo pipefail
REG=${1:?registry host:port}
LIST=${2:?image list file}
# shellcheck source=contrib/conformance/lib.sh
. "$(dirname "$0")/lib.sh"

gcc -static -O2 -o "$WORK/stress" "$HERE/stress.c"
gcc -static -Os -s -o "$WORK/pause" "$HERE/../../pause/pause.c"

# containerd's busybox: a `daemon` user, and root in `wheel` (its TestAdditionalGids reads
# `groups=0(root),10(wheel)`).
accounts() {
  echo 'daemon:x:1:1:daemon:/usr/sbin:/bin/false' >>"$1/etc/passwd"
  printf 'daemon:x:1:\nwheel:x:10:root\n' >>"$1/etc/group"
}
alpine() {
  accounts "$1"
  printf 'NAME="Alpine Linux"\nID=alpine\nVERSION_ID=3.14.0\n' >"$1/etc/os-release"
  # As in Alpine: /bin/sh is a symlink to busybox (an escape test follows it).
  rm -f "$1/bin/sh" && ln -s /bin/busybox "$1/bin/sh"
}
pause() { install -m 755 "$WORK/pause" "$1/pause"; }
stress() { accounts "$1" && install -m 755 "$WORK/stress" "$1/usr/local/bin/stress"; }
copy_up() {
  accounts "$1"
  mkdir -p "$1/test_dir" "$1/C:/weird_test_dir" "$1/:colon_prefixed"
  echo test_content >"$1/test_dir/test_file"
  echo test_content >"$1/C:/weird_test_dir/weird_test_file"
  echo test_content >"$1/:colon_prefixed/colon_prefixed_file"
}
ownership() {
  accounts "$1"
  mkdir -p "$1/test_dir"
  chown 65534:65534 "$1/test_dir"
}
nginx_image() {
  accounts "$1"
  cp "$WORK/nginx" "$1/usr/sbin/nginx"
}

C=containerd
make_image $C/busybox:1.36 accounts --config.cmd sh
make_image $C/alpine:3.14.0 alpine --config.cmd /bin/sh
for tag in 3.10 3.10.2; do
  make_image pause:$tag pause --config.entrypoint /pause
done
make_image e2e-test-images/resource-consumer:1.10 stress --config.cmd sleep \
  --config.cmd 1000000
make_image $C/volume-copy-up:2.2 copy_up --config.cmd sh --config.volume /test_dir \
  --config.volume C:/weird_test_dir --config.volume /:colon_prefixed
make_image $C/volume-ownership:2.1 ownership --config.cmd sleep --config.cmd 1000000 \
  --config.volume /test_dir
make_image $C/nginx:1.27.0 nginx_image --config.cmd nginx --config.cmd -g \
  --config.cmd "daemon off;"

cat >"$LIST" <<TOML
alpine = "$REG/$C/alpine:3.14.0"
busybox = "$REG/$C/busybox:1.36"
pause = "$REG/pause:3.10.2"
resourceconsumer = "$REG/e2e-test-images/resource-consumer:1.10"
volumecopyup = "$REG/$C/volume-copy-up:2.2"
volumeownership = "$REG/$C/volume-ownership:2.1"
nginx = "$REG/$C/nginx:1.27.0"
TOML
echo "the image list is $LIST"
