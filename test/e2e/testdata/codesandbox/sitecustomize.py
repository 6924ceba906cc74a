# The wildcard DNS of a deployment, for the test: every name under
# LIZARD_TEST_DOMAIN resolves to 127.0.0.1, where the test's server
# listens. Python loads this module at start when it is on PYTHONPATH.
import os
import socket

_domain = os.environ.get("LIZARD_TEST_DOMAIN", "")
_getaddrinfo = socket.getaddrinfo


def _resolve(host, *args, **kwargs):
    if _domain and isinstance(host, str) and (host == _domain or host.endswith("." + _domain)):
        host = "127.0.0.1"
    return _getaddrinfo(host, *args, **kwargs)


socket.getaddrinfo = _resolve
