//! A refused setting, named by its key: what every check of the configuration returns.

use std::fmt;

/// One refused setting of the configuration: the key it is at (`alerts.webhook[0] (oncall).url`,
/// `incidents.window_secs`) and what is wrong with it, never its value. The key is kept as a value of its own so the config
/// loader can find what a message refers to without reading it back out of the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigIssue {
    /// The key, as the message names it; empty for an issue that is about no one key.
    pub key: String,
    pub message: String,
}

impl ConfigIssue {
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> ConfigIssue {
        ConfigIssue {
            key: key.into(),
            message: message.into(),
        }
    }
}

/// `key: message`, the form every refusal of the config has always had.
impl fmt::Display for ConfigIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.key.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.key, self.message)
        }
    }
}
