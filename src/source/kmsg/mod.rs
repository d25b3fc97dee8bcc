//! The kernel ring buffer, `/dev/kmsg`.

pub mod record;

pub use record::{parse_record, KmsgRecord, RecordError};
