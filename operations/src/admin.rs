//! The admin server of a runner: health, readiness, status, metrics, and
//! pause/resume for the whole runner or one table.
//!
//! It listens on loopback by default. When it listens anywhere else, the
//! mutating endpoints require `Authorization: Bearer <token>` and refuse
//! without a configured token, so a runner can never be paused by anyone who
//! can reach its port. With a token configured, every mutating request
//! needs it, also on loopback. A mutating request from a web page (an
//! `Origin` other than the server itself, a cross-site `Sec-Fetch-Site`, or
//! on loopback a `Host` that is no loopback name) is refused whatever it
//! presents: any page in a local browser can reach a loopback port.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use tokio::sync::watch;

use crate::config::{resolve_secret, ConfigError};
use crate::telemetry::Telemetry;

/// Default admin address: loopback only, so nothing is exposed by accident.
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:8090";

/// The `[admin]` section of a runner config. `Debug` never shows the token.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// Address to listen on; `off` disables the server.
    #[serde(default = "default_listen")]
    pub listen: String,
    /// Bearer token for pause/resume/delete: inline, `env:NAME` or
    /// `file:/path`. Required when `listen` is not a loopback address.
    #[serde(default)]
    pub token: Option<String>,
    /// Other runners' admin URLs (`http://host:port`) whose status the
    /// console page shows beside this runner's, read-only (fetched by this
    /// server, so the page needs no cross-site access).
    #[serde(default)]
    pub peers: Vec<String>,
}

impl std::fmt::Debug for AdminConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminConfig")
            .field("listen", &self.listen)
            .field("token", &self.token.as_ref().map(|_| crate::config::Redacted))
            .field("peers", &self.peers)
            .finish()
    }
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            listen: default_listen(),
            token: None,
            peers: Vec::new(),
        }
    }
}

fn default_listen() -> String {
    DEFAULT_ADMIN_LISTEN.to_string()
}

impl AdminConfig {
    /// The address, or `None` when the server is off.
    pub fn address(&self) -> Result<Option<SocketAddr>, ConfigError> {
        if self.listen == "off" {
            return Ok(None);
        }
        self.listen
            .parse()
            .map(Some)
            .map_err(|_| ConfigError::invalid("admin.listen", "must be host:port (an IP address) or \"off\""))
    }

    /// Checks the fields.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.address()?;
        for (i, p) in self.peers.iter().enumerate() {
            let ok = reqwest::Url::parse(p).is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some());
            if !ok {
                return Err(ConfigError::invalid(
                    format!("admin.peers[{i}]"),
                    "must be a runner's admin URL, e.g. http://127.0.0.1:8091",
                ));
            }
        }
        Ok(())
    }

    /// The token, resolved.
    pub fn token(&self) -> Result<Option<SecretString>, ConfigError> {
        self.token.as_deref().map(|t| resolve_secret("admin.token", t)).transpose()
    }
}

/// Which parts of a runner an operator paused. Stored as JSON by
/// `crate::pauses`: `{"all": false, "tables": ["s.t"]}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, Deserialize)]
pub struct PauseSet {
    /// The whole runner.
    pub all: bool,
    /// Single tables, `schema.table`.
    pub tables: BTreeSet<String>,
}

impl PauseSet {
    /// Whether `table` is paused (directly or through the whole runner).
    pub fn is_paused(&self, table: &str) -> bool {
        self.all || self.tables.contains(table)
    }
}

