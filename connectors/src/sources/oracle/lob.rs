//! LOB reassembly. A row written with a CLOB / BLOB value reaches
//! `V$LOGMNR_CONTENTS` as a DML row holding `EMPTY_CLOB()` (or the old
//! value), then a `SEL_LOB_LOCATOR` row (`OPERATION_CODE` 9) naming the
//! column and the row, then `LOB_WRITE` rows (10) with the pieces,
//! `LOB_TRIM` (11) and `LOB_ERASE` (28) rows, all in the same transaction
//! (Oracle Database Utilities, "Supported Data Types, Storage Attributes,
//! and Database and Redo Log File Versions" and the `OPERATION_CODE` list
//! of `V$LOGMNR_CONTENTS` in the Database Reference). LogMiner writes them
//! as PL/SQL:
//!
//! ```text
//! DECLARE loc_c CLOB; buf_c VARCHAR2(6156); BEGIN select "DOC" into loc_c from "APP"."T" where "ID" = '1' and ROWID = 'AAAS' for update;
//! buf_c := 'piece'; dbms_lob.write(loc_c, 5, 1, buf_c);
//! buf_b := HEXTORAW('0a0b'); dbms_lob.write(loc_b, 2, 1, buf_b);
//! dbms_lob.trim(loc_c, 3);
//! dbms_lob.erase(loc_c, 2, 1);
//! ```
//!
//! Offsets and amounts count characters for CLOB / NCLOB and bytes for
//! BLOB, from 1 (PL/SQL Packages and Types Reference, `DBMS_LOB.WRITE`,
//! `TRIM`, `ERASE`: an erase writes spaces into a CLOB and zero bytes into
//! a BLOB, a write beyond the end fills the hole the same way).

use tributary_schemas::TableId;

use super::redo_sql::{from_hex, malformed, Cursor, Literal, Token};
use crate::error::Result;

/// One LOB row, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LobOp {
    /// `SEL_LOB_LOCATOR`: the following writes go to `column` of the row
    /// the where clause names.
    Select {
        /// The table.
        table: TableId,
        /// The LOB column.
        column: String,
        /// The row's columns in the where clause (its key at least).
        key: Vec<(String, Literal)>,
    },
    /// `dbms_lob.write(loc, amount, offset, buf)`.
    Write {
        /// The piece.
        data: LobData,
        /// 1-based offset.
        offset: u64,
    },
    /// `dbms_lob.trim(loc, length)`.
    Trim(u64),
    /// `dbms_lob.erase(loc, amount, offset)`.
    Erase {
        /// How much.
        amount: u64,
        /// 1-based offset.
        offset: u64,
    },
}

/// A piece of a LOB.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LobData {
    /// CLOB / NCLOB characters.
    Text(String),
    /// BLOB bytes.
    Bytes(Vec<u8>),
}

fn number(c: &mut Cursor) -> Result<u64> {
    match c.literal()? {
        Literal::Number(n) => n.parse().map_err(|_| malformed("a LOB offset that is not a number")),
        _ => Err(malformed("a LOB offset that is not a number")),
    }
}

/// Parses the `SQL_REDO` of a LOB row of `OPERATION_CODE` `op`.
pub fn parse(op: u8, sql: &str) -> Result<LobOp> {
    let mut c = Cursor::new(sql)?;
    match op {
        9 => {
            if !c.skip_past_word("select") {
                return Err(malformed("a LOB locator row without its select"));
            }
            let column = c.identifier()?;
            c.word("into")?;
            c.identifier()?;
            c.word("from")?;
            let table = c.table()?;
            c.word("where")?;
            let key = c.conditions()?;
            Ok(LobOp::Select { table, column, key })
        }
        10 => {
            // buf_x := <value>; dbms_lob.write(loc_x, amount, offset, buf_x);
            c.identifier()?;
            c.punct(":=")?;
            let data = match c.literal()? {
                Literal::Str(s) => LobData::Text(s),
                Literal::Raw(b) => LobData::Bytes(b),
                _ => return Err(malformed("a LOB piece that is neither text nor HEXTORAW")),
            };
            c.punct(";")?;
            c.word("dbms_lob.write")?;
            c.punct("(")?;
            c.identifier()?;
            c.punct(",")?;
            let _amount = number(&mut c)?;
            c.punct(",")?;
            let offset = number(&mut c)?;
            Ok(LobOp::Write { data, offset })
        }
        11 => {
            c.word("dbms_lob.trim")?;
            c.punct("(")?;
            c.identifier()?;
            c.punct(",")?;
            Ok(LobOp::Trim(number(&mut c)?))
        }
        28 => {
            c.word("dbms_lob.erase")?;
            c.punct("(")?;
            c.identifier()?;
            c.punct(",")?;
            let amount = number(&mut c)?;
            c.punct(",")?;
            let offset = number(&mut c)?;
            Ok(LobOp::Erase { amount, offset })
        }
        _ => Err(malformed("not a LOB operation")),
    }
}

