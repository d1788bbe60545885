//! The agent's log set-up: `--logging-format=text` (the default, for people) or `json`.
//!
//! The JSON format is upstream's (component-base's zap encoder, as `kubelet
//! --logging-format=json` writes it), so log pipelines built for the kubelet read Deckhand's:
//! one object per line with `ts` (milliseconds since the epoch, a float, as upstream's encoder
//! writes it), `caller` (`file:line`), `msg`, `v` (the verbosity the line was logged at; left
//! out of errors, as upstream's), then the fields of the enclosing spans (outermost first) and
//! of the event itself as keys (`pod`, `pod_uid`, `container`, …). An `error` field of an
//! error line is named `err`, upstream's key.
//!
//! It is a small layer of our own rather than tracing-subscriber's `json` feature: that one
//! nests fields under `fields`, names keys `timestamp`/`level`/`target` and writes the time as
//! text, none of which upstream's readers expect, and it would pull in `tracing-serde` for
//! what ~150 lines do here.

use std::io::Write as _;

use serde_json::Value;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;

use crate::base::clock;
use crate::config::LoggingFormat;

/// Upstream's `--v` levels mapped onto tracing levels (RUST_LOG overrides).
pub fn filter(verbosity: u8) -> EnvFilter {
    if let Ok(filter) = EnvFilter::try_from_default_env() {
        return filter;
    }
    let level = match verbosity {
        0..=2 => "info",
        3..=5 => "debug",
        _ => "trace",
    };
    EnvFilter::new(format!("warn,deckhand={level}"))
}

/// Installs the global subscriber: the format chosen, to stderr, at the verbosity given.
pub fn init(format: LoggingFormat, verbosity: u8) {
    match format {
        LoggingFormat::Text => tracing_subscriber::fmt()
            .with_env_filter(filter(verbosity))
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        LoggingFormat::Json => tracing_subscriber::registry()
            .with(filter(verbosity))
            .with(JsonLayer::new(std::io::stderr))
            .init(),
    }
}

/// The verbosity upstream would have logged a line of this level at (`None`: an error,
/// which carries no `v`).
pub fn verbosity_of(level: &Level) -> Option<u8> {
    match *level {
        Level::ERROR => None,
        Level::WARN | Level::INFO => Some(0),
        Level::DEBUG => Some(4),
        Level::TRACE => Some(6),
    }
}

/// Fields in the order they were recorded; a later field of the same name replaces the
/// earlier (an event's own field wins over its span's).
/// An event's own fields are kept as recorded (`raw`), duplicates included: an event with
/// an explicit `message = …` field and a format string has two `message`s, the format
/// string's first (tracing's macros put it first).
#[derive(Debug, Default, Clone)]
struct Fields {
    list: Vec<(String, Value)>,
    raw: bool,
}

impl Fields {
    fn raw() -> Self {
        Fields {
            list: Vec::new(),
            raw: true,
        }
    }