/// Pause and resume, shared between the admin server and the runner loop.
#[derive(Clone)]
pub struct Control {
    tx: Arc<watch::Sender<PauseSet>>,
    ready: Arc<AtomicBool>,
    /// The last pause set written to the pause store, once one is attached
    /// (`crate::pauses`): the admin API answers a change once it is stored.
    stored: Arc<watch::Sender<Option<PauseSet>>>,
    /// Requests to copy a table again (`POST /resync`), for a runner that
    /// serves them (sources) to take between batches.
    resyncs: Arc<ResyncQueue>,
    /// Requests to verify tables (`POST /verify`), the same way; the
    /// request's table is empty for every table.
    verifies: Arc<ResyncQueue>,
    /// Notified at each request: the runner's source ends a batch it waits
    /// on (`Source::set_wake`), so a request waits for no heartbeat.
    wake: Arc<tokio::sync::Notify>,
    /// A migration's cutover asked from the console (`POST /cutover`).
    cutover: Arc<CutoverSlot>,
}

/// A migration's cutover asked through the admin server (`POST /cutover`),
/// for a runner that serves it (a sink runner told its source runner's
/// config, docs/migration.md), and its progress (`GET /cutover`).
struct CutoverSlot {
    /// Where requests go (`true`: a dry run), once a runner serves them.
    tx: std::sync::Mutex<Option<tokio::sync::mpsc::UnboundedSender<bool>>>,
    /// The last one's progress and report, as `GET /cutover` answers it.
    state: std::sync::Mutex<serde_json::Value>,
}

/// A request to copy one table (`schema.table`) again; the runner answers
/// with what it did, or why not.
pub struct ResyncRequest {
    /// `schema.table`.
    pub table: String,
    /// A verification's method (`POST /verify?method=`), when asked: the
    /// config's otherwise.
    pub method: Option<String>,
    /// Where the answer goes; closed when the asker gave up waiting.
    pub reply: tokio::sync::oneshot::Sender<Result<String, String>>,
}

struct ResyncQueue {
    served: AtomicBool,
    tx: tokio::sync::mpsc::UnboundedSender<ResyncRequest>,
    rx: std::sync::Mutex<tokio::sync::mpsc::UnboundedReceiver<ResyncRequest>>,
}

impl ResyncQueue {
    fn new() -> Self {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        Self {
            served: AtomicBool::new(false),
            tx,
            rx: std::sync::Mutex::new(rx),
        }
    }

    /// The next request whose asker still waits.
    fn next(&self) -> Option<ResyncRequest> {
        let mut rx = self.rx.lock().unwrap_or_else(|p| p.into_inner());
        while let Ok(r) = rx.try_recv() {
            if !r.reply.is_closed() {
                return Some(r);
            }
        }
        None
    }
}

impl Default for Control {
    fn default() -> Self {
        Self::new()
    }
}

impl Control {
    /// Nothing paused, not ready.
    pub fn new() -> Self {
        Self {
            tx: Arc::new(watch::channel(PauseSet::default()).0),
            ready: Arc::new(AtomicBool::new(false)),
            stored: Arc::new(watch::channel(None).0),
            resyncs: Arc::new(ResyncQueue::new()),
            verifies: Arc::new(ResyncQueue::new()),
            wake: Arc::new(tokio::sync::Notify::new()),
            cutover: Arc::new(CutoverSlot {
                tx: std::sync::Mutex::new(None),
                state: std::sync::Mutex::new(serde_json::json!({"state": "none"})),
            }),
        }
    }

