# What the look-alike image scripts share (sourced, with REG set to the registry): a work
# directory, Debian's dynamic busybox, and make_image.
# shellcheck shell=bash
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
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
