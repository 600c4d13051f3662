//! The image service against the test bed's registries and containerd: pulls (tag, digest,
//! bare name through hosts.toml, multi-arch, auth, failures, concurrency), list, status,
//! remove, pinning, and surviving a restart.

mod common;

use std::collections::HashSet;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::Duration;

use common::registry_push::{push_image, push_random_image, random_layer};
use common::{Crius, Testbed, eventually, push_test_image};
use crius::api::v1::{
    AuthConfig, ImageFilter, ImageSpec, ImageStatusRequest, ListImagesRequest, PullImageRequest,
    RemoveImageRequest,
};
use crius::config::{RegistryAuth, RegistryHostConfig};
use crius_testkit::CriClient;

fn spec(image: &str) -> Option<ImageSpec> {
    Some(ImageSpec {
        image: image.to_string(),
        ..Default::default()
    })
}

async fn pull(client: &mut CriClient, image: &str) -> Result<String, tonic::Status> {
    pull_with(client, image, None).await
}

async fn pull_with(
    client: &mut CriClient,
    image: &str,
    auth: Option<AuthConfig>,
) -> Result<String, tonic::Status> {
    client
        .image
        .pull_image(PullImageRequest {
            image: spec(image),
            auth,
            sandbox_config: None,
        })
        .await
        .map(|r| r.into_inner().image_ref)
}

async fn status(client: &mut CriClient, image: &str) -> Option<crius::api::v1::Image> {
    client
        .image
        .image_status(ImageStatusRequest {
            image: spec(image),
            verbose: false,
        })
        .await
        .expect("image status")
        .into_inner()
        .image
}

async fn remove(client: &mut CriClient, image: &str) {
    client
        .image
        .remove_image(RemoveImageRequest { image: spec(image) })
        .await
        .expect("remove image");
}

async fn list(client: &mut CriClient) -> Vec<crius::api::v1::Image> {
    let mut images = client
        .image
        .list_images(ListImagesRequest { filter: None })
        .await
        .expect("list images")
        .into_inner()
        .images;
    // Every namespace has crius's built-in pause image; the tests are about the others.
    images.retain(|i| {
        !i.repo_tags
            .iter()
            .any(|t| t.starts_with("crius.local/pause:"))
    });
    images.sort_by(|a, b| a.id.cmp(&b.id));
    images
}

/// Image names in containerd, without the built-in pause image's.
fn image_names(crius: &Crius, pause_id: &str) -> Vec<String> {
    crius
        .ctr(&["images", "ls", "-q"])
        .lines()
        .filter(|n| !n.starts_with("crius.local/pause:") && *n != pause_id)
        .map(str::to_string)
        .collect()
}

/// The built-in pause image's ID.
async fn pause_id(client: &mut CriClient) -> String {
    status(
        client,
        &format!("crius.local/pause:{}", env!("CARGO_PKG_VERSION")),
    )
    .await
    .expect("built-in pause image")
    .id
}

/// The digests in `ctr content ls` of this namespace.
fn content_digests(crius: &Crius) -> HashSet<String> {
    crius
        .ctr(&["content", "ls", "-q"])
        .lines()
        .map(str::to_string)
        .collect()
}

/// An image of one random layer pushed to the test bed's registry: the layer, its digest and
/// the image's reference.
async fn push_one_layer_image() -> (Vec<u8>, String, String) {
    use sha2::{Digest, Sha256};
    let registry = Testbed::from_env().registry;
    let layer = random_layer();
    let digest = format!("sha256:{:x}", Sha256::digest(&layer));
    let image = format!(
        "{registry}/{}",
        push_image(&registry, std::slice::from_ref(&layer)).await
    );
    (layer, digest, image)
}

/// A layer goes into an unnamed file on the filesystem of containerd's store, gets its name
/// in the store once crius has checked it (read-only, as containerd keeps its blobs), and
/// containerd records it: no ingest is left, and containerd holds exactly the layer's bytes.
#[tokio::test]
async fn a_layer_downloaded_into_an_unnamed_file_is_recorded_whole() {
    let crius = Crius::start().await;
    let mut client = crius.client().await;
    let (layer, layer_digest, image) = push_one_layer_image().await;
    pull(&mut client, &image).await.expect("pull");
    assert!(
        crius.log().lines().any(|l| l
            .contains("blob downloaded into an unnamed file and recorded")
            && l.contains(&layer_digest)
            && l.contains("named=Some(true)")),
        "{}",
        crius.log()
    );
    assert!(content_digests(&crius).contains(&layer_digest));
    // (The pull unpacked the layer from what containerd holds, checking its diff ID.)
    let stored = std::process::Command::new("ctr")
        .arg("--address")
        .arg(&crius.config.containerd.address)
        .args(["-n", &crius.config.containerd.namespace])
        .args(["content", "get", &layer_digest])
        .output()
        .expect("ctr content get")
        .stdout;
    assert_eq!(stored.len(), layer.len());
    assert!(
        stored == layer,
        "containerd holds other bytes than the layer's"
    );
    let ingests = crius.ctr(&["content", "active"]);
    assert!(!ingests.contains("crius-layer"), "{ingests}");
    let mode = std::fs::metadata(blob_path(&crius, &layer_digest))
        .expect("the layer's blob")
        .permissions()
        .mode();
    assert_eq!(mode & 0o333, 0, "blob mode {mode:o}");
    assert_eq!(
        ingest_dirs_naming(&crius, &layer_digest),
        Vec::<PathBuf>::new()
    );
    remove(&mut client, &image).await;
    assert!(!content_digests(&crius).contains(&layer_digest));
}