    /// Says that this runner cuts over when asked (`POST /cutover`): the
    /// requests (`true`: a dry run) arrive on the returned receiver, one
    /// at a time (none while one runs).
    pub fn serve_cutover(&self) -> tokio::sync::mpsc::UnboundedReceiver<bool> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        *self.cutover.tx.lock().unwrap_or_else(|p| p.into_inner()) = Some(tx);
        rx
    }

    /// Sets what `GET /cutover` answers: `state` (`running`, `done`,
    /// `failed`), the steps so far, the report, the error.
    pub fn set_cutover_state(&self, state: serde_json::Value) {
        *self.cutover.state.lock().unwrap_or_else(|p| p.into_inner()) = state;
    }

    /// The next verification asked (`POST /verify`) and still waited for;
    /// its table is empty for every table. Served with the resyncs.
    pub fn next_verify(&self) -> Option<ResyncRequest> {
        self.verifies.next()
    }

    /// What the admin server notifies when a request comes in (for the
    /// runner to hand to its source).
    pub fn wake(&self) -> Arc<tokio::sync::Notify> {
        self.wake.clone()
    }

    /// Says that this runner takes resync requests ([`Control::next_resync`]).
    pub fn serve_resyncs(&self) {
        self.resyncs.served.store(true, Ordering::Relaxed);
    }

    /// The next resync request still waited for, if any.
    pub fn next_resync(&self) -> Option<ResyncRequest> {
        self.resyncs.next()
    }

    /// Sets the pause set read back from the pause store at start.
    pub fn restore(&self, paused: PauseSet) {
        self.stored.send_replace(Some(paused.clone()));
        self.tx.send_replace(paused);
    }

    /// Records that the pause store holds `paused`.
    pub fn mark_stored(&self, paused: PauseSet) {
        self.stored.send_replace(Some(paused));
    }

    /// Waits until the pause store holds the current pause set (at once
    /// without a store). `false` if it did not within `timeout`.
    pub async fn wait_stored(&self, timeout: std::time::Duration) -> bool {
        let mut rx = self.stored.subscribe();
        let wanted = self.paused();
        let stored = tokio::time::timeout(timeout, rx.wait_for(|s| s.as_ref().is_none_or(|s| *s == wanted))).await;
        matches!(stored, Ok(Ok(_)))
    }

    /// Pauses the runner (`None`) or one table.
    pub fn pause(&self, table: Option<&str>) {
        self.tx.send_modify(|p| match table {
            None => p.all = true,
            Some(t) => {
                p.tables.insert(t.to_string());
            }
        });
    }

    /// Resumes the runner (`None`: everything) or one table.
    pub fn resume(&self, table: Option<&str>) {
        self.tx.send_modify(|p| match table {
            None => *p = PauseSet::default(),
            Some(t) => {
                p.tables.remove(t);
            }
        });
    }

    /// The current pause set.
    pub fn paused(&self) -> PauseSet {
        self.tx.borrow().clone()
    }

    /// A receiver that wakes on every change.
    pub fn subscribe(&self) -> watch::Receiver<PauseSet> {
        self.tx.subscribe()
    }

    /// Marks the runner ready (connected, past start-up) or not.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    /// What `GET /ready` answers (`true`: 200).
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }
}

#[derive(Clone)]
struct AppState {
    telemetry: Telemetry,
    control: Control,
    token: Option<Arc<SecretString>>,
    loopback: bool,
    peers: Arc<Vec<String>>,
}

#[derive(Debug, Deserialize)]
struct TableQuery {
    table: Option<String>,
    /// `POST /verify` only: `rows` or `summary`.
    method: Option<String>,
}

/// Why a mutating request is refused, if it is: one from a web page of
/// another site (or of a name that only resolves to loopback), then one
/// without the configured token, then, beyond loopback, any without one.
fn refuse(state: &AppState, headers: &HeaderMap) -> Option<Response> {
    if let Some(why) = foreign(state, headers) {
        tracing::warn!(reason = why, "refused a pause/resume request from a web page");
        return Some((StatusCode::FORBIDDEN, format!("refused: {why}\n")).into_response());
    }
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match (&state.token, presented) {
        (Some(token), Some(p)) if constant_time_eq(token.expose_secret().as_bytes(), p.as_bytes()) => None,
        (Some(_), _) => Some((StatusCode::UNAUTHORIZED, "a valid bearer token is required\n").into_response()),
        (None, _) if state.loopback => None,
        (None, _) => Some(
            (
                StatusCode::FORBIDDEN,
                "this admin server listens beyond loopback and has no token configured: set admin.token\n",
            )
                .into_response(),
        ),
    }
}

