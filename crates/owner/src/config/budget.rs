//! `[pricing."<model>"]` and `[budget]` (docs/configuration.md, "Budgets"): what a model's
//! tokens cost, and the spend limits a session gets at `session.create` and the home has per
//! day.

use std::collections::BTreeMap;

use drover_ledger::{Price, SpendRules};
use serde::Deserialize;

/// `[pricing."<model>"]`: USD per million tokens of the model named by the key (the session's
/// model name, as `session.create` froze it).
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriceEntry {
    /// Input (prompt) tokens.
    pub input_per_mtok: f64,
    /// Cached input tokens (default: `input_per_mtok`).
    #[serde(default)]
    pub cached_input_per_mtok: Option<f64>,
    /// Output (completion) tokens.
    pub output_per_mtok: f64,
}

/// `[budget]`: every limit is off unless set.
#[derive(Debug, Clone, Copy, PartialEq, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BudgetSection {
    /// USD a new session (with its child agents) may spend; frozen at `session.create`.
    pub session_usd: Option<f64>,
    /// Tokens (input + output) a new session may spend; frozen at `session.create`.
    pub session_tokens: Option<u64>,
    /// USD every session of the home together may spend per day (UTC); read as it is now.
    pub home_usd_per_day: Option<f64>,
}

/// An amount of USD a limit or price may be: finite and not negative (a limit over 0).
fn check_usd(name: &str, value: f64, limit: bool) -> Result<(), String> {
    if !value.is_finite() || value < 0.0 || (limit && value == 0.0) {
        let what = if limit {
            "a finite amount over 0"
        } else {
            "a finite amount of 0 or more"
        };
        return Err(format!("{name} must be {what}, not {value}"));
    }
    Ok(())
}

impl BudgetSection {
    /// Refuses a limit that is not a finite amount over 0, naming it.
    pub(super) fn check(&self) -> Result<(), String> {
        if let Some(usd) = self.session_usd {
            check_usd("[budget] session_usd", usd, true)?;
        }
        if self.session_tokens == Some(0) {
            return Err("[budget] session_tokens must be over 0".to_string());
        }
        if let Some(usd) = self.home_usd_per_day {
            check_usd("[budget] home_usd_per_day", usd, true)?;
        }
        Ok(())
    }
}

/// Refuses a price that is not a finite amount of 0 or more, naming it.
pub(super) fn check_pricing(pricing: &BTreeMap<String, PriceEntry>) -> Result<(), String> {
    for (model, price) in pricing {
        for (key, value) in [
            ("input_per_mtok", Some(price.input_per_mtok)),
            ("cached_input_per_mtok", price.cached_input_per_mtok),
            ("output_per_mtok", Some(price.output_per_mtok)),
        ] {
            if let Some(value) = value {
                check_usd(&format!("[pricing.\"{model}\"] {key}"), value, false)?;
            }
        }
    }
    Ok(())
}

impl super::Config {
    /// The prices and home-wide limit `usage.add` and `budget.check` are applied with.
    pub fn spend_rules(&self) -> SpendRules {
        SpendRules {
            pricing: self
                .pricing
                .iter()
                .map(|(model, p)| {
                    (
                        model.clone(),
                        Price {
                            input_per_mtok: p.input_per_mtok,
                            cached_input_per_mtok: p.cached_input_per_mtok,
                            output_per_mtok: p.output_per_mtok,
                        },
                    )
                })
                .collect(),
            home_usd_per_day: self.budget.home_usd_per_day,
        }
    }
}
