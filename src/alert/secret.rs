//! Secrets of the alert channels: where each comes from (`env:`, `file:`, inline) and its value
//! once read. Kept apart from the channels so every channel, the config checks and the redactor
//! read secrets the same way, and so a value never shows in `Debug`, `Display`, logs or errors.

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Deserializer};

/// A secret value and where it comes from: `env:NAME`, `file:PATH`, `inline:VALUE` or a plain
/// string (inline). Its value is read only by [`Secret::resolve`] and never printed.
#[derive(Clone, PartialEq, Eq)]
pub enum Secret {
    Inline(String),
    Env(String),
    File(PathBuf),
}

/// The resolved value of a secret. `Debug` and `Display` print `<redacted>`.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretValue(String);

impl SecretValue {
    /// The value itself; call it only where it is handed to a library, never to format text.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl fmt::Display for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl Secret {
    pub fn parse(text: &str) -> Secret {
        if let Some(name) = text.strip_prefix("env:") {
            Secret::Env(name.to_string())
        } else if let Some(path) = text.strip_prefix("file:") {
            Secret::File(PathBuf::from(path))
        } else if let Some(value) = text.strip_prefix("inline:") {
            Secret::Inline(value.to_string())
        } else {
            Secret::Inline(text.to_string())
        }
    }

    pub fn is_inline(&self) -> bool {
        matches!(self, Secret::Inline(_))
    }

    /// Reads the value. The error names the source (variable or file), never the value. In the
    /// `xidwatch` binary an `env:` variable leaves the environment at its first read
    /// ([`crate::process_guard::env_secret`]).
    pub fn resolve(&self) -> Result<SecretValue, String> {
        match self {
            Secret::Inline(v) => Ok(SecretValue(v.clone())),
            // In the binary, taken out of the environment once read and kept for reloads.
            Secret::Env(name) => match crate::process_guard::env_secret(name) {
                Some(v) if !v.is_empty() => Ok(SecretValue(v)),
                Some(_) => Err(format!("environment variable {name} is empty")),
                None => Err(format!("environment variable {name} is not set")),
            },
            Secret::File(path) => {
                // Like the config: a regular file of bounded size, never a device or FIFO.
                let text = crate::files::read_config_file(path)
                    .map_err(|e| format!("cannot read secret file {}: {e}", path.display()))?;
                let v = text.trim_end_matches(['\n', '\r']).to_string();
                if v.is_empty() {
                    Err(format!("secret file {} is empty", path.display()))
                } else {
                    Ok(SecretValue(v))
                }
            }
        }
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Secret::Inline(_) => f.write_str("Secret(<redacted>)"),
            Secret::Env(name) => write!(f, "Secret(env:{name})"),
            Secret::File(path) => write!(f, "Secret(file:{})", path.display()),
        }
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ok(Secret::parse(&s))
    }
}
