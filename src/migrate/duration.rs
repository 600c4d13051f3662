//! containerd writes durations the way Go prints them ("4h0m0s", "1m30s", "300ms", "1.5h").

use std::time::Duration;

/// Nanoseconds per unit, longest unit names first so "ms" is not read as "m".
const UNITS: &[(&str, u128)] = &[
    ("ns", 1),
    ("us", 1_000),
    ("µs", 1_000),
    ("μs", 1_000),
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60_000_000_000),
    ("h", 3_600_000_000_000),
];

/// A non-negative Go duration; `None` when `text` is not one (or is negative or too long).
pub(crate) fn parse_go_duration(text: &str) -> Option<Duration> {
    let mut rest = text.strip_prefix('+').unwrap_or(text);
    if rest == "0" {
        return Some(Duration::ZERO);
    }
    if rest.is_empty() {
        return None;
    }
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let (nanos, after) = one_term(rest)?;
        total = total.checked_add(nanos)?;
        rest = after;
    }
    let secs = u64::try_from(total / 1_000_000_000).ok()?;
    let sub = u32::try_from(total % 1_000_000_000).ok()?;
    Some(Duration::new(secs, sub))
}

/// One `<number>[.<fraction>]<unit>` term: its nanoseconds and the text after it.
fn one_term(text: &str) -> Option<(u128, &str)> {
    let number_end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, rest) = text.split_at(number_end);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() {
        return None;
    }
    let unit_end = rest
        .find(|c: char| c.is_ascii_digit() || c == '.')
        .unwrap_or(rest.len());
    let (unit, rest) = rest.split_at(unit_end);
    let per_unit = UNITS.iter().find(|(name, _)| *name == unit)?.1;
    let whole: u128 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let mut nanos = whole.checked_mul(per_unit)?;
    let mut scale = per_unit;
    for digit in fraction.chars().take(18) {
        scale /= 10;
        nanos = nanos.checked_add(u128::from(digit.to_digit(10)?) * scale)?;
    }
    Some((nanos, rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        let secs = Duration::from_secs;
        assert_eq!(parse_go_duration("4h0m0s"), Some(secs(4 * 3600)));
        assert_eq!(parse_go_duration("5m0s"), Some(secs(300)));
        assert_eq!(parse_go_duration("1m30s"), Some(secs(90)));
        assert_eq!(parse_go_duration("0s"), Some(Duration::ZERO));
        assert_eq!(parse_go_duration("0"), Some(Duration::ZERO));
        assert_eq!(parse_go_duration("300ms"), Some(Duration::from_millis(300)));
        assert_eq!(parse_go_duration("1.5h"), Some(secs(5400)));
        assert_eq!(parse_go_duration("2µs"), Some(Duration::from_micros(2)));
        for bad in [
            "",
            "4",
            "h",
            "-1s",
            "1x",
            "1.2.3s",
            ".s",
            "99999999999999999999999h",
        ] {
            assert_eq!(parse_go_duration(bad), None, "{bad}");
        }
    }
}
