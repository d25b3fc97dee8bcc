//! Every integration test of xidwatch, compiled as one test binary: one link instead of one per
//! file, and one place to see what is covered. Each module tests one capability end to end.

mod alert;
mod catalog_current;
mod classify;
mod confine;
mod corpus;
mod daemon;
mod e2e_alert;
mod fabricmanager;
mod families;
mod fleet;
mod health;
mod hostpage;
mod install;
mod layers;
mod lost;
mod nvml;
mod ops;
mod page_cli;
mod prefilter_cost;
mod privacy;
mod promises;
mod runbook;
mod scan_cli;
mod scan_groups;
mod secrets;
mod service;
mod services;
mod site_shapes;
mod state_files;
mod support;
mod verdict;
