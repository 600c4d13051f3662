//! Failpoints: named places where tests make crius fail, stall or die on purpose.
//!
//! They are read once from `CRIUS_FAILPOINTS`, a `;`-separated list of `name=action`, where
//! action is `error`, `error(<n>)` (the first n hits only), `kill` (SIGKILL to crius itself,
//! as a crash would) or `sleep(<ms>)`.
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
    /// An error for the first this many hits, then nothing.
    ErrorTimes(u32),
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
            other => {
                let argument = |prefix: &str| {
                    other
                        .strip_prefix(prefix)
                        .and_then(|rest| rest.strip_suffix(')'))
                        .and_then(|n| n.parse::<u64>().ok())
                };
                if let Some(ms) = argument("sleep(") {
                    Action::Sleep(Duration::from_millis(ms))
                } else if let Some(n) = argument("error(") {
                    Action::ErrorTimes(u32::try_from(n).unwrap_or(u32::MAX))
                } else {
                    tracing::warn!(entry, "ignoring failpoint with unknown action");
                    continue;
                }
            }
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
        Some(Action::ErrorTimes(times)) => {
            if count_hit(name) > *times {
                return Ok(());
            }
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

/// How many times `name` has been hit, this one included.
#[cfg(feature = "failpoints")]
fn count_hit(name: &str) -> u32 {
    static HITS: OnceLock<std::sync::Mutex<HashMap<String, u32>>> = OnceLock::new();
    let mut hits = HITS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let count = hits.entry(name.to_string()).or_insert(0);
    *count = count.saturating_add(1);
    *count
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
        let points = parse("a=error; b=sleep(250);c=kill;d;e=bogus;f=error(2)");
        assert_eq!(points.get("f"), Some(&Action::ErrorTimes(2)));
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
