"""LDAP logins (``nacos.core.auth.system.type=ldap``), as Nacos's LDAP auth plugin checks them.

Nacos's ``LdapAuthenticationManager``: a login is first tried against the node's own users; when
that fails, the name (lower-cased unless ``nacos.core.auth.ldap.case.sensitive``) is looked up in
the directory under ``nacos.core.auth.ldap.basedc`` with the filter ``(<filter.prefix>=<name>)``,
Shoal binding as ``nacos.core.auth.ldap.userDn`` / ``.password`` for the search (anonymously when
no DN is set), and the password is checked by binding as the entry found. The user then acts as
the local user ``LDAP_<name>``, created on the first such login with an unusable password, so
its roles are the ones bound to ``LDAP_<name>`` (as in Nacos). A name that already starts with
``LDAP_`` is refused.

ldap3 (pure Python, synchronous) runs in the executor (:func:`shoal.tasks.run_blocking`); every
connection has the connect and receive timeout ``nacos.core.auth.ldap.timeout``, so a directory
that is down or hung costs a login at most about twice that, never a stalled loop.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from shoal.config import Config
from shoal.errors import Forbidden
from shoal.tasks import run_blocking

log = logging.getLogger(__name__)

#: What the local stand-in of an LDAP user is called: ``LDAP_<name>`` (Nacos ``AuthConstants.LDAP_PREFIX``).
LDAP_PREFIX = "LDAP_"


class LdapUnavailable(Forbidden):
    """The LDAP server could not be reached or did not answer in time: the login is refused
    (403, as Nacos refuses it) with a message that names the server and the cause."""


class LdapDirectory:
    """Checks a name and password against the configured LDAP server (Nacos ``LdapTemplate.authenticate``)."""

    def __init__(self, config: Config) -> None:
        self.url = config.ldap_url
        self.base = config.ldap_basedc
        self.bind_dn = config.ldap_user_dn
        self.bind_password = config.ldap_password
        self.prefix = config.ldap_filter_prefix
        self.case_sensitive = config.ldap_case_sensitive
        self.timeout_s = config.ldap_timeout_ms / 1000
        # ldap3 sets the receive timeout with SO_RCVTIMEO from whole seconds only
        self.receive_timeout_s = max(1, math.ceil(self.timeout_s))

    def login_name(self, username: str) -> str:
        """The name looked up (lower-cased unless case-sensitive)."""
        return username if self.case_sensitive else username.lower()

    async def authenticate(self, username: str, password: str) -> bool:
        """Whether the directory has exactly one entry for ``username`` and ``password`` binds as it.

        Raises :class:`LdapUnavailable` when the server cannot be reached or times out."""
        if not username or not password or username.upper().startswith(LDAP_PREFIX):
            return False
        return bool(await run_blocking(self._authenticate, self.login_name(username), password))

    def _server(self) -> Any:
        import ldap3

        return ldap3.Server(self.url, connect_timeout=self.timeout_s, get_info=ldap3.NONE)

    def _authenticate(self, username: str, password: str) -> bool:
        import ldap3
        from ldap3.core import exceptions
        from ldap3.utils.conv import escape_filter_chars

        server = self._server()
        try:
            search = ldap3.Connection(server, user=self.bind_dn or None, password=self.bind_password or None,
                                      receive_timeout=self.receive_timeout_s, raise_exceptions=False)
            try:
                if not search.bind():
                    log.warning("auth: LDAP bind as %r to %s refused: %s", self.bind_dn, self.url,
                                search.result.get("description"))
                    raise LdapUnavailable(f"LDAP server {self.url} refused the search bind "
                                          "(nacos.core.auth.ldap.userDn / .password)")
                search.search(self.base, f"({self.prefix}={escape_filter_chars(username)})",
                              search_scope=ldap3.SUBTREE, attributes=[], size_limit=2)
                entries = [e for e in search.response or [] if e.get("type") == "searchResEntry"]
            finally:
                search.unbind()
            if len(entries) != 1:
                return False
            user = ldap3.Connection(server, user=entries[0]["dn"], password=password,
                                    receive_timeout=self.receive_timeout_s, raise_exceptions=False)
            try:
                return bool(user.bind())
            finally:
                user.unbind()
        except exceptions.LDAPException as exc:
            log.warning("auth: LDAP server %s not usable: %s: %s", self.url, type(exc).__name__, exc)
            raise LdapUnavailable(f"LDAP server {self.url} not reachable: {type(exc).__name__}") from None