/// Two images that share a layer, pulled at once: the layer is downloaded once (the second
/// pull waits for the first's download and finds the blob in containerd).
#[tokio::test]
async fn concurrent_pulls_of_images_sharing_a_layer_download_it_once() {
    use sha2::{Digest, Sha256};
    let testbed = Testbed::from_env();
    let registry = testbed.registry.clone();
    let crius = Crius::start().await;
    let client = crius.client().await;
    let shared = random_layer();
    let shared_digest = format!("sha256:{:x}", Sha256::digest(&shared));
    let mut images = Vec::new();
    for _ in 0..2 {
        let layers = [shared.clone(), random_layer()];
        images.push(format!(
            "{registry}/{}",
            push_image(&registry, &layers).await
        ));
    }
    let pulls: Vec<_> = (images.iter().cloned())
        .map(|image| {
            let mut client = client.clone();
            tokio::spawn(async move { pull(&mut client, &image).await })
        })
        .collect();
    for pulled in pulls {
        pulled.await.unwrap().expect("pull");
    }
    let log = std::fs::read_to_string(&testbed.registry_log).unwrap();
    let downloads = (log.lines())
        .filter(|l| l.contains("GET /v2/random-") && l.contains(&shared_digest))
        .filter(|l| l.contains("crius/"))
        .count();
    assert_eq!(downloads, 1, "the shared layer's downloads");
    let mut client = client.clone();
    for image in &images {
        remove(&mut client, image).await;
    }
}

/// Where containerd's local content store keeps the blob `digest`.
fn blob_path(crius: &Crius, digest: &str) -> PathBuf {
    let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
    content_root(crius).join("blobs/sha256").join(hex)
}

fn content_root(crius: &Crius) -> PathBuf {
    crius
        .config
        .containerd
        .root
        .join("io.containerd.content.v1.content")
}

/// The ingest directories of containerd's local content store whose key names `digest`.
fn ingest_dirs_naming(crius: &Crius, digest: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(content_root(crius).join("ingest")) else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|entry| entry.path())
        .filter(|dir| {
            std::fs::read_to_string(dir.join("ref")).is_ok_and(|key| key.contains(digest))
        })
        .collect()
}

/// A blob crius named in containerd's store and containerd's collection removed before the
/// commit recorded it (as it removes any blob recorded nowhere): crius sends containerd the
/// bytes from its file instead, and the pull gets the same blob.
#[tokio::test]
async fn a_named_blob_collected_before_its_commit_is_sent_from_crius_file() {
    let crius = Crius::start_with_failpoints("blob_published=sleep(3000)").await;
    let mut client = crius.client().await;
    let (layer, layer_digest, image) = push_one_layer_image().await;
    let pulling = {
        let (mut client, image) = (client.clone(), image.clone());
        tokio::spawn(async move { pull(&mut client, &image).await })
    };
    // (Reached only once the blob is named in the store.)
    wait_for_failpoint(&crius, "blob_published").await;
    assert!(
        !content_digests(&crius).contains(&layer_digest),
        "recorded before the commit"
    );
    // A collection of a test running beside this one may have removed it already.
    let blob = blob_path(&crius, &layer_digest);
    match std::fs::remove_file(&blob) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => panic!("remove {}: {e}", blob.display()),
    }
    pulling.await.unwrap().expect("pull");
    assert!(
        crius
            .log()
            .contains("containerd did not find the blob in its store; sending it"),
        "{}",
        crius.log()
    );
    assert!(content_digests(&crius).contains(&layer_digest));
    assert!(
        std::fs::read(&blob).unwrap() == layer,
        "containerd holds other bytes than the layer's"
    );
    assert_eq!(
        ingest_dirs_naming(&crius, &layer_digest),
        Vec::<PathBuf>::new()
    );
    remove(&mut client, &image).await;
}

