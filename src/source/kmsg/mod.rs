//! The kernel ring buffer, `/dev/kmsg`.

pub mod follow;
pub mod record;

pub use record::{parse_record, KmsgRecord, RecordError};
