//! `[classify]`: the site's own line shapes. An operator adds a wording the built-in shapes do
//! not know (`[[classify.shape]]`) or silences a harmless one (`[[classify.silence]]`), in the
//! same row form as the built-in table (`src/classify/shapes.toml`). The rows are checked and
//! compiled here, at load, with their example lines, and handed to the classifier as a table;
//! a reload builds them again.

use std::sync::Arc;

use serde::Deserialize;

use crate::classify::table::{RowSpec, Table};
use crate::model::ConfigIssue;

/// `[classify]` as written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClassifyConfig {
    /// `[[classify.shape]]`: wordings the site adds, each a finding.
    pub shape: Vec<RowSpec>,
    /// `[[classify.silence]]`: lines the site knows are harmless; nothing is reported for them.
    pub silence: Vec<RowSpec>,
}

/// At most this many rows of each kind: each is a pattern run on the lines holding its literal.
pub const MAX_SITE_ROWS: usize = 256;

impl ClassifyConfig {
    /// Checks every row (an unknown slot, a bad severity, an example its row does not read) and
    /// builds the table; the error names the key (`classify.shape[2].pattern: ...`).
    pub fn build(&self) -> Result<Arc<Table>, ConfigIssue> {
        for (key, rows) in [
            ("classify.shape", &self.shape),
            ("classify.silence", &self.silence),
        ] {
            if rows.len() > MAX_SITE_ROWS {
                return Err(ConfigIssue::new(
                    key,
                    format!("{} rows, expected at most {MAX_SITE_ROWS}", rows.len()),
                ));
            }
        }
        Table::build_site(&self.shape, &self.silence).map(Arc::new)
    }
}
