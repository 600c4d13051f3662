#!/usr/bin/env bash
# Builds the crius daemon as it ships (`make release`): statically linked against glibc
# (RUSTFLAGS="-C target-feature=+crt-static" for the host target only, so build scripts and
# macros stay dynamic). Static, it maps no libc.so, libm.so or loader: 1.7 MiB less resident
# memory, and glibc's malloc stays (musl's took 25% longer per small RPC). Host names still
# resolve through /etc/hosts and DNS (glibc 2.34+ has both without NSS modules; other
# nsswitch sources load the node's modules, which must match this glibc). STATIC=0 links
# dynamically instead. The binary goes to target/crius-release/, where `make install` and
# `make run` take it.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
OUT=$TARGET_DIR/crius-release
cd "$ROOT"

case ${STATIC:-1} in
0 | 1) ;;
*) echo "[release] STATIC must be 0 (dynamic) or 1 (static), not '$STATIC'" >&2; exit 2 ;;
esac
if [ "${STATIC:-1}" = 0 ]; then
  cargo build --release --bin crius
  built=$TARGET_DIR/release/crius
else
  host=$(rustc -vV | sed -n 's/^host: //p')
  RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static" \
    cargo build --release --bin crius --target "$host"
  built=$TARGET_DIR/$host/release/crius
fi
mkdir -p "$OUT"
install -m 0755 "$built" "$OUT/crius"
echo "[release] $OUT/crius ($(file -b "$OUT/crius" | grep -o 'static-pie linked\|statically linked\|dynamically linked'))" >&2
