//! MySQL and MariaDB types (as `information_schema.COLUMNS.COLUMN_TYPE`
//! spells them) to logical types, following Debezium's MySQL connector
//! with `decimal.handling.mode=precise`, except where noted.

use super::{decimal, SourceType, TypeText};
use crate::error::SchemaError;
use crate::model::DataType;

/// Maps a MySQL column type.
///
/// Two choices differ from Debezium's defaults, for correctness:
/// `bigint unsigned` is `Decimal(20,0)` (Debezium's
/// `bigint.unsigned.handling.mode=precise`; its default `long` wraps values
/// above 2^63), and `tinyint(1)` is `Boolean` (how MySQL stores `BOOLEAN`;
/// Debezium needs its `TinyIntOneToBooleanConverter` for that).
pub fn data_type(st: &SourceType<'_>) -> Result<DataType, SchemaError> {
    let mut tt = TypeText::parse(st.type_text).ok_or_else(|| st.unsupported())?;
    // Without a display width the modifiers end up in the base name.
    let modifiers = ["unsigned", "signed", "zerofill"];
    let (base, moved): (Vec<&str>, Vec<&str>) = tt.base.split(' ').partition(|w| !modifiers.contains(w));
    let unsigned = tt.suffix.split(' ').chain(moved.iter().copied()).any(|w| w == "unsigned");
    tt.base = base.join(" ");
    Ok(match tt.base.as_str() {
        "tinyint" if tt.num(0) == Some(1) && !unsigned => DataType::Boolean,
        "bool" | "boolean" => DataType::Boolean,
        "tinyint" => DataType::Int16,
        "smallint" if unsigned => DataType::Int32,
        "smallint" => DataType::Int16,
        "mediumint" => DataType::Int32,
        "int" | "integer" if unsigned => DataType::Int64,
        "int" | "integer" => DataType::Int32,
        "bigint" if unsigned => DataType::Decimal { precision: 20, scale: 0 },
        "bigint" => DataType::Int64,
        "serial" => DataType::Decimal { precision: 20, scale: 0 },
        // MySQL's FLOAT(p) is single precision up to p = 24.
        "float" => match (tt.num(0), tt.num(1)) {
            (Some(p), None) if p > 24 => DataType::Float64,
            _ => DataType::Float32,
        },
        "double" | "double precision" | "real" => DataType::Float64,
        "decimal" | "numeric" | "dec" | "fixed" => {
            decimal(st, &tt).unwrap_or(DataType::Decimal { precision: 10, scale: 0 })
        }
        "bit" if tt.num(0).is_none_or(|n| n == 1) => DataType::Boolean,
        "bit" => DataType::Bytes,
        "char" | "varchar" | "tinytext" | "text" | "mediumtext" | "longtext" | "national char" | "national varchar"
        | "nchar" | "nvarchar" => DataType::Text,
        "binary" | "varbinary" | "tinyblob" | "blob" | "mediumblob" | "longblob" => DataType::Bytes,
        "json" => DataType::Json,
        "enum" => DataType::Enum { symbols: tt.args.clone() },
        // Debezium's EnumSet: the comma-separated members as text.
        "set" => DataType::Text,
        "date" => DataType::Date,
        // -838:59:59 to 838:59:59: not a time of day.
        "time" => DataType::TimeSpan,
        "datetime" => DataType::Timestamp,
        "timestamp" => DataType::TimestampTz,
        "year" => DataType::Int32,
        "geometry" | "point" | "linestring" | "polygon" | "multipoint" | "multilinestring" | "multipolygon"
        | "geometrycollection" | "geomcollection" => DataType::Geometry,
        _ => return Err(st.unsupported()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::TableId;

    fn map(text: &str) -> Result<DataType, SchemaError> {
        let t = TableId::new("shop", "t");
        data_type(&SourceType::new(&t, "c", text))
    }

    #[test]
    fn column_types_map() {
        assert_eq!(map("decimal(10,2)").ok(), Some(DataType::Decimal { precision: 10, scale: 2 }));
        assert_eq!(map("tinyint(1)").ok(), Some(DataType::Boolean));
        assert_eq!(map("tinyint(4)").ok(), Some(DataType::Int16));
        assert_eq!(map("int(10) unsigned").ok(), Some(DataType::Int64));
        assert_eq!(map("bigint unsigned").ok(), Some(DataType::Decimal { precision: 20, scale: 0 }));
        assert_eq!(map("bigint(20)").ok(), Some(DataType::Int64));
        assert_eq!(map("datetime(6)").ok(), Some(DataType::Timestamp));
        assert_eq!(map("timestamp(3)").ok(), Some(DataType::TimestampTz));
        assert_eq!(map("time(6)").ok(), Some(DataType::TimeSpan));
        assert_eq!(map("enum('a','b')").ok(), Some(DataType::Enum { symbols: vec!["a".into(), "b".into()] }));
        assert_eq!(map("varchar(255)").ok(), Some(DataType::Text));
        assert_eq!(map("longblob").ok(), Some(DataType::Bytes));
        assert!(map("cursor").is_err());
    }
}
