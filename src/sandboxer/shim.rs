//! One pod's shim, as the sandbox controller drives it: started with the shim binary's
//! `start` action in the pod's bundle, then called over ttrpc on its `Sandbox` service
//! (`containerd.runtime.sandbox.v1`, prost messages, the call made by hand: the service
//! has no Rust client crius could use).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use prost::Message;
use tokio::io::AsyncReadExt;

use super::SandboxerError;

const SERVICE: &str = "containerd.runtime.sandbox.v1.Sandbox";
/// How long the shim's `start` may take to answer with its address.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// Most bytes read from `start`'s output (a JSON line with an address).
const START_OUTPUT_LIMIT: u64 = 64 * 1024;
/// Most bytes read from a bundle's `address` file (a unix socket path).
const ADDRESS_LIMIT: u64 = 4096;
/// Deadline of the quick calls (all but Wait and Stop, which take their own).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// What a shim's `start` printed: containerd 2.x's bootstrap JSON.
#[derive(Debug, serde::Deserialize)]
struct Bootstrap {
    version: u32,
    address: String,
    protocol: String,
}

/// How to start a pod's shim.
pub struct Launch<'a> {
    pub binary: &'a Path,
    pub namespace: &'a str,
    pub containerd_address: &'a Path,
    pub containerd_ttrpc_address: &'a Path,
    pub id: &'a str,
    pub bundle: &'a Path,
}

/// Runs the shim's `start` in `bundle` and returns the task/sandbox address it serves
/// (`unix://...`). The bundle has no spec, so the shim answers as a version 3 shim.
pub async fn start(launch: &Launch<'_>) -> Result<String, SandboxerError> {
    let mut child = tokio::process::Command::new(launch.binary)
        .args(["-namespace", launch.namespace])
        .arg("-address")
        .arg(launch.containerd_address)
        .args(["-publish-binary", "containerd", "-id", launch.id, "start"])
        .env("TTRPC_ADDRESS", launch.containerd_ttrpc_address)
        .current_dir(launch.bundle)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| SandboxerError::Shim(format!("run {}: {e}", launch.binary.display())))?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| SandboxerError::Shim("no stdout".into()))?;
    let stderr = child
        .stderr
        .take()
        .ok_or_else(|| SandboxerError::Shim("no stderr".into()))?;
    let finished = tokio::time::timeout(START_TIMEOUT, async {
        let mut out = Vec::new();
        let mut err = Vec::new();
        let mut stdout = stdout.take(START_OUTPUT_LIMIT);
        let mut stderr = stderr.take(START_OUTPUT_LIMIT);
        let (read_out, read_err) =
            tokio::join!(stdout.read_to_end(&mut out), stderr.read_to_end(&mut err),);
        read_out.and(read_err)?;
        let status = child.wait().await?;
        Ok::<_, std::io::Error>((status, out, err))
    })
    .await
    .map_err(|_| SandboxerError::Shim(format!("shim start for {} timed out", launch.id)))?
    .map_err(|e| SandboxerError::Shim(format!("shim start for {}: {e}", launch.id)))?;
    let (status, out, err) = finished;
    if !status.success() {
        return Err(SandboxerError::Shim(format!(
            "shim start for {} failed ({status}): {}",
            launch.id,
            String::from_utf8_lossy(&err).trim()
        )));
    }
    parse_bootstrap(&out)
}

/// The address in a shim's bootstrap answer, which must be a ttrpc version 3 shim.
fn parse_bootstrap(out: &[u8]) -> Result<String, SandboxerError> {
    let answer: Bootstrap = serde_json::from_slice(out).map_err(|e| {
        SandboxerError::Shim(format!(
            "shim start answered {:?}, not bootstrap JSON: {e}",
            String::from_utf8_lossy(out)
        ))
    })?;
    if answer.version < 3 || answer.protocol != "ttrpc" || !answer.address.starts_with("unix://") {
        return Err(SandboxerError::Shim(format!(
            "shim answered version {} over {} at {}: a ttrpc version 3 shim on a unix socket is needed",
            answer.version, answer.protocol, answer.address
        )));
    }
    Ok(answer.address)
}

/// The address a shim's `start` wrote into its bundle (`address`), to find it again after
/// a restart of crius.
pub fn recorded_address(bundle: &Path) -> Option<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(bundle.join("address"))
        .ok()?
        .take(ADDRESS_LIMIT)
        .read_to_string(&mut text)
        .ok()?;
    let address = text.trim();
    address.starts_with("unix://").then(|| address.to_string())
}

/// A ttrpc connection to one shim's sandbox service.
#[derive(Clone)]
pub struct ShimClient {
    pub address: String,
    pub bundle: PathBuf,
    client: ttrpc::r#async::Client,
}

impl ShimClient {
    pub async fn connect(address: &str, bundle: &Path) -> Result<Self, SandboxerError> {
        let client = ttrpc::r#async::Client::connect(address)
            .await
            .map_err(|e| SandboxerError::Unavailable(format!("connect to shim {address}: {e}")))?;
        Ok(Self {
            address: address.to_string(),
            bundle: bundle.to_path_buf(),
            client,
        })
    }

    /// One unary call; `timeout` None waits as long as the shim takes (Wait).
    pub async fn call<Req: Message, Resp: Message + Default>(
        &self,
        method: &str,
        request: &Req,
        timeout: Option<Duration>,
    ) -> Result<Resp, SandboxerError> {
        let mut req = ttrpc::Request::new();
        req.service = SERVICE.to_string();
        req.method = method.to_string();
        req.payload = request.encode_to_vec();
        req.timeout_nano = timeout.map_or(0, |t| i64::try_from(t.as_nanos()).unwrap_or(i64::MAX));
        let response = self
            .client
            .request(req)
            .await
            .map_err(|e| SandboxerError::from_ttrpc(method, e))?;
        Resp::decode(response.payload.as_slice())
            .map_err(|e| SandboxerError::Shim(format!("{method}: bad answer: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_version_3_ttrpc_shim_on_a_unix_socket_is_taken() {
        let ok = br#"{"version":3,"address":"unix:///run/s/x","protocol":"ttrpc"}"#;
        assert_eq!(parse_bootstrap(ok).expect("v3"), "unix:///run/s/x");
        for bad in [
            &b"unix:///run/s/x"[..],
            br#"{"version":2,"address":"unix:///run/s/x","protocol":"ttrpc"}"#,
            br#"{"version":3,"address":"vsock://3:1024","protocol":"ttrpc"}"#,
            br#"{"version":3,"address":"unix:///x","protocol":"grpc"}"#,
        ] {
            assert!(
                parse_bootstrap(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn the_recorded_address_is_read_back_and_junk_is_not() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(recorded_address(dir.path()), None);
        std::fs::write(dir.path().join("address"), "unix:///run/s/y").expect("write");
        assert_eq!(
            recorded_address(dir.path()).as_deref(),
            Some("unix:///run/s/y")
        );
        std::fs::write(dir.path().join("address"), "/etc/passwd").expect("write");
        assert_eq!(recorded_address(dir.path()), None);
    }
}
