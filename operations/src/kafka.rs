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
