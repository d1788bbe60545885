//! Resource quantities: parsing and every conversion must never panic (no overflow with
//! debug assertions on), and the checked and saturating conversions must agree.
#![no_main]

use deckhand::base::podspec::quantity;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(q) = quantity::parse(text) else {
        return;
    };
    let (value, milli) = (q.value(), q.milli_value());
    if let Some(v) = q.checked_value() {
        assert_eq!(v, value, "{text:?}");
    }
    if let Some(m) = q.checked_milli_value() {
        assert_eq!(m, milli, "{text:?}");
        // A whole-unit amount that fits in thousandths fits in units too.
        assert!(q.checked_value().is_some(), "{text:?}");
    }
    if q.is_zero() {
        assert_eq!((value, milli), (0, 0), "{text:?}");
    }
    if q.is_negative() {
        assert!(value <= 0 && milli <= 0, "{text:?}");
    } else {
        assert!(value >= 0 && milli >= 0, "{text:?}");
    }
});
