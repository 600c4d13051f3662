//! Failpoints: named places where tests make crius fail, stall or die on purpose.
//!
//! They are read once from `CRIUS_FAILPOINTS`, a `;`-separated list of `name=action`, where
//! action is `error`, `kill` (SIGKILL to crius itself, as a crash would) or `sleep(<ms>)`.
//! With the variable unset every check is a single load of an empty map.
//!
//! They exist only in a build with the `failpoints` feature (the test build, `make test`):
//! a release binary has none, whatever its environment says.

#[cfg(feature = "failpoints")]
use std::collections::HashMap;
#[cfg(feature = "failpoints")]
use std::sync::OnceLock;
#[cfg(feature = "failpoints")]
use std::time::Duration;

/// The environment variable that configures failpoints.
pub const ENV: &str = "CRIUS_FAILPOINTS";

#[cfg(feature = "failpoints")]
#[derive(Debug, Clone, PartialEq, Eq)]
enum Action {
    Error,
    Kill,
    Sleep(Duration),
}

/// A failpoint configured to fail fired.
#[derive(Debug, thiserror::Error)]
#[error("failpoint {0} triggered")]
pub struct Triggered(pub String);

#[cfg(feature = "failpoints")]
fn parse(spec: &str) -> HashMap<String, Action> {
    let mut points = HashMap::new();
    for entry in spec.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let (name, action) = entry.split_once('=').unwrap_or((entry, "error"));
        let action = match action.trim() {
            "error" => Action::Error,
            "kill" => Action::Kill,
            other => match other
                .strip_prefix("sleep(")
                .and_then(|rest| rest.strip_suffix(')'))
                .and_then(|ms| ms.parse::<u64>().ok())
            {
                Some(ms) => Action::Sleep(Duration::from_millis(ms)),
                None => {
                    tracing::warn!(entry, "ignoring failpoint with unknown action");
                    continue;
                }
            },
        };
        points.insert(name.trim().to_string(), action);
    }
    points
}

#[cfg(feature = "failpoints")]
fn points() -> &'static HashMap<String, Action> {
    static POINTS: OnceLock<HashMap<String, Action>> = OnceLock::new();
    POINTS.get_or_init(|| std::env::var(ENV).map(|s| parse(&s)).unwrap_or_default())
}

/// Without the `failpoints` feature there are none: always `Ok`.
#[cfg(not(feature = "failpoints"))]
pub async fn hit(_name: &str) -> Result<(), Triggered> {
    Ok(())
}

/// Without the `failpoints` feature there are none: always `Ok`.
#[cfg(not(feature = "failpoints"))]
pub async fn hit_rpc(_rpc: &str) -> Result<(), Triggered> {
    Ok(())
}

/// Evaluates the failpoint `name`: sleeps, kills the process, or returns an error as
/// configured; returns `Ok` when it is not configured.
#[cfg(feature = "failpoints")]
pub async fn hit(name: &str) -> Result<(), Triggered> {
    let points = points();
    if points.is_empty() {
        return Ok(());
    }
    match points.get(name) {
        None => Ok(()),
        Some(Action::Sleep(d)) => {
            tracing::warn!(failpoint = name, delay = ?d, "failpoint sleeping");
            tokio::time::sleep(*d).await;
            Ok(())
        }
        Some(Action::Error) => {
            tracing::warn!(failpoint = name, "failpoint returning an error");
            Err(Triggered(name.to_string()))
        }
        Some(Action::Kill) => {
            tracing::warn!(failpoint = name, "failpoint killing crius");
            // SIGKILL cannot be caught: this is the crash the failpoint stands for.
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
            Err(Triggered(name.to_string()))
        }
    }
}

/// Evaluates the failpoint `rpc.<Method>` for a CRI call; free when none is configured.
#[cfg(feature = "failpoints")]
pub async fn hit_rpc(rpc: &str) -> Result<(), Triggered> {
    if points().is_empty() {
        return Ok(());
    }
    hit(&format!("rpc.{rpc}")).await
}

#[cfg(all(test, feature = "failpoints"))]
mod tests {
    use super::*;

    #[test]
    fn parses_actions_and_defaults_to_error() {
        let points = parse("a=error; b=sleep(250);c=kill;d;e=bogus");
        assert_eq!(points.get("a"), Some(&Action::Error));
        assert_eq!(
            points.get("b"),
            Some(&Action::Sleep(Duration::from_millis(250)))
        );
        assert_eq!(points.get("c"), Some(&Action::Kill));
        assert_eq!(points.get("d"), Some(&Action::Error));
        assert!(!points.contains_key("e"));
    }
}
