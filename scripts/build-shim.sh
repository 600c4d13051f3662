#!/usr/bin/env bash
# Builds crius's shim (containerd-shim-crius-v2, and its exec helper crius-exec-helper)
# small and static, since one runs per pod:
# against musl when rustup has its target (or can add it), else against glibc's static
# libc. The binary goes to target/crius-shim/, where the test bed and `make run` take it.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=$ROOT/target/crius-shim
cd "$ROOT"

musl="$(uname -m)-unknown-linux-musl"
if rustup target list --installed 2>/dev/null | grep -qx "$musl" ||
  rustup target add "$musl" >/dev/null 2>&1; then
  target=$musl flags=""
else
  target=$(rustc -vV | sed -n 's/^host: //p') flags="-C target-feature=+crt-static"
  echo "[shim] no $musl target: linking glibc statically (a larger binary)" >&2
fi
RUSTFLAGS="$flags" cargo build -p crius-shim --profile shim --target "$target"
mkdir -p "$OUT"
# The exec helper goes beside the shim, where the shim looks for it.
for bin in containerd-shim-crius-v2 crius-exec-helper; do
  install -m 0755 "target/$target/shim/$bin" "$OUT/"
  echo "[shim] $OUT/$bin ($target, $(stat -c %s "$OUT/$bin") bytes)" >&2
done
