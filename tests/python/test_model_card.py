"""The model card escha-convert writes into OUT: its front matter is YAML the Hub reads, with the
fields a user filters by, and it names no path of the machine that ran the job."""

import subprocess

import pytest

from testenv import require

yaml = require("yaml")

FORMATS = [("bf16", "transformers", "bf16"), ("mlx", "mlx", "mlx"), ("exl3", "exllamav3", "exllamav3")]


@pytest.mark.parametrize("name", ["dense", "moe"])
@pytest.mark.parametrize("fmt,library,tag", FORMATS)
def test_front_matter_is_yaml_and_the_card_names_no_path(escha_convert, repo_root, tmp_path, name, fmt, library, tag):
    out = tmp_path / "out"
    base = repo_root / "fixtures" / f"{name}-base"
    subprocess.run([str(escha_convert), str(repo_root / "fixtures" / name), str(out), "-q", "--format", fmt,
                    "--verify-base", str(base)], check=True)
    card = (out / "README.md").read_text()
    head, body = card.split("---\n", 2)[1:]
    meta = yaml.safe_load(head)
    assert meta["library_name"] == library
    assert {"escha", "exl3", tag} <= set(meta["tags"])
    for path in (str(tmp_path), str(repo_root)):
        assert path not in card
    assert f"`escha-convert {name} OUT --format {fmt}" in body
    assert f"| verified | PASS against `{name}-base`" in body
