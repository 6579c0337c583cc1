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

use tributary_tests::matrix::{converge, converge_as, Compare, Runners, Sink, SinkKind, Source, SourceKind};

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

/// MariaDB's cases (issue #46, the MySQL side): DDL that changes the
/// values of rows the binlog holds no change for, and values whose range
/// differs between MariaDB and a destination. Statements are split on
/// `; `: a session setting (`sql_mode`) holds for the statements after it.
const MARIADB: &[Case] = &[
    // A generated column added by a copying ALTER got its values without a
    // row event: the destination held NULL in the rows older than it.
    // VIRTUAL columns are in the row images too (binlog_row_image = FULL),
    // so they are carried; under updates both kinds flow.
    Case {
        table: "generated",
        create: "CREATE TABLE {t} (id int PRIMARY KEY, a int, v int AS (a * 2) VIRTUAL, s int AS (a + 1) PERSISTENT); \
                 INSERT INTO {t} (id, a) SELECT seq, seq FROM seq_1_to_20",
        steps: &[
            "UPDATE {t} SET a = a + 2 WHERE id <= 10",
            "ALTER TABLE {t} ADD COLUMN g int AS (a * 3) STORED; UPDATE {t} SET a = a + 1 WHERE id = 1",
            "ALTER TABLE {t} ADD COLUMN gv int AS (a * 5) VIRTUAL; UPDATE {t} SET a = a + 1 WHERE id = 2",
            "ALTER TABLE {t} ADD COLUMN gp int AS (a - 1) PERSISTENT; UPDATE {t} SET a = a + 1 WHERE id = 3",
            "ALTER TABLE {t} MODIFY COLUMN s int AS (a + 100) PERSISTENT; UPDATE {t} SET a = a + 1 WHERE id = 4",
            "UPDATE {t} SET a = a * 2 WHERE id > 15; INSERT INTO {t} (id, a) VALUES (101, 7)",
        ],
        absent: &[],
    },
    // Defaults the rows older than the column got and the binlog does not
    // say: the ALTER's clock, one uuid per row, a literal rounded to the
    // column's scale, a sequence. A constant default is carried (no copy).
    Case {
        table: "defaults",
        create: "CREATE TABLE {t} (id int PRIMARY KEY, a int); INSERT INTO {t} SELECT seq, seq FROM seq_1_to_20",
        steps: &[
            "ALTER TABLE {t} ADD COLUMN c datetime(6) DEFAULT CURRENT_TIMESTAMP(6); UPDATE {t} SET a = a + 1 WHERE id = 1",
            "ALTER TABLE {t} ADD COLUMN u char(36) DEFAULT (uuid()); UPDATE {t} SET a = a + 1 WHERE id = 2",
            "ALTER TABLE {t} ADD COLUMN k int DEFAULT 7; UPDATE {t} SET a = a + 1 WHERE id = 3",
            "ALTER TABLE {t} ADD COLUMN r decimal(5,1) DEFAULT 1.25; UPDATE {t} SET a = a + 1 WHERE id = 4",
            "ALTER TABLE {t} ADD COLUMN n int NOT NULL AUTO_INCREMENT, ADD UNIQUE KEY (n); UPDATE {t} SET a = a + 1 WHERE id = 5",
            "INSERT INTO {t} (id, a) VALUES (101, 1); UPDATE {t} SET a = a + 1 WHERE id = 6",
        ],
        absent: &[],
    },
    // Type changes that convert the values in place and that the topic
    // carries: fractions of a second cut (also in strict mode), then text
    // truncated, an integer clamped, NULL made 0 and characters latin1 has
    // not made `?` (with a non-strict sql_mode, where MariaDB converts
    // instead of refusing). A change the topic cannot carry (a decimal's
    // scale) pauses the table instead (incompatible_schema_changes,
    // tests/tests/schema_changes.rs).
    Case {
        table: "retyped",
        create: "CREATE TABLE {t} (id int PRIMARY KEY, d decimal(8,2), n int, v varchar(20), dt datetime(6), \
                 tm time(6), b int, w varchar(20)) CHARACTER SET utf8mb4; \
                 INSERT INTO {t} SELECT seq, seq + 0.25, seq * 100, concat('value ', seq), \
                 '2024-01-01 10:00:00.654321' + INTERVAL seq SECOND, SEC_TO_TIME(seq - 108000.654321), \
                 IF(seq % 2 = 0, NULL, seq), concat('жук ', seq) FROM seq_1_to_20",
        steps: &[
            "ALTER TABLE {t} MODIFY dt datetime(2); ALTER TABLE {t} MODIFY tm time; UPDATE {t} SET d = d + 1 WHERE id = 1",
            "SET SESSION sql_mode = ''; ALTER TABLE {t} MODIFY v varchar(5); ALTER TABLE {t} MODIFY n tinyint; \
             SET SESSION sql_mode = DEFAULT; UPDATE {t} SET d = d + 1 WHERE id = 2",
            "SET SESSION sql_mode = ''; ALTER TABLE {t} MODIFY b int NOT NULL; SET SESSION sql_mode = DEFAULT; \
             UPDATE {t} SET d = d + 1 WHERE id = 3",
            "SET SESSION sql_mode = ''; ALTER TABLE {t} CONVERT TO CHARACTER SET latin1; SET SESSION sql_mode = DEFAULT; \
             UPDATE {t} SET d = d + 1 WHERE id = 5",
            "UPDATE {t} SET d = d + 1 WHERE id > 15; \
             INSERT INTO {t} VALUES (101, 1.5, 2, 'new', '2024-02-02 00:00:00', '-01:00:00', 0, 'x')",
        ],
        absent: &[],
    },
    // TIME spans -838:59:59..838:59:59: the destination once held
    // `01:00:01` for `-838:59:59` (wrapped modulo a day). With its
    // neighbours at their edges: YEAR, BIGINT UNSIGNED above 2^63,
    // DATETIME(6) and DATE from year 1000 to 9999.
    Case {
        table: "ranges",
        create: "CREATE TABLE {t} (id int PRIMARY KEY, t0 time, t6 time(6), y year, u bigint unsigned, \
                 dt datetime(6), d date, a int); \
                 INSERT INTO {t} VALUES \
                 (1, '-838:59:59', '-838:59:59.000000', 1901, 18446744073709551615, '1000-01-01 00:00:00.000001', '1000-01-01', 1), \
                 (2, '838:59:59', '838:59:58.999999', 2155, 9223372036854775808, '9999-12-31 23:59:59.999999', '9999-12-31', 2), \
                 (3, '-00:00:01', '-12:00:00.000001', 2000, 0, '1970-01-01 00:00:00.000000', '1970-01-01', 3), \
                 (4, '24:00:00', '100:00:00.5', 1999, 1, '1969-12-31 23:59:59.999999', '1969-12-31', 4)",
        steps: &[
            "INSERT INTO {t} VALUES (5, '-100:00:00', '-00:00:00.000001', 2001, 18446744073709551614, \
             '2024-02-29 12:00:00.000001', '2024-02-29', 5); UPDATE {t} SET t0 = '-838:59:59', t6 = '838:59:59' WHERE id = 4",
            "ALTER TABLE {t} ADD COLUMN t2 time(6) DEFAULT '-01:00:00.5'; UPDATE {t} SET a = a + 1 WHERE id = 1",
            "UPDATE {t} SET t2 = '-838:59:59', t0 = '00:00:00' WHERE id = 2; INSERT INTO {t} (id, t0, a) VALUES (101, '500:00:00', 1)",
        ],
        absent: &[],
    },
];

