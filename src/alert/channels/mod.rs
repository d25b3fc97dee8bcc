//! The channel kinds, one folder each: its `[alerts]` table, its checks, its build and its
//! delivery, behind [`Sink`](super::sink::Sink) and [`ChannelConfig`](super::sink::ChannelConfig).
//! Slack is the webhook's message format, kept apart because it is a page of its own.

pub mod alertmanager;
pub mod email;
pub mod slack;
pub mod stdout;
pub mod webhook;