/// A LOB being reassembled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LobValue {
    /// CLOB / NCLOB, by character.
    Text(Vec<char>),
    /// BLOB, by byte.
    Bytes(Vec<u8>),
}

/// Largest LOB offset accepted: a forged or corrupt offset must not make
/// the source allocate without bound (1 GiB, far above what a change
/// event can carry through Kafka anyway).
pub const MAX_LOB_LENGTH: u64 = 1 << 30;

impl LobValue {
    /// Applies one write, trim or erase.
    pub fn apply(&mut self, op: &LobOp) -> Result<()> {
        match op {
            LobOp::Select { .. } => Ok(()),
            LobOp::Write { data, offset } => {
                let at = start(*offset)?;
                match (self, data) {
                    (LobValue::Text(v), LobData::Text(s)) => overwrite(v, at, &s.chars().collect::<Vec<_>>(), ' '),
                    (LobValue::Bytes(v), LobData::Bytes(b)) => overwrite(v, at, b, 0),
                    _ => Err(malformed("a LOB piece of the other kind (text into a BLOB or bytes into a CLOB)")),
                }
            }
            LobOp::Trim(len) => {
                let len = usize::try_from((*len).min(MAX_LOB_LENGTH)).unwrap_or(usize::MAX);
                match self {
                    LobValue::Text(v) => v.truncate(len),
                    LobValue::Bytes(v) => v.truncate(len),
                }
                Ok(())
            }
            LobOp::Erase { amount, offset } => {
                let at = start(*offset)?;
                let n = usize::try_from((*amount).min(MAX_LOB_LENGTH)).unwrap_or(0);
                match self {
                    LobValue::Text(v) => {
                        let end = (at + n).min(v.len());
                        v.iter_mut().take(end).skip(at).for_each(|c| *c = ' ');
                    }
                    LobValue::Bytes(v) => {
                        let end = (at + n).min(v.len());
                        v.iter_mut().take(end).skip(at).for_each(|b| *b = 0);
                    }
                }
                Ok(())
            }
        }
    }
}

fn start(offset: u64) -> Result<usize> {
    if offset == 0 || offset > MAX_LOB_LENGTH {
        return Err(malformed("a LOB offset out of range"));
    }
    Ok((offset - 1) as usize)
}

fn overwrite<T: Copy>(v: &mut Vec<T>, at: usize, piece: &[T], fill: T) -> Result<()> {
    if (at + piece.len()) as u64 > MAX_LOB_LENGTH {
        return Err(malformed("a LOB larger than 1 GiB"));
    }
    if v.len() < at {
        v.resize(at, fill);
    }
    for (i, x) in piece.iter().enumerate() {
        match v.get_mut(at + i) {
            Some(slot) => *slot = *x,
            None => v.push(*x),
        }
    }
    Ok(())
}

/// An `XML DOC BEGIN` row (`OPERATION_CODE` 68): the following
/// `XML DOC WRITE` rows (70), up to `XML DOC END` (71), hold the new
/// XMLTYPE document of `column` of the row the where clause names (Oracle
/// Database Reference, `V$LOGMNR_CONTENTS.OPERATION`; the shapes are those
/// Debezium's LogMiner adapter parses, `XmlBeginParser`). Binary XML
/// storage (the default since 11.2) writes
///
/// ```text
/// XML DOC BEGIN:  select "DATA" from "APP"."T" where "ID" = '1'
/// XML_REDO := HEXTORAW('3c613e'):3
/// ```
///
/// (the document's bytes in the database character set, or a short one
/// inline as `XML_REDO := '<a/>':4`, `XML_REDO := NULL` for none); text
/// (CLOB) storage writes
///
/// ```text
/// update "APP"."T" a set a."DATA" = XMLType(:1)  where a."ID" = '1';
/// <a>the document's text, as is</a>
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XmlBegin {
    /// The table.
    pub table: TableId,
    /// The XMLTYPE column.
    pub column: String,
    /// The row's columns in the where clause.
    pub key: Vec<(String, Literal)>,
    /// Binary storage: the writes are `XML_REDO := ...` statements; else
    /// each write is a piece of the document's text.
    pub binary: bool,
}

