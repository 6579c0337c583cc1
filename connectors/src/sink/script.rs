//! The unit of a warehouse that runs a batch as one script: the statements
//! of a unit are collected while the core applies the batch and run at its
//! end, with the offsets, as one transaction (BigQuery: one multi-statement
//! request; Snowflake: statement by statement after the group's writer
//! lock). Staging and DDL run at once, outside it. The [`Warehouse`] steps
//! of such a unit are written here once; a dialect implements [`Scripted`]:
//! how its transaction runs and what its staging leaves.
//!
//! [`Warehouse`]: super::warehouse::Warehouse

use std::time::Instant;

use async_trait::async_trait;

use super::bookkeeping::{OffsetMove, DELETED_ROWS_PRUNE_INTERVAL};
use super::warehouse::Mode;
use super::ApplyError;
use crate::error::Result;

/// The open unit's statements, how it ends, and when expired deleted-rows
/// entries are removed next.
#[derive(Debug)]
pub struct Script {
    mode: Mode,
    statements: Vec<String>,
    prune_at: Instant,
}

impl Default for Script {
    fn default() -> Self {
        Self {
            mode: Mode::Commit,
            statements: Vec::new(),
            prune_at: Instant::now(),
        }
    }
}

impl Script {
    /// Adds a statement to the open unit.
    pub fn push(&mut self, statement: String) {
        self.statements.push(statement);
    }

    /// Adds statements to the open unit, in order.
    pub fn extend(&mut self, statements: impl IntoIterator<Item = String>) {
        self.statements.extend(statements);
    }

    /// The open unit's statements, in order.
    pub fn statements(&self) -> &[String] {
        &self.statements
    }

    /// Whether the open unit has no statement.
    pub fn is_empty(&self) -> bool {
        self.statements.is_empty()
    }

    /// How the open unit ends.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Whether a transaction that `commit`s this script removes the
    /// expired deleted-rows entries first: at most once per
    /// [`DELETED_ROWS_PRUNE_INTERVAL`], and only beside rows written (an
    /// offsets-only commit stays small). When it does, the next is due an
    /// interval later.
    pub fn prune_due(&mut self, commit: bool) -> bool {
        let due = commit && !self.statements.is_empty() && Instant::now() >= self.prune_at;
        if due {
            self.prune_at = Instant::now() + DELETED_ROWS_PRUNE_INTERVAL;
        }
        due
    }

    fn clear(&mut self) {
        self.statements.clear();
    }
}

/// A warehouse whose unit is a [`Script`]: what differs between dialects.
#[async_trait]
pub trait Scripted: Send {
    /// The open unit's script.
    fn script(&mut self) -> &mut Script;

    /// Runs the script's statements and moves `offsets` (each from its
    /// fence, else failing with `bookkeeping::fenced`) as one transaction:
    /// committed when `commit`, else rolled back. Nothing of it stays when
    /// it fails. Called only when there is a statement or an offset.
    async fn run_transaction(&mut self, offsets: &[OffsetMove<'_>], commit: bool) -> Result<()>;

    /// Deletes the rows the unit staged, whatever became of it.
    async fn clean_staging(&mut self);
}

/// [`Warehouse::begin`](super::warehouse::Warehouse::begin): a unit in
/// `mode`, without statements.
pub fn begin(s: &mut impl Scripted, mode: Mode) -> Result<()> {
    let script = s.script();
    script.mode = mode;
    script.clear();
    Ok(())
}

/// [`Warehouse::finish`](super::warehouse::Warehouse::finish): the script
/// and `offsets` in one transaction, committed in [`Mode::Commit`] and
/// rolled back in [`Mode::Trial`]; the staged rows go either way.
pub async fn finish(s: &mut impl Scripted, offsets: &[OffsetMove<'_>]) -> Result<()> {
    let commit = s.script().mode == Mode::Commit;
    let result = run(s, offsets, commit).await;
    s.clean_staging().await;
    s.script().clear();
    result
}

/// [`Warehouse::abort`](super::warehouse::Warehouse::abort) and
/// [`Warehouse::rollback_to_savepoint`](super::warehouse::Warehouse::rollback_to_savepoint):
/// nothing ran yet, so the statements are dropped and the staged rows
/// deleted.
pub async fn abort(s: &mut impl Scripted) {
    s.clean_staging().await;
    s.script().clear();
}

/// [`Warehouse::savepoint`](super::warehouse::Warehouse::savepoint): a
/// probe starts with no statements (those before it ran in no probe).
pub fn savepoint(s: &mut impl Scripted) -> Result<()> {
    s.script().clear();
    Ok(())
}

/// [`Warehouse::verify`](super::warehouse::Warehouse::verify): the probe's
/// statements run now, in a transaction rolled back, so that the
/// destination itself tries every statement and value.
pub async fn verify(s: &mut impl Scripted) -> Result<(), ApplyError> {
    run(s, &[], false).await.map_err(ApplyError::from)
}

/// Before a DDL statement, which cannot run inside the unit's transaction
/// (BigQuery) or commits it (Snowflake): in [`Mode::Commit`] the script so
/// far is committed (without offsets: a replay of it is harmless, guarded
/// by position) and `true`, the DDL is to run now; in [`Mode::Trial`],
/// which cannot undo DDL, the script so far is dropped and `false`: no DDL
/// is made (nor what came before it).
pub async fn commit_before_ddl(s: &mut impl Scripted) -> Result<bool> {
    if s.script().mode == Mode::Commit {
        run(s, &[], true).await?;
        s.script().clear();
        Ok(true)
    } else {
        s.script().clear();
        Ok(false)
    }
}

/// The script and `offsets` as one transaction, unless both are empty.
async fn run(s: &mut impl Scripted, offsets: &[OffsetMove<'_>], commit: bool) -> Result<()> {
    if s.script().is_empty() && offsets.is_empty() {
        return Ok(());
    }
    s.run_transaction(offsets, commit).await
}
