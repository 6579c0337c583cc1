//! Oracle types (`ALL_TAB_COLUMNS.DATA_TYPE`, with `DATA_PRECISION` and
//! `DATA_SCALE` given apart or written in the text) to logical types,
//! following Debezium's Oracle connector with `decimal.handling.mode=precise`.

use super::{SourceType, TypeText};
use crate::error::SchemaError;
use crate::model::DataType;

/// Maps an Oracle column type.
///
/// `NUMBER(p)` / `NUMBER(p,0)` become the smallest integer that holds `p`
/// digits, as in Debezium (`p < 3` is Debezium's int8, our `Int16`);
/// `NUMBER` without precision and `FLOAT` are variable-scale decimals.
pub fn data_type(st: &SourceType<'_>) -> Result<DataType, SchemaError> {
    let tt = TypeText::parse(st.type_text).ok_or_else(|| st.unsupported())?;
    let name = if tt.suffix.is_empty() {
        tt.base.clone()
    } else {
        format!("{} {}", tt.base, tt.suffix)
    };
    Ok(match name.as_str() {
        "number" | "numeric" | "decimal" | "integer" | "int" | "smallint" => {
            // `NUMBER(*,s)` has no precision but a scale.
            let precision = st.precision.or_else(|| tt.num(0));
            let scale = st.scale.or_else(|| tt.num(1));
            match (precision, scale, tt.base.as_str()) {
                (None, _, "integer" | "int" | "smallint") => DataType::Decimal { precision: 38, scale: 0 },
                // `INTEGER` as the catalog reports it: `ALL_TAB_COLUMNS`
                // has DATA_TYPE `NUMBER`, no precision and scale 0
                // (`NUMBER(*,0)`): up to 38 integer digits.
                (None, Some(0), _) => DataType::Decimal { precision: 38, scale: 0 },
                (None, _, _) => DataType::VariableDecimal,
                (Some(p), None | Some(0), _) if p < 5 => DataType::Int16,
                (Some(p), None | Some(0), _) if p < 10 => DataType::Int32,
                (Some(p), None | Some(0), _) if p < 19 => DataType::Int64,
                (Some(p), Some(s), _) if s <= p => DataType::Decimal { precision: p, scale: s },
                (Some(p), None, _) => DataType::Decimal { precision: p, scale: 0 },
                // Negative or larger-than-precision scales: exact as text.
                _ => DataType::VariableDecimal,
            }
        }
        "float" | "real" | "double precision" => DataType::VariableDecimal,
        "binary_float" => DataType::Float32,
        "binary_double" => DataType::Float64,
        "boolean" => DataType::Boolean,
        "char" | "varchar2" | "varchar" | "nchar" | "nvarchar2" | "clob" | "nclob" | "long" | "rowid" | "urowid"
        | "xmltype" => DataType::Text,
        "raw" | "long raw" | "blob" => DataType::Bytes,
        "json" => DataType::Json,
        // Oracle's DATE has a time of day.
        "date" => DataType::Timestamp,
        "timestamp" => DataType::Timestamp,
        "timestamp with time zone" | "timestamp with local time zone" => DataType::TimestampTz,
        n if n.starts_with("interval ") => DataType::Interval,
        _ => return Err(st.unsupported()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::TableId;

    #[test]
    fn data_types_map() {
        let t = TableId::new("APP", "T");
        let map = |text: &str, p: Option<u32>, s: Option<u32>| {
            data_type(&SourceType::new(&t, "C", text).with_precision_scale(p, s)).ok()
        };
        assert_eq!(map("NUMBER", Some(10), Some(2)), Some(DataType::Decimal { precision: 10, scale: 2 }));
        assert_eq!(map("NUMBER", Some(9), Some(0)), Some(DataType::Int32));
        assert_eq!(map("NUMBER(4)", None, None), Some(DataType::Int16));
        assert_eq!(map("NUMBER", None, None), Some(DataType::VariableDecimal));
        assert_eq!(map("NUMBER", None, Some(0)), Some(DataType::Decimal { precision: 38, scale: 0 }));
        assert_eq!(map("NUMBER(*,0)", None, None), Some(DataType::Decimal { precision: 38, scale: 0 }));
        assert_eq!(map("NUMBER", None, Some(2)), Some(DataType::VariableDecimal));
        assert_eq!(map("BINARY_FLOAT", None, None), Some(DataType::Float32));
        assert_eq!(map("TIMESTAMP(6) WITH LOCAL TIME ZONE", None, None), Some(DataType::TimestampTz));
        assert_eq!(map("INTERVAL YEAR(2) TO MONTH", None, None), Some(DataType::Interval));
        assert_eq!(map("NCLOB", None, None), Some(DataType::Text));
        assert_eq!(map("LONG RAW", None, None), Some(DataType::Bytes));
        assert_eq!(map("NUMBER(25)", None, None), Some(DataType::Decimal { precision: 25, scale: 0 }));
        assert_eq!(map("TIMESTAMP(6) WITH TIME ZONE", None, None), Some(DataType::TimestampTz));
        assert_eq!(map("TIMESTAMP(6)", None, None), Some(DataType::Timestamp));
        assert_eq!(map("INTERVAL DAY(2) TO SECOND(6)", None, None), Some(DataType::Interval));
        assert_eq!(map("VARCHAR2", None, None), Some(DataType::Text));
        assert!(map("SDO_GEOMETRY", None, None).is_none());
    }
}