#[tokio::test]
async fn pulls_by_tag_and_digest_into_containerd() {
    let registry = Testbed::from_env().registry;
    let crius = Crius::start().await;
    let mut client = crius.client().await;
    let tag = format!("{registry}/busybox:latest");

    let id = pull(&mut client, &tag).await.expect("pull by tag");
    assert!(id.starts_with("sha256:"), "{id}");
    let image = status(&mut client, &tag).await.expect("image present");
    assert_eq!(image.id, id);
    assert_eq!(image.repo_tags, vec![tag.clone()]);
    let digest_ref = image.repo_digests[0].clone();
    assert!(digest_ref.starts_with(&format!("{registry}/busybox@sha256:")));
    assert!(
        image.size > 1_000_000,
        "busybox is over 1 MB: {}",
        image.size
    );

    // containerd sees the names, the managed label and the unpacked layers.
    let names = crius.ctr(&["images", "ls", "-q"]);
    for name in [&tag, &digest_ref, &id] {
        assert!(names.lines().any(|l| l == name), "{name} not in:\n{names}");
    }
    let verbose = client
        .image
        .image_status(ImageStatusRequest {
            image: spec(&tag),
            verbose: true,
        })
        .await
        .unwrap()
        .into_inner();
    let info: serde_json::Value = serde_json::from_str(&verbose.info["info"]).unwrap();
    let chain_id = info["chainID"].as_str().unwrap().to_string();
    let snapshots = crius.ctr(&["snapshots", "ls"]);
    assert!(
        snapshots.contains(&chain_id),
        "{chain_id} not in:\n{snapshots}"
    );
    let labels = crius.ctr(&["images", "ls"]);
    assert!(
        labels.contains("io.cri-containerd.image=managed"),
        "{labels}"
    );

    // By digest: the same image, no new names but the digest one.
    assert_eq!(
        pull(&mut client, &digest_ref)
            .await
            .expect("pull by digest"),
        id
    );
    // The listing has it once, with its tag and digest.
    let images = list(&mut client).await;
    assert_eq!(images.len(), 1);
    assert_eq!(images[0].repo_digests, vec![digest_ref.clone()]);
    let filtered = client
        .image
        .list_images(ListImagesRequest {
            filter: Some(ImageFilter { image: spec(&tag) }),
        })
        .await
        .unwrap()
        .into_inner()
        .images;
    assert_eq!(filtered.len(), 1);
    let none = client
        .image
        .list_images(ListImagesRequest {
            filter: Some(ImageFilter {
                image: spec("nosuch:image"),
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .images;
    assert!(none.is_empty());
}

#[tokio::test]
async fn bare_names_and_other_registries_go_through_hosts_toml() {
    let registry = Testbed::from_env().registry;
    // Docker Hub's `library/busybox` and registry.k8s.io's `busybox`, both served locally.
    push_test_image(
        "busybox:latest",
        &format!("{registry}/library/busybox:latest"),
    );
    let certs = tempfile::tempdir().unwrap();
    for (host, server) in [
        ("docker.io", "https://registry-1.docker.io"),
        ("registry.k8s.io", "https://registry.k8s.io"),
    ] {
        std::fs::create_dir_all(certs.path().join(host)).unwrap();
        std::fs::write(
            certs.path().join(host).join("hosts.toml"),
            format!(
                "server = \"{server}\"\n[host.\"http://{registry}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
            ),
        )
        .unwrap();
    }
    let config_path = certs.path().display().to_string();
    let crius = Crius::start_with(|c| c.registry.config_path = config_path, &[]).await;
    let mut client = crius.client().await;

    let id = pull(&mut client, "busybox").await.expect("pull bare name");
    let image = status(&mut client, "busybox").await.expect("present");
    assert_eq!(image.id, id);
    assert_eq!(image.repo_tags, vec!["docker.io/library/busybox:latest"]);

    let k8s = pull(&mut client, "registry.k8s.io/busybox:latest")
        .await
        .expect("pull through the registry.k8s.io mirror");
    assert_eq!(k8s, id);
}

#[tokio::test]
async fn a_multi_arch_index_pulls_the_host_platform() {
    let registry = Testbed::from_env().registry;
    let crius = Crius::start().await;
    let mut client = crius.client().await;
    let reference = format!("{registry}/multiarch:latest");
    let id = pull(&mut client, &reference).await.expect("pull index");
    let verbose = client
        .image
        .image_status(ImageStatusRequest {
            image: spec(&reference),
            verbose: true,
        })
        .await
        .unwrap()
        .into_inner();
    let info: serde_json::Value = serde_json::from_str(&verbose.info["info"]).unwrap();
    assert_eq!(info["imageSpec"]["architecture"], "amd64");
    assert_eq!(verbose.image.unwrap().id, id);
    // The amd64 entry is the plain busybox image.
    let busybox = pull(&mut client, &format!("{registry}/busybox:latest"))
        .await
        .unwrap();
    assert_eq!(busybox, id);
    // The index itself is what the repo digest names.
    let index_digest = crius
        .ctr(&["images", "ls"])
        .lines()
        .find(|l| l.starts_with(&reference))
        .map(|l| l.contains("application/vnd.oci.image.index.v1+json"))
        .unwrap();
    assert!(index_digest);
}

#[tokio::test]
async fn htpasswd_registry_needs_the_right_credentials() {
    let testbed = Testbed::from_env();
    let reference = format!("{}/private/busybox:latest", testbed.auth_registry);
    let (user, password) = testbed.auth_credentials.split_once(':').unwrap();

    let crius = Crius::start().await;
    let mut client = crius.client().await;
    let err = pull(&mut client, &reference)
        .await
        .expect_err("no credentials");
    assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err:?}");
    assert!(err.message().contains(&reference), "{}", err.message());
    assert!(
        err.message().contains("authentication failed"),
        "{}",
        err.message()
    );

    let wrong = AuthConfig {
        username: user.into(),
        password: "wrong".into(),
        ..Default::default()
    };
    let err = pull_with(&mut client, &reference, Some(wrong))
        .await
        .expect_err("wrong password");
    assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err:?}");

    let right = AuthConfig {
        username: user.into(),
        password: password.into(),
        ..Default::default()
    };
    pull_with(&mut client, &reference, Some(right))
        .await
        .expect("request credentials");
    remove(&mut client, &reference).await;
    use base64::Engine as _;
    let encoded = AuthConfig {
        auth: base64::engine::general_purpose::STANDARD.encode(&testbed.auth_credentials),
        ..Default::default()
    };
    pull_with(&mut client, &reference, Some(encoded))
        .await
        .expect("auth field");

    // Credentials from crius's config.
    let host = testbed.auth_registry.clone();
    let (user, password) = (user.to_string(), password.to_string());
    let configured = Crius::start_with(
        |c| {
            c.registry.configs.insert(
                host,
                RegistryHostConfig {
                    auth: Some(RegistryAuth {
                        username: user,
                        password,
                        ..Default::default()
                    }),
                },
            );
        },
        &[],
    )
    .await;
    let mut client = configured.client().await;
    pull(&mut client, &reference)
        .await
        .expect("config credentials");
}

#[tokio::test]
async fn failed_pulls_name_the_reference_and_cause_and_leave_nothing() {
    let registry = Testbed::from_env().registry;
    let crius = Crius::start().await;
    let mut client = crius.client().await;
    pull(&mut client, &format!("{registry}/busybox:latest"))
        .await
        .expect("a good pull first");
    let before = content_digests(&crius);

    let missing_tag = format!("{registry}/busybox:nosuchtag");
    let err = pull(&mut client, &missing_tag)
        .await
        .expect_err("missing tag");
    assert_eq!(err.code(), tonic::Code::NotFound);
    assert!(
        err.message().contains(&missing_tag) && err.message().contains("not found"),
        "{}",
        err.message()
    );

    let missing_repo = format!("{registry}/no/such/repo:latest");
    let err = pull(&mut client, &missing_repo)
        .await
        .expect_err("missing repo");
    assert_eq!(err.code(), tonic::Code::NotFound);
    assert!(err.message().contains(&missing_repo), "{}", err.message());

    let unreachable = "127.0.0.1:9/busybox:latest";
    let err = pull(&mut client, unreachable)
        .await
        .expect_err("unreachable");
    assert_eq!(err.code(), tonic::Code::Unavailable);
    assert!(
        err.message().contains(unreachable) && err.message().contains("unreachable"),
        "{}",
        err.message()
    );

    let err = pull(&mut client, "Not/A:Valid Reference")
        .await
        .expect_err("invalid");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message().contains("Not/A:Valid Reference"),
        "{}",
        err.message()
    );

    assert_eq!(content_digests(&crius), before);
    assert_eq!(list(&mut client).await.len(), 1);
}

#[tokio::test]
#[cfg_attr(
    not(feature = "failpoints"),
    ignore = "needs --features failpoints (make test has it)"
)]
async fn a_pull_failing_after_unpacking_leaves_no_content_or_snapshots() {
    let registry = Testbed::from_env().registry;
    let crius = Crius::start_with_failpoints("pull_after_unpack=error").await;
    let mut client = crius.client().await;
    let content_before = content_digests(&crius);
    let snapshots_before = crius.ctr(&["snapshots", "ls"]).lines().count();
    let err = pull(&mut client, &format!("{registry}/busybox:latest"))
        .await
        .expect_err("failpoint");
    assert_eq!(err.code(), tonic::Code::Internal, "{err:?}");
    assert_eq!(
        content_digests(&crius),
        content_before,
        "content left behind"
    );
    assert_eq!(
        crius.ctr(&["snapshots", "ls"]).lines().count(),
        snapshots_before,
        "snapshots left behind"
    );
    assert_eq!(
        crius.ctr(&["leases", "ls", "-q"]).trim(),
        "",
        "lease left behind"
    );
    assert!(list(&mut client).await.is_empty());
}