/// Parses an `XML DOC BEGIN` row's `SQL_REDO`.
pub fn parse_xml_begin(sql: &str) -> Result<XmlBegin> {
    if let Some(rest) = sql.trim_start().strip_prefix("XML DOC BEGIN:") {
        let mut c = Cursor::new(rest)?;
        c.word("select")?;
        let column = c.identifier()?;
        c.word("from")?;
        let table = c.table()?;
        c.word("where")?;
        let key = c.conditions()?;
        return Ok(XmlBegin { table, column, key, binary: true });
    }
    // `XMLType(:1)` is a bind the tokenizer has no token for: the value
    // is in the writes, so it reads as NULL here.
    let lower = sql.to_ascii_lowercase();
    let at = lower
        .find("xmltype(:")
        .ok_or_else(|| malformed("an XML DOC BEGIN row of neither shape"))?;
    let close = lower[at..].find(')').ok_or_else(|| malformed("an unterminated XMLType bind"))? + at;
    let mut c = Cursor::new(&format!("{} NULL {}", &sql[..at], &sql[close + 1..]))?;
    c.word("update")?;
    let table = c.table()?;
    c.skip_alias();
    c.word("set")?;
    let column = c.column()?;
    c.punct("=")?;
    c.literal()?;
    c.word("where")?;
    let key = c.conditions()?;
    Ok(XmlBegin { table, column, key, binary: false })
}

/// The bytes of an `XML DOC WRITE` row (UTF-8 text, or the raw bytes of
/// binary storage, which may split a character between two rows);
/// `None` for `XML_REDO := NULL`, a NULL document.
pub fn parse_xml_write(sql: &str, binary: bool) -> Result<Option<Vec<u8>>> {
    if !binary {
        return Ok(Some(sql.as_bytes().to_vec()));
    }
    let rest = sql
        .strip_prefix("XML_REDO := ")
        .ok_or_else(|| malformed("an XML DOC WRITE row without XML_REDO"))?;
    if rest.trim() == "NULL" {
        return Ok(None);
    }
    // `...:<length>` ends every piece.
    let body = rest.rsplit_once(':').map_or(rest, |(b, _)| b).trim_end();
    if let Some(hex) = body.strip_prefix("HEXTORAW('") {
        // Oracle leaves the closing quote out of some pieces (Debezium's
        // `XmlWriteParser` compensates the same way).
        let hex = hex
            .strip_suffix(')')
            .ok_or_else(|| malformed("an unterminated HEXTORAW piece"))?;
        return Ok(Some(from_hex(hex.strip_suffix('\'').unwrap_or(hex))?));
    }
    let text = body
        .strip_prefix('\'')
        .and_then(|b| b.strip_suffix('\''))
        .ok_or_else(|| malformed("an XML DOC WRITE piece that is neither HEXTORAW nor quoted"))?;
    Ok(Some(text.replace("''", "'").into_bytes()))
}

