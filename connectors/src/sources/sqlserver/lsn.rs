//! SQL Server log sequence numbers and how they become a [`Position`].
//!
//! An LSN is `binary(10)`: the virtual log file (VLF) sequence number (4
//! bytes), the log block offset in it (4 bytes) and the slot of the record
//! in the block (2 bytes), compared byte by byte, big-endian
//! (<https://learn.microsoft.com/sql/relational-databases/sql-server-transaction-log-architecture-and-management-guide>,
//! "Log sequence numbers"; the CDC functions take and return them as
//! `binary(10)`:
//! <https://learn.microsoft.com/sql/relational-databases/system-functions/sys-fn-cdc-get-max-lsn-transact-sql>).
//! Debezium prints them `0000002d:00000c28:0003`, and so do we.
//!
//! # Packing into a `Position`
//!
//! 80 bits do not fit `Position.commit`, which the sinks store as a signed
//! 64-bit column (`bookkeeping::position_i64`). The packing keeps the order:
//!
//! * `commit = vlf << 32 | block` of the transaction's commit LSN
//!   (`__$start_lsn`), which needs `vlf < 2^31 - 1` (the sign bit, and
//!   `i64::MAX` which the sinks reserve);
//! * `index = slot << 40 | ordinal`, where `ordinal` is the event's place in
//!   its transaction after ordering by (`__$seqval`, `__$operation`) and
//!   pairing update rows: `ordinal < 2^40`.
//!
//! `(commit, index)` compares as (vlf, block, slot, ordinal): the LSN order,
//! then the order inside the transaction. Snapshot rows read at LSN `L`
//! take `L` with [`MAX_ORDINAL`]: they are the state after every change of
//! the transaction at `L`. A VLF sequence number reaches 2^31
//! only after two billion log files; an LSN beyond it is refused
//! ([`Lsn::position`]) rather than wrapped, since a wrapped position would
//! look older than every row already written and the sinks would skip it.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use tributary_schemas::Position;

use crate::error::{Error, Result};

/// Largest VLF sequence number that packs (see the module doc).
pub const MAX_PACKED_VLF: u32 = (1 << 31) - 2;
/// Largest ordinal of an event inside one transaction that packs.
pub const MAX_ORDINAL: u64 = (1 << 40) - 1;

/// A SQL Server LSN (`binary(10)`), ordered as the server orders it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Lsn(pub [u8; 10]);

impl Lsn {
    /// The zero LSN: what `sys.fn_cdc_get_min_lsn` returns for a capture
    /// instance that does not exist.
    pub const ZERO: Lsn = Lsn([0; 10]);

    /// From its three parts.
    pub fn new(vlf: u32, block: u32, slot: u16) -> Self {
        let mut b = [0u8; 10];
        b[..4].copy_from_slice(&vlf.to_be_bytes());
        b[4..8].copy_from_slice(&block.to_be_bytes());
        b[8..].copy_from_slice(&slot.to_be_bytes());
        Lsn(b)
    }

    /// From the bytes a query returns; anything but 10 bytes is refused.
    pub fn from_slice(bytes: &[u8]) -> Result<Self> {
        let b: [u8; 10] = bytes
            .try_into()
            .map_err(|_| Error::permanent(format!("an LSN has 10 bytes, the server sent {}", bytes.len())))?;
        Ok(Lsn(b))
    }

    /// The VLF sequence number.
    pub fn vlf(&self) -> u32 {
        u32::from_be_bytes([self.0[0], self.0[1], self.0[2], self.0[3]])
    }

    /// The log block.
    pub fn block(&self) -> u32 {
        u32::from_be_bytes([self.0[4], self.0[5], self.0[6], self.0[7]])
    }

    /// The slot in the block.
    pub fn slot(&self) -> u16 {
        u16::from_be_bytes([self.0[8], self.0[9]])
    }

    /// Whether this is the zero LSN.
    pub fn is_zero(&self) -> bool {
        *self == Lsn::ZERO
    }

    /// As a `binary(10)` literal for T-SQL (`0x0000002D00000C280003`).
    pub fn sql_literal(&self) -> String {
        let mut s = String::from("0x");
        for b in self.0 {
            s.push_str(&format!("{b:02X}"));
        }
        s
    }

    /// The position of the event at `ordinal` of the transaction committed
    /// at this LSN (see the module doc); out of range is a needs-operator
    /// error, never a wrapped position.
    pub fn position(&self, ordinal: u64) -> Result<Position> {
        if self.vlf() > MAX_PACKED_VLF {
            return Err(Error::needs_operator(format!(
                "LSN {self} has a VLF sequence number above {MAX_PACKED_VLF}: it does not fit Tributary's 63-bit positions"
            ))
            .with_class("tributary.lsn_range"));
        }
        if ordinal > MAX_ORDINAL {
            return Err(Error::needs_operator(format!(
                "the transaction at {self} has more than {MAX_ORDINAL} changes: they do not fit Tributary's positions"
            ))
            .with_class("tributary.lsn_range"));
        }
        Ok(Position {
            commit: u64::from(self.vlf()) << 32 | u64::from(self.block()),
            index: u64::from(self.slot()) << 40 | ordinal,
        })
    }

