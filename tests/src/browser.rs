//! A headless Chromium driven over the DevTools protocol, for the console
//! page's test: open a page, evaluate JavaScript, click an element with the
//! mouse, take a screenshot. Debian's `chromium-headless-shell` (or
//! `chromium`), installed by scripts/install.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

type Socket = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// The Chromium binaries tried, in order.
const BINARIES: [&str; 4] = [
    "chromium-headless-shell",
    "chromium",
    "/usr/lib/chromium/chromium-headless-shell",
    "/usr/lib/chromium/chromium",
];

fn binary() -> PathBuf {
    if let Ok(b) = std::env::var("TRIBUTARY_CHROMIUM") {
        return PathBuf::from(b);
    }
    for b in BINARIES {
        let found = if b.starts_with('/') {
            Path::new(b).exists().then(|| PathBuf::from(b))
        } else {
            std::env::var_os("PATH")
                .and_then(|paths| std::env::split_paths(&paths).map(|p| p.join(b)).find(|p| p.exists()))
        };
        if let Some(p) = found {
            return p;
        }
    }
    panic!(
        "no headless Chromium found (tried {BINARIES:?}): scripts/install installs Debian's chromium-headless-shell; \
         or set TRIBUTARY_CHROMIUM"
    )
}

/// One browser with one page.
pub struct Browser {
    child: Child,
    _profile: PathBuf,
    socket: Socket,
    next_id: u64,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self._profile);
    }
}

impl Browser {
    /// Starts Chromium headless with a fresh profile and opens a blank page
    /// of `width` x `height` CSS pixels.
    pub async fn start(width: u32, height: u32) -> Self {
        let profile = std::env::temp_dir().join(crate::unique("chromium-profile"));
        std::fs::create_dir_all(&profile).expect("profile dir");
        let child = Command::new(binary())
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
                &format!("--window-size={width},{height}"),
                &format!("--user-data-dir={}", profile.display()),
                "about:blank",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromium");
        // Chromium writes the port it bound into the profile.
        let port_file = profile.join("DevToolsActivePort");
        let deadline = Instant::now() + Duration::from_secs(30);
        let port: u16 = loop {
            if let Some(p) = std::fs::read_to_string(&port_file)
                .ok()
                .and_then(|t| t.lines().next().and_then(|l| l.trim().parse().ok()))
            {
                break p;
            }
            assert!(Instant::now() < deadline, "chromium did not open its DevTools port");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let targets: Vec<Value> = reqwest::get(format!("http://127.0.0.1:{port}/json/list"))
            .await
            .expect("DevTools targets")
            .json()
            .await
            .expect("targets JSON");
        let page = targets
            .iter()
            .find(|t| t["type"] == "page")
            .and_then(|t| t["webSocketDebuggerUrl"].as_str())
            .expect("a page target")
            .to_string();
        let (socket, _) = tokio_tungstenite::connect_async(page).await.expect("DevTools socket");
        let mut b = Self { child, _profile: profile, socket, next_id: 0 };
        b.call("Page.enable", json!({})).await;
        b.call("Runtime.enable", json!({})).await;
        b
    }

    /// Sends a DevTools command and returns its result (events between are
    /// skipped).
    pub async fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let text = json!({ "id": id, "method": method, "params": params }).to_string();
        self.socket.send(Message::text(text)).await.expect("DevTools send");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let msg = tokio::time::timeout_at(deadline, self.socket.next())
                .await
                .unwrap_or_else(|_| panic!("no answer to {method}"))
                .expect("DevTools socket closed")
                .expect("DevTools socket");
            let Message::Text(text) = msg else { continue };
            let v: Value = serde_json::from_str(&text).expect("DevTools JSON");
            if v["id"] == id {
                if let Some(e) = v.get("error") {
                    panic!("{method}: {e}");
                }
                return v["result"].clone();
            }
        }
    }

    /// Opens `url` in the page.
    pub async fn navigate(&mut self, url: &str) {
        self.call("Page.navigate", json!({ "url": url })).await;
    }

    /// Evaluates `expression` in the page; its value (JSON-serialisable).
    pub async fn eval(&mut self, expression: &str) -> Value {
        let r = self
            .call("Runtime.evaluate", json!({ "expression": expression, "returnByValue": true, "awaitPromise": true }))
            .await;
        if let Some(e) = r.get("exceptionDetails") {
            panic!("{expression}: {e}");
        }
        r["result"]["value"].clone()
    }

    /// Waits until `expression` is truthy in the page.
    pub async fn wait_for(&mut self, what: &str, timeout: Duration, expression: &str) {
        let deadline = Instant::now() + timeout;
        loop {
            let v = self
                .eval(&format!("(() => {{ try {{ return !!({expression}); }} catch (e) {{ return false; }} }})()"))
                .await;
            if v == Value::Bool(true) {
                return;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what} in the page");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Clicks the middle of the element `selector` with the mouse, as a user
    /// would (press and release at its position), not by calling `click()`.
    pub async fn click(&mut self, selector: &str) {
        let sel = serde_json::to_string(selector).expect("selector");
        let rect = self
            .eval(&format!(
                "(() => {{ const e = document.querySelector({sel}); if (!e) return null; e.scrollIntoView({{block: 'center'}}); \
                 const r = e.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; }})()"
            ))
            .await;
        let (x, y) = match rect.as_array().map(|a| (a[0].as_f64(), a[1].as_f64())) {
            Some((Some(x), Some(y))) => (x, y),
            _ => panic!("no element {selector} to click"),
        };
        for kind in ["mousePressed", "mouseReleased"] {
            self.call(
                "Input.dispatchMouseEvent",
                json!({ "type": kind, "x": x, "y": y, "button": "left", "clickCount": 1 }),
            )
            .await;
        }
    }

    /// A PNG of the page, written to `path`.
    pub async fn screenshot(&mut self, path: &Path) {
        let r = self.call("Page.captureScreenshot", json!({ "format": "png" })).await;
        let data = r["data"].as_str().expect("screenshot data");
        use base64::Engine;
        let png = base64::engine::general_purpose::STANDARD
            .decode(data)
            .expect("screenshot base64");
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).expect("artifact dir");
        }
        std::fs::write(path, png).expect("write screenshot");
    }
}
