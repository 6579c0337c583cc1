//! Raw records into what the sink applies: change events through the
//! schema registry, control records from their headers
//! ([`ControlRecord`]), and a topic's buffer into one batch.

use std::time::Instant;

use tracing::warn;
use tributary_connectors::{Error, ErrorKind, KafkaPosition, Sink, SinkBatch, SinkRecord};
use tributary_schemas::records::{ControlRecord, RecordError};
use tributary_schemas::{Decoded, EventDecoder, TableId};

use crate::apply::{source_ts, DecodedBatch, RawBatch};
use crate::buffer::RawRecord;
use crate::dead_letters::Stage;
use crate::pipeline::Pipeline;

/// Turns a raw record into what the sink applies: `None` for a tombstone
/// (nothing to do, its offset is still covered). `table` is the topic's
/// table, for records that do not name theirs.
pub async fn decode_record(
    decoder: &mut EventDecoder,
    raw: &RawRecord,
    table: &TableId,
) -> Result<Option<SinkRecord>, Error> {
    if raw.value.is_none() {
        // The source names the table (the topic's name may not: see
        // `legal_topic_name`); records of older runners do not.
        return match ControlRecord::decode(&raw.headers, table) {
            Ok(None) => Ok(None),
            Ok(Some(ControlRecord::TableDropped { table })) => Ok(Some(SinkRecord::TableDropped(table))),
            Ok(Some(ControlRecord::TableCopied { table, at })) => Ok(Some(SinkRecord::Copied(table, at))),
            Ok(Some(ControlRecord::TableReset { table, reset })) => Ok(Some(SinkRecord::Reset(table, reset))),
            Ok(Some(ControlRecord::Sequence { table, state })) => Ok(Some(SinkRecord::Sequence(table, state))),
            Ok(Some(ControlRecord::Objects { table, objects })) => Ok(Some(SinkRecord::Objects(table, objects))),
            Ok(Some(ControlRecord::Verify { table, range })) => {
                let shape = decoder
                    .shape_of(&raw.topic, table, range.schema_id, range.key_schema_id)
                    .await
                    .map_err(Error::from)?;
                Ok(Some(SinkRecord::Verify(shape, range)))
            }
            Err(e @ RecordError::UnknownKind { .. }) => {
                // A newer source runner's kind: this sink has nothing to
                // do with it (as with a tombstone), and says so.
                warn!(topic = %raw.topic, partition = raw.partition, offset = raw.offset, error = %e,
                    "a control record of a kind this sink runner does not know is skipped");
                Ok(None)
            }
            Err(e) => Err(Error::permanent(e.to_string()).with_table(table.clone())),
        };
    }
    match decoder.decode(&raw.topic, raw.key.as_deref(), raw.value.as_deref()).await {
        Ok(Decoded::Change(ev)) => Ok(Some(SinkRecord::Change(ev))),
        Ok(Decoded::Tombstone) => Ok(None),
        // (Registry down: retried; refused: operator; bad bytes: permanent.)
        Err(e) => Err(Error::from(e)),
    }
}

/// The table a record is about.
pub fn record_table(record: &SinkRecord) -> &TableId {
    record.table()
}

/// The source table of a topic named `<prefix>.<schema>.<table>` (or, without
/// a known prefix, its last two dot-separated parts).
pub fn table_from_topic(topic: &str, prefix: Option<&str>) -> TableId {
    let rest = prefix.and_then(|p| topic.strip_prefix(p)).and_then(|r| r.strip_prefix('.'));
    if let Some(rest) = rest {
        if let Some((s, t)) = rest.split_once('.') {
            return TableId::new(s, t);
        }
    }
    let mut parts = topic.rsplitn(3, '.');
    let table = parts.next().unwrap_or(topic);
    let schema = parts.next().unwrap_or("");
    TableId::new(schema, table)
}