/// Why a state-changing request looks like a web page's, if it does.
///
/// Browsers send `Origin` with every cross-site POST (and `Sec-Fetch-Site`
/// with modern ones); the runners' own commands and `curl` send neither.
/// A page of another site is refused whatever it presents: any web page in
/// a browser on this machine can reach a loopback address. On loopback the
/// `Host` must also be a loopback name or address, or a page under a DNS
/// name that resolves to 127.0.0.1 (DNS rebinding) would pass as
/// same-origin.
fn foreign(state: &AppState, headers: &HeaderMap) -> Option<&'static str> {
    let text = |name: header::HeaderName| headers.get(name).map(|v| v.to_str().unwrap_or("\u{fffd}"));
    if let Some(site) = text(header::HeaderName::from_static("sec-fetch-site")) {
        if !matches!(site, "same-origin" | "none") {
            return Some("the request comes from another site's web page (Sec-Fetch-Site)");
        }
    }
    let host = text(header::HOST);
    if state.loopback && !host.is_some_and(is_loopback_host) {
        return Some("the Host header does not name a loopback address");
    }
    if let Some(origin) = text(header::ORIGIN) {
        let authority = origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"))
            .filter(|a| !a.contains('/'));
        let same = match (authority, host) {
            (Some(a), Some(h)) => a.eq_ignore_ascii_case(h),
            _ => false,
        };
        if !same {
            return Some("the request's Origin is not this admin server");
        }
    }
    None
}

/// Whether `host` (a `Host` header: name or address, and maybe a port)
/// names this machine's loopback.
fn is_loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split_once(']').map_or("", |(ip, _)| ip)
    } else {
        host.rsplit_once(':').map_or(host, |(name, port)| {
            if port.chars().all(|c| c.is_ascii_digit()) {
                name
            } else {
                host
            }
        })
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Compares without an early exit, so timing does not leak the token.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn health() -> &'static str {
    "ok\n"
}

async fn ready(State(s): State<AppState>) -> Response {
    if s.control.is_ready() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting\n").into_response()
    }
}

/// The runner's own account of its state: a pause shows once the runner
/// has actually stopped moving data (a source finishes the batch in flight
/// first), not when it was merely asked to.
async fn status(State(s): State<AppState>) -> Response {
    Json(s.telemetry.status()).into_response()
}

async fn metrics(State(s): State<AppState>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], s.telemetry.metrics_text()).into_response()
}

async fn pause(State(s): State<AppState>, headers: HeaderMap, Query(q): Query<TableQuery>) -> Response {
    if let Some(r) = refuse(&s, &headers) {
        return r;
    }
    if q.table.is_some() && s.telemetry.kind() == "source" {
        // A replication stream cannot skip one table without losing its
        // changes (docs/operations.md).
        return (
            StatusCode::BAD_REQUEST,
            "a source runner pauses as a whole: pause the table at its sink runner, or the whole source\n",
        )
            .into_response();
    }
    s.control.pause(q.table.as_deref());
    tracing::info!(table = q.table.as_deref().unwrap_or("*"), "paused by an operator");
    stored(&s.control, "paused").await
}

async fn resume(State(s): State<AppState>, headers: HeaderMap, Query(q): Query<TableQuery>) -> Response {
    if let Some(r) = refuse(&s, &headers) {
        return r;
    }
    s.control.resume(q.table.as_deref());
    tracing::info!(table = q.table.as_deref().unwrap_or("*"), "resumed by an operator");
    stored(&s.control, "resumed").await
}

/// The console: one page, no framework, reading `/status`, `/history` and
/// `/peers` and posting to `/pause`, `/resume` and `/resync` like the CLI.
async fn console() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            // Its own script and styles only; never framed by another page.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'self' 'unsafe-inline'; style-src 'unsafe-inline'; \
                 connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
            ),
        ],
        include_str!("console.html"),
    )
        .into_response()
}

async fn history(State(s): State<AppState>) -> Response {
    Json(s.telemetry.lag_history()).into_response()
}

