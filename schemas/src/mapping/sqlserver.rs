//! SQL Server types (`INFORMATION_SCHEMA.COLUMNS.DATA_TYPE`, with
//! `NUMERIC_PRECISION`/`NUMERIC_SCALE` given apart or written in the text)
//! to logical types, following Debezium's SQL Server connector with
//! `decimal.handling.mode=precise` and `time.precision.mode=adaptive`
//! widened to microseconds.

use super::{decimal, SourceType, TypeText};
use crate::error::SchemaError;
use crate::model::DataType;

/// Maps a SQL Server column type.
pub fn data_type(st: &SourceType<'_>) -> Result<DataType, SchemaError> {
    let tt = TypeText::parse(st.type_text).ok_or_else(|| st.unsupported())?;
    Ok(match tt.base.as_str() {
        "bit" => DataType::Boolean,
        // tinyint is 0..=255 in SQL Server: int16 holds it.
        "tinyint" | "smallint" => DataType::Int16,
        "int" => DataType::Int32,
        "bigint" => DataType::Int64,
        "real" => DataType::Float32,
        "float" => match st.precision.or_else(|| tt.num(0)) {
            Some(p) if p <= 24 => DataType::Float32,
            _ => DataType::Float64,
        },
        "decimal" | "numeric" => decimal(st, &tt).unwrap_or(DataType::Decimal { precision: 18, scale: 0 }),
        "money" => DataType::Decimal { precision: 19, scale: 4 },
        "smallmoney" => DataType::Decimal { precision: 10, scale: 4 },
        "char" | "varchar" | "text" | "nchar" | "nvarchar" | "ntext" | "xml" | "sysname" => DataType::Text,
        // hierarchyid as its path text (`/1/3/`, `ToString()`); sql_variant
        // as its value's text (`CAST(... AS nvarchar(4000))`): one column
        // type for values of many base types.
        "hierarchyid" | "sql_variant" => DataType::Text,
        "binary" | "varbinary" | "image" | "rowversion" | "timestamp" => DataType::Bytes,
        "uniqueidentifier" => DataType::Uuid,
        "date" => DataType::Date,
        "time" => DataType::Time,
        "datetime" | "datetime2" | "smalldatetime" => DataType::Timestamp,
        "datetimeoffset" => DataType::TimestampTz,
        "geometry" | "geography" => DataType::Geometry,
        _ => return Err(st.unsupported()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::TableId;

    #[test]
    fn data_types_map() {
        let t = TableId::new("dbo", "t");
        let map = |text: &str, p: Option<u32>, s: Option<u32>| {
            data_type(&SourceType::new(&t, "c", text).with_precision_scale(p, s)).ok()
        };
        assert_eq!(map("decimal", Some(12), Some(2)), Some(DataType::Decimal { precision: 12, scale: 2 }));
        assert_eq!(map("numeric(9,3)", None, None), Some(DataType::Decimal { precision: 9, scale: 3 }));
        assert_eq!(map("uniqueidentifier", None, None), Some(DataType::Uuid));
        assert_eq!(map("datetimeoffset(7)", None, None), Some(DataType::TimestampTz));
        assert_eq!(map("datetime2(7)", None, None), Some(DataType::Timestamp));
        assert_eq!(map("nvarchar(max)", None, None), Some(DataType::Text));
        assert_eq!(map("float", Some(24), None), Some(DataType::Float32));
        assert_eq!(map("sql_variant", None, None), Some(DataType::Text));
        assert_eq!(map("hierarchyid", None, None), Some(DataType::Text));
        assert_eq!(map("rowversion", None, None), Some(DataType::Bytes));
        assert_eq!(map("decimal(38,0)", None, None), Some(DataType::Decimal { precision: 38, scale: 0 }));
        assert!(map("cursor", None, None).is_none());
    }
}
