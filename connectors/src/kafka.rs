//! Kafka's errors as [`Error`]s: the one classifier both runners use (the
//! source runner's producer and admin client, the sink runner's consumer
//! and dead-letter producers). Kafka codes are classified, never
//! string-matched.

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use crate::error::{Error, ErrorKind};

/// The error of a Kafka call made for `context`, with its kind:
///
/// * a setting librdkafka refuses, a client it cannot make, a refused
///   right, a failed login, a fatal transaction error (this producer was
///   fenced: another instance with its transactional id took over), and a
///   record larger than Kafka accepts need an operator: retrying makes the
///   same client, or sends the same record, again;
/// * everything else (a broker away, a timeout, an abortable transaction
///   error) may clear by itself.
pub fn kafka_error(context: &str, err: KafkaError) -> Error {
    let kind = match &err {
        // Its message repeats the value, which may be a secret, so it is
        // not kept.
        KafkaError::ClientConfig(_, _, key, _) => {
            return Error::needs_operator(format!("kafka: {context}: librdkafka refuses the setting `{key}`"))
                .with_class("kafka.ClientConfig")
                .with_hint(format!("correct or remove `{key}` under [kafka] properties"));
        }
        KafkaError::ClientCreation(_) => ErrorKind::NeedsOperator,
        KafkaError::Transaction(e) if e.is_fatal() => ErrorKind::NeedsOperator,
        // A record too large fails its transaction (an abortable error):
        // the same record fails again however often it is retried.
        KafkaError::Transaction(e) if too_large(e.code()) => ErrorKind::NeedsOperator,
        KafkaError::Transaction(_) => ErrorKind::Retryable,
        e => match e.rdkafka_error_code() {
            Some(
                RDKafkaErrorCode::TopicAuthorizationFailed
                | RDKafkaErrorCode::ClusterAuthorizationFailed
                | RDKafkaErrorCode::TransactionalIdAuthorizationFailed
                | RDKafkaErrorCode::SaslAuthenticationFailed
                | RDKafkaErrorCode::Authentication,
            ) => ErrorKind::NeedsOperator,
            Some(code) if too_large(code) => ErrorKind::NeedsOperator,
            _ => ErrorKind::Retryable,
        },
    };
    let class = if is_fenced(&err) {
        FENCED_PRODUCER_CLASS.to_string()
    } else {
        format!("kafka.{:?}", err.rdkafka_error_code())
    };
    Error::new(kind, format!("kafka: {context}")).with_class(class).with_source(err)
}

/// The class of the error of a transactional producer another producer
/// with the same transactional id fenced. A source runner's fence needs an
/// operator (two runners of one name) or is a `source-runner reset`; a
/// dead-letter producer's is the normal hand-over of a partition to its
/// next owner (see the sink runner's dead letters).
pub const FENCED_PRODUCER_CLASS: &str = "kafka.ProducerFenced";

/// Whether `err` says that this transactional producer was fenced.
fn is_fenced(err: &KafkaError) -> bool {
    matches!(
        err.rdkafka_error_code(),
        Some(RDKafkaErrorCode::Fenced | RDKafkaErrorCode::ProducerFenced | RDKafkaErrorCode::InvalidProducerEpoch)
    )
}

/// Whether `code` says a record (or its batch) is larger than the producer
/// (`message.max.bytes`) or the broker and topic (`max.message.bytes`)
/// accept.
pub fn too_large(code: RDKafkaErrorCode) -> bool {
    matches!(code, RDKafkaErrorCode::MessageSizeTooLarge | RDKafkaErrorCode::MessageBatchTooLarge)
}

/// The error of a record of `bytes` bytes that Kafka refuses as too large
/// on `topic`, with what to raise.
pub fn too_large_error(topic: &str, bytes: usize, code: RDKafkaErrorCode) -> Error {
    Error::needs_operator(format!(
        "kafka: a record of {bytes} bytes (key and value, uncompressed) is larger than Kafka accepts on topic {topic}: \
         {code}"
    ))
    .with_class(format!("kafka.{code:?}"))
    .with_hint(format!(
        "raise the producer's message.max.bytes ([kafka] properties = {{ \"message.max.bytes\" = \"...\" }}, \
         librdkafka's default 1000000) and the topic's max.message.bytes (kafka-configs.sh --alter \
         --entity-type topics --entity-name {topic} --add-config max.message.bytes=...) above {bytes} bytes; \
         the runner resumes by itself once both fit"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_too_large_and_bad_client_settings_need_an_operator() {
        for code in [
            RDKafkaErrorCode::MessageSizeTooLarge,
            RDKafkaErrorCode::MessageBatchTooLarge,
            RDKafkaErrorCode::TopicAuthorizationFailed,
            RDKafkaErrorCode::TransactionalIdAuthorizationFailed,
        ] {
            let e = kafka_error("produce", KafkaError::MessageProduction(code));
            assert_eq!(e.kind(), ErrorKind::NeedsOperator, "{code:?}");
        }
        let e = too_large_error("p.s.t", 123_456, RDKafkaErrorCode::MessageSizeTooLarge);
        assert_eq!(e.kind(), ErrorKind::NeedsOperator);
        let text = e.to_string();
        for part in ["123456 bytes", "p.s.t", "message.max.bytes", "max.message.bytes"] {
            assert!(text.contains(part), "{part} missing: {text}");
        }
        let e = kafka_error("cannot create the producer", KafkaError::ClientCreation("bad".into()));
        assert_eq!(e.kind(), ErrorKind::NeedsOperator);
        let e = kafka_error(
            "cannot create the producer",
            KafkaError::ClientConfig(
                rdkafka::types::RDKafkaConfRes::RD_KAFKA_CONF_INVALID,
                "Invalid value \"hunter2\" for sasl.password".into(),
                "sasl.password".into(),
                "hunter2".into(),
            ),
        );
        assert_eq!(e.kind(), ErrorKind::NeedsOperator);
        assert!(!e.to_string().contains("hunter2"), "{e}");
    }

    #[test]
    fn outages_stay_retryable_and_fences_are_named() {
        let e = kafka_error("produce", KafkaError::MessageProduction(RDKafkaErrorCode::BrokerTransportFailure));
        assert_eq!(e.kind(), ErrorKind::Retryable);
        assert_eq!(e.class(), "kafka.Some(BrokerTransportFailure)");
        let e = kafka_error("commit", KafkaError::MessageProduction(RDKafkaErrorCode::ProducerFenced));
        assert_eq!(e.class(), FENCED_PRODUCER_CLASS);
    }
}
