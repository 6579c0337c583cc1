//! Kafka client settings shared by both runners.

use rdkafka::ClientConfig;
use secrecy::ExposeSecret;
use serde::Deserialize;

use crate::config::{resolve_secret, ConfigError};

/// How to reach Kafka. `Debug` shows no secret: the SASL password is
/// shown as set or not, and of `properties` only the names (a value may
/// be a password, e.g. `ssl.key.password`).
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaConfig {
    /// Comma-separated `host:port` list.
    pub bootstrap_servers: String,
    /// `PLAINTEXT` (default), `SSL`, `SASL_PLAINTEXT` or `SASL_SSL`.
    #[serde(default = "default_security_protocol")]
    pub security_protocol: String,
    /// SASL mechanism, e.g. `SCRAM-SHA-512`.
    #[serde(default)]
    pub sasl_mechanism: Option<String>,
    /// SASL user name.
    #[serde(default)]
    pub sasl_username: Option<String>,
    /// SASL password: inline, `env:NAME` or `file:/path`.
    #[serde(default)]
    pub sasl_password: Option<String>,
    /// CA bundle for TLS.
    #[serde(default)]
    pub ssl_ca_location: Option<String>,
    /// Extra librdkafka properties, for anything not covered above.
    #[serde(default)]
    pub properties: std::collections::BTreeMap<String, String>,
}

impl std::fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let properties: std::collections::BTreeMap<&str, crate::config::Redacted> =
            self.properties.keys().map(|k| (k.as_str(), crate::config::Redacted)).collect();
        f.debug_struct("KafkaConfig")
            .field("bootstrap_servers", &self.bootstrap_servers)
            .field("security_protocol", &self.security_protocol)
            .field("sasl_mechanism", &self.sasl_mechanism)
            .field("sasl_username", &self.sasl_username)
            .field("sasl_password", &self.sasl_password.as_ref().map(|_| crate::config::Redacted))
            .field("ssl_ca_location", &self.ssl_ca_location)
            .field("properties", &properties)
            .finish()
    }
}

fn default_security_protocol() -> String {
    "PLAINTEXT".to_string()
}

impl KafkaConfig {
    /// Checks the fields; errors name them under `prefix`.
    pub fn validate(&self, prefix: &str) -> Result<(), ConfigError> {
        if self.bootstrap_servers.trim().is_empty() {
            return Err(ConfigError::invalid(
                format!("{prefix}.bootstrap_servers"),
                "must list at least one host:port",
            ));
        }
        let protocols = ["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"];
        if !protocols.contains(&self.security_protocol.as_str()) {
            return Err(ConfigError::invalid(
                format!("{prefix}.security_protocol"),
                format!("must be one of {}", protocols.join(", ")),
            ));
        }
        if self.security_protocol.starts_with("SASL") && self.sasl_username.is_none() {
            return Err(ConfigError::invalid(
                format!("{prefix}.sasl_username"),
                "is required when security_protocol is SASL_*",
            ));
        }
        self.validate_properties(prefix)
    }

    /// Hands each of `properties` to librdkafka now, as creating a client
    /// would, so that a mistyped name or a value librdkafka refuses stops
    /// the runner at start with the key named, instead of failing every
    /// client creation later. Neither librdkafka's message nor the value is
    /// repeated: a value may be a secret.
    fn validate_properties(&self, prefix: &str) -> Result<(), ConfigError> {
        for (key, value) in &self.properties {
            let mut one = ClientConfig::new();
            one.set(key, value);
            match one.create_native_config() {
                Ok(_) => {}
                Err(rdkafka::error::KafkaError::ClientConfig(res, ..)) => {
                    let rule = if res == rdkafka::types::RDKafkaConfRes::RD_KAFKA_CONF_UNKNOWN {
                        "is not a librdkafka setting (see librdkafka's CONFIGURATION.md for the names)"
                    } else {
                        "has a value librdkafka refuses for this setting"
                    };
                    return Err(ConfigError::invalid(format!("{prefix}.properties.\"{key}\""), rule));
                }
                Err(_) => {
                    return Err(ConfigError::invalid(
                        format!("{prefix}.properties.\"{key}\""),
                        "cannot be handed to librdkafka (it contains a NUL character)",
                    ))
                }
            }
        }
        Ok(())
    }

    /// A librdkafka config with connection and security settings applied.
    pub fn client_config(&self) -> Result<ClientConfig, ConfigError> {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.bootstrap_servers);
        c.set("security.protocol", &self.security_protocol);
        if let Some(m) = &self.sasl_mechanism {
            c.set("sasl.mechanism", m);
        }
        if let Some(u) = &self.sasl_username {
            c.set("sasl.username", u);
        }
        if let Some(p) = &self.sasl_password {
            let secret = resolve_secret("kafka.sasl_password", p)?;
            c.set("sasl.password", secret.expose_secret());
        }
        if let Some(ca) = &self.ssl_ca_location {
            c.set("ssl.ca.location", ca);
        }
        for (k, v) in &self.properties {
            c.set(k, v);
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(properties: &[(&str, &str)]) -> KafkaConfig {
        KafkaConfig {
            bootstrap_servers: "127.0.0.1:9092".into(),
            security_protocol: default_security_protocol(),
            sasl_mechanism: None,
            sasl_username: None,
            sasl_password: None,
            ssl_ca_location: None,
            properties: properties.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        }
    }

    #[test]
    fn a_mistyped_or_refused_property_is_named_at_validation() {
        assert!(config(&[("linger.ms", "5"), ("compression.type", "zstd")])
            .validate("kafka")
            .is_ok());
        let e = config(&[("linger.ms", "5"), ("lingr.ms", "5")]).validate("kafka").unwrap_err();
        let text = e.to_string();
        assert!(text.contains("kafka.properties.\"lingr.ms\""), "{text}");
        assert!(text.contains("is not a librdkafka setting"), "{text}");
        let e = config(&[("compression.type", "secret-looking-value")])
            .validate("kafka")
            .unwrap_err();
        let text = e.to_string();
        assert!(text.contains("kafka.properties.\"compression.type\"") && text.contains("value"), "{text}");
        assert!(!text.contains("secret-looking-value"), "the value is never repeated: {text}");
    }
}
