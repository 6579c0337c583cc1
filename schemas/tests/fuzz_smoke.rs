//! The fuzz target's decode function over a few thousand random byte
//! strings on stable Rust, so CI exercises it without nightly and
//! cargo-fuzz. Random bytes alone rarely get past the first union, so half
//! the inputs are valid events with a few bytes flipped, cut or inserted.

mod fixtures;

use proptest::prelude::*;
use tributary_schemas::fuzzing::{decode_arbitrary, schema_count};
use tributary_schemas::{envelope, CompiledEnvelope, EnvelopeOptions, EventEncoder, Registry};

#[test]
fn fixed_schemas_compile() {
    assert_eq!(schema_count(), 4, "every fixed fuzzing schema compiles");
}

fn valid_datums() -> Vec<Vec<u8>> {
    let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
    let mut encoder = EventEncoder::new(Registry::in_memory(), EnvelopeOptions::default());
    rt.block_on(encoder.prepare(&fixtures::table(), fixtures::TOPIC))
        .expect("prepare");
    fixtures::events()
        .iter()
        .map(|(_, e)| encoder.encode(e, fixtures::TOPIC).expect("encode").value.expect("value")[5..].to_vec())
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(data in prop::collection::vec(any::<u8>(), 0..300)) {
        decode_arbitrary(&data);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn mutated_events_never_panic(
        which in 0usize..5,
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..6),
    ) {
        thread_local! {
            static VALID: Vec<Vec<u8>> = valid_datums();
            static PLAN: std::cell::RefCell<CompiledEnvelope> = {
                let s = envelope(&fixtures::table(), fixtures::TOPIC, &EnvelopeOptions::default()).expect("schemas");
                std::cell::RefCell::new(CompiledEnvelope::new("t", &s.value, s.key.as_deref()).expect("compiles"))
            };
        }
        let mut data = VALID.with(|v| v[which].clone());
        for (at, byte, kind) in edits {
            if data.is_empty() {
                break;
            }
            let i = at.index(data.len());
            match kind {
                0 => data[i] = byte,
                1 => data.truncate(i),
                _ => data.insert(i, byte),
            }
        }
        PLAN.with(|p| {
            let _ = p.borrow_mut().decode_datum("t", &data);
        });
    }
}
