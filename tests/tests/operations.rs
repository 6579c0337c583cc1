//! Operating a copy: status and metrics move as data flows (parsed, not just
//! fetched), pause stops the flow and resume restarts it with nothing lost,
//! delete leaves no slot, publication, topic or subject behind, a secret
//! never appears in logs, status or metrics, and mutating requests are
//! refused without the token or when a web page sends them.
//!
//! Real PostgreSQL, Kafka and registry; the `source-runner` binary.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;
use secrecy::SecretString;
use tributary_operations::admin::{router, Control};
use tributary_operations::telemetry::Telemetry;
use tributary_tests::{kafka_bootstrap, pg_source_url, runner_binary, schema_registry_url, unique, wait_for};

/// The value of metric `name` for `table` (the `runner` and `kind` labels
/// come first).
fn metric(text: &str, name: &str, table: &str) -> Option<f64> {
    let prefix = format!("{name}{{");
    let label = format!("table=\"{table}\"}} ");
    text.lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .find_map(|l| l.split_once(&label).map(|(_, v)| v))
        .and_then(|v| v.trim().parse().ok())
}

async fn get(url: &str) -> Option<String> {
    let resp = reqwest::get(url).await.ok()?;
    resp.status().is_success().then_some(())?;
    resp.text().await.ok()
}

