"""Certificates and keys for a local control plane, made with the openssl command line (Debian's).

One CA signs the API server's serving certificate, the client certificates of the control-plane
components and of the admin, and the webhook's serving certificate. The service-account token key pair
is separate, as kubeadm makes it.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


def _openssl(*args: str) -> None:
    result = subprocess.run(["openssl", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args[:2])} failed: {result.stderr.strip()[-500:]}")


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


class Authority:
    """A throwaway CA in `directory` (valid two days: a test cluster outlives no test run)."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.ca = KeyPair(self.dir / "ca.crt", self.dir / "ca.key")
        _openssl(
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=gluon-localcluster-ca",
            "-keyout",
            str(self.ca.key),
            "-out",
            str(self.ca.cert),
        )

    def issue(self, name: str, subject: str, sans: tuple[str, ...] = (), client: bool = False) -> KeyPair:
        """A certificate signed by this CA. `subject` as openssl writes it, e.g. /CN=admin/O=system:masters."""
        pair = KeyPair(self.dir / f"{name}.crt", self.dir / f"{name}.key")
        csr = self.dir / f"{name}.csr"
        ext = self.dir / f"{name}.ext"
        usage = "clientAuth" if client else "serverAuth"
        lines = ["basicConstraints=CA:FALSE", "keyUsage=digitalSignature,keyEncipherment", f"extendedKeyUsage={usage}"]
        if sans:
            lines.append("subjectAltName=" + ",".join(sans))
        ext.write_text("\n".join(lines) + "\n")
        _openssl(
            "req", "-new", "-newkey", "rsa:2048", "-nodes", "-subj", subject, "-keyout", str(pair.key), "-out", str(csr)
        )
        _openssl(
            "x509",
            "-req",
            "-in",
            str(csr),
            "-CA",
            str(self.ca.cert),
            "-CAkey",
            str(self.ca.key),
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            str(ext),
            "-out",
            str(pair.cert),
        )
        return pair

    def service_account_keys(self) -> KeyPair:
        """The key pair the API server signs and verifies service-account tokens with (cert = public key)."""
        pair = KeyPair(self.dir / "sa.pub", self.dir / "sa.key")
        _openssl("genrsa", "-out", str(pair.key), "2048")
        _openssl("rsa", "-in", str(pair.key), "-pubout", "-out", str(pair.cert))
        return pair
