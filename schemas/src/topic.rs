//! Topic names of change events: one topic per table, named like
//! Debezium's (`<prefix>.<schema>.<table>`) unless configured otherwise,
//! and a dead-letter topic beside each.

use crate::model::TableId;

/// The default template, Debezium's topic naming.
pub const DEFAULT_TEMPLATE: &str = "{prefix}.{schema}.{table}";

/// Suffix of a topic's dead-letter topic.
pub const DLQ_SUFFIX: &str = ".dlq";

/// The longest topic name Kafka accepts.
pub const MAX_TOPIC_LEN: usize = 249;

/// Length of the hash suffix ([`legal_topic_name`]): `_` and 8 hex digits.
const HASH_SUFFIX_LEN: usize = 9;

/// Whether Kafka accepts `c` in a topic name.
fn is_legal_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

/// Whether Kafka accepts `name` as a topic name as it is.
pub fn is_legal_topic_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && name.len() <= MAX_TOPIC_LEN && name.chars().all(is_legal_char)
}

/// 32-bit FNV-1a: stable across Rust versions and platforms (unlike
/// `std`'s hasher), so a table keeps its topic from release to release.
fn fnv1a32(bytes: &[u8]) -> u32 {
    bytes
        .iter()
        .fold(0x811c_9dc5u32, |h, b| (h ^ u32::from(*b)).wrapping_mul(0x0100_0193))
}

/// `name` as a topic name Kafka accepts, deterministically.
///
/// A legal name (only `[a-zA-Z0-9._-]`, at most 249 characters) is kept as
/// it is, so existing topics keep their names. Otherwise each character
/// outside that set becomes `_`, the result is cut to leave room, and
/// `_` plus 8 hex digits of a hash of the whole original name is appended:
/// `order items` and `order_items` (or two long names alike in their first
/// 240 characters) get different topics.
pub fn legal_topic_name(name: &str) -> String {
    legal_topic_name_within(name, MAX_TOPIC_LEN)
}

/// [`legal_topic_name`] with at most `max` characters.
fn legal_topic_name_within(name: &str, max: usize) -> String {
    if is_legal_topic_name(name) && name.len() <= max {
        return name.to_string();
    }
    let mut out: String = name.chars().map(|c| if is_legal_char(c) { c } else { '_' }).collect();
    // Every character is ASCII now: byte and char lengths agree.
    out.truncate(max - HASH_SUFFIX_LEN);
    out.push_str(&format!("_{:08x}", fnv1a32(name.as_bytes())));
    out
}

/// `topic` followed by `suffix` (a dead-letter topic), still a legal topic
/// name: a name that would grow past 249 characters is cut with a hash, as
/// [`legal_topic_name`] does.
pub fn with_suffix(topic: &str, suffix: &str) -> String {
    let whole = format!("{topic}{suffix}");
    if is_legal_topic_name(&whole) {
        return whole;
    }
    let room = MAX_TOPIC_LEN.saturating_sub(suffix.len()).max(HASH_SUFFIX_LEN + 1);
    format!("{}{suffix}", legal_topic_name_within(topic, room))
}

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

    /// The topic of a table: the template filled in, then made a legal
    /// Kafka topic name by [`legal_topic_name`] (a legal name is kept as it
    /// is). The one place table topics are named.
    pub fn topic(&self, prefix: &str, table: &TableId) -> String {
        legal_topic_name(&self.fill(prefix, table))
    }

    /// The template filled in, before it is made legal.
    fn fill(&self, prefix: &str, table: &TableId) -> String {
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
        with_suffix(topic, DLQ_SUFFIX)
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
/// Control record: the table's rows are about to be copied again from a
/// source whose positions may not compare with those the destination holds
/// (a source epoch change, or `source-runner reset`): every existing row's
/// position is forgotten (older than any change), once per reset id in
/// [`CONTROL_RESET_HEADER`], whichever partition's record comes first. The
/// copy's rows then pass the position guard, and the
/// [`CONTROL_TABLE_COPIED`] record after them removes the rows not copied.
pub const CONTROL_TABLE_RESET: &str = "table-reset";
/// Header of a [`CONTROL_TABLE_RESET`] record: the reset's id, a decimal
/// number greater than that of every earlier reset of the table (the
/// source runner's clock in milliseconds when the reset was decided).
pub const CONTROL_RESET_HEADER: &str = "tributary.reset";
/// Header of a control record: the source table's schema (a topic's name
/// may not say it: see [`legal_topic_name`]).
pub const CONTROL_SCHEMA_HEADER: &str = "tributary.source.schema";
/// Header of a control record: the source table's name.
pub const CONTROL_TABLE_NAME_HEADER: &str = "tributary.source.table";

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
        assert_eq!(n.fill("p", &t), "cdc-{prefix}-s-{x}");
        // Braces are no topic characters: the topic is then made legal.
        assert!(is_legal_topic_name(&n.topic("p", &t)));
    }

    #[test]
    fn legal_names_are_kept_and_others_made_legal_without_collisions() {
        let n = TopicNaming::default();
        let t = |table: &str| n.topic("shop", &TableId::new("public", table));
        // Legal names, including every legal character: unchanged.
        assert_eq!(t("Order-Items_2.x"), "shop.public.Order-Items_2.x");
        // Spaces, `$`, non-ASCII: replaced, with a hash of the real name.
        let spaced = t("order items$2");
        assert!(spaced.starts_with("shop.public.order_items_2_"), "{spaced}");
        assert_eq!(spaced.len(), "shop.public.order_items_2_".len() + 8);
        assert!(is_legal_topic_name(&spaced));
        assert_eq!(spaced, t("order items$2"), "deterministic");
        assert_ne!(spaced, t("order_items$2"));
        assert_ne!(spaced, t("order items 2"));
        assert_ne!(t("order_items_2"), spaced, "a legal name never takes a made-up one's place");
        let accented = t("commandé");
        assert!(accented.starts_with("shop.public.command__") && is_legal_topic_name(&accented), "{accented}");
        // Over 249 characters: cut, with a hash, so two long names differ.
        let a = t(&format!("{}a", "x".repeat(300)));
        let b = t(&format!("{}b", "x".repeat(300)));
        assert_eq!(a.len(), MAX_TOPIC_LEN);
        assert!(is_legal_topic_name(&a) && is_legal_topic_name(&b));
        assert_ne!(a, b);
        // Exactly 249 characters is legal and kept.
        let exact = t(&"y".repeat(MAX_TOPIC_LEN - "shop.public.".len()));
        assert_eq!(exact.len(), MAX_TOPIC_LEN);
        assert!(exact.ends_with('y'));
        // The hash is fixed from release to release (topics keep their names).
        assert_eq!(legal_topic_name("a b"), "a_b_10a3f9f2");
        assert_eq!(fnv1a32(b""), 0x811c_9dc5);
        assert_eq!(fnv1a32(b"a"), 0xe40c_292c);
    }

    #[test]
    fn dead_letter_topics_of_long_topics_stay_legal() {
        let long = "z".repeat(MAX_TOPIC_LEN);
        let dlq = TopicNaming::dlq_topic(&long);
        assert!(dlq.ends_with(DLQ_SUFFIX) && is_legal_topic_name(&dlq), "{dlq}");
        assert_ne!(dlq, TopicNaming::dlq_topic(&"z".repeat(MAX_TOPIC_LEN - 1)));
    }

    #[test]
    fn dlq_appends_suffix() {
        assert_eq!(TopicNaming::dlq_topic("a.b.c"), "a.b.c.dlq");
    }
}
