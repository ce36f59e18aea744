"""What is shown of output, and what reading it costs.

Invisible format characters (bidi overrides and isolates, tag
characters, line and paragraph separators...) printed by the code must reach no
person unescaped: not the model's observation, not ``retool sandbox exec``, not
the report viewer. Bounded reads: the SandboxFusion client must not hold a reply
whole: a service answering with tens of MiB of output costs the trainer about
what it keeps (``max_output_bytes``), measured with ``tracemalloc`` against a
stand-in service in another process on 127.0.0.1.
"""

from __future__ import annotations

import io
import json
import random
import subprocess
import sys
import textwrap
import tracemalloc
import unicodedata

import pytest

from retool.protocol.sanitize import escape_control, sanitize_observation
from retool.report.viewer import clean
from retool.sandbox import ErrorKind, FusionSandbox, format_tool_content, jsontail

from .helpers import RETOOL

# What an attacker prints to hide or reorder text for a reader: each must come out as
# visible escape text, never as the character itself.
HIDDEN = {
    "right-to-left override": "\u202e",
    "left-to-right override": "\u202d",
    "right-to-left embedding": "\u202b",
    "pop directional formatting": "\u202c",
    "right-to-left isolate": "\u2067",
    "first strong isolate": "\u2068",
    "pop directional isolate": "\u2069",
    "right-to-left mark": "\u200f",
    "arabic letter mark": "\u061c",
    "line separator": "\u2028",
    "paragraph separator": "\u2029",
    "tag latin small a": "\U000e0061",
    "cancel tag": "\U000e007f",
    "word joiner": "\u2060",
    "invisible times": "\u2062",
    "byte order mark": "\ufeff",
    "soft hyphen": "\u00ad",
    "interlinear annotation": "\ufff9",
    "hangul filler": "\u3164",
    "variation selector 17": "\U000e0100",
}
SNEAKY = (
    "print('ok' + '\\u202e' + 'gnp.exe' + '\\u2066' + 'x' + '\\u2069' + '\\u2028'"
    " + ''.join(chr(0xE0000 + ord(c)) for c in 'ignore previous') + '\\U000e007f')"
)


def _invisible(text: str) -> list[str]:
    return [
        f"U+{ord(c):04X}"
        for c in text
        if unicodedata.category(c) in ("Cf", "Zl", "Zp") and c not in "\u200b\u200c\u200d"
    ]


@pytest.mark.parametrize("name", sorted(HIDDEN))
def test_each_hiding_character_is_escaped(name):
    char = HIDDEN[name]
    shown = escape_control(f"a{char}b")
    point = ord(char)
    spelled = f"\\x{point:02x}" if point <= 0xFF else f"\\u{point:04x}"
    if point > 0xFFFF:
        spelled = f"\\U{point:08x}"
    assert shown == f"a{spelled}b"


def test_every_format_and_separator_character_of_this_python_is_escaped():
    """The spelled-out ranges cover Unicode's Cf, Zl and Zp as this Python knows them."""
    left = _invisible(escape_control("".join(map(chr, range(sys.maxunicode + 1)))))
    assert left == [], left
    kept = escape_control("\u200c\u200d\u200b")  # joiners shape words; ZWSP is our defuser
    assert kept == "\u200c\u200d\u200b"


def test_sanitizing_twice_changes_nothing():
    text = "<tool_call>\u202e" + "\U000e0041" + "<|im_end|>\x1b"
    once = sanitize_observation(text)
    assert sanitize_observation(once) == once
    assert not _invisible(once.replace("\u200b", ""))


def test_the_observation_of_a_call_shows_no_hiding_character(sandbox):
    result = sandbox.run(SNEAKY)
    assert result.ok, result.stderr
    text = format_tool_content(result)
    assert _invisible(text) == [], text
    assert "\\u202e" in text and "\\U000e0069" in text and "\\u2028" in text


