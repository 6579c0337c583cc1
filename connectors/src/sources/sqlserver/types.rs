//! SQL Server column types to the model's [`DataType`], the select
//! expression that reads each type exactly, and the decoding of the values
//! tiberius hands over ([`tiberius::ColumnData`]) into [`Value`]s.
//!
//! tiberius decodes the TDS wire format (MS-TDS 2.2.5.5, "Data Type
//! Definitions":
//! <https://learn.microsoft.com/openspecs/windows_protocols/ms-tds/ffb02215-af07-4b50-8545-1fd522106c68>)
//! into day and fraction counts for the temporal types; the conversions to
//! epoch days and microseconds below are ours and follow that section.

use tributary_schemas::mapping::{sqlserver, SourceType};
use tributary_schemas::{DataType, TableId, Value};

use crate::error::{Error, Result};

/// Days from 0001-01-01 (the epoch of `date`, `datetime2` and
/// `datetimeoffset` on the wire, MS-TDS 2.2.5.5.1.9) to 1970-01-01.
pub const DAYS_0001_TO_1970: i64 = 719_162;
/// Days from 1900-01-01 (the epoch of `datetime` and `smalldatetime`,
/// MS-TDS 2.2.5.5.1.8) to 1970-01-01.
pub const DAYS_1900_TO_1970: i64 = 25_567;
const MICROS_PER_DAY: i64 = 86_400_000_000;

/// A column as the catalog describes it (`sys.columns` /
/// `cdc.captured_columns` with `sys.types`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnDef {
    /// Column name.
    pub name: String,
    /// Type as SQL Server spells it, with its length, precision or scale
    /// (`decimal(38,4)`, `nvarchar(max)`, `datetime2(7)`).
    pub type_text: String,
    /// Whether it accepts NULL.
    pub nullable: bool,
}

impl ColumnDef {
    /// A column definition.
    pub fn new(name: &str, type_text: &str, nullable: bool) -> Self {
        Self {
            name: name.into(),
            type_text: type_text.into(),
            nullable,
        }
    }

    /// The base type name, lower case (`datetime2(7)` -> `datetime2`).
    pub fn base(&self) -> String {
        self.type_text.split('(').next().unwrap_or("").trim().to_ascii_lowercase()
    }
}

/// The logical type of a SQL Server column.
pub fn map_type(table: &TableId, column: &ColumnDef) -> Result<DataType> {
    Ok(sqlserver::data_type(&SourceType::new(table, &column.name, &column.type_text))?)
}

/// `[name]`, with `]` doubled (T-SQL's delimited identifiers).
pub fn quote_ident(name: &str) -> String {
    format!("[{}]", name.replace(']', "]]"))
}

/// `N'text'`, with `'` doubled.
pub fn quote_literal(text: &str) -> String {
    format!("N'{}'", text.replace('\'', "''"))
}

/// The select-list expression reading `column` exactly, aliased to its name.
///
/// tiberius reads `money` as an `f64` (`value / 1e4`, exact only below
/// 2^53 / 10^4), so money is cast to the decimal it is. `hierarchyid`,
/// `geometry` and `geography` are CLR types whose serialization is private:
/// their documented text and WKB forms are read instead. A `sql_variant`
/// becomes its value's text.
pub fn select_expr(column: &ColumnDef) -> String {
    let q = quote_ident(&column.name);
    let expr = match column.base().as_str() {
        "money" => format!("CAST({q} AS decimal(19,4))"),
        "smallmoney" => format!("CAST({q} AS decimal(10,4))"),
        "hierarchyid" => format!("{q}.ToString()"),
        "geometry" | "geography" => format!("{q}.STAsBinary()"),
        "sql_variant" => format!("CAST({q} AS nvarchar(4000))"),
        _ => return q,
    };
    format!("{expr} AS {q}")
}

/// A decimal's canonical text from its unscaled value and scale
/// (`-12340`, 3 -> `-12.340`).
pub fn decimal_text(unscaled: i128, scale: u8) -> String {
    let digits = unscaled.unsigned_abs().to_string();
    let sign = if unscaled < 0 { "-" } else { "" };
    let scale = usize::from(scale);
    if scale == 0 {
        return format!("{sign}{digits}");
    }
    let padded = format!("{digits:0>width$}", width = scale + 1);
    let (int, frac) = padded.split_at(padded.len() - scale);
    format!("{sign}{int}.{frac}")
}

