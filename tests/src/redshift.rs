//! The Redshift sink's test destination: PostgreSQL 15 in the sink's test
//! mode (a database of its own, `redshift_emulated`, a schema per test) with
//! the staged files in the stack's S3 emulator (moto), and the dialect check
//! that holds every statement the sink sends to what Redshift accepts.

use std::ops::ControlFlow;
use std::sync::{Arc, Mutex};

use sqlparser::ast::{
    AlterColumnOperation, AlterTableOperation, CopySource, DataType, Expr, MergeClauseKind, OnInsert, Query, SetExpr,
    Statement,
};
use sqlparser::dialect::RedshiftSqlDialect;
use sqlparser::parser::Parser;
use tokio::sync::OnceCell;
use tokio_postgres::Client;
use tributary_connectors::sinks::redshift::{Loader, RedshiftSink, RedshiftSinkConfig};

use crate::bench::BenchDestination;
use crate::postgres::connect;
use crate::{env_or, pg_destination_url, unique};

/// The staging bucket of the tests (created on first use).
pub const BUCKET: &str = "tributary-redshift-tests";
/// The database standing in for the cluster.
pub const DATABASE: &str = "redshift_emulated";
/// A role ARN: the test mode never hands it to anything that checks it.
pub const IAM_ROLE: &str = "arn:aws:iam::123456789012:role/tributary-redshift-test";

/// The stack's S3 emulator.
pub fn s3_endpoint() -> String {
    env_or("S3_ENDPOINT", "http://127.0.0.1:9075")
}

/// The URL of the database standing in for the cluster.
pub fn redshift_url() -> String {
    let base = pg_destination_url();
    match base.rfind('/') {
        Some(i) => format!("{}/{DATABASE}", &base[..i]),
        None => base,
    }
}

static READY: OnceCell<()> = OnceCell::const_new();

/// Creates the database and the bucket once per test process.
pub async fn ready() {
    READY
        .get_or_init(|| async {
            let admin = connect(&pg_destination_url()).await;
            let exists = !admin
                .query("SELECT 1 FROM pg_database WHERE datname = $1", &[&DATABASE])
                .await
                .expect("look up the database")
                .is_empty();
            if !exists {
                // Another test process may create it at the same moment.
                if let Err(e) = admin.batch_execute(&format!("CREATE DATABASE {DATABASE}")).await {
                    let again = admin.query("SELECT 1 FROM pg_database WHERE datname = $1", &[&DATABASE]).await;
                    assert!(again.is_ok_and(|r| !r.is_empty()), "create database: {e}");
                }
            }
            create_bucket().await;
        })
        .await;
}

/// Creates the staging bucket (moto loses it when it restarts).
pub async fn create_bucket() {
    let status = reqwest::Client::new()
        .put(format!("{}/{BUCKET}", s3_endpoint()))
        .send()
        .await
        .expect("the S3 emulator (scripts/stack start s3)")
        .status();
    // 409: another process created it first.
    assert!(status.is_success() || status.as_u16() == 409, "create bucket: {status}");
}

/// A schema of its own in the emulated cluster.
pub struct Warehouse {
    /// The schema.
    pub schema: String,
    /// An admin session on the emulated cluster.
    pub admin: Client,
}

impl Warehouse {
    /// A fresh schema for the test `name`.
    pub async fn new(name: &str) -> Self {
        ready().await;
        Self {
            schema: unique(&format!("rs_{name}")),
            admin: connect(&redshift_url()).await,
        }
    }

    /// The sink's config in test mode: this schema, the emulator's bucket.
    pub fn config(&self, group: &str) -> RedshiftSinkConfig {
        config(group, &self.schema)
    }

    /// `"schema"."items"`.
    pub fn table(&self) -> String {
        format!("\"{}\".\"items\"", self.schema)
    }

    /// Whether the `items` table exists.
    pub async fn exists(&self) -> bool {
        crate::postgres::table_exists(&self.admin, &self.table()).await
    }

