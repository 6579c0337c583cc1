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
    /// Per connection: its own hold, and the server bytes it carried.
    conns: Arc<Mutex<Vec<Conn>>>,
}

struct Conn {
    held: watch::Sender<bool>,
    carried: Arc<std::sync::atomic::AtomicU64>,
}

impl Proxy {
    /// Starts forwarding connections on a free port to `server`.
    pub async fn start(server: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let (held, gate) = watch::channel(false);
        let pipes = Arc::new(Mutex::new(Vec::new()));
        let conns = Arc::new(Mutex::new(Vec::new()));
        let (spawned, accepted) = (pipes.clone(), conns.clone());
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(upstream) = TcpStream::connect(server).await else {
                    continue;
                };
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = upstream.into_split();
                let (own, own_gate) = watch::channel(false);
                let carried = Arc::new(std::sync::atomic::AtomicU64::new(0));
                let gates = Gates {
                    all: gate.clone(),
                    own: own_gate,
                    carried: carried.clone(),
                };
                accepted
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(Conn { held: own, carried });
                let mut pipes = spawned.lock().unwrap_or_else(|e| e.into_inner());
                pipes.push(tokio::spawn(pipe(client_read, server_write, None)));
                pipes.push(tokio::spawn(pipe(server_read, client_write, Some(gates))));
            }
        });
        Self { port, held, accept, pipes, conns }
    }

    /// Holds back only the connection that has carried the most server
    /// bytes so far (a replication stream, once it streamed): the client's
    /// other sessions (catalog queries) still get their answers.
    pub fn hold_busiest(&self) {
        let conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = conns
            .iter()
            .max_by_key(|c| c.carried.load(std::sync::atomic::Ordering::Relaxed))
        {
            c.held.send_replace(true);
        }
    }

    /// Holds back only the `n`th connection (from 0, in the order the
    /// client opened them): a source's first is its catalog session.
    pub fn hold_connection(&self, n: usize) {
        let conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        conns.get(n).expect("no such connection").held.send_replace(true);
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

/// The holds of a server-to-client direction: every connection's, its own,
/// and the bytes it carried.
struct Gates {
    all: watch::Receiver<bool>,
    own: watch::Receiver<bool>,
    carried: Arc<std::sync::atomic::AtomicU64>,
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut gates: Option<Gates>,
) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        if let Some(g) = gates.as_mut() {
            // Dropped senders (the proxy is gone): forward freely.
            for gate in [&mut g.all, &mut g.own] {
                while *gate.borrow_and_update() {
                    if gate.changed().await.is_err() {
                        break;
                    }
                }
            }
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some(g) = &gates {
            g.carried.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
        }
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
