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

use tributary_tests::matrix::{converge, Runners, Sink, SinkKind, Source, SourceKind};

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

/// A case's SQL for the source: `{s}` its schema or database, `{t}` the
/// qualified table.
fn sql(source: &Source, template: &str, table: &str) -> String {
    template.replace("{s}", source.name()).replace("{t}", &source.qualified(table))
}

async fn fidelity(source_kind: SourceKind, sink_kind: SinkKind, cases: &[Case]) {
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
        converge(&mut source, &sink, &mut runners, case.table, "snapshot").await;
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
            converge(&mut source, &sink, &mut runners, case.table, step).await;
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
