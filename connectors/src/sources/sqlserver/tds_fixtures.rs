//! The tiberius query layer against byte fixtures written from the TDS
//! specification ([MS-TDS]: <https://learn.microsoft.com/openspecs/windows_protocols/ms-tds>):
//! a server in the test process answers [`TiberiusClient`] over a real
//! socket with the bytes a SQL Server sends, and the client's rows are
//! decoded as the source decodes them. No SQL Server runs here: the
//! fixtures are only as right as our reading of the specification.

use std::time::Duration;

use secrecy::SecretString;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tributary_schemas::{TableId, Value};

use super::client::{CaptureInstance, CdcClient, TiberiusClient};
use super::config::ConnectionParams;
use super::lsn::Lsn;
use super::types::ColumnDef;
use crate::tls::TlsMode;

/// One message, in one packet (MS-TDS 2.2.3.1.1: type, status 0x01 end
/// of message, length big-endian including the 8-byte header, SPID,
/// packet id, window).
fn packet(kind: u8, payload: &[u8]) -> Vec<u8> {
    let len = u16::try_from(payload.len() + 8).expect("one packet");
    let mut out = vec![kind, 0x01];
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&[0, 0, 1, 0]);
    out.extend_from_slice(payload);
    out
}

/// Reads one client message (its packets up to end of message).
async fn read_message(sock: &mut TcpStream) -> (u8, Vec<u8>) {
    let mut payload = Vec::new();
    loop {
        let mut header = [0u8; 8];
        sock.read_exact(&mut header).await.expect("header");
        let len = usize::from(u16::from_be_bytes([header[2], header[3]]));
        let mut body = vec![0u8; len - 8];
        sock.read_exact(&mut body).await.expect("body");
        payload.extend_from_slice(&body);
        if header[1] & 0x01 != 0 {
            return (header[0], payload);
        }
    }
}

fn utf16(s: &str) -> Vec<u8> {
    s.encode_utf16().flat_map(u16::to_le_bytes).collect()
}

/// B_VARCHAR: a character count byte, then UTF-16LE (MS-TDS 2.2.5.1.3).
fn b_varchar(s: &str) -> Vec<u8> {
    let mut out = vec![u8::try_from(s.encode_utf16().count()).expect("short")];
    out.extend(utf16(s));
    out
}

/// PRELOGIN response (MS-TDS 2.2.6.5): option tokens (token, offset, length,
/// big-endian), the terminator 0xFF, then the data: VERSION (6 bytes) and
/// ENCRYPTION = ENCRYPT_NOT_SUP (0x02).
fn prelogin_response() -> Vec<u8> {
    let mut out = vec![0x00, 0x00, 11, 0x00, 6, 0x01, 0x00, 17, 0x00, 1, 0xFF];
    out.extend_from_slice(&[16, 0, 0x07, 0xD0, 0, 0]);
    out.push(0x02);
    out
}

/// DONE (MS-TDS 2.2.7.6): status (0x10: the count is valid), current
/// command, row count (8 bytes from TDS 7.2).
fn done(rows: u64) -> Vec<u8> {
    let mut out = vec![0xFD];
    out.extend_from_slice(&(if rows > 0 { 0x10u16 } else { 0 }).to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&rows.to_le_bytes());
    out
}

/// LOGINACK (MS-TDS 2.2.7.14): length, interface 1 (SQL_TSQL), TDS version
/// 7.4 (0x74000004, big-endian), program name, program version; then DONE.
fn login_response() -> Vec<u8> {
    let mut body = vec![0x01];
    body.extend_from_slice(&0x7400_0004u32.to_be_bytes());
    body.extend(b_varchar("Microsoft SQL Server"));
    body.extend_from_slice(&[16, 0, 0x07, 0xD0]);
    let mut out = vec![0xAD];
    out.extend_from_slice(&u16::try_from(body.len()).expect("short").to_le_bytes());
    out.extend(body);
    out.extend(done(0));
    out
}

