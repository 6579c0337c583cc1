//! PostgreSQL types (as `format_type(atttypid, atttypmod)` spells them) to
//! logical types, following Debezium's PostgreSQL connector with
//! `decimal.handling.mode=precise`, `time.precision.mode=adaptive_time_microseconds`
//! and `hstore.handling.mode=json`.

use super::{decimal, SourceType, TypeText};
use crate::error::SchemaError;
use crate::model::DataType;

/// Maps a PostgreSQL column type. User-defined enums need their labels
/// ([`SourceType::with_enum_labels`]); their type text is the enum's name
/// or `USER-DEFINED`.
pub fn data_type(st: &SourceType<'_>) -> Result<DataType, SchemaError> {
    if let Some(labels) = st.enum_labels {
        let text = st.type_text.trim();
        // An array of an enum is `mood[]`.
        if let Some(_inner) = text.strip_suffix("[]") {
            return Ok(DataType::Array(Box::new(DataType::Enum { symbols: labels.to_vec() })));
        }
        return Ok(DataType::Enum { symbols: labels.to_vec() });
    }
    map_text(st, st.type_text).ok_or_else(|| st.unsupported())
}

fn map_text(st: &SourceType<'_>, text: &str) -> Option<DataType> {
    let text = text.trim();
    if let Some(inner) = text.strip_suffix("[]") {
        // Precision and scale given apart describe the element type.
        return Some(DataType::Array(Box::new(map_text(st, inner)?)));
    }
    let tt = TypeText::parse(text)?;
    let name = if tt.suffix.is_empty() {
        tt.base.clone()
    } else {
        format!("{} {}", tt.base, tt.suffix)
    };
    // Schema-qualified and quoted names: `public.geometry`, `"char"`.
    let name = name.trim_matches('"');
    let name = match name.rsplit_once('.') {
        Some((_, n)) if !name.contains(' ') => n.trim_matches('"'),
        _ => name,
    };
    Some(match name {
        "smallint" | "int2" | "smallserial" => DataType::Int16,
        "integer" | "int" | "int4" | "serial" => DataType::Int32,
        "bigint" | "int8" | "bigserial" | "oid" | "xid8" => DataType::Int64,
        "real" | "float4" => DataType::Float32,
        "double precision" | "float8" => DataType::Float64,
        "float" => match tt.num(0) {
            Some(p) if p <= 24 => DataType::Float32,
            _ => DataType::Float64,
        },
        "numeric" | "decimal" => decimal(st, &tt).unwrap_or(DataType::VariableDecimal),
        // Debezium: money as decimal with `money.fraction.digits` (2).
        "money" => DataType::Decimal { precision: 19, scale: 2 },
        "boolean" | "bool" => DataType::Boolean,
        "bit" if tt.num(0).is_none_or(|n| n == 1) => DataType::Boolean,
        // Debezium's Bits: exact, the bit count being the column's.
        "bit" => DataType::Bits { length: tt.num(0)? },
        // Debezium's Bits would lose the value's own length (`0101` and
        // `101` are one number): PostgreSQL's text is exact.
        "bit varying" | "varbit" => DataType::Text,
        "character varying" | "varchar" | "character" | "char" | "bpchar" | "text" | "name" | "citext" | "xml"
        | "inet" | "cidr" | "macaddr" | "macaddr8" | "tsvector" | "tsquery" | "ltree" | "int4range" | "int8range"
        | "numrange" | "tsrange" | "tstzrange" | "daterange" | "int4multirange" | "int8multirange"
        | "nummultirange" | "tsmultirange" | "tstzmultirange" | "datemultirange" | "pg_lsn" | "txid_snapshot" => {
            DataType::Text
        }
        // The rest of PostgreSQL 15's built-in types a table can hold, as
        // their text: geometry, `jsonpath`, snapshots, system identifiers,
        // the `reg*` names, ACL items, vectors of oids.
        "point" | "line" | "lseg" | "box" | "path" | "polygon" | "circle" | "jsonpath" | "pg_snapshot" | "xid"
        | "cid" | "tid" | "regclass" | "regcollation" | "regconfig" | "regdictionary" | "regnamespace" | "regoper"
        | "regoperator" | "regproc" | "regprocedure" | "regrole" | "regtype" | "aclitem" | "int2vector"
        | "oidvector" | "refcursor" | "pg_node_tree" => DataType::Text,
        // Debezium's ZonedTime is ISO text with the offset; no logical type
        // keeps the offset, so the text is the value.
        "time with time zone" | "timetz" => DataType::Text,
        "json" | "jsonb" | "hstore" => DataType::Json,
        "uuid" => DataType::Uuid,
        "bytea" => DataType::Bytes,
        "date" => DataType::Date,
        "time" | "time without time zone" => DataType::Time,
        "timestamp" | "timestamp without time zone" => DataType::Timestamp,
        "timestamp with time zone" | "timestamptz" => DataType::TimestampTz,
        n if n == "interval" || n.starts_with("interval ") => DataType::Interval,
        "geometry" | "geography" => DataType::Geometry,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::TableId;

    fn map(text: &str) -> Result<DataType, SchemaError> {
        let t = TableId::new("public", "t");
        data_type(&SourceType::new(&t, "c", text))
    }

    #[test]
    fn format_type_texts_map() {
        assert_eq!(map("numeric(12,2)").ok(), Some(DataType::Decimal { precision: 12, scale: 2 }));
        assert_eq!(map("numeric").ok(), Some(DataType::VariableDecimal));
        assert_eq!(map("character varying(40)").ok(), Some(DataType::Text));
        assert_eq!(map("timestamp with time zone").ok(), Some(DataType::TimestampTz));
        assert_eq!(map("timestamp(3) without time zone").ok(), Some(DataType::Timestamp));
        assert_eq!(map("time(6) without time zone").ok(), Some(DataType::Time));
        assert_eq!(map("integer[]").ok(), Some(DataType::Array(Box::new(DataType::Int32))));
        assert_eq!(map("interval year to month").ok(), Some(DataType::Interval));
        assert_eq!(map("\"char\"").ok(), Some(DataType::Text));
        assert_eq!(map("public.geometry(Point,4326)").ok(), Some(DataType::Geometry));
        assert_eq!(map("bit(1)").ok(), Some(DataType::Boolean));
        assert_eq!(map("bit(8)").ok(), Some(DataType::Bits { length: 8 }));
        assert_eq!(map("bit varying(8)").ok(), Some(DataType::Text));
        assert_eq!(map("bit varying").ok(), Some(DataType::Text));
        for text in [
            "point",
            "box",
            "polygon",
            "circle",
            "line",
            "lseg",
            "path",
            "jsonpath",
            "pg_snapshot",
            "regtype",
        ] {
            assert_eq!(map(text).ok(), Some(DataType::Text), "{text}");
        }
        assert_eq!(map("box[]").ok(), Some(DataType::Array(Box::new(DataType::Text))));
        assert_eq!(map("jsonb").ok(), Some(DataType::Json));
    }

    #[test]
    fn enums_need_labels_and_unknowns_fail() {
        let t = TableId::new("public", "t");
        let labels = vec!["sad".to_string(), "happy".to_string()];
        let st = SourceType::new(&t, "mood", "USER-DEFINED").with_enum_labels(&labels);
        assert_eq!(data_type(&st).ok(), Some(DataType::Enum { symbols: labels.clone() }));
        let err = map("USER-DEFINED").expect_err("unknown");
        assert_eq!(err.column(), Some("c"));
        assert!(map("public.pair").is_err());
    }
}
