#!/usr/bin/env bash
# `make install`: the crius binary and its shim, the systemd unit, a default config and the
# default CNI network. The config and the network are written only where none exists, so a
# re-install never replaces an operator's files.
#
# Variables (the Makefile passes them): DESTDIR (a staging root), PREFIX (/usr/local),
# BINDIR ($PREFIX/bin), UNITDIR ($PREFIX/lib/systemd/system), SYSCONFDIR (/etc),
# CNI_CONF_DIR ($SYSCONFDIR/cni/net.d), PROFILE (release, or debug for what `make build`
# built), INSTALL_CNI (0: no default network). It installs what was built: `make release`
# first (as the user who builds, not root).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
DESTDIR=${DESTDIR:-}
PREFIX=${PREFIX:-/usr/local}
BINDIR=${BINDIR:-$PREFIX/bin}
UNITDIR=${UNITDIR:-$PREFIX/lib/systemd/system}
SYSCONFDIR=${SYSCONFDIR:-/etc}
CNI_CONF_DIR=${CNI_CONF_DIR:-$SYSCONFDIR/cni/net.d}
PROFILE=${PROFILE:-release}
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}

log() { printf '[install] %s\n' "$*" >&2; }

# The paths go into the unit through sed and into systemd's syntax: keep them plain.
for path in "$BINDIR" "$SYSCONFDIR" "$UNITDIR" "$CNI_CONF_DIR"; do
  case $path in
  /*) ;;
  *) log "install paths must be absolute: $path"; exit 1 ;;
  esac
  case $path in
  *[\|\&\ \'\"\$]* | *$'\n'*) log "install paths may not hold |, &, quotes, \$ or spaces: $path"; exit 1 ;;
  esac
done

# `make release` puts the shipped build (static, or dynamic with STATIC=0) apart.
if [ "$PROFILE" = release ]; then
  BIN=$TARGET_DIR/crius-release/crius
else
  BIN=$TARGET_DIR/$PROFILE/crius
fi
SHIM=$TARGET_DIR/crius-shim/containerd-shim-crius-v2
# The shim's exec helper: beside the shim, where the shim looks for it.
EXEC_HELPER=$TARGET_DIR/crius-shim/crius-exec-helper
for built in "$BIN" "$SHIM" "$EXEC_HELPER"; do
  if [ ! -x "$built" ]; then
    log "$built is missing: build it first (make release; make build shim for PROFILE=debug)"
    exit 1
  fi
done

# Each binary goes in under a temporary name and is renamed over the old one: a running
# shim that copies its exec helper meanwhile reads the old file or the new, never half of one.
install_binary() { # built, installed name
  install -D -m 0755 "$1" "$DESTDIR$BINDIR/.$2.new"
  mv -f "$DESTDIR$BINDIR/.$2.new" "$DESTDIR$BINDIR/$2"
}
install_binary "$BIN" crius
install_binary "$SHIM" containerd-shim-crius-v2
install_binary "$EXEC_HELPER" crius-exec-helper
log "installed crius, containerd-shim-crius-v2 and crius-exec-helper in $DESTDIR$BINDIR"

install -d -m 0755 "$DESTDIR$UNITDIR"
sed -e "s|@BINDIR@|$BINDIR|g" -e "s|@SYSCONFDIR@|$SYSCONFDIR|g" \
  "$ROOT/contrib/systemd/crius.service.in" >"$DESTDIR$UNITDIR/crius.service.tmp"
chmod 0644 "$DESTDIR$UNITDIR/crius.service.tmp"
mv -f "$DESTDIR$UNITDIR/crius.service.tmp" "$DESTDIR$UNITDIR/crius.service"
log "installed $DESTDIR$UNITDIR/crius.service"

config=$DESTDIR$SYSCONFDIR/crius/config.toml
if [ -e "$config" ] || [ -L "$config" ]; then
  log "kept the existing $config"
else
  install -d -m 0755 "$DESTDIR$SYSCONFDIR/crius"
  "$BIN" config default >"$config.tmp"
  chmod 0644 "$config.tmp"
  mv -f "$config.tmp" "$config"
  log "wrote the default config to $config"
fi

# The network kubelet's pods get when the node has none configured yet (crius reads the
# same files as containerd: *.conf, *.conflist, *.json). Named to sort last: crius loads the
# first network in name order, so a cluster network written later (10-flannel, 05-cilium,
# ...) takes over from it. INSTALL_CNI=0 skips it.
conf_dir=$DESTDIR$CNI_CONF_DIR
if [ "${INSTALL_CNI:-1}" = 0 ]; then
  log "not writing a default CNI network (INSTALL_CNI=0)"
elif compgen -G "$conf_dir/*.conf" >/dev/null || compgen -G "$conf_dir/*.conflist" >/dev/null ||
  compgen -G "$conf_dir/*.json" >/dev/null; then
  log "kept the CNI network(s) in $conf_dir"
else
  install -D -m 0644 "$ROOT/contrib/10-crius-bridge.conflist" "$conf_dir/99-crius-bridge.conflist"
  log "wrote a node-local bridge network (10.88.0.0/16) to $conf_dir/99-crius-bridge.conflist;" \
    "a cluster's CNI plugin writing its own network there replaces it"
fi

if [ -z "$DESTDIR" ]; then
  log "next: systemctl daemon-reload && systemctl enable --now crius"
fi