#[tokio::test]
async fn ten_concurrent_pulls_share_one_download() {
    let testbed = Testbed::from_env();
    let repo = format!("concurrent-{}", std::process::id());
    let reference = format!("{}/{repo}:latest", testbed.registry);
    push_test_image("busybox:latest", &reference);
    let crius = Crius::start().await;
    let client = crius.client().await;

    let pulls: Vec<_> = (0..10)
        .map(|_| {
            let mut client = client.clone();
            let reference = reference.clone();
            tokio::spawn(async move { pull(&mut client, &reference).await })
        })
        .collect();
    let mut ids = HashSet::new();
    for p in pulls {
        ids.insert(p.await.unwrap().expect("every pull succeeds"));
    }
    assert_eq!(ids.len(), 1);

    // One pull reached the registry: one manifest request, at most one layer download
    // (none when containerd already has the blob from another namespace).
    let log = std::fs::read_to_string(&testbed.registry_log).unwrap();
    let crius_gets = |path: &str| {
        log.lines()
            .filter(|l| l.contains(&format!("GET /v2/{repo}/{path}")) && l.contains("crius/"))
            .count()
    };
    assert_eq!(crius_gets("manifests/"), 1, "manifest requests");
    assert!(
        crius_gets("blobs/") <= 2,
        "config and layer fetched more than once"
    );
}

#[tokio::test]
async fn pulling_a_present_image_fetches_only_its_manifest_and_records_new_tags() {
    let testbed = Testbed::from_env();
    let repo = format!("present-{}", std::process::id());
    let latest = format!("{}/{repo}:latest", testbed.registry);
    let other_tag = format!("{}/{repo}:v2", testbed.registry);
    push_test_image("busybox:latest", &latest);
    push_test_image("busybox:latest", &other_tag);
    let crius = Crius::start().await;
    let mut client = crius.client().await;
    let requests = |path: &str| {
        let log = std::fs::read_to_string(&testbed.registry_log).unwrap();
        log.lines()
            .filter(|l| l.contains(&format!("GET /v2/{repo}/{path}")) && l.contains("crius/"))
            .count()
    };

    let id = pull(&mut client, &latest).await.expect("first pull");
    let blobs = requests("blobs/");
    assert!(blobs >= 1, "the first pull fetched no blob");
    let manifests = requests("manifests/");

    assert_eq!(pull(&mut client, &latest).await.expect("again"), id);
    assert_eq!(pull(&mut client, &other_tag).await.expect("new tag"), id);
    assert_eq!(
        requests("blobs/"),
        blobs,
        "a present image's blobs were fetched"
    );
    assert_eq!(requests("manifests/"), manifests + 2, "each pull resolves");
    let image = status(&mut client, &other_tag).await.expect("status");
    assert_eq!(image.repo_tags, vec![latest.clone(), other_tag.clone()]);
    let names = crius.ctr(&["images", "ls", "-q"]);
    assert!(
        names.lines().any(|l| l == other_tag),
        "{other_tag} not in:\n{names}"
    );
}

#[tokio::test]
async fn image_status_reports_the_user_and_nothing_for_unknown_images() {
    let registry = Testbed::from_env().registry;
    let crius = Crius::start().await;
    let mut client = crius.client().await;
    let numeric = format!("{registry}/busybox-user:1000");
    let named = format!("{registry}/busybox-user:nobody");
    pull(&mut client, &numeric).await.unwrap();
    pull(&mut client, &named).await.unwrap();

    let image = status(&mut client, &numeric).await.unwrap();
    assert_eq!(image.uid.map(|u| u.value), Some(1000));
    assert_eq!(image.username, "");
    let image = status(&mut client, &named).await.unwrap();
    assert_eq!(image.uid, None);
    assert_eq!(image.username, "nobody");
    assert!(status(&mut client, "nosuch/image:latest").await.is_none());
    // Found by an ID prefix too.
    let prefix = &image.id["sha256:".len().."sha256:".len() + 12];
    assert_eq!(status(&mut client, prefix).await.unwrap().id, image.id);
}

#[tokio::test]
async fn remove_image_by_tag_digest_or_id_removes_every_name_and_the_content() {
    let registry = Testbed::from_env().registry;
    let crius = Crius::start().await;
    let mut client = crius.client().await;
    let tag = format!("{registry}/busybox:latest");
    let empty = content_digests(&crius);

    for how in ["tag", "digest", "id"] {
        let id = pull(&mut client, &tag).await.unwrap();
        let image = status(&mut client, &tag).await.unwrap();
        let name = match how {
            "tag" => tag.clone(),
            "digest" => image.repo_digests[0].clone(),
            _ => id.clone(),
        };
        remove(&mut client, &name).await;
        assert!(
            status(&mut client, &tag).await.is_none(),
            "removed by {how}"
        );
        assert!(status(&mut client, &id).await.is_none(), "removed by {how}");
        assert!(list(&mut client).await.is_empty(), "removed by {how}");
        let pause = pause_id(&mut client).await;
        assert!(image_names(&crius, &pause).is_empty(), "removed by {how}");
        // A second remove succeeds.
        remove(&mut client, &name).await;
        // containerd collected the content.
        assert_eq!(
            content_digests(&crius),
            empty,
            "content left after removal by {how}"
        );
    }
}

