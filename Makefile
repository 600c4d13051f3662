# crius: `make run` serves the CRI in the foreground; `make test` runs every check and test
# on a fresh machine (it installs packages, starts containerd and a registry, stops them).

.PHONY: all build release shim run test soak install bench bench-all fuzz testbed-up testbed-down clean

all: build

build:
	cargo build
	cargo build -p crius-shim

# The daemon as it ships, in target/crius-release/: linked statically against glibc
# (STATIC=0: dynamically).
release: shim
	STATIC="$(STATIC)" scripts/build-release.sh

# crius's shim, containerd-shim-crius-v2 (small and static: one runs per pod), in
# target/crius-shim/.
shim:
	scripts/build-shim.sh

run: release
	scripts/run.sh

test:
	scripts/testbed.sh test

# Churn with faults injected (not part of `make test`): SOAK_MINUTES (default 10) beside
# containerd 1.6 and 2.x; fails on any leak, lost exit or INTERNAL/UNKNOWN answer.
soak:
	scripts/testbed.sh soak

# Installs what `make release` built: crius, its shim, the systemd unit, and a default
# config and CNI network where none exists (scripts/install.sh). PROFILE=debug installs
# what `make build shim` built; INSTALL_CNI=0 writes no network.
PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin
UNITDIR ?= $(PREFIX)/lib/systemd/system
SYSCONFDIR ?= /etc
CNI_CONF_DIR ?= $(SYSCONFDIR)/cni/net.d
PROFILE ?= release
INSTALL_CNI ?= 1

install:
	INSTALL_CNI="$(INSTALL_CNI)" DESTDIR="$(DESTDIR)" PREFIX="$(PREFIX)" BINDIR="$(BINDIR)" UNITDIR="$(UNITDIR)" \
	SYSCONFDIR="$(SYSCONFDIR)" CNI_CONF_DIR="$(CNI_CONF_DIR)" PROFILE="$(PROFILE)" \
	scripts/install.sh

# The parsers' property tests with many more cases than `make test` runs (256 each).
fuzz:
	CRIUS_FUZZ_CASES=$${CRIUS_FUZZ_CASES:-20000} cargo test --lib fuzz

# Benchmarks against the test bed (not run by `make test`): `make bench` prints the table
# of every CRI operation against containerd's CRI; `make bench-all` runs every benchmark.
bench:
	scripts/testbed.sh bench

bench-all:
	scripts/testbed.sh bench all

# For working on the tests: start the test bed once, then
#   eval "$$(scripts/testbed.sh env)" && cargo test
testbed-up:
	scripts/testbed.sh deps
	scripts/testbed.sh up

testbed-down:
	scripts/testbed.sh down

clean:
	scripts/testbed.sh down
	cargo clean