/// A PLP value (MS-TDS 2.2.5.2.3): total length (8 bytes), chunks of a
/// 4-byte length and data, the terminator chunk of length 0.
fn plp(data: &[u8], chunk: usize) -> Vec<u8> {
    let mut out = (data.len() as u64).to_le_bytes().to_vec();
    for c in data.chunks(chunk) {
        out.extend_from_slice(&u32::try_from(c.len()).expect("chunk").to_le_bytes());
        out.extend_from_slice(c);
    }
    out.extend_from_slice(&0u32.to_le_bytes());
    out
}

/// A column of the fixture: its definition in the capture instance, its
/// COLMETADATA TYPE_INFO (MS-TDS 2.2.5.6), its ROW bytes, and the value
/// the source must read.
struct Fixture {
    column: ColumnDef,
    type_info: Vec<u8>,
    row: Vec<u8>,
    want: Value,
}

fn every_type() -> Vec<Fixture> {
    // Days from 0001-01-01 to 2024-02-29 (the DATE part of datetime2 and
    // datetimeoffset, 3 bytes little-endian: MS-TDS 2.2.5.5.1.8).
    let days: u32 = 738_944;
    let micros_2024_02_29 = 1_709_164_800_000_000i64;
    // 13:14:15.1234567 as 100 ns increments (scale 7: 5 bytes, 2.2.5.5.1.10).
    let ticks: u64 = (13 * 3600 + 14 * 60 + 15) * 10_000_000 + 1_234_567;
    let time_of_day: i64 = (13 * 3600 + 14 * 60 + 15) * 1_000_000 + 123_456;
    let date_time = |extra: &[u8]| {
        let mut out = vec![u8::try_from(8 + extra.len()).expect("len")];
        out.extend_from_slice(&ticks.to_le_bytes()[..5]);
        out.extend_from_slice(&days.to_le_bytes()[..3]);
        out.extend_from_slice(extra);
        out
    };
    let guid = uuid::Uuid::parse_str("6f9619ff-8b86-d011-b42d-00c04fc964ff").expect("uuid");
    // uniqueidentifier on the wire: the first three groups little-endian
    // (MS-TDS 2.2.5.5.1.7 refers to the GUID structure of MS-DTYP 2.3.4.2).
    let guid_wire = guid.to_bytes_le();
    // decimal(38,10): sign byte (1 positive), then the 16-byte little-endian
    // magnitude (MS-TDS 2.2.5.5.1.6).
    let big: u128 = 12_345_678_901_234_567_890_123_456_789_012_345_678;
    let mut decimal = vec![17, 1];
    decimal.extend_from_slice(&big.to_le_bytes());
    // money read through CAST(... AS decimal(19,4)): 9 bytes, -922337203685477.5808.
    let mut money = vec![9, 0];
    money.extend_from_slice(&9_223_372_036_854_775_808u64.to_le_bytes());
    let blob: Vec<u8> = (0..=255u8).cycle().take(10_000).collect();
    let xml = "<a b=\"1\">é</a>";
    let nvarchar_ci = [0x09, 0x04, 0xD0, 0x00, 0x34];
    let mut text = (u16::try_from(utf16("héllo, 世界").len()).expect("short"))
        .to_le_bytes()
        .to_vec();
    text.extend(utf16("héllo, 世界"));
    vec![
        Fixture {
            column: ColumnDef::new("id", "int", false),
            type_info: vec![0x26, 4],
            row: [&[4u8][..], &(-7i32).to_le_bytes()].concat(),
            want: Value::Int32(-7),
        },
        Fixture {
            column: ColumnDef::new("big", "bigint", true),
            type_info: vec![0x26, 8],
            row: [&[8u8][..], &i64::MIN.to_le_bytes()].concat(),
            want: Value::Int64(i64::MIN),
        },
        Fixture {
            column: ColumnDef::new("small", "smallint", true),
            type_info: vec![0x26, 2],
            row: vec![0],
            want: Value::Null,
        },
        Fixture {
            column: ColumnDef::new("flag", "bit", true),
            type_info: vec![0x68, 1],
            row: vec![1, 1],
            want: Value::Boolean(true),
        },
        Fixture {
            column: ColumnDef::new("amount", "decimal(38,10)", true),
            type_info: vec![0x6A, 17, 38, 10],
            row: decimal,
            want: Value::Decimal("1234567890123456789012345678.9012345678".into()),
        },
        Fixture {
            column: ColumnDef::new("price", "money", true),
            type_info: vec![0x6A, 9, 19, 4],
            row: money,
            want: Value::Decimal("-922337203685477.5808".into()),
        },
        Fixture {
            column: ColumnDef::new("guid", "uniqueidentifier", true),
            type_info: vec![0x24, 16],
            row: [&[16u8][..], &guid_wire].concat(),
            want: Value::Uuid(guid),
        },
        Fixture {
            column: ColumnDef::new("at", "datetime2(7)", true),
            type_info: vec![0x2A, 7],
            row: date_time(&[]),
            want: Value::Timestamp(micros_2024_02_29 + time_of_day),
        },
        Fixture {
            // +05:30: the wire holds the UTC time and the offset in minutes.
            column: ColumnDef::new("at_tz", "datetimeoffset(7)", true),
            type_info: vec![0x2B, 7],
            row: date_time(&330i16.to_le_bytes()),
            want: Value::TimestampTz(micros_2024_02_29 + time_of_day),
        },
        Fixture {
            column: ColumnDef::new("blob", "varbinary(max)", true),
            type_info: vec![0xA5, 0xFF, 0xFF],
            row: plp(&blob, 4000),
            want: Value::Bytes(blob.clone()),
        },
        Fixture {
            // XML: no schema collection (MS-TDS 2.2.5.5.3), UTF-16LE in PLP.
            column: ColumnDef::new("doc", "xml", true),
            type_info: vec![0xF1, 0x00],
            row: plp(&utf16(xml), 7),
            want: Value::Text(xml.into()),
        },
        Fixture {
            column: ColumnDef::new("name", "nvarchar(100)", true),
            type_info: [&[0xE7u8, 200, 0][..], &nvarchar_ci].concat(),
            row: text,
            want: Value::Text("héllo, 世界".into()),
        },
        Fixture {
            column: ColumnDef::new("gone", "nvarchar(100)", true),
            type_info: [&[0xE7u8, 200, 0][..], &nvarchar_ci].concat(),
            row: vec![0xFF, 0xFF],
            want: Value::Null,
        },
    ]
}

