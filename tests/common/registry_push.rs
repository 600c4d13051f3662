//! Images made by a test and pushed to a test bed registry: content no namespace of
//! containerd has yet (containerd shares blobs between namespaces).

/// Pushes an image of one layer of 512 KiB of random bytes (an uncompressed tar) to
/// `registry`; returns its `repository:tag`.
pub async fn push_random_image(registry: &str) -> String {
    push_image(registry, &[random_layer()]).await
}

/// An uncompressed tar of one file of 512 KiB of random bytes.
pub fn random_layer() -> Vec<u8> {
    let mut data = vec![0u8; 512 * 1024];
    rand::Rng::fill(&mut rand::rng(), &mut data[..]);
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(data.len() as u64);
    header.set_mode(0o644);
    header.set_cksum();
    builder
        .append_data(&mut header, "random", data.as_slice())
        .unwrap();
    builder.into_inner().unwrap()
}

/// Pushes an image of `layers` (uncompressed tars) to `registry` under a new repository;
/// returns its `repository:tag`.
pub async fn push_image(registry: &str, layers: &[Vec<u8>]) -> String {
    use sha2::{Digest, Sha256};
    let digest = |bytes: &[u8]| format!("sha256:{:x}", Sha256::digest(bytes));
    let diff_ids: Vec<String> = layers.iter().map(|layer| digest(layer)).collect();
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64", "os": "linux", "config": {},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }))
    .unwrap();
    let repo = format!("random-{:016x}", rand::random::<u64>());
    let http = reqwest::Client::new();
    for blob in layers.iter().chain([&config]) {
        let start = http
            .post(format!("http://{registry}/v2/{repo}/blobs/uploads/"))
            .send()
            .await
            .unwrap();
        let location = start.headers()["location"].to_str().unwrap().to_string();
        let location = if location.starts_with("http") {
            location
        } else {
            format!("http://{registry}{location}")
        };
        let sep = if location.contains('?') { '&' } else { '?' };
        let put = http
            .put(format!("{location}{sep}digest={}", digest(blob)))
            .body(blob.clone())
            .send()
            .await
            .unwrap();
        assert!(put.status().is_success(), "blob upload: {}", put.status());
    }
    let layer_descriptors: Vec<serde_json::Value> = layers
        .iter()
        .map(|layer| {
            serde_json::json!({"mediaType": "application/vnd.oci.image.layer.v1.tar",
                               "digest": digest(layer), "size": layer.len()})
        })
        .collect();
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": digest(&config), "size": config.len()},
        "layers": layer_descriptors,
    }))
    .unwrap();
    let put = http
        .put(format!("http://{registry}/v2/{repo}/manifests/v1"))
        .header("content-type", "application/vnd.oci.image.manifest.v1+json")
        .body(manifest)
        .send()
        .await
        .unwrap();
    assert!(
        put.status().is_success(),
        "manifest upload: {}",
        put.status()
    );
    format!("{repo}:v1")
}