/// How long the console waits for a peer's status.
const PEER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// The configured peers' `/status`, fetched here: `[{url, status}]` or
/// `[{url, error}]`.
async fn peer_status(State(s): State<AppState>) -> Response {
    let client = reqwest::Client::builder().timeout(PEER_TIMEOUT).build();
    let mut out = Vec::new();
    for url in s.peers.iter() {
        let got = match &client {
            Ok(c) => match c.get(format!("{}/status", url.trim_end_matches('/'))).send().await {
                Ok(r) if r.status().is_success() => r.json::<serde_json::Value>().await.map_err(|e| e.to_string()),
                Ok(r) => Err(format!("answered {}", r.status())),
                Err(e) => Err(e.to_string()),
            },
            Err(e) => Err(e.to_string()),
        };
        out.push(match got {
            Ok(status) => serde_json::json!({ "url": url, "status": status }),
            Err(error) => serde_json::json!({ "url": url, "error": error }),
        });
    }
    Json(out).into_response()
}

async fn resync(State(s): State<AppState>, headers: HeaderMap, Query(q): Query<TableQuery>) -> Response {
    if let Some(r) = refuse(&s, &headers) {
        return r;
    }
    let Some(table) = q.table else {
        return (StatusCode::BAD_REQUEST, "resync needs ?table=schema.table\n").into_response();
    };
    if !s.control.resyncs.served.load(Ordering::Relaxed) {
        return (
            StatusCode::NOT_FOUND,
            "this runner cannot copy a table again: ask its source runner (source-runner reset --table)\n",
        )
            .into_response();
    }
    tracing::info!(table = %table, "copy again asked by an operator");
    let (reply, answer) = tokio::sync::oneshot::channel();
    let _ = s.control.resyncs.tx.send(ResyncRequest { table, method: None, reply });
    s.control.wake.notify_one();
    match tokio::time::timeout(RESYNC_TIMEOUT, answer).await {
        Ok(Ok(Ok(done))) => (StatusCode::OK, format!("{done}\n")).into_response(),
        Ok(Ok(Err(e))) => (StatusCode::CONFLICT, format!("{e}\n")).into_response(),
        // Dropped unanswered: the request is not carried out.
        Ok(Err(_)) | Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "the runner is not streaming now (starting or retrying); nothing was done: try again, or use \
             source-runner reset --table\n",
        )
            .into_response(),
    }
}

#[derive(Debug, Deserialize)]
struct CutoverQuery {
    #[serde(default)]
    dry_run: bool,
}

/// `POST /cutover[?dry_run=true]`: starts a migration's cutover (or its
/// dry run) in the runner, as `sink-runner cutover` does; `GET /cutover`
/// follows it.
async fn cutover(State(s): State<AppState>, headers: HeaderMap, Query(q): Query<CutoverQuery>) -> Response {
    if let Some(r) = refuse(&s, &headers) {
        return r;
    }
    let tx = s.control.cutover.tx.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let Some(tx) = tx else {
        return (
            StatusCode::NOT_FOUND,
            "this runner cannot cut over: a sink runner into PostgreSQL does, with [cutover] source_config set              (docs/migration.md)\n",
        )
            .into_response();
    };
    {
        let mut state = s.control.cutover.state.lock().unwrap_or_else(|p| p.into_inner());
        if state["state"] == "running" {
            return (StatusCode::CONFLICT, "a cutover is running: GET /cutover follows it\n").into_response();
        }
        *state = serde_json::json!({"state": "running", "dry_run": q.dry_run, "steps": []});
    }
    tracing::info!(dry_run = q.dry_run, "cutover asked by an operator");
    if tx.send(q.dry_run).is_err() {
        s.control.set_cutover_state(serde_json::json!({"state": "none"}));
        return (StatusCode::SERVICE_UNAVAILABLE, "the runner is stopping; nothing was done\n").into_response();
    }
    let what = if q.dry_run { "dry run of the cutover" } else { "cutover" };
    (StatusCode::ACCEPTED, format!("{what} started: GET /cutover follows it\n")).into_response()
}

