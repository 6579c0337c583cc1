//! Global transaction ids of both servers.
//!
//! MariaDB: `domain-server-sequence`, one current position per replication
//! domain (`0-1-42,1-2-7`); its GTID events (type 162) and GTID list events
//! (type 163) are MariaDB's own and `mysql_common` does not parse them, so
//! [`MariaGtidEvent`] and [`parse_gtid_list`] decode them here.
//!
//! MySQL 8: `source_uuid:interval[:interval]`, a set of executed transaction
//! numbers per server UUID (`3e11fa47-...:1-5:7`); [`MySqlGtidSet`] keeps one
//! and adds each committed transaction to it.

use std::collections::BTreeMap;
use std::fmt;

/// MariaDB's event type of a GTID event (starts every event group).
pub const MARIADB_GTID_EVENT: u8 = 162;
/// MariaDB's event type of a GTID list event (binlog start, after rotates).
pub const MARIADB_GTID_LIST_EVENT: u8 = 163;
/// MariaDB's ANNOTATE_ROWS event (the statement of the following rows).
pub const MARIADB_ANNOTATE_ROWS_EVENT: u8 = 160;
/// MariaDB's BINLOG_CHECKPOINT event.
pub const MARIADB_BINLOG_CHECKPOINT_EVENT: u8 = 161;

/// `FL_STANDALONE`: the group has no BEGIN/COMMIT (a DDL statement); it
/// ends with its single QUERY event.
const FL_STANDALONE: u8 = 1;
/// `FL_GROUP_COMMIT_ID`: an 8-byte commit id follows the flags.
const FL_GROUP_COMMIT_ID: u8 = 2;

/// One MariaDB GTID, `domain-server-sequence`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MariaGtid {
    /// Replication domain.
    pub domain: u32,
    /// Server id of the originating server.
    pub server: u32,
    /// Sequence number within the domain.
    pub sequence: u64,
}

impl fmt::Display for MariaGtid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}-{}", self.domain, self.server, self.sequence)
    }
}

/// A decoded MariaDB GTID event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MariaGtidEvent {
    /// The transaction's GTID (server id from the event header).
    pub gtid: MariaGtid,
    /// Whether the group is a single statement without BEGIN/COMMIT (DDL).
    pub standalone: bool,
}

impl MariaGtidEvent {
    /// Decodes the event body (after the 19-byte header, without checksum):
    /// `seq_no u64, domain_id u32, flags2 u8 [, commit_id u64]`.
    pub fn parse(body: &[u8], server_id: u32) -> Option<Self> {
        let sequence = u64::from_le_bytes(body.get(0..8)?.try_into().ok()?);
        let domain = u32::from_le_bytes(body.get(8..12)?.try_into().ok()?);
        let flags = *body.get(12)?;
        if flags & FL_GROUP_COMMIT_ID != 0 && body.len() < 21 {
            return None;
        }
        Some(Self {
            gtid: MariaGtid { domain, server: server_id, sequence },
            standalone: flags & FL_STANDALONE != 0,
        })
    }
}

/// Decodes a GTID list event body: `count u32 (low 28 bits), then count x
/// (domain u32, server u32, seq u64)`.
pub fn parse_gtid_list(body: &[u8]) -> Option<Vec<MariaGtid>> {
    let count = (u32::from_le_bytes(body.get(0..4)?.try_into().ok()?) & 0x0fff_ffff) as usize;
    let mut out = Vec::with_capacity(count.min(1024));
    for i in 0..count {
        let at = 4 + i * 16;
        let rec = body.get(at..at + 16)?;
        out.push(MariaGtid {
            domain: u32::from_le_bytes(rec[0..4].try_into().ok()?),
            server: u32::from_le_bytes(rec[4..8].try_into().ok()?),
            sequence: u64::from_le_bytes(rec[8..16].try_into().ok()?),
        });
    }
    Some(out)
}

/// MariaDB's GTID position: the last GTID of each domain, as
/// `gtid_slave_pos` / `@slave_connect_state` spell it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MariaGtidPos(BTreeMap<u32, MariaGtid>);

impl MariaGtidPos {
    /// Parses `0-1-42,1-2-7` (empty text: no position).
    pub fn parse(text: &str) -> Option<Self> {
        let mut out = BTreeMap::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let mut it = part.split('-');
            let gtid = MariaGtid {
                domain: it.next()?.parse().ok()?,
                server: it.next()?.parse().ok()?,
                sequence: it.next()?.parse().ok()?,
            };
            if it.next().is_some() {
                return None;
            }
            out.insert(gtid.domain, gtid);
        }
        Some(Self(out))
    }

    /// Records a committed transaction.
    pub fn advance(&mut self, gtid: MariaGtid) {
        self.0.insert(gtid.domain, gtid);
    }
}

impl fmt::Display for MariaGtidPos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.values().map(ToString::to_string).collect();
        f.write_str(&parts.join(","))
    }
}

/// A MySQL GTID set: per source UUID, disjoint sorted closed intervals.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MySqlGtidSet(BTreeMap<String, Vec<(u64, u64)>>);

