//! One HTTP/1.1 receiver on loopback for the alert channels: every request recorded (path,
//! headers, body, when it came), each answered as the test says (scripted replies, a default, or
//! a function of the request; a status with headers and a body, or never), one thread per
//! connection so a request left unanswered holds up no other. Plain threads: it serves sync and
//! async tests alike.

use std::collections::VecDeque;
use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::wait::{wait_for, LIMIT};

/// One request as received.
#[derive(Debug, Clone)]
pub struct Request {
    /// `POST /alerts HTTP/1.1`.
    pub line: String,
    /// `/alerts`.
    pub path: String,
    /// Header names in lower case, values as sent.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// When its last byte was read.
    pub at: Instant,
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

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON; panics when it is not.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }
}

/// How to answer a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// This status, an empty body, `connection: close`.
    Status(u16),
    /// This status, these extra headers and this body.
    With(u16, Vec<(String, String)>, String),
    /// Read the request and never answer; the connection stays open until the receiver goes.
    Hang,
}

type Answer = dyn Fn(usize, &Request) -> Reply + Send + Sync;

struct Shared {
    addr: SocketAddr,
    got: Mutex<Vec<Request>>,
    /// Requests read so far, answered or not.
    seen: AtomicUsize,
    /// Connections of unanswered requests, kept open.
    held: Mutex<Vec<TcpStream>>,
    /// Replies for the next requests, in order; then `default`; then `answer`.
    script: Mutex<VecDeque<Reply>>,
    default: Mutex<Option<Reply>>,
    answer: Box<Answer>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        for c in self.held.get_mut().unwrap().drain(..) {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
        // Wake the accept loop so it sees the receiver gone.
        let _ = TcpStream::connect(self.addr);
    }
}

/// The receiver; clones share it, and it stops when the last one goes.
#[derive(Clone)]
pub struct Receiver {
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
            addr,
            got: Mutex::default(),
            seen: AtomicUsize::new(0),
            held: Mutex::default(),
            script: Mutex::default(),
            default: Mutex::default(),
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
        Receiver { shared }
    }

    /// Replies for the next requests, in order, before the default.
    pub fn script(&self, replies: Vec<Reply>) {
        self.shared.script.lock().unwrap().extend(replies);
    }

    /// The reply for every request once the script is used up.
    pub fn set_default(&self, reply: Reply) {
        *self.shared.default.lock().unwrap() = Some(reply);
    }

    pub fn addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// `http://127.0.0.1:PORT/alerts`.
    pub fn url(&self) -> String {
        self.url_for("/alerts")
    }

    pub fn url_for(&self, path: &str) -> String {
        format!("http://{}{path}", self.shared.addr)
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<Request> {
        self.shared.got.lock().unwrap().clone()
    }

    /// The requests to `path` so far.
    pub fn requests_to(&self, path: &str) -> Vec<Request> {
        self.requests()
            .into_iter()
            .filter(|r| r.path == path)
            .collect()
    }

    /// The requests answered so far.
    pub fn answered(&self) -> Vec<Request> {
        self.requests().into_iter().filter(|r| r.answered).collect()
    }

    /// The bodies of the answered requests as text.
    pub fn bodies(&self) -> Vec<String> {
        self.answered().iter().map(Request::text).collect()
    }

    /// The bodies of the answered requests as JSON (`null` for one that is not).
    pub fn docs(&self) -> Vec<Value> {
        self.answered()
            .iter()
            .map(|r| serde_json::from_slice(&r.body).unwrap_or(Value::Null))
            .collect()
    }

    /// Waits until `n` requests were answered; returns them.
    #[track_caller]
    pub fn wait_answered(&self, n: usize) -> Vec<Request> {
        self.wait_answered_within(LIMIT, n)
    }

    #[track_caller]
    pub fn wait_answered_within(&self, limit: Duration, n: usize) -> Vec<Request> {
        wait_for(limit, &format!("{n} request(s) at {}", self.addr()), || {
            let a = self.answered();
            (a.len() >= n).then_some(a)
        })
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
                .split_once(':')
                .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        })
        .collect();
    let mut req = Request {
        path: line.split(' ').nth(1).unwrap_or_default().to_string(),
        line,
        headers,
        body,
        at: Instant::now(),
        answered: true,
    };
    let n = s.seen.fetch_add(1, Ordering::SeqCst);
    let scripted = s.script.lock().unwrap().pop_front();
    let reply = scripted
        .or_else(|| s.default.lock().unwrap().clone())
        .unwrap_or_else(|| (s.answer)(n, &req));
    let (code, extra, text) = match reply {
        Reply::Status(code) => (code, Vec::new(), String::new()),
        Reply::With(code, extra, text) => (code, extra, text),
        Reply::Hang => {
            req.answered = false;
            s.got.lock().unwrap().push(req);
            s.held.lock().unwrap().push(w);
            return;
        }
    };
    s.got.lock().unwrap().push(req);
    let mut resp = format!(
        "HTTP/1.1 {code} X\r\ncontent-length: {}\r\ncontent-type: text/plain\r\nconnection: close\r\n",
        text.len()
    );
    for (k, v) in extra {
        resp.push_str(&format!("{k}: {v}\r\n"));
    }
    resp.push_str("\r\n");
    resp.push_str(&text);
    let _ = w.write_all(resp.as_bytes());
}