    fn set(&mut self, key: &str, value: Value) {
        match self.list.iter_mut().find(|(k, _)| k == key) {
            Some(slot) if !self.raw => slot.1 = value,
            _ => self.list.push((key.to_string(), value)),
        }
    }
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.set(field.name(), Value::String(format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.set(field.name(), Value::String(value.to_string()));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.set(field.name(), Value::from(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.set(field.name(), Value::from(value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.set(field.name(), Value::from(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.set(field.name(), Value::from(value));
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.set(field.name(), Value::String(value.to_string()));
    }
}

/// Writes each event as one JSON line to what `make_writer` gives.
pub struct JsonLayer<W> {
    make_writer: W,
}

impl<W> JsonLayer<W> {
    pub fn new(make_writer: W) -> Self {
        JsonLayer { make_writer }
    }
}

/// One log line (without its newline) from its parts: pure, for the tests and the layer.
pub fn render_line(
    ts_ms: f64,
    caller: Option<(&str, u32)>,
    level: &Level,
    message: &str,
    fields: &[(String, Value)],
) -> String {
    let mut out = String::with_capacity(128);
    out.push_str("{\"ts\":");
    out.push_str(&Value::from(ts_ms).to_string());
    if let Some((file, line)) = caller {
        out.push_str(",\"caller\":");
        out.push_str(&Value::String(format!("{file}:{line}")).to_string());
    }
    out.push_str(",\"msg\":");
    out.push_str(&Value::String(message.to_string()).to_string());
    if let Some(v) = verbosity_of(level) {
        out.push_str(",\"v\":");
        out.push_str(&v.to_string());
    }
    for (key, value) in fields {
        let key = match key.as_str() {
            // Keys the line itself uses are not overwritten by a field.
            "ts" | "caller" | "msg" | "v" => format!("field.{key}"),
            "error" if *level == Level::ERROR => "err".to_string(),
            k => k.to_string(),
        };
        out.push(',');
        out.push_str(&Value::String(key).to_string());
        out.push(':');
        out.push_str(&value.to_string());
    }
    out.push('}');
    out
}

impl<S, W> tracing_subscriber::Layer<S> for JsonLayer<W>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + 'static,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: Context<'_, S>,
    ) {
        let Some(span) = ctx.span(id) else { return };
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        span.extensions_mut().insert(fields);
    }

    fn on_record(
        &self,
        id: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        ctx: Context<'_, S>,
    ) {
        let Some(span) = ctx.span(id) else { return };
        let mut ext = span.extensions_mut();
        if let Some(fields) = ext.get_mut::<Fields>() {
            values.record(fields);
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        if let Some(scope) = ctx.event_scope(event) {
            for span in scope.from_root() {
                if let Some(span_fields) = span.extensions().get::<Fields>() {
                    for (k, v) in &span_fields.list {
                        fields.set(k, v.clone());
                    }
                }
            }
        }
        let mut own = Fields::raw();
        event.record(&mut own);
        // The first `message` is the line's text; a later one stays a field.
        let first_message = own.list.iter().position(|(k, _)| k == "message");
        let mut message = String::new();
        for (i, (k, v)) in own.list.into_iter().enumerate() {
            if Some(i) == first_message {
                message = match v {
                    Value::String(s) => s,
                    other => other.to_string(),
                };
            } else {
                fields.set(&k, v);
            }
        }
        let meta = event.metadata();
        let ts_ms = clock::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as f64 / 1e6)
            .unwrap_or_default();
        let caller = meta.file().zip(meta.line());
        let mut line = render_line(ts_ms, caller, meta.level(), &message, &fields.list);
        line.push('\n');
        // One write per line, so lines from different threads never interleave.
        let _ = self.make_writer.make_writer().write_all(line.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn lines_have_upstreams_keys() {
        let fields = vec![
            ("pod".to_string(), Value::from("default/web")),
            ("restarts".to_string(), Value::from(3)),
            ("error".to_string(), Value::from("boom")),
            ("msg".to_string(), Value::from("shadow")),
        ];
        // (level, the expected line)
        let cases = [
            (
                Level::INFO,
                r#"{"ts":1700000000123.5,"caller":"src/x.rs:7","msg":"started \"a\"","v":0,"pod":"default/web","restarts":3,"error":"boom","field.msg":"shadow"}"#,
            ),
            (
                Level::DEBUG,
                r#"{"ts":1700000000123.5,"caller":"src/x.rs:7","msg":"started \"a\"","v":4,"pod":"default/web","restarts":3,"error":"boom","field.msg":"shadow"}"#,
            ),
            (
                Level::ERROR,
                r#"{"ts":1700000000123.5,"caller":"src/x.rs:7","msg":"started \"a\"","pod":"default/web","restarts":3,"err":"boom","field.msg":"shadow"}"#,
            ),
        ];
        for (level, want) in cases {
            let got = render_line(
                1_700_000_000_123.5,
                Some(("src/x.rs", 7)),
                &level,
                "started \"a\"",
                &fields,
            );
            assert_eq!(got, want);
            serde_json::from_str::<Value>(&got).unwrap();
        }
    }

    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn span_fields_reach_the_events_inside() {
        let sink = Sink::default();
        let writer = sink.clone();
        let subscriber = tracing_subscriber::registry()
            .with(JsonLayer::new(move || writer.clone()))
            .with(tracing_subscriber::filter::LevelFilter::TRACE);
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("sync", pod = "default/web");
            let _g = span.enter();
            let inner = tracing::info_span!("container", container = "app");
            let _i = inner.enter();
            tracing::info!(attempt = 2, pod = "default/other", "container started");
            tracing::warn!(
                message = "Started container app",
                reason = "Started",
                "event"
            );
        });
        let text = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert_eq!(lines[0]["msg"], "container started");
        assert_eq!(lines[0]["v"], 0);
        assert_eq!(lines[0]["container"], "app");
        assert_eq!(
            lines[0]["pod"], "default/other",
            "the event's own field wins"
        );
        assert_eq!(lines[0]["attempt"], 2);
        assert!(lines[0]["ts"].as_f64().unwrap() > 1.6e12, "{text}");
        assert!(
            lines[0]["caller"]
                .as_str()
                .unwrap()
                .starts_with("src/app/logging.rs:")
        );
        assert_eq!(lines[1]["pod"], "default/web");
        assert_eq!(lines[1]["msg"], "event");
        assert_eq!(lines[1]["message"], "Started container app");
        assert_eq!(lines[1]["reason"], "Started");
    }
}
