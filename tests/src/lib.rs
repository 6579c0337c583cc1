//! Support for the integration tests in `tests/tests/`: finding the runner
//! binaries, endpoints of the local stack, and waiting on conditions with a
//! deadline (never a fixed sleep).

pub mod bench;
pub mod bigquery;
pub mod browser;
pub mod conformance;
pub mod counters;
pub mod e2e;
pub mod items;
pub mod kafka;
pub mod logs;
pub mod matrix;
pub mod mysql;
pub mod postgres;
pub mod proxy;
pub mod redshift;
pub mod side;
pub mod snowflake;
pub mod spanner;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// An endpoint from `scripts/stack env`, or the stack's default.
pub fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

/// Kafka bootstrap servers of the local stack.
pub fn kafka_bootstrap() -> String {
    env_or("KAFKA_BOOTSTRAP", "127.0.0.1:9092")
}

/// The stack's Kafka listener that authenticates with SASL/OAUTHBEARER
/// (unsecured JWS tokens; see scripts/stack).
pub fn kafka_oauth_bootstrap() -> String {
    env_or("KAFKA_OAUTH_BOOTSTRAP", "127.0.0.1:9094")
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

/// The BigQuery emulator of the local stack (`scripts/stack start bigquery`).
pub fn bigquery_emulator_url() -> String {
    env_or("BIGQUERY_EMULATOR_URL", "http://127.0.0.1:9050")
}

/// The emulator's project.
pub fn bigquery_project() -> String {
    env_or("BIGQUERY_PROJECT", "tributary-local")
}

/// The Snowflake emulator of the local stack (`scripts/stack start snowflake`).
pub fn snowflake_emulator_url() -> String {
    env_or("SNOWFLAKE_EMULATOR_URL", "http://127.0.0.1:9070")
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
    exe.parent().and_then(|p| p.parent()).map(PathBuf::from).expect("target dir")
}

/// The workspace root. Read at run time (cargo test sets
/// `CARGO_MANIFEST_DIR` for the test being run), not compiled in: a target
/// directory shared by two checkouts may hold a test binary built in the
/// other one, whose compiled-in path then points there.
pub fn workspace_dir() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
        .join("..")
}

/// `target/<profile>/<package>` for a runner binary of the workspace, built
/// if needed (`scripts/test` builds them first, so this is normally a no-op).
///
/// `TRIBUTARY_RUNNER_DIR` names a directory of runners built before, used
/// as they are (a long repeated run of copied test binaries, while the
/// workspace is being edited).
pub fn runner_binary(package: &str) -> PathBuf {
    if let Some(dir) = std::env::var_os("TRIBUTARY_RUNNER_DIR") {
        return PathBuf::from(dir).join(package);
    }
    let dir = target_dir();
    let workspace = workspace_dir();
    let mut cmd = Command::new(option_env!("CARGO").unwrap_or("cargo"));
    // The same selection as `scripts/test` (`--workspace --bins --tests
    // --benches`): the dev-dependencies turn on features of the connectors
    // (`fuzzing`, `test-utils`), and a bins-only build resolves the crate
    // without them, so cargo rebuilt the connectors and relinked both
    // runners in the middle of the test run (minutes, and gigabytes).
    cmd.current_dir(&workspace).args(["build", "-q", "--workspace", "--bins"]);
    if dir.ends_with("release") {
        cmd.arg("--release");
    } else {
        cmd.args(["--tests", "--benches"]);
    }
    // `cargo test` gives this process CARGO_MANIFEST_DIR, CARGO_PKG_* and
    // friends; build scripts that watch them would rebuild, and the outer
    // `cargo test` after them. The nested build gets a plain shell's view.
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        let keep = matches!(k.as_str(), "CARGO_HOME" | "CARGO_TARGET_DIR" | "CARGO_INCREMENTAL")
            || k.starts_with("CARGO_BUILD_")
            || k.starts_with("CARGO_REGISTRIES_")
            || k.starts_with("CARGO_NET_")
            || k.starts_with("CARGO_PROFILE_");
        if (k.starts_with("CARGO_") && !keep) || k == "OUT_DIR" {
            cmd.env_remove(&k);
        }
    }
    let status = cmd.status().expect("run cargo build");
    assert!(status.success(), "cargo build of the workspace's runners failed (for {package})");
    let bin = dir.join(package);
    assert!(bin.exists(), "{} missing after the build", bin.display());
    bin
}

/// A runner binary of the workspace running as a child process, its
/// stderr appended to a log file; killed (SIGKILL) when dropped.
pub struct Runner {
    child: std::process::Child,
}

impl Runner {
    /// Starts `target/<profile>/<package> --config <config>` with
    /// `RUST_LOG=info`, or what `TEST_RUNNER_LOG` says (to debug a test).
    pub fn start(package: &str, config: &std::path::Path, log: &std::path::Path) -> Self {
        Self::spawn(&runner_binary(package), config, log)
    }

    /// Starts the binary `bin` (from [`runner_binary`]) like
    /// [`Runner::start`], without building first: for harnesses that
    /// restart a runner many times.
    pub fn spawn(bin: &std::path::Path, config: &std::path::Path, log: &std::path::Path) -> Self {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("open runner log");
        let child = Command::new(bin)
            .arg("--config")
            .arg(config)
            .env("RUST_LOG", std::env::var("TEST_RUNNER_LOG").unwrap_or_else(|_| "info".into()))
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn runner");
        Self { child }
    }

