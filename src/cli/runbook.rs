//! `xidwatch runbook list | show | run`: the on-call's view of the runbooks.

use anyhow::Context;

use super::RunbookCommand;
use crate::model::PciAddress;
use crate::runbook::{render_evidence, render_list, render_show, Subject};

pub fn run(cmd: RunbookCommand) -> anyhow::Result<u8> {
    match cmd {
        RunbookCommand::List { config } => {
            let c = match super::load_config_sending_nothing(config.as_deref()) {
                Ok(c) => c,
                Err(code) => return Ok(code),
            };
            print!("{}", render_list(&c.runbook_set));
            Ok(0)
        }
        RunbookCommand::Show { name, config } => {
            let c = match super::load_config_sending_nothing(config.as_deref()) {
                Ok(c) => c,
                Err(code) => return Ok(code),
            };
            match c.runbook_set.get(&name) {
                Some(rb) => {
                    print!("{}", render_show(rb));
                    Ok(0)
                }
                None => {
                    eprintln!("xidwatch: no runbook named {name:?} (see `xidwatch runbook list`)");
                    Ok(1)
                }
            }
        }
        RunbookCommand::Run {
            name,
            pci,
            xid,
            pid,
            config,
        } => {
            let c = match super::load_config_sending_nothing(config.as_deref()) {
                Ok(c) => c,
                Err(code) => return Ok(code),
            };
            let pci = match pci.as_deref().map(PciAddress::parse).transpose() {
                Ok(p) => p,
                Err(e) => {
                    eprintln!("xidwatch: --pci: {e}");
                    return Ok(super::EXIT_ERROR);
                }
            };
            let Some(rb) = c.runbook_set.get(&name) else {
                eprintln!("xidwatch: no runbook named {name:?} (see `xidwatch runbook list`)");
                return Ok(1);
            };
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("starting the runtime")?;
            // Under sudo the steps still run unprivileged; say as whom.
            match crate::runbook::sandbox::run_as() {
                Ok(Some(u)) => eprintln!(
                    "xidwatch: running as root: programs run as {} (uid {}), without capabilities (dmesg keeps CAP_SYSLOG)",
                    u.name, u.uid
                ),
                Ok(None) => {}
                Err(e) => eprintln!("xidwatch: {e}"),
            }
            let subject = Subject::manual(pci, xid, pid);
            let ev =
                rt.block_on(rb.run(&subject, &crate::daemon::runbook_env(&c), &c.runbook_limits));
            print!("{}", render_evidence(&ev));
            Ok(0)
        }
    }
}
