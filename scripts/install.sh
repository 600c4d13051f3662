#!/usr/bin/env bash
# `make install`: the crius binary and its shim, the systemd unit, a default config and the
# default CNI network. The config and the network are written only where none exists, so a
# re-install never replaces an operator's files.
#
# Variables (the Makefile passes them): DESTDIR (a staging root), PREFIX (/usr/local),
# BINDIR ($PREFIX/bin), UNITDIR ($PREFIX/lib/systemd/system), SYSCONFDIR (/etc),
# CNI_CONF_DIR ($SYSCONFDIR/cni/net.d), PROFILE (release, or debug for what `make build`
# built).
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

BIN=$TARGET_DIR/$PROFILE/crius
SHIM=$TARGET_DIR/crius-shim/containerd-shim-crius-v2
for built in "$BIN" "$SHIM"; do
  if [ ! -x "$built" ]; then
    log "$built is missing: build it first (make release, or make build shim for PROFILE=debug)"
    exit 1
  fi
done

install -D -m 0755 "$BIN" "$DESTDIR$BINDIR/crius"
install -D -m 0755 "$SHIM" "$DESTDIR$BINDIR/containerd-shim-crius-v2"
log "installed crius and containerd-shim-crius-v2 in $DESTDIR$BINDIR"

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
# same files as containerd: *.conf, *.conflist, *.json).
conf_dir=$DESTDIR$CNI_CONF_DIR
if compgen -G "$conf_dir/*.conf" >/dev/null || compgen -G "$conf_dir/*.conflist" >/dev/null ||
  compgen -G "$conf_dir/*.json" >/dev/null; then
  log "kept the CNI network(s) in $conf_dir"
else
  install -D -m 0644 "$ROOT/contrib/10-crius-bridge.conflist" "$conf_dir/10-crius-bridge.conflist"
  log "wrote the default bridge network to $conf_dir/10-crius-bridge.conflist"
fi

if [ -z "$DESTDIR" ]; then
  log "next: systemctl daemon-reload && systemctl enable --now crius"
fi
