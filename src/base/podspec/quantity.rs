//! Kubernetes resource quantities ("250m", "64Mi", "1.5G", "2e3"), parsed exactly.
//!
//! A quantity is kept as `digits × 10^exp10 × 2^exp2` so nothing is lost to floating point;
//! conversions round up, the way the API server's `Value()` / `MilliValue()` do.

use thiserror::Error;

/// Why a quantity string was rejected.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum QuantityError {
    #[error("empty quantity")]
    Empty,
    #[error("no digits in quantity")]
    NoDigits,
    #[error("unknown suffix {0:?}")]
    UnknownSuffix(String),
    #[error("too many significant digits")]
    TooPrecise,
    #[error("exponent out of range")]
    ExponentOutOfRange,
}

/// A parsed quantity. Compare values through [`Quantity::value`] / [`Quantity::milli_value`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quantity {
    negative: bool,
    digits: u128,
    exp10: i32,
    exp2: u32,
}

// 10^38 still fits in u128; anything beyond that is out of reach anyway.
const MAX_POW10: u32 = 38;

impl Quantity {
    /// True when the amount is zero (whatever the suffix).
    pub fn is_zero(&self) -> bool {
        self.digits == 0
    }

    /// The amount rounded up to a whole unit (bytes for memory, cores for CPU), saturated to
    /// the i64 range. Validation rejects amounts that do not fit (see [`Self::checked_value`]),
    /// so saturation only shows for quantities that bypassed it.
    pub fn value(&self) -> i64 {
        self.scaled_ceil(0).unwrap_or(self.saturated())
    }

    /// The amount in thousandths, rounded up (millicores for CPU), saturated to the i64 range.
    pub fn milli_value(&self) -> i64 {
        self.scaled_ceil(3).unwrap_or(self.saturated())
    }

    /// [`Self::value`], or `None` when the amount does not fit an i64.
    pub fn checked_value(&self) -> Option<i64> {
        self.scaled_ceil(0)
    }

    /// [`Self::milli_value`], or `None` when the amount in thousandths does not fit an i64.
    pub fn checked_milli_value(&self) -> Option<i64> {
        self.scaled_ceil(3)
    }

    /// True when the amount is below zero.
    pub fn is_negative(&self) -> bool {
        self.negative && self.digits != 0
    }

    fn saturated(&self) -> i64 {
        if self.negative { i64::MIN } else { i64::MAX }
    }

    /// `self × 10^scale`, rounded towards +∞; `None` when it does not fit an i64.
    ///
    /// All exponent arithmetic is done in i64 so that an input such as `1e2147483647` cannot
    /// wrap the i32 exponent (which used to turn a huge CPU limit into `1m`).
    fn scaled_ceil(&self, scale: i32) -> Option<i64> {
        if self.digits == 0 {
            return Some(0);
        }
        let n = 1u128
            .checked_shl(self.exp2)
            .and_then(|m| self.digits.checked_mul(m))?;
        let e = i64::from(self.exp10) + i64::from(scale);
        let magnitude: u128;
        let mut remainder_nonzero = false;
        if e >= 0 {
            magnitude = pow10(e).and_then(|p| n.checked_mul(p))?;
        } else {
            match pow10(-e) {
                Some(d) => {
                    magnitude = n / d;
                    remainder_nonzero = n % d != 0;
                }
                None => {
                    // Divisor larger than any u128: the whole amount is a fraction.
                    magnitude = 0;
                    remainder_nonzero = true;
                }
            }
        }
        if self.negative {
            // Rounding up a negative number drops the fraction. -2^63 itself fits.
            let m = i128::try_from(magnitude).ok()?;
            i64::try_from(-m).ok()
        } else {
            let up = magnitude.checked_add(u128::from(remainder_nonzero))?;
            i64::try_from(up).ok()
        }
    }
}

/// 10^e for 0 ≤ e ≤ 38; `None` above (and for a negative `e`, which callers never pass).
fn pow10(e: i64) -> Option<u128> {
    let e = u32::try_from(e).ok().filter(|e| *e <= MAX_POW10)?;
    Some(10u128.pow(e))
}

impl std::str::FromStr for Quantity {
    type Err = QuantityError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse(s)
    }
}

