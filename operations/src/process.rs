//! A runner process's start and end: its config file and async runtime, and
//! the signals that ask it to stop.

use std::path::Path;
use std::process::ExitCode;

use serde::de::DeserializeOwned;

use crate::config::{load, Validate};

/// Loads the config file named on the command line, tunes the allocator
/// ([`crate::memory::tune_allocator`]) and builds the multi-threaded runtime (the runners block in rebalance callbacks and
/// librdkafka calls, so one thread is not enough). On failure, prints why
/// and returns the exit code: 2 for a missing or invalid config, 1 else.
/// `env_var` names the variable that can give the path instead of `--config`.
pub fn start<C: DeserializeOwned + Validate>(
    path: Option<&Path>,
    env_var: &str,
) -> Result<(C, tokio::runtime::Runtime), ExitCode> {
    let Some(path) = path else {
        eprintln!("error: --config FILE is required (or set {env_var})");
        return Err(ExitCode::from(2));
    };
    let config: C = load(path).map_err(|e| {
        eprintln!("error: {e}");
        ExitCode::from(2)
    })?;
    // Before the runtime's threads exist.
    crate::memory::tune_allocator();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(|e| {
        eprintln!("error: cannot start the async runtime: {e}");
        ExitCode::FAILURE
    })?;
    Ok((config, runtime))
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Sleeps until `at`; for ever when there is none (the arm of a
/// `select!` whose timer is not armed).
pub async fn sleep_until(at: Option<std::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await,
        None => std::future::pending::<()>().await,
    }
}
