"""docs/roles/ is what ``python -m gpufleet.roledocs`` renders from the argument specs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpufleet import roledocs

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / roledocs.DOCS_DIR


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    return roledocs.render_all(roledocs.load_specs(ROOT))


def test_committed_docs_are_current(pages: dict[str, str]) -> None:
    stale = roledocs.stale(DOCS, pages)
    assert not stale, (
        f"docs/roles/ is stale ({', '.join(stale)}): run `{roledocs.COMMAND}` "
        "from the repository root and commit the result"
    )


def test_every_role_with_a_spec_has_a_page(pages: dict[str, str]) -> None:
    roles = sorted(path.parents[1].name for path in ROOT.glob("roles/*/meta/argument_specs.yml"))
    assert sorted(pages) == sorted([*(f"{role}.md" for role in roles), "README.md"])
    for role in roles:
        assert f"[`{role}`]({role}.md)" in pages["README.md"]


def test_every_option_is_documented(pages: dict[str, str]) -> None:
    for role, spec in roledocs.load_specs(ROOT).items():
        for name in spec["options"]:
            assert f"\n### `{name}`\n" in pages[f"{role}.md"], f"{role}: {name}"


def test_check_mode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "roles" / "demo" / "meta" / "argument_specs.yml"
    spec.parent.mkdir(parents=True)
    spec.write_text(
        "argument_specs:\n  main:\n    short_description: Demo.\n    options:\n"
        "      demo_port: {type: int, default: 1, description: A port.}\n"
    )
    argv = ["--root", str(tmp_path)]
    assert roledocs.main([*argv, "--check"]) == 1
    assert "stale: docs/roles/demo.md" in capsys.readouterr().out
    assert roledocs.main(argv) == 0
    assert roledocs.main([*argv, "--check"]) == 0
    (tmp_path / "docs" / "roles" / "gone.md").write_text("old role\n")
    assert roledocs.main([*argv, "--check"]) == 1
    assert "stale: docs/roles/gone.md" in capsys.readouterr().out
    assert roledocs.main(argv) == 0
    assert sorted(p.name for p in (tmp_path / "docs" / "roles").iterdir()) == [
        "README.md",
        "demo.md",
    ]


def test_rendering_is_deterministic(pages: dict[str, str]) -> None:
    assert roledocs.render_all(roledocs.load_specs(ROOT)) == pages
    assert all(text.endswith("\n") and not text.endswith("\n\n") for text in pages.values())


@pytest.mark.parametrize(
    ("text", "markdown"),
    [
        ("C(binary) installs", "`binary` installs"),
        ("I(alertmanager_tls_cert) (PEM)", "`alertmanager_tls_cert` (PEM)"),
        ("B(never) logged", "**never** logged"),
        ("see U(https://example.org/a)", "see <https://example.org/a>"),
        ("see L(the docs, https://example.org/d).", "see [the docs](https://example.org/d)."),
        (r"V(a\)b) and V(x)", "`a)b` and `x`"),
        ("as C({version: {arch: sha256}}), merged", "as `{version: {arch: sha256}}`, merged"),
        ("(22.05 has no C(scontrol --json))", "(22.05 has no `scontrol --json`)"),
        ("C(a`b)", "``a`b``"),
        ("M(ansible.builtin.copy) and O(x) stay", "M(ansible.builtin.copy) and O(x) stay"),
        ("ABC(x) is no markup", "ABC(x) is no markup"),
        ("loki-linux-<arch>.zip", "loki-linux-\\<arch>.zip"),
        ("folded\n  lines", "folded lines"),
    ],
)
def test_markup(text: str, markdown: str) -> None:
    assert roledocs.markup(text) == markdown


def test_paragraphs() -> None:
    assert roledocs.paragraphs(None) == []
    assert roledocs.paragraphs("One C(x).") == ["One `x`."]
    assert roledocs.paragraphs(["One.", "Two I(y)."]) == ["One.", "Two `y`."]


@pytest.mark.parametrize(
    ("option", "name"),
    [
        ({"type": "int"}, "int"),
        ({"type": "list", "elements": "str"}, "list of str"),
        ({"type": "list", "elements": "dict"}, "list of dict"),
        ({}, "str"),
    ],
)
def test_type_name(option: dict, name: str) -> None:
    assert roledocs.type_name(option) == name


@pytest.mark.parametrize(
    ("value", "markdown"),
    [
        ("", '`""`'),
        ("binary", "`binary`"),
        ("12", "`'12'`"),
        ("null", "`'null'`"),
        (None, "`null`"),
        (True, "`true`"),
        (9093, "`9093`"),
        ([], "`[]`"),
        ({}, "`{}`"),
        (["alertname", "cluster"], "`[alertname, cluster]`"),
        ({"node": 9100, "dcgm": 9400}, "`{node: 9100, dcgm: 9400}`"),
        (
            "{{ groups['alertmanager'] | default([]) }}",
            "`{{ groups['alertmanager'] | default([]) }}`",
        ),
    ],
)
def test_render_default_inline(value: object, markdown: str) -> None:
    assert roledocs.render_default(value) == markdown


def test_long_default_is_a_yaml_block() -> None:
    value = [{"field": f"DCGM_FI_DEV_{n}", "type": "gauge"} for n in range(5)]
    block = roledocs.render_default(value)
    assert isinstance(block, list)
    assert block[0] == "```yaml" and block[-1] == "```"
    assert block[1] == "- {field: DCGM_FI_DEV_0, type: gauge}"
    assert yaml.safe_load("\n".join(block[1:-1])) == value


def test_long_flat_list_is_one_item_a_line() -> None:
    value = [f"/var/log/slurm/daemon{n}.log" for n in range(4)]
    block = roledocs.render_default(value)
    assert block[1:-1] == [f"- {item}" for item in value]


def test_option_page() -> None:
    spec = {
        "short_description": "Demo C(role).",
        "description": ["First.", "Second."],
        "options": {
            "demo_mode": {
                "type": "str",
                "choices": ["a", "b"],
                "default": "a",
                "description": "Mode, C(a) or C(b).",
            },
            "demo_items": {
                "type": "list",
                "elements": "dict",
                "default": [],
                "description": "Items.",
                "options": {"name": {"type": "str", "required": True, "description": "Name."}},
            },
        },
    }
    page = roledocs.render_role("demo", spec)
    assert page.startswith("# `demo`\n")
    assert "\nDemo `role`.\n\nFirst.\n\nSecond.\n\n## Variables\n" in page
    assert "### `demo_mode`\n\n- type: `str`\n- default: `a`\n- choices: `a`, `b`\n" in page
    assert "\n#### `demo_items.name`\n\n- type: `str`\n- required: yes\n\nName.\n" in page
    assert page.index("demo_mode") < page.index("demo_items")
