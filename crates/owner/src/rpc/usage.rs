//! `usage.report` (drover extension): what the home's model requests spent, from the ledger.
//! Reading it needs no attachment: like `session.list`, it shows every session of the home to
//! any client holding its token.

use std::sync::Arc;

use drover_protocol::client as wire;

use crate::error::OwnerError;
use crate::owner::Owner;

/// `usage.report {by?, since?, session_id?}`: the executions' spend in groups, and its total.
pub(super) async fn usage_report(
    owner: &Arc<Owner>,
    p: wire::UsageReportParams,
) -> Result<wire::UsageReport, OwnerError> {
    Ok(owner
        .ledger(move |ledger, _| {
            ledger.usage_report(p.by.unwrap_or_default(), p.since, p.session_id.as_deref())
        })
        .await?)
}
