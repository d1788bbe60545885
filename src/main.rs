//! `deckhand`: parse flags, build the configuration, set up logging (`deckhand::app::logging`), run
//! the agent, exit 0 on SIGTERM/SIGINT.

use std::process::ExitCode;

use clap::Parser;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

use deckhand::app::daemon::{self, Tuning};
use deckhand::config::{self, Flags};

/// Threads for blocking work (file system, cgroups, mounts), which is short here: a few at a time
/// keep up with a batch of pods starting. Tokio's default (512) lets a start-up burst leave
/// dozens of threads, and its blocking pool wakes idle threads in turn, so the periodic passes
/// (log rotation, stats) keep them all alive; each holds a stack and a malloc arena of its own
/// (with 110 pods at rest: 20 threads, most of the anonymous RSS beyond the heap).
const MAX_BLOCKING_THREADS: usize = 8;

fn main() -> ExitCode {
    // `deckhand pods|validate|version …` are commands for people; anything else runs the agent.
    if std::env::args()
        .nth(1)
        .is_some_and(|a| deckhand::app::cli::COMMANDS.contains(&a.as_str()))
    {
        return run_command(deckhand::app::cli::Cli::parse());
    }
    let flags = Flags::parse();
    // The configuration picks the log format, so it is read first; what it has to say is
    // kept in `warnings` and logged by the daemon, and a refusal goes to stderr.
    let config = match config::load(&flags) {
        Ok(c) => c,
        Err(err) => {
            eprintln!("deckhand: invalid configuration: {err}");
            return ExitCode::from(2);
        }
    };
    deckhand::app::logging::init(config.logging_format, config.verbosity);
    let tuning = match Tuning::from_config_and_env(&config) {
        Ok(t) => t,
        Err(err) => {
            eprintln!("deckhand: {err}");
            return ExitCode::from(2);
        }
    };

    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(MAX_BLOCKING_THREADS)
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
fn run_command(cli: deckhand::app::cli::Cli) -> ExitCode {
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
    match runtime.block_on(deckhand::app::cli::run(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(deckhand::app::cli::CliError::Usage(message)) => {
            eprintln!("deckhand: {message}");
            ExitCode::from(2)
        }
        Err(err) => {
            eprintln!("deckhand: {err}");
            ExitCode::FAILURE
        }
    }
}