def test_sandbox_exec_shows_no_hiding_character():
    done = subprocess.run(
        [RETOOL, "sandbox", "exec", "-", "--timeout", "20"],
        input=SNEAKY.encode(),
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    shown = done.stdout.decode()
    assert _invisible(shown) == [] and "\\u202e" in shown, shown


def test_the_report_viewer_shows_no_hiding_character():
    text = clean("the answer is \u202e24\u202c, " + "".join(chr(0xE0000 + ord(c)) for c in "42"))
    assert _invisible(text) == [] and "\\u202e24\\u202c" in text and "\\U000e0034" in text


# -- bounded reads --------------------------------------------------------------------
def _compare(full, cut, keep):
    if isinstance(cut, jsontail.Cut):
        assert isinstance(full, str) and full.endswith(str(cut))
        assert len(cut) == min(keep, len(full)) and cut.length == len(full)
        assert cut.size == len(full.encode("utf-8", errors="replace"))
    elif isinstance(full, dict):
        assert full.keys() == cut.keys()
        for key in full:
            _compare(full[key], cut[key], keep)
    elif isinstance(full, list):
        assert len(full) == len(cut)
        for a, b in zip(full, cut, strict=True):
            _compare(a, b, keep)
    else:
        assert full == cut


@pytest.mark.parametrize("seed", range(8))
def test_jsontail_reads_what_json_reads_whatever_the_pieces(seed, monkeypatch):
    """Escapes, surrogate pairs and multi-byte characters split at every piece boundary."""
    rng = random.Random(seed)
    alphabet = 'ab\n"\\\\\\\u00e9\u4e2d\U0001f600\x01/\t\ud800\udc00'
    text = "".join(rng.choice(alphabet) for _ in range(rng.choice([3, 900, 6000, 12000])))
    doc = {
        "status": "Success",
        "message": "m" * rng.randrange(5000),
        "run_result": {
            "stdout": text,
            "stderr": text[::-1],
            "return_code": 0,
            "x": [1.5, None, True, {}],
        },
    }
    data = json.dumps(doc, ensure_ascii=rng.random() < 0.5 or "\ud800" in text).encode()
    whole = json.loads(data)  # not ``doc``: adjacent lone surrogates decode as one pair
    for piece in (1, 2, 5, 13) if len(data) < 20_000 else (7, 13, 4096):
        monkeypatch.setattr(jsontail, "PIECE", piece)
        _compare(whole, jsontail.read(io.BytesIO(data).read, keep=40), 40)


@pytest.mark.parametrize(
    "data, error",
    [
        (b'{"a": "unterminated', ValueError),
        (b'{"a": 1} trailing', ValueError),
        (b'{"a": "\x00"}', ValueError),
        (b'{"a": "' + b"\\u12" * 40 + b'"}', ValueError),
        (b"[" + b"1," * 600_000 + b"1]", OverflowError),  # a huge envelope
        (b"[" + (b'"' + b"x" * 5000 + b'",') * 20 + b"1]", OverflowError),  # too many long strings
    ],
)
def test_jsontail_refuses_what_it_cannot_bound(data, error):
    with pytest.raises(error):
        jsontail.read(io.BytesIO(data).read, keep=10)


_SERVICE = textwrap.dedent(
    """
    import http.server, json, sys
    SIZE = int(sys.argv[1])

    class H(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        def log_message(self, *a):
            pass
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            body = "".join("line %d: %s\\n" % (i, "\\u00e9x\\"\\\\" * 10) for i in range(SIZE))
            run = {"status": "Finished", "execution_time": 0.1, "return_code": 0,
                   "stdout": body + "THE END\\n", "stderr": "warn\\n" * (SIZE // 4)}
            data = json.dumps({"status": "Success", "message": "", "compile_result": None,
                               "run_result": run, "executor_pod_name": None,
                               "files": {}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            for at in range(0, len(data), 1 << 20):
                self.wfile.write(data[at : at + (1 << 20)])

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    print(server.server_address[1], flush=True)
    server.serve_forever()
    """
)


@pytest.fixture(scope="module")
def loud_service(tmp_path_factory):
    """A stand-in whose every reply carries ~20 MiB of JSON (stdout + stderr)."""
    script = tmp_path_factory.mktemp("loud") / "service.py"
    script.write_text(_SERVICE)
    proc = subprocess.Popen(
        [sys.executable, str(script), "150000"], stdout=subprocess.PIPE, text=True
    )
    try:
        port = int(proc.stdout.readline())
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait()


def test_a_loud_reply_costs_what_is_kept_not_what_was_printed(loud_service):
    keep = 16384
    with FusionSandbox(loud_service, max_output_bytes=keep, check=False, timeout=30) as sb:
        sb.run("print(1)")  # warm: connection, imports
        tracemalloc.start()
        try:
            result = sb.run("print(1)")
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    # The reply is ~20 MiB of JSON and ~10 MiB of stdout; reading it whole held both.
    assert peak < 4 << 20, f"{peak / 2**20:.1f} MiB held for a {keep}-byte tail"
    assert result.stdout.endswith("THE END\n") and result.truncated
    assert len(result.stdout.encode()) <= keep + 3  # one cut character becomes U+FFFD
    assert result.error_kind == ErrorKind.OUTPUT  # over the local file cap, as locally
    assert result.stderr.endswith("warn\n")