/// The committed snapshots in this crius's namespace.
fn committed_snapshots(crius: &Crius) -> HashSet<String> {
    crius
        .ctr(&["snapshots", "ls"])
        .lines()
        .filter(|l| l.trim_end().ends_with("Committed"))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

/// Two images pushed to the test bed's registry that share their base layer: that layer
/// alone, and that layer with another on it.
async fn push_alone_and_stacked() -> (String, String) {
    let registry = Testbed::from_env().registry;
    let base = random_layer();
    let alone = format!(
        "{registry}/{}",
        push_image(&registry, std::slice::from_ref(&base)).await
    );
    let stacked = format!(
        "{registry}/{}",
        push_image(&registry, &[base, random_layer()]).await
    );
    (alone, stacked)
}

#[tokio::test]
#[cfg_attr(
    not(feature = "failpoints"),
    ignore = "needs --features failpoints (make test has it)"
)]
async fn a_pull_keeps_the_layer_it_reuses_while_another_removal_collects() {
    // A pull that finds a layer's snapshot already there waits 10 s before it goes on.
    let crius = Crius::start_with_failpoints("unpack_found_snapshot=sleep(10000)").await;
    let mut client = crius.client().await;
    let (alone, stacked) = push_alone_and_stacked().await;
    let id = pull(&mut client, &alone).await.unwrap();
    let snapshots = committed_snapshots(&crius);
    pull(&mut client, &stacked).await.unwrap();
    // Only the stacked image holds the shared layer's snapshot now.
    remove(&mut client, &alone).await;

    // The pull finds the shared snapshot, and the stacked image's removal collects
    // everything nothing references while the pull waits.
    let pulling = {
        let (mut client, alone) = (client.clone(), alone.clone());
        tokio::spawn(async move { pull(&mut client, &alone).await })
    };
    wait_for_failpoint(&crius, "unpack_found_snapshot").await;
    remove(&mut client, &stacked).await;
    assert!(
        !pulling.is_finished(),
        "the removal came while the pull waited"
    );
    assert_eq!(pulling.await.unwrap().unwrap(), id);
    assert_eq!(committed_snapshots(&crius), snapshots);
}

/// Two pulls unpacking the same layer at once: the one that prepares second finds containerd
/// refusing (the layer's snapshot was committed meanwhile) and takes the layer as done, as
/// containerd's unpacker does.
#[tokio::test]
#[cfg_attr(
    not(feature = "failpoints"),
    ignore = "needs --features failpoints (make test has it)"
)]
async fn a_layer_another_pull_committed_while_one_prepared_it_is_taken_as_done() {
    // Each unpack waits 3 s between finding no snapshot and preparing one.
    let crius = Crius::start_with_failpoints("unpack_preparing=sleep(3000)").await;
    let mut client = crius.client().await;
    let (alone, stacked) = push_alone_and_stacked().await;
    let before = committed_snapshots(&crius);
    let first = {
        let (mut client, alone) = (client.clone(), alone.clone());
        tokio::spawn(async move { pull(&mut client, &alone).await })
    };
    wait_for_failpoint(&crius, "unpack_preparing").await;
    // The second looks for the shared snapshot before the first commits it, and prepares
    // after.
    tokio::time::sleep(Duration::from_secs(1)).await;
    pull(&mut client, &stacked).await.expect("second pull");
    first.await.unwrap().expect("first pull");
    let active = (crius.ctr(&["snapshots", "ls"]).lines())
        .filter(|l| l.trim_end().ends_with("Active"))
        .count();
    assert_eq!(active, 0, "active snapshots left");
    assert_eq!(committed_snapshots(&crius).difference(&before).count(), 2);
    remove(&mut client, &stacked).await;
    remove(&mut client, &alone).await;
    assert_eq!(committed_snapshots(&crius), before);
}

/// Waits until crius's log shows the failpoint `name` sleeping.
async fn wait_for_failpoint(crius: &Crius, name: &str) {
    let reached = eventually(Duration::from_secs(20), || async {
        crius
            .log()
            .lines()
            .any(|l| l.contains("failpoint sleeping") && l.contains(name))
    })
    .await;
    assert!(reached, "failpoint {name} not reached");
}

/// Whether ImageStatus and containerd's records agree on whether `image` is there.
async fn store_agrees_with_containerd(crius: &Crius, client: &mut CriClient, image: &str) -> bool {
    let listed = crius
        .ctr(&["images", "ls", "-q"])
        .lines()
        .any(|l| l == image);
    status(client, image).await.is_some() == listed
}

/// A crius whose pulls that find their image present wait `wait_ms` before they record it,
/// an image pulled once, and a second pull of it waiting there.
struct HeldPull {
    crius: Crius,
    client: CriClient,
    image: String,
    id: String,
    pulling: tokio::task::JoinHandle<Result<String, tonic::Status>>,
}

async fn pull_held_while_present(wait_ms: u64) -> HeldPull {
    let registry = Testbed::from_env().registry;
    let crius = Crius::start_with_failpoints(&format!("pull_found_present=sleep({wait_ms})")).await;
    let mut client = crius.client().await;
    let image = format!("{registry}/{}", push_random_image(&registry).await);
    let id = pull(&mut client, &image).await.unwrap();
    let pulling = {
        let (mut client, image) = (client.clone(), image.clone());
        tokio::spawn(async move { pull(&mut client, &image).await })
    };
    wait_for_failpoint(&crius, "pull_found_present").await;
    HeldPull {
        crius,
        client,
        image,
        id,
        pulling,
    }
}

#[tokio::test]
#[cfg_attr(
    not(feature = "failpoints"),
    ignore = "needs --features failpoints (make test has it)"
)]
async fn a_removal_waits_for_a_pull_that_found_the_image_present() {
    let HeldPull {
        crius,
        mut client,
        image,
        pulling,
        ..
    } = pull_held_while_present(3000).await;
    remove(&mut client, &image).await;
    // The removal came after the pull had recorded the image, and took all of it.
    assert!(
        pulling.is_finished(),
        "RemoveImage answered before the pull"
    );
    pulling.await.unwrap().unwrap();
    assert!(status(&mut client, &image).await.is_none());
    assert!(store_agrees_with_containerd(&crius, &mut client, &image).await);
}