/// MariaDB's decimals beyond 38 digits, into PostgreSQL only: the BigQuery
/// emulator makes a BIGNUMERIC(65, 30) column NUMERIC and drops the rows
/// (real BigQuery holds it: docs/destinations/bigquery.md).
const MARIADB_WIDE_DECIMALS: &[Case] = &[Case {
    table: "wide",
    create: "CREATE TABLE {t} (id int PRIMARY KEY, w decimal(65,30), a int); \
             INSERT INTO {t} VALUES (1, '12345678901234567890123456789012345.123456789012345678901234567890', 1), \
             (2, '-99999999999999999999999999999999999.999999999999999999999999999999', 2)",
    steps: &["UPDATE {t} SET w = -w WHERE id = 1; INSERT INTO {t} VALUES (3, '0.000000000000000000000000000001', 3)"],
    absent: &[],
}];

#[tokio::test]
async fn mariadb_to_postgres() {
    fidelity(SourceKind::MariaDb, SinkKind::Postgres, MARIADB).await;
    fidelity(SourceKind::MariaDb, SinkKind::Postgres, MARIADB_WIDE_DECIMALS).await;
}

#[tokio::test]
async fn mariadb_to_bigquery() {
    fidelity(SourceKind::MariaDb, SinkKind::BigQuery, MARIADB).await;
}

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

