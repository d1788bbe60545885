//! `deckhand`: parse flags, build the configuration, run the agent, exit 0 on SIGTERM/SIGINT.

use std::process::ExitCode;

use clap::Parser;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

use deckhand::config::{self, Flags};
use deckhand::daemon::{self, Tuning};

/// Upstream's `--v` levels mapped onto tracing levels (RUST_LOG overrides).
fn log_filter(verbosity: u8) -> EnvFilter {
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

fn main() -> ExitCode {
    // `deckhand pods|validate|version …` are commands for people; anything else runs the agent.
    if std::env::args()
        .nth(1)
        .is_some_and(|a| deckhand::cli::COMMANDS.contains(&a.as_str()))
    {
        return run_command(deckhand::cli::Cli::parse());
    }
    let flags = Flags::parse();
    tracing_subscriber::fmt()
        .with_env_filter(log_filter(flags.verbosity.unwrap_or(0)))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();

    let config = match config::load(&flags) {
        Ok(c) => c,
        Err(err) => {
            eprintln!("deckhand: invalid configuration: {err}");
            return ExitCode::from(2);
        }
    };
    let tuning = match Tuning::from_config_and_env(&config) {
        Ok(t) => t,
        Err(err) => {
            eprintln!("deckhand: {err}");
            return ExitCode::from(2);
        }
    };

    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("deckhand: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let cancel = CancellationToken::new();
        let stopper = cancel.clone();
        tokio::spawn(async move {
            let (Ok(mut term), Ok(mut int)) = (
                signal(SignalKind::terminate()),
                signal(SignalKind::interrupt()),
            ) else {
                return;
            };
            tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM received"),
                _ = int.recv() => tracing::info!("SIGINT received"),
            }
            stopper.cancel();
        });
        match daemon::run(config, tuning, cancel).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                tracing::error!("{err}");
                eprintln!("deckhand: {err}");
                ExitCode::FAILURE
            }
        }
    })
}

/// Runs one of the commands for people on a small single-threaded runtime.
fn run_command(cli: deckhand::cli::Cli) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("deckhand: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(deckhand::cli::run(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(deckhand::cli::CliError::Usage(message)) => {
            eprintln!("deckhand: {message}");
            ExitCode::from(2)
        }
        Err(err) => {
            eprintln!("deckhand: {err}");
            ExitCode::FAILURE
        }
    }
}
