//! The type-and-DDL fidelity matrix (issue #46): what the log does not
//! carry, and values whose range differs between source and destination.
//! For each source x sink, the runners as built copy one table per case;
//! each case's steps (DDL that changes values without row changes, new
//! enum labels, generated columns, ...) run while everything streams, the
//! source is killed (SIGKILL) right after each step and started again,
//! and the destination must then equal the source, value by value over
//! every column the source carries (compared as text), with no runner
//! exiting. Each DDL step writes a row too: a new column reaches a
//! destination with its table's next change (sinks learn a shape from the
//! records).

use std::time::Duration;

use tributary_tests::matrix::{converge_as, Compare, Runners, Sink, SinkKind, Source, SourceKind};

/// One table and what is done to it.
struct Case {
    /// The table's name.
    table: &'static str,
    /// Makes the table (and what it needs) and its first rows; `{s}` is
    /// the schema, `{t}` the table. Statements separated by `; `.
    create: &'static str,
    /// The steps, each one run alone (its statements separated by `; `),
    /// then the source killed and started again, then compared.
    steps: &'static [&'static str],
    /// Columns the destination must not have (left out by a documented
    /// choice), checked at the end.
    absent: &'static [&'static str],
}

/// PostgreSQL's cases.
const POSTGRES: &[Case] = &[
    // Once stopped the source runner for good ("label is not one of the
    // column's enum labels"), and every other table with it.
    Case {
        table: "enums",
        create: "CREATE TYPE {s}.mood AS ENUM ('sad', 'ok'); \
                 CREATE TABLE {t} (id int PRIMARY KEY, m {s}.mood, a int); \
                 INSERT INTO {t} SELECT g, 'ok', g FROM generate_series(1, 20) g",
        steps: &[
            "ALTER TYPE {s}.mood ADD VALUE 'ecstatic'",
            "INSERT INTO {t} VALUES (101, 'ecstatic', 1); UPDATE {t} SET m = 'ecstatic' WHERE id <= 3; \
             DELETE FROM {t} WHERE id = 20",
            "ALTER TYPE {s}.mood ADD VALUE 'calm' BEFORE 'sad'",
            "UPDATE {t} SET m = 'calm' WHERE id = 4; INSERT INTO {t} VALUES (102, 'calm', 2)",
        ],
        absent: &[],
    },
    // The rows older than the ALTERs kept NULL in both columns: a volatile
    // default rewrites the table, which the WAL does not carry, and clears
    // the first column's missing value.
    Case {
        table: "defaults",
        create: "CREATE TABLE {t} (id int PRIMARY KEY, a int); \
                 INSERT INTO {t} SELECT g, g FROM generate_series(1, 20) g",
        steps: &[
            "ALTER TABLE {t} ADD COLUMN created timestamptz DEFAULT now(); UPDATE {t} SET a = a + 1 WHERE id = 1",
            "ALTER TABLE {t} ADD COLUMN r int DEFAULT (random() * 1000)::int; UPDATE {t} SET a = a + 1 WHERE id = 2",
            "UPDATE {t} SET a = a + 1 WHERE id = 1; INSERT INTO {t} (id, a) VALUES (101, 1)",
        ],
        absent: &[],
    },
    // A column's type changed with values computed by USING: a rewrite,
    // not in the WAL.
    Case {
        table: "retyped",
        create: "CREATE TABLE {t} (id int PRIMARY KEY, a int, b text); \
                 INSERT INTO {t} SELECT g, g, 'x' || g FROM generate_series(1, 20) g",
        steps: &[
            "ALTER TABLE {t} ALTER COLUMN a TYPE bigint USING a * 1000 + 7; UPDATE {t} SET b = b || '!' WHERE id = 1",
            "ALTER TABLE {t} ALTER COLUMN b TYPE varchar(40) USING upper(b); UPDATE {t} SET a = a + 1 WHERE id = 3",
            "UPDATE {t} SET a = a + 1 WHERE id = 2; INSERT INTO {t} VALUES (101, 5, 'new')",
        ],
        absent: &[],
    },
    // The destination once kept the snapshot's value of a stored generated
    // column (-65536 where the source had -65534): PostgreSQL does not
    // publish generated columns, so they are left out, and never stale.
    Case {
        table: "generated",
        create: "CREATE TABLE {t} (id int PRIMARY KEY, sm int, g int GENERATED ALWAYS AS (sm * 2) STORED); \
                 INSERT INTO {t} (id, sm) SELECT g, -32768 + g FROM generate_series(0, 19) g",
        steps: &[
            "UPDATE {t} SET sm = sm + 2",
            "ALTER TABLE {t} ADD COLUMN h int GENERATED ALWAYS AS (sm + 1) STORED; UPDATE {t} SET sm = sm WHERE id = 1",
            "UPDATE {t} SET sm = sm - 1 WHERE id < 5; INSERT INTO {t} (id, sm) VALUES (101, 7)",
        ],
        absent: &["g", "h"],
    },
];