impl<S: Sink + 'static> Pipeline<S> {
    /// The source table of `topic`: as its records named it, once seen.
    pub(crate) fn table_of(&self, topic: &str) -> TableId {
        if let Some(t) = self.tables.get(topic) {
            return t.clone();
        }
        table_from_topic(topic, self.config.prefix.as_deref())
    }

    /// Decodes a topic's buffer into a batch (what cannot be decoded is
    /// dead-lettered now) and takes the buffer out of the buffers: records
    /// that arrive meanwhile start a new one.
    pub(crate) async fn prepare(&mut self, topic: &str) -> Result<Option<DecodedBatch>, (TableId, Error)> {
        let Some(count) = self.buffers.get(topic).map(|b| b.records.len()) else {
            return Ok(None);
        };
        let fallback = self.table_of(topic);
        let started = Instant::now();
        let mut batch_records = Vec::with_capacity(count);
        let mut raw_index: Vec<usize> = Vec::with_capacity(count);
        let mut table: Option<TableId> = None;
        // The lane of every topic: its records name their own topics, the
        // transaction topic's say where the batch leaves the destination.
        let lane = self.buffers.lane.is_some();
        let mut end: Option<(KafkaPosition, usize, crate::transactions::End)> = None;
        let mut transactions = 0u64;
        let mut i = 0;
        while let Some(raw) = self.buffers.get(topic).and_then(|b| b.records.get(i)) {
            if lane && self.buffers.lane.as_deref() == Some(raw.topic.as_str()) {
                if let Some(e) = crate::transactions::read_end(raw) {
                    transactions += 1;
                    end = Some((raw.position(), i, e));
                }
                i += 1;
                continue;
            }
            let own;
            let fallback = if lane {
                own = self.table_of(&raw.topic);
                &own
            } else {
                &fallback
            };
            match decode_record(&mut self.decoder, raw, fallback).await {
                Ok(Some(record)) => {
                    if table.is_none() {
                        table = Some(record_table(&record).clone());
                    }
                    if lane && !self.tables.contains_key(&raw.topic) {
                        self.tables.insert(raw.topic.clone(), record_table(&record).clone());
                    }
                    batch_records.push((raw.position(), record));
                    raw_index.push(i);
                    i += 1;
                }
                Ok(None) => i += 1,
                Err(e) if e.kind() == ErrorKind::Permanent => {
                    let raw = raw.clone();
                    let t = fallback.clone();
                    self.dead_letter(&raw, Stage::Decode, &e, &t)
                        .await
                        .map_err(|e| (t.clone(), e))?;
                    if let Some(b) = self.buffers.get_mut(topic) {
                        b.remove(i);
                    }
                }
                Err(e) => return Err((table.unwrap_or_else(|| fallback.clone()), e)),
            }
        }
        let table = table.unwrap_or(fallback);
        if !lane {
            self.tables.insert(topic.to_string(), table.clone());
        }
        // The moment the batch leaves the destination in, written with it.
        let consistent = match end {
            Some((at, raw_at, end)) => {
                if let Some(row) =
                    crate::transactions::consistent_as_of_event(&end, &self.config.consumer_group, &batch_records)
                {
                    batch_records.push((at, row));
                    raw_index.push(raw_at);
                }
                Some(end)
            }
            None => None,
        };
        let Some(buf) = self.buffers.take(topic) else {
            return Ok(None);
        };
        let next_offsets: Vec<(String, i32, i64)> = buf.offsets().map(|(t, p, o)| (t.to_string(), p, o)).collect();
        let oldest = source_ts(&batch_records).min();
        if lane {
            // Each table of the lane's batch waits from its own oldest change.
            let bookkeeping = crate::transactions::consistent_as_of_table();
            for t in crate::apply::tables_of(&batch_records)
                .iter()
                .filter(|t| t.table != bookkeeping)
            {
                self.telemetry.record_pending(&(self.labeler)(&t.table), t.oldest);
            }
        } else if let Some(ts) = oldest {
            self.telemetry.record_pending(&(self.labeler)(&table), ts);
        }
        // (Empty unless the lane waits for whole transactions.)
        let spans = self.transactions.spanning.clone();
        let batch = SinkBatch {
            table: table.clone(),
            records: batch_records,
            next_offsets,
            expected_offsets: Vec::new(),
            // Source transactions over the memory bound whose END is not in
            // the lane yet: their destination transaction stays open.
            unit: tributary_connectors::UnitPart { continues: false, more: !spans.is_empty() },
        };
        Ok(Some(DecodedBatch {
            raw: RawBatch {
                topic: topic.to_string(),
                table,
                buf,
                raw_index,
                started,
                decoded: started.elapsed(),
                oldest,
                consistent,
                transactions,
                spans,
            },
            batch,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_name_their_table() {
        assert_eq!(table_from_topic("shop.public.orders", Some("shop")), TableId::new("public", "orders"));
        assert_eq!(table_from_topic("a.b.shop.public.orders", None), TableId::new("public", "orders"));
        assert_eq!(
            table_from_topic("my.shop.public.order.items", Some("my.shop")),
            TableId::new("public", "order.items")
        );
    }

    #[tokio::test]
    async fn a_control_record_names_its_table_and_an_unknown_kind_is_skipped() {
        use tributary_schemas::records::control::{CONTROL_HEADER, SCHEMA_HEADER, TABLE_DROPPED, TABLE_NAME_HEADER};
        let registry = tributary_schemas::Registry::new("http://127.0.0.1:1").expect("registry client");
        let mut decoder = EventDecoder::new(registry);
        let control = |kind: &str, named: bool| {
            let mut headers = vec![(CONTROL_HEADER.to_string(), Some(kind.as_bytes().to_vec()))];
            if named {
                headers.push((SCHEMA_HEADER.to_string(), Some(b"public".to_vec())));
                headers.push((TABLE_NAME_HEADER.to_string(), Some(b"order items$2".to_vec())));
            }
            RawRecord {
                topic: "shop.public.order_items_2_0c2b1c53".into(),
                partition: 0,
                offset: 7,
                key: None,
                value: None,
                headers,
            }
        };
        let from_topic = table_from_topic("shop.public.order_items_2_0c2b1c53", Some("shop"));
        let decoded = decode_record(&mut decoder, &control(TABLE_DROPPED, true), &from_topic)
            .await
            .expect("decoded");
        assert_eq!(decoded, Some(SinkRecord::TableDropped(TableId::new("public", "order items$2"))));
        // An older source runner's record, without the names: the topic's.
        let decoded = decode_record(&mut decoder, &control(TABLE_DROPPED, false), &from_topic)
            .await
            .expect("decoded");
        assert_eq!(decoded, Some(SinkRecord::TableDropped(from_topic.clone())));
        // A newer source runner's kind: skipped, not dead-lettered.
        let decoded = decode_record(&mut decoder, &control("table-verified", true), &from_topic).await;
        assert_eq!(decoded.expect("skipped"), None);
        // A known kind without what it needs: permanent (dead-lettered).
        let e = decode_record(&mut decoder, &control("table-reset", true), &from_topic)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Permanent);
    }
}