    /// The exit status, once the runner has exited (by itself: a runner
    /// pauses and retries instead, so this is a failure).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// The process id (to send it other signals, e.g. SIGSTOP).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL: no shutdown code runs.
    pub fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A header of a Kafka record as text (dead-letter headers).
pub fn header(m: &rdkafka::message::OwnedMessage, name: &str) -> Option<String> {
    use rdkafka::message::{Header, Headers, Message};
    m.headers().and_then(|h| {
        h.iter()
            .find(|x: &Header<'_, &[u8]>| x.key == name)
            .and_then(|x| x.value)
            .map(|v| String::from_utf8_lossy(v).into_owned())
    })
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

/// The last `n` lines of a runner's log file (what a failed wait shows,
/// so that a failure in CI can be read without the machine).
pub fn log_tail(log: &std::path::Path, n: usize) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let tail: Vec<&str> = text.lines().rev().take(n).collect();
    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
}

/// The CA of the local stack's PostgreSQL server certificate (which names
/// `localhost`, not `127.0.0.1`): `PG_TLS_CA`, or where `scripts/stack up`
/// puts it.
pub fn pg_tls_ca() -> String {
    std::env::var("PG_TLS_CA")
        .unwrap_or_else(|_| workspace_dir().join(".stack/postgres-ca.crt").to_string_lossy().into_owned())
}

/// The CA of the local stack's MariaDB server certificate (which names
/// `localhost`, not `127.0.0.1`): `MYSQL_TLS_CA`, or where `scripts/stack
/// up` puts it.
pub fn mysql_tls_ca() -> String {
    std::env::var("MYSQL_TLS_CA")
        .unwrap_or_else(|_| workspace_dir().join(".stack/mariadb-ca.crt").to_string_lossy().into_owned())
}

/// A consumer configuration that reads topics from their beginning and only
/// what committed transactions wrote (`read_committed`), as every check of
/// exactly-once delivery must; a group of its own per reader.
pub fn committed_reader(group_prefix: &str) -> rdkafka::ClientConfig {
    let mut c = rdkafka::ClientConfig::new();
    c.set("bootstrap.servers", kafka_bootstrap())
        .set("group.id", unique(group_prefix))
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .set("topic.metadata.refresh.interval.ms", "1000");
    c
}

/// xorshift64*: a small seedable generator, so that a failing random
/// schedule can be replayed from its printed seed.
pub struct Rng(pub u64);

impl Rng {
    /// The next value.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A value in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// A source runner's config reading the stack's PostgreSQL tables of schema
/// `name` (slot and publication `name`), for end-to-end tests.
pub fn pg_source_runner_config(name: &str) -> String {
    format!(
        "name = \"{name}\"\nschema_registry_url = \"{registry}\"\n[kafka]\nbootstrap_servers = \"{kafka}\"\n\
         [admin]\nlisten = \"off\"\n[postgres]\nurl = \"{url}\"\nslot_name = \"{name}\"\npublication_name = \"{name}\"\n\
         include = [\"{name}.*\"]\nheartbeat_interval_ms = 1000\n",
        registry = schema_registry_url(),
        kafka = kafka_bootstrap(),
        url = pg_source_url(),
    )
}

/// A sink runner's config reading the topics of source runner `prefix` as
/// `group` (short Kafka sessions, so a killed runner's partitions move on
/// quickly) into the destination `section`.
pub fn sink_runner_config(prefix: &str, group: &str, section: &str) -> String {
    format!(
        "prefix = \"{prefix}\"\nconsumer_group = \"{group}\"\nschema_registry_url = \"{registry}\"\n\
         batch_max_records = 500\nbatch_linger_ms = 200\n\
         [kafka]\nbootstrap_servers = \"{kafka}\"\n[kafka.properties]\n\"session.timeout.ms\" = \"6000\"\n\
         \"heartbeat.interval.ms\" = \"1000\"\n[admin]\nlisten = \"off\"\n{section}",
        registry = schema_registry_url(),
        kafka = kafka_bootstrap(),
    )
}

/// A runner's `GET /status` on its admin server at `port`, once it answers.
pub async fn runner_status(port: u16) -> Option<serde_json::Value> {
    let body = reqwest::get(format!("http://127.0.0.1:{port}/status"))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    serde_json::from_str(&body).ok()
}

/// A TCP port free on 127.0.0.1 now (for a runner's admin server).
///
/// Picked below the kernel's ephemeral range (32768-60999 here): a port
/// the kernel hands out for `:0` is one any outgoing connection (a Kafka
/// client, a database session) may take as its local port before the
/// runner binds it ("Address already in use", a runner that exits at
/// start: fidelity failed so in CI). Each test process takes its own block
/// of 200 ports by its id, in turn, so two test binaries side by side do
/// not pick the same.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let base = 20_000 + (std::process::id() % 60) as u16 * 200;
    for _ in 0..200 {
        let port = base + NEXT.fetch_add(1, Ordering::Relaxed) % 200;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}
