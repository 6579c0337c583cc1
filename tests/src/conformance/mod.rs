//! The conformance suites every connector runs: [`sink`] for destinations,
//! [`source`] for source databases. A case is written once, against a
//! fixture trait the connector implements for its real service; the test
//! files `tests/tests/sink_conformance.rs` and
//! `tests/tests/source_conformance.rs` list, per connector, the cases it
//! runs (a case a destination cannot express is left out of its list, with
//! the reason beside it, never run and reported as passed).

pub mod sink;
pub mod source;

/// The listed cases of suite `sink` or `source`, each a test of its own in
/// module `$module`, run against a fresh `$fixture` (`$fixture::new(case
/// name)`) that is cleaned up afterwards.
#[macro_export]
macro_rules! conformance {
    ($suite:ident, $module:ident: $fixture:ident { $($case:ident),* $(,)? }) => {
        mod $module {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let fx = super::$fixture::new(stringify!($case)).await;
                    $crate::conformance::$suite::$case(&fx).await;
                    $crate::conformance::$suite::Fixture::cleanup(&fx).await;
                }
            )*
        }
    };
}