/// COLMETADATA (MS-TDS 2.2.7.4): column count, then per column the user
/// type (4 bytes from TDS 7.2), flags (0x0001 nullable), TYPE_INFO and the
/// name; one ROW (2.2.7.19: 0xD1 and each value); DONE.
fn result_set(fixtures: &[Fixture]) -> Vec<u8> {
    let mut out = vec![0x81];
    out.extend_from_slice(&u16::try_from(fixtures.len()).expect("few").to_le_bytes());
    for f in fixtures {
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&u16::from(f.column.nullable).to_le_bytes());
        out.extend_from_slice(&f.type_info);
        out.extend(b_varchar(&f.column.name));
    }
    out.push(0xD1);
    for f in fixtures {
        out.extend_from_slice(&f.row);
    }
    out.extend(done(1));
    out
}

/// Serves one session: PRELOGIN, LOGIN7, then answers the SQL batches
/// with `results` in turn.
async fn serve(listener: TcpListener, results: Vec<Vec<u8>>) {
    let (mut sock, _) = listener.accept().await.expect("accept");
    let (kind, _) = read_message(&mut sock).await;
    assert_eq!(kind, 0x12, "PRELOGIN first");
    sock.write_all(&packet(0x04, &prelogin_response())).await.expect("prelogin");
    let (kind, _) = read_message(&mut sock).await;
    assert_eq!(kind, 0x10, "LOGIN7 next");
    sock.write_all(&packet(0x04, &login_response())).await.expect("login");
    for result in results {
        let (kind, _) = read_message(&mut sock).await;
        assert_eq!(kind, 0x01, "a SQL batch");
        sock.write_all(&packet(0x04, &result)).await.expect("result");
    }
}

