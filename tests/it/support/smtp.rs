//! One SMTP sink on loopback: speaks enough of RFC 5321 for the email channel (EHLO, MAIL, RCPT,
//! DATA, RSET, NOOP, QUIT, no TLS, no AUTH) and keeps every message.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::wait::{wait_for, LIMIT};

/// One message as received.
#[derive(Debug, Clone, Default)]
pub struct Mail {
    /// The `MAIL FROM:` address, without its angle brackets.
    pub from: String,
    /// Each `RCPT TO:` address.
    pub to: Vec<String>,
    /// The message (headers and body) with CRLF line ends, dot-stuffing undone.
    pub data: String,
}

impl Mail {
    /// The message with folded header lines unfolded and `\n` line ends, for matching.
    pub fn unfolded(&self) -> String {
        self.data.replace("\r\n", "\n").replace("\n ", " ")
    }
}

pub struct SmtpSink {
    addr: SocketAddr,
    got: Arc<Mutex<Vec<Mail>>>,
}

impl SmtpSink {
    pub fn start() -> SmtpSink {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let got: Arc<Mutex<Vec<Mail>>> = Arc::default();
        let g = Arc::downgrade(&got);
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let Some(g) = g.upgrade() else { return };
                std::thread::spawn(move || {
                    let _ = session(conn, &g);
                });
            }
        });
        SmtpSink { addr, got }
    }

    /// `host:port`, for `smtp_url = "smtp://HOST:PORT"`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn mails(&self) -> Vec<Mail> {
        self.got.lock().unwrap().clone()
    }

    /// Waits until `n` messages arrived; returns them.
    #[track_caller]
    pub fn wait_mails(&self, n: usize) -> Vec<Mail> {
        self.wait_mails_within(LIMIT, n)
    }

    #[track_caller]
    pub fn wait_mails_within(&self, limit: Duration, n: usize) -> Vec<Mail> {
        wait_for(
            limit,
            &format!("{n} message(s) at smtp://{}", self.addr),
            || {
                let m = self.mails();
                (m.len() >= n).then_some(m)
            },
        )
    }
}

impl Drop for SmtpSink {
    fn drop(&mut self) {
        // Wake the accept loop so it sees the sink gone.
        let _ = TcpStream::connect(self.addr);
    }
}

fn session(conn: TcpStream, got: &Mutex<Vec<Mail>>) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut w = conn.try_clone()?;
    let mut r = BufReader::new(conn);
    w.write_all(b"220 sink.test ESMTP\r\n")?;
    let mut mail = Mail::default();
    let mut line = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let cmd = line.trim_end();
        let verb = cmd
            .split([' ', ':'])
            .next()
            .unwrap_or("")
            .to_ascii_uppercase();
        let arg = |prefix: &str| {
            cmd.get(prefix.len()..)
                .unwrap_or("")
                .trim()
                .split(' ')
                .next()
                .unwrap_or("")
                .trim_matches(['<', '>'])
                .to_string()
        };
        match verb.as_str() {
            "EHLO" => w.write_all(b"250-sink.test\r\n250-8BITMIME\r\n250 SMTPUTF8\r\n")?,
            "HELO" => w.write_all(b"250 sink.test\r\n")?,
            "MAIL" => {
                mail = Mail {
                    from: arg("MAIL FROM:"),
                    ..Mail::default()
                };
                w.write_all(b"250 ok\r\n")?;
            }
            "RCPT" => {
                mail.to.push(arg("RCPT TO:"));
                w.write_all(b"250 ok\r\n")?;
            }
            "DATA" => {
                w.write_all(b"354 go ahead\r\n")?;
                let mut data = String::new();
                loop {
                    line.clear();
                    if r.read_line(&mut line)? == 0 {
                        return Ok(());
                    }
                    if line == ".\r\n" || line == ".\n" {
                        break;
                    }
                    data.push_str(line.strip_prefix('.').unwrap_or(&line));
                }
                mail.data = data;
                got.lock().unwrap().push(std::mem::take(&mut mail));
                w.write_all(b"250 queued\r\n")?;
            }
            "RSET" => {
                mail = Mail::default();
                w.write_all(b"250 ok\r\n")?;
            }
            "NOOP" => w.write_all(b"250 ok\r\n")?,
            "QUIT" => {
                w.write_all(b"221 bye\r\n")?;
                return Ok(());
            }
            _ => w.write_all(b"502 not implemented\r\n")?,
        }
    }
}
