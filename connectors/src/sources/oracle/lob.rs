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

use super::redo_sql::{malformed, Cursor, Literal, Token};
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
        assert!(b.apply(&LobOp::Write { data: LobData::Bytes(vec![1]), offset: MAX_LOB_LENGTH + 1 }).is_err());
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
