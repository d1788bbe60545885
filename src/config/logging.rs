//! The logging section: `--v` and the log format (`--logging-format`, `logging.format`).

use super::file::KubeletConfigurationFile;
use super::flags::Flags;
use super::validate::{InvalidValue, invalid};
use super::{ConfigError, LoggingFormat};

/// How the agent logs.
pub(super) struct Logging {
    pub format: LoggingFormat,
    pub verbosity: u8,
}

/// The format (the flag, else the file's `logging.format`, else text) and the verbosity (a
/// flag only: the file's `logging` has no verbosity here).
pub(super) fn logging(flags: &Flags, f: &KubeletConfigurationFile) -> Result<Logging, ConfigError> {
    let format = match (
        flags.logging_format.as_deref(),
        f.logging.as_ref().and_then(|l| l.format.as_deref()),
    ) {
        (Some(flag), _) => flag
            .parse()
            .map_err(|e: InvalidValue| invalid("--logging-format", e))?,
        (None, Some(file)) => file
            .parse()
            .map_err(|e: InvalidValue| invalid("logging.format", e))?,
        (None, None) => LoggingFormat::Text,
    };
    Ok(Logging {
        format,
        verbosity: flags.verbosity.unwrap_or(0),
    })
}
