//! Go durations as flags and the config file spell them: parsing must never panic, and
//! every accepted duration must format the Go way and parse back to itself.
#![no_main]

use deckhand::config::duration::{format_go_duration, parse_go_duration};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(d) = parse_go_duration(text) else {
        return;
    };
    let shown = format_go_duration(d);
    assert_eq!(parse_go_duration(&shown), Ok(d), "{text:?} -> {shown:?}");
});