#[tokio::test]
#[cfg_attr(
    not(feature = "failpoints"),
    ignore = "needs --features failpoints (make test has it)"
)]
async fn a_removal_that_waited_past_its_deadline_gives_up() {
    let HeldPull {
        crius,
        mut client,
        image,
        pulling,
        ..
    } = pull_held_while_present(6000).await;
    let mut request = tonic::Request::new(RemoveImageRequest {
        image: spec(&image),
    });
    request.set_timeout(Duration::from_secs(1));
    let err = client
        .image
        .remove_image(request)
        .await
        .expect_err("the pull holds the image");
    assert_eq!(err.code(), tonic::Code::DeadlineExceeded, "{err:?}");
    pulling.await.unwrap().unwrap();
    // The removal the client gave up on did not go on once the pull was done.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(status(&mut client, &image).await.is_some());
    assert!(store_agrees_with_containerd(&crius, &mut client, &image).await);
}

#[tokio::test]
#[cfg_attr(
    not(feature = "failpoints"),
    ignore = "needs --features failpoints (make test has it)"
)]
async fn a_pull_that_found_the_image_present_while_ctr_removed_it_pulls_it_again() {
    let HeldPull {
        crius,
        mut client,
        image,
        id,
        pulling,
    } = pull_held_while_present(10000).await;
    // Another client deletes the tag while the pull waits (its digest and ID names keep
    // the content): the pull must write it again.
    crius.ctr(&["images", "rm", &image]);
    let forgotten = eventually(Duration::from_secs(8), || {
        let mut client = client.clone();
        let image = image.clone();
        async move { status(&mut client, &image).await.is_none() }
    })
    .await;
    assert!(forgotten, "crius follows the delete");
    assert_eq!(pulling.await.unwrap().unwrap(), id);
    assert!(crius.log().contains("pulling it again"));
    assert_eq!(status(&mut client, &image).await.unwrap().id, id);
    assert!(store_agrees_with_containerd(&crius, &mut client, &image).await);
}

#[tokio::test]
#[cfg_attr(
    not(feature = "failpoints"),
    ignore = "needs --features failpoints (make test has it)"
)]
async fn a_remove_whose_deletes_fail_keeps_the_image_with_every_name() {
    let registry = Testbed::from_env().registry;
    let crius = Crius::start_with_failpoints("image_delete=error").await;
    let mut client = crius.client().await;
    let tag = format!("{registry}/busybox:latest");
    let id = pull(&mut client, &tag).await.unwrap();
    let before = status(&mut client, &tag).await.unwrap();

    let err = client
        .image
        .remove_image(RemoveImageRequest { image: spec(&tag) })
        .await
        .expect_err("failpoint");
    assert_eq!(err.code(), tonic::Code::Internal, "{err:?}");
    // crius forgot the names before deleting them; the failed deletes read them back.
    let after = status(&mut client, &id).await.expect("image kept");
    assert_eq!(after.repo_tags, before.repo_tags);
    assert_eq!(after.repo_digests, before.repo_digests);
    assert!(status(&mut client, &before.repo_digests[0]).await.is_some());
    assert_eq!(list(&mut client).await.len(), 1);
}

#[tokio::test]
async fn the_sandbox_image_is_pinned_and_removing_one_tag_removes_every_registrys_tags() {
    let registry = Testbed::from_env().registry;
    let alias = format!("{registry}/pinned-alias-{}:v1", std::process::id());
    push_test_image("busybox:latest", &alias);
    let sandbox = format!("{registry}/busybox:latest");
    // The same registry by another host name: the same image under another registry's name.
    let port = registry.rsplit(':').next().unwrap();
    let other_registry = format!("localhost:{port}/busybox:latest");
    let sandbox_image = sandbox.clone();
    let crius = Crius::start_with(|c| c.image.sandbox_image = sandbox_image, &[]).await;
    let mut client = crius.client().await;
    let id = pull(&mut client, &sandbox).await.unwrap();
    assert_eq!(pull(&mut client, &alias).await.unwrap(), id);
    assert_eq!(pull(&mut client, &other_registry).await.unwrap(), id);
    let image = status(&mut client, &id).await.unwrap();
    assert!(image.pinned);
    assert_eq!(image.repo_tags.len(), 3, "{:?}", image.repo_tags);

    // Removing one tag (of another registry) removes the image with all its names.
    remove(&mut client, &other_registry).await;
    for name in [&id, &sandbox, &alias, &other_registry] {
        assert!(status(&mut client, name).await.is_none(), "{name} is left");
    }
    // No built-in pause image with a configured sandbox image: nothing at all is left.
    assert_eq!(crius.ctr(&["images", "ls", "-q"]).trim(), "");
}

#[tokio::test]
async fn images_survive_a_restart_and_ctr_imports_show_up() {
    let testbed = Testbed::from_env();
    let mut crius = Crius::start().await;
    let mut client = crius.client().await;
    pull(&mut client, &format!("{}/busybox:latest", testbed.registry))
        .await
        .unwrap();
    pull(
        &mut client,
        &format!("{}/busybox-user:nobody", testbed.registry),
    )
    .await
    .unwrap();
    let before = list(&mut client).await;
    assert_eq!(before.len(), 2);

    crius.restart().await;
    let mut client = crius.client().await;
    assert_eq!(list(&mut client).await, before);

    // An image imported with ctr appears without a restart.
    let archive = crius.dir.path().join("image.tar");
    let out = std::process::Command::new("skopeo")
        .args(["copy", "--quiet"])
        .arg(format!(
            "oci:{}:busybox-user:1000",
            testbed.images.display()
        ))
        .arg(format!(
            "oci-archive:{}:imported/busybox:v1",
            archive.display()
        ))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    crius.ctr(&["images", "import", &archive.display().to_string()]);
    // ctr keeps the name as given; crius finds it by its normalised form too.
    let imported = "docker.io/imported/busybox:v1";
    assert!(
        eventually(Duration::from_secs(5), || {
            let mut client = client.clone();
            async move { status(&mut client, imported).await.is_some() }
        })
        .await,
        "imported image not listed"
    );
    assert_eq!(
        status(&mut client, imported)
            .await
            .unwrap()
            .uid
            .map(|u| u.value),
        Some(1000)
    );
}

