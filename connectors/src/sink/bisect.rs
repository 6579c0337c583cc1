//! Finding the record of a batch that a destination refuses, by bisection.

use async_trait::async_trait;

use super::ApplyError;
use crate::error::{Error, ErrorKind, Result};

/// Applies a prefix of a batch and undoes it, for [`locate_failed_record`].
#[async_trait]
pub trait PrefixProbe: Send {
    /// Applies the first `n` records of the batch, then undoes them.
    async fn probe(&mut self, n: usize) -> Result<(), ApplyError>;
}

/// Finds the first record of a batch of `len` records that fails with a
/// permanent error, by bisecting on prefixes; `original` is the error the
/// whole batch failed with. A record a probe names directly (a value that
/// cannot be rendered, a schema change) ends the search at once.
pub async fn locate_failed_record<P: PrefixProbe>(
    probe: &mut P,
    len: usize,
    original: Error,
) -> Result<(), ApplyError> {
    let (mut lo, mut hi) = (0usize, len);
    let mut error_at_hi = original;
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        match probe.probe(mid).await {
            Ok(()) => lo = mid,
            Err(f) if f.error.kind() == ErrorKind::Permanent => {
                if let Some(i) = f.record {
                    return Err(ApplyError { error: f.error, record: Some(i) });
                }
                hi = mid;
                error_at_hi = f.error;
            }
            Err(f) => return Err(f),
        }
    }
    if hi == len {
        // Confirm with the whole batch: this also refreshes the error (its
        // column) for the record found.
        match probe.probe(len).await {
            Ok(()) => {
                tracing::warn!("a permanent error did not repeat when the batch was applied again");
                return Err(ApplyError::from(
                    Error::retryable("the batch failed once with a data error that did not repeat")
                        .with_class("tributary.flaky"),
                ));
            }
            Err(f) if f.error.kind() == ErrorKind::Permanent => error_at_hi = f.error,
            Err(f) => return Err(f),
        }
    }
    Err(ApplyError { error: error_at_hi, record: Some(hi - 1) })
}
