//! Topic names of change events: one topic per table, named like
//! Debezium's (`<prefix>.<schema>.<table>`) unless configured otherwise,
//! and a dead-letter topic beside each.
//!
//! # Which topics belong to a copy
//!
//! A copy's topics are told apart from another copy's by their names alone,
//! also when one copy's prefix is another's plus a dot (`shop` and
//! `shop.eu`): a schema or table name never brings a `.` into a topic name
//! (a name with one is made legal with a hash, like any name Kafka refuses:
//! see [`TopicNaming::topic`]), so with the default template a table topic
//! of copy `p` is exactly `p.<schema>.<table>` with two dot-free parts
//! ([`is_table_topic`]). `shop.eu.public.t` has three parts after `shop.`:
//! it is copy `shop.eu`'s, never copy `shop`'s. A dead-letter topic is a
//! table topic plus the suffix (`.dlq` adds a part), so a source table
//! named `dlq` (`p.<schema>.dlq`, two parts) is a table topic like any
//! other. The offsets topic `p.tributary.offsets` ([`offsets_topic`]) has
//! the shape of a table topic and is left out by name.

use crate::model::TableId;

/// The default template, Debezium's topic naming.
pub const DEFAULT_TEMPLATE: &str = "{prefix}.{schema}.{table}";

/// Suffix of a topic's dead-letter topic.
pub const DLQ_SUFFIX: &str = ".dlq";

/// What follows the prefix in a copy's offsets topic (the source runner's
/// checkpoints): `<prefix>.tributary.offsets`.
pub const OFFSETS_TOPIC_SUFFIX: &str = ".tributary.offsets";

/// The offsets topic of the copy with topic prefix `prefix`.
pub fn offsets_topic(prefix: &str) -> String {
    format!("{prefix}{OFFSETS_TOPIC_SUFFIX}")
}

/// Whether `topic` is a table topic of the copy with prefix `prefix` under
/// the default template: `<prefix>.<schema>.<table>` with two non-empty
/// parts without a dot (see the module documentation), and not the copy's
/// offsets topic.
pub fn is_table_topic(prefix: &str, topic: &str) -> bool {
    TopicNaming::default().is_table_topic(prefix, topic)
}

/// Whether `topic` is the dead-letter topic (`suffix`, e.g. `.dlq`) of a
/// topic for which `is_table` holds. A long topic's dead-letter topic is cut
/// with a hash ([`with_suffix`]), which keeps it a table topic's shape.
pub fn is_dead_letter_topic(topic: &str, suffix: &str, is_table: impl Fn(&str) -> bool) -> bool {
    !suffix.is_empty() && topic.strip_suffix(suffix).is_some_and(is_table)
}

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
    hashed_within(name, name, max)
}

/// `name` made legal with the hash of `hashed` appended: each character
/// outside Kafka's set becomes `_`, the result is cut to leave room for the
/// hash.
fn hashed_within(name: &str, hashed: &str, max: usize) -> String {
    let mut out: String = name.chars().map(|c| if is_legal_char(c) { c } else { '_' }).collect();
    // Every character is ASCII now: byte and char lengths agree.
    out.truncate(max - HASH_SUFFIX_LEN);
    out.push_str(&format!("_{:08x}", fnv1a32(hashed.as_bytes())));
    out
}

