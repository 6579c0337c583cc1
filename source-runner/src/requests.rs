//! The copy's requests topic, read between batches: what its sink runners
//! ask (a repair of rows a verification found different, see
//! [`tributary_schemas::records::requests`]). Offsets are committed as
//! requests are taken: one taken just before a crash may be lost, and the
//! next verification, which finds its rows still different, asks again.

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::Message;
use tracing::warn;
use tributary_connectors::kafka::kafka_error;
use tributary_connectors::Error;
use tributary_schemas::records::requests::{self, Request};

use crate::config::SourceRunnerConfig;

/// The requests topic's reader.
pub struct Requests {
    consumer: BaseConsumer,
}

impl Requests {
    /// Reads the requests topic of `config`'s prefix (made before, by the
    /// writer), from where this runner last took requests (from the start
    /// the first time: requests sent before it ran are served).
    pub fn subscribe(config: &SourceRunnerConfig) -> Result<Self, Error> {
        let mut c = config.kafka.client_config().map_err(|e| Error::needs_operator(e.to_string()))?;
        c.set("group.id", format!("tributary-source-{}-requests", config.name))
            .set("enable.auto.commit", "true")
            .set("auto.offset.reset", "earliest");
        let consumer: BaseConsumer = c.create().map_err(|e| kafka_error("requests consumer", e))?;
        consumer
            .subscribe(&[&requests::topic(config.prefix())])
            .map_err(|e| kafka_error("subscribing to the requests topic", e))?;
        Ok(Self { consumer })
    }

    /// The next request waiting, without waiting for one; an unreadable
    /// one is skipped, loudly.
    pub fn next(&self) -> Option<Request> {
        loop {
            let message = match self.consumer.poll(Duration::ZERO)? {
                Ok(m) => m,
                Err(e) => {
                    warn!(error = %e, "reading the requests topic failed; trying again at the next batch");
                    return None;
                }
            };
            match message.payload().map(Request::decode) {
                Some(Ok(r)) => return Some(r),
                Some(Err(e)) => warn!(offset = message.offset(), error = %e, "an unreadable request is skipped"),
                None => {}
            }
        }
    }
}
