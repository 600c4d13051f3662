//! Log set-up: `tracing` to stderr, text or JSON, filtered by the configured level.
//!
//! The filter is a static list of targets and levels (`Targets`), not `EnvFilter`: crius
//! never filters on span fields, and `EnvFilter` brings a regex engine (some 300 KiB of
//! code, all of it resident) and a per-event span lookup.

use tracing_subscriber::filter::Targets;
use tracing_subscriber::prelude::*;

use crate::config::LogFormat;

/// Parses a log level or filter such as `info` or `crius=debug,info`. `EnvFilter`'s span
/// and field directives (`crius[exec{id=..}]=debug`) are refused: `Targets` would take them
/// for a target name that never matches.
pub fn parse_filter(filter: &str) -> Option<Targets> {
    if filter.contains(['[', ']', '{', '}']) {
        return None;
    }
    filter.trim().parse().ok()
}

/// Installs the global subscriber. `level` is a filter as [`parse_filter`] reads it; the
/// `CRIUS_LOG` environment variable, when set, overrides it.
pub fn init(level: &str, format: LogFormat) {
    let filter = std::env::var("CRIUS_LOG")
        .ok()
        .and_then(|env| parse_filter(&env))
        .or_else(|| parse_filter(level))
        .unwrap_or_else(|| Targets::new().with_default(tracing::Level::INFO));
    let layer = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let registry = tracing_subscriber::registry().with(filter);
    // A second init (tests) is harmless: keep the first subscriber.
    let _ = match format {
        LogFormat::Text => registry.with(layer).try_init(),
        LogFormat::Json => registry.with(layer.json()).try_init(),
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::Level;

    #[test]
    fn reads_a_bare_level_and_per_target_levels() {
        let filter = parse_filter("crius=debug,info").expect("filter");
        assert!(filter.would_enable("crius::cri", &Level::DEBUG));
        assert!(!filter.would_enable("h2", &Level::DEBUG));
        assert!(filter.would_enable("h2", &Level::INFO));
        let warn = parse_filter("warn").expect("level");
        assert!(!warn.would_enable("crius", &Level::INFO));
        assert!(warn.would_enable("crius", &Level::WARN));
        let off = parse_filter("off").expect("off");
        assert!(!off.would_enable("crius", &Level::ERROR));
    }

    #[test]
    fn refuses_what_is_not_a_filter() {
        assert!(parse_filter("crius=loud").is_none());
        assert!(parse_filter("info,h2=verbose").is_none());
        // EnvFilter's span and field directives are not understood, so not accepted.
        assert!(parse_filter("crius[request{id=1}]=debug").is_none());
        assert!(parse_filter("[exec]=trace").is_none());
    }
}
