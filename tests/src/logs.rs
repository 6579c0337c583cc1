//! The logs of a runner started inside a test, kept in memory so that a
//! failed assertion can say what the runner did (libtest captures only the
//! test thread's output, and a runner logs from the runtime's workers).

use std::io::Write;
use std::sync::{Arc, Mutex};

use tracing::Dispatch;

/// Where a runner's log lines go; [`Captured::text`] reads them back.
#[derive(Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    /// A dispatcher writing `info` and above here: attach it to the runner's
    /// future with `tracing::instrument::WithSubscriber::with_subscriber`.
    pub fn dispatch(&self) -> Dispatch {
        let sink = self.clone();
        Dispatch::new(
            tracing_subscriber::fmt()
                .with_ansi(false)
                .with_max_level(tracing::Level::INFO)
                .with_writer(move || sink.clone())
                .finish(),
        )
    }

    /// Everything logged so far.
    pub fn text(&self) -> String {
        let bytes = self.0.lock().map(|b| b.clone()).unwrap_or_default();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut b) = self.0.lock() {
            b.extend_from_slice(buf);
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
