//! The kernel ring buffer, `/dev/kmsg`.

pub mod follow;
pub mod record;
pub mod time;

pub use record::{parse_record, KmsgRecord, RecordError};
pub use time::KernelClock;
