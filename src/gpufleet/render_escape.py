"""Quote role variables for the files they are rendered into.

Each function takes one value from the inventory and returns it written so that the
program reading the file gets exactly that value back, or raises UnrepresentableValue
when the format has no way to say it literally. plugins/filter/gpufleet_filters.py exposes
them as the gpufleet_systemd_*, gpufleet_env_* and gpufleet_ini_* filters.

systemd (systemd.service(5) "Command lines", systemd.syntax(7), systemd.unit(5)
"Specifiers"): a command line is split into words with C-style quoting and escapes
(a double-quoted word keeps spaces and ";"; inside it "\\" and '"' are escaped), each
word is then expanded for %-specifiers ("%%" is a literal "%"), and at start every
argument is expanded for $VAR and ${VAR} ("$$" is a literal "$"). A ";" ends the
command only as a word of its own, unquoted.

EnvironmentFile= (systemd's parse_env_file, and a POSIX shell alike): inside double
quotes a backslash escapes '"', "\\", "`" and "$"; systemd expands nothing there.

grafana.ini (gopkg.in/ini.v1, then Grafana's expanders): a value in triple quotes
is taken verbatim up to the last '\"\"\"' of its line; ini.v1 then replaces every
%(key)s with another key's value, and Grafana every $__env{..}, $__file{..},
$__vault{..} and ${..}. Neither has an escape: such a value is refused.
"""

from __future__ import annotations

import re

# Every C0 control character and DEL: each would end a line or be read differently
# by one of the parsers; the roles' preflights refuse them first, naming the variable.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# A word that needs no quotes in a unit file (after % and $ are doubled): printable
# ASCII but the quotes, the backslash, and ";" and "#", which start a comment line
# (even inside a continued ExecStart=) and ";" also a second command.
_SYSTEMD_PLAIN = re.compile(r"[!$-&(-:<-\[\]-~]+")
# Environment variable names, as systemd and a shell accept them.
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# ini keys and section names gpufleet writes: no delimiter, bracket, quote or comment.
_INI_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")
# A value go-ini and Grafana read back unchanged without quotes.
_INI_PLAIN = re.compile(r"[A-Za-z0-9_@+=:,./\-]+")
# Grafana's expander pattern (pkg/setting/expanders.go) and go-ini's recursive value.
_GRAFANA_EXPANSION = re.compile(r"\$(|__[0-9A-Za-z_]+)\{[^}]+\}")
_GO_INI_REFERENCE = re.compile(r"%\([^)]+\)s")


class UnrepresentableValue(ValueError):
    """A value the target format cannot hold literally."""


def _text(value: object, what: str) -> str:
    if isinstance(value, bool) or value is None or isinstance(value, (list, dict)):
        raise UnrepresentableValue(f"{what}: {value!r} is not a string or number")
    text = str(value)
    if _CONTROL.search(text):
        raise UnrepresentableValue(f"{what}: {text!r} holds a control character")
    return text


def systemd_specifiers(value: object) -> str:
    """A value of a unit setting that expands %-specifiers but takes no quotes
    (Description=, User=, MemoryMax=...): each % doubled."""
    return _text(value, "systemd value").replace("%", "%%")