/// The columns `cdc.fn_cdc_get_all_changes_<instance>` puts first, as the
/// source selects them: `__$start_lsn` and `__$seqval` binary(10)
/// (BIGBINARYTYPE 0xAD, a 2-byte length: MS-TDS 2.2.5.4.2), `__$operation`
/// int, the commit time in ms as bigint. (Their `want` is not compared:
/// the test checks the change row's fields.)
fn cdc_columns(start: Lsn, seqval: Lsn, operation: i32, ts_ms: i64) -> Vec<Fixture> {
    let lsn = |name: &str, l: Lsn| Fixture {
        column: ColumnDef::new(name, "binary(10)", false),
        type_info: vec![0xAD, 10, 0],
        row: [&[10u8, 0][..], &l.0].concat(),
        want: Value::Null,
    };
    vec![
        lsn("__$start_lsn", start),
        lsn("__$seqval", seqval),
        Fixture {
            column: ColumnDef::new("__$operation", "int", false),
            type_info: vec![0x26, 4],
            row: [&[4u8][..], &operation.to_le_bytes()].concat(),
            want: Value::Null,
        },
        Fixture {
            column: ColumnDef::new("ts", "bigint", true),
            type_info: vec![0x26, 8],
            row: [&[8u8][..], &ts_ms.to_le_bytes()].concat(),
            want: Value::Null,
        },
    ]
}

#[tokio::test]
async fn every_type_decodes_from_the_bytes_ms_tds_specifies() {
    let fixtures = every_type();
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let (start, seqval) = (Lsn::new(0x2d, 0xffff_fff0, 3), Lsn::new(0x2d, 0xffff_fff0, 1));
    let mut change = cdc_columns(start, seqval, 4, 1_709_164_800_123);
    change.extend(every_type());
    let server = tokio::spawn(serve(listener, vec![result_set(&fixtures), result_set(&change)]));
    let params = ConnectionParams {
        host: "127.0.0.1".into(),
        port,
        user: "tributary".into(),
        password: SecretString::from("secret".to_string()),
        database: "fixtures".into(),
        tls: TlsMode::Disable,
        tls_ca_file: None,
        connect_timeout: Duration::from_secs(5),
    };
    let mut client = tokio::time::timeout(Duration::from_secs(10), TiberiusClient::connect(&params))
        .await
        .expect("in time")
        .expect("logs in");
    let instance = CaptureInstance {
        name: "dbo_all_types".into(),
        table: TableId::new("dbo", "all_types"),
        start_lsn: Lsn::ZERO,
        columns: fixtures.iter().map(|f| f.column.clone()).collect(),
        key: vec!["id".into()],
    };
    let rows = client.snapshot_rows(&instance, None, 10).await.expect("rows");
    assert_eq!(rows.len(), 1);
    for (f, got) in fixtures.iter().zip(&rows[0]) {
        assert_eq!(got, &f.want, "column {} ({})", f.column.name, f.column.type_text);
    }
    let changes = client.changes(&instance, Lsn::new(0x2d, 0, 0), start).await.expect("changes");
    assert_eq!(changes.len(), 1);
    let c = &changes[0];
    assert_eq!((c.start_lsn, c.seqval, c.operation, c.ts_ms), (start, seqval, 4, 1_709_164_800_123));
    let want: Vec<Value> = fixtures.iter().map(|f| f.want.clone()).collect();
    assert_eq!(c.row, want);
    server.await.expect("the server answered every batch");
}