#[tokio::test]
async fn a_pull_without_progress_is_cancelled() {
    // A "registry" that accepts connections and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = silent.local_addr().unwrap();
    let held = tokio::spawn(async move {
        let mut connections = Vec::new();
        while let Ok((conn, _)) = silent.accept().await {
            connections.push(conn);
        }
    });
    let crius = Crius::start_with(
        |c| c.image.pull_progress_timeout = Duration::from_secs(1),
        &[],
    )
    .await;
    let mut client = crius.client().await;
    let started = std::time::Instant::now();
    let err = pull(&mut client, &format!("{address}/stuck:latest"))
        .await
        .expect_err("stalled pull");
    assert_eq!(err.code(), tonic::Code::DeadlineExceeded, "{err:?}");
    assert!(err.message().contains("no progress"), "{}", err.message());
    assert!(started.elapsed() < Duration::from_secs(10));
    held.abort();
}

/// A registry in front of the test registry that sends blobs a few KiB at a time, so a pull
/// through it takes far longer than its caller waits. Returns its address.
async fn trickling_registry(upstream: String) -> (String, tokio::task::JoinHandle<()>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let server = tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let upstream = upstream.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if client.read(&mut byte).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                let text = String::from_utf8_lossy(&head).to_string();
                let is_blob = text.lines().next().is_some_and(|l| l.contains("/blobs/"));
                // One request per upstream connection: it closes when it has answered.
                let request: String = text
                    .lines()
                    .filter(|l| !l.to_ascii_lowercase().starts_with("connection:"))
                    .take_while(|l| !l.is_empty())
                    .map(|l| format!("{l}\r\n"))
                    .collect::<String>()
                    + "Connection: close\r\n\r\n";
                let Ok(mut registry) = tokio::net::TcpStream::connect(&upstream).await else {
                    return;
                };
                if registry.write_all(request.as_bytes()).await.is_err() {
                    return;
                }
                let mut response = Vec::new();
                if registry.read_to_end(&mut response).await.is_err() {
                    return;
                }
                let chunk = if is_blob { 4096 } else { response.len().max(1) };
                for piece in response.chunks(chunk) {
                    if client.write_all(piece).await.is_err() {
                        return;
                    }
                    if is_blob {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            });
        }
    });
    (address, server)
}

fn pull_leases(crius: &Crius) -> Vec<String> {
    crius.leases("crius-pull-")
}

#[tokio::test]
async fn a_pull_past_its_deadline_is_deadline_exceeded_and_leaves_nothing() {
    let registry = Testbed::from_env().registry;
    let (slow, server) = trickling_registry(registry).await;
    let crius = Crius::start().await;
    let mut client = crius.client().await;
    let before = content_digests(&crius);
    // Content no namespace of containerd has yet (it shares blobs between namespaces).
    let name = push_random_image(&Testbed::from_env().registry).await;
    let image = format!("{slow}/{name}");

    // Over gRPC: the grpc-timeout header.
    let mut request = tonic::Request::new(PullImageRequest {
        image: spec(&image),
        ..Default::default()
    });
    request.set_timeout(Duration::from_secs(2));
    let started = std::time::Instant::now();
    let err = client
        .image
        .pull_image(request)
        .await
        .expect_err("a pull slower than its deadline");
    assert_eq!(err.code(), tonic::Code::DeadlineExceeded, "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(4));

    // Over ttrpc: timeout_nano.
    let ttrpc = crius_testkit::TtrpcCriClient::connect(crius.ttrpc_socket())
        .await
        .unwrap();
    let err = ttrpc
        .call_with_timeout::<_, crius::api::v1::PullImageResponse>(
            "runtime.v1.ImageService",
            "PullImage",
            &PullImageRequest {
                image: spec(&image),
                ..Default::default()
            },
            Duration::from_secs(1),
        )
        .await
        .expect_err("a pull slower than its deadline");
    assert_eq!(err.code(), tonic::Code::DeadlineExceeded, "{err:?}");

    // Nothing of either attempt stays: no lease, no content, no image, no snapshot.
    let clean = eventually(Duration::from_secs(10), || async {
        pull_leases(&crius).is_empty()
            && content_digests(&crius) == before
            && crius.ctr(&["content", "active"]).lines().count() <= 1
    })
    .await;
    assert!(
        clean,
        "left behind: leases {:?}, content {:?}, active {}",
        pull_leases(&crius),
        content_digests(&crius)
            .difference(&before)
            .collect::<Vec<_>>(),
        crius.ctr(&["content", "active"])
    );
    assert!(status(&mut client, &image).await.is_none());
    assert!(!crius.ctr(&["images", "ls", "-q"]).contains(&slow));
    server.abort();
}

/// What a container of the layered test image sees of its files: every path with its
/// checksum, and the outcome of the whiteout and the opaque directory.
async fn layered_image_view(crius: &Crius, tag: &str) -> String {
    let mut pod = common::pod::pod(crius, &format!("layered-{tag}")).await;
    let name = format!("test/layered:{tag}");
    pod.pull(&name).await;
    let id = pod
        .create(common::pod::container("view", &name, &["sleep", "3600"]))
        .await
        .expect("create");
    pod.start(&id).await.expect("start");
    let (out, err, code) = pod
        .exec(
            &id,
            &[
                "sh",
                "-c",
                "test ! -e /data/victim && test ! -e /data/opq/old && cat /data/opq/new && \
                 find /data /bin ! -type d | sort | xargs md5sum && find /data -type d | sort",
            ],
            60,
        )
        .await
        .expect("exec");
    assert_eq!(code, 0, "{out}{err}");
    pod.remove_pod().await;
    out
}

/// The major and minor version of the containerd under test (`ctr version`'s server part).
fn containerd_version(crius: &Crius) -> (u32, u32) {
    let out = crius.ctr(&["version"]);
    let version = (out.split("Server:").nth(1))
        .and_then(|server| {
            server
                .lines()
                .find_map(|l| l.trim().strip_prefix("Version:"))
        })
        .unwrap_or_else(|| panic!("no server version in {out:?}"));
    major_minor(version)
}

/// `v2.3.4`, `2.1.9+unknown`, `1.6.20~ds1` → (2, 3), (2, 1), (1, 6).
fn major_minor(version: &str) -> (u32, u32) {
    let version = version.trim().trim_start_matches('v');
    let mut numbers = version.split(|c: char| !c.is_ascii_digit()).map(|n| {
        n.parse::<u32>()
            .unwrap_or_else(|_| panic!("version {version:?}"))
    });
    (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0))
}