/// Microseconds of a `time` value of `increments` units of 10^-`scale`
/// seconds (MS-TDS 2.2.5.5.1.10); scale 7 (100 ns) is truncated to
/// microseconds, as the model keeps them.
pub fn time_micros(increments: u64, scale: u8) -> Result<i64> {
    let micros = if scale <= 6 {
        increments.checked_mul(10u64.pow(u32::from(6 - scale)))
    } else {
        10u64.checked_pow(u32::from(scale - 6)).map(|d| increments / d)
    };
    micros
        .and_then(|m| i64::try_from(m).ok())
        .filter(|m| *m < MICROS_PER_DAY)
        .ok_or_else(|| Error::permanent(format!("a time value of scale {scale} is beyond one day")))
}

/// Microseconds since 1970 of a `datetime`: days since 1900-01-01 and
/// 1/300 s ticks since midnight (MS-TDS 2.2.5.5.1.8), rounded to the
/// nearest microsecond.
pub fn datetime_micros(days: i32, ticks: u32) -> i64 {
    (i64::from(days) - DAYS_1900_TO_1970) * MICROS_PER_DAY + (i64::from(ticks) * 10_000 + 1) / 3
}

fn mismatch(table: &TableId, column: &ColumnDef, got: &str) -> Error {
    Error::permanent(format!("column {} of type {} came as a {got} value", column.name, column.type_text))
        .with_table(table.clone())
        .with_column(column.name.clone())
}

/// The model's value of a column of type `dt` as tiberius decoded it. A
/// value of a kind the type does not have is a permanent error naming the
/// column and its type, never the value.
pub fn decode(data: tiberius::ColumnData<'_>, dt: &DataType, table: &TableId, column: &ColumnDef) -> Result<Value> {
    use tiberius::ColumnData as C;
    let bad = |got: &str| mismatch(table, column, got);
    Ok(match data {
        C::U8(None)
        | C::I16(None)
        | C::I32(None)
        | C::I64(None)
        | C::F32(None)
        | C::F64(None)
        | C::Bit(None)
        | C::String(None)
        | C::Guid(None)
        | C::Binary(None)
        | C::Numeric(None)
        | C::Xml(None)
        | C::DateTime(None)
        | C::SmallDateTime(None)
        | C::Time(None)
        | C::Date(None)
        | C::DateTime2(None)
        | C::DateTimeOffset(None) => Value::Null,
        C::Bit(Some(b)) => match dt {
            DataType::Boolean => Value::Boolean(b),
            _ => return Err(bad("bit")),
        },
        C::U8(Some(v)) => int(i64::from(v), dt).ok_or_else(|| bad("tinyint"))?,
        C::I16(Some(v)) => int(i64::from(v), dt).ok_or_else(|| bad("smallint"))?,
        C::I32(Some(v)) => int(i64::from(v), dt).ok_or_else(|| bad("int"))?,
        C::I64(Some(v)) => int(v, dt).ok_or_else(|| bad("bigint"))?,
        C::F32(Some(v)) => match dt {
            DataType::Float32 => Value::Float32(v),
            DataType::Float64 => Value::Float64(f64::from(v)),
            _ => return Err(bad("real")),
        },
        C::F64(Some(v)) => match dt {
            DataType::Float64 => Value::Float64(v),
            // money read without its cast: refuse rather than round.
            _ => return Err(bad("float")),
        },
        C::Numeric(Some(n)) => match dt {
            DataType::Decimal { .. } => Value::Decimal(decimal_text(n.value(), n.scale())),
            _ => return Err(bad("decimal")),
        },
        C::String(Some(s)) => match dt {
            DataType::Text => Value::Text(s.into_owned()),
            _ => return Err(bad("text")),
        },
        C::Xml(Some(x)) => match dt {
            DataType::Text => Value::Text(x.into_owned().into_string()),
            _ => return Err(bad("xml")),
        },
        C::Guid(Some(u)) => match dt {
            DataType::Uuid => Value::Uuid(u),
            _ => return Err(bad("uniqueidentifier")),
        },
        C::Binary(Some(b)) => match dt {
            DataType::Bytes => Value::Bytes(b.into_owned()),
            DataType::Geometry => Value::Geometry(b.into_owned()),
            _ => return Err(bad("binary")),
        },
        C::Date(Some(d)) => match dt {
            DataType::Date => {
                let days = i64::from(d.days()) - DAYS_0001_TO_1970;
                Value::Date(i32::try_from(days).map_err(|_| bad("date"))?)
            }
            _ => return Err(bad("date")),
        },
        C::Time(Some(t)) => match dt {
            DataType::Time => Value::Time(time_micros(t.increments(), t.scale())?),
            _ => return Err(bad("time")),
        },
        C::DateTime(Some(d)) => match dt {
            DataType::Timestamp => Value::Timestamp(datetime_micros(d.days(), d.seconds_fragments())),
            _ => return Err(bad("datetime")),
        },
        C::SmallDateTime(Some(d)) => match dt {
            // Days since 1900-01-01 and minutes since midnight.
            DataType::Timestamp => Value::Timestamp(
                (i64::from(d.days()) - DAYS_1900_TO_1970) * MICROS_PER_DAY
                    + i64::from(d.seconds_fragments()) * 60_000_000,
            ),
            _ => return Err(bad("smalldatetime")),
        },
        C::DateTime2(Some(d)) => match dt {
            DataType::Timestamp => Value::Timestamp(datetime2_micros(d)?),
            _ => return Err(bad("datetime2")),
        },
        // The date and time of a datetimeoffset are UTC on the wire; the
        // offset only says where it was written (MS-TDS 2.2.5.5.1.10).
        C::DateTimeOffset(Some(d)) => match dt {
            DataType::TimestampTz => Value::TimestampTz(datetime2_micros(d.datetime2())?),
            _ => return Err(bad("datetimeoffset")),
        },
    })
}

