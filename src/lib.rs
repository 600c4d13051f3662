//! crius: a Kubernetes CRI runtime and image service that drives containerd.
//!
//! The binary (`main.rs`) parses the command line and runs a [`cri::CriService`] served by [`server`]; the
//! modules below are the parts it is built from. See `docs/architecture.md` for the map.

pub mod api;
pub mod cdi;
pub mod check;
pub mod checkpoint;
pub mod cli;
pub mod cni;
pub mod config;
pub mod containerd;
pub mod cri;
pub mod failpoint;
pub mod fsusage;
pub mod heap;
pub mod image;
pub mod imagespec;
pub mod io;
pub mod keyed_locks;
pub mod logging;
pub mod metrics;
pub mod migrate;
pub mod oci;
pub mod protos;
pub mod quiet_socket;
pub mod sandboxer;
pub mod server;
pub mod stats;
pub mod store;
pub mod streaming;
pub mod sys;
pub mod undo;

/// How many cases each property test of a parser tries: a bounded run in `make test`,
/// `CRIUS_FUZZ_CASES` more with `make fuzz`.
#[cfg(test)]
pub(crate) fn fuzz_config() -> proptest::test_runner::Config {
    let cases = std::env::var("CRIUS_FUZZ_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(256);
    proptest::test_runner::Config {
        cases,
        failure_persistence: None,
        ..Default::default()
    }
}
