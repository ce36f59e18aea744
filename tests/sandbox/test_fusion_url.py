"""``sandbox.url`` typed wrong: one ``ConfigError`` naming the key, never ``urlsplit``'s ValueError.

``urlsplit`` raises on an unclosed IPv6 bracket and on a bracketed host that is
no address; ``.port`` on a port that is no number or out of range. Each is a
config error at load time, and ``retool doctor`` says so in its table.
"""

from __future__ import annotations

import pytest

from retool.cli import main
from retool.config import SandboxConfig
from retool.errors import ConfigError
from retool.sandbox.fusion_endpoint import parse_endpoint

BAD = ["http://[::1/", "http://[zz]:8080", "http://[::1]:99999", "http://h:0", "http://h:8080:1"]


@pytest.mark.parametrize("url", BAD)
def test_a_url_typed_wrong_is_a_config_error(url):
    with pytest.raises(ConfigError, match="sandbox.url") as info:
        parse_endpoint(url)
    assert repr(url) in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="sandbox.url"):
        SandboxConfig(backend="sandboxfusion", url=url)


def test_an_ipv6_url_is_fine():
    endpoint = parse_endpoint("http://[::1]:8080")
    assert (endpoint.host, endpoint.port, endpoint.path) == ("::1", 8080, "/run_code")


def test_doctor_names_the_url_instead_of_a_traceback(capsys):
    code = main(
        ["doctor", "--set", "sandbox.backend=sandboxfusion", "--set", "sandbox.url=http://[::1/"]
    )
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and code != 0
    assert "http://[::1/" in out + err and "sandbox.url" in out + err
