//! The runner's commands besides `run`: `check`, `replay`, `objects` and `delete`
//! (`status`, `pause` and `resume` talk to a running runner's admin
//! server, see `tributary_operations::admin::client`).

pub mod check;
pub mod delete;
pub mod objects;
pub mod replay;
