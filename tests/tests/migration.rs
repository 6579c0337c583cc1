//! Moving a database (issue #49): a PostgreSQL destination gets the
//! source's indexes, constraints, defaults and identities, each at its time
//! (docs/migration.md), kept in step with the source's later DDL.

use std::collections::BTreeSet;
use std::time::Duration;

use tributary_tests::matrix::{converge, Runners, Sink, SinkKind, Source, SourceKind};
use tributary_tests::{pg_destination_url, pg_source_url, postgres, runner_binary, wait_for};

/// The catalog of `schema`'s tables `customers` and `orders` as comparable
/// lines: indexes and constraints (all but the primary key's), defaults
/// and identities, with the schema's name replaced by `S` (and a
/// partitioned table's `ON ONLY` printed as a plain table's `ON`).
async fn catalog(url: &str, schema: &str) -> BTreeSet<String> {
    let client = postgres::connect(url).await;
    let tables = "t.relname IN ('customers', 'orders')";
    let queries = [
        format!(
            "SELECT 'index ' || pg_get_indexdef(i.indexrelid) FROM pg_index i JOIN pg_class t ON t.oid = i.indrelid \
             JOIN pg_namespace n ON n.oid = t.relnamespace WHERE n.nspname = $1 AND {tables} AND NOT i.indisprimary"
        ),
        format!(
            "SELECT 'constraint ' || k.conname || ' ' || pg_get_constraintdef(k.oid) || ' valid=' || k.convalidated::text \
             FROM pg_constraint k JOIN pg_class t ON t.oid = k.conrelid \
             JOIN pg_namespace n ON n.oid = t.relnamespace WHERE n.nspname = $1 AND {tables} AND k.contype <> 'p'"
        ),
        format!(
            "SELECT 'column ' || t.relname || '.' || a.attname || ' default ' || coalesce(pg_get_expr(d.adbin, d.adrelid), '') \
             || ' identity ' || a.attidentity::text FROM pg_attribute a JOIN pg_class t ON t.oid = a.attrelid \
             JOIN pg_namespace n ON n.oid = t.relnamespace LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum \
             WHERE n.nspname = $1 AND {tables} AND a.attnum > 0 AND NOT a.attisdropped \
               AND (d.oid IS NOT NULL OR a.attidentity <> '')"
        ),
    ];
    let mut out = BTreeSet::new();
    for q in &queries {
        for row in client
            .query(q.as_str(), &[&schema])
            .await
            .unwrap_or_else(|e| panic!("{q}: {e:?}"))
        {
            let line: String = row.get(0);
            out.insert(line.replace(&format!("{schema}."), "S.").replace(" ON ONLY ", " ON "));
        }
    }
    out
}

/// The objects the sink recorded, as `sink-runner objects --json` lists
/// them (`--make-waiting` first when asked): `(kind, name, state)`, and
/// whether the command succeeded.
fn objects(config: &std::path::Path, make_waiting: bool) -> (BTreeSet<(String, String, String)>, bool) {
    let mut cmd = std::process::Command::new(runner_binary("sink-runner"));
    cmd.args(["objects", "--json", "--config"]).arg(config);
    if make_waiting {
        cmd.arg("--make-waiting");
    }
    let out = cmd.output().expect("run sink-runner objects");
    let list: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    });
    let text = |v: &serde_json::Value, k: &str| v[k].as_str().unwrap_or_default().to_string();
    (
        list.iter()
            .map(|o| (text(o, "kind"), text(o, "name"), text(o, "state")))
            .collect(),
        out.status.success(),
    )
}