/// Parses a quantity string in the Kubernetes grammar:
/// `[+-] digits [. digits] [suffix]` where the suffix is a binary one (Ki Mi Gi Ti Pi Ei),
/// a decimal one (n u m k M G T P E) or a decimal exponent (`e3`, `E-2`).
pub fn parse(s: &str) -> Result<Quantity, QuantityError> {
    if s.is_empty() {
        return Err(QuantityError::Empty);
    }
    let bytes = s.as_bytes();
    let mut i = 0;
    let mut negative = false;
    if bytes[0] == b'+' || bytes[0] == b'-' {
        negative = bytes[0] == b'-';
        i = 1;
    }

    let mut digits: u128 = 0;
    let mut exp10: i32 = 0;
    let mut seen_digit = false;
    let mut in_fraction = false;
    while i < bytes.len() {
        let b = bytes[i];
        if b.is_ascii_digit() {
            seen_digit = true;
            digits = digits
                .checked_mul(10)
                .and_then(|d| d.checked_add(u128::from(b - b'0')))
                .ok_or(QuantityError::TooPrecise)?;
            if in_fraction {
                exp10 = exp10
                    .checked_sub(1)
                    .ok_or(QuantityError::ExponentOutOfRange)?;
            }
        } else if b == b'.' && !in_fraction {
            in_fraction = true;
        } else {
            break;
        }
        i += 1;
    }
    if !seen_digit {
        return Err(QuantityError::NoDigits);
    }

    let suffix = &s[i..];
    let mut exp2 = 0u32;
    let mut shift10 = 0i32;
    match suffix {
        "" => {}
        "Ki" => exp2 = 10,
        "Mi" => exp2 = 20,
        "Gi" => exp2 = 30,
        "Ti" => exp2 = 40,
        "Pi" => exp2 = 50,
        "Ei" => exp2 = 60,
        "n" => shift10 = -9,
        "u" => shift10 = -6,
        "m" => shift10 = -3,
        "k" => shift10 = 3,
        "M" => shift10 = 6,
        "G" => shift10 = 9,
        "T" => shift10 = 12,
        "P" => shift10 = 15,
        "E" => shift10 = 18,
        _ => {
            // Decimal exponent: e/E followed by a signed integer.
            let rest = suffix
                .strip_prefix('e')
                .or_else(|| suffix.strip_prefix('E'))
                .ok_or_else(|| QuantityError::UnknownSuffix(suffix.to_string()))?;
            let unsigned = rest.strip_prefix(['+', '-']).unwrap_or(rest);
            if unsigned.is_empty() || !unsigned.bytes().all(|b| b.is_ascii_digit()) {
                return Err(QuantityError::UnknownSuffix(suffix.to_string()));
            }
            shift10 = rest
                .parse()
                .map_err(|_| QuantityError::ExponentOutOfRange)?;
        }
    }
    exp10 = exp10
        .checked_add(shift10)
        .ok_or(QuantityError::ExponentOutOfRange)?;

    Ok(Quantity {
        negative: negative && digits != 0,
        digits,
        exp10,
        exp2,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_and_milli_value_table() {
        // (input, value(), milli_value())
        let cases: &[(&str, i64, i64)] = &[
            ("0", 0, 0),
            ("1", 1, 1000),
            ("500m", 1, 500),
            ("250m", 1, 250),
            ("1.5", 2, 1500),
            ("0.1", 1, 100),
            (".5", 1, 500),
            ("2.", 2, 2000),
            ("100n", 1, 1),
            ("1u", 1, 1),
            ("1k", 1000, 1_000_000),
            ("1M", 1_000_000, 1_000_000_000),
            ("1G", 1_000_000_000, 1_000_000_000_000),
            ("1T", 1_000_000_000_000, 1_000_000_000_000_000),
            ("1P", 1_000_000_000_000_000, 1_000_000_000_000_000_000),
            ("2E", 2_000_000_000_000_000_000, i64::MAX),
            ("1Ki", 1024, 1_024_000),
            ("64Mi", 67_108_864, 67_108_864_000),
            ("1.5Gi", 1_610_612_736, 1_610_612_736_000),
            ("1Ti", 1 << 40, (1i64 << 40) * 1000),
            ("1Pi", 1 << 50, (1i64 << 50) * 1000),
            ("1Ei", 1 << 60, i64::MAX),
            ("1e3", 1000, 1_000_000),
            ("1E3", 1000, 1_000_000),
            ("5e-3", 1, 5),
            ("12e+1", 120, 120_000),
            ("+3", 3, 3000),
            ("-2", -2, -2000),
            ("-1.5", -1, -1500),
            ("0.0001m", 1, 1),
        ];
        for (input, value, milli) in cases {
            let q = parse(input).unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(q.value(), *value, "value of {input}");
            assert_eq!(q.milli_value(), *milli, "milli value of {input}");
        }
    }

    #[test]
    fn zero_with_any_suffix_is_zero() {
        for s in ["0", "0m", "0Gi", "0.000", "-0", "0e9"] {
            let q = parse(s).unwrap();
            assert!(q.is_zero(), "{s}");
            assert_eq!(q.value(), 0);
        }
    }

    #[test]
    fn rejects_garbage() {
        assert_eq!(parse(""), Err(QuantityError::Empty));
        assert_eq!(parse("Mi"), Err(QuantityError::NoDigits));
        assert_eq!(parse("."), Err(QuantityError::NoDigits));
        assert!(matches!(parse("1KB"), Err(QuantityError::UnknownSuffix(_))));
        assert!(matches!(
            parse("1 Mi"),
            Err(QuantityError::UnknownSuffix(_))
        ));
        assert!(matches!(parse("1e"), Err(QuantityError::UnknownSuffix(_))));
        assert!(matches!(parse("1e+"), Err(QuantityError::UnknownSuffix(_))));
        assert!(matches!(
            parse("1.2.3"),
            Err(QuantityError::UnknownSuffix(_))
        ));
        assert!(matches!(parse("1ki"), Err(QuantityError::UnknownSuffix(_))));
        assert_eq!(
            parse("1234567890123456789012345678901234567890"),
            Err(QuantityError::TooPrecise)
        );
    }

    #[test]
    fn huge_exponents_saturate() {
        assert_eq!(parse("1e100").unwrap().value(), i64::MAX);
        assert_eq!(parse("1e-100").unwrap().value(), 1);
        assert_eq!(parse("-1e100").unwrap().value(), i64::MIN);
    }

    /// Inputs that once overflowed an i32 exponent or an intermediate product (a panic in
    /// debug builds, a wrong small value in release): every one saturates or is rejected.
    #[test]
    fn exponent_overflow_regressions() {
        // (input, value(), milli_value(), checked_milli_value())
        let cases: &[(&str, i64, i64, Option<i64>)] = &[
            ("1e2147483647", i64::MAX, i64::MAX, None),
            ("1e2147483645", i64::MAX, i64::MAX, None),
            ("-1e2147483647", i64::MIN, i64::MIN, None),
            ("1e-2147483648", 1, 1, Some(1)),
            ("-1e-2147483648", 0, 0, Some(0)),
            ("9223372036854775807", i64::MAX, i64::MAX, None),
            ("9223372036854775808", i64::MAX, i64::MAX, None),
            ("-9223372036854775808", i64::MIN, i64::MIN, None),
            (
                "9223372036854775807m",
                9_223_372_036_854_776,
                i64::MAX,
                Some(i64::MAX),
            ),
            ("16Ei", i64::MAX, i64::MAX, None),
            (
                "340282366920938463463374607431768211455Ei",
                i64::MAX,
                i64::MAX,
                None,
            ),
            ("0.5e-2147483647", 1, 1, Some(1)),
        ];
        for (input, value, milli, checked_milli) in cases {
            let q = parse(input).unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(q.value(), *value, "value of {input}");
            assert_eq!(q.milli_value(), *milli, "milli value of {input}");
            assert_eq!(
                q.checked_milli_value(),
                *checked_milli,
                "checked milli of {input}"
            );
        }
        assert_eq!(
            parse("1e2147483648"),
            Err(QuantityError::ExponentOutOfRange)
        );
        assert_eq!(parse("1.5e2147483647").unwrap().value(), i64::MAX);
        // The fraction moves the exponent below i32::MIN: rejected, not wrapped.
        assert_eq!(
            parse("0.1e-2147483648"),
            Err(QuantityError::ExponentOutOfRange)
        );
        assert_eq!(parse("1Ei").unwrap().checked_value(), Some(1 << 60));
        assert_eq!(parse("8Ei").unwrap().checked_value(), None);
        assert!(parse("-1").unwrap().is_negative());
        assert!(!parse("-0").unwrap().is_negative());
    }
}
