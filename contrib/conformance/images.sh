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
# shellcheck source=contrib/conformance/lib.sh
. "$(dirname "$0")/lib.sh"

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
