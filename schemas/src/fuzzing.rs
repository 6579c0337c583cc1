//! The decoder's fuzzing entry point, shared by the cargo-fuzz target
//! (`fuzz/fuzz_targets/decode_value.rs`, needs nightly) and an always-on
//! test that feeds it random bytes on stable, so CI exercises the same code.

use std::sync::{Mutex, OnceLock, PoisonError};

use crate::avro::{envelope, EnvelopeOptions};
use crate::decoder::CompiledEnvelope;
use crate::model::{Column, DataType, TableId, TableSchema};

const DEBEZIUM_PG_VALUE: &str = include_str!("../tests/debezium/postgres.value.avsc");
const DEBEZIUM_PG_KEY: &str = include_str!("../tests/debezium/postgres.key.avsc");
const DEBEZIUM_MYSQL_VALUE: &str = include_str!("../tests/debezium/mysql.value.avsc");
const DEBEZIUM_MYSQL_KEY: &str = include_str!("../tests/debezium/mysql.key.avsc");

/// A table with one column of every logical type, nullable and not.
fn every_type_table() -> TableSchema {
    let types = [
        DataType::Boolean,
        DataType::Int16,
        DataType::Int32,
        DataType::Int64,
        DataType::Float32,
        DataType::Float64,
        DataType::Decimal { precision: 12, scale: 2 },
        DataType::Decimal { precision: 60, scale: 10 },
        DataType::VariableDecimal,
        DataType::Text,
        DataType::Json,
        DataType::Uuid,
        DataType::Bytes,
        DataType::Bits { length: 12 },
        DataType::Date,
        DataType::Time,
        DataType::TimeSpan,
        DataType::Timestamp,
        DataType::TimestampTz,
        DataType::Interval,
        DataType::Enum { symbols: vec!["a".into(), "b".into()] },
        DataType::Array(Box::new(DataType::Array(Box::new(DataType::Int32)))),
        DataType::Geometry,
    ];
    let columns = types
        .iter()
        .enumerate()
        .flat_map(|(i, t)| {
            [false, true].map(|nullable| Column {
                name: format!("c{i}_{nullable}"),
                data_type: t.clone(),
                nullable,
                source_type: String::new(),
                default: None,
                aliases: Vec::new(),
                column_id: None,
            })
        })
        .collect();
    TableSchema {
        id: TableId::new("public", "fuzz"),
        columns,
        key: vec!["c3_false".into()],
        dropped: Vec::new(),
    }
}

fn plans() -> &'static [Mutex<CompiledEnvelope>] {
    static PLANS: OnceLock<Vec<Mutex<CompiledEnvelope>>> = OnceLock::new();
    PLANS.get_or_init(|| {
        let mut texts: Vec<(String, Option<String>)> = vec![
            (DEBEZIUM_PG_VALUE.into(), Some(DEBEZIUM_PG_KEY.into())),
            (DEBEZIUM_MYSQL_VALUE.into(), Some(DEBEZIUM_MYSQL_KEY.into())),
        ];
        for connector in ["postgresql", "mysql"] {
            // Fixed inputs that the unit tests cover: failing here would be
            // a bug in this crate, and the fuzzer should report it loudly.
            if let Ok(s) = envelope(&every_type_table(), "fuzz.public.t", &EnvelopeOptions::for_connector(connector)) {
                texts.push((s.value, s.key));
            }
        }
        texts
            .iter()
            .filter_map(|(v, k)| CompiledEnvelope::new("fuzz", v, k.as_deref()).ok())
            .map(Mutex::new)
            .collect()
    })
}

/// Decodes `data` as: one byte choosing a writer schema, then an Avro
/// datum; with the byte 255, the rest is compiled as a schema instead.
/// Returns whether the datum decoded; must never panic.
pub fn decode_arbitrary(data: &[u8]) -> bool {
    let Some((&selector, rest)) = data.split_first() else {
        return false;
    };
    if selector == 255 {
        return std::str::from_utf8(rest)
            .ok()
            .is_some_and(|text| CompiledEnvelope::new("fuzz", text, None).is_ok());
    }
    let plans = plans();
    if plans.is_empty() {
        return false;
    }
    let plan = &plans[usize::from(selector) % plans.len()];
    let mut plan = plan.lock().unwrap_or_else(PoisonError::into_inner);
    plan.decode_datum("fuzz", rest).is_ok()
}

/// How many fixed schemas [`decode_arbitrary`] chooses from.
pub fn schema_count() -> usize {
    plans().len()
}