/// `GET /cutover`: the last cutover's state, steps and report, and whether
/// this runner cuts over (`available`).
async fn cutover_state(State(s): State<AppState>) -> Response {
    let available = s.control.cutover.tx.lock().unwrap_or_else(|p| p.into_inner()).is_some();
    let mut state = s.control.cutover.state.lock().unwrap_or_else(|p| p.into_inner()).clone();
    state["available"] = serde_json::Value::Bool(available);
    Json(state).into_response()
}

/// `POST /verify[?table=schema.table][&method=rows|summary]`: verifies the
/// table (every table without one) while the stream goes on, by the
/// method asked (the config's without one); the sinks report the outcome.
async fn verify(State(s): State<AppState>, headers: HeaderMap, Query(q): Query<TableQuery>) -> Response {
    if let Some(r) = refuse(&s, &headers) {
        return r;
    }
    if !s.control.resyncs.served.load(Ordering::Relaxed) {
        return (
            StatusCode::NOT_FOUND,
            "this runner cannot verify: ask its source runner (source-runner verify), and read the outcome here\n",
        )
            .into_response();
    }
    let table = q.table.unwrap_or_default();
    tracing::info!(table = %table, "verification asked by an operator");
    let (reply, answer) = tokio::sync::oneshot::channel();
    let _ = s.control.verifies.tx.send(ResyncRequest { table, method: q.method, reply });
    s.control.wake.notify_one();
    match tokio::time::timeout(RESYNC_TIMEOUT, answer).await {
        Ok(Ok(Ok(done))) => (StatusCode::OK, format!("{done}\n")).into_response(),
        Ok(Ok(Err(e))) => (StatusCode::CONFLICT, format!("{e}\n")).into_response(),
        Ok(Err(_)) | Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "the runner is not streaming now (starting or retrying); nothing was done: try again\n",
        )
            .into_response(),
    }
}

/// How long `POST /resync` waits for the runner to take the request.
const RESYNC_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// How long a pause or resume waits for the pause store.
const STORE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The answer to a pause or resume: `done` once the pause store holds it,
/// `503` if it does not in time (the change holds until a restart, and is
/// still being stored).
async fn stored(control: &Control, done: &str) -> Response {
    if control.wait_stored(STORE_TIMEOUT).await {
        (StatusCode::OK, format!("{done}\n")).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{done}, but not stored in Kafka yet: a restart now would forget it (the runner keeps trying)\n"),
        )
            .into_response()
    }
}

/// The admin routes, for tests and for [`serve`].
pub fn router(telemetry: Telemetry, control: Control, token: Option<SecretString>, loopback: bool) -> Router {
    router_with_peers(telemetry, control, token, loopback, Vec::new())
}

/// [`router`], with the console showing `peers` (other runners' admin URLs).
pub fn router_with_peers(
    telemetry: Telemetry,
    control: Control,
    token: Option<SecretString>,
    loopback: bool,
    peers: Vec<String>,
) -> Router {
    Router::new()
        .route("/", get(console))
        .route("/history", get(history))
        .route("/peers", get(peer_status))
        .route("/resync", post(resync))
        .route("/verify", post(verify))
        .route("/cutover", get(cutover_state).post(cutover))
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/status", get(status))
        .route("/metrics", get(metrics))
        .route("/pause", post(pause))
        .route("/resume", post(resume))
        .with_state(AppState {
            telemetry,
            control,
            token: token.map(Arc::new),
            loopback,
            peers: Arc::new(peers),
        })
}

