//! Support for the integration tests in `tests/tests/`: finding the runner
//! binaries, endpoints of the local stack, and waiting on conditions with a
//! deadline (never a fixed sleep).
#![deny(missing_docs)]

use std::path::PathBuf;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// An endpoint from `scripts/stack env`, or the stack's default.
pub fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

/// Kafka bootstrap servers of the local stack.
pub fn kafka_bootstrap() -> String {
    env_or("KAFKA_BOOTSTRAP", "127.0.0.1:9092")
}

/// Schema registry URL of the local stack (Confluent API).
pub fn schema_registry_url() -> String {
    env_or("SCHEMA_REGISTRY_URL", "http://127.0.0.1:8081/apis/ccompat/v7")
}

/// The source database of the local stack.
pub fn pg_source_url() -> String {
    env_or("PG_SOURCE_URL", "postgres://tributary:tributary@127.0.0.1:5432/source")
}

/// The destination database of the local stack.
pub fn pg_destination_url() -> String {
    env_or("PG_DESTINATION_URL", "postgres://tributary:tributary@127.0.0.1:5432/destination")
}

/// The stack's MariaDB (ROW binlog, FULL row image), the MySQL source's database.
pub fn mysql_url() -> String {
    env_or("MYSQL_URL", "mysql://tributary:tributary@127.0.0.1:3306/source")
}

/// A name no earlier run used, for topics, slots and schemas.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}_{}", &uuid::Uuid::new_v4().simple().to_string()[..12])
}

/// `target/<profile>`, from the running test binary (`target/<profile>/deps/<test>`).
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent()
        .and_then(|p| p.parent())
        .map(PathBuf::from)
        .expect("target dir")
}

/// `target/<profile>/<package>` for a runner binary of the workspace, built
/// if needed (`scripts/test` builds them first, so this is normally a no-op).
pub fn runner_binary(package: &str) -> PathBuf {
    let dir = target_dir();
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut cmd = Command::new(option_env!("CARGO").unwrap_or("cargo"));
    // The same selection as `scripts/test` (`--workspace --bins`): with a
    // narrower one, feature unification differs and cargo rebuilds
    // dependencies and relinks the binary in the middle of the test run.
    cmd.current_dir(&workspace)
        .args(["build", "-q", "--workspace", "--bins"]);
    // `cargo test` gives this process CARGO_MANIFEST_DIR, CARGO_PKG_* and
    // friends; build scripts that watch them would rebuild, and the outer
    // `cargo test` after them. The nested build gets a plain shell's view.
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        let keep = matches!(k.as_str(), "CARGO_HOME" | "CARGO_TARGET_DIR")
            || k.starts_with("CARGO_BUILD_")
            || k.starts_with("CARGO_REGISTRIES_")
            || k.starts_with("CARGO_NET_")
            || k.starts_with("CARGO_PROFILE_");
        if (k.starts_with("CARGO_") && !keep) || k == "OUT_DIR" {
            cmd.env_remove(&k);
        }
    }
    if dir.ends_with("release") {
        cmd.arg("--release");
    }
    let status = cmd.status().expect("run cargo build");
    assert!(status.success(), "cargo build --workspace --bins failed (for {package})");
    let bin = dir.join(package);
    assert!(bin.exists(), "{} missing after the build", bin.display());
    bin
}

/// Polls `check` until it returns `Some`, failing the test with `what` after
/// `timeout`. The poll interval is short; the deadline is what bounds it.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A runner process (`source-runner` or `sink-runner`) on a config file,
/// its log appended to `log`; killed when dropped.
pub struct RunnerProcess {
    child: Child,
}

impl RunnerProcess {
    /// Starts a `source-runner`.
    pub fn source(config: &Path, log: &Path) -> Self {
        Self::start("source-runner", config, log)
    }

    /// Starts a `sink-runner`.
    pub fn sink(config: &Path, log: &Path) -> Self {
        Self::start("sink-runner", config, log)
    }

    fn start(package: &str, config: &Path, log: &Path) -> Self {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("open runner log");
        let child = Command::new(runner_binary(package))
            .arg("--config")
            .arg(config)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {package}: {e}"));
        Self { child }
    }

    /// SIGKILL: no shutdown code runs.
    pub fn kill9(mut self) {
        self.child.kill().expect("kill -9 the runner");
        let _ = self.child.wait();
    }
}

impl Drop for RunnerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
