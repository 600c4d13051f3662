//! The OCI and Docker image documents crius reads: indexes (manifest lists), manifests and
//! image configs, with only the fields crius uses, tolerant of the rest.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const DOCKER_MANIFEST_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const OCI_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// What a registry is asked to return for a manifest request.
pub const MANIFEST_ACCEPT: &str = "application/vnd.oci.image.index.v1+json, \
application/vnd.docker.distribution.manifest.list.v2+json, \
application/vnd.oci.image.manifest.v1+json, \
application/vnd.docker.distribution.manifest.v2+json";

pub fn is_index(media_type: &str) -> bool {
    media_type == OCI_INDEX || media_type == DOCKER_MANIFEST_LIST
}

pub fn is_manifest(media_type: &str) -> bool {
    media_type == OCI_MANIFEST || media_type == DOCKER_MANIFEST
}

/// `sha256:<hex>` of `data`.
pub fn sha256_digest(data: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(data))
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Platform {
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub os: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub variant: String,
}

impl Platform {
    /// The platform crius runs on, in OCI terms.
    pub fn host() -> Self {
        let (architecture, variant) = match std::env::consts::ARCH {
            "x86_64" => ("amd64", ""),
            "aarch64" => ("arm64", "v8"),
            "x86" => ("386", ""),
            "arm" => ("arm", "v7"),
            "powerpc64" => ("ppc64le", ""),
            "s390x" => ("s390x", ""),
            "riscv64" => ("riscv64", ""),
            other => (other, ""),
        };
        Self {
            architecture: architecture.to_string(),
            os: "linux".to_string(),
            variant: variant.to_string(),
        }
    }

    /// Whether an image for `other` runs here. arm64's variant is optional (v8 is the only).
    pub fn matches(&self, other: &Platform) -> bool {
        if self.os != other.os || self.architecture != other.architecture {
            return false;
        }
        other.variant.is_empty()
            || other.variant == self.variant
            || (self.architecture == "arm64" && other.variant == "v8")
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    #[serde(default)]
    pub media_type: String,
    pub digest: String,
    pub size: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<Platform>,
    #[serde(default, skip_serializing_if = "HashMap::is_empty")]
    pub annotations: HashMap<String, String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Index {
    #[serde(default)]
    pub media_type: String,
    pub manifests: Vec<Descriptor>,
}

impl Index {
    /// The first manifest for `platform`.
    pub fn select(&self, platform: &Platform) -> Option<&Descriptor> {
        self.manifests.iter().find(|m| {
            is_manifest(&m.media_type) && m.platform.as_ref().is_some_and(|p| platform.matches(p))
        })
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    #[serde(default)]
    pub media_type: String,
    pub config: Descriptor,
    #[serde(default)]
    pub layers: Vec<Descriptor>,
}

/// The image configuration: what runs, and the layers' uncompressed digests.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ImageConfigFile {
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub os: String,
    #[serde(default)]
    pub config: RunConfig,
    #[serde(default)]
    pub rootfs: RootFs,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct RunConfig {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub user: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entrypoint: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmd: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub working_dir: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volumes: Option<HashMap<String, serde_json::Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<HashMap<String, String>>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub stop_signal: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exposed_ports: Option<HashMap<String, serde_json::Value>>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RootFs {
    #[serde(default, rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub diff_ids: Vec<String>,
}

/// The chain IDs of a layer stack: the snapshot names containerd's unpacker uses.
pub fn chain_ids(diff_ids: &[String]) -> Vec<String> {
    let mut chain: Vec<String> = Vec::with_capacity(diff_ids.len());
    for diff_id in diff_ids {
        let next = match chain.last() {
            None => diff_id.clone(),
            Some(parent) => sha256_digest(format!("{parent} {diff_id}").as_bytes()),
        };
        chain.push(next);
    }
    chain
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_ids_follow_the_oci_definition() {
        let a = "sha256:aaaa".to_string();
        let b = "sha256:bbbb".to_string();
        let chain = chain_ids(&[a.clone(), b.clone()]);
        assert_eq!(chain[0], a);
        assert_eq!(chain[1], sha256_digest(b"sha256:aaaa sha256:bbbb"));
        assert!(chain_ids(&[]).is_empty());
    }

    #[test]
    fn selects_the_host_platform_from_an_index() {
        let index: Index = serde_json::from_str(&format!(
            r#"{{"mediaType":"{OCI_INDEX}","manifests":[
              {{"mediaType":"{OCI_MANIFEST}","digest":"sha256:arm","size":1,
                "platform":{{"architecture":"arm64","os":"linux","variant":"v8"}}}},
              {{"mediaType":"{OCI_MANIFEST}","digest":"sha256:amd","size":1,
                "platform":{{"architecture":"amd64","os":"linux"}}}}]}}"#
        ))
        .unwrap();
        let amd64 = Platform {
            architecture: "amd64".into(),
            os: "linux".into(),
            variant: String::new(),
        };
        assert_eq!(index.select(&amd64).unwrap().digest, "sha256:amd");
        let arm64 = Platform {
            architecture: "arm64".into(),
            os: "linux".into(),
            variant: "v8".into(),
        };
        assert_eq!(index.select(&arm64).unwrap().digest, "sha256:arm");
        let s390x = Platform {
            architecture: "s390x".into(),
            os: "linux".into(),
            variant: String::new(),
        };
        assert!(index.select(&s390x).is_none());
    }

    #[test]
    fn config_user_and_diff_ids_parse() {
        let config: ImageConfigFile = serde_json::from_str(
            r#"{"architecture":"amd64","os":"linux","config":{"User":"1000","Cmd":["sh"],"Env":["A=b"]},
                "rootfs":{"type":"layers","diff_ids":["sha256:x"]},"history":[]}"#,
        )
        .unwrap();
        assert_eq!(config.config.user, "1000");
        assert_eq!(config.config.cmd.as_deref(), Some(&["sh".to_string()][..]));
        assert_eq!(config.rootfs.diff_ids, vec!["sha256:x"]);
    }
}

#[cfg(test)]
mod fuzz {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(crate::fuzz_config())]

        #[test]
        fn documents_of_any_bytes_parse_or_fail_cleanly(data in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let _ = serde_json::from_slice::<Index>(&data);
            let _ = serde_json::from_slice::<Manifest>(&data);
            let _ = serde_json::from_slice::<ImageConfigFile>(&data);
        }

        #[test]
        fn chain_ids_of_any_diff_ids(ids in proptest::collection::vec("\\PC{0,70}", 0..20)) {
            prop_assert_eq!(chain_ids(&ids).len(), ids.len());
        }
    }
}
