#!/usr/bin/python3
"""A loopback webhook receiver for the container drill (.ci/image-checks.sh).

Every POST's body is appended to OUT as one JSON line, {"path", "headers", "body"} (the body
decoded as UTF-8), written and flushed before the 200 answer, so a reader polling OUT sees a
whole request or none. Anything but POST gets 405. Standard library only.

Usage: webhook_sink.py HOST PORT OUT
PORT 0 takes a free port. Runs until killed; writes "listening PORT" to stdout once bound.
"""
import http.server
import json
import sys

MAX_BODY = 4 << 20


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        if length < 0 or length > MAX_BODY:
            self.send_error(413)
            return
        body = self.rfile.read(length)
        record = {
            "path": self.path,
            "headers": {k: v for k, v in self.headers.items()},
            "body": body.decode("utf-8", "replace"),
        }
        with open(self.server.out, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", "3")
        self.end_headers()
        self.wfile.write(b"ok\n")

    def do_GET(self):
        self.send_error(405)

    def log_message(self, fmt, *args):
        sys.stderr.write("webhook_sink: " + (fmt % args) + "\n")


def main():
    host, port, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    server = http.server.ThreadingHTTPServer((host, port), Handler)
    server.out = out
    print(f"listening {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
