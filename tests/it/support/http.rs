//! One HTTP/1.1 receiver on loopback for the alert channels: every request recorded (method,
//! path, headers, body), each answered as the test says (a status, or never), one thread per
//! connection so a request left unanswered holds up no other.

use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use super::wait::{wait_for, LIMIT};

/// One request as received.
#[derive(Debug, Clone)]
pub struct Request {
    /// `POST /alerts HTTP/1.1`.
    pub line: String,
    /// Header names in lower case, values as sent.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Answered (`false`: held open, never answered).
    pub answered: bool,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn path(&self) -> &str {
        self.line.split(' ').nth(1).unwrap_or("")
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON (`null` when it is not).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

/// How to answer a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// This status, empty body, `connection: close`.
    Status(u16),
    /// Read the request and never answer; the connection stays open until the receiver goes.
    Hang,
}

type Answer = dyn Fn(usize, &Request) -> Reply + Send + Sync;

struct Shared {
    got: Mutex<Vec<Request>>,
    /// Requests read so far, answered or not.
    seen: AtomicUsize,
    /// Connections of unanswered requests, kept open.
    held: Mutex<Vec<TcpStream>>,
    answer: Box<Answer>,
}

pub struct Receiver {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

impl Receiver {
    /// Answers every request 200.
    pub fn start() -> Receiver {
        Receiver::answering(|_, _| Reply::Status(200))
    }

    /// Answers every request 200, on loopback port `port` (one a test freed before).
    pub fn start_on(port: u16) -> Receiver {
        Receiver::bind(port, Box::new(|_, _| Reply::Status(200)))
    }

    /// Answers the `n`-th request (from 0) with `answer(n, &request)`.
    pub fn answering(
        answer: impl Fn(usize, &Request) -> Reply + Send + Sync + 'static,
    ) -> Receiver {
        Receiver::bind(0, Box::new(answer))
    }

    fn bind(port: u16, answer: Box<Answer>) -> Receiver {
        let listener = TcpListener::bind(("127.0.0.1", port)).unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            got: Mutex::default(),
            seen: AtomicUsize::new(0),
            held: Mutex::default(),
            answer,
        });
        let s = Arc::downgrade(&shared);
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                // The receiver is gone: stop accepting.
                let Some(s) = s.upgrade() else { return };
                std::thread::spawn(move || serve(conn, &s));
            }
        });
        Receiver { addr, shared }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT/alerts`.
    pub fn url(&self) -> String {
        self.url_for("/alerts")
    }

    pub fn url_for(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<Request> {
        self.shared.got.lock().unwrap().clone()
    }

    /// The requests answered so far.
    pub fn answered(&self) -> Vec<Request> {
        self.requests().into_iter().filter(|r| r.answered).collect()
    }

    /// The bodies of the answered requests as text.
    pub fn bodies(&self) -> Vec<String> {
        self.answered().iter().map(Request::text).collect()
    }

    /// The bodies of the answered requests as JSON.
    pub fn docs(&self) -> Vec<Value> {
        self.answered().iter().map(Request::json).collect()
    }

    /// Waits until `n` requests were answered; returns them.
    #[track_caller]
    pub fn wait_answered(&self, n: usize) -> Vec<Request> {
        self.wait_answered_within(LIMIT, n)
    }

    #[track_caller]
    pub fn wait_answered_within(&self, limit: Duration, n: usize) -> Vec<Request> {
        wait_for(limit, &format!("{n} request(s) at {}", self.addr), || {
            let a = self.answered();
            (a.len() >= n).then_some(a)
        })
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        for c in self.shared.held.lock().unwrap().drain(..) {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
        // Wake the accept loop so it sees the receiver gone.
        let _ = TcpStream::connect(self.addr);
    }
}

fn serve(conn: TcpStream, s: &Shared) {
    let Ok(mut w) = conn.try_clone() else { return };
    let mut r = BufReader::new(conn);
    let Some((head, body)) = super::read_request(&mut r) else {
        return;
    };
    let mut lines = head.into_iter();
    let line = lines.next().unwrap_or_default().trim_end().to_string();
    let headers = lines
        .filter_map(|l| {
            l.trim_end()
                .split_once(": ")
                .map(|(k, v)| (k.to_ascii_lowercase(), v.to_string()))
        })
        .collect();
    let mut req = Request {
        line,
        headers,
        body,
        answered: true,
    };
    let n = s.seen.fetch_add(1, Ordering::SeqCst);
    match (s.answer)(n, &req) {
        Reply::Status(code) => {
            s.got.lock().unwrap().push(req);
            let _ = write!(
                w,
                "HTTP/1.1 {code} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            );
        }
        Reply::Hang => {
            req.answered = false;
            s.got.lock().unwrap().push(req);
            s.held.lock().unwrap().push(w);
        }
    }
}