def _systemd_quoted(text: str, *, expand_env: bool) -> str:
    text = text.replace("%", "%%")
    if expand_env:
        text = text.replace("$", "$$")
    if _SYSTEMD_PLAIN.fullmatch(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def systemd_arg(value: object) -> str:
    """One argument of ExecStart= (or ExecReload=...): one word, read literally."""
    return _systemd_quoted(_text(value, "systemd argument"), expand_env=True)


def systemd_executable(value: object) -> str:
    """The program of ExecStart=: an absolute path. systemd does not expand $ in the
    path it runs but does in argv[0], so a path with a $ cannot be given literally;
    it refuses a path with a quote or backslash ("contains special characters")."""
    text = _text(value, "systemd executable")
    if not text.startswith("/") or re.search(r"[$\\\"']", text):
        raise UnrepresentableValue(
            f"systemd executable: {text!r} must be an absolute path without $, quotes"
            " or backslashes"
        )
    return _systemd_quoted(text, expand_env=False)


def systemd_path(value: object, prefix: str = "") -> str:
    """One path of a list setting such as ReadWritePaths= (quoted words, specifiers,
    no $ expansion). prefix ("-": ignore a missing path) goes inside the quotes, where
    systemd looks for it."""
    text = _text(value, "systemd path")
    if not text.startswith("/"):
        raise UnrepresentableValue(f"systemd path: {text!r} is not an absolute path")
    return _systemd_quoted(prefix + text, expand_env=False)


def systemd_environment(value: object, name: str) -> str:
    """The value of Environment=: one quoted NAME=value assignment (specifiers are
    expanded there, $ is not)."""
    if not _ENV_NAME.fullmatch(name):
        raise UnrepresentableValue(f"environment variable name {name!r} is not valid")
    text = _text(value, f"environment variable {name}")
    return _systemd_quoted(f"{name}={text}", expand_env=False)


def env_value(value: object) -> str:
    """A value of an EnvironmentFile= (/etc/default/...) file: double-quoted, with
    the characters a shell and systemd treat specially inside quotes escaped."""
    text = _text(value, "environment file value")
    escaped = re.sub(r'(["\\`$])', r"\\\1", text)
    return f'"{escaped}"'


def env_words(words: list[object]) -> str:
    """A variable that a unit's ExecStart= uses as $NAME, which systemd splits at
    whitespace into arguments: each word must hold no whitespace or quote."""
    checked = []
    for word in words:
        text = _text(word, "environment file word")
        if not text or re.search(r"[\s\"'\\]", text):
            raise UnrepresentableValue(
                f"environment file word {text!r} must be non-empty and hold no space, quote"
                " or backslash: the service splits this variable at whitespace"
            )
        checked.append(text)
    return env_value(" ".join(checked))


def ini_name(value: object) -> str:
    """A grafana.ini section or key name."""
    text = _text(value, "ini name")
    if not _INI_NAME.fullmatch(text):
        raise UnrepresentableValue(
            f"ini name {text!r}: only letters, digits, '_', '.' and '-' are written"
        )
    return text


def ini_problem(value: object) -> str | None:
    """Why a grafana.ini value cannot be written literally, or None."""
    if isinstance(value, (list, dict)) or value is None:
        return "is not a string, number or boolean"
    text = str(value)
    if _CONTROL.search(text):
        return "holds a control character"
    if _GRAFANA_EXPANSION.search(text):
        return "holds a Grafana expansion ($__env{..}, $__file{..}, ${..}), which has no escape"
    if _GO_INI_REFERENCE.search(text):
        return "holds a %(key)s reference, which go-ini expands and cannot escape"
    return None


def ini_problems(config: dict[object, object]) -> list[str]:
    """One line per name or value of config (grafana.ini as {key: value} and
    {section: {key: value}}) that cannot be written literally, for the preflight."""
    problems = []

    def check(path: str, names: list[object], value: object) -> None:
        for name in names:
            if not isinstance(name, str) or not _INI_NAME.fullmatch(name):
                problems.append(f"{path}: the name {name!r} is not letters, digits, '_', '.', '-'")
                return
        problem = ini_problem(value)
        if problem:
            problems.append(f"{path} {problem}")

    for key, value in config.items():
        if isinstance(value, dict):
            for option, option_value in value.items():
                check(f"{key}.{option}", [key, option], option_value)
        else:
            check(str(key), [key], value)
    return problems


def ini_value(value: object) -> str:
    """A grafana.ini value: booleans as true/false, plain words bare, anything else in
    triple quotes, which go-ini takes verbatim up to the last \"\"\" of the line."""
    problem = ini_problem(value)
    if problem:
        # Without the value: grafana.ini holds the admin password and secret key.
        raise UnrepresentableValue(f"a grafana.ini value {problem}")
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value)
    if text.lower() in ("true", "false"):
        return text.lower()
    if _INI_PLAIN.fullmatch(text):
        return text
    return f'"""{text}"""'
