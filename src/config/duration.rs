//! Durations in Go's `time.ParseDuration` / `time.Duration.String` notation.
//!
//! Kubernetes configuration (KubeletConfiguration's `metav1.Duration` fields) and the kubelet
//! flags spell durations the Go way: `10s`, `1m30s`, `1.5h`, `300ms`. This module reads and
//! writes that notation. Negative durations are rejected: no Deckhand setting needs one.

use std::time::Duration;

/// Largest duration Go can represent (`math.MaxInt64` nanoseconds, about 292 years). Inputs
/// beyond it are rejected so that a value we accept is one upstream would accept too.
const MAX_NANOS: u128 = i64::MAX as u128;

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// Why a duration string was rejected. The message does not repeat the input; callers wrap it
/// as `field: invalid duration "<input>": <this>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("empty duration (expected e.g. 10s, 1m30s, 1.5h)")]
    Empty,
    #[error("negative durations are not allowed")]
    Negative,
    #[error("expected a number at byte {at} (durations look like 10s, 1m30s, 1.5h)")]
    ExpectedNumber { at: usize },
    #[error("missing unit after {number:?} (use one of ns, us, µs, ms, s, m, h)")]
    MissingUnit { number: String },
    #[error("unknown unit {unit:?} (use one of ns, us, µs, ms, s, m, h)")]
    UnknownUnit { unit: String },
    #[error("duration is too large (at most about 292 years)")]
    Overflow,
}

/// Nanoseconds in one of Go's duration units, or `None` for an unknown unit.
fn unit_nanos(unit: &str) -> Option<u128> {
    Some(match unit {
        "ns" => 1,
        // Go accepts the micro sign (U+00B5) and the Greek small mu (U+03BC).
        "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
        "ms" => 1_000_000,
        "s" => NANOS_PER_SEC,
        "m" => 60 * NANOS_PER_SEC,
        "h" => 3_600 * NANOS_PER_SEC,
        _ => return None,
    })
}

/// Parses a Go duration such as `10s`, `1m30s`, `1.5h`, `300ms`, `2h45m` or `0`.
///
/// The grammar is Go's: an optional `+` sign, then one or more `<number><unit>` pairs where the
/// number may carry a fraction (`1.5`, `.5`, `5.`) and the unit is one of `ns`, `us` (or `µs`),
/// `ms`, `s`, `m`, `h`. A bare `0` is the only number allowed without a unit. A leading `-` is
/// rejected with [`DurationError::Negative`].
pub fn parse_go_duration(input: &str) -> Result<Duration, DurationError> {
    let mut rest = input;
    if let Some(after) = rest.strip_prefix('+') {
        rest = after;
    } else if rest.starts_with('-') {
        return Err(DurationError::Negative);
    }
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(if input.is_empty() {
            DurationError::Empty
        } else {
            DurationError::ExpectedNumber { at: input.len() }
        });
    }

    let mut total: u128 = 0;
    while !rest.is_empty() {
        let at = input.len() - rest.len();

        // Integer part.
        let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
        let int_digits = &rest[..int_len];
        rest = &rest[int_len..];

        // Optional fraction.
        let mut frac_digits = "";
        let mut had_dot = false;
        if let Some(after) = rest.strip_prefix('.') {
            had_dot = true;
            let frac_len = after.bytes().take_while(u8::is_ascii_digit).count();
            frac_digits = &after[..frac_len];
            rest = &after[frac_len..];
        }
        if int_digits.is_empty() && frac_digits.is_empty() {
            // Covers "s", ".s", "1h-" and stray characters.
            return Err(DurationError::ExpectedNumber { at });
        }
        let number_end = input.len() - rest.len();

        // Unit: everything up to the next digit or dot.
        let unit_len = rest
            .char_indices()
            .find(|&(_, c)| c == '.' || c.is_ascii_digit())
            .map_or(rest.len(), |(i, _)| i);
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        if unit.is_empty() {
            return Err(DurationError::MissingUnit {
                number: input[at..number_end].to_string(),
            });
        }
        let scale = unit_nanos(unit).ok_or_else(|| DurationError::UnknownUnit {
            unit: unit.to_string(),
        })?;

        let whole = parse_digits(int_digits)?;
        let mut component = whole.checked_mul(scale).ok_or(DurationError::Overflow)?;
        if had_dot && !frac_digits.is_empty() {
            // Digits past 18 cannot change the result by a whole nanosecond (the largest unit
            // is 3.6e12 ns), so they are dropped, as Go effectively does.
            let kept = &frac_digits[..frac_digits.len().min(18)];
            let numerator = parse_digits(kept)?;
            // At most 10^18 - 1 times at most 3.6e12 and 10^18: all well inside u128, but
            // checked all the same so that no input can reach an overflow.
            let fraction = 10u128
                .checked_pow(kept.len() as u32)
                .and_then(|denominator| {
                    numerator
                        .checked_mul(scale)
                        .map(|scaled| scaled / denominator)
                })
                .ok_or(DurationError::Overflow)?;
            component = component
                .checked_add(fraction)
                .ok_or(DurationError::Overflow)?;
        }
        total = total
            .checked_add(component)
            .filter(|t| *t <= MAX_NANOS)
            .ok_or(DurationError::Overflow)?;
    }

    // `total` is at most i64::MAX nanoseconds, so both parts fit their types.
    let secs = u64::try_from(total / NANOS_PER_SEC).map_err(|_| DurationError::Overflow)?;
    let nanos = u32::try_from(total % NANOS_PER_SEC).map_err(|_| DurationError::Overflow)?;
    Ok(Duration::new(secs, nanos))
}

