//! The labels containerd's CRI puts on the image records it keeps, which crius puts there
//! too (so `ctr`, containerd's garbage collection and tools written against containerd's CRI
//! read them the same).

use std::collections::HashMap;

/// An image record kept by the CRI.
pub const MANAGED_LABEL: &str = "io.cri-containerd.image";
/// An image kubelet's garbage collection leaves (the sandbox image).
pub const PINNED_LABEL: &str = "io.cri-containerd.pinned";

/// The labels of the records of an image the CRI keeps: managed, and pinned when the name
/// asked for is a pinned one (the sandbox image).
pub fn record_labels(pinned: bool) -> HashMap<String, String> {
    let mut labels = HashMap::from([(MANAGED_LABEL.to_string(), "managed".to_string())]);
    if pinned {
        labels.insert(PINNED_LABEL.to_string(), "pinned".to_string());
    }
    labels
}