    /// `id|name|qty|price` per row, ordered by id.
    pub async fn rows(&self) -> Vec<String> {
        if !self.exists().await {
            return Vec::new();
        }
        crate::postgres::items_rows(&self.admin, &self.table()).await
    }

    /// The `[redshift]` section of a sink runner's file for this schema.
    pub fn runner_section(&self) -> String {
        format!(
            // `s3` inline: callers append keys of `[redshift]` after it.
            "[redshift]\nurl = \"{}\"\niam_role = \"{IAM_ROLE}\"\nschema = \"{}\"\nloader = \"test_stdin_from_s3\"\n\
             s3 = {{ bucket = \"{BUCKET}\", endpoint = \"{}\", allow_http = true, \
             access_key_id = \"test\", secret_access_key = \"test\" }}\n",
            redshift_url(),
            self.schema,
            s3_endpoint()
        )
    }

    /// Drops the schema and the groups' offsets.
    pub async fn cleanup(&self, groups: &[String]) {
        let _ = self
            .admin
            .execute("DELETE FROM tributary.offsets WHERE consumer_group = ANY($1)", &[&groups])
            .await;
        let _ = self
            .admin
            .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", self.schema))
            .await;
    }
}

/// A [`Warehouse`] with a sink of its own consumer group that records the
/// statements it runs: the sink benchmark's destination.
pub struct BenchWarehouse {
    warehouse: Warehouse,
    group: String,
    recorded: Arc<Mutex<Vec<String>>>,
}

/// Each statement is a query in Redshift's queue (the staged file's upload
/// is not one).
#[async_trait::async_trait]
impl BenchDestination for BenchWarehouse {
    const UNIT: &'static str = "statements";
    type Sink = RedshiftSink;

    async fn create(name: &str) -> (Self, RedshiftSink) {
        let warehouse = Warehouse::new(name).await;
        let group = unique(name);
        let recorded = Arc::new(Mutex::new(Vec::new()));
        let mut sink = RedshiftSink::new(warehouse.config(&group)).expect("config");
        sink.record_statements(recorded.clone());
        (BenchWarehouse { warehouse, group, recorded }, sink)
    }

    async fn rows(&self) -> usize {
        self.warehouse.rows().await.len()
    }

    fn units(&self, _sink: &RedshiftSink, _batches: u64) -> u64 {
        self.recorded.lock().map(|r| r.len()).unwrap_or_default() as u64
    }

    async fn cleanup(self) {
        self.warehouse.cleanup(&[self.group]).await;
    }
}

/// The sink's config in test mode for `schema`.
pub fn config(group: &str, schema: &str) -> RedshiftSinkConfig {
    let mut c = RedshiftSinkConfig::new(redshift_url(), IAM_ROLE, BUCKET, group);
    c.schema = Some(schema.to_string());
    c.loader = Loader::TestStdinFromS3;
    c.s3.endpoint = Some(s3_endpoint());
    c.s3.allow_http = true;
    c.s3.access_key_id = Some("test".into());
    c.s3.secret_access_key = Some("test".into());
    c
}

// ---------------------------------------------------------------- dialect check

/// What in `sql` Redshift does not accept, one line per construct (empty:
/// none found). The statement must parse as Redshift SQL.
pub fn dialect_violations(sql: &str) -> Vec<String> {
    let mut out = Vec::new();
    let statements = match Parser::parse_sql(&RedshiftSqlDialect {}, sql) {
        Ok(s) => s,
        Err(e) => {
            out.push(format!("does not parse as Redshift SQL: {e}"));
            // Name what in it Redshift refuses, where PostgreSQL parses it.
            match Parser::parse_sql(&sqlparser::dialect::PostgreSqlDialect {}, sql) {
                Ok(s) => s,
                Err(_) => return out,
            }
        }
    };
    for statement in &statements {
        statement_violations(statement, &mut out);
        let _ = sqlparser::ast::visit_expressions(statement, |e: &Expr| {
            expression_violations(e, &mut out);
            ControlFlow::<()>::Continue(())
        });
    }
    out
}

