"""The documentation site: its configuration reference covers every key, and it builds.

The set of keys is read from the config dataclasses here, not from the
reference module, so a field added later without a comment in its source, or
one the reference failed to render, fails this test. The site is built with
``mkdocs build --strict`` into a temporary directory (a few seconds), as CI
does: a broken link or anchor, a page left out of the navigation or a
docstring the API pages cannot render fails it.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import subprocess
import sys
import typing
from dataclasses import dataclass
from pathlib import Path

import pytest

from retool.config import RunConfig, load_config
from retool.config.reference import (
    allowed_values,
    defaults_toml,
    field_comments,
    missing_descriptions,
    render_reference,
    sections,
)

ROOT = Path(__file__).resolve().parents[2]


def _config_fields() -> list[tuple[str, str]]:
    """``(section, key)`` of every field of every section of :class:`RunConfig`."""
    hints = typing.get_type_hints(RunConfig)
    return [
        (section.name, item.name)
        for section in dataclasses.fields(RunConfig)
        for item in dataclasses.fields(hints[section.name])
    ]


def test_the_reference_names_every_config_field_once():
    page = render_reference()
    fields = _config_fields()
    assert len(fields) > 80  # every section's fields, not an empty walk
    for section, key in fields:
        assert page.count(f'<a id="{section}.{key}"></a>`{key}`') == 1, f"{section}.{key}"
    for section in {s for s, _ in fields}:
        assert f"## [{section}]" in page


def test_every_config_field_has_a_description_in_its_source():
    assert missing_descriptions() == [], (
        "config fields without a comment (write one beside or above the field in "
        "src/retool/config/: it is the key's description in the docs)"
    )
    documented = {f.name: f.description for s in sections() for f in s.fields}
    assert set(documented) == {f"{s}.{k}" for s, k in _config_fields()}


def test_allowed_values_are_the_checks_own():
    allowed = {f.name: f.allowed for s in sections() for f in s.fields}
    assert allowed["train.beta1"] == "[0, 1)"  # a later check refuses 1 itself
    assert allowed["rollout.top_p"] == "(0, 1]"
    assert allowed["rollout.group_size"] == "[1, 65536]"  # "> 0" of an integer
    assert allowed["data.seed"] == "[0, 2**32 - 1]"
    assert allowed["cost.max_money"] == "[0, inf)"
    assert allowed["model.backend"] == "`local`, `pytrio`, `tinker`"
    assert allowed["rollout.share_identical_code"] == "true or false"
    assert allowed["train.run_dir"] == "must not be empty"
    assert allowed["sandbox.url"] == ""  # read only with sandbox.backend = "sandboxfusion"


def test_an_interval_is_what_the_section_accepts():
    """Each closed bound of an integer key is accepted and one past it refused."""
    hints = typing.get_type_hints(RunConfig)
    checked = 0
    for section in sections():
        cls = hints[section.name]
        for f in section.fields:
            match = re.fullmatch(r"\[(\d+), (\d+)\]", f.allowed)
            if f.type != "integer" or not match:
                continue
            low, high = int(match.group(1)), int(match.group(2))
            assert allowed_values(cls, section.name, f.key, int) == f.allowed
            for outside in (low - 1, high + 1):
                with pytest.raises(ValueError, match=re.escape(f.name)):
                    cls(**{f.key: outside})
            cls(**{f.key: low})
            checked += 1
    assert checked > 20


def test_comments_above_and_beside_a_field_are_its_description():
    @dataclass(frozen=True)
    class Section:
        plain: int = 1  # beside the field
        # above the field,
        # over two lines
        above: int = 2  # and beside it
        bare: int = 3

    comments = field_comments(Section)
    assert comments["plain"] == "beside the field"
    assert comments["above"] == "above the field, over two lines and beside it"
    assert comments.get("bare", "") == ""


def test_every_default_in_one_file_loads_as_the_defaults(tmp_path):
    path = tmp_path / "defaults.toml"
    path.write_text(defaults_toml(), encoding="utf-8")
    assert load_config(path) == RunConfig()


@pytest.mark.skipif(
    not all(importlib.util.find_spec(m) for m in ("mkdocs", "material", "mkdocstrings")),
    reason="the docs extra is not installed (pip install -e '.[docs]')",
)
def test_the_site_builds_strict_with_the_generated_reference(tmp_path):
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    page = (site / "reference" / "configuration" / "index.html").read_text(encoding="utf-8")
    for section, key in _config_fields():
        assert f'id="{section}.{key}"' in page, f"{section}.{key} missing from the built page"
    assert (site / "measurements" / "index.html").is_file()
    assert (site / "reference" / "api" / "config" / "index.html").is_file()
    assert not (site / "hooks").exists()  # the build's hooks are not published