fn parse_digits(digits: &str) -> Result<u128, DurationError> {
    let mut value: u128 = 0;
    for b in digits.bytes() {
        value = value
            .checked_mul(10)
            .and_then(|v| v.checked_add(u128::from(b - b'0')))
            .filter(|v| *v <= MAX_NANOS)
            .ok_or(DurationError::Overflow)?;
    }
    Ok(value)
}

/// Formats a duration the way Go's `time.Duration.String` does: `0s`, `300ms`, `1.5µs`,
/// `45s`, `1m30s`, `2m0s`, `1h0m0s`, `1h2m3.5s`.
pub fn format_go_duration(d: Duration) -> String {
    let total = d.as_nanos();
    if total == 0 {
        return "0s".to_string();
    }
    if total < NANOS_PER_SEC {
        // Below one second Go picks the largest unit that keeps the integer part non-zero.
        return if total < 1_000 {
            format!("{total}ns")
        } else if total < 1_000_000 {
            format!("{}µs", decimal(total, 3))
        } else {
            format!("{}ms", decimal(total, 6))
        };
    }

    let mut out = String::new();
    let hours = total / (3_600 * NANOS_PER_SEC);
    let minutes = (total / (60 * NANOS_PER_SEC)) % 60;
    let sec_nanos = total % (60 * NANOS_PER_SEC);
    if hours > 0 {
        out.push_str(&format!("{hours}h"));
    }
    if hours > 0 || minutes > 0 {
        out.push_str(&format!("{minutes}m"));
    }
    out.push_str(&decimal(sec_nanos, 9));
    out.push('s');
    out
}

