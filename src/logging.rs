//! Log set-up: `tracing` to stderr, text or JSON, filtered by the configured level.
//!
//! The filter is a static list of targets and levels (`Targets`), not `EnvFilter`: crius
//! never filters on span fields, and `EnvFilter` brings a regex engine (some 300 KiB of
//! code, all of it resident) and a per-event span lookup.
//!
//! Text lines are coloured only when stderr is a terminal and `NO_COLOR` is unset: a file,
//! a pipe or the journal gets plain lines. When stderr is systemd's journal stream
//! (`JOURNAL_STREAM` names it), each line starts with its syslog priority (`<3>` for an
//! error ... `<7>` for debug), which journald reads as the entry's level and strips.

use std::ffi::OsStr;
use std::io::IsTerminal;
use std::os::fd::AsFd;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::prelude::*;
use tracing_subscriber::registry::LookupSpan;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Parses a log level or filter such as `info` or `crius=debug,info`. `EnvFilter`'s span
/// and field directives (`crius[exec{id=..}]=debug`) are refused: `Targets` would take them
/// for a target name that never matches.
pub fn parse_filter(filter: &str) -> Option<Targets> {
    if filter.contains(['[', ']', '{', '}']) {
        return None;
    }
    filter.trim().parse().ok()
}

/// Whether text lines get ANSI colours: only on a terminal, and never when `NO_COLOR` is
/// set to anything but the empty string (no-color.org).
pub fn wants_colour(is_terminal: bool, no_color: Option<&OsStr>) -> bool {
    is_terminal && no_color.is_none_or(OsStr::is_empty)
}

/// Whether stderr is the journal stream systemd gave this process: `JOURNAL_STREAM` is
/// `<device>:<inode>` of that stream, and only counts while stderr is still that file
/// (a redirection by hand leaves the variable behind).
fn stderr_is_journal(journal_stream: Option<&OsStr>) -> bool {
    let Some((device, inode)) = journal_stream
        .and_then(OsStr::to_str)
        .and_then(|s| s.split_once(':'))
    else {
        return false;
    };
    let Ok(stat) = nix::sys::stat::fstat(std::io::stderr().as_fd()) else {
        return false;
    };
    device.parse::<u64>().is_ok_and(|d| d == stat.st_dev)
        && inode.parse::<u64>().is_ok_and(|i| i == stat.st_ino)
}

/// The syslog priority journald reads from a `<N>` line prefix (sd-daemon(3)).
pub fn syslog_priority(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        Level::DEBUG | Level::TRACE => 7,
    }
}

/// Puts the event's syslog priority in front of the line another formatter writes.
struct JournalPriority<F>(F);

impl<S, N, F> FormatEvent<S, N> for JournalPriority<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        write!(writer, "<{}>", syslog_priority(event.metadata().level()))?;
        self.0.format_event(ctx, writer, event)
    }
}

/// Installs the global subscriber. `level` is a filter as [`parse_filter`] reads it; the
/// `CRIUS_LOG` environment variable, when set, overrides it.
pub fn init(level: &str, format: LogFormat) {
    let filter = std::env::var("CRIUS_LOG")
        .ok()
        .and_then(|env| parse_filter(&env))
        .or_else(|| parse_filter(level))
        .unwrap_or_else(|| Targets::new().with_default(tracing::Level::INFO));
    let colour = wants_colour(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    let journal = stderr_is_journal(std::env::var_os("JOURNAL_STREAM").as_deref());
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(colour);
    let registry = tracing_subscriber::registry().with(filter);
    // A second init (tests) is harmless: keep the first subscriber.
    let _ = match (format, journal) {
        (LogFormat::Text, false) => registry.with(layer).try_init(),
        (LogFormat::Text, true) => {
            // The journal keeps its own timestamp for every entry.
            let text = tracing_subscriber::fmt::format()
                .without_time()
                .with_ansi(false);
            registry
                .with(layer.event_format(JournalPriority(text)))
                .try_init()
        }
        (LogFormat::Json, _) => registry.with(layer.json()).try_init(),
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
    fn colours_only_a_terminal_without_no_color() {
        assert!(wants_colour(true, None));
        assert!(
            !wants_colour(false, None),
            "a file or a pipe gets plain lines"
        );
        assert!(!wants_colour(true, Some(OsStr::new("1"))));
        // no-color.org: an empty NO_COLOR is as if unset.
        assert!(wants_colour(true, Some(OsStr::new(""))));
        assert!(!wants_colour(false, Some(OsStr::new(""))));
    }

    #[test]
    fn journal_priorities_are_syslog_levels() {
        assert_eq!(syslog_priority(&Level::ERROR), 3);
        assert_eq!(syslog_priority(&Level::WARN), 4);
        assert_eq!(syslog_priority(&Level::INFO), 6);
        assert_eq!(syslog_priority(&Level::DEBUG), 7);
    }

    #[test]
    fn a_journal_stream_that_is_not_stderr_is_ignored() {
        assert!(!stderr_is_journal(None));
        assert!(!stderr_is_journal(Some(OsStr::new("garbage"))));
        // A device and inode no stderr has (a variable left behind by a redirection).
        assert!(!stderr_is_journal(Some(OsStr::new("0:0"))));
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
