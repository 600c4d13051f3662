//! `-info`: what containerd 2.x asks a shim before it checks a container's spec against
//! the OCI runtime's features (idmapped mounts, for one): the shim's name and version, the
//! options it was given, and the OCI runtime's own `features` answer, as containerd's runc
//! shim reports them.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use containerd_shim_protos::protobuf::well_known_types::any::Any;
use containerd_shim_protos::protobuf::{Message, MessageField};
use containerd_shim_protos::shim::oci::Options;
use containerd_shim_protos::types::introspection::{RuntimeInfo, RuntimeVersion};

/// The type URL containerd reads the runtime-spec `Features` (JSON) under.
const FEATURES_TYPE_URL: &str =
    "types.containerd.io/opencontainers/runtime-spec/1/features/Features";
/// How long the OCI runtime may take to describe itself, and how much of it is read.
const FEATURES_TIMEOUT: Duration = Duration::from_secs(5);
const MAX_BYTES: u64 = 1024 * 1024;

pub fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut input = Vec::new();
    std::io::stdin().take(MAX_BYTES).read_to_end(&mut input)?;
    let options = if input.is_empty() {
        None
    } else {
        Some(Any::parse_from_bytes(&input)?)
    };
    let binary = options
        .as_ref()
        .filter(|any| any.type_url.ends_with("containerd.runc.v1.Options"))
        .and_then(|any| Options::parse_from_bytes(&any.value).ok())
        .map(|o| o.binary_name)
        .filter(|b| !b.is_empty())
        .unwrap_or_else(|| "runc".to_string());
    let features = runtime_features(&binary).map(|json| Any {
        type_url: FEATURES_TYPE_URL.to_string(),
        value: json,
        ..Default::default()
    });
    let info = RuntimeInfo {
        name: "io.containerd.crius.v2".to_string(),
        version: MessageField::some(RuntimeVersion {
            version: crate::task::service::VERSION.to_string(),
            ..Default::default()
        }),
        options: options.into(),
        // A runtime that cannot say leaves containerd nothing to check the spec against.
        features: features.into(),
        ..Default::default()
    };
    let mut stdout = std::io::stdout();
    stdout.write_all(&info.write_to_bytes()?)?;
    stdout.flush()?;
    Ok(())
}

/// `<binary> features`, within [`FEATURES_TIMEOUT`]; `None` when it cannot answer.
fn runtime_features(binary: &str) -> Option<Vec<u8>> {
    let mut child = Command::new(binary)
        .arg("features")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let mut stdout = child.stdout.take()?;
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        let _ = (&mut stdout).take(MAX_BYTES).read_to_end(&mut out);
        out
    });
    let deadline = Instant::now() + FEATURES_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    };
    let out = reader.join().ok()?;
    (status.success() && !out.is_empty()).then_some(out)
}