fn datetime2_micros(d: tiberius::time::DateTime2) -> Result<i64> {
    let days = i64::from(d.date().days()) - DAYS_0001_TO_1970;
    Ok(days * MICROS_PER_DAY + time_micros(d.time().increments(), d.time().scale())?)
}

/// An integer as the column's integer type; `None` when it does not fit.
fn int(v: i64, dt: &DataType) -> Option<Value> {
    Some(match dt {
        DataType::Int16 => Value::Int16(i16::try_from(v).ok()?),
        DataType::Int32 => Value::Int32(i32::try_from(v).ok()?),
        DataType::Int64 => Value::Int64(v),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::borrow::Cow;
    use tiberius::numeric::Numeric;
    use tiberius::time::{Date, DateTime, DateTime2, DateTimeOffset, SmallDateTime, Time};
    use tiberius::ColumnData as C;

    fn t() -> TableId {
        TableId::new("dbo", "t")
    }

    fn dec(type_text: &str, data: C<'static>) -> Result<Value> {
        let col = ColumnDef::new("c", type_text, true);
        let dt = map_type(&t(), &col)?;
        decode(data, &dt, &t(), &col)
    }

    #[test]
    fn numbers_bits_and_decimals() {
        assert_eq!(dec("tinyint", C::U8(Some(255))).unwrap(), Value::Int16(255));
        assert_eq!(dec("int", C::I32(Some(-7))).unwrap(), Value::Int32(-7));
        assert_eq!(dec("bigint", C::I64(Some(i64::MIN))).unwrap(), Value::Int64(i64::MIN));
        assert_eq!(dec("bit", C::Bit(Some(true))).unwrap(), Value::Boolean(true));
        assert_eq!(dec("real", C::F32(Some(1.5))).unwrap(), Value::Float32(1.5));
        assert_eq!(dec("float", C::F64(Some(2.25))).unwrap(), Value::Float64(2.25));
        // decimal(38): the whole i128 range of 38 digits, and its scale kept.
        let max = 10i128.pow(38) - 1;
        assert_eq!(
            dec("decimal(38,0)", C::Numeric(Some(Numeric::new_with_scale(max, 0)))).unwrap(),
            Value::Decimal("9".repeat(38))
        );
        assert_eq!(
            dec("decimal(12,4)", C::Numeric(Some(Numeric::new_with_scale(-123_400, 4)))).unwrap(),
            Value::Decimal("-12.3400".into())
        );
        assert_eq!(decimal_text(5, 3), "0.005");
        assert_eq!(decimal_text(-5, 3), "-0.005");
        // money arrives through its cast to decimal(19,4): exact beyond 2^53.
        assert_eq!(
            dec("money", C::Numeric(Some(Numeric::new_with_scale(i128::from(i64::MAX), 4)))).unwrap(),
            Value::Decimal("922337203685477.5807".into())
        );
        // ... and as tiberius's own f64 it is refused, not rounded.
        assert!(dec("money", C::F64(Some(1.0))).is_err());
        assert_eq!(dec("int", C::I32(None)).unwrap(), Value::Null);
    }

    #[test]
    fn text_xml_guid_and_bytes() {
        assert_eq!(dec("nvarchar(max)", C::String(Some(Cow::Borrowed("héllo")))).unwrap(), Value::Text("héllo".into()));
        let x = tiberius::xml::XmlData::new("<a>1</a>");
        assert_eq!(dec("xml", C::Xml(Some(Cow::Owned(x)))).unwrap(), Value::Text("<a>1</a>".into()));
        let u = uuid::Uuid::parse_str("6f9619ff-8b86-d011-b42d-00c04fc964ff").unwrap();
        assert_eq!(dec("uniqueidentifier", C::Guid(Some(u))).unwrap(), Value::Uuid(u));
        assert_eq!(
            dec("varbinary(max)", C::Binary(Some(Cow::Borrowed(&[0, 1, 255])))).unwrap(),
            Value::Bytes(vec![0, 1, 255])
        );
        // rowversion: 8 bytes, kept as they are.
        assert_eq!(
            dec("rowversion", C::Binary(Some(Cow::Borrowed(&[0, 0, 0, 0, 0, 0, 7, 0xd1])))).unwrap(),
            Value::Bytes(vec![0, 0, 0, 0, 0, 0, 7, 0xd1])
        );
        // hierarchyid and sql_variant as their text (read through ToString() / CAST).
        assert_eq!(dec("hierarchyid", C::String(Some(Cow::Borrowed("/1/3/")))).unwrap(), Value::Text("/1/3/".into()));
        assert_eq!(dec("sql_variant", C::String(Some(Cow::Borrowed("42")))).unwrap(), Value::Text("42".into()));
        // A kind the column's type does not have names the column and the type.
        let e = dec("int", C::String(Some(Cow::Borrowed("secret")))).unwrap_err();
        assert_eq!(e.column(), Some("c"));
        assert!(!e.to_string().contains("secret"), "{e}");
    }

    #[test]
    fn temporal_types_follow_ms_tds() {
        // date: days since 0001-01-01 (MS-TDS 2.2.5.5.1.9): 1970-01-01 is day 719162.
        assert_eq!(dec("date", C::Date(Some(Date::new(719_162)))).unwrap(), Value::Date(0));
        assert_eq!(dec("date", C::Date(Some(Date::new(0)))).unwrap(), Value::Date(-719_162));
        // time(7): 100 ns increments; 12:00:00.1234567 truncates to microseconds.
        let noon = 12 * 3600 * 10_000_000u64 + 1_234_567;
        assert_eq!(dec("time(7)", C::Time(Some(Time::new(noon, 7)))).unwrap(), Value::Time(43_200_123_456));
        assert_eq!(dec("time(0)", C::Time(Some(Time::new(1, 0)))).unwrap(), Value::Time(1_000_000));
        assert!(dec("time(7)", C::Time(Some(Time::new(864_000_000_000, 7)))).is_err());
        // datetime: days since 1900-01-01 and 1/300 s ticks (MS-TDS 2.2.5.5.1.8):
        // 1900-01-01 00:00:00.003 is one tick, 3333 µs.
        assert_eq!(
            dec("datetime", C::DateTime(Some(DateTime::new(0, 1)))).unwrap(),
            Value::Timestamp(-DAYS_1900_TO_1970 * MICROS_PER_DAY + 3333)
        );
        // 1970-01-01 00:00:01.000 = 300 ticks.
        assert_eq!(
            dec("datetime", C::DateTime(Some(DateTime::new(25_567, 300)))).unwrap(),
            Value::Timestamp(1_000_000)
        );
        // smalldatetime: days since 1900 and minutes.
        assert_eq!(
            dec("smalldatetime", C::SmallDateTime(Some(SmallDateTime::new(25_567, 61)))).unwrap(),
            Value::Timestamp(61 * 60_000_000)
        );
        // datetime2(3): 1970-01-02 00:00:00.500.
        let d2 = DateTime2::new(Date::new(719_163), Time::new(500, 3));
        assert_eq!(dec("datetime2(3)", C::DateTime2(Some(d2))).unwrap(), Value::Timestamp(MICROS_PER_DAY + 500_000));
        // datetimeoffset: the date and time are UTC; +02:00 changes nothing.
        let off = DateTimeOffset::new(DateTime2::new(Date::new(719_162), Time::new(0, 7)), 120);
        assert_eq!(dec("datetimeoffset(7)", C::DateTimeOffset(Some(off))).unwrap(), Value::TimestampTz(0));
    }

    #[test]
    fn select_expressions_read_each_type_exactly() {
        let e = |t: &str| select_expr(&ColumnDef::new("a]b", t, true));
        assert_eq!(e("int"), "[a]]b]");
        assert_eq!(e("money"), "CAST([a]]b] AS decimal(19,4)) AS [a]]b]");
        assert_eq!(e("smallmoney"), "CAST([a]]b] AS decimal(10,4)) AS [a]]b]");
        assert_eq!(e("hierarchyid"), "[a]]b].ToString() AS [a]]b]");
        assert_eq!(e("geography"), "[a]]b].STAsBinary() AS [a]]b]");
        assert_eq!(e("sql_variant"), "CAST([a]]b] AS nvarchar(4000)) AS [a]]b]");
        assert_eq!(quote_literal("o'k"), "N'o''k'");
    }
}
