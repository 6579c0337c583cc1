//! The Oracle source against the source conformance suite, twice:
//!
//! * `fake`: the source driven by the in-memory LogMiner of
//!   `tributary_connectors::sources::oracle::fake` (which writes
//!   `V$LOGMNR_CONTENTS` rows as Oracle documents them). Runs everywhere.
//! * `oracle`: a real Oracle database at `TRIBUTARY_ORACLE_URL`, with
//!   Oracle Instant Client installed. No Oracle can run on the machines
//!   Tributary is developed and tested on, so these cases are `#[ignore]`d:
//!   `cargo test` reports them as ignored, never as passed. Run them with
//!   the commands in `docs/sources/oracle.md` ("Running the tests against
//!   a real Oracle"): `cargo test -p tributary-tests --test oracle_source
//!   -- --ignored`.

use std::sync::Arc;

use async_trait::async_trait;
use tributary_connectors::sources::oracle::client::OracleClient;
use tributary_connectors::sources::oracle::fake::FakeOracle;
use tributary_connectors::sources::oracle::{OracleSource, OracleSourceConfig};
use tributary_connectors::Source;
use tributary_schemas::TableId;
use tributary_tests::conformance::source::SourceFixture;
use tributary_tests::{conformance, unique};

// The fake lives in the test process: the runner binary cannot reach it,
// so `kill_9_exactly_once` is not in its list.
conformance!(source, fake: Fake {
    snapshot_then_streaming,
    restart_resumes_after_the_checkpoint,
    ddl_add_column,
    new_and_dropped_tables,
    resync_copies_a_table_again,
});

/// The conformance cases against a real Oracle, ignored unless asked for.
macro_rules! needs_oracle {
    ($($case:ident),* $(,)?) => {
        mod oracle {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[ignore = "needs TRIBUTARY_ORACLE_URL and Oracle Instant Client (docs/sources/oracle.md)"]
                async fn $case() {
                    let fx = super::Oracle::new(stringify!($case)).await;
                    tributary_tests::conformance::source::$case(&fx).await;
                    tributary_tests::conformance::source::SourceFixture::cleanup(&fx).await;
                }
            )*
        }
    };
}

needs_oracle!(
    snapshot_then_streaming,
    restart_resumes_after_the_checkpoint,
    ddl_add_column,
    new_and_dropped_tables,
    resync_copies_a_table_again,
    kill_9_exactly_once,
);

const FAKE_URL: &str = "oracle://c##tributary@fake:1521/FREEPDB1";

fn fast(mut c: OracleSourceConfig) -> OracleSourceConfig {
    c.snapshot_chunk_rows = 100;
    c.poll_interval_ms = 100;
    c
}

// ---------------------------------------------------------------- the fake

struct Fake {
    db: FakeOracle,
}

impl Fake {
    async fn new(_case: &str) -> Self {
        Self { db: FakeOracle::new() }
    }
}

#[async_trait]
impl SourceFixture for Fake {
    fn table(&self, name: &str) -> TableId {
        TableId::new("APP", name)
    }

    async fn create(&self, name: &str) {
        self.db.create_table(
            &self.table(name),
            &[("id", "NUMBER(9)"), ("name", "VARCHAR2(100)"), ("qty", "NUMBER(9)")],
            &["id"],
        );
    }

    async fn insert(&self, name: &str, rows: &[(i32, &str, i32)]) {
        let mut tx = self.db.begin();
        for (id, n, q) in rows {
            let (id, q) = (id.to_string(), q.to_string());
            tx.insert(&self.table(name), &[Some(&id), Some(n), Some(&q)]);
        }
        tx.commit();
    }

    async fn update(&self, name: &str, id: i32, new_name: &str, qty: i32) {
        let mut tx = self.db.begin();
        let q = qty.to_string();
        tx.update(&self.table(name), &id.to_string(), &[("name", Some(new_name)), ("qty", Some(&q))]);
        tx.commit();
    }

    async fn delete(&self, name: &str, id: i32) {
        let mut tx = self.db.begin();
        tx.delete(&self.table(name), &id.to_string());
        tx.commit();
    }

    async fn add_note(&self, name: &str, id: i32, note: &str) {
        let t = self.table(name);
        self.db.add_column(&t, "note", "VARCHAR2(100)");
        let mut tx = self.db.begin();
        let id = id.to_string();
        tx.insert(&t, &[Some(&id), Some("b"), Some(&id), Some(note)]);
        tx.commit();
    }

    async fn drop_table(&self, name: &str) {
        self.db.drop_table(&self.table(name));
    }

