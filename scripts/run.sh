#!/usr/bin/env bash
# `make run`: crius in the foreground with /etc/crius/config.toml (or the built-in defaults).
# Starts containerd with contrib/containerd.toml when none answers on the default socket, and
# writes a bridge network (10.88.0.0/16, portmap, loopback) when the CNI conf dir is empty.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=$ROOT/target/crius-release/crius
CONTAINERD_SOCK=/run/containerd/containerd.sock
CNI_CONF_DIR=/etc/cni/net.d
RUN_DIR=$ROOT/.run
mkdir -p "$RUN_DIR"

# containerd finds crius's shim (the default handler's) on its PATH: put the one just built
# where every containerd looks, /usr/local/bin.
# Its exec helper goes beside it.
for bin in containerd-shim-crius-v2 crius-exec-helper; do
  built=$ROOT/target/crius-shim/$bin
  if ! cmp -s "$built" "/usr/local/bin/$bin"; then
    echo "[run] installing $built to /usr/local/bin" >&2
    # Renamed into place: a running shim never reads half of one.
    install -m 0755 "$built" "/usr/local/bin/.$bin.new"
    mv -f "/usr/local/bin/.$bin.new" "/usr/local/bin/$bin"
  fi
done

config_args=()
if [ -n "${CRIUS_CONFIG:-}" ]; then
  config_args=(--config "$CRIUS_CONFIG")
fi
if [ -n "${CRIUS_CONFIG:-}" ] || [ -f /etc/crius/config.toml ]; then
  "$BIN" config check "${config_args[@]}"
fi

containerd_pid=
cleanup() {
  if [ -n "$containerd_pid" ]; then
    echo "[run] stopping the containerd started for crius" >&2
    kill "$containerd_pid" 2>/dev/null || true
    wait "$containerd_pid" 2>/dev/null || true
  fi
}
trap cleanup EXIT

if ! ctr --address "$CONTAINERD_SOCK" --connect-timeout 1s version >/dev/null 2>&1; then
  echo "[run] no containerd at $CONTAINERD_SOCK: starting one (log: $RUN_DIR/containerd.log)" >&2
  containerd --config "$ROOT/contrib/containerd.toml" >"$RUN_DIR/containerd.log" 2>&1 &
  containerd_pid=$!
  for _ in $(seq 100); do
    ctr --address "$CONTAINERD_SOCK" --connect-timeout 1s version >/dev/null 2>&1 && break
    sleep 0.1
  done
fi

mkdir -p "$CNI_CONF_DIR"
if [ -z "$(ls -A "$CNI_CONF_DIR")" ]; then
  echo "[run] $CNI_CONF_DIR is empty: writing the default bridge network" >&2
  cp "$ROOT/contrib/10-crius-bridge.conflist" "$CNI_CONF_DIR/"
fi

"$BIN" "${config_args[@]}" &
crius_pid=$!
trap 'kill -TERM $crius_pid 2>/dev/null || true' INT TERM
status=0
wait "$crius_pid" || status=$?
# A signal interrupts the first wait: wait for crius to finish its shutdown.
if kill -0 "$crius_pid" 2>/dev/null; then wait "$crius_pid" || status=$?; fi
exit "$status"
