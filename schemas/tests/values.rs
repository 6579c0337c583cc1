//! Values that do not fit their column are refused with an error naming
//! the table, column, value kind and type, and never the value itself.

mod fixtures;

use tributary_schemas::{EnvelopeOptions, EventEncoder, Registry, SchemaError, Value};

async fn encoder() -> EventEncoder {
    let mut e = EventEncoder::new(Registry::in_memory(), EnvelopeOptions::default());
    e.prepare(&fixtures::table(), fixtures::TOPIC).await.expect("prepare");
    e
}

/// Encodes the create event with column `index` replaced by `value`.
async fn encode_with(index: usize, value: Value) -> Result<(), SchemaError> {
    let e = encoder().await;
    let (_, mut event) = fixtures::events().into_iter().nth(1).expect("create");
    if let Some(row) = event.after.as_mut() {
        row[index] = value;
    }
    e.encode(&event, fixtures::TOPIC).map(|_| ())
}

fn assert_value_error(r: Result<(), SchemaError>, column: &str, kind: &str, secret: &str) {
    let err = r.expect_err("must be refused");
    let text = err.to_string();
    match &err {
        SchemaError::Value { table, column: c, value_kind, .. } => {
            assert_eq!(table.to_string(), "public.orders");
            assert_eq!(c, column);
            assert_eq!(*value_kind, kind);
        }
        other => panic!("expected a value error, got {other:?}"),
    }
    assert!(text.contains("public.orders") && text.contains(column), "{text}");
    assert!(secret.is_empty() || !text.contains(secret), "the error shows the value: {text}");
}

#[tokio::test]
async fn unfit_values_are_refused_without_showing_them() {
    // amount is decimal(12,2), NOT NULL.
    assert_value_error(encode_with(3, Value::Decimal("NaN".into())).await, "amount", "decimal", "NaN");
    assert_value_error(
        encode_with(3, Value::Decimal("123456789012.5".into())).await,
        "amount",
        "decimal",
        "123456789012",
    );
    assert_value_error(encode_with(3, Value::Decimal("1.234".into())).await, "amount", "decimal", "1.234");
    assert_value_error(encode_with(3, Value::Null).await, "amount", "null", "");
    assert_value_error(encode_with(3, Value::Text("12.00".into())).await, "amount", "text", "12.00");
    // status is an enum of new, paid, gone.
    assert_value_error(encode_with(12, Value::Enum("stolen".into())).await, "status", "enum", "stolen");
    // A TOAST value the source did not resolve.
    assert_value_error(encode_with(2, Value::Unchanged).await, "customer", "unchanged", "");
    // Wrong kind inside an array.
    assert_value_error(encode_with(13, Value::Array(vec![Value::Int32(1)])).await, "tags", "array", "");
    // The decimal in a variable-scale column must be a number too.
    assert_value_error(encode_with(4, Value::Decimal("Infinity".into())).await, "ratio", "decimal", "Infinity");
}

#[tokio::test]
async fn rows_of_the_wrong_width_and_unprepared_topics_are_refused() {
    let e = encoder().await;
    let (_, mut event) = fixtures::events().into_iter().nth(1).expect("create");
    if let Some(row) = event.after.as_mut() {
        row.pop();
    }
    assert!(matches!(e.encode(&event, fixtures::TOPIC), Err(SchemaError::Value { .. })));
    let (_, event) = fixtures::events().into_iter().nth(1).expect("create");
    assert!(matches!(e.encode(&event, "other.topic"), Err(SchemaError::Incompatible { .. })));
}
