//! A batch as sinks apply it: split at table drops, grouped by destination
//! table; and the destination table name templates every sink shares.

use tributary_schemas::{ChangeEvent, TableId};

use super::{KafkaPosition, SinkBatch, SinkRecord};

/// Expands a destination table name template: `{schema}` and `{table}`
/// stand for the source table's schema and name. One pass, so a
/// placeholder-looking text inside a name is kept as it is.
pub fn expand_table_template(template: &str, source: &TableId) -> String {
    let mut table = String::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        table.push_str(&rest[..open]);
        let after = &rest[open..];
        if let Some(r) = after.strip_prefix("{table}") {
            table.push_str(&source.table);
            rest = r;
        } else if let Some(r) = after.strip_prefix("{schema}") {
            table.push_str(&source.schema);
            rest = r;
        } else {
            table.push('{');
            rest = &after[1..];
        }
    }
    table.push_str(rest);
    table
}

/// Checks a destination table name template (see [`expand_table_template`]):
/// the rule it breaks, if any.
pub fn check_table_template(template: &str) -> Result<(), &'static str> {
    if !template.contains("{table}") {
        return Err("must contain {table}, or every source table would land in the same destination table");
    }
    let stripped = template.replace("{table}", "").replace("{schema}", "");
    if stripped.contains('{') || stripped.contains('}') {
        return Err("may only use the placeholders {schema} and {table}");
    }
    Ok(())
}

/// A run of a batch's records, as sinks apply them: a table drop, or the
/// change records between two drops.
#[derive(Debug)]
pub enum Segment<'a> {
    /// The source table was dropped.
    Dropped(&'a TableId),
    /// The source table was copied again at a position: older rows are gone.
    Copied(&'a TableId, tributary_schemas::Position),
    /// The source table is copied again in another position domain: its
    /// rows' positions are forgotten (once per reset id).
    Reset(&'a TableId, u64),
    /// A sequence's state (see [`SinkRecord::Sequence`]).
    Sequence(&'a TableId, &'a tributary_schemas::SequenceState),
    /// A table's objects (see [`SinkRecord::Objects`]).
    Objects(&'a TableId, &'a tributary_schemas::TableObjects),
    /// Change records with no drop in between; `start` is the index of the
    /// first one in the batch.
    Changes {
        /// Index of `records[0]` in the batch.
        start: usize,
        /// The records.
        records: &'a [(KafkaPosition, SinkRecord)],
    },
}

/// Splits records at table drops and copies (each must happen between the
/// changes before it and those after it).
pub fn segments(records: &[(KafkaPosition, SinkRecord)]) -> Vec<Segment<'_>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < records.len() {
        match &records[i].1 {
            SinkRecord::TableDropped(id) => {
                out.push(Segment::Dropped(id));
                i += 1;
            }
            SinkRecord::Copied(id, at) => {
                out.push(Segment::Copied(id, *at));
                i += 1;
            }
            SinkRecord::Reset(id, reset) => {
                out.push(Segment::Reset(id, *reset));
                i += 1;
            }
            SinkRecord::Sequence(id, state) => {
                out.push(Segment::Sequence(id, state));
                i += 1;
            }
            SinkRecord::Objects(id, objects) => {
                out.push(Segment::Objects(id, objects));
                i += 1;
            }
            // Compared before the batch is applied (`Sink::verify`).
            SinkRecord::Verify(..) => i += 1,
            SinkRecord::Change(_) => {
                let end = records[i..]
                    .iter()
                    .position(|(_, r)| !matches!(r, SinkRecord::Change(_)))
                    .map_or(records.len(), |p| i + p);
                out.push(Segment::Changes { start: i, records: &records[i..end] });
                i = end;
            }
        }
    }
    out
}

