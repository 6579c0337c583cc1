//! Against the real schema registry (`SCHEMA_REGISTRY_URL`, default the
//! local stack's Apicurio, Confluent-compatible API). Subjects are unique
//! per run so reruns do not collide. Skipped with a message when the
//! registry is down, unless `CI` is set.

mod fixtures;

use std::sync::Arc;

use tributary_schemas::decoder::Decoded;
use tributary_schemas::{
    Column, DataType, EnvelopeOptions, EventDecoder, EventEncoder, Registry, SchemaError, TableSchema,
};

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

const SCHEMA_A: &str = r#"{"type":"record","name":"A","namespace":"t","fields":[{"name":"a","type":"int"}]}"#;

#[tokio::test]
async fn register_read_and_reregister() {
    if !fixtures::service_available("schema registry", fixtures::registry_up()).await {
        return;
    }
    let subject = unique("reg-test");
    let registry = Registry::new(fixtures::registry_url()).expect("client");
    let id = registry.register(&subject, SCHEMA_A).await.expect("register");
    // A second client (empty caches) gets the same id from the server.
    let fresh = Registry::new(fixtures::registry_url()).expect("client");
    assert_eq!(fresh.register(&subject, SCHEMA_A).await.expect("re-register"), id);
    let schema = fresh.schema(id).await.expect("read by id");
    assert!(matches!(&*schema, apache_avro::Schema::Record(r) if r.name.name() == "A"));
    let text = fresh.schema_text(id).await.expect("text");
    assert!(text.contains("\"a\""));
    let latest = fresh.latest(&subject).await.expect("latest").expect("has a version");
    assert_eq!(latest.0, id);
    assert_eq!(fresh.latest(&unique("none")).await.expect("latest"), None);
}