struct Runner(Child);
impl Drop for Runner {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn source_runner(config: &Path, log: &Path, secret: &str) -> Runner {
    let log = std::fs::File::create(log).expect("log file");
    Runner(
        Command::new(runner_binary("source-runner"))
            .arg("--config")
            .arg(config)
            .env("RUST_LOG", "debug,rdkafka=info,hyper=info,reqwest=info,h2=info")
            .env("OPS_TEST_PASSWORD", secret)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn source-runner"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_metrics_pause_resume_delete_and_no_secret_anywhere() {
    let name = unique("ops");
    let (pg, conn) = tokio_postgres::connect(&pg_source_url(), tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    // The runner logs in with a role whose password is distinctive, given
    // only through the environment, so any leak is findable.
    let secret = format!("S3cret-{}", uuid::Uuid::new_v4().simple());
    pg.batch_execute(&format!(
        "CREATE ROLE {name} LOGIN REPLICATION SUPERUSER PASSWORD '{secret}';
         CREATE SCHEMA {name};
         CREATE TABLE {name}.items (id int PRIMARY KEY, note text);
         ALTER TABLE {name}.items REPLICA IDENTITY FULL;
         INSERT INTO {name}.items SELECT i, 'n' || i FROM generate_series(1, 100) i;"
    ))
    .await
    .expect("setup");

    let port = tributary_tests::free_port();
    let dir = std::env::temp_dir().join(&name);
    std::fs::create_dir_all(&dir).expect("dir");
    let config = dir.join("source.toml");
    let log = dir.join("source.log");
    let url = pg_source_url();
    let host_part = url.split('@').nth(1).expect("url has a host part");
    std::fs::write(
        &config,
        format!(
            r#"name = "{name}"
schema_registry_url = "{registry}"

[kafka]
bootstrap_servers = "{kafka}"

[admin]
listen = "127.0.0.1:{port}"

[postgres]
url = "postgres://{name}@{host_part}"
password = "env:OPS_TEST_PASSWORD"
slot_name = "{name}"
publication_name = "{name}"
include = ["{name}.*"]
heartbeat_interval_ms = 500
"#,
            registry = schema_registry_url(),
            kafka = kafka_bootstrap(),
        ),
    )
    .expect("config");
    let mut runner = source_runner(&config, &log, &secret);
    let table = format!("{name}.items");
    let base = format!("http://127.0.0.1:{port}");

    // Status and metrics move as the snapshot lands.
    let status: serde_json::Value = wait_for("the snapshot in /status", Duration::from_secs(120), || async {
        let s: serde_json::Value = serde_json::from_str(&get(&format!("{base}/status")).await?).ok()?;
        (s["tables"][&table]["events"].as_u64()? >= 100).then_some(s)
    })
    .await;
    assert_eq!(status["kind"], "source");
    assert!(get(&format!("{base}/health")).await.is_some());
    assert!(get(&format!("{base}/ready")).await.is_some());
    let metrics = get(&format!("{base}/metrics")).await.expect("metrics");
    assert!(metric(&metrics, "tributary_events_total", &table).unwrap_or(0.0) >= 100.0, "{metrics}");
    assert!(metric(&metrics, "tributary_bytes_total", &table).unwrap_or(0.0) > 0.0, "{metrics}");
    assert!(metric(&metrics, "tributary_lag_seconds", &table).is_some(), "{metrics}");
    // The WAL the slot keeps, sampled at the loop's first trip.
    assert!(status["source_retained_bytes"].as_u64().is_some(), "{status}");
    assert!(metrics.contains("\ntributary_source_retained_bytes "), "{metrics}");

    // Pause: nothing flows; resume: everything made meanwhile arrives.
    let client = reqwest::Client::new();
    let pause = || async {
        let answer = client.post(format!("{base}/pause")).send().await.expect("pause");
        assert!(answer.status().is_success(), "pause: {}", answer.status());
    };
    pause().await;
    wait_for("paused in /status", Duration::from_secs(30), || async {
        let s: serde_json::Value = serde_json::from_str(&get(&format!("{base}/status")).await?).ok()?;
        s["paused"].as_str().map(|_| ())
    })
    .await;
    let events_at_pause = || async {
        let s: serde_json::Value =
            serde_json::from_str(&get(&format!("{base}/status")).await.expect("status")).expect("json");
        s["tables"][&table]["events"].as_u64().unwrap_or(0)
    };
    // The count must hold for 3 s while 10 rows change.
    let holds_while_rows_change = |mark: &'static str, what: &'static str| {
        let (pg, name) = (&pg, &name);
        async move {
            let before = events_at_pause().await;
            pg.batch_execute(&format!("UPDATE {name}.items SET note = note || '{mark}' WHERE id <= 10"))
                .await
                .expect("update");
            let until = std::time::Instant::now() + Duration::from_secs(3);
            while std::time::Instant::now() < until {
                assert_eq!(events_at_pause().await, before, "{what}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            before
        }
    };
    // The batch in flight when the pause arrived may still commit; after
    // that, the count must hold while changes are made.
    holds_while_rows_change("!", "a paused source moved events").await;
    // Issue #30: the pause is stored; a kill -9 and a new process keep it.
    drop(runner);
    let log_after_kill = dir.join("source-after-kill.log");
    runner = source_runner(&config, &log_after_kill, &secret);
    wait_for("paused again after kill -9, from the stored pause", Duration::from_secs(60), || async {
        let s: serde_json::Value = serde_json::from_str(&get(&format!("{base}/status")).await?).ok()?;
        s["paused"].as_str().filter(|r| r.contains("operator")).map(|_| ())
    })
    .await;
    let before = holds_while_rows_change("?", "a source paused before its restart moved events").await;
    assert!(client
        .post(format!("{base}/resume"))
        .send()
        .await
        .expect("resume")
        .status()
        .is_success());
    wait_for("the held changes after resume", Duration::from_secs(60), || async {
        (events_at_pause().await >= before + 10).then_some(())
    })
    .await;

    // Copy the table again from the console's button (`POST /resync`): the
    // runner is fenced by the recorded reset, starts again, and copies the
    // table's 100 rows once more. A source refuses a one-table pause.
    let refused = client
        .post(format!("{base}/pause?table={table}"))
        .send()
        .await
        .expect("table pause");
    assert_eq!(refused.status().as_u16(), 400, "a source cannot pause one table");
    let copied = events_at_pause().await;
    let resync = client
        .post(format!("{base}/resync?table={table}"))
        .send()
        .await
        .expect("resync");
    assert!(resync.status().is_success(), "{:?}", resync.text().await);
    wait_for("the table copied again", Duration::from_secs(120), || async {
        (events_at_pause().await >= copied + 100).then_some(())
    })
    .await;

    // The secret is nowhere the runner writes.
    let status_text = get(&format!("{base}/status")).await.expect("status");
    let metrics = get(&format!("{base}/metrics")).await.expect("metrics");
    let log_text = std::fs::read_to_string(&log).expect("log")
        + &std::fs::read_to_string(&log_after_kill).expect("log after the kill");
    for (what, text) in [("status", &status_text), ("metrics", &metrics), ("log", &log_text)] {
        assert!(!text.contains(&secret), "the password appears in {what}");
    }
    assert!(log_text.contains("admin server listening"), "the log is the runner's:\n{log_text}");

    // Delete leaves nothing behind, a stored pause included: a copy made
    // again under this name must not start paused.
    pause().await;
    drop(runner);
    let out = Command::new(runner_binary("source-runner"))
        .arg("--config")
        .arg(&config)
        .args(["delete", "--yes"])
        .env("OPS_TEST_PASSWORD", &secret)
        .output()
        .expect("delete");
    assert!(out.status.success(), "delete failed: {}", String::from_utf8_lossy(&out.stderr));
    let slots = pg
        .query_one("SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", &[&name])
        .await
        .expect("slots")
        .get::<_, i64>(0);
    assert_eq!(slots, 0, "the slot is gone");
    let pubs = pg
        .query_one("SELECT count(*) FROM pg_publication WHERE pubname = $1", &[&name])
        .await
        .expect("publications")
        .get::<_, i64>(0);
    assert_eq!(pubs, 0, "the publication is gone");
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", kafka_bootstrap())
        .create()
        .expect("metadata client");
    let prefix = format!("{name}.");
    wait_for("the topics gone", Duration::from_secs(30), || async {
        let meta = consumer.fetch_metadata(None, Duration::from_secs(10)).ok()?;
        (!meta.topics().iter().any(|t| t.name().starts_with(&prefix))).then_some(())
    })
    .await;
    let subjects: Vec<String> = reqwest::get(format!("{}/subjects", schema_registry_url()))
        .await
        .expect("subjects")
        .json()
        .await
        .expect("subjects json");
    assert!(!subjects.iter().any(|s| s.starts_with(&prefix)), "subjects left behind: {subjects:?}");
    let mut kafka = ClientConfig::new();
    kafka.set("bootstrap.servers", kafka_bootstrap());
    let stored = tributary_operations::pauses::PauseStore::of_source(kafka, &name)
        .load()
        .await
        .expect("the stored pauses");
    assert_eq!(stored, tributary_operations::admin::PauseSet::default(), "the deleted copy's pause is still stored");

    // On a fresh database this runner installed the shared DDL trigger, so
    // its role owns it: hand that to the stack's role before dropping ours.
    pg.batch_execute(&format!(
        "DROP SCHEMA {name} CASCADE; REASSIGN OWNED BY {name} TO CURRENT_USER; \
         DROP OWNED BY {name}; DROP ROLE {name}"
    ))
    .await
    .expect("cleanup");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Serves `router` on a loopback listener and returns its base URL.
async fn serve(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}")
}

#[tokio::test]
async fn mutating_requests_need_the_token() {
    let client = reqwest::Client::new();
    // A token is configured: without it or with a wrong one, refused.
    let control = Control::new();
    let base = serve(router(
        Telemetry::new("t", "sink"),
        control.clone(),
        Some(SecretString::from("right-token".to_string())),
        true,
    ))
    .await;
    let status = |r: reqwest::Response| r.status().as_u16();
    assert_eq!(status(client.post(format!("{base}/pause")).send().await.expect("send")), 401);
    assert_eq!(
        status(
            client
                .post(format!("{base}/pause"))
                .bearer_auth("wrong")
                .send()
                .await
                .expect("send")
        ),
        401
    );
    assert!(!control.paused().all, "a refused request changed nothing");
    assert_eq!(
        status(
            client
                .post(format!("{base}/pause"))
                .bearer_auth("right-token")
                .send()
                .await
                .expect("send")
        ),
        200
    );
    assert!(control.paused().all);
    // Reads never need it.
    assert_eq!(status(client.get(format!("{base}/status")).send().await.expect("send")), 200);

    // Beyond loopback without a configured token: always refused.
    let control = Control::new();
    let base = serve(router(Telemetry::new("t", "sink"), control.clone(), None, false)).await;
    assert_eq!(status(client.post(format!("{base}/resume")).send().await.expect("send")), 403);
    assert_eq!(status(client.post(format!("{base}/pause?table=a.b")).send().await.expect("send")), 403);
    assert_eq!(control.paused(), Default::default());

    // On loopback without a token: allowed, per table.
    let control = Control::new();
    let base = serve(router(Telemetry::new("t", "sink"), control.clone(), None, true)).await;
    assert_eq!(status(client.post(format!("{base}/pause?table=a.b")).send().await.expect("send")), 200);
    assert!(control.paused().is_paused("a.b") && !control.paused().is_paused("a.c"));
}

#[tokio::test]
async fn web_pages_cannot_pause_or_resume_a_runner() {
    let client = reqwest::Client::new();
    let status = |r: reqwest::Response| r.status().as_u16();
    // Loopback without a token: what any local web page could reach.
    let control = Control::new();
    let base = serve(router(Telemetry::new("t", "source"), control.clone(), None, true)).await;
    let authority = base.strip_prefix("http://").expect("http").to_string();
    let post = |path: &str, headers: &[(&str, &str)]| {
        let mut req = client.post(format!("{base}{path}"));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        req.send()
    };
    for headers in [
        // A page of another site.
        vec![("Origin", "http://evil.example")],
        vec![("Origin", "null")],
        vec![("Origin", "http://127.0.0.1:1")],
        vec![("Sec-Fetch-Site", "cross-site")],
        // DNS rebinding: a name resolving to 127.0.0.1, same-origin to the page.
        vec![("Host", "evil.example"), ("Origin", "http://evil.example")],
        vec![("Host", "evil.example")],
    ] {
        for path in ["/pause", "/resume", "/pause?table=a.b"] {
            let r = post(path, &headers).await.expect("send");
            assert_eq!(r.status().as_u16(), 403, "{path} with {headers:?}");
        }
    }
    assert_eq!(control.paused(), Default::default(), "a refused request changed nothing");
    // Reads stay open (a browser's same-origin policy keeps them from pages).
    let r = client
        .get(format!("{base}/status"))
        .header("Origin", "http://evil.example")
        .send()
        .await
        .expect("send");
    assert_eq!(status(r), 200);
    // The runner's own commands and curl send no Origin; a page served by
    // the admin server itself would send its own.
    assert_eq!(status(post("/pause", &[]).await.expect("send")), 200);
    assert!(control.paused().all);
    let own = format!("http://{authority}");
    assert_eq!(status(post("/resume", &[("Origin", own.as_str())]).await.expect("send")), 200);
    assert!(!control.paused().all);
    let localhost = format!("localhost:{}", authority.rsplit_once(':').expect("port").1);
    assert_eq!(status(post("/pause", &[("Host", localhost.as_str())]).await.expect("send")), 200);

    // A token configured: a foreign page is refused even with the token,
    // and every state-changing request needs it.
    let control = Control::new();
    let base = serve(router(
        Telemetry::new("t", "source"),
        control.clone(),
        Some(SecretString::from("right-token".to_string())),
        false,
    ))
    .await;
    let r = client
        .post(format!("{base}/pause"))
        .bearer_auth("right-token")
        .header("Origin", "http://evil.example")
        .send()
        .await
        .expect("send");
    assert_eq!(status(r), 403);
    for path in ["/pause", "/resume", "/pause?table=a.b", "/resume?table=a.b"] {
        assert_eq!(status(client.post(format!("{base}{path}")).send().await.expect("send")), 401, "{path}");
    }
    assert_eq!(control.paused(), Default::default());
    let r = client
        .post(format!("{base}/pause"))
        .bearer_auth("right-token")
        .send()
        .await
        .expect("send");
    assert_eq!(status(r), 200);
    assert!(control.paused().all);
}

/// A registry that wants credentials: the stack's Apicurio behind a proxy
/// that refuses any request without the expected `Authorization` header
/// (as Confluent Cloud does with its API key, or a secured Apicurio with
/// basic auth or a bearer token) and forwards the others unchanged.
async fn guarded_registry(accepted: Vec<String>) -> String {
    use axum::http::{HeaderMap, Method, StatusCode, Uri};
    let upstream = schema_registry_url();
    let origin = upstream[..upstream.find("/apis").expect("a ccompat URL")].to_string();
    let client = reqwest::Client::new();
    let app =
        axum::Router::new().fallback(move |method: Method, uri: Uri, headers: HeaderMap, body: axum::body::Bytes| {
            let (client, origin, accepted) = (client.clone(), origin.clone(), accepted.clone());
            async move {
                let given = headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("");
                if !accepted.iter().any(|a| a == given) {
                    let body = r#"{"error_code":40101,"message":"Unauthorized"}"#.to_string();
                    return (StatusCode::UNAUTHORIZED, body);
                }
                let mut forward = client.request(method, format!("{origin}{uri}")).body(body);
                for name in ["content-type", "accept"] {
                    if let Some(v) = headers.get(name) {
                        forward = forward.header(name, v.clone());
                    }
                }
                match forward.send().await {
                    Ok(resp) => {
                        let status = StatusCode::from_u16(resp.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
                        (status, resp.text().await.unwrap_or_default())
                    }
                    Err(e) => (StatusCode::BAD_GATEWAY, e.to_string()),
                }
            }
        });
    format!("{}{}", serve(app).await, &upstream[upstream.find("/apis").expect("a ccompat URL")..])
}

/// `[schema_registry]` credentials reach the registry on every call
/// (registration through schema_registry_converter, the compatibility and
/// look-up calls through our own client); without them, or with wrong ones,
/// the refusal is an operator's error, never a retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_that_wants_credentials_gets_them_from_the_config() {
    use tributary_operations::registry::SchemaRegistryConfig;
    let basic = format!("Basic {}", {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode("api-key:api-secret")
    });
    let url = guarded_registry(vec![basic, "Bearer the-token".to_string()]).await;
    std::env::set_var("TRIBUTARY_TEST_REGISTRY_SECRET", "api-secret");
    let section = |text: &str| -> SchemaRegistryConfig {
        let c: SchemaRegistryConfig = toml::from_str(text).expect("section");
        c.validate().expect("valid");
        c
    };
    let subject = format!("{}-value", unique("guarded"));
    let schema = r#"{"type":"record","name":"r","fields":[{"name":"a","type":"int"}]}"#;
    for (what, text) in [
        ("no credentials", ""),
        ("a wrong password", "username = \"api-key\"\npassword = \"wrong\""),
        ("a wrong token", "token = \"not-the-token\""),
    ] {
        let registry = section(text).registry(&url).expect("client");
        let e = registry.register(&subject, schema).await.expect_err(what);
        let e = tributary_connectors::Error::from(e);
        assert_eq!(e.kind(), tributary_connectors::ErrorKind::NeedsOperator, "{what}: {e}");
        let e = registry.lookup(&subject, schema).await.expect_err(what);
        assert!(e.to_string().contains("401"), "{what}: {e}");
    }
    for (what, text) in [
        (
            "basic, the password from the environment",
            "username = \"api-key\"\npassword = \"env:TRIBUTARY_TEST_REGISTRY_SECRET\"",
        ),
        ("a bearer token", "token = \"the-token\""),
    ] {
        let registry = section(text).registry(&url).expect("client");
        let id = registry
            .register(&subject, schema)
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(registry.lookup(&subject, schema).await.expect(what), Some(id), "{what}");
        assert!(registry.check_compatible(&subject, schema).await.expect(what), "{what}");
        assert_eq!(registry.latest(&subject).await.expect(what).map(|(i, _)| i), Some(id), "{what}");
    }
    let registry = section("token = \"the-token\"").registry(&url).expect("client");
    registry.delete_subject(&subject).await.expect("cleanup");
}

/// A TLS front for the plain HTTP server at `upstream` (`http://addr`),
/// with the stack's PostgreSQL certificate (CN=localhost, signed by the
/// stack's own CA, whose file is `PG_TLS_CA`): a registry behind a private
/// CA. Its `https://localhost:port` origin.
async fn tls_front(upstream: &str) -> String {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let ca = std::path::PathBuf::from(tributary_tests::env_or("PG_TLS_CA", ".stack/postgres-ca.crt"));
    let tls_dir = ca.parent().expect("the stack directory").join("postgres/tls");
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(tls_dir.join("server.crt"))
        .expect("the stack's certificate")
        .collect::<Result<_, _>>()
        .expect("certificate");
    let key = PrivateKeyDer::from_pem_file(tls_dir.join("server.key")).expect("the stack's key");
    let config =
        rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("protocols")
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .expect("server config");
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("address").port();
    let upstream = upstream.trim_start_matches("http://").to_string();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let (acceptor, upstream) = (acceptor.clone(), upstream.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(client).await else {
                    return;
                };
                if let Ok(mut plain) = tokio::net::TcpStream::connect(&upstream).await {
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                }
            });
        }
    });
    format!("https://localhost:{port}")
}

/// A registry served over TLS with a certificate of a private CA is
/// reached with `[schema_registry] ca_file` naming that CA; without it the
/// handshake is refused (issue #24).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_behind_a_private_ca_is_reached_with_its_ca_file() {
    use tributary_operations::registry::SchemaRegistryConfig;
    let guarded = guarded_registry(vec!["Bearer the-token".to_string()]).await;
    let path = &guarded[guarded.find("/apis").expect("a ccompat URL")..];
    let url = format!("{}{path}", tls_front(&guarded[..guarded.find("/apis").expect("a ccompat URL")]).await);
    let ca = tributary_tests::env_or("PG_TLS_CA", ".stack/postgres-ca.crt");
    let subject = format!("{}-value", unique("tlsreg"));
    let schema = r#"{"type":"record","name":"r","fields":[{"name":"a","type":"int"}]}"#;
    let section = |text: &str| -> SchemaRegistryConfig {
        let c: SchemaRegistryConfig = toml::from_str(text).expect("section");
        c.validate().expect("valid");
        c
    };
    let untrusted = section("token = \"the-token\"").registry(&url).expect("client");
    let refused = tributary_connectors::Error::from(
        untrusted
            .register(&subject, schema)
            .await
            .expect_err("an unknown CA is refused"),
    );
    // An operator's error that says what to set, not a retry for ever.
    assert_eq!(refused.kind(), tributary_connectors::ErrorKind::NeedsOperator, "{refused}");
    assert!(refused.to_string().contains("ca_file"), "{refused}");
    let registry = section(&format!("token = \"the-token\"\nca_file = \"{ca}\""))
        .registry(&url)
        .expect("client");
    let id = registry.register(&subject, schema).await.expect("register over TLS");
    assert_eq!(registry.lookup(&subject, schema).await.expect("lookup"), Some(id));
    assert!(registry.check_compatible(&subject, schema).await.expect("compatibility"));
    registry.delete_subject(&subject).await.expect("cleanup");
}

