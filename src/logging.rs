//! Log set-up: `tracing` to stderr, text or JSON, filtered by the configured level.

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Installs the global subscriber. `level` is a tracing filter such as `info` or
/// `crius=debug,info`; the `CRIUS_LOG` environment variable, when set, overrides it.
pub fn init(level: &str, format: LogFormat) {
    let filter = std::env::var("CRIUS_LOG")
        .ok()
        .and_then(|env| EnvFilter::try_new(env).ok())
        .or_else(|| EnvFilter::try_new(level).ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // A second init (tests) is harmless: keep the first subscriber.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}