/// The change events of `records` grouped by destination table, in order
/// of first appearance, each with its index in the batch (`base` + its
/// index in `records`).
pub fn group_by_destination<'a, D: PartialEq>(
    records: &'a [(KafkaPosition, SinkRecord)],
    base: usize,
    destination: impl Fn(&TableId) -> D,
) -> Vec<(D, Vec<(usize, &'a ChangeEvent)>)> {
    let mut groups: Vec<(D, Vec<(usize, &'a ChangeEvent)>)> = Vec::new();
    // A batch is mostly one table: its events go to the last group without
    // rendering their destination name (a template, so allocations) each.
    let mut last: Option<(&'a TableId, usize)> = None;
    for (i, (_, record)) in records.iter().enumerate() {
        if let SinkRecord::Change(ev) = record {
            let g = match last {
                Some((id, g)) if *id == ev.schema.id => g,
                _ => {
                    let dest = destination(&ev.schema.id);
                    let g = match groups.iter().position(|(d, _)| *d == dest) {
                        Some(g) => g,
                        None => {
                            groups.push((dest, Vec::new()));
                            groups.len() - 1
                        }
                    };
                    last = Some((&ev.schema.id, g));
                    g
                }
            };
            groups[g].1.push((base + i, ev));
        }
    }
    groups
}

/// `batch` cut into consecutive parts whose records weigh at most `limit`
/// together (a record heavier than `limit` is a part of its own), for a
/// destination that bounds what one commit holds (Spanner's mutations per
/// commit); `None` when the whole batch fits. Each part carries the offsets
/// of its prefix: the next offset after its last record of each partition
/// it holds, and the batch's own next offsets for the last part (which
/// also cover tombstones and dead letters after the last record). Each
/// part's fence is what the part before it stores, so a crash between two
/// commits resumes after the last one, neither losing nor repeating.
pub fn split_by_weight(
    batch: &SinkBatch,
    limit: usize,
    weight: impl Fn(&SinkRecord) -> usize,
) -> Option<Vec<SinkBatch>> {
    let total: usize = batch.records.iter().map(|(_, r)| weight(r)).sum();
    if total <= limit || batch.records.len() < 2 {
        return None;
    }
    let mut parts: Vec<SinkBatch> = Vec::new();
    let mut expected = batch.expected_offsets.clone();
    let mut start = 0;
    while start < batch.records.len() {
        let mut end = start;
        let mut sum = 0;
        while end < batch.records.len() {
            let w = weight(&batch.records[end].1);
            if end > start && sum + w > limit {
                break;
            }
            sum += w;
            end += 1;
        }
        let records = batch.records[start..end].to_vec();
        let next_offsets = if end == batch.records.len() {
            batch.next_offsets.clone()
        } else {
            let mut next: Vec<(String, i32, i64)> = Vec::new();
            for (at, _) in &records {
                match next.iter_mut().find(|(t, p, _)| *t == at.topic && *p == at.partition) {
                    Some(n) => n.2 = n.2.max(at.offset + 1),
                    None => next.push((at.topic.clone(), at.partition, at.offset + 1)),
                }
            }
            next
        };
        let part_expected = expected
            .iter()
            .filter(|(t, p, _)| next_offsets.iter().any(|(nt, np, _)| nt == t && np == p))
            .cloned()
            .collect();
        for (t, p, n) in &next_offsets {
            // Partitions the runner checks stay checked, from what this
            // part stores.
            if let Some(e) = expected.iter_mut().find(|(et, ep, _)| et == t && ep == p) {
                e.2 = Some(*n);
            }
        }
        parts.push(SinkBatch {
            table: batch.table.clone(),
            records,
            next_offsets,
            expected_offsets: part_expected,
            unit: crate::UnitPart::default(),
        });
        start = end;
    }
    Some(parts)
}

#[cfg(test)]
mod split_tests {
    use super::*;

    fn at(partition: i32, offset: i64) -> KafkaPosition {
        KafkaPosition { topic: "t".into(), partition, offset }
    }

    #[test]
    fn parts_carry_the_offsets_of_their_prefix() {
        let id = TableId::new("s", "t");
        let records: Vec<(KafkaPosition, SinkRecord)> = [(0, 10), (1, 5), (0, 11), (1, 6), (0, 12)]
            .into_iter()
            .map(|(p, o)| (at(p, o), SinkRecord::TableDropped(id.clone())))
            .collect();
        let batch = SinkBatch {
            table: id.clone(),
            records,
            next_offsets: vec![("t".into(), 0, 20), ("t".into(), 1, 7)],
            expected_offsets: vec![("t".into(), 0, Some(10)), ("t".into(), 1, None)],
            unit: crate::UnitPart::default(),
        };
        assert!(split_by_weight(&batch, 5, |_| 1).is_none());
        let parts = split_by_weight(&batch, 2, |_| 1).expect("split");
        assert_eq!(parts.len(), 3);
        assert_eq!(parts[0].next_offsets, vec![("t".to_string(), 0, 11), ("t".to_string(), 1, 6)]);
        assert_eq!(parts[0].expected_offsets, vec![("t".to_string(), 0, Some(10)), ("t".to_string(), 1, None)]);
        assert_eq!(parts[1].next_offsets, vec![("t".to_string(), 0, 12), ("t".to_string(), 1, 7)]);
        assert_eq!(parts[1].expected_offsets, vec![("t".to_string(), 0, Some(11)), ("t".to_string(), 1, Some(6))]);
        // The last part stores the batch's own next offsets.
        assert_eq!(parts[2].next_offsets, batch.next_offsets);
        assert_eq!(parts[2].expected_offsets, vec![("t".to_string(), 0, Some(12)), ("t".to_string(), 1, Some(7))]);
    }
}