#[tokio::test]
async fn postgres_to_postgres() {
    fidelity(SourceKind::Postgres, SinkKind::Postgres, POSTGRES).await;
}

#[tokio::test]
async fn postgres_to_bigquery() {
    fidelity(SourceKind::Postgres, SinkKind::BigQuery, POSTGRES).await;
}

#[tokio::test]
async fn postgres_to_redshift() {
    fidelity(SourceKind::Postgres, SinkKind::Redshift, POSTGRES).await;
}

#[tokio::test]
async fn postgres_to_spanner() {
    fidelity(SourceKind::Postgres, SinkKind::Spanner, POSTGRES).await;
}

#[tokio::test]
async fn postgres_to_snowflake() {
    fidelity(SourceKind::Postgres, SinkKind::Snowflake, POSTGRES).await;
}

/// Tables without a key (issue #46, item 4): equal rows and NULLs in
/// every column are legal rows, an UPDATE or DELETE changes exactly the
/// rows it names (one of two equal ones here, by `ctid`), and a table that
/// gains or loses its primary key is copied again in its new shape. The
/// destination is compared with the source as a multiset.
const KEYLESS_POSTGRES: &[Case] = &[
    Case {
        table: "keyless",
        create: "CREATE TABLE {t} (id int, b text, n numeric(10,2)); ALTER TABLE {t} REPLICA IDENTITY FULL; \
                 INSERT INTO {t} VALUES (1, 'x', 1.5), (1, 'x', 1.5), (2, 'y', NULL), (3, NULL, NULL), \
                 (NULL, NULL, NULL), (NULL, NULL, NULL)",
        steps: &[
            "UPDATE {t} SET b = 'z' WHERE ctid = (SELECT ctid FROM {t} WHERE id = 1 LIMIT 1)",
            "DELETE FROM {t} WHERE ctid = (SELECT ctid FROM {t} WHERE id IS NULL LIMIT 1)",
            "INSERT INTO {t} VALUES (2, 'y', NULL), (4, 'w', 2.25), (NULL, NULL, NULL); \
             DELETE FROM {t} WHERE ctid = (SELECT ctid FROM {t} WHERE id = 2 LIMIT 1)",
            "UPDATE {t} SET n = 9 WHERE id = 1; UPDATE {t} SET b = 'v' WHERE id IS NULL",
            "DELETE FROM {t} WHERE id = 1; INSERT INTO {t} VALUES (5, 'x', 1.5), (5, 'x', 1.5)",
        ],
        absent: &[],
    },
    Case {
        table: "gains_key",
        create: "CREATE TABLE {t} (id int NOT NULL, b text); ALTER TABLE {t} REPLICA IDENTITY FULL; \
                 INSERT INTO {t} VALUES (1, 'a'), (2, 'b'), (3, NULL)",
        steps: &[
            "ALTER TABLE {t} ADD PRIMARY KEY (id); UPDATE {t} SET b = 'c' WHERE id = 2",
            "INSERT INTO {t} VALUES (4, 'd'); DELETE FROM {t} WHERE id = 1",
        ],
        absent: &[],
    },
    Case {
        table: "loses_key",
        create: "CREATE TABLE {t} (id int PRIMARY KEY, b text); INSERT INTO {t} VALUES (1, 'a'), (2, 'b')",
        steps: &[
            "ALTER TABLE {t} DROP CONSTRAINT loses_key_pkey; ALTER TABLE {t} ALTER COLUMN id DROP NOT NULL; \
             ALTER TABLE {t} REPLICA IDENTITY FULL; INSERT INTO {t} VALUES (1, 'a'), (NULL, NULL)",
            "DELETE FROM {t} WHERE ctid = (SELECT ctid FROM {t} WHERE id = 1 LIMIT 1); UPDATE {t} SET b = 'e' WHERE id = 2",
        ],
        absent: &[],
    },
];

