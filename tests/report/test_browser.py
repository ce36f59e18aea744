"""report.html in a real browser: headless Chromium opens a trajectory and renders its turns.

The page is opened at ``report.html#step=S&question=Q`` (the deep link a person
would follow or click to), Chromium runs its JavaScript (``--virtual-time-budget``
lets it finish), and ``--dump-dom`` gives the DOM as rendered: the test asserts
the viewer built the turn elements with the trajectory's text, and that hostile
text stayed text. A screenshot is taken too, to be looked at (the test only
checks that it is a real, non-blank PNG).

Debian's ``chromium`` package provides the browser; ``.ci/run`` installs it when
missing. Without it the tests skip and say so. ``--no-sandbox`` because CI runs
as root, where Chromium's own sandbox refuses to start; the page is our own.
"""

from __future__ import annotations

import html
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from retool.training.run_dir import read_rollouts
from tests.report.conftest import EVIL

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
BROWSER = os.environ.get("RETOOL_CHROMIUM") or next(filter(None, map(shutil.which, NAMES)), None)

pytestmark = pytest.mark.skipif(
    BROWSER is None,
    reason="no chromium binary on PATH: install Debian's chromium "
    "(apt-get install -y --no-install-recommends chromium; .ci/run does) to run the browser test",
)


def chromium(url: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert BROWSER is not None
    done = subprocess.run(
        [
            BROWSER,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            "--virtual-time-budget=10000",
            *args,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def screenshot(url: str, tmp_path: Path, name: str) -> Path:
    # A window as tall as the page: the viewer is in the picture without scrolling.
    path = tmp_path / name
    chromium(url, tmp_path / "profile", "--window-size=1280,7000", f"--screenshot={path}")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 50_000  # rendered, not blank
    return path


def test_the_viewer_opens_a_trajectory_of_a_real_run(real_run, real_report, tmp_path):
    url = real_report.as_uri() + "#step=2&question=1"
    dom = chromium(url, tmp_path / "profile", "--dump-dom").stdout
    assert 'data-viewer="step-2-question-1"' in dom
    records = [
        r
        for r in read_rollouts(real_run / "rollouts" / "step_000002.jsonl.gz")
        if r["question_index"] == 1
    ]
    assert dom.count('data-kind="assistant"') == len(records) == 3
    assert dom.count('data-kind="question"') == 1 and dom.count('data-kind="system"') == 1
    assert html.escape(records[0]["question"], quote=False) in dom
    for record in records:
        assert html.escape(record["final_text"], quote=False) in dom
        assert f'data-member="{record["group_index"]}"' in dom
    assert 'class="tok loss' in dom or 'class="tok noloss' in dom  # token colouring rendered
    assert 'class="tok ctx' in dom
    shot = screenshot(url, tmp_path, "real.png")
    print(f"screenshot: {shot}")


def test_code_observations_and_hostile_text_render_as_text(crafted_report, tmp_path):
    url = crafted_report.as_uri() + "#step=1&question=0&member=0"
    dom = chromium(url, tmp_path / "profile", "--dump-dom").stdout
    assert 'data-viewer="step-1-question-0"' in dom
    assert '<pre class="code">print(6 * 7)</pre>' in dom
    assert '<pre class="text">```output\n42\n```</pre>' in dom
    assert "observation 1 (user message) · ok · 0.25 s" in dom
    # The hostile text is in the page, as text: no element was made from it.
    assert html.escape(EVIL.replace("\x00", "\ufffd"), quote=False) in dom
    assert "<script>alert" not in dom and "<b>bold</b>" not in dom
    assert "&lt;img src=x onerror=" in dom and "<img src=x" not in dom.replace('"', "")
    shot = screenshot(url, tmp_path, "crafted.png")
    print(f"screenshot: {shot}")
