#!/usr/bin/python3
"""A real SMTP server (aiosmtpd, Debian's python3-aiosmtpd) for xidwatch's email tests.

Two listeners, both saving every accepted message into one Maildir:
  - plain SMTP on HOST:PORT (no TLS, no AUTH), like a local relay;
  - STARTTLS required + AUTH (PLAIN/LOGIN, one user) on HOST:PORT+1, with the given certificate.

Usage: smtp_sink.py HOST PORT MAILDIR CERT KEY USER PASSWORD
Runs until killed.
"""
import asyncio
import os
import signal
import ssl
import sys

from aiosmtpd.controller import Controller
from aiosmtpd.handlers import Mailbox
from aiosmtpd.smtp import AuthResult, LoginPassword


def main():
    host, port, maildir, cert, key, user, password = sys.argv[1:8]
    port = int(port)
    # Python's Maildir only creates its subfolders when the folder itself is missing.
    for sub in ("tmp", "new", "cur"):
        os.makedirs(os.path.join(maildir, sub), exist_ok=True)

    def authenticator(server, session, envelope, mechanism, auth_data):
        ok = (
            isinstance(auth_data, LoginPassword)
            and auth_data.login.decode() == user
            and auth_data.password.decode() == password
        )
        return AuthResult(success=ok, handled=False)

    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)

    plain = Controller(Mailbox(maildir), hostname=host, port=port)
    secure = Controller(
        Mailbox(maildir),
        hostname=host,
        port=port + 1,
        tls_context=ctx,
        require_starttls=True,
        authenticator=authenticator,
        auth_require_tls=True,
        auth_required=True,
    )
    plain.start()
    secure.start()
    print(f"smtp sink: plain {host}:{port}, starttls+auth {host}:{port + 1}, maildir {maildir}", flush=True)
    stop = asyncio.new_event_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.call_soon_threadsafe(stop.stop))
    try:
        stop.run_forever()
    finally:
        plain.stop()
        secure.stop()


if __name__ == "__main__":
    main()
