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

/// A shop's tables in schema `s`, with every kind of object a migration
/// carries: an identity, a `bigserial`, defaults, a unique constraint, a
/// check, an expression index with a predicate, a partitioned table with
/// its own index and a foreign key; and their first rows.
fn shop(s: &str) -> String {
    format!(
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
    )
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

/// Starts a copy: a source runner of config `source` and a sink runner
/// named `prefix` (the source's name) of group `group` into destination
/// `section`, each with its admin server on a port of its own (`listen =
/// "off"` replaced), configs and logs in `dir`. Returns both configs'
/// paths, the sink's admin port and the runners.
fn start_copy(
    prefix: &str,
    dir: &std::path::Path,
    source: &str,
    group: &str,
    section: &str,
) -> (std::path::PathBuf, std::path::PathBuf, u16, (tributary_tests::Runner, tributary_tests::Runner)) {
    std::fs::create_dir_all(dir).expect("temp dir");
    let (source_port, sink_port) = (tributary_tests::free_port(), tributary_tests::free_port());
    let source_config = dir.join("source.toml");
    std::fs::write(
        &source_config,
        source.replace("listen = \"off\"", &format!("listen = \"127.0.0.1:{source_port}\"")),
    )
    .expect("source config");
    let sink_config = dir.join("sink.toml");
    std::fs::write(
        &sink_config,
        tributary_tests::sink_runner_config(prefix, group, section)
            .replace("listen = \"off\"", &format!("listen = \"127.0.0.1:{sink_port}\"")),
    )
    .expect("sink config");
    let source = tributary_tests::Runner::start("source-runner", &source_config, &dir.join("source.log"));
    let sink = tributary_tests::Runner::start("sink-runner", &sink_config, &dir.join("sink.log"));
    eprintln!("logs: {}", dir.display());
    (source_config, sink_config, sink_port, (source, sink))
}

/// The `[postgres]` section of a sink into `dest`.
fn into(dest: &postgres::Destination) -> String {
    format!("[postgres]\nurl = \"{}\"\nschema = \"{}\"\n", pg_destination_url(), dest.schema)
}

/// The rows of `schema`'s customers and orders at `url`, as text.
async fn contents(url: &str, schema: &str) -> (Option<String>, Option<String>) {
    let client = postgres::connect(url).await;
    let row = client
        .query_one(
            &format!(
                "SELECT (SELECT string_agg(format('%s|%s|%s|%s', id, email, name, created), ',' ORDER BY id) \
                         FROM \"{schema}\".customers), \
                        (SELECT string_agg(format('%s|%s|%s|%s', id, customer_id, qty, placed), ',' ORDER BY id) \
                         FROM \"{schema}\".orders)"
            ),
            &[],
        )
        .await
        .expect("the rows");
    (row.get(0), row.get(1))
}

/// Asks the sink runner of admin port `port` for a cutover from its
/// console (`POST /cutover`), a dry run or not, and waits for its end:
/// what `GET /cutover` then says.
async fn console_cutover(port: u16, dry_run: bool) -> serde_json::Value {
    let asked = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/cutover?dry_run={dry_run}"))
        .send()
        .await
        .expect("POST /cutover");
    assert_eq!(asked.status(), reqwest::StatusCode::ACCEPTED, "{:?}", asked.text().await);
    wait_for("the cutover asked from the console", Duration::from_secs(240), || async {
        let state: serde_json::Value = reqwest::get(format!("http://127.0.0.1:{port}/cutover"))
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        (state["state"] != "running").then_some(state)
    })
    .await
}

/// Runs `sink-runner cutover --json` (up to 180 s per wait).
async fn cutover(sink_config: &std::path::Path, source_config: &std::path::Path) -> std::process::Output {
    let (sink_config, source_config) = (sink_config.to_path_buf(), source_config.to_path_buf());
    tokio::task::spawn_blocking(move || {
        std::process::Command::new(runner_binary("sink-runner"))
            .arg("--config")
            .arg(&sink_config)
            .arg("cutover")
            .arg("--source-config")
            .arg(&source_config)
            .args(["--json", "--timeout-seconds", "180"])
            .output()
            .expect("run the cutover")
    })
    .await
    .expect("cutover")
}

/// Deletes both runners' copy (topics, slot; the destination's tables too
/// when `drop_destination`).
fn delete(source_config: &std::path::Path, sink_config: &std::path::Path, drop_destination: bool) {
    for (runner, config, extra) in [
        ("source-runner", source_config, None),
        ("sink-runner", sink_config, drop_destination.then_some("--drop-destination")),
    ] {
        let _ = std::process::Command::new(runner_binary(runner))
            .arg("--config")
            .arg(config)
            .args(["delete", "--yes"])
            .args(extra)
            .status();
    }
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
    source.sql(&shop(&s)).await;
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

/// A PostgreSQL database moved under a steady write load: `sink-runner
/// cutover` waits for the copy, makes the source read-only (the writer's
/// session ends), verifies every table, makes the objects that waited and
/// moves the sequences. The report says every table is equal, the write
/// downtime is under 10 s, the destination's catalog equals the source's,
/// and the application's next rows go into the destination with keys above
/// every source key. The source is a database of its own: read-only is a
/// database's setting.
#[tokio::test]
async fn a_postgres_database_moves_under_writes_and_cuts_over_in_one_command() {
    let name = tributary_tests::unique("migcut");
    let pg = postgres::connect(&pg_source_url()).await;
    pg.batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .expect("a database of its own");
    let url = match pg_source_url().rsplit_once('/') {
        Some((server, _)) => format!("{server}/{name}"),
        None => panic!("a source URL with a database"),
    };
    let db = postgres::connect(&url).await;
    db.batch_execute(&format!("CREATE SCHEMA {name}; {}", shop(&name)))
        .await
        .expect("the shop");
    let dest = postgres::Destination::new(&name).await;
    let dir = std::env::temp_dir().join(&name);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let source_toml = tributary_tests::pg_source_runner_config(&name)
        .replace(&format!("url = \"{}\"", pg_source_url()), &format!("url = \"{url}\""));
    let (source_config, sink_config, sink_port, (source, sink)) =
        start_copy(&name, &dir, &source_toml, &dest.group, &into(&dest));
    wait_for("the copy", Duration::from_secs(120), || async {
        let status = tributary_tests::runner_status(sink_port).await?;
        let t = &status["tables"][format!("{}.orders", dest.schema)];
        (t["events"].as_u64()? + t["rows_snapshotted"].as_u64().unwrap_or(0) >= 300).then_some(())
    })
    .await;

    // The application: a session of its own, writing until it cannot.
    let mut config: tokio_postgres::Config = url.parse().expect("url");
    config.application_name("shop-app");
    let (app, connection) = config.connect(tokio_postgres::NoTls).await.expect("the application's session");
    tokio::spawn(connection);
    let (s, writes) = (name.clone(), std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0)));
    let counted = writes.clone();
    let writer = tokio::spawn(async move {
        for i in 0u64.. {
            let sql = format!(
                "BEGIN; INSERT INTO {s}.customers (email, name) VALUES ('w{i}@x', 'w{i}'); \
                 INSERT INTO {s}.orders (customer_id, qty, placed) SELECT max(id), 1 + {i} % 7, date '2026-01-01' + {i} % 300 \
                   FROM {s}.customers; \
                 UPDATE {s}.orders SET qty = qty + 1 WHERE id = 1 + {i} % 300; COMMIT"
            );
            if let Err(e) = app.batch_execute(&sql).await {
                return e.to_string();
            }
            counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        unreachable!()
    });
    tokio::time::sleep(Duration::from_secs(5)).await;
    let out = cutover(&sink_config, &source_config).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the cutover failed ({}):\n{stdout}\n{stderr}", out.status);
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    eprintln!("{}", serde_json::to_string_pretty(&report).unwrap_or_default());
    let stopped = tokio::time::timeout(Duration::from_secs(30), writer)
        .await
        .expect("the writer stops")
        .expect("writer");
    assert!(writes.load(std::sync::atomic::Ordering::Relaxed) > 10, "the application wrote during the copy");
    eprintln!("the application's last error: {stopped}");
    let tables = report["tables"].as_array().expect("tables");
    assert_eq!(tables.len(), 2, "{report}");
    assert!(tables.iter().all(|t| t["verification"] == "equal"), "{report}");
    let downtime = report["downtime_ms"].as_u64().expect("downtime");
    assert!(downtime < 10_000, "write downtime {downtime} ms");
    assert_eq!(catalog(&pg_destination_url(), &dest.schema).await, catalog(&url, &name).await);
    let d = &dest.schema;
    // The cutover ended every session of the source but the copy's; its
    // keys as it left them.
    let db = postgres::connect(&url).await;
    let max = db
        .query_one(&format!("SELECT (SELECT max(id) FROM {name}.customers), (SELECT max(id) FROM {name}.orders)"), &[])
        .await
        .expect("the source's keys");
    let (max_customer, max_order): (i32, i64) = (max.get(0), max.get(1));

    // The way back (docs/migration.md): before the application moves, a
    // copy from the new database into the old one starts from this point,
    // without a snapshot (the two are equal); its sink's sessions may write
    // the read-only database, without its triggers (foreign keys included:
    // a child row may come before its parent's). (No DDL trigger: the new
    // database is the one every test's sink writes.)
    let back = format!("{name}_back");
    let back_source = format!(
        "name = \"{back}\"\nschema_registry_url = \"{}\"\n[kafka]\nbootstrap_servers = \"{}\"\n[admin]\nlisten = \"off\"\n\
         [postgres]\nurl = \"{}\"\nslot_name = \"{back}\"\npublication_name = \"{back}\"\ninclude = [\"{d}.*\"]\n\
         snapshot_mode = \"never\"\nschema_objects = false\nheartbeat_interval_ms = 1000\n\
         install_ddl_trigger = false\n",
        tributary_tests::schema_registry_url(),
        tributary_tests::kafka_bootstrap(),
        pg_destination_url()
    );
    let back_section = format!(
        "[postgres]\nurl = \"{url}?options=-c%20default_transaction_read_only%3Doff%20-c%20session_replication_role%3Dreplica\"\n\
         schema = \"{name}\"\n"
    );
    let (back_source_config, back_sink_config, _, back_runners) =
        start_copy(&back, &dir.join("back"), &back_source, &format!("{back}_group"), &back_section);
    wait_for("the way back's slot", Duration::from_secs(60), || async {
        let slots: i64 = dest
            .admin
            .query_one("SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", &[&back])
            .await
            .ok()?
            .get(0);
        (slots == 1).then_some(())
    })
    .await;

    // The application on the new database: keys above every source key.
    let row = dest
        .admin
        .query_one(
            &format!(
                "WITH c AS (INSERT INTO \"{d}\".customers (email, name) VALUES ('after@x', 'after') RETURNING id), \
                 o AS (INSERT INTO \"{d}\".orders (customer_id, placed) SELECT id, '2026-06-01' FROM c RETURNING id) \
                 SELECT (SELECT id FROM c), (SELECT id FROM o)"
            ),
            &[],
        )
        .await
        .expect("the application writes into the new database");
    let (customer, order): (i32, i64) = (row.get(0), row.get(1));
    assert!(customer > max_customer && order > max_order, "keys the source used");
    dest.admin
        .batch_execute(&format!(
            "UPDATE \"{d}\".orders SET qty = qty + 5 WHERE id <= 5; DELETE FROM \"{d}\".customers WHERE id = 1"
        ))
        .await
        .expect("an update, a delete that cascades");
    // The old database follows the new one, and still refuses the
    // application's writes.
    let new = contents(&pg_destination_url(), d).await;
    assert!(new.0.as_deref().is_some_and(|c| c.contains("after@x")), "{new:?}");
    let since = std::time::Instant::now();
    wait_for("the old database to equal the new one", Duration::from_secs(90), || async {
        (contents(&url, &name).await == contents(&pg_destination_url(), d).await).then_some(())
    })
    .await;
    eprintln!("the old database equalled the new one {} ms after its writes", since.elapsed().as_millis());
    let refused = db
        .batch_execute(&format!("INSERT INTO {name}.customers (email, name) VALUES ('late@x', 'late')"))
        .await
        .expect_err("the old database is read-only");
    eprintln!("the old database refused the application: {refused:?}");
    drop(back_runners);
    delete(&back_source_config, &back_sink_config, false);

    drop(sink);
    drop(source);
    drop(db);
    delete(&source_config, &sink_config, true);
    let _ = pg.batch_execute(&format!("DROP DATABASE {name} WITH (FORCE)")).await;
    dest.exec(&format!("DROP SCHEMA IF EXISTS \"{d}\" CASCADE")).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A MariaDB database moves into PostgreSQL under a steady write load, with
/// the objects that map (docs/migration.md): its unique and secondary
/// indexes (a descending part, the index InnoDB made for a foreign key),
/// a foreign key with its action, checks, literal and `CURRENT_TIMESTAMP`
/// defaults and `AUTO_INCREMENT` columns as identities; a prefix index is
/// not carried. One cutover asked from the sink runner's console (`POST
/// /cutover`, after a dry run that changes nothing) makes the server read-only (the
/// application's account is stopped, its session ended), verifies both
/// tables, makes the objects that waited and moves the identities past the
/// source's counters: the application's next rows go into the destination
/// with keys above every source key, and the copy equals the source.
#[tokio::test]
async fn a_mariadb_database_moves_under_writes_and_cuts_over_in_one_command() {
    use mysql_async::prelude::Queryable;
    let name = tributary_tests::unique("mymig");
    let base = tributary_tests::mysql_url();
    let server = base
        .rsplit_once('/')
        .map(|(s, _)| s.to_string())
        .expect("a MySQL URL with a database");
    let url = format!("{server}/{name}");
    let mut admin = mysql_async::Conn::from_url(&base).await.expect("MariaDB");
    for sql in [
        format!("CREATE DATABASE {name}"),
        format!(
            "CREATE TABLE {name}.customers (id int NOT NULL AUTO_INCREMENT PRIMARY KEY, email varchar(80) NOT NULL, \
             name varchar(80), status varchar(10) NOT NULL DEFAULT 'new', created datetime DEFAULT CURRENT_TIMESTAMP, \
             UNIQUE KEY email (email), KEY by_name (name), KEY name_prefix (name(4)), \
             CONSTRAINT status_known CHECK (status IN ('new', 'vip')))"
        ),
        format!(
            "CREATE TABLE {name}.orders (id bigint NOT NULL AUTO_INCREMENT PRIMARY KEY, customer_id int NOT NULL, \
             qty int NOT NULL DEFAULT 1, placed date NOT NULL, KEY placed_qty (placed, qty DESC), \
             CONSTRAINT orders_customer FOREIGN KEY (customer_id) REFERENCES {name}.customers (id) ON DELETE CASCADE, \
             CONSTRAINT qty_positive CHECK (qty > 0))"
        ),
        format!("INSERT INTO {name}.customers (email, name) SELECT concat('c', seq, '@x'), concat('n', seq) FROM seq_1_to_50"),
        format!(
            "INSERT INTO {name}.orders (customer_id, qty, placed) \
             SELECT 1 + seq % 50, 1 + seq % 5, date '2025-06-01' + INTERVAL seq DAY FROM seq_1_to_300"
        ),
        // The application's own account: read_only stops it (the copy's
        // account may write through it).
        format!("CREATE USER '{name}'@'%' IDENTIFIED BY 'app'"),
        format!("GRANT SELECT, INSERT, UPDATE, DELETE ON {name}.* TO '{name}'@'%'"),
    ] {
        admin.query_drop(&sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    let dest = postgres::Destination::new(&name).await;
    let dir = std::env::temp_dir().join(&name);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let server_id = 100_000 + (uuid::Uuid::new_v4().as_u128() % 1_000_000) as u32;
    let source_toml = format!(
        "name = \"{name}\"\nschema_registry_url = \"{registry}\"\n[kafka]\nbootstrap_servers = \"{kafka}\"\n\
         [admin]\nlisten = \"off\"\n[mysql]\nurl = \"{url}\"\nserver_id = {server_id}\n\
         heartbeat_interval_ms = 1000\nobjects_interval_ms = 1000\n",
        registry = tributary_tests::schema_registry_url(),
        kafka = tributary_tests::kafka_bootstrap(),
    );
    // The cutover from the console: the sink runner knows the source's config.
    let section = format!("[cutover]\nsource_config = \"{}\"\n{}", dir.join("source.toml").display(), into(&dest));
    let (source_config, sink_config, sink_port, (source, sink)) =
        start_copy(&name, &dir, &source_toml, &dest.group, &section);
    // Once copied, the indexes that are not unique and the defaults are
    // made; the rest waits for the cutover.
    let now = [
        ("index", "customers_by_name"),
        ("index", "orders_placed_qty"),
        ("index", "orders_orders_customer"),
        ("default", "status"),
        ("default", "created"),
        ("default", "qty"),
    ];
    let waiting = [
        ("index", "customers_email"),
        ("foreign_key", "orders_customer"),
        ("check", "qty_positive"),
        ("check", "status_known"),
        ("identity", "id"),
    ];
    wait_for("the copy and its objects", Duration::from_secs(120), || async {
        let (listed, ok) = objects(&sink_config, false);
        let has = |kind: &str, name: &str, state: &str| listed.contains(&(kind.into(), name.into(), state.into()));
        (ok && now.iter().all(|(k, n)| has(k, n, "made")) && waiting.iter().all(|(k, n)| has(k, n, "at_cutover")))
            .then_some(())
    })
    .await;
    let (listed, _) = objects(&sink_config, false);
    assert!(!listed.iter().any(|(_, n, _)| n.contains("prefix")), "a prefix index is not carried: {listed:?}");

    // The application: an account and a session of its own, writing until
    // it cannot.
    let app_url = format!("mysql://{name}:app@{}/{name}", server.rsplit('@').next().unwrap_or_default());
    let mut app = mysql_async::Conn::from_url(app_url.as_str())
        .await
        .expect("the application's session");
    let writes = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counted = writes.clone();
    let writer = tokio::spawn(async move {
        for i in 0u64.. {
            let statements = [
                "START TRANSACTION".to_string(),
                format!("INSERT INTO customers (email, name, status) VALUES ('w{i}@x', 'w{i}', 'vip')"),
                format!(
                    "INSERT INTO orders (customer_id, qty, placed) \
                     VALUES (LAST_INSERT_ID(), 1 + {i} % 7, date '2026-01-01' + INTERVAL {i} % 300 DAY)"
                ),
                format!("UPDATE orders SET qty = qty + 1 WHERE id = 1 + {i} % 300"),
                "COMMIT".to_string(),
            ];
            for sql in statements {
                if let Err(e) = app.query_drop(sql).await {
                    return e.to_string();
                }
            }
            counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        unreachable!()
    });
    tokio::time::sleep(Duration::from_secs(5)).await;
    // The console's page offers it; a dry run changes nothing (the
    // application goes on writing); then the cutover.
    let page = reqwest::get(format!("http://127.0.0.1:{sink_port}/"))
        .await
        .expect("the console")
        .text()
        .await
        .expect("its page");
    assert!(page.contains("cutover-run"), "the console has no cutover");
    let dry = console_cutover(sink_port, true).await;
    assert!(dry["state"] == "done" && dry["report"]["dry_run"] == true, "{dry}");
    let before = writes.load(std::sync::atomic::Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(writes.load(std::sync::atomic::Ordering::Relaxed) > before, "a dry run stops no write");
    let done = console_cutover(sink_port, false).await;
    let stopped = tokio::time::timeout(Duration::from_secs(30), writer).await;
    // The server is shared with the other tests: writable again first.
    admin.query_drop("SET GLOBAL read_only = OFF").await.expect("undo read_only");
    assert_eq!(done["state"], "done", "{done}");
    let report = done["report"].clone();
    eprintln!("{}", serde_json::to_string_pretty(&done).unwrap_or_default());
    let stopped = stopped.expect("the writer stops").expect("writer");
    assert!(writes.load(std::sync::atomic::Ordering::Relaxed) > 10, "the application wrote during the copy");
    eprintln!("the application's last error: {stopped}");
    let tables = report["tables"].as_array().expect("tables");
    assert_eq!(tables.len(), 2, "{report}");
    assert!(tables.iter().all(|t| t["verification"] == "equal"), "{report}");
    let downtime = report["downtime_ms"].as_u64().expect("downtime");
    assert!(downtime < 10_000, "write downtime {downtime} ms");
    assert!(report["ok"].as_bool() == Some(true), "{report}");

    // The destination's catalog holds every object that maps.
    let d = &dest.schema;
    let lines = catalog(&pg_destination_url(), d).await;
    eprintln!("{lines:#?}");
    for expected in [
        "index CREATE UNIQUE INDEX customers_email ON S.customers USING btree (email)",
        "index CREATE INDEX customers_by_name ON S.customers USING btree (name)",
        "index CREATE INDEX orders_placed_qty ON S.orders USING btree (placed, qty DESC)",
        "index CREATE INDEX orders_orders_customer ON S.orders USING btree (customer_id)",
        "constraint orders_customer FOREIGN KEY (customer_id) REFERENCES S.customers(id) ON UPDATE RESTRICT ON DELETE CASCADE valid=true",
        "constraint qty_positive CHECK ((qty > 0)) valid=true",
        "column customers.id default  identity d",
        "column orders.id default  identity d",
        "column orders.qty default 1 identity ",
        "column customers.created default CURRENT_TIMESTAMP identity ",
    ] {
        assert!(lines.contains(expected), "{expected} not in {lines:#?}");
    }
    for prefix in ["constraint status_known CHECK", "column customers.status default 'new'"] {
        assert!(lines.iter().any(|l| l.starts_with(prefix)), "{prefix} not in {lines:#?}");
    }
    assert!(!lines.iter().any(|l| l.contains("name_prefix")), "{lines:#?}");

    // The application on the new database: keys above every source key,
    // the defaults filled in.
    let row = dest
        .admin
        .query_one(
            &format!(
                "WITH c AS (INSERT INTO \"{d}\".customers (email, name) VALUES ('after@x', 'after') RETURNING id, status), \
                 o AS (INSERT INTO \"{d}\".orders (customer_id, placed) SELECT id, '2026-06-01' FROM c RETURNING id, qty) \
                 SELECT (SELECT id FROM c)::bigint, (SELECT id FROM o)::bigint, (SELECT status FROM c)::text, \
                        (SELECT qty FROM o)::bigint"
            ),
            &[],
        )
        .await
        .expect("the application writes into the new database");
    let (customer, order, status, qty): (i64, i64, String, i64) = (row.get(0), row.get(1), row.get(2), row.get(3));
    assert_eq!((status.as_str(), qty), ("new", 1));
    let (max_customer, max_order): (i64, i64) = admin
        .query_first(format!("SELECT (SELECT max(id) FROM {name}.customers), (SELECT max(id) FROM {name}.orders)"))
        .await
        .expect("the source's keys")
        .expect("a row");
    assert!(customer > max_customer && order > max_order, "keys the source used");
    // The foreign key holds in the destination.
    let refused = dest
        .admin
        .batch_execute(&format!("INSERT INTO \"{d}\".orders (customer_id, placed) VALUES (-1, '2026-06-01')"))
        .await;
    assert!(refused.is_err(), "an order of no customer is refused");

    drop(sink);
    drop(source);
    delete(&source_config, &sink_config, true);
    let _ = admin.query_drop(format!("DROP DATABASE {name}")).await;
    let _ = admin.query_drop(format!("DROP USER '{name}'@'%'")).await;
    dest.exec(&format!("DROP SCHEMA IF EXISTS \"{d}\" CASCADE")).await;
    let _ = std::fs::remove_dir_all(&dir);
}
