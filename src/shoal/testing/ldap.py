"""A real OpenLDAP ``slapd`` (Debian's slapd package) for the LDAP login tests: a generated config
and mdb database in a directory of its own, filled with ``slapadd`` before the start, serving on a
free loopback port above 1024, and always stopped (:class:`Slapd` is a context manager)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
from pathlib import Path

from shoal.testing import free_port_block, poll_until
from shoal.testing.ci import require

SLAPD = shutil.which("slapd") or "/usr/sbin/slapd"
SLAPADD = shutil.which("slapadd") or "/usr/sbin/slapadd"
SCHEMA_DIR = Path("/etc/ldap/schema")
MODULE_DIR = Path("/usr/lib/ldap")

BASE = "dc=example,dc=org"
ADMIN_DN = f"cn=admin,{BASE}"
PEOPLE = f"ou=people,{BASE}"


def person(uid: str, password: str) -> str:
    return (f"dn: uid={uid},{PEOPLE}\nobjectClass: inetOrgPerson\nuid: {uid}\ncn: {uid}\nsn: {uid}\n"
            f"userPassword: {password}\n")


class Slapd:
    """One slapd with ``users`` ({uid: password}) under ``ou=people``; the directory's admin is
    :data:`ADMIN_DN` with ``admin_password``."""

    def __init__(self, root: Path, users: dict[str, str], admin_password: str) -> None:
        require(os.access(SLAPD, os.X_OK) and (SCHEMA_DIR / "core.schema").is_file(),
                "slapd is not installed: apt-get install slapd ldap-utils (ci/test-deps.sh)")
        self.root = root
        self.admin_password = admin_password
        self.port = free_port_block((0,))
        self.url = f"ldap://127.0.0.1:{self.port}"
        self._proc: subprocess.Popen[bytes] | None = None
        root.mkdir(parents=True, exist_ok=True)
        (root / "db").mkdir()
        self.conf = root / "slapd.conf"
        self.conf.write_text("\n".join([
            *(f"include {SCHEMA_DIR / name}.schema" for name in ("core", "cosine", "inetorgperson", "nis")),
            f"modulepath {MODULE_DIR}", "moduleload back_mdb",
            f"pidfile {root / 'slapd.pid'}",
            "database mdb", "maxsize 16777216", f'suffix "{BASE}"', f'rootdn "{ADMIN_DN}"',
            f"rootpw {admin_password}", f"directory {root / 'db'}", ""]))
        ldif = root / "data.ldif"
        ldif.write_text("\n".join([
            f"dn: {BASE}\nobjectClass: top\nobjectClass: dcObject\nobjectClass: organization\no: Example\n"
            "dc: example\n",
            f"dn: {PEOPLE}\nobjectClass: organizationalUnit\nou: people\n",
            *(person(uid, password) for uid, password in users.items())]))
        done = subprocess.run([SLAPADD, "-f", str(self.conf), "-l", str(ldif)], capture_output=True, text=True,
                              timeout=30)
        assert done.returncode == 0, done.stderr

    def start(self) -> Slapd:
        log = open(self.root / "slapd.log", "wb")  # noqa: SIM115 - handed to the process, closed below
        with log:
            # -d keeps slapd in the foreground (a child we can stop), logging to the file
            self._proc = subprocess.Popen([SLAPD, "-f", str(self.conf), "-h", f"{self.url}/", "-d", "0"],
                                          stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          start_new_session=True)
        poll_until(self._answering, 20, 0.05, what=f"slapd on {self.url}")
        return self

    def _answering(self) -> bool:
        if self._proc is not None and self._proc.poll() is not None:
            raise AssertionError(f"slapd exited {self._proc.returncode}: {(self.root / 'slapd.log').read_text()}")
        with socket.socket() as probe:
            probe.settimeout(0.5)
            return probe.connect_ex(("127.0.0.1", self.port)) == 0

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()

    def __enter__(self) -> Slapd:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