impl MySqlGtidSet {
    /// Parses `uuid:1-5:7,uuid2:1-3` (`@@gtid_executed`; newlines allowed).
    pub fn parse(text: &str) -> Option<Self> {
        let mut set = Self::default();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let mut it = part.split(':');
            let uuid = it.next()?.trim().to_ascii_lowercase();
            if uuid.len() != 36 {
                return None;
            }
            for interval in it {
                let (lo, hi) = match interval.split_once('-') {
                    Some((a, b)) => (a.parse().ok()?, b.parse().ok()?),
                    None => {
                        let n = interval.parse().ok()?;
                        (n, n)
                    }
                };
                if lo == 0 || hi < lo {
                    return None;
                }
                set.add_range(&uuid, lo, hi);
            }
        }
        Some(set)
    }

    /// Adds one transaction `uuid:gno`.
    pub fn add(&mut self, uuid: &str, gno: u64) {
        self.add_range(uuid, gno, gno);
    }

    fn add_range(&mut self, uuid: &str, lo: u64, hi: u64) {
        let intervals = self.0.entry(uuid.to_ascii_lowercase()).or_default();
        intervals.push((lo, hi));
        intervals.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(intervals.len());
        for &(a, b) in intervals.iter() {
            match merged.last_mut() {
                Some(last) if a <= last.1.saturating_add(1) => last.1 = last.1.max(b),
                _ => merged.push((a, b)),
            }
        }
        *intervals = merged;
    }

    /// Whether `uuid:gno` is in the set (a transaction to skip on resume).
    pub fn contains(&self, uuid: &str, gno: u64) -> bool {
        self.0
            .get(&uuid.to_ascii_lowercase())
            .is_some_and(|iv| iv.iter().any(|&(a, b)| a <= gno && gno <= b))
    }
}

/// The UUID text of a 16-byte server id (MySQL's GTID event `sid`).
pub fn uuid_text(sid: [u8; 16]) -> String {
    uuid::Uuid::from_bytes(sid).hyphenated().to_string()
}

impl fmt::Display for MySqlGtidSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .0
            .iter()
            .map(|(uuid, iv)| {
                let mut s = uuid.clone();
                for (a, b) in iv {
                    if a == b {
                        s.push_str(&format!(":{a}"));
                    } else {
                        s.push_str(&format!(":{a}-{b}"));
                    }
                }
                s
            })
            .collect();
        f.write_str(&parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mariadb_gtid_event_decodes_with_and_without_commit_id() {
        // A DDL group as MariaDB 10.11 writes it: seq 42, domain 0, standalone.
        let mut body = 42u64.to_le_bytes().to_vec();
        body.extend(0u32.to_le_bytes());
        body.push(FL_STANDALONE | 32);
        body.extend([0u8; 6]);
        let e = MariaGtidEvent::parse(&body, 1).expect("decodes");
        assert_eq!(e.gtid.to_string(), "0-1-42");
        assert!(e.standalone);

        // A group-committed transaction in domain 3: the commit id follows.
        let mut body = 7u64.to_le_bytes().to_vec();
        body.extend(3u32.to_le_bytes());
        body.push(FL_GROUP_COMMIT_ID | 4);
        body.extend(99u64.to_le_bytes());
        let e = MariaGtidEvent::parse(&body, 2).expect("decodes");
        assert_eq!(e.gtid.to_string(), "3-2-7");
        assert!(!e.standalone);
        // Truncated: no panic, no event.
        assert_eq!(MariaGtidEvent::parse(&body[..15], 2), None);
        assert_eq!(MariaGtidEvent::parse(&[], 2), None);
    }

    #[test]
    fn mariadb_gtid_list_and_position_round_trip() {
        let mut body = 2u32.to_le_bytes().to_vec();
        for (d, s, n) in [(0u32, 1u32, 10u64), (1, 5, 3)] {
            body.extend(d.to_le_bytes());
            body.extend(s.to_le_bytes());
            body.extend(n.to_le_bytes());
        }
        let list = parse_gtid_list(&body).expect("decodes");
        let mut pos = MariaGtidPos::default();
        for g in list {
            pos.advance(g);
        }
        assert_eq!(pos.to_string(), "0-1-10,1-5-3");
        pos.advance(MariaGtid { domain: 0, server: 1, sequence: 11 });
        assert_eq!(MariaGtidPos::parse(&pos.to_string()), Some(pos.clone()));
        assert_eq!(pos.to_string(), "0-1-11,1-5-3");
        assert_eq!(parse_gtid_list(&body[..20]), None);
        assert_eq!(MariaGtidPos::parse("0-1"), None);
    }

    #[test]
    fn mysql_gtid_sets_merge_intervals() {
        let a = "3e11fa47-71ca-11e1-9e33-c80aa9429562";
        let mut set =
            MySqlGtidSet::parse(&format!("{a}:1-5:7,\n4e11fa47-71ca-11e1-9e33-c80aa9429562:1-3")).expect("parses");
        assert!(set.contains(a, 3) && !set.contains(a, 6));
        set.add(a, 6);
        assert_eq!(set.to_string(), format!("{a}:1-7,4e11fa47-71ca-11e1-9e33-c80aa9429562:1-3"));
        set.add(a, 9);
        assert_eq!(set.to_string().split(',').next(), Some(format!("{a}:1-7:9").as_str()));
        assert_eq!(MySqlGtidSet::parse("nonsense:1"), None);
        assert_eq!(MySqlGtidSet::parse(&format!("{a}:5-1")), None);
        let sid = *uuid::Uuid::parse_str(a).expect("uuid").as_bytes();
        assert_eq!(uuid_text(sid), a);
    }
}