/// Sequences are not in the WAL's changes: a copy promoted to primary
/// handed out keys its source had used (the destination had no sequence
/// at all). The PostgreSQL sink keeps each sequence a captured table's
/// column takes values from at or above the source's, also across a kill
/// of the source: a `nextval` in the destination never returns a key its
/// copy of the table holds.
#[tokio::test]
async fn postgres_sequences_to_postgres() {
    let mut source = Source::new(SourceKind::Postgres, "fidseq").await;
    let sink = Sink::new(SinkKind::Postgres, "fidseq").await;
    let Sink::Postgres(destination) = &sink else {
        unreachable!("a PostgreSQL destination")
    };
    let s = source.name().to_string();
    source
        .sql(&format!(
            "CREATE SEQUENCE {s}.shared START 500; \
             CREATE TABLE {s}.orders (id bigserial PRIMARY KEY, ref int DEFAULT nextval('{s}.shared'), a int); \
             CREATE TABLE {s}.lines (id int GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, a int); \
             INSERT INTO {s}.orders (a) SELECT g FROM generate_series(1, 20) g; \
             INSERT INTO {s}.lines (a) SELECT g FROM generate_series(1, 5) g"
        ))
        .await;
    let mut runners = Runners::new(&source, &sink);
    runners.source.start();
    runners.sink.start();
    for table in ["orders", "lines"] {
        converge(&mut source, &sink, &mut runners, table, "snapshot").await;
    }
    let next_in = |url: String, schema: String, sequence: &'static str| async move {
        let client = tributary_tests::postgres::connect(&url).await;
        let q = format!(
            "SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END FROM \"{schema}\".\"{sequence}\""
        );
        client.query_one(q.as_str(), &[]).await.ok().map(|r| r.get::<_, i64>(0))
    };
    let caught_up = |what: &'static str| {
        let (s, d) = (s.clone(), destination.schema.clone());
        async move {
            tributary_tests::wait_for(what, Duration::from_secs(60), || {
                let (s, d) = (s.clone(), d.clone());
                async move {
                    for seq in ["orders_id_seq", "shared", "lines_id_seq"] {
                        let want = next_in(tributary_tests::pg_source_url(), s.clone(), seq).await?;
                        let got = next_in(tributary_tests::pg_destination_url(), d.clone(), seq).await?;
                        if got < want {
                            return None;
                        }
                    }
                    Some(())
                }
            })
            .await
        }
    };
    caught_up("the destination's sequences at the source's").await;
    // Values handed out while the source runner is killed, and after.
    runners.source.kill9();
    source
        .sql(&format!(
            "INSERT INTO {s}.orders (a) SELECT g FROM generate_series(1, 7) g; SELECT nextval('{s}.shared'); \
             INSERT INTO {s}.lines (a) VALUES (6)"
        ))
        .await;
    runners.source.start();
    source.sql(&format!("INSERT INTO {s}.orders (a) VALUES (99)")).await;
    for table in ["orders", "lines"] {
        converge(&mut source, &sink, &mut runners, table, "after the kill").await;
    }
    caught_up("the destination's sequences at the source's after the kill").await;
    // Promoted: the destination's next key is not one its copy holds.
    let client = tributary_tests::postgres::connect(&tributary_tests::pg_destination_url()).await;
    let d = &destination.schema;
    let row = client
        .query_one(
            &format!("SELECT nextval('\"{d}\".\"orders_id_seq\"') > (SELECT max(id) FROM \"{d}\".\"orders\")"),
            &[],
        )
        .await
        .expect("nextval");
    assert!(row.get::<_, bool>(0), "the destination's sequence hands out a key its copy holds");
    runners.assert_alive("at the end");
    runners.delete();
    sink.cleanup().await;
    source.cleanup().await;
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