/// Binds the admin server and serves it in a background task. Returns the
/// bound address (useful with port 0), or `None` when it is off.
pub async fn serve(
    config: &AdminConfig,
    telemetry: Telemetry,
    control: Control,
) -> Result<Option<SocketAddr>, std::io::Error> {
    let invalid = |e: ConfigError| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string());
    let Some(addr) = config.address().map_err(invalid)? else {
        return Ok(None);
    };
    let token = config.token().map_err(invalid)?;
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let app = router_with_peers(telemetry.clone(), control, token, addr.ip().is_loopback(), config.peers.clone());
    // The lag history the console draws.
    tokio::spawn(async move {
        let mut every = tokio::time::interval(crate::telemetry::HISTORY_EVERY);
        loop {
            every.tick().await;
            telemetry.sample_lag();
        }
    });
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "admin server stopped");
        }
    });
    tracing::info!(address = %bound, "admin server listening");
    Ok(Some(bound))
}

/// The client side of the admin API, for the runners' `status`, `pause` and
/// `resume` commands.
pub mod client {
    pub use reqwest::Method;
    use secrecy::{ExposeSecret, SecretString};

    use super::RunnerStatusView;

    /// Calls the admin API of a running runner at `listen` (its `admin.listen`).
    pub async fn call(
        listen: &str,
        method: reqwest::Method,
        path: &str,
        token: Option<&SecretString>,
    ) -> Result<String, String> {
        let host = listen.replace("0.0.0.0", "127.0.0.1");
        let url = format!("http://{host}{path}");
        let mut req = reqwest::Client::new().request(method, &url);
        if let Some(t) = token {
            req = req.bearer_auth(t.expose_secret());
        }
        let resp = req
            .send()
            .await
            .map_err(|e| format!("cannot reach the runner's admin server at {host}: {e} (is the runner running?)"))?;
        let status = resp.status();
        let body = resp.text().await.map_err(|e| e.to_string())?;
        if status.is_success() {
            Ok(body)
        } else {
            Err(format!("{status}: {}", body.trim()))
        }
    }

    /// What an operator asks a running runner from the command line.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Request {
        /// `GET /status`, as a table or (`json`) raw.
        Status {
            /// Print the raw JSON.
            json: bool,
        },
        /// `POST /pause`, for one table or all.
        Pause(Option<String>),
        /// `POST /resume`, for one table or all.
        Resume(Option<String>),
        /// `POST /verify`, for one table or all (source runners), by a
        /// method or the config's.
        Verify {
            /// `schema.table`; none: every table.
            table: Option<String>,
            /// `rows` or `summary`; none: the config's.
            method: Option<String>,
        },
    }

    /// Runs `request` against the runner whose `[admin]` section is `admin`,
    /// prints the answer, and returns the process exit code.
    pub async fn command(admin: &super::AdminConfig, request: Request) -> std::process::ExitCode {
        use std::process::ExitCode;
        let token = match admin.token() {
            Ok(t) => t,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        };
        let with_table = |path: &str, table: &Option<String>| match table {
            Some(t) => format!("{path}?table={t}"),
            None => path.to_string(),
        };
        let (method, path, table_view) = match &request {
            Request::Status { json } => (Method::GET, "/status".to_string(), !json),
            Request::Pause(t) => (Method::POST, with_table("/pause", t), false),
            Request::Resume(t) => (Method::POST, with_table("/resume", t), false),
            Request::Verify { table, method: m } => {
                let mut path = with_table("/verify", table);
                if let Some(m) = m {
                    path.push(if table.is_some() { '&' } else { '?' });
                    path.push_str(&format!("method={m}"));
                }
                (Method::POST, path, false)
            }
        };
        let printed = match call(&admin.listen, method, &path, token.as_ref()).await {
            Ok(body) if table_view => render_status(&body),
            other => other,
        };
        match printed {
            Ok(text) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        }
    }

    /// Renders `GET /status` as a readable table.
    pub fn render_status(json: &str) -> Result<String, String> {
        let s: RunnerStatusView = serde_json::from_str(json).map_err(|e| format!("unexpected status: {e}"))?;
        let mut out = format!(
            "{} runner {}: {}\n",
            s.kind,
            s.runner,
            s.paused.as_deref().map_or("running".to_string(), |r| format!("paused ({r})"))
        );
        out.push_str(&format!(
            "{:<32} {:<14} {:>26} {:>10} {:>8} {:>8} {:>9}  {}\n",
            "TABLE", "STATE", "SNAPSHOT", "EVENTS", "EV/S", "FAILED", "LAG", "LAST ERROR"
        ));
        for (name, t) in &s.tables {
            let mut state = match &t.reason {
                Some(r) => format!("{} ({r})", t.state),
                None => t.state.clone(),
            };
            // A sink's last verification (docs/verification.md).
            if let Some(v) = &t.verification {
                state.push_str(&match v.state.as_str() {
                    "differs" => format!(", verified: {} rows differ", v.rows_differing),
                    other => format!(", verified: {}", other.replace('_', " ")),
                });
            }
            out.push_str(&format!(
                "{:<32} {:<14} {:>26} {:>10} {:>8.1} {:>8} {:>9}  {}\n",
                name,
                state,
                t.copy_progress(),
                t.events,
                t.events_per_second,
                t.failed_records,
                t.lag_seconds.map_or("-".to_string(), |l| format!("{l:.1}s")),
                t.last_error.as_ref().map_or("", |e| e.message.as_str()),
            ));
        }
        Ok(out)
    }
}