    fn source(&self, runner: &str) -> Box<dyn Source> {
        let config = fast(OracleSourceConfig::with_url(FAKE_URL, &["APP.*"]));
        Box::new(OracleSource::new(config, runner, Some(Arc::new(self.db.clone()))).expect("valid config"))
    }

    fn runner_section(&self) -> Option<String> {
        None
    }

    async fn cleanup(&self) {}
}

// ------------------------------------------------------------ a real Oracle

/// Tables `<PREFIX>_<name>` of the URL's user, removed by cleanup.
struct Oracle {
    url: String,
    owner: String,
    prefix: String,
    client: OracleClient,
}

impl Oracle {
    async fn new(case: &str) -> Self {
        let url = std::env::var("TRIBUTARY_ORACLE_URL").unwrap_or_else(|_| {
            panic!(
                "TRIBUTARY_ORACLE_URL is not set (oracle://user:password@host:1521/FREEPDB1): these cases need a real \
                 Oracle, see docs/sources/oracle.md"
            )
        });
        let config = OracleSourceConfig::with_url(url.clone(), &["X.Y"]);
        let p = config.connection().expect("TRIBUTARY_ORACLE_URL is an oracle:// URL");
        let client = OracleClient::connect(&p.user, &p.password, &p.connect).await.expect("connect");
        let short: String = case.chars().filter(|c| c.is_ascii_alphabetic()).take(6).collect();
        Self {
            owner: p.user.to_uppercase(),
            prefix: unique(&format!("T{short}")).to_uppercase(),
            url,
            client,
        }
    }

    fn config(&self) -> OracleSourceConfig {
        fast(OracleSourceConfig::with_url(self.url.clone(), &[&format!("{}.{}_*", self.owner, self.prefix)]))
    }

    fn quoted(&self, name: &str) -> String {
        let t = self.table(name);
        format!("\"{}\".\"{}\"", t.schema, t.table)
    }

    async fn run(&self, sql: &str) {
        self.client.execute(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
}

#[async_trait]
impl SourceFixture for Oracle {
    fn table(&self, name: &str) -> TableId {
        TableId::new(&self.owner, format!("{}_{}", self.prefix, name.to_uppercase()))
    }

    async fn create(&self, name: &str) {
        let t = self.quoted(name);
        self.run(&format!(
            "CREATE TABLE {t} (\"id\" NUMBER(9) PRIMARY KEY, \"name\" VARCHAR2(100), \"qty\" NUMBER(9))"
        ))
        .await;
        self.run(&format!("ALTER TABLE {t} ADD SUPPLEMENTAL LOG DATA (ALL) COLUMNS"))
            .await;
    }

    async fn insert(&self, name: &str, rows: &[(i32, &str, i32)]) {
        let t = self.quoted(name);
        let selects: Vec<String> = rows
            .iter()
            .map(|(i, n, q)| format!("SELECT {i}, '{}', {q} FROM DUAL", n.replace('\'', "''")))
            .collect();
        for chunk in selects.chunks(500) {
            self.run(&format!("INSERT INTO {t} (\"id\", \"name\", \"qty\") {}", chunk.join(" UNION ALL ")))
                .await;
        }
    }

    async fn update(&self, name: &str, id: i32, new_name: &str, qty: i32) {
        let t = self.quoted(name);
        self.run(&format!("UPDATE {t} SET \"name\" = '{new_name}', \"qty\" = {qty} WHERE \"id\" = {id}"))
            .await;
    }

    async fn delete(&self, name: &str, id: i32) {
        self.run(&format!("DELETE FROM {} WHERE \"id\" = {id}", self.quoted(name)))
            .await;
    }

    async fn add_note(&self, name: &str, id: i32, note: &str) {
        let t = self.quoted(name);
        self.run(&format!("ALTER TABLE {t} ADD (\"note\" VARCHAR2(100))")).await;
        self.run(&format!("INSERT INTO {t} VALUES ({id}, 'b', {id}, '{note}')")).await;
    }

    async fn drop_table(&self, name: &str) {
        self.run(&format!("DROP TABLE {} PURGE", self.quoted(name))).await;
    }

    fn source(&self, runner: &str) -> Box<dyn Source> {
        Box::new(OracleSource::new(self.config(), runner, None).expect("valid config"))
    }

    fn runner_section(&self) -> Option<String> {
        Some(format!(
            "[oracle]\nurl = \"{}\"\ninclude = [\"{}.{}_*\"]\npoll_interval_ms = 100\n",
            self.url, self.owner, self.prefix
        ))
    }

    async fn cleanup(&self) {
        for name in ["items", "later"] {
            // Dropped by a case already, or never created: fine.
            let _ = self.client.execute(&format!("DROP TABLE {} PURGE", self.quoted(name))).await;
        }
    }
}
