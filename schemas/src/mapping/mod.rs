//! Source database types to logical types, one module per database, each
//! following the Debezium connector's default choices for that database
//! (differences are listed in `docs/type-mapping.md`).

pub mod mysql;
pub mod oracle;
pub mod postgres;
pub mod sqlserver;

use crate::error::SchemaError;
use crate::model::{DataType, TableId};

/// A column's type as its database reports it, with the details some
/// catalogs give apart from the type's text.
#[derive(Debug, Clone, Copy)]
pub struct SourceType<'a> {
    /// The table, for errors.
    pub table: &'a TableId,
    /// The column, for errors.
    pub column: &'a str,
    /// The type's text: PostgreSQL's `format_type` (`numeric(12,2)`,
    /// `character varying(40)`, `integer[]`), MySQL's `COLUMN_TYPE`
    /// (`decimal(10,2)`, `enum('a','b')`, `bigint unsigned`), SQL Server's
    /// or Oracle's `DATA_TYPE` (`decimal`, `NUMBER`, `TIMESTAMP(6) WITH TIME ZONE`).
    pub type_text: &'a str,
    /// Precision (total digits) when the catalog gives it apart; it wins
    /// over a precision written in `type_text`.
    pub precision: Option<u32>,
    /// Scale when the catalog gives it apart.
    pub scale: Option<u32>,
    /// Labels of an enum type (PostgreSQL `pg_enum`, in sort order) when
    /// the type is a user-defined enum.
    pub enum_labels: Option<&'a [String]>,
}

impl<'a> SourceType<'a> {
    /// A type known by its text alone.
    pub fn new(table: &'a TableId, column: &'a str, type_text: &'a str) -> Self {
        Self {
            table,
            column,
            type_text,
            precision: None,
            scale: None,
            enum_labels: None,
        }
    }

    /// With precision and scale from the catalog.
    pub fn with_precision_scale(mut self, precision: Option<u32>, scale: Option<u32>) -> Self {
        self.precision = precision;
        self.scale = scale;
        self
    }

    /// With the labels of a user-defined enum.
    pub fn with_enum_labels(mut self, labels: &'a [String]) -> Self {
        self.enum_labels = Some(labels);
        self
    }

    /// The error for a type this mapping does not know.
    pub fn unsupported(&self) -> SchemaError {
        SchemaError::UnsupportedType {
            table: self.table.clone(),
            column: self.column.to_string(),
            source_type: self.type_text.to_string(),
        }
    }
}

/// A type's text taken apart: lower-case base name (words joined by one
/// space), the arguments in parentheses, and the words after them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeText {
    /// `character varying`, `decimal`, `timestamp`.
    pub base: String,
    /// `["12", "2"]`; quoted labels are unquoted.
    pub args: Vec<String>,
    /// Words after the parentheses (`unsigned`, `with time zone`).
    pub suffix: String,
}

impl TypeText {
    /// Parses `numeric(12,2)`, `timestamp(6) with time zone`,
    /// `enum('a','b''c')`, `bigint unsigned zerofill`.
    pub fn parse(text: &str) -> Option<TypeText> {
        let text = text.trim();
        let (head, args, tail) = match text.find('(') {
            Some(open) => {
                let close = text.rfind(')')?;
                if close < open {
                    return None;
                }
                (&text[..open], parse_args(&text[open + 1..close])?, &text[close + 1..])
            }
            None => (text, Vec::new(), ""),
        };
        let words = |s: &str| s.split_whitespace().map(str::to_ascii_lowercase).collect::<Vec<_>>().join(" ");
        Some(TypeText { base: words(head), args, suffix: words(tail) })
    }

    /// Argument `i` as a number.
    pub fn num(&self, i: usize) -> Option<u32> {
        self.args.get(i)?.trim().parse().ok()
    }
}

/// Splits `12, 2` or `'a','b''c'` into arguments.
fn parse_args(s: &str) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let Some(&c) = chars.peek() else { break };
        let mut arg = String::new();
        if c == '\'' || c == '"' {
            let quote = c;
            chars.next();
            loop {
                match chars.next()? {
                    ch if ch == quote => {
                        if chars.peek() == Some(&quote) {
                            chars.next();
                            arg.push(quote);
                        } else {
                            break;
                        }
                    }
                    '\\' => arg.push(chars.next()?),
                    ch => arg.push(ch),
                }
            }
            while chars.peek().is_some_and(|c| c.is_whitespace()) {
                chars.next();
            }
        } else {
            while let Some(&ch) = chars.peek() {
                if ch == ',' {
                    break;
                }
                arg.push(ch);
                chars.next();
            }
            arg = arg.trim().to_string();
        }
        out.push(arg);
        match chars.next() {
            Some(',') => continue,
            None => break,
            Some(_) => return None,
        }
    }
    Some(out)
}

/// Decimal from explicit or written precision and scale: `None` when the
/// type has no precision at all.
pub(crate) fn decimal(st: &SourceType<'_>, tt: &TypeText) -> Option<DataType> {
    let precision = st.precision.or_else(|| tt.num(0))?;
    let scale = st.scale.or_else(|| tt.num(1)).unwrap_or(0);
    Some(DataType::Decimal { precision, scale })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_text_parses_parts() {
        let t = TypeText::parse("Timestamp(6)  WITH time zone").expect("parses");
        assert_eq!(t.base, "timestamp");
        assert_eq!(t.args, ["6"]);
        assert_eq!(t.suffix, "with time zone");
        let t = TypeText::parse("enum('a','b''c','d,e')").expect("parses");
        assert_eq!(t.args, ["a", "b'c", "d,e"]);
        let t = TypeText::parse("decimal(10, 2) unsigned zerofill").expect("parses");
        assert_eq!((t.num(0), t.num(1)), (Some(10), Some(2)));
        assert_eq!(t.suffix, "unsigned zerofill");
        assert!(TypeText::parse("enum('a").is_none());
    }
}
