//! A problem a setup check found in a source database, with its fix: what
//! `source-runner check` prints for every source.

use std::fmt;

use tributary_schemas::TableId;

/// How bad a problem is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// The source works, but not as well as it could.
    Warning,
    /// The source cannot start or will fail.
    Error,
}

/// One thing wrong with the source database's setup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// How bad.
    pub severity: Severity,
    /// The table concerned, if any.
    pub table: Option<TableId>,
    /// What is wrong and why it matters.
    pub message: String,
    /// The exact SQL (or configuration change) that fixes it.
    pub fix: Option<String>,
    /// Whether `check --fix` (or the source on start) applies the fix itself
    /// when its role may.
    pub auto_fix: bool,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let level = match self.severity {
            Severity::Warning => "warning",
            Severity::Error => "error",
        };
        write!(f, "{level}: ")?;
        if let Some(t) = &self.table {
            write!(f, "table {t}: ")?;
        }
        f.write_str(&self.message)?;
        if let Some(fix) = &self.fix {
            write!(f, "\n  fix: {fix}")?;
        }
        Ok(())
    }
}

impl Problem {
    /// An error: the source cannot start or will fail.
    pub fn error(message: impl Into<String>, fix: Option<String>) -> Self {
        Self {
            severity: Severity::Error,
            table: None,
            message: message.into(),
            fix,
            auto_fix: false,
        }
    }

    /// A warning: the source works, but not as well as it could.
    pub fn warning(message: impl Into<String>, fix: Option<String>) -> Self {
        Self {
            severity: Severity::Warning,
            ..Self::error(message, fix)
        }
    }

    /// About `table`.
    pub fn on(mut self, table: &TableId) -> Self {
        self.table = Some(table.clone());
        self
    }

    /// The source applies the fix itself when its role may.
    pub fn auto(mut self) -> Self {
        self.auto_fix = true;
        self
    }
}
