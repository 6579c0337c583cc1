//! A TCP proxy whose server-to-client direction can be held back: the
//! client sees a server that goes quiet mid-stream (a stall, not a
//! disconnect), at a moment the test chooses.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Bytes read per forwarded chunk: at most this much still reaches the
/// client after [`Proxy::hold`].
const CHUNK: usize = 16 * 1024;

/// A proxy listening on a local port, forwarding every connection to one
/// server.
pub struct Proxy {
    /// The port it listens on (127.0.0.1).
    pub port: u16,
    held: watch::Sender<bool>,
    accept: tokio::task::JoinHandle<()>,
    pipes: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

impl Proxy {
    /// Starts forwarding connections on a free port to `server`.
    pub async fn start(server: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let (held, gate) = watch::channel(false);
        let pipes = Arc::new(Mutex::new(Vec::new()));
        let spawned = pipes.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(upstream) = TcpStream::connect(server).await else {
                    continue;
                };
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = upstream.into_split();
                let mut pipes = spawned.lock().unwrap_or_else(|e| e.into_inner());
                pipes.push(tokio::spawn(pipe(client_read, server_write, None)));
                pipes.push(tokio::spawn(pipe(server_read, client_write, Some(gate.clone()))));
            }
        });
        Self { port, held, accept, pipes }
    }

    /// Stops passing the server's bytes on (connections stay open).
    pub fn hold(&self) {
        self.held.send_replace(true);
    }

    /// Passes the server's bytes on again.
    pub fn release(&self) {
        self.held.send_replace(false);
    }

    /// Closes every connection, as the death of the client's process does
    /// (the server's sessions end; a replication slot is free again).
    pub fn cut(&self) {
        for p in self.pipes.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
            p.abort();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut gate: Option<watch::Receiver<bool>>,
) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        if let Some(g) = gate.as_mut() {
            // Dropped sender (the proxy is gone): forward freely.
            while *g.borrow_and_update() {
                if g.changed().await.is_err() {
                    break;
                }
            }
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// The server a `scheme://user:password@host:port/db` URL names, and the
/// same URL pointed at a proxy on `port`.
pub fn url_through(url: &str, port: u16) -> (SocketAddr, String) {
    use std::net::ToSocketAddrs;
    let (scheme, rest) = url.split_once("://").expect("URL with a scheme");
    let (userinfo, rest) = rest.rsplit_once('@').map_or(("", rest), |(u, r)| (u, r));
    let (hostport, path) = rest.split_once('/').map_or((rest, ""), |(h, p)| (h, p));
    let server = hostport
        .to_socket_addrs()
        .expect("the URL's host:port resolves")
        .next()
        .expect("an address");
    let at = if userinfo.is_empty() {
        String::new()
    } else {
        format!("{userinfo}@")
    };
    (server, format!("{scheme}://{at}127.0.0.1:{port}/{path}"))
}
