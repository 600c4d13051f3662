//! How the shim process starts and serves: `start` (spawn or reuse the pod's shim and
//! answer its address), `delete` (clean up after a dead shim), the ttrpc server with its
//! signal and reaper loops, the bootstrap of a new shim process, and `-info`.

pub mod bootstrap;
pub mod delete;
pub mod info;
pub mod serve;
pub mod start;
