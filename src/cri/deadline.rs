//! Client deadlines: gRPC's `grpc-timeout` header and ttrpc's `timeout_nano`. Every RPC is
//! bounded by its client's deadline (`DEADLINE_EXCEEDED` when it passes), and handlers with
//! work to undo (PullImage) read it with [`current`] to stop and clean up in time.

use std::time::Duration;

use tokio::time::Instant;

tokio::task_local! {
    static DEADLINE: Option<Instant>;
}

/// The deadline of the RPC this task serves, if its client set one.
pub fn current() -> Option<Instant> {
    DEADLINE.try_with(|d| *d).ok().flatten()
}

/// Runs `call` with `deadline` as [`current`].
pub async fn scope<F: std::future::Future>(deadline: Option<Instant>, call: F) -> F::Output {
    DEADLINE.scope(deadline, call).await
}

/// Parses `grpc-timeout` (`<up to 8 digits><unit>`, unit one of `H M S m u n`).
pub fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    let unit = value.chars().last()?;
    let digits = &value[..value.len() - unit.len_utf8()];
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        'H' => Duration::from_secs(n.checked_mul(3600)?),
        'M' => Duration::from_secs(n.checked_mul(60)?),
        'S' => Duration::from_secs(n),
        'm' => Duration::from_millis(n),
        'u' => Duration::from_micros(n),
        'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// The deadline of a gRPC request, from its metadata.
pub fn from_grpc_metadata(metadata: &tonic::metadata::MetadataMap) -> Option<Instant> {
    let timeout = metadata
        .get("grpc-timeout")
        .and_then(|v| v.to_str().ok())
        .and_then(parse_grpc_timeout)?;
    Some(Instant::now() + timeout)
}

/// ttrpc's `timeout_nano` (0 for none) as a `grpc-timeout` value: the finest unit that fits
/// in the header's 8 digits.
pub fn grpc_timeout_header(timeout_nano: i64) -> Option<String> {
    let nanos = u64::try_from(timeout_nano).ok().filter(|n| *n > 0)?;
    const UNITS: [(char, u64); 6] = [
        ('n', 1),
        ('u', 1_000),
        ('m', 1_000_000),
        ('S', 1_000_000_000),
        ('M', 60_000_000_000),
        ('H', 3_600_000_000_000),
    ];
    UNITS
        .iter()
        .find(|(_, per)| nanos / per < 100_000_000)
        .map(|(unit, per)| format!("{}{unit}", (nanos / per).max(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_in_every_unit_and_garbage_ignored() {
        assert_eq!(parse_grpc_timeout("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(parse_grpc_timeout("3M"), Some(Duration::from_secs(180)));
        assert_eq!(parse_grpc_timeout("10S"), Some(Duration::from_secs(10)));
        assert_eq!(parse_grpc_timeout("250m"), Some(Duration::from_millis(250)));
        assert_eq!(parse_grpc_timeout("7u"), Some(Duration::from_micros(7)));
        assert_eq!(
            parse_grpc_timeout("99999999n"),
            Some(Duration::from_nanos(99_999_999))
        );
        for bad in ["", "S", "123456789S", "10s", "1.5S", "-1S", "10"] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn ttrpc_timeouts_become_grpc_timeout_values() {
        assert_eq!(grpc_timeout_header(0), None);
        assert_eq!(grpc_timeout_header(-5), None);
        assert_eq!(grpc_timeout_header(1_500), Some("1500n".to_string()));
        assert_eq!(
            grpc_timeout_header(120_000_000_000),
            Some("120000m".to_string())
        );
        for nanos in [1, 99_999_999, 100_000_000, 7_200_000_000_000, i64::MAX] {
            let header = grpc_timeout_header(nanos).unwrap();
            let parsed = parse_grpc_timeout(&header).unwrap();
            let wanted = Duration::from_nanos(nanos as u64);
            assert!(parsed <= wanted, "{nanos} -> {header}");
            assert!(
                parsed.as_secs_f64() >= wanted.as_secs_f64() * 0.99,
                "{nanos} -> {header}"
            );
        }
    }

    #[tokio::test]
    async fn the_deadline_is_visible_inside_its_scope_only() {
        assert_eq!(current(), None);
        let at = Instant::now() + Duration::from_secs(5);
        assert_eq!(scope(Some(at), async { current() }).await, Some(at));
        assert_eq!(current(), None);
    }
}

#[cfg(test)]
mod fuzz {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(crate::fuzz_config())]

        #[test]
        fn any_grpc_timeout_parses_or_is_none(value in "\\PC{0,12}") {
            let _ = parse_grpc_timeout(&value);
        }

        #[test]
        fn every_ttrpc_timeout_becomes_a_header_that_parses(nanos in 1i64..i64::MAX) {
            let header = grpc_timeout_header(nanos).unwrap();
            prop_assert!(parse_grpc_timeout(&header).is_some(), "{}", header);
        }
    }
}