/// [`KEYLESS_POSTGRES`] in MariaDB: tables without any key (their binlog
/// rows carry FULL images), one of two equal rows named by `LIMIT 1`.
const KEYLESS_MARIADB: &[Case] = &[
    Case {
        table: "keyless",
        create: "CREATE TABLE {t} (id int, b varchar(20), n decimal(10,2)); \
                 INSERT INTO {t} VALUES (1, 'x', 1.5), (1, 'x', 1.5), (2, 'y', NULL), (3, NULL, NULL), \
                 (NULL, NULL, NULL), (NULL, NULL, NULL)",
        steps: &[
            "UPDATE {t} SET b = 'z' WHERE id = 1 LIMIT 1",
            "DELETE FROM {t} WHERE id IS NULL LIMIT 1",
            "INSERT INTO {t} VALUES (2, 'y', NULL), (4, 'w', 2.25), (NULL, NULL, NULL); \
             DELETE FROM {t} WHERE id = 2 LIMIT 1",
            "UPDATE {t} SET n = 9 WHERE id = 1; UPDATE {t} SET b = 'v' WHERE id IS NULL",
            "DELETE FROM {t} WHERE id = 1; INSERT INTO {t} VALUES (5, 'x', 1.5), (5, 'x', 1.5)",
        ],
        absent: &[],
    },
    Case {
        table: "gains_key",
        create:
            "CREATE TABLE {t} (id int NOT NULL, b varchar(20)); INSERT INTO {t} VALUES (1, 'a'), (2, 'b'), (3, NULL)",
        steps: &[
            "ALTER TABLE {t} ADD PRIMARY KEY (id); UPDATE {t} SET b = 'c' WHERE id = 2",
            "INSERT INTO {t} VALUES (4, 'd'); DELETE FROM {t} WHERE id = 1",
        ],
        absent: &[],
    },
    Case {
        table: "loses_key",
        create:
            "CREATE TABLE {t} (id int NOT NULL PRIMARY KEY, b varchar(20)); INSERT INTO {t} VALUES (1, 'a'), (2, 'b')",
        steps: &[
            "ALTER TABLE {t} DROP PRIMARY KEY; INSERT INTO {t} VALUES (1, 'a'), (1, 'a')",
            "DELETE FROM {t} WHERE id = 1 LIMIT 1; UPDATE {t} SET b = 'e' WHERE id = 2",
        ],
        absent: &[],
    },
];

#[tokio::test]
async fn keyless_postgres_to_postgres() {
    fidelity_as(SourceKind::Postgres, SinkKind::Postgres, KEYLESS_POSTGRES, Compare::Multiset).await;
}

#[tokio::test]
async fn keyless_postgres_to_bigquery() {
    fidelity_as(SourceKind::Postgres, SinkKind::BigQuery, KEYLESS_POSTGRES, Compare::Multiset).await;
}

#[tokio::test]
async fn keyless_postgres_to_redshift() {
    fidelity_as(SourceKind::Postgres, SinkKind::Redshift, KEYLESS_POSTGRES, Compare::Multiset).await;
}

#[tokio::test]
async fn keyless_postgres_to_spanner() {
    fidelity_as(SourceKind::Postgres, SinkKind::Spanner, KEYLESS_POSTGRES, Compare::Multiset).await;
}

#[tokio::test]
async fn keyless_postgres_to_snowflake() {
    fidelity_as(SourceKind::Postgres, SinkKind::Snowflake, KEYLESS_POSTGRES, Compare::Multiset).await;
}

#[tokio::test]
async fn keyless_mariadb_to_postgres() {
    fidelity_as(SourceKind::MariaDb, SinkKind::Postgres, KEYLESS_MARIADB, Compare::Multiset).await;
}

#[tokio::test]
async fn keyless_mariadb_to_bigquery() {
    fidelity_as(SourceKind::MariaDb, SinkKind::BigQuery, KEYLESS_MARIADB, Compare::Multiset).await;
}

/// A case's SQL for the source: `{s}` its schema or database, `{t}` the
/// qualified table.
fn sql(source: &Source, template: &str, table: &str) -> String {
    template.replace("{s}", source.name()).replace("{t}", &source.qualified(table))
}

async fn fidelity(source_kind: SourceKind, sink_kind: SinkKind, cases: &[Case]) {
    fidelity_as(source_kind, sink_kind, cases, Compare::ById).await;
}

/// [`fidelity`], the destination compared with the source as `compare`
/// says.
async fn fidelity_as(source_kind: SourceKind, sink_kind: SinkKind, cases: &[Case], compare: Compare) {
    let mut source = Source::new(source_kind, "fid").await;
    let sink = Sink::new(sink_kind, "fid").await;
    for case in cases {
        let create = sql(&source, case.create, case.table);
        source.sql(&create).await;
    }
    let mut runners = Runners::new(&source, &sink);
    runners.source.start();
    runners.sink.start();
    for case in cases {
        converge_as(&mut source, &sink, &mut runners, case.table, "snapshot", compare).await;
    }
    let steps = cases.iter().map(|c| c.steps.len()).max().unwrap_or(0);
    for i in 0..steps {
        for case in cases {
            let Some(step) = case.steps.get(i) else { continue };
            eprintln!("{source_kind:?} -> {sink_kind:?}: {}: {step}", case.table);
            let step_sql = sql(&source, step, case.table);
            source.sql(&step_sql).await;
            // Killed right after the step: the source replays from its
            // last checkpoint, DDL and rows alike.
            tokio::time::sleep(Duration::from_millis(150)).await;
            runners.source.kill9();
            runners.source.start();
            converge_as(&mut source, &sink, &mut runners, case.table, step, compare).await;
        }
    }
    for case in cases {
        for column in case.absent {
            assert!(
                !sink.has_column(case.table, column).await,
                "{}: the destination has column {column}, which is not carried",
                case.table
            );
        }
    }
    runners.assert_alive("at the end");
    runners.delete();
    sink.cleanup().await;
    source.cleanup().await;
}
