//! A batch as sinks apply it: split at table drops, grouped by destination
//! table; and the destination table name templates every sink shares.

use tributary_schemas::{ChangeEvent, TableId};

use super::{KafkaPosition, SinkRecord};

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
