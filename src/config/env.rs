//! The runbooks' environment as the config gives it: shared by the daemon's hand-over and by
//! the commands that run a runbook by hand (`scan --run-runbooks`, `runbook run`, `test-alert`).

use crate::host::alert_host;

/// Where runbooks find programs, sysfs and procfs, as the config says.
pub fn runbook_env(config: &super::Config) -> crate::runbook::RunbookEnv {
    let mut env = config.runbooks.env();
    env.host = alert_host(config.incidents.host.as_deref());
    env.secrets = crate::runbook::Redactor::new(config.alerts.secret_values());
    env
}