fn statement_violations(statement: &Statement, out: &mut Vec<String>) {
    let mut no = |what: &str| out.push(what.to_string());
    match statement {
        Statement::Insert(i) => {
            if matches!(i.on, Some(OnInsert::OnConflict(_))) {
                no("INSERT ... ON CONFLICT (Redshift has no upsert clause)");
            }
            if i.returning.is_some() {
                no("RETURNING");
            }
            if i.source.as_ref().is_some_and(|q| q.with.is_some()) {
                no("WITH on INSERT");
            }
        }
        Statement::Update(u) if u.returning.is_some() => no("RETURNING"),
        Statement::Delete(d) if d.returning.is_some() => no("RETURNING"),
        Statement::Merge(m) => {
            let matched: Vec<_> = m.clauses.iter().filter(|c| c.clause_kind == MergeClauseKind::Matched).collect();
            if matched.len() > 1 {
                no("MERGE with more than one WHEN MATCHED");
            }
            if matched.iter().any(|c| c.predicate.is_some()) {
                no("MERGE ... WHEN MATCHED AND <condition>");
            }
            if m.clauses
                .iter()
                .any(|c| c.clause_kind != MergeClauseKind::Matched && c.predicate.is_some())
            {
                no("MERGE ... WHEN NOT MATCHED AND <condition>");
            }
        }
        Statement::Query(q) => dml_in_with(q, out),
        Statement::AlterTable(a) => {
            for op in &a.operations {
                match op {
                    AlterTableOperation::AlterColumn {
                        op: AlterColumnOperation::SetDataType { data_type, .. },
                        ..
                    } if !is_varchar(data_type) => {
                        out.push(format!("ALTER COLUMN ... TYPE {data_type} (Redshift only lengthens a VARCHAR)"));
                    }
                    AlterTableOperation::AlterColumn {
                        op: AlterColumnOperation::SetNotNull | AlterColumnOperation::DropNotNull,
                        ..
                    } => out.push("ALTER COLUMN ... SET/DROP NOT NULL".into()),
                    AlterTableOperation::AddColumn { if_not_exists: true, .. } => {
                        out.push("ADD COLUMN IF NOT EXISTS".into())
                    }
                    AlterTableOperation::AddColumn { column_def, .. } => type_violations(&column_def.data_type, out),
                    AlterTableOperation::DropColumn { if_exists: true, .. } => out.push("DROP COLUMN IF EXISTS".into()),
                    _ => {}
                }
            }
        }
        Statement::CreateTable(c) => {
            if c.on_commit.is_some() {
                out.push("CREATE TABLE ... ON COMMIT".into());
            }
            for col in &c.columns {
                type_violations(&col.data_type, out);
            }
        }
        Statement::Truncate(_) => no("TRUNCATE (commits the transaction in Redshift)"),
        Statement::Lock(l) if l.lock_mode.is_some() => no("LOCK ... IN ... MODE (Redshift's LOCK has no modes)"),
        Statement::Savepoint { .. } | Statement::ReleaseSavepoint { .. } => no("savepoints"),
        Statement::Rollback { savepoint: Some(_), .. } => no("savepoints"),
        Statement::Copy {
            source: CopySource::Table { .. },
            to: false,
            target: sqlparser::ast::CopyTarget::Stdin,
            ..
        } => no("COPY FROM STDIN"),
        _ => {}
    }
}

/// A data-modifying statement inside a `WITH` (PostgreSQL's writable CTE).
fn dml_in_with(q: &Query, out: &mut Vec<String>) {
    if let Some(with) = &q.with {
        for cte in &with.cte_tables {
            if matches!(
                *cte.query.body,
                SetExpr::Insert(_) | SetExpr::Update(_) | SetExpr::Delete(_) | SetExpr::Merge(_)
            ) {
                out.push("a data-modifying WITH (writable CTE)".into());
            }
        }
    }
}