#[test]
fn versions_parse_to_major_and_minor() {
    assert_eq!(major_minor("v2.3.4"), (2, 3));
    assert_eq!(major_minor("2.1.9+unknown"), (2, 1));
    assert_eq!(major_minor("1.6.20~ds1"), (1, 6));
}

/// The premise of committing staged layers onto their parents: containerd 2.2+ keeps the
/// parent given at the commit of a snapshot prepared without one, and says so; older ones
/// commit it without a parent (which crius checks for).
#[tokio::test]
async fn a_commit_onto_a_parent_is_kept_only_where_the_snapshotter_says_it_rebases() {
    let testbed = Testbed::from_env();
    let namespace = format!("crius-rebase-{}", std::process::id());
    let containerd = crius::containerd::Containerd::connect(
        &testbed.containerd_address,
        &namespace,
        Duration::from_secs(10),
    )
    .await
    .expect("connect");
    let lease = "crius-rebase-test";
    containerd
        .create_lease(lease, Duration::from_secs(600))
        .await
        .expect("lease");
    let (sn, none) = ("overlayfs", std::collections::HashMap::new);
    containerd
        .prepare_snapshot(sn, "base-active", "", none(), Some(lease))
        .await
        .expect("prepare base");
    containerd
        .commit_snapshot(sn, "base", "base-active", none(), Some(lease))
        .await
        .expect("commit base");
    containerd
        .prepare_snapshot(sn, "staged", "", none(), Some(lease))
        .await
        .expect("prepare staged");
    containerd
        .commit_snapshot_onto(sn, "layer", "staged", "base", Some(lease))
        .await
        .expect("commit onto base");
    let parent = containerd
        .snapshot_parent(sn, "layer")
        .await
        .expect("stat layer");
    let rebases = containerd.snapshotter_can_rebase(sn).await;
    let version = containerd.version().await.expect("version");
    containerd
        .delete_lease(lease, false)
        .await
        .expect("delete lease");
    assert_eq!(
        rebases,
        major_minor(&version) >= (2, 2),
        "containerd {version}"
    );
    let expected = if rebases { "base" } else { "" };
    assert_eq!(parent.as_deref(), Some(expected), "containerd {version}");
}

#[tokio::test]
async fn layers_applied_ahead_of_their_parents_match_layers_applied_in_order() {
    // One per CPU by default; the test VM has two: every layer but the first is staged.
    let parallel = Crius::start_with(|c| c.image.max_concurrent_unpacks = 4, &[]).await;
    let in_order = Crius::start_with(|c| c.image.max_concurrent_unpacks = 1, &[]).await;
    for tag in ["gzip", "zstd"] {
        let staged = layered_image_view(&parallel, tag).await;
        assert!(staged.starts_with("only me\n"), "{staged}");
        assert!(staged.lines().count() > 50, "{staged}");
        assert_eq!(
            staged,
            layered_image_view(&in_order, tag).await,
            "{tag}: the staged layers differ from the layers applied in order"
        );
    }
    let log = parallel.log();
    assert!(
        log.contains("layer applied ahead of its parent") && log.contains("staged=true"),
        "no layer was staged"
    );
    assert!(!in_order.log().contains("staged=true"));
    // containerd 2.2+ commits a staged layer onto its parent itself; older ones may not be
    // asked to (they would commit it without the parent).
    let rebase = containerd_version(&parallel) >= (2, 2);
    assert_eq!(
        log.contains("rebase=true"),
        rebase,
        "containerd {:?}: expected rebase={rebase}",
        containerd_version(&parallel)
    );
    assert!(log.contains(&format!("rebase={rebase}")), "not asked");
    for crius in [&parallel, &in_order] {
        let active = crius.ctr(&["snapshots", "ls"]);
        assert!(!active.contains("Active"), "{active}");
        assert!(pull_leases(crius).is_empty());
    }
}

#[tokio::test]
#[cfg_attr(
    not(feature = "failpoints"),
    ignore = "needs --features failpoints (make test has it)"
)]
async fn a_pull_failing_while_layers_are_staged_leaves_no_content_or_snapshots() {
    let registry = Testbed::from_env().registry;
    let crius = Crius::start_with(
        |c| c.image.max_concurrent_unpacks = 4,
        &[("CRIUS_FAILPOINTS", "unpack_staging=error")],
    )
    .await;
    let mut client = crius.client().await;
    let content_before = content_digests(&crius);
    let snapshots_before = crius.ctr(&["snapshots", "ls"]).lines().count();
    let err = pull(&mut client, &format!("{registry}/test/layered:gzip"))
        .await
        .expect_err("failpoint");
    assert_eq!(err.code(), tonic::Code::Internal, "{err:?}");
    // The staged snapshots and the layers went with the pull's lease.
    assert!(
        eventually(Duration::from_secs(10), || async {
            crius.ctr(&["snapshots", "ls"]).lines().count() == snapshots_before
        })
        .await,
        "snapshots left behind: {}",
        crius.ctr(&["snapshots", "ls"])
    );
    assert!(pull_leases(&crius).is_empty());
    assert_eq!(
        content_digests(&crius),
        content_before,
        "content left behind"
    );
    assert!(list(&mut client).await.is_empty());
}
