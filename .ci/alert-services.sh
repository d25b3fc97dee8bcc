# Starts the real servers the alert tests talk to, on loopback, and exports the variables that
# turn those opt-in tests on. Source it (". .ci/alert-services.sh") from .ci/run; safe to source
# twice (a server already answering is left alone).
#
#   SMTP:         aiosmtpd (Debian python3-aiosmtpd), plain on 127.0.0.1:2525 and STARTTLS+AUTH
#                 on localhost:2526 with a throw-away self-signed certificate; mail lands in a
#                 Maildir the tests read.
#   Alertmanager: prometheus-alertmanager (Debian) on 127.0.0.1:9093 with a minimal config.
#
# Exports: XIDWATCH_SMTP_TEST, XIDWATCH_SMTP_MAILDIR, XIDWATCH_SMTP_TLS_TEST, XIDWATCH_SMTP_TLS_CA,
#          XIDWATCH_SMTP_USER, XIDWATCH_SMTP_PASSWORD, XIDWATCH_ALERTMANAGER_URL.

xw_alert_services() {
    local base="${XIDWATCH_ALERT_SERVICES_DIR:-/tmp/xidwatch-alert-services}"
    mkdir -p "$base"

    if ! /usr/bin/python3 -c 'import aiosmtpd' 2>/dev/null || ! command -v prometheus-alertmanager >/dev/null 2>&1 || ! command -v openssl >/dev/null 2>&1; then
        echo "alert-services: installing python3-aiosmtpd, prometheus-alertmanager, openssl"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >"$base/apt.log" 2>&1 || true
        apt-get install -y -qq --no-install-recommends python3-aiosmtpd prometheus-alertmanager openssl >>"$base/apt.log" 2>&1 \
            || { echo "alert-services: apt-get install failed, see $base/apt.log"; tail -20 "$base/apt.log"; return 1; }
    fi

    # Whether host:port accepts TCP connections (bash /dev/tcp), trying for up to $3 seconds.
    xw_wait_port() {
        local deadline=$((SECONDS + $3))
        while true; do
            if (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; then return 0; fi
            ((SECONDS < deadline)) || return 1
            sleep 0.2
        done
    }

    # --- SMTP
    local maildir="$base/maildir" ca="$base/smtp-ca.pem" cert="$base/smtp-cert.pem" key="$base/smtp-key.pem"
    if [ ! -s "$cert" ]; then
        # A throw-away CA and a leaf certificate for "localhost" signed by it (rustls refuses a
        # CA certificate used as the server's own).
        (
            set -e
            cd "$base"
            openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=xidwatch test CA" \
                -keyout smtp-ca-key.pem -out smtp-ca.pem
            openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" -keyout smtp-key.pem -out smtp.csr
            printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' >smtp.ext
            openssl x509 -req -in smtp.csr -CA smtp-ca.pem -CAkey smtp-ca-key.pem -CAcreateserial \
                -days 30 -extfile smtp.ext -out smtp-cert.pem
        ) >"$base/openssl.log" 2>&1 || { echo "alert-services: openssl failed"; cat "$base/openssl.log"; return 1; }
    fi
    export XIDWATCH_SMTP_USER=xidwatch
    export XIDWATCH_SMTP_PASSWORD=ci-smtp-password
    if ! xw_wait_port 127.0.0.1 2525 0; then
        nohup /usr/bin/python3 "$(dirname "${BASH_SOURCE[0]}")/smtp_sink.py" 127.0.0.1 2525 "$maildir" \
            "$cert" "$key" "$XIDWATCH_SMTP_USER" "$XIDWATCH_SMTP_PASSWORD" >"$base/smtp.log" 2>&1 &
        echo $! >"$base/smtp.pid"
    fi
    if xw_wait_port 127.0.0.1 2525 20 && xw_wait_port 127.0.0.1 2526 5; then
        export XIDWATCH_SMTP_TEST=127.0.0.1:2525
        export XIDWATCH_SMTP_MAILDIR="$maildir"
        export XIDWATCH_SMTP_TLS_TEST=localhost:2526
        export XIDWATCH_SMTP_TLS_CA="$ca"
        echo "alert-services: SMTP (aiosmtpd) on 127.0.0.1:2525 (plain) and localhost:2526 (STARTTLS+AUTH), maildir $maildir"
    else
        echo "alert-services: SMTP server did not start; see $base/smtp.log"; cat "$base/smtp.log"; return 1
    fi

    # --- Alertmanager
    cat >"$base/alertmanager.yml" <<'YML'
route:
  receiver: "null"
  group_wait: 1s
receivers:
  - name: "null"
YML
    if ! xw_wait_port 127.0.0.1 9093 0; then
        mkdir -p "$base/am-data"
        nohup prometheus-alertmanager --config.file="$base/alertmanager.yml" \
            --storage.path="$base/am-data" --web.listen-address=127.0.0.1:9093 \
            --cluster.listen-address= >"$base/alertmanager.log" 2>&1 &
        echo $! >"$base/alertmanager.pid"
    fi
    if xw_wait_port 127.0.0.1 9093 30; then
        export XIDWATCH_ALERTMANAGER_URL=http://127.0.0.1:9093
        echo "alert-services: Alertmanager on 127.0.0.1:9093"
    else
        echo "alert-services: Alertmanager did not start; see $base/alertmanager.log"; tail -20 "$base/alertmanager.log"; return 1
    fi
}

xw_alert_services