/// `value / 10^scale` written in decimal with trailing fractional zeros (and a bare dot)
/// removed: `decimal(1500, 3)` is `1.5`, `decimal(2000, 3)` is `2`.
fn decimal(value: u128, scale: u32) -> String {
    let div = 10u128.pow(scale);
    let whole = value / div;
    let frac = value % div;
    if frac == 0 {
        return whole.to_string();
    }
    let digits = format!("{frac:0width$}", width = scale as usize);
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn parses_valid_durations() {
        let cases: &[(&str, Duration)] = &[
            ("0", Duration::ZERO),
            ("+0", Duration::ZERO),
            ("0s", Duration::ZERO),
            ("10s", Duration::from_secs(10)),
            ("1m30s", Duration::from_secs(90)),
            ("1.5h", Duration::from_secs(5_400)),
            ("300ms", ms(300)),
            ("2h45m", Duration::from_secs(2 * 3_600 + 45 * 60)),
            ("1h0m0s", Duration::from_secs(3_600)),
            ("1m0s", Duration::from_secs(60)),
            ("+5s", Duration::from_secs(5)),
            (".5s", ms(500)),
            ("5.s", Duration::from_secs(5)),
            ("1.25s", ms(1_250)),
            ("100ns", Duration::from_nanos(100)),
            ("7us", Duration::from_micros(7)),
            ("7µs", Duration::from_micros(7)),
            ("7\u{3bc}s", Duration::from_micros(7)),
            ("1.000000001s", Duration::new(1, 1)),
            ("0.0000000019s", Duration::from_nanos(1)),
            ("1s500ms", ms(1_500)),
            ("2562047h", Duration::from_secs(2_562_047 * 3_600)),
        ];
        for (input, want) in cases {
            assert_eq!(parse_go_duration(input), Ok(*want), "input {input:?}");
        }
    }

    #[test]
    fn rejects_invalid_durations() {
        let cases: &[(&str, DurationError)] = &[
            ("", DurationError::Empty),
            ("+", DurationError::ExpectedNumber { at: 1 }),
            (
                "10",
                DurationError::MissingUnit {
                    number: "10".into(),
                },
            ),
            (
                "1.5",
                DurationError::MissingUnit {
                    number: "1.5".into(),
                },
            ),
            ("1x", DurationError::UnknownUnit { unit: "x".into() }),
            (
                "1 minute",
                DurationError::UnknownUnit {
                    unit: " minute".into(),
                },
            ),
            ("10S", DurationError::UnknownUnit { unit: "S".into() }),
            ("s", DurationError::ExpectedNumber { at: 0 }),
            (".s", DurationError::ExpectedNumber { at: 0 }),
            ("1h-", DurationError::UnknownUnit { unit: "h-".into() }),
            ("1h 2m", DurationError::UnknownUnit { unit: "h ".into() }),
            ("-1s", DurationError::Negative),
            ("-0", DurationError::Negative),
            (" 1s", DurationError::ExpectedNumber { at: 0 }),
            ("2562048h", DurationError::Overflow),
            ("99999999999999999999999s", DurationError::Overflow),
        ];
        for (input, want) in cases {
            assert_eq!(
                parse_go_duration(input).as_ref(),
                Err(want),
                "input {input:?}"
            );
        }
    }

    #[test]
    fn every_bad_input_is_an_error() {
        // The brief's list, checked only for being rejected.
        for input in [
            "10", "1x", "s", "", "1h-", "1..5s", "1s.", "ms", "1e3s", "1,5s",
        ] {
            assert!(parse_go_duration(input).is_err(), "{input:?} was accepted");
        }
    }

    #[test]
    fn formats_like_go() {
        let cases: &[(Duration, &str)] = &[
            (Duration::ZERO, "0s"),
            (Duration::from_nanos(1), "1ns"),
            (Duration::from_nanos(999), "999ns"),
            (Duration::from_nanos(1_500), "1.5µs"),
            (Duration::from_micros(1), "1µs"),
            (ms(300), "300ms"),
            (Duration::from_micros(1_250), "1.25ms"),
            (Duration::from_secs(1), "1s"),
            (ms(1_500), "1.5s"),
            (Duration::from_secs(45), "45s"),
            (Duration::from_secs(60), "1m0s"),
            (Duration::from_secs(90), "1m30s"),
            (Duration::from_secs(120), "2m0s"),
            (Duration::from_secs(3_600), "1h0m0s"),
            (Duration::new(3_723, 500_000_000), "1h2m3.5s"),
            (Duration::from_secs(5_400), "1h30m0s"),
            (Duration::new(1, 1), "1.000000001s"),
            (Duration::from_secs(100 * 3_600), "100h0m0s"),
        ];
        for (d, want) in cases {
            assert_eq!(format_go_duration(*d), *want, "duration {d:?}");
        }
    }

    #[test]
    fn format_then_parse_round_trips() {
        for d in [
            Duration::ZERO,
            Duration::from_nanos(7),
            Duration::from_micros(1_500),
            Duration::new(3_723, 500_000_000),
            Duration::from_secs(300),
        ] {
            assert_eq!(parse_go_duration(&format_go_duration(d)), Ok(d));
        }
    }

    /// Edge cases a fuzzer would try first: the largest value Go accepts, one nanosecond
    /// more, long fractions, many components and non-ASCII bytes. None may panic.
    #[test]
    fn overflow_and_odd_input_regressions() {
        assert_eq!(
            parse_go_duration("9223372036854775807ns"),
            Ok(Duration::from_nanos(i64::MAX as u64))
        );
        assert_eq!(
            parse_go_duration("9223372036854775808ns"),
            Err(DurationError::Overflow)
        );
        assert_eq!(
            parse_go_duration("2562047h47m16.854775807s"),
            Ok(Duration::from_nanos(i64::MAX as u64))
        );
        assert_eq!(
            parse_go_duration("2562047h47m16.854775808s"),
            Err(DurationError::Overflow)
        );
        assert_eq!(
            parse_go_duration(&format!("0.{}h", "9".repeat(400))),
            Ok(Duration::from_nanos(3_599_999_999_999))
        );
        assert_eq!(
            parse_go_duration(&"1000000h".repeat(3)),
            Err(DurationError::Overflow)
        );
        assert_eq!(parse_go_duration("1.\u{b5}s"), Ok(Duration::from_micros(1)));
        for odd in ["1\u{b5}", "1\u{3bc}", "\u{b5}s", "1é", "1s\u{0}"] {
            assert!(parse_go_duration(odd).is_err(), "{odd:?} was accepted");
        }
    }
}