/// `id|v` of every row of `table`, by id (none while it cannot be read).
async fn rows(client: &tokio_postgres::Client, table: String) -> Vec<String> {
    client
        .query(&format!("SELECT id::text || '|' || v::text FROM {table} ORDER BY id"), &[])
        .await
        .map(|r| r.iter().map(|r| r.get::<_, String>(0)).collect())
        .unwrap_or_default()
}

/// Issue #30: one table copied again (`POST /resync`, the console's button)
/// under a writing workload, without a restart: the other table's changes
/// keep reaching the destination within 5 s throughout (measured end to
/// end, from each insert at the source to its row in the destination, and
/// by both runners' lag), and at the end both tables equal the source and a
/// row written into the destination by hand, which the new copy does not
/// see, is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_table_copied_again_under_load_while_the_others_stream() {
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};
    use std::time::Instant;
    use tributary_tests::postgres::{connect, Destination};

    const ROWS: i64 = 100_000;
    let name = unique("resync");
    let pg = connect(&pg_source_url()).await;
    pg.batch_execute(&format!(
        "CREATE SCHEMA {name};
         CREATE TABLE {name}.a (id bigint PRIMARY KEY, v bigint NOT NULL);
         CREATE TABLE {name}.b (id bigint PRIMARY KEY, v bigint NOT NULL);
         INSERT INTO {name}.a SELECT i, i FROM generate_series(1, {ROWS}) i;
         INSERT INTO {name}.b SELECT i, i FROM generate_series(1, 10) i;"
    ))
    .await
    .expect("source tables");
    let dest = Destination::new(&name).await;
    let dir = std::env::temp_dir().join(&name);
    std::fs::create_dir_all(&dir).expect("dir");
    let (source_port, sink_port) = (tributary_tests::free_port(), tributary_tests::free_port());
    let listen = |port: u16| format!("listen = \"127.0.0.1:{port}\"");
    let source_config = dir.join("source.toml");
    std::fs::write(
        &source_config,
        tributary_tests::pg_source_runner_config(&name).replace("listen = \"off\"", &listen(source_port)),
    )
    .expect("source config");
    let sink_config = dir.join("sink.toml");
    let section =
        format!("[postgres]\nurl = \"{}\"\nschema = \"{}\"\n", tributary_tests::pg_destination_url(), dest.schema);
    std::fs::write(
        &sink_config,
        tributary_tests::sink_runner_config(&name, &dest.group, &section)
            .replace("listen = \"off\"", &listen(sink_port)),
    )
    .expect("sink config");
    let source_log = dir.join("source.log");
    let source = tributary_tests::Runner::start("source-runner", &source_config, &source_log);
    let sink = tributary_tests::Runner::start("sink-runner", &sink_config, &dir.join("sink.log"));

    let (src_a, src_b) = (format!("{name}.a"), format!("{name}.b"));
    let (dst_a, dst_b) = (format!("\"{}\".a", dest.schema), format!("\"{}\".b", dest.schema));
    let converged = |what: &'static str| {
        let (pg, dest, src_a, src_b, dst_a, dst_b) = (&pg, &dest, &src_a, &src_b, &dst_a, &dst_b);
        async move {
            wait_for(what, Duration::from_secs(180), || async {
                let a = rows(pg, src_a.clone()).await == rows(&dest.admin, dst_a.clone()).await;
                (a && rows(pg, src_b.clone()).await == rows(&dest.admin, dst_b.clone()).await).then_some(())
            })
            .await
        }
    };
    converged("the first copy").await;
    // A row the source never had: the new copy must remove it.
    dest.exec(&format!("INSERT INTO {dst_a} (id, v, __tributary_commit, __tributary_index) VALUES (-1, -1, 1, 0)"))
        .await;

    // The workload: b gets a row every 50 ms (its insert time kept), a is
    // updated and deleted from.
    let inserted: Arc<Mutex<BTreeMap<i64, Instant>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Held while the copy is compared with the source.
    let held = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (inserted, stop, held, name) = (inserted.clone(), stop.clone(), held.clone(), name.clone());
        tokio::spawn(async move {
            let pg = connect(&pg_source_url()).await;
            let mut i = 11i64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if held.load(std::sync::atomic::Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                pg.batch_execute(&format!(
                    "INSERT INTO {name}.b VALUES ({i}, {i});
                     UPDATE {name}.a SET v = v + 1 WHERE id = {};
                     DELETE FROM {name}.a WHERE id = {};",
                    (i * 7919) % ROWS + 1,
                    (i * 104_729) % ROWS + 1
                ))
                .await
                .expect("workload");
                inserted.lock().unwrap_or_else(|p| p.into_inner()).insert(i, Instant::now());
                i += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let status = tributary_tests::runner_status;
    let events_a = || async {
        status(source_port)
            .await
            .and_then(|s| s["tables"][&src_a]["events"].as_u64())
            .unwrap_or(0)
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = events_a().await;
    let resync = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{source_port}/resync?table={src_a}"))
        .send()
        .await
        .expect("resync");
    assert!(resync.status().is_success(), "{:?}", resync.text().await);

    // While a is copied: b's staleness end to end, and both runners' lag.
    let watch_b = |what: &'static str, copied: Box<dyn Fn(&serde_json::Value) -> bool + Send>| {
        let (dest, dst_b, src_b, inserted) = (&dest, &dst_b, &src_b, &inserted);
        async move {
            let (mut worst_stale, mut worst_lag, mut lags_read) = (Duration::ZERO, 0f64, 0u32);
            let until = Instant::now() + Duration::from_secs(180);
            loop {
                let newest: i64 = dest
                    .admin
                    .query_one(&format!("SELECT coalesce(max(id), 0) FROM {dst_b}"), &[])
                    .await
                    .map(|r| r.get(0))
                    .unwrap_or(0);
                let waiting = inserted
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .range(newest + 1..)
                    .next()
                    .map(|(_, t)| *t);
                worst_stale = worst_stale.max(waiting.map_or(Duration::ZERO, |t| t.elapsed()));
                for port in [source_port, sink_port] {
                    if let Some(lag) = status(port).await.and_then(|s| s["tables"][src_b]["lag_seconds"].as_f64()) {
                        worst_lag = worst_lag.max(lag);
                        lags_read += 1;
                    }
                }
                if status(source_port).await.is_some_and(|s| copied(&s)) {
                    break;
                }
                assert!(Instant::now() < until, "{what} did not end");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            eprintln!("while {what}: b at most {worst_stale:?} behind end to end, lag at most {worst_lag:.1} s");
            assert!(worst_stale < Duration::from_secs(5), "b fell {worst_stale:?} behind while {what}");
            assert!(lags_read > 0, "no lag of b in either runner's /status");
            assert!(worst_lag < 5.0, "b's lag reached {worst_lag} s while {what}");
        }
    };
    let a_events = src_a.clone();
    watch_b(
        "a was copied again",
        Box::new(move |s| s["tables"][&a_events]["events"].as_u64().unwrap_or(0) >= before + ROWS as u64 - 100),
    )
    .await;
    held.store(true, std::sync::atomic::Ordering::Relaxed);
    converged("both tables equal to the source after the copy").await;
    held.store(false, std::sync::atomic::Ordering::Relaxed);
    let gone = dest.texts(&format!("SELECT id::text FROM {dst_a} WHERE id = -1")).await;
    assert!(gone.is_empty(), "the hand-written row outlived the copy");

    // A new table of 100,000 rows: its snapshot, too, lets b stream.
    pg.batch_execute(&format!(
        "CREATE TABLE {name}.c (id bigint PRIMARY KEY, v bigint NOT NULL);
         INSERT INTO {name}.c SELECT i, i FROM generate_series(1, {ROWS}) i;"
    ))
    .await
    .expect("new table");
    let src_c = format!("{name}.c");
    watch_b(
        "the new table c was copied",
        Box::new(move |s| s["tables"][&src_c]["events"].as_u64().unwrap_or(0) >= ROWS as u64),
    )
    .await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.await.expect("writer");
    converged("both tables equal to the source after the copy").await;
    let dst_c = format!("\"{}\".c", dest.schema);
    let want_c = rows(&pg, format!("{name}.c")).await;
    wait_for("the new table c in the destination", Duration::from_secs(120), || async {
        (rows(&dest.admin, dst_c.clone()).await == want_c).then_some(())
    })
    .await;
    let log = std::fs::read_to_string(&source_log).unwrap_or_default();
    assert!(!log.contains("retrying from the last checkpoint"), "the source runner restarted:\n{log}");
    drop((sink, source));
    tributary_tests::e2e::delete_source_copy(&pg, &source_config, &name).await;
    dest.cleanup().await;
    let _ = std::fs::remove_dir_all(&dir);
}
