//! Task stats: the container's cgroup metrics, in the message containerd expects for the
//! host's cgroup version.

use containerd_shim::cgroup;
use containerd_shim_protos::protobuf::MessageFull;
use containerd_shim_protos::protobuf::well_known_types::any::Any;

use crate::error::ShimError;

pub fn collect(group: &cgroups_rs::fs::Cgroup) -> Result<Any, ShimError> {
    if group.v2() {
        let metrics =
            cgroup::collect_metrics_v2(group).map_err(|e| ShimError::Internal(e.to_string()))?;
        pack(&metrics)
    } else {
        let metrics =
            cgroup::collect_metrics(group).map_err(|e| ShimError::Internal(e.to_string()))?;
        pack(&metrics)
    }
}

fn pack<M: MessageFull>(message: &M) -> Result<Any, ShimError> {
    let mut any = Any::new();
    any.type_url = M::descriptor().full_name().to_string();
    any.value = message
        .write_to_bytes()
        .map_err(|e| ShimError::Internal(e.to_string()))?;
    Ok(any)
}
