//! The runner's commands besides `run`: `check`, `replay`, `objects`, `cutover` and `delete`
//! (`status`, `pause` and `resume` talk to a running runner's admin
//! server, see `tributary_operations::admin::client`).

pub mod check;
#[cfg(feature = "cutover")]
pub mod cutover;
pub mod delete;
#[cfg(feature = "sink-postgres")]
pub mod objects;
pub mod replay;
