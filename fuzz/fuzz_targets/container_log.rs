//! Container log files as a container (or anything that can write in the pod log directory)
//! can make them: the backward tail search, over one to three files and any block size,
//! must find what the in-memory search finds; rendering in any chunking must give what
//! rendering the whole does (the pump holds long lines in pieces), stay within `limitBytes`,
//! and never panic.
#![no_main]

use deckhand::endpoints::node_api::log_read::{Pump, find_tail};
use deckhand::endpoints::node_api::logs::{LogOptions, Renderer, tail_start};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Four control bytes, then the log.
    let [a, b, c, d, log @ ..] = data else {
        return;
    };
    let n = u64::from(*a % 16);
    let block = usize::from(*b % 32) + 1;
    let chunk = usize::from(*c % 64) + 1;

    // The tail of one file, as the in-memory search finds it.
    let one = find_tail(&[(log, log.len() as u64)], n, block).unwrap();
    assert_eq!(one, (0, tail_start(log, n) as u64));

    // Split in up to three files: the tail found in them begins at a line start of its file
    // and leaves at most n lines after it.
    let cut1 = usize::from(*d) % (log.len() + 1);
    let cut2 = cut1 + (log.len() - cut1) / 2;
    let files = [&log[..cut1], &log[cut1..cut2], &log[cut2..]];
    let segments: Vec<(&[u8], u64)> = files.iter().map(|f| (*f, f.len() as u64)).collect();
    let (seg, offset) = find_tail(&segments, n, block).unwrap();
    let offset = offset as usize;
    assert!(offset <= files[seg].len());
    assert!(n == 0 || offset == 0 || files[seg][offset - 1] == b'\n');

    // Rendering in chunks of `chunk` bytes is rendering the whole, within limitBytes.
    let limit = (*d > 128).then(|| u64::from(*d - 128) + 1);
    let o = LogOptions {
        timestamps: *a > 128,
        limit_bytes: limit,
        ..Default::default()
    };
    let render = |piece: usize, max_line: usize| {
        let mut pump = Pump::new(Renderer::new(&o), max_line);
        let mut out = Vec::new();
        for p in log.chunks(piece) {
            pump.feed(p, &mut out);
        }
        pump.end_of_file(&mut out);
        out
    };
    let whole = render(log.len().max(1), usize::MAX / 2);
    let chunked = render(chunk, 1 << 20);
    assert_eq!(whole, chunked);
    if let Some(limit) = limit {
        assert!(whole.len() as u64 <= limit);
    }
    // Long lines cut at a small size: no panic, within the limit.
    let small = render(chunk, 64);
    if let Some(limit) = limit {
        assert!(small.len() as u64 <= limit);
    }
});