#[tokio::test]
async fn errors_say_whether_to_retry() {
    if !fixtures::service_available("schema registry", fixtures::registry_up()).await {
        return;
    }
    let registry = Registry::new(fixtures::registry_url()).expect("client");
    match registry.schema(u32::MAX - 7).await {
        Err(SchemaError::Registry { retryable, .. }) => assert!(!retryable, "404 is not retryable"),
        other => panic!("expected a registry error, got {other:?}"),
    }
    let dead = Registry::new("http://127.0.0.1:9/apis/ccompat/v7").expect("client");
    match dead.schema(1).await {
        Err(SchemaError::Registry { retryable, .. }) => assert!(retryable, "a refused connection is retryable"),
        other => panic!("expected a registry error, got {other:?}"),
    }
    // The registry itself refuses an incompatible version (409).
    let subject = unique("reg-refuse");
    registry.set_compatibility(&subject, "BACKWARD").await.expect("config");
    registry.register(&subject, SCHEMA_A).await.expect("v1");
    let narrowed = SCHEMA_A.replace(r#""type":"int""#, r#""type":"string""#);
    assert!(!registry.check_compatible(&subject, &narrowed).await.expect("check"));
    match registry.register(&subject, &narrowed).await {
        Err(SchemaError::Registry { retryable, .. }) => assert!(!retryable),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn with_columns(base: &TableSchema, f: impl FnOnce(&mut Vec<Column>)) -> Arc<TableSchema> {
    let mut t = base.clone();
    f(&mut t.columns);
    Arc::new(t)
}

#[tokio::test]
async fn evolution_is_checked_before_producing() {
    if !fixtures::service_available("schema registry", fixtures::registry_up()).await {
        return;
    }
    let topic = unique("evo.public.orders");
    let registry = Registry::new(fixtures::registry_url()).expect("client");
    let mut encoder = EventEncoder::new(registry.clone(), EnvelopeOptions::default());
    let v1 = fixtures::table();
    encoder.prepare(&v1, &topic).await.expect("first version");
    let (_, key_id, v1_id) = encoder.prepared(&topic).expect("prepared");
    assert!(key_id.is_some());

    // The subject's level was set to BACKWARD.
    let config: serde_json::Value = reqwest::get(format!("{}/config/{topic}-value", fixtures::registry_url()))
        .await
        .expect("get config")
        .json()
        .await
        .expect("json");
    assert_eq!(config["compatibilityLevel"], "BACKWARD");

    // Compatible: a new nullable column and a widened type.
    let v2 = with_columns(&v1, |c| {
        c.push(Column {
            name: "gift_note".into(),
            data_type: DataType::Text,
            nullable: true,
            source_type: "text".into(),
            default: None,
            aliases: Vec::new(),
            column_id: None,
        });
        let qty = c.iter_mut().find(|c| c.name == "qty").expect("qty");
        qty.data_type = DataType::Int64;
    });
    encoder.prepare(&v2, &topic).await.expect("compatible evolution");
    let (_, _, v2_id) = encoder.prepared(&topic).expect("prepared");
    assert_ne!(v1_id, v2_id);

    // Relaxed, not refused: a NOT NULL column without a default is
    // written as optional, a narrowed type keeps its wider type, and a NOT
    // NULL column with a default carries it.
    let v3 = with_columns(&v2, |c| {
        c.push(Column {
            name: "must".into(),
            data_type: DataType::Boolean,
            nullable: false,
            source_type: "boolean".into(),
            default: None,
            aliases: Vec::new(),
            column_id: None,
        });
        c.push(Column::new("flag", DataType::Text, false).with_default(&tributary_schemas::Value::Text("x".into())));
        let id = c.iter_mut().find(|c| c.name == "id").expect("id");
        id.data_type = DataType::Int32;
    });
    encoder.prepare(&v3, &topic).await.expect("relaxed evolution");
    let (schemas, _, v3_id) = encoder.prepared(&topic).expect("prepared");
    assert!(schemas.value.contains(r#""default":"x""#), "{}", schemas.value);
    let written = encoder.written(&topic).expect("written");
    let shape = |name: &str| {
        written
            .columns
            .iter()
            .find(|c| c.name == name)
            .map(|c| (c.data_type.clone(), c.nullable))
    };
    assert_eq!(shape("must"), Some((DataType::Boolean, true)));
    assert_eq!(shape("id"), Some((DataType::Int64, false)));
    assert_eq!(shape("flag"), Some((DataType::Text, false)));

    // Refused: a type no shape carries over.
    let v4 = with_columns(&v3, |c| {
        let qty = c.iter_mut().find(|c| c.name == "qty").expect("qty");
        qty.data_type = DataType::Text;
    });
    let err = encoder.prepare(&v4, &topic).await.expect_err("incompatible");
    match &err {
        SchemaError::Incompatible { table, columns, reason } => {
            assert_eq!(table, &v1.id);
            assert_eq!(columns, "qty");
            assert!(reason.contains("int64") && reason.contains("text"), "{reason}");
        }
        other => panic!("expected Incompatible, got {other:?}"),
    }
    assert!(err.to_string().contains("public.orders"));

    // After a restart (a new encoder), every shape registered before is
    // found by its content and keeps its version (the replay of events
    // written before a schema change), and the registry's latest version
    // is the reference for a new one: v4 is still refused.
    let mut restarted = EventEncoder::new(registry.clone(), EnvelopeOptions::default());
    assert!(matches!(restarted.prepare(&v4, &topic).await, Err(SchemaError::Incompatible { .. })));
    restarted.prepare(&v1, &topic).await.expect("v1 after restart");
    assert_eq!(restarted.prepared(&topic).expect("prepared").2, v1_id);
    restarted.prepare(&v3, &topic).await.expect("v3 after restart");
    assert_eq!(restarted.prepared(&topic).expect("prepared").2, v3_id);
    restarted.prepare(&v2, &topic).await.expect("same version after restart");
    assert_eq!(restarted.prepared(&topic).expect("prepared").2, v2_id);

    // v3's narrowed id is written as the wider type, and reads back as it.
    let mut event = fixtures::events().remove(1).1;
    let mut row = event.after.take().expect("row");
    let id_at = v3.column_index("id").expect("id");
    let tributary_schemas::Value::Int64(id) = row[id_at] else {
        panic!("id is int64")
    };
    row[id_at] = tributary_schemas::Value::Int32(i32::try_from(id).expect("small id"));
    row[17] = tributary_schemas::Value::Int64(3);
    row.push(tributary_schemas::Value::Null);
    row.push(tributary_schemas::Value::Boolean(true));
    row.push(tributary_schemas::Value::Text("y".into()));
    event.after = Some(row);
    event.schema = v3.clone();
    let rec = restarted.encode(&event, &topic).expect("encode v3");
    let mut decoder = EventDecoder::new(Registry::new(fixtures::registry_url()).expect("client"));
    let Decoded::Change(back) = decoder
        .decode(&topic, rec.key.as_deref(), rec.value.as_deref())
        .await
        .expect("decode v3")
    else {
        panic!("a change")
    };
    assert_eq!(back.after.as_ref().expect("after")[id_at], tributary_schemas::Value::Int64(id));
    let flag = back.schema.columns.iter().find(|c| c.name == "flag").expect("flag");
    assert_eq!(flag.default_value(), Some(tributary_schemas::Value::Text("x".into())));

    // Events encoded with v2 decode through the real registry.
    let mut event = fixtures::events().remove(1).1;
    let mut row = event.after.take().expect("row");
    row[17] = tributary_schemas::Value::Int64(3);
    row.push(tributary_schemas::Value::Text("for you".into()));
    event.after = Some(row);
    event.schema = v2.clone();
    let rec = restarted.encode(&event, &topic).expect("encode");
    let mut decoder = EventDecoder::new(Registry::new(fixtures::registry_url()).expect("client"));
    let decoded = decoder
        .decode(&topic, rec.key.as_deref(), rec.value.as_deref())
        .await
        .expect("decode");
    assert_eq!(decoded, Decoded::Change(event));
}

#[tokio::test]
async fn renames_and_drops_travel_in_the_schema() {
    if !fixtures::service_available("schema registry", fixtures::registry_up()).await {
        return;
    }
    let topic = unique("ren.public.orders");
    let registry = Registry::new(fixtures::registry_url()).expect("client");
    let mut encoder = EventEncoder::new(registry.clone(), EnvelopeOptions::default());
    let v1 = fixtures::table();
    encoder.prepare(&v1, &topic).await.expect("v1");
    let old = fixtures::events().remove(1).1;
    let old_rec = encoder.encode(&old, &topic).expect("encode v1");

    // RENAME COLUMN customer TO buyer; DROP COLUMN ratio.
    let ratio = v1.column_index("ratio").expect("ratio");
    let v2 = with_columns(&v1, |c| {
        c.remove(ratio);
        let customer = c.iter_mut().find(|c| c.name == "customer").expect("customer");
        customer.name = "buyer".into();
        customer.aliases = vec!["customer".into()];
    });
    encoder
        .prepare(&v2, &topic)
        .await
        .expect("BACKWARD compatible: the registry takes it");
    let (schemas, _, _) = encoder.prepared(&topic).expect("prepared");
    assert!(schemas.value.contains(r#""aliases":["customer"]"#), "{}", schemas.value);
    assert!(schemas.value.contains(r#""tributary.dropped":["ratio"]"#), "{}", schemas.value);
    let v2_value = schemas.value.clone();

    // A source restarted before the events of v2 were committed replays
    // them with the shape it reads again (no aliases, nothing dropped):
    // that is v2, drop and all, not a new version without the drop.
    let mut restarted = EventEncoder::new(registry.clone(), EnvelopeOptions::default());
    let v2_again = with_columns(&v2, |c| c.iter_mut().for_each(|c| c.aliases.clear()));
    restarted.prepare(&v2_again, &topic).await.expect("v2 again");
    let (again, _, _) = restarted.prepared(&topic).expect("prepared again");
    assert_eq!(again.value, v2_value, "the registered v2 is used as it is");
    let mut new = fixtures::events().remove(2).1;
    new.schema = v2.clone();
    for row in [new.before.as_mut(), new.after.as_mut()].into_iter().flatten() {
        row.remove(ratio);
    }
    let new_rec = encoder.encode(&new, &topic).expect("encode v2");

    // A decoder started after the rename reads the v1 event with the new
    // name (its values where they were), and v2's with the drop recorded.
    let mut decoder = EventDecoder::new(Registry::new(fixtures::registry_url()).expect("client"));
    let Decoded::Change(back_old) = decoder
        .decode(&topic, old_rec.key.as_deref(), old_rec.value.as_deref())
        .await
        .expect("decode v1")
    else {
        panic!("a change")
    };
    let names: Vec<&str> = back_old.schema.columns.iter().map(|c| c.name.as_str()).collect();
    assert!(names.contains(&"buyer") && !names.contains(&"customer"), "{names:?}");
    assert!(names.contains(&"ratio"), "v1 still has ratio: {names:?}");
    assert_eq!(back_old.after, old.after);
    let Decoded::Change(back_new) = decoder
        .decode(&topic, new_rec.key.as_deref(), new_rec.value.as_deref())
        .await
        .expect("decode v2")
    else {
        panic!("a change")
    };
    assert_eq!(back_new.schema.dropped, vec!["ratio".to_string()]);
    let buyer = back_new.schema.columns.iter().find(|c| c.name == "buyer").expect("buyer");
    assert_eq!(buyer.aliases, vec!["customer".to_string()]);
    assert_eq!(back_new.after, new.after);

    // A decoder that saw v1 before v2 existed reads later v1 events (a
    // partition behind another) with the new names once it has seen v2.
    let mut early = EventDecoder::new(Registry::new(fixtures::registry_url()).expect("client"));
    let fresh_topic = unique("ren2.public.orders");
    let mut enc = EventEncoder::new(registry.clone(), EnvelopeOptions::default());
    enc.prepare(&v1, &fresh_topic).await.expect("v1");
    let r1 = enc.encode(&old, &fresh_topic).expect("v1 event");
    let first = early
        .decode(&fresh_topic, r1.key.as_deref(), r1.value.as_deref())
        .await
        .expect("v1");
    let Decoded::Change(first) = first else {
        panic!("a change")
    };
    assert!(first.schema.column_index("customer").is_some());
    enc.prepare(&v2, &fresh_topic).await.expect("v2");
    let r2 = enc.encode(&new, &fresh_topic).expect("v2 event");
    early
        .decode(&fresh_topic, r2.key.as_deref(), r2.value.as_deref())
        .await
        .expect("v2");
    let Decoded::Change(late) = early
        .decode(&fresh_topic, r1.key.as_deref(), r1.value.as_deref())
        .await
        .expect("v1")
    else {
        panic!("a change")
    };
    assert!(late.schema.column_index("buyer").is_some(), "read with the newest names");
}