fn is_varchar(t: &DataType) -> bool {
    matches!(t, DataType::Varchar(_) | DataType::CharacterVarying(_) | DataType::CharVarying(_))
}

/// Column types Redshift lacks (or, for TEXT, silently shortens to 256
/// bytes).
fn type_violations(t: &DataType, out: &mut Vec<String>) {
    let bad = match t {
        DataType::Text | DataType::JSONB | DataType::JSON | DataType::Bytea | DataType::Uuid => true,
        DataType::Array(_) => true,
        DataType::Custom(name, _) => {
            let n = name.to_string().to_ascii_lowercase();
            !matches!(n.as_str(), "super" | "varbyte" | "timestamptz" | "timetz")
        }
        _ => false,
    };
    if bad {
        out.push(format!("column type {t}"));
    }
}

/// PostgreSQL functions Redshift lacks or runs on the leader node only
/// (which cannot read user tables).
const LEADER_OR_PG_ONLY: [&str; 9] = [
    "now",
    "pg_advisory_xact_lock",
    "hashtext",
    "to_regclass",
    "to_regnamespace",
    "current_setting",
    "array_position",
    "gen_random_uuid",
    "string_to_array",
];

fn expression_violations(e: &Expr, out: &mut Vec<String>) {
    match e {
        Expr::BinaryOp { left, right, .. } if matches!(**left, Expr::Tuple(_)) || matches!(**right, Expr::Tuple(_)) => {
            out.push(format!("row-value comparison {e}"));
        }
        Expr::Function(f) => {
            let name = f.name.to_string().to_ascii_lowercase();
            if LEADER_OR_PG_ONLY.contains(&name.as_str()) {
                out.push(format!("function {name}()"));
            }
        }
        _ => {}
    }
}

/// A [`Warehouse`] with the consumer group of its sink runner, for the
/// end-to-end flow.
pub struct Copy {
    /// The schema.
    pub warehouse: Warehouse,
    /// The sink runner's consumer group.
    pub group: String,
}

#[async_trait::async_trait]
impl crate::e2e::Destination for Copy {
    fn section(&self) -> String {
        self.warehouse.runner_section()
    }

    fn group(&self) -> String {
        self.group.clone()
    }

    async fn rows(&self, columns: &[&str]) -> Vec<String> {
        let cells: Vec<String> = columns.iter().map(|c| format!("coalesce(\"{c}\"::text, 'NULL')")).collect();
        let sql = format!("SELECT {} FROM {} ORDER BY id", cells.join(", "), self.warehouse.table());
        match self.warehouse.admin.query(sql.as_str(), &[]).await {
            Ok(rows) => rows
                .iter()
                .map(|r| (0..columns.len()).map(|i| r.get::<_, String>(i)).collect::<Vec<_>>().join("|"))
                .collect(),
            Err(_) => Vec::new(),
        }
    }

    async fn stored(&self) -> i64 {
        self.warehouse
            .admin
            .query_one(
                "SELECT coalesce(sum(next_offset), 0)::bigint FROM tributary.offsets WHERE consumer_group = $1",
                &[&self.group],
            )
            .await
            .map_or(0, |r| r.get(0))
    }

    async fn exists(&self) -> bool {
        self.warehouse.exists().await
    }

    /// Redshift's DATE has no infinity: the sink stages the value as a date
    /// out of range, which the stand-in refuses and logs in its
    /// `stl_load_errors` (Redshift's COPY would refuse it too, with its own
    /// reason: not verifiable here).
    fn refuses_infinity(&self) -> bool {
        true
    }

    async fn cleanup(&self) {
        self.warehouse.cleanup(std::slice::from_ref(&self.group)).await
    }
}
