//! Topic names of change events: one topic per table, named like
//! Debezium's (`<prefix>.<schema>.<table>`) unless configured otherwise,
//! and a dead-letter topic beside each.

use crate::model::TableId;

/// The default template, Debezium's topic naming.
pub const DEFAULT_TEMPLATE: &str = "{prefix}.{schema}.{table}";

/// Suffix of a topic's dead-letter topic.
pub const DLQ_SUFFIX: &str = ".dlq";

/// How table topics are named.
///
/// The template may use `{prefix}` (the runner's logical name), `{schema}`
/// and `{table}`; any other text is kept as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicNaming {
    /// The template, e.g. `{prefix}.{schema}.{table}` or `cdc-{table}`.
    pub template: String,
}

impl Default for TopicNaming {
    fn default() -> Self {
        Self { template: DEFAULT_TEMPLATE.to_string() }
    }
}

impl TopicNaming {
    /// A naming with the given template.
    pub fn new(template: impl Into<String>) -> Self {
        Self { template: template.into() }
    }

    /// The topic of a table.
    pub fn topic(&self, prefix: &str, table: &TableId) -> String {
        // One pass, so a placeholder-looking text inside a table name is not
        // substituted again.
        let mut out = String::with_capacity(self.template.len() + prefix.len() + 32);
        let mut rest = self.template.as_str();
        while let Some(open) = rest.find('{') {
            out.push_str(&rest[..open]);
            let after = &rest[open..];
            let (value, len) = if after.starts_with("{prefix}") {
                (prefix, "{prefix}".len())
            } else if after.starts_with("{schema}") {
                (table.schema.as_str(), "{schema}".len())
            } else if after.starts_with("{table}") {
                (table.table.as_str(), "{table}".len())
            } else {
                ("{", 1)
            };
            out.push_str(value);
            rest = &after[len..];
        }
        out.push_str(rest);
        out
    }

    /// The dead-letter topic of a topic: `<topic>.dlq`.
    pub fn dlq_topic(topic: &str) -> String {
        format!("{topic}{DLQ_SUFFIX}")
    }
}

/// Header that marks a control record on a change topic (a null key and
/// value; see docs/CONTRACTS.md).
pub const CONTROL_HEADER: &str = "tributary.control";
/// Control record: the source table was dropped.
pub const CONTROL_TABLE_DROPPED: &str = "table-dropped";
/// Control record: the table was copied again (after its changes were held
/// back); every row older than the position in [`CONTROL_POSITION_HEADER`]
/// is gone (the copy rewrote the rows that exist).
pub const CONTROL_TABLE_COPIED: &str = "table-copied";
/// Header of a [`CONTROL_TABLE_COPIED`] record: the copy's position as
/// `commit:index`.
pub const CONTROL_POSITION_HEADER: &str = "tributary.position";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_debezium_naming() {
        let t = TableId::new("public", "orders");
        assert_eq!(TopicNaming::default().topic("shop", &t), "shop.public.orders");
    }

    #[test]
    fn template_substitutes_once() {
        let t = TableId::new("s", "{prefix}");
        let n = TopicNaming::new("cdc-{table}-{schema}-{x}");
        assert_eq!(n.topic("p", &t), "cdc-{prefix}-s-{x}");
    }

    #[test]
    fn dlq_appends_suffix() {
        assert_eq!(TopicNaming::dlq_topic("a.b.c"), "a.b.c.dlq");
    }
}
