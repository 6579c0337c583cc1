//! `sink-runner check` for Redshift: the cluster is reachable, the sink
//! user can write the bookkeeping tables (or create them), and the S3
//! staging prefix takes a write, a read and a delete; each problem with its
//! fix. Changes nothing but the probe object it removes again.

use super::client::classify;
use super::dialect::offsets_table;
use super::RedshiftSink;
use crate::pgwire::quote_ident;
use crate::problem::Problem;

/// Checks that the destination and the staging area are usable. Empty
/// means ready. Whether the cluster may assume `iam_role` and read the
/// bucket shows only at the first load (Redshift has no dry-run `COPY`).
pub(super) async fn check(sink: &mut RedshiftSink) -> Vec<Problem> {
    let mut problems = Vec::new();
    if let Err(e) = sink.stager.probe(&sink.consumer_group).await {
        problems.push(Problem::error(
            format!("the S3 staging prefix is not usable: {}", e.message()),
            Some(e.hint().unwrap_or("check redshift.s3").to_string()),
        ));
    }
    let ctx = sink.session.ctx();
    if let Err(e) = sink.connect().await {
        problems.push(Problem::error(
            format!("cannot connect to Redshift or set up the bookkeeping tables: {}", e.message()),
            Some(
                e.hint()
                    .unwrap_or("check redshift.url and the cluster's security group")
                    .to_string(),
            ),
        ));
        return problems;
    }
    let Ok(client) = sink.schema_session.connected() else {
        return problems;
    };
    let user = quote_ident(&ctx.user);
    let sql = format!(
        "SELECT has_table_privilege({t}, 'SELECT') AND has_table_privilege({t}, 'INSERT') \
         AND has_table_privilege({t}, 'DELETE')",
        t = super::dialect::literal(&offsets_table())
    );
    match client.query_one(sql.as_str(), &[]).await {
        Ok(row) if row.get::<_, bool>(0) => {}
        Ok(_) => problems.push(Problem::error(
            "the sink user cannot write tributary.offsets",
            Some(format!(
                "GRANT USAGE ON SCHEMA tributary TO {user}; \
                 GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA tributary TO {user}"
            )),
        )),
        Err(e) => {
            let e = classify(&e, &ctx);
            problems.push(Problem::error(
                format!("cannot query the destination: {}", e.message()),
                Some(e.hint().unwrap_or("check the cluster's log").to_string()),
            ));
        }
    }
    problems
}
