//! RPCs whose capability is not built yet. Each answers `UNIMPLEMENTED` with its name, so a
//! client sees exactly what is missing instead of a fake success. Entries leave this file as
//! their capability lands in its own module.

use crate::api::v1::*;
use tonic::Status;

use crate::server::CriService;

macro_rules! not_built {
    ($($name:ident, $rpc:literal, $req:ident, $resp:ident;)*) => {
        impl CriService {
            $(
                pub async fn $name(&self, _req: $req) -> Result<$resp, Status> {
                    Err(Status::unimplemented(concat!($rpc, " is not implemented in crius yet")))
                }
            )*
        }
    };
}

not_built! {
    checkpoint_container, "CheckpointContainer", CheckpointContainerRequest, CheckpointContainerResponse;
}
