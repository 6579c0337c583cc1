//! Config files: TOML, unknown fields rejected, every rule checked up front
//! with an error that names the field.

use std::path::Path;

use serde::de::DeserializeOwned;

/// A config that can check its own rules after parsing.
pub trait Validate {
    /// Checks every rule serde cannot express; the error names the field.
    fn validate(&self) -> Result<(), ConfigError>;
}

/// Why a config file was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {reason}")]
    Read {
        /// The path given.
        path: String,
        /// Why.
        reason: String,
    },
    /// The file is not valid TOML for this config (syntax, unknown field,
    /// wrong type); the message names the field and its line.
    #[error("invalid config file {path}: {reason}")]
    Parse {
        /// The path given.
        path: String,
        /// TOML's own message, which names the key and the position.
        reason: String,
    },
    /// A field breaks a rule.
    #[error("invalid config: field `{field}`: {rule}")]
    Invalid {
        /// Dotted path of the field, e.g. `source.postgres.url`.
        field: String,
        /// The rule it breaks.
        rule: String,
    },
}

impl ConfigError {
    /// A rule broken by `field`.
    pub fn invalid(field: impl Into<String>, rule: impl Into<String>) -> Self {
        ConfigError::Invalid { field: field.into(), rule: rule.into() }
    }
}

/// Reads, parses and validates a TOML config file.
pub fn load<T: DeserializeOwned + Validate>(path: &Path) -> Result<T, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
        path: path.display().to_string(),
        reason: e.to_string(),
    })?;
    parse(&text, &path.display().to_string())
}

/// Parses and validates TOML text; `origin` names it in errors.
pub fn parse<T: DeserializeOwned + Validate>(text: &str, origin: &str) -> Result<T, ConfigError> {
    let config: T = toml::from_str(text).map_err(|e| ConfigError::Parse {
        path: origin.to_string(),
        reason: e.to_string().trim_end().to_string(),
    })?;
    config.validate()?;
    Ok(config)
}

/// Resolves a secret given inline, as `env:NAME` or as `file:/path`, so that
/// no password needs to sit in a config file.
pub fn resolve_secret(field: &str, raw: &str) -> Result<secrecy::SecretString, ConfigError> {
    if let Some(name) = raw.strip_prefix("env:") {
        std::env::var(name)
            .map(secrecy::SecretString::from)
            .map_err(|_| ConfigError::invalid(field, format!("environment variable {name} is not set")))
    } else if let Some(path) = raw.strip_prefix("file:") {
        std::fs::read_to_string(path)
            .map(|s| secrecy::SecretString::from(s.trim_end_matches(['\n', '\r']).to_string()))
            .map_err(|e| ConfigError::invalid(field, format!("cannot read secret file {path}: {e}")))
    } else {
        Ok(secrecy::SecretString::from(raw.to_string()))
    }
}

/// `scheme://user:secret@host/db?password=x` -> `scheme://user:***@host/db?***`:
/// a connection URL fit for logs (a query string may hold a password too).
pub fn redact_url(url: &str) -> String {
    let (url, query) = match url.split_once('?') {
        Some((u, _)) => (u, "?***"),
        None => (url, ""),
    };
    if let Some(scheme_end) = url.find("://") {
        let rest = &url[scheme_end + 3..];
        let auth_end = rest.find('/').unwrap_or(rest.len());
        if let Some(at) = rest[..auth_end].rfind('@') {
            let userinfo = &rest[..at];
            let user = userinfo.split(':').next().unwrap_or("");
            return format!("{}://{}:***@{}{query}", &url[..scheme_end], user, &rest[at + 1..]);
        }
    }
    format!("{url}{query}")
}

/// What `Debug` shows in place of a secret.
#[derive(Clone, Copy)]
pub struct Redacted;

impl std::fmt::Debug for Redacted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_their_passwords() {
        assert_eq!(redact_url("postgres://u:pw@h:5432/db"), "postgres://u:***@h:5432/db");
        assert_eq!(redact_url("postgres://u@h/db?password=pw&sslmode=require"), "postgres://u:***@h/db?***");
        assert_eq!(redact_url("postgres://h/db"), "postgres://h/db");
    }
}
