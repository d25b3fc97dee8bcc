//! NVML queries a runbook step may ask for. The types are defined beside the NVML source (the
//! worker that owns the NVML handle answers them); this module names them for the runbook stage.

pub use crate::source::nvml::query::{NvmlError, NvmlProbe, NvmlQuery};