/// Whether `topic` is `template` filled in with `prefix` and dot-free,
/// non-empty names (see [`TopicNaming::is_table_topic`]). Backtracks over
/// where each name ends: templates are a few parts long.
fn matches_template(template: &[u8], prefix: &[u8], topic: &[u8]) -> bool {
    const PREFIX: &[u8] = b"{prefix}";
    const SCHEMA: &[u8] = b"{schema}";
    const TABLE: &[u8] = b"{table}";
    if template.is_empty() {
        return topic.is_empty();
    }
    if let Some(rest) = template.strip_prefix(PREFIX) {
        return topic.strip_prefix(prefix).is_some_and(|t| matches_template(rest, prefix, t));
    }
    let name = template.strip_prefix(SCHEMA).or_else(|| template.strip_prefix(TABLE));
    if let Some(rest) = name {
        let longest = topic.iter().take_while(|c| **c != b'.').count();
        return (1..=longest).any(|n| matches_template(rest, prefix, &topic[n..]));
    }
    topic.first() == template.first() && matches_template(&template[1..], prefix, &topic[1..])
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
    ///
    /// A schema or table name with a `.` is treated as a name Kafka
    /// refuses: its dots become `_` and a hash of the whole name is
    /// appended (`order.items` gives `shop.public.order_items_<hash>`), so
    /// the parts of a topic name are the template's own and a copy's topics
    /// are known by their shape (see the module documentation).
    pub fn topic(&self, prefix: &str, table: &TableId) -> String {
        let whole = self.fill(prefix, table);
        if !table.schema.contains('.') && !table.table.contains('.') {
            return legal_topic_name(&whole);
        }
        let undotted = TableId::new(table.schema.replace('.', "_"), table.table.replace('.', "_"));
        hashed_within(&self.fill(prefix, &undotted), &whole, MAX_TOPIC_LEN)
    }

    /// Whether `topic` is a table topic of the copy with prefix `prefix`:
    /// the template with `{prefix}` as `prefix` and each `{schema}` and
    /// `{table}` as one or more topic characters other than `.`, and not
    /// the copy's offsets topic. A topic a name over 249 characters cut
    /// matches as long as the cut left every part of the template (the
    /// default template ends with `{table}`: always).
    pub fn is_table_topic(&self, prefix: &str, topic: &str) -> bool {
        topic != offsets_topic(prefix)
            && matches_template(self.template.as_bytes(), prefix.as_bytes(), topic.as_bytes())
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
        // Legal names, including every legal character but the dot: unchanged.
        assert_eq!(t("Order-Items_2"), "shop.public.Order-Items_2");
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
    fn a_dot_in_a_name_never_adds_a_part_to_the_topic() {
        let n = TopicNaming::default();
        let dotted = n.topic("shop", &TableId::new("public", "order.items"));
        assert!(dotted.starts_with("shop.public.order_items_"), "{dotted}");
        assert_eq!(dotted.len(), "shop.public.order_items_".len() + 8);
        assert_ne!(dotted, n.topic("shop", &TableId::new("public", "order_items")));
        assert_ne!(dotted, n.topic("shop", &TableId::new("public", "order_items_")));
        let schema = n.topic("shop", &TableId::new("eu.public", "t"));
        assert!(schema.starts_with("shop.eu_public.t_"), "{schema}");
        assert!(is_table_topic("shop", &dotted) && is_table_topic("shop", &schema));
        // Copy `shop.eu`'s table topic is never copy `shop`'s.
        let other = n.topic("shop.eu", &TableId::new("public", "t"));
        assert_eq!(other, "shop.eu.public.t");
        assert!(!is_table_topic("shop", &other));
        assert!(is_table_topic("shop.eu", &other));
        assert!(!is_table_topic("shop.eu", &schema));
    }

    #[test]
    fn a_copys_topics_are_known_by_their_shape() {
        assert!(is_table_topic("p", "p.s.t"));
        assert!(is_table_topic("p", "p.s.dlq"), "a table named dlq");
        for not_ours in [
            "p.s",
            "p.s.t.dlq",
            "p.x.s.t",
            "p.tributary.offsets",
            "q.s.t",
            "px.s.t",
            "p..t",
            "p.s.",
            "p.s.t.",
        ] {
            assert!(!is_table_topic("p", not_ours), "{not_ours}");
        }
        let dlq = |t: &str| is_dead_letter_topic(t, DLQ_SUFFIX, |x| is_table_topic("p", x));
        assert!(dlq("p.s.t.dlq") && dlq("p.s.dlq.dlq"));
        assert!(!dlq("p.s.dlq") && !dlq("p.x.s.t.dlq") && !dlq("p.tributary.offsets.dlq"));
        // Other templates: each part as written, names without a dot.
        let n = TopicNaming::new("cdc-{prefix}-{schema}-{table}");
        assert!(n.is_table_topic("p", "cdc-p-s-t"));
        assert!(n.is_table_topic("p", "cdc-p-s-t-x"), "a dash is a name character");
        assert!(!n.is_table_topic("p", "cdc-p-s.t"));
        assert!(!n.is_table_topic("p", "cdc-q-s-t"));
        let mine = n.topic("p", &TableId::new("a.b", "c d"));
        assert!(n.is_table_topic("p", &mine), "{mine}");
        // A long name is cut but keeps its shape.
        let long = TopicNaming::default().topic("p", &TableId::new("s", "x".repeat(300)));
        assert!(is_table_topic("p", &long));
        assert!(is_table_topic("p", &TopicNaming::dlq_topic(&long).replace(".dlq", "")));
        assert!(dlq(&TopicNaming::dlq_topic(&long)));
    }

    #[test]
    fn dlq_appends_suffix() {
        assert_eq!(TopicNaming::dlq_topic("a.b.c"), "a.b.c.dlq");
    }
}
