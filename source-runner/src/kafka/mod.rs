//! The source runner's side of Kafka: its transactional producer
//! ([`producer`]) and its topics ([`admin`]). Kafka's errors are classified
//! once for both runners, in `tributary_connectors::kafka`.

pub mod admin;
pub mod producer;

use tributary_connectors::Error;

/// Runs `f`, a blocking librdkafka call, without stalling the async runtime.
pub(crate) async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, Error> {
    tokio::task::spawn_blocking(f).await.map_err(unfinished)
}

/// A blocking Kafka call's task that panicked or was cancelled.
pub(crate) fn unfinished(e: tokio::task::JoinError) -> Error {
    Error::retryable(format!("blocking Kafka call did not finish: {e}"))
}
