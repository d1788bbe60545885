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

/// glibc's allocator gives each thread that allocates its own arena (up to eight per core),
/// and memory freed into one arena is not reused by another. The agent's threads are the two
/// runtime workers plus blocking threads that come and go (file and mount work for each pod
/// start), so after starting 110 pods the freed memory sits in a dozen arenas. Two arenas are
/// plenty for a process that is idle most of the time.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn limit_malloc_arenas() {
    // SAFETY: mallopt only changes the allocator's tuning; it is called before any other
    // thread exists, and an unknown value is refused with 0, which changes nothing.
    let ok = unsafe { libc::mallopt(libc::M_ARENA_MAX, 2) };
    if ok == 0 {
        eprintln!("deckhand: cannot limit malloc arenas (mallopt refused); continuing");
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn limit_malloc_arenas() {}

/// How often memory freed since the last time is handed back to the kernel.
const TRIM_PERIOD: std::time::Duration = std::time::Duration::from_secs(30);

/// A burst of work (many pods starting) leaves freed memory in the heap that glibc keeps for
/// later, which shows as resident memory long after the burst; trimming now and then returns
/// it. Costs a walk over the free lists, a few microseconds when nothing is to be returned.
async fn trim_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    loop {
        tokio::time::sleep(TRIM_PERIOD).await;
        // SAFETY: malloc_trim only returns free pages to the kernel; it takes the
        // allocator's own locks and touches no memory the program holds.
        unsafe {
            libc::malloc_trim(0);
        }
    }
}

fn main() -> ExitCode {
    // `deckhand pods|validate|version …` are commands for people; anything else runs the agent.
    if std::env::args()
        .nth(1)
        .is_some_and(|a| deckhand::cli::COMMANDS.contains(&a.as_str()))
    {
        return run_command(deckhand::cli::Cli::parse());
    }
    limit_malloc_arenas();
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
        tokio::spawn(trim_freed_memory());
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
