"""Test certificates made with the openssl CLI: a CA, a server and clients, and a rogue CA."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Pki:
    directory: Path

    def path(self, name: str) -> Path:
        return self.directory / name


def _openssl(directory: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)


def _ca(directory: Path, name: str) -> None:
    _openssl(
        directory,
        *("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
        *("-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.crt"),
    )


def _leaf(directory: Path, ca: str, name: str, san: str) -> None:
    _openssl(
        directory,
        *("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}"),
        *("-addext", f"subjectAltName={san}", "-keyout", f"{name}.key", "-out", f"{name}.csr"),
    )
    _openssl(
        directory,
        *("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key"),
        *("-CAcreateserial", "-days", "1", "-copy_extensions", "copy", "-out", f"{name}.crt"),
    )


def make_pki(directory: Path) -> Pki:
    """ca.crt signs server and server-rotated (127.0.0.1, localhost), client (DNS:scraper) and
    other-client (DNS:intruder); rogue-ca.crt signs rogue-client (DNS:scraper)."""
    if shutil.which("openssl") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("openssl is needed to make test certificates")
        pytest.skip("openssl is needed to make test certificates")
    directory.mkdir(parents=True, exist_ok=True)
    _ca(directory, "ca")
    _ca(directory, "rogue-ca")
    _leaf(directory, "ca", "server", "IP:127.0.0.1,DNS:localhost")
    _leaf(directory, "ca", "server-rotated", "IP:127.0.0.1,DNS:localhost")
    _leaf(directory, "ca", "client", "DNS:scraper,IP:::1")
    _leaf(directory, "ca", "other-client", "DNS:intruder")
    _leaf(directory, "rogue-ca", "rogue-client", "DNS:scraper")
    return Pki(directory)
