//! TLS modes towards databases, the same words for every connector that
//! speaks TLS itself (PostgreSQL, MySQL): libpq's `sslmode` names, which
//! MySQL's `--ssl-mode` mirrors (`REQUIRED`, `VERIFY_CA`, `VERIFY_IDENTITY`).

use serde::Deserialize;
use tributary_operations::config::ConfigError;

/// TLS towards a database, in the modes of libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum TlsMode {
    /// Plain TCP.
    #[default]
    Disable,
    /// TLS without certificate verification.
    Require,
    /// TLS, the server certificate must chain to `tls_ca_file`.
    VerifyCa,
    /// As `verify-ca`, and the host name must match.
    VerifyFull,
}

/// The TLS rules shared by every database section with `tls` and
/// `tls_ca_file`; `field` names a key under the section.
pub fn validate_tls(mode: TlsMode, ca_file: Option<&str>, field: impl Fn(&str) -> String) -> Result<(), ConfigError> {
    match mode {
        TlsMode::VerifyCa | TlsMode::VerifyFull if ca_file.is_none() => Err(ConfigError::invalid(
            field("tls_ca_file"),
            "is required with tls = \"verify-ca\" or \"verify-full\"",
        )),
        TlsMode::Disable if ca_file.is_some() => Err(ConfigError::invalid(
            field("tls_ca_file"),
            "is set but tls = \"disable\"; set tls = \"verify-ca\" or \"verify-full\"",
        )),
        _ => Ok(()),
    }
}
