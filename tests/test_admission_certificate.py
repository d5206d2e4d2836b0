"""The webhook server picks up a renewed serving certificate without a restart (admission.CertificateReloader):
real TLS handshakes against the context kopf's server is built with, before and after the mounted files
change (as the kubelet rewrites a Secret that cert-manager renewed or a `helm upgrade` replaced)."""

from __future__ import annotations

import shutil
import socket
import ssl
import threading

import pytest

from gluon_localcluster.pki import Authority
from gluon_operator import admission


def served_certificate(context: ssl.SSLContext) -> bytes:
    """The DER certificate a client is shown by a server using `context`."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def serve() -> None:
            conn, _ = listener.accept()
            with context.wrap_socket(conn, server_side=True) as tls:
                tls.recv(1)

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        client = ssl.create_default_context()
        client.check_hostname, client.verify_mode = False, ssl.CERT_NONE
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            with client.wrap_socket(raw, server_hostname=None) as tls:
                seen = tls.getpeercert(binary_form=True)
                tls.send(b"x")
        thread.join(10)
    return seen


def der(path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(path.read_text())


def test_a_renewed_certificate_is_served_without_a_restart(tmp_path, monkeypatch):
    monkeypatch.setattr(admission, "RELOAD_CHECK_SECONDS", 0.0)
    ca = Authority(tmp_path / "pki")
    first, second = ca.issue("first", "/CN=first"), ca.issue("second", "/CN=second")
    mounted_cert, mounted_key = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copy(first.cert, mounted_cert)
    shutil.copy(first.key, mounted_key)
    server = admission.AdmissionServer(addr="127.0.0.1", port=0, certfile=str(mounted_cert), pkeyfile=str(mounted_key))
    _, context = server._build_ssl()
    assert served_certificate(context) == der(first.cert)

    mounted_key.write_text("half written")  # caught mid-update: the previous pair is served
    assert served_certificate(context) == der(first.cert)
    shutil.copy(second.cert, mounted_cert)
    shutil.copy(second.key, mounted_key)
    assert served_certificate(context) == der(second.cert)


def test_the_files_are_read_again_at_most_every_check_interval(tmp_path):
    ca = Authority(tmp_path / "pki")
    first, second = ca.issue("first", "/CN=first"), ca.issue("second", "/CN=second")
    now = [0.0]
    reloader = admission.CertificateReloader(str(first.cert), str(first.key), check_seconds=30, clock=lambda: now[0])
    before = reloader.current()
    reloader.certfile, reloader.keyfile = str(second.cert), str(second.key)
    now[0] = 29.0
    assert reloader.current() is before
    now[0] = 30.0
    assert reloader.current() is not before


@pytest.mark.parametrize("missing", ["cert", "key"])
def test_missing_files_keep_the_previous_pair(tmp_path, missing):
    ca = Authority(tmp_path / "pki")
    pair = ca.issue("first", "/CN=first")
    reloader = admission.CertificateReloader(str(pair.cert), str(pair.key), check_seconds=0)
    before = reloader.current()
    (pair.cert if missing == "cert" else pair.key).unlink()
    assert reloader.current() is before