/// `GET /status` as the client reads it.
#[derive(Debug, Deserialize)]
struct RunnerStatusView {
    runner: String,
    kind: String,
    paused: Option<String>,
    tables: std::collections::BTreeMap<String, TableStatusView>,
}

#[derive(Debug, Deserialize)]
struct TableStatusView {
    state: String,
    reason: Option<String>,
    rows_snapshotted: u64,
    #[serde(default)]
    rows_estimated: Option<u64>,
    events: u64,
    events_per_second: f64,
    failed_records: u64,
    lag_seconds: Option<f64>,
    last_error: Option<LastErrorView>,
    #[serde(default)]
    verification: Option<VerificationView>,
}

#[derive(Debug, Deserialize)]
struct VerificationView {
    state: String,
    rows_differing: u64,
}

impl TableStatusView {
    /// Rows copied, of the estimate, and the time left at the current rate
    /// while snapshotting: `400/~1000 (40%, 2m left)`.
    fn copy_progress(&self) -> String {
        let Some(est) = self.rows_estimated.filter(|e| *e > 0) else {
            return self.rows_snapshotted.to_string();
        };
        let done = self.rows_snapshotted;
        let mut out = format!("{done}/~{est} ({:.0}%", 100.0 * done.min(est) as f64 / est as f64);
        if self.state == "snapshotting" && self.events_per_second > 0.0 && est > done {
            let secs = (est - done) as f64 / self.events_per_second;
            out.push_str(&if secs < 90.0 {
                format!(", {secs:.0}s left")
            } else {
                format!(", {:.0}m left", secs / 60.0)
            });
        }
        out.push(')');
        out
    }
}

#[derive(Debug, Deserialize)]
struct LastErrorView {
    message: String,
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_cli_status_shows_the_copy_progress_and_time_left() {
        let json = r#"{"runner":"r","kind":"source","paused":null,"tables":{
            "s.big":{"state":"snapshotting","rows_snapshotted":400,"rows_estimated":1000,"events":400,
                     "events_per_second":10.0,"failed_records":0,"lag_seconds":1.5,"last_error":null},
            "s.small":{"state":"streaming","rows_snapshotted":7,"rows_estimated":null,"events":9,
                     "events_per_second":0.0,"failed_records":0,"lag_seconds":0.0,"last_error":null}}}"#;
        let text = super::client::render_status(json).expect("renders");
        assert!(text.contains("400/~1000 (40%, 60s left)"), "{text}");
        assert!(text.lines().any(|l| l.starts_with("s.small") && l.contains(" 7 ")), "{text}");
    }
}