    /// The LSN a position was packed from (its ordinal dropped).
    pub fn from_position(p: Position) -> Lsn {
        Lsn::new((p.commit >> 32) as u32, p.commit as u32, (p.index >> 40) as u16)
    }

    /// The smallest LSN after this one (`sys.fn_cdc_increment_lsn`:
    /// <https://learn.microsoft.com/sql/relational-databases/system-functions/sys-fn-cdc-increment-lsn-transact-sql>).
    /// Saturates at the largest LSN.
    pub fn next(&self) -> Lsn {
        let v = u128::from_be_bytes({
            let mut b = [0u8; 16];
            b[6..].copy_from_slice(&self.0);
            b
        });
        let n = v.saturating_add(1).min((1u128 << 80) - 1);
        let mut out = [0u8; 10];
        out.copy_from_slice(&n.to_be_bytes()[6..]);
        Lsn(out)
    }
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:08x}:{:08x}:{:04x}", self.vlf(), self.block(), self.slot())
    }
}

impl std::str::FromStr for Lsn {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let bad = || Error::needs_operator(format!("`{s}` is not an LSN (expected vvvvvvvv:bbbbbbbb:ssss)"));
        let mut parts = s.split(':');
        let (Some(v), Some(b), Some(sl), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
            return Err(bad());
        };
        if v.len() != 8 || b.len() != 8 || sl.len() != 4 {
            return Err(bad());
        }
        let v = u32::from_str_radix(v, 16).map_err(|_| bad())?;
        let b = u32::from_str_radix(b, 16).map_err(|_| bad())?;
        let sl = u16::from_str_radix(sl, 16).map_err(|_| bad())?;
        Ok(Lsn::new(v, b, sl))
    }
}

impl Serialize for Lsn {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for Lsn {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(|e: Error| serde::de::Error::custom(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn lsn() -> impl Strategy<Value = Lsn> {
        (0..=MAX_PACKED_VLF, any::<u32>(), any::<u16>()).prop_map(|(v, b, s)| Lsn::new(v, b, s))
    }

    #[test]
    fn text_bytes_and_literal_agree() {
        let l = Lsn::new(0x2d, 0xc28, 3);
        assert_eq!(l.to_string(), "0000002d:00000c28:0003");
        assert_eq!(l.sql_literal(), "0x0000002D00000C280003");
        assert_eq!("0000002d:00000c28:0003".parse::<Lsn>().expect("parses"), l);
        assert_eq!(Lsn::from_slice(&l.0).expect("10 bytes"), l);
        assert!(Lsn::from_slice(&[0; 9]).is_err());
        assert!("2d:c28:3".parse::<Lsn>().is_err());
        assert_eq!(serde_json::to_string(&l).expect("json"), "\"0000002d:00000c28:0003\"");
        assert_eq!(Lsn::new(1, u32::MAX, u16::MAX).next(), Lsn::new(2, 0, 0));
    }

    #[test]
    fn positions_beyond_63_bits_are_refused_not_wrapped() {
        let top = Lsn::new(MAX_PACKED_VLF, u32::MAX, u16::MAX);
        let p = top.position(MAX_ORDINAL).expect("the largest packable LSN");
        assert!(i64::try_from(p.commit).is_ok() && p.commit < i64::MAX as u64, "{p:?}");
        assert!(i64::try_from(p.index).is_ok());
        assert!(Lsn::new(MAX_PACKED_VLF + 1, 0, 0).position(0).is_err());
        assert!(Lsn::new(1, 0, 0).position(MAX_ORDINAL + 1).is_err());
    }

    proptest! {
        // The packing preserves the LSN order, then the ordinal order.
        #[test]
        fn packing_preserves_order(a in lsn(), b in lsn(), i in 0..=MAX_ORDINAL, j in 0..=MAX_ORDINAL) {
            let (pa, pb) = (a.position(i).unwrap(), b.position(j).unwrap());
            prop_assert_eq!(pa.cmp(&pb), (a, i).cmp(&(b, j)));
            prop_assert_eq!(Lsn::from_position(pa), a);
        }

        #[test]
        fn text_round_trips(a in lsn()) {
            prop_assert_eq!(a.to_string().parse::<Lsn>().unwrap(), a);
            prop_assert!(a.next() > a || a.0 == [0xff; 10]);
        }
    }
}