/// Whether a token list is the LOB locator's PL/SQL (for callers that see
/// only text).
pub fn is_locator(sql: &str) -> bool {
    Cursor::new(sql).is_ok_and(|c| matches!(c.peek(), Some(Token::Word(w)) if w.eq_ignore_ascii_case("DECLARE")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn locator_write_trim_and_erase_rows_parse() {
        let sel = "DECLARE \n loc_c CLOB; \n buf_c VARCHAR2(6156); \nBEGIN\n select \"DOC\" into loc_c from \"APP\".\"T\" where \"ID\" = '1' and ROWID = 'AAAS+/x' for update;";
        assert!(is_locator(sel));
        assert_eq!(
            parse(9, sel).unwrap(),
            LobOp::Select {
                table: TableId::new("APP", "T"),
                column: "DOC".into(),
                key: vec![("ID".into(), Literal::Str("1".into()))],
            }
        );
        assert_eq!(
            parse(10, "buf_c := 'it''s'; dbms_lob.write(loc_c, 4, 3, buf_c);").unwrap(),
            LobOp::Write { data: LobData::Text("it's".into()), offset: 3 }
        );
        assert_eq!(
            parse(10, "buf_b := HEXTORAW('0a0B'); dbms_lob.write(loc_b, 2, 1, buf_b);").unwrap(),
            LobOp::Write { data: LobData::Bytes(vec![10, 11]), offset: 1 }
        );
        assert_eq!(parse(11, "dbms_lob.trim(loc_c, 5);").unwrap(), LobOp::Trim(5));
        assert_eq!(parse(28, "dbms_lob.erase(loc_b, 2, 1);").unwrap(), LobOp::Erase { amount: 2, offset: 1 });
        assert!(parse(10, "buf_c := 'x'; dbms_lob.write(loc_c, 1, 0x, buf_c);").is_err());
        assert!(parse(9, "select 1 from dual").is_err());
    }

    #[test]
    fn pieces_reassemble_with_holes_trims_and_erases() {
        let mut v = LobValue::Text(Vec::new());
        for op in [
            LobOp::Write { data: LobData::Text("héllo".into()), offset: 1 },
            LobOp::Write { data: LobData::Text("world".into()), offset: 8 },
            LobOp::Erase { amount: 1, offset: 2 },
            LobOp::Trim(11),
        ] {
            v.apply(&op).unwrap();
        }
        assert_eq!(v, LobValue::Text("h llo  worl".chars().collect()));
        let mut b = LobValue::Bytes(vec![1]);
        b.apply(&LobOp::Write { data: LobData::Bytes(vec![9]), offset: 3 }).unwrap();
        assert_eq!(b, LobValue::Bytes(vec![1, 0, 9]));
        assert!(b.apply(&LobOp::Write { data: LobData::Text("x".into()), offset: 1 }).is_err());
        assert!(b
            .apply(&LobOp::Write {
                data: LobData::Bytes(vec![1]),
                offset: MAX_LOB_LENGTH + 1
            })
            .is_err());
    }

    #[test]
    fn xml_begin_and_write_rows_parse_in_both_storages() {
        let key = vec![("ID".to_string(), Literal::Str("1".into()))];
        let want = |binary| XmlBegin {
            table: TableId::new("APP", "T"),
            column: "DATA".into(),
            key: key.clone(),
            binary,
        };
        assert_eq!(
            parse_xml_begin("XML DOC BEGIN:  select \"DATA\" from \"APP\".\"T\" where \"ID\" = '1'").unwrap(),
            want(true)
        );
        assert_eq!(
            parse_xml_begin("update \"APP\".\"T\" a set a.\"DATA\" = XMLType(:1)  where a.\"ID\" = '1';").unwrap(),
            want(false)
        );
        let with_null = "XML DOC BEGIN:  select \"P\" from \"S\".\"T\" where \"A\" = '3' and \"M\" IS NULL";
        assert_eq!(parse_xml_begin(with_null).unwrap().key[1], ("M".to_string(), Literal::Null));
        assert!(parse_xml_begin("XMLDOCBEGIN:  select \"DATA\" from \"APP\".\"T\" where \"ID\" = '1'").is_err());
        assert!(parse_xml_begin("updater \"APP\".\"T\" a set a.\"DATA\" = 1 where a.\"ID\" = '1';").is_err());

        // "<root>Ä</root>" in UTF-8, split inside the Ä; the last piece
        // without its closing quote, as Oracle writes some.
        assert_eq!(
            parse_xml_write("XML_REDO := HEXTORAW('3c726f6f743ec3'):7", true).unwrap(),
            Some(b"<root>\xc3".to_vec())
        );
        assert_eq!(
            parse_xml_write("XML_REDO := HEXTORAW('843c2f726f6f743e):8", true).unwrap(),
            Some(b"\x84</root>".to_vec())
        );
        assert_eq!(parse_xml_write("XML_REDO := '<a x=''1''/>':10", true).unwrap(), Some(b"<a x='1'/>".to_vec()));
        assert_eq!(parse_xml_write("XML_REDO := NULL", true).unwrap(), None);
        assert_eq!(parse_xml_write("<a>it's: </a>", false).unwrap(), Some(b"<a>it's: </a>".to_vec()));
        assert!(parse_xml_write("<a/>", true).is_err());
        assert!(parse_xml_write("XML_REDO := HEXTORAW('3g'):1", true).is_err());
    }

    proptest! {
        /// A text cut into pieces of any sizes, written in any order at
        /// their offsets, comes back whole.
        #[test]
        fn pieces_in_any_order_reassemble(text in "\\PC{0,200}", cuts in proptest::collection::vec(1usize..40, 1..20), order in any::<u64>()) {
            let chars: Vec<char> = text.chars().collect();
            let mut pieces = Vec::new();
            let mut at = 0;
            for n in cuts.iter().cycle() {
                if at >= chars.len() { break; }
                let end = (at + n).min(chars.len());
                pieces.push(LobOp::Write { data: LobData::Text(chars[at..end].iter().collect()), offset: at as u64 + 1 });
                at = end;
            }
            let k = pieces.len().max(1);
            pieces.rotate_left((order as usize) % k);
            let mut v = LobValue::Text(Vec::new());
            for p in &pieces {
                v.apply(p).unwrap();
            }
            prop_assert_eq!(v, LobValue::Text(chars));
        }
    }
}