/// Indexes that are not unique and defaults reach the destination once
/// each table is copied, and follow the source's DDL (an index added, a
/// default changed); unique, check and foreign keys and identities wait
/// for the cutover (a check dropped at the source before then never
/// refuses the rows written after it), where `sink-runner objects
/// --make-waiting` makes them: the destination's catalog then equals the
/// source's, a partitioned table's included.
#[tokio::test]
async fn postgres_objects_follow_the_source_and_the_rest_wait_for_the_cutover() {
    let mut source = Source::new(SourceKind::Postgres, "migobj").await;
    let sink = Sink::new(SinkKind::Postgres, "migobj").await;
    let Sink::Postgres(destination) = &sink else {
        unreachable!("a PostgreSQL destination")
    };
    let (s, d) = (source.name().to_string(), destination.schema.clone());
    source
        .sql(&format!(
            "CREATE TABLE {s}.customers (id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY, email text NOT NULL, name text, \
               created date NOT NULL DEFAULT current_date, CONSTRAINT customers_email_key UNIQUE (email), \
               CONSTRAINT name_not_empty CHECK (length(name) > 0)); \
             CREATE INDEX customers_lower_name ON {s}.customers (lower(name)) WHERE name IS NOT NULL; \
             CREATE TABLE {s}.orders (id bigserial, customer_id int NOT NULL REFERENCES {s}.customers (id) ON DELETE CASCADE, \
               qty int NOT NULL DEFAULT 1 CONSTRAINT qty_positive CHECK (qty > 0), placed date NOT NULL, \
               PRIMARY KEY (id, placed)) PARTITION BY RANGE (placed); \
             CREATE TABLE {s}.orders_2025 PARTITION OF {s}.orders FOR VALUES FROM ('2025-01-01') TO ('2026-01-01'); \
             CREATE TABLE {s}.orders_2026 PARTITION OF {s}.orders FOR VALUES FROM ('2026-01-01') TO ('2027-01-01'); \
             CREATE INDEX orders_customer ON {s}.orders (customer_id); \
             INSERT INTO {s}.customers (email, name) SELECT 'c' || g || '@x', 'n' || g FROM generate_series(1, 50) g; \
             INSERT INTO {s}.orders (customer_id, qty, placed) \
               SELECT 1 + g % 50, 1 + g % 5, date '2025-06-01' + g FROM generate_series(1, 300) g"
        ))
        .await;
    let mut runners = Runners::new(&source, &sink);
    runners.source.start();
    runners.sink.start();
    for table in ["customers", "orders"] {
        converge(&mut source, &sink, &mut runners, table, "snapshot").await;
    }
    // The source's DDL after the copy, with writes: the destination follows.
    source
        .sql(&format!(
            "CREATE INDEX customers_created ON {s}.customers (created); \
             ALTER TABLE {s}.customers DROP CONSTRAINT name_not_empty; \
             ALTER TABLE {s}.orders ALTER COLUMN qty SET DEFAULT 2; \
             INSERT INTO {s}.customers (email, name) VALUES ('late@x', ''); \
             INSERT INTO {s}.orders (customer_id, placed) VALUES (51, '2026-03-01')"
        ))
        .await;
    for table in ["customers", "orders"] {
        converge(&mut source, &sink, &mut runners, table, "after the DDL").await;
    }
    let now_ones = [
        "index CREATE INDEX customers_created ON S.customers USING btree (created)",
        "index CREATE INDEX customers_lower_name ON S.customers USING btree (lower(name)) WHERE (name IS NOT NULL)",
        "index CREATE INDEX orders_customer ON S.orders USING btree (customer_id)",
        "column customers.created default CURRENT_DATE identity ",
        "column orders.qty default 2 identity ",
    ];
    let waited = wait_for("the indexes, checks and defaults in the destination", Duration::from_secs(60), || {
        let d = d.clone();
        async move {
            let got = catalog(&pg_destination_url(), &d).await;
            now_ones.iter().all(|l| got.contains(*l)).then_some(got)
        }
    })
    .await;
    assert!(!waited.iter().any(|l| l.contains("name_not_empty")), "a dropped check stays: {waited:#?}");
    assert!(!waited.iter().any(|l| l.starts_with("constraint ") || l.contains("UNIQUE")), "{waited:#?}");
    let (listed, ok) = objects(&runners.sink.config, false);
    assert!(ok, "objects refused: {listed:#?}");
    for (kind, name) in [
        ("unique", "customers_email_key"),
        ("foreign_key", "orders_customer_id_fkey"),
        ("check", "qty_positive"),
        ("identity", "id"),
    ] {
        assert!(
            listed.contains(&(kind.to_string(), name.to_string(), "at_cutover".to_string())),
            "{kind} {name} waits for the cutover: {listed:#?}"
        );
    }
    // The cutover's part: the source quiet, everything applied.
    runners.sink.kill9();
    let (listed, ok) = objects(&runners.sink.config, true);
    assert!(ok, "objects refused at the cutover: {listed:#?}");
    assert!(listed.iter().all(|(_, _, state)| state == "made"), "{listed:#?}");
    let want = catalog(&pg_source_url(), &s).await;
    let got = catalog(&pg_destination_url(), &d).await;
    assert_eq!(got, want, "the destination's catalog differs from the source's");
    // Promoted: the identity hands out a key above every copied one.
    let client = postgres::connect(&pg_destination_url()).await;
    let row = client
        .query_one(
            &format!(
                "SELECT nextval(pg_get_serial_sequence('\"{d}\".customers', 'id')) > (SELECT max(id) FROM \"{d}\".customers)"
            ),
            &[],
        )
        .await
        .expect("the identity's next value");
    assert!(row.get::<_, bool>(0), "the identity hands out a key the copy holds");
    runners.assert_alive("at the end");
    runners.delete();
    sink.cleanup().await;
    source.cleanup().await;
}
