//! Classification: turns kernel log messages into typed [`Finding`](crate::model::Finding)s.
