//! PostgreSQL types: the mapping of a column's type onto the model's, and
//! the decoding of PostgreSQL's text and binary output into values. They
//! live in [`crate::pgwire::values`], where the PostgreSQL sink reads them
//! too (a verification reads destination rows back with the decoders that
//! read the source's).

pub use crate::pgwire::values::*;
