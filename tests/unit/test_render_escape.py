"""Role variables reach units, environment files and grafana.ini literally (issue 26/15).

The systemd checks read the quoted text back with systemd's own word splitter and
environment-file reader (extract_first_word and load_env_file of the installed
libsystemd-shared, called through ctypes; skipped where it is missing), then read back
%% and $$ as systemd.unit(5) "Specifiers" and systemd.service(5) "Command lines" say
(any other % or $ fails the test: systemd would expand it). grafana.ini values are
read back by a model of gopkg.in/ini.v1's readValue and Grafana's expanders.

Property tests are seeded and bounded: random strings of the characters each format
treats specially, a few hundred per format.
"""

from __future__ import annotations

import ctypes
import glob
import random
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path

import pytest
from render_role import systemd_verify_problems, template_value, trust_as_template
from test_unit_bounds import SCENARIOS, Scenario, services

from gpufleet import render_escape as esc

# Spaces, systemd's specials, shell and INI specials, and non-ASCII.
HOSTILE_CHARS = " %$;\"'\\#`{}()=:/-_aZh9\u00fc\u20ac"
HOSTILE = "/srv/gpu fleet/%h;$HOME ${USER} \"q\" 'a' \\b \u00fc#x"
WHITESPACE = " \t\n\r"


def random_strings(seed: int, count: int, alphabet: str = HOSTILE_CHARS) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 14))) for _ in range(count)]


# ------------------------------------------------------------ systemd, as systemd reads it


class LibSystemd:
    """extract_first_word and load_env_file of the installed libsystemd-shared."""

    CUNESCAPE = 1 << 1

    def __init__(self, path: str):
        self.lib = ctypes.CDLL(path)
        self.libc = ctypes.CDLL(None)
        self.libc.free.argtypes = [ctypes.c_void_p]
        self.lib.extract_first_word.argtypes = [
            ctypes.POINTER(ctypes.c_char_p),
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.c_char_p,
            ctypes.c_int,
        ]
        self.lib.extract_first_word.restype = ctypes.c_int
        self.lib.load_env_file.argtypes = [
            ctypes.c_void_p,
            ctypes.c_char_p,
            ctypes.POINTER(ctypes.POINTER(ctypes.c_char_p)),
        ]
        self.lib.load_env_file.restype = ctypes.c_int
        # EXTRACT_UNQUOTE moved between releases (1 << 4, later 1 << 5 when KEEP_QUOTE
        # came in): the one that unquotes is found by asking.
        self.unquote = next((flag for flag in (1 << 5, 1 << 4, 1 << 3) if self._probe(flag)), None)

    def _probe(self, flag: int) -> bool:
        try:
            return self.words('"a b" c\\x41', flag | self.CUNESCAPE) == ["a b", "cA"]
        except ValueError:
            return False

    def first_word(self, text: str, flags: int) -> tuple[str | None, str]:
        buf = ctypes.create_string_buffer(text.encode())
        p = ctypes.c_char_p(ctypes.addressof(buf))
        out = ctypes.c_void_p()
        r = self.lib.extract_first_word(ctypes.byref(p), ctypes.byref(out), None, flags)
        if r < 0:
            raise ValueError(f"systemd cannot split {text!r} ({r})")
        rest = (p.value or b"").decode()
        if r == 0:
            return None, rest
        word = ctypes.string_at(out.value).decode()
        self.libc.free(out)
        return word, rest

    def words(self, text: str, flags: int) -> list[str]:
        out = []
        while True:
            word, text = self.first_word(text, flags)
            if word is None:
                return out
            out.append(word)

    def env_file(self, path: Path) -> dict[str, str]:
        strv = ctypes.POINTER(ctypes.c_char_p)()
        r = self.lib.load_env_file(None, str(path).encode(), ctypes.byref(strv))
        if r < 0:
            raise ValueError(f"systemd cannot read {path} ({r})")
        out, i = {}, 0
        while strv[i]:
            name, _, value = strv[i].decode().partition("=")
            out[name] = value
            i += 1
        return out


@cache
def libsystemd() -> LibSystemd | None:
    found = sorted(
        glob.glob("/usr/lib/*/systemd/libsystemd-shared-*.so")
        + glob.glob("/usr/lib/systemd/libsystemd-shared-*.so")
        + glob.glob("/lib/systemd/libsystemd-shared-*.so")
    )
    try:
        lib = LibSystemd(found[0]) if found else None
    except (OSError, AttributeError):
        return None
    return lib if lib and lib.unquote else None


needs_systemd = pytest.mark.skipif(
    libsystemd() is None, reason="no libsystemd-shared with extract_first_word here"
)


def unspecify(word: str) -> str:
    """A word after specifier expansion, when it must hold no specifier: %% is %."""

    def one(match: re.Match) -> str:
        if match.group(1) != "%":
            raise AssertionError(f"{word!r}: systemd would expand %{match.group(1)}")
        return "%"

    return re.sub(r"%(.?)", one, word, flags=re.S)


def unexpand(word: str, allowed: frozenset[str] = frozenset()) -> str:
    """An argument after $-expansion at start: $$ is $; $NAME and ${NAME} would expand."""
    out, i = [], 0
    while i < len(word):
        if word.startswith("$$", i):
            out.append("$")
            i += 2
            continue
        found = re.compile(r"\$(\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))").match(
            word, i
        )
        if found:
            name = found.group(2) or found.group(3)
            if name not in allowed:
                raise AssertionError(f"{word!r}: systemd would expand ${name}")
            out.append(found.group(0))
            i = found.end()
            continue
        out.append(word[i])
        i += 1
    return "".join(out)


def exec_commands(value: str, allowed_env: frozenset[str] = frozenset()) -> list[list[str]]:
    """The commands of an Exec*= value as systemd runs them: [path, arg, ...] each."""
    lib = libsystemd()
    flags = lib.unquote | lib.CUNESCAPE
    commands: list[list[str]] = [[]]
    rest = value
    while True:
        rest = rest.lstrip(WHITESPACE)
        if not rest:
            break
        # An unquoted ";" word of its own separates two commands.
        if rest[0] == ";" and (len(rest) == 1 or rest[1] in WHITESPACE):
            commands.append([])
            rest = rest[1:]
            continue
        word, rest = lib.first_word(rest, flags)
        if word is None:
            break
        commands[-1].append(word)
    out = []
    for words in commands:
        path, *args = words
        assert path.startswith("/"), f"{value!r}: the program is no absolute path"
        out.append([unspecify(path)] + [unexpand(unspecify(a), allowed_env) for a in args])
    return out


def unit_settings(text: str) -> list[tuple[str, str]]:
    """(key, value) of a unit file as systemd's parser reads it: a line ending in a
    backslash continues on the next, comment lines are skipped, even inside one."""
    out, pending = [], None
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith(("#", ";")):
            continue
        if pending is not None:
            line = pending + " " + line
            pending = None
        if line.endswith("\\"):
            pending = line[:-1]
            continue
        if line and not line.startswith("[") and "=" in line:
            key, _, value = line.partition("=")
            out.append((key.strip(), value.strip()))
    return out


@needs_systemd
def test_libsystemd_reads_what_the_systemd_docs_say():
    """The model is systemd's own parser: quoting and separators as documented."""
    assert exec_commands('/bin/echo "a b" \\x41 ; /bin/true x') == [
        ["/bin/echo", "a b", "A"],
        ["/bin/true", "x"],
    ]
    assert exec_commands('/bin/echo ";" a;b') == [["/bin/echo", ";", "a;b"]]
    with pytest.raises(AssertionError, match="expand %h"):
        exec_commands("/bin/echo %h")
    with pytest.raises(AssertionError, match="expand \\$HOME"):
        exec_commands("/bin/echo $HOME")


@needs_systemd
@pytest.mark.parametrize("seed", range(4))
def test_any_argument_is_one_literal_argument(seed: int):
    values = [*random_strings(seed, 150), ";", "%h", "$HOME", "${HOME}", "", "a;b", "#c"]
    line = " ".join(["/usr/bin/prog"] + [esc.systemd_arg(v) for v in values] + ["--last"])
    assert exec_commands(line) == [["/usr/bin/prog", *values, "--last"]]
    # One argument per continuation line, as the templates write them.
    continued = "ExecStart=/usr/bin/prog \\\n" + "".join(
        f"    {esc.systemd_arg(v)} \\\n" for v in values
    )
    ((key, value),) = unit_settings(continued + "    --last\n")
    assert key == "ExecStart" and exec_commands(value) == [["/usr/bin/prog", *values, "--last"]]


@needs_systemd
def test_environment_and_path_values_read_back_literally():
    lib = libsystemd()
    for value in random_strings(7, 300):
        (word,) = lib.words(esc.systemd_environment(value, "SLURM_CONF"), lib.unquote | 2)
        assert unspecify(word) == "SLURM_CONF=" + value  # no $ expansion in Environment=
        # ReadWritePaths= unquotes without C escapes; "-" inside the quotes.
        (path,) = lib.words(esc.systemd_path("/" + value, "-"), lib.unquote)
        assert unspecify(path) == "-/" + value


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze not installed")
def test_systemd_runs_the_executable_that_was_named(tmp_path: Path):
    """systemd-analyze verify names the program it would run (it does not exist here)."""
    path = "/opt/gpu fleet/%h;x/\u00fc"
    unit = tmp_path / "x.service"
    unit.write_text(f"[Service]\nExecStart={esc.systemd_executable(path)} --x\n")
    run = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert f"Command {path} is not executable" in run.stderr
    assert not systemd_verify_problems(unit)


def test_what_a_unit_cannot_hold_is_refused():
    for bad in ("relative/prog", "/opt/$x/prog", '/opt/"q"', "/opt/a\\b"):
        with pytest.raises(esc.UnrepresentableValue):
            esc.systemd_executable(bad)
    for bad in ("a\nb", "a\rb", "a\x00b", "a\x7fb", None, True, ["a"]):
        with pytest.raises(esc.UnrepresentableValue):
            esc.systemd_arg(bad)
    with pytest.raises(esc.UnrepresentableValue):
        esc.systemd_environment("x", "BAD NAME")
    with pytest.raises(esc.UnrepresentableValue):
        esc.systemd_path("relative")


def test_plain_words_stay_readable():
    assert esc.systemd_arg("--web.listen-address=[::]:9100") == "--web.listen-address=[::]:9100"
    assert esc.systemd_arg(15) == "15"
    assert esc.systemd_arg("50%") == "50%%"
    assert esc.systemd_arg("a b") == '"a b"'
    assert esc.systemd_arg(";") == '";"'
    assert esc.systemd_arg("#x") == '"#x"'
    assert esc.systemd_path("/var/lib/x", "-") == "-/var/lib/x"


# ------------------------------------------------------------------ environment files


@needs_systemd
@pytest.mark.parametrize("seed", range(2))
def test_environment_file_values_read_back_by_systemd_and_sh(seed: int, tmp_path: Path):
    values = [*random_strings(100 + seed, 100), "", "\\", '"', "$HOME", "`id`", "%h"]
    env = tmp_path / "default"
    env.write_text("".join(f"V{i}={esc.env_value(v)}\n" for i, v in enumerate(values)))
    read = libsystemd().env_file(env)
    assert [read[f"V{i}"] for i in range(len(values))] == values
    names = " ".join(f'"$V{i}"' for i in range(len(values)))
    shell = subprocess.run(
        ["sh", "-c", f'. "$1"; printf "%s\\0" {names}', "sh", str(env)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert shell.stdout.split("\0")[:-1] == values


def test_environment_file_words_refuse_what_the_service_would_split():
    assert esc.env_words(["-a=1", "-b=$x"]) == '"-a=1 -b=\\$x"'
    for bad in (["a b"], ['a"'], ["a'"], ["a\\b"], [""], ["a\tb"]):
        with pytest.raises(esc.UnrepresentableValue):
            esc.env_words(bad)


# ---------------------------------------------------------------------- grafana.ini


def go_ini_value(raw: str) -> str:
    """gopkg.in/ini.v1 parser.readValue (LoadOptions as Grafana's ini.Load gives)."""
    line = raw.lstrip()
    if not line:
        return ""
    quote = '"""' if len(line) > 3 and line.startswith('"""') else "`" if line[0] == "`" else ""
    if quote:
        body = line[len(quote) :]
        end = body.rfind(quote)
        assert end >= 0, "a multi-line value"
        return body[:end]
    line = line.strip()
    assert not line.endswith("\\"), "a continued value"
    cut = [i for i in (line.find("#"), line.find(";")) if i >= 0]
    if cut:
        line = line[: min(cut)].strip()
    if len(line) >= 2 and line[0] == line[-1] and line[0] in "'\"":
        line = line[1:-1]
    return line


def grafana_reads(raw: str) -> str:
    """The value Grafana uses: go-ini's %(key)s and Grafana's $..{..} expand it."""
    value = go_ini_value(raw)
    assert not re.search(r"%\([^)]+\)s", value), "go-ini would replace a %(key)s"
    assert not re.search(r"\$(|__\w+)\{[^}]+\}", value), "Grafana would expand it"
    return value


@pytest.mark.parametrize("seed", range(3))
def test_grafana_ini_values_read_back_or_are_refused(seed: int):
    values = random_strings(200 + seed, 200, HOSTILE_CHARS + '"""``')
    values += ['a"""b', '"""', "`x`", " lead", "trail ", "x#y", "x;y", '"q"', "", "50%"]
    refused = 0
    for value in values:
        if esc.ini_problem(value):
            refused += 1
            with pytest.raises(esc.UnrepresentableValue):
                esc.ini_value(value)
            continue
        line = f"key = {esc.ini_value(value)}\n"
        assert grafana_reads(line.split("=", 1)[1]) == value, line
    assert refused < len(values) / 2


def test_grafana_expansions_are_refused_with_one_line_each():
    config = {
        "server": {"root_url": "http://mon03:3000/", "x": 'a"""b'},
        "security": {"admin_password": "$__file{/etc/shadow}", "secret_key": "${HOME}"},
        "smtp": {"password": "%(admin_password)s", "from": "$__env{X} $__vault{y}"},
        "bad key": 1,
    }
    assert esc.ini_problems(config) == [
        "security.admin_password holds a Grafana expansion ($__env{..}, $__file{..},"
        " ${..}), which has no escape",
        "security.secret_key holds a Grafana expansion ($__env{..}, $__file{..},"
        " ${..}), which has no escape",
        "smtp.password holds a %(key)s reference, which go-ini expands and cannot escape",
        "smtp.from holds a Grafana expansion ($__env{..}, $__file{..}, ${..}), which has no escape",
        "bad key: the name 'bad key' is not letters, digits, '_', '.', '-'",
    ]
    assert esc.ini_value(True) == "true" and esc.ini_value("False") == "false"
    assert esc.ini_value(3000) == "3000" and esc.ini_value("a b") == '"""a b"""'


# ------------------------------------------------------------ the roles' rendered files

CGROUP = '/machine.slice/libpod-%h $x;"q".scope'
# Per scenario of test_unit_bounds: hostile values, and the arguments (or Environment=,
# ReadWritePaths= words) each must come out as.
HOSTILE_SCENARIOS = {
    "node_exporter": (
        {"node_exporter_textfile_dir": HOSTILE, "node_exporter_extra_flags": [";", "--x=%i"]},
        [["--collector.textfile.directory=" + HOSTILE], [";", "--x=%i"]],
    ),
    "gpu_collector": (
        {"gpu_collector_nvidia_smi_path": HOSTILE, "gpu_collector_slurm_cgroup_root": CGROUP},
        [["--nvidia-smi", HOSTILE], ["--slurm-cgroup-root", CGROUP]],
    ),
    "gpu_collector_timer": (
        {"gpu_collector_nvidia_smi_path": HOSTILE, "gpu_collector_slurm_cgroup_root": CGROUP},
        [["--nvidia-smi", HOSTILE], ["--slurm-cgroup-root", CGROUP]],
    ),
    "slurm_exporter": (
        {"slurm_exporter_slurm_bin_dir": HOSTILE, "slurm_exporter_slurm_conf": HOSTILE},
        [["--slurm-bin-dir", HOSTILE], ["SLURM_CONF=" + HOSTILE]],
    ),
    "prometheus_shard": (
        {"prometheus_data_dir": HOSTILE, "prometheus_extra_flags": ["--a=b c"]},
        [["--storage.tsdb.path=" + HOSTILE + "/shard-0"], ["--a=b c"], [HOSTILE + "/shard-0"]],
    ),
    "alertmanager": (
        {"alertmanager_data_dir": HOSTILE},
        [["--storage.path=" + HOSTILE], [HOSTILE]],
    ),
    "loki": (
        {"loki_config_dir": HOSTILE, "loki_data_dir": HOSTILE},
        [["-config.file=" + HOSTILE + "/loki.yml"], [HOSTILE]],
    ),
    "dcgm_package": ({"dcgm_exporter_extra_flags": ["--x=" + HOSTILE]}, [["--x=" + HOSTILE]]),
    "dcgm_podman": ({"dcgm_exporter_extra_flags": ["--x=" + HOSTILE]}, [["--x=" + HOSTILE]]),
    "alloy": ({"alloy_data_dir": HOSTILE}, [["-" + HOSTILE]]),
    "victoriametrics": ({"victoriametrics_data_dir": HOSTILE}, [["-" + HOSTILE]]),
}


def contains_run(words: list[str], run: list[str]) -> bool:
    return any(words[i : i + len(run)] == run for i in range(len(words) - len(run) + 1))


def read_units(name: str, overrides: dict) -> list[list[str]]:
    """Every command, Environment= and ReadWritePaths= list of the scenario's services,
    read as systemd reads them. The expansions allowed: ExecReload's $MAINPID, and
    Prometheus' ${GPUFLEET_QUERY_MAX_SAMPLES}, a number its own bounds drop-in sets."""
    scenario = SCENARIOS[name]
    lib = libsystemd()
    found: list[list[str]] = []
    merged = Scenario(scenario.role, scenario.host, {**scenario.overrides, **overrides})
    for files in services(merged).values():
        for _, text in files:
            for key, value in unit_settings(text):
                if key.startswith("Exec"):
                    value = value.lstrip("-@:+!")
                    allowed = frozenset({"MAINPID", "GPUFLEET_QUERY_MAX_SAMPLES"})
                    found.extend(exec_commands(value, allowed))
                elif key in ("Environment", "ReadWritePaths"):
                    unquote = lib.unquote | (2 if key == "Environment" else 0)
                    found.append([unspecify(w) for w in lib.words(value, unquote)])
    return found


@needs_systemd
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_every_unit_reads_back_without_expansion(name: str):
    """With the scenario's own values: no command picks up a specifier or a variable."""
    assert read_units(name, {})


@needs_systemd
@pytest.mark.parametrize("name", sorted(HOSTILE_SCENARIOS))
def test_hostile_role_variables_stay_one_literal_value(name: str, tmp_path: Path):
    overrides, expected = HOSTILE_SCENARIOS[name]
    read = read_units(name, overrides)
    for run in expected:
        assert any(contains_run(words, run) for words in read), (name, run, read)
    # Exactly the commands the scenario runs with harmless values: no ";" adds one.
    assert len([w for w in read if w and w[0].startswith("/")]) == len(
        [w for w in read_units(name, {}) if w and w[0].startswith("/")]
    )


def test_grafana_ini_writes_triple_quotes_literally_and_preflight_refuses_expansions():
    from test_grafana_role import SECRETS, grafana_ini, tasks

    ini = grafana_ini(grafana_ini={"server": {"x": 'a"""b'}, "smtp": {"from": "x; y # z"}})
    # configparser keeps the quotes; go-ini's reading of the written line is checked here.
    assert grafana_reads(ini["server"]["x"]) == 'a"""b'
    assert grafana_reads(ini["smtp"]["from"]) == "x; y # z"
    (task,) = [t for t in tasks("preflight.yml") if "written literally" in t["name"]]
    problems = template_value(
        "grafana",
        trust_as_template(task["vars"]["__grafana_ini_problems"]),
        "mon03",
        {
            **SECRETS,
            "grafana_admin_password": "$__file{/etc/shadow}",
            "grafana_ini": {"server": {"domain": "${HOME}"}},
        },
    )
    assert problems == [
        "server.domain holds a Grafana expansion ($__env{..}, $__file{..}, ${..}), which"
        " has no escape",
        "security.admin_password holds a Grafana expansion ($__env{..}, $__file{..}, ${..}),"
        " which has no escape",
    ]
    with pytest.raises(Exception, match="Grafana expansion") as refused:
        grafana_ini(grafana_admin_password="$__file{/etc/shadow}")
    assert "shadow" not in str(refused.value)


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze not installed")
@pytest.mark.parametrize("name", sorted(HOSTILE_SCENARIOS))
def test_hostile_units_pass_systemd_analyze_verify(name: str, tmp_path: Path):
    overrides, _ = HOSTILE_SCENARIOS[name]
    scenario = SCENARIOS[name]
    merged = Scenario(scenario.role, scenario.host, {**scenario.overrides, **overrides})
    for service, files in services(merged).items():
        if service.endswith(".timer"):
            continue
        parts = []
        if not any(n.endswith(".service.j2") for n, _ in files):
            parts.append("[Unit]\nDescription=stand-in\n[Service]\nExecStart=/bin/true\n")
        parts.extend(text for _, text in files)
        text = re.sub(r"(Exec\w+=[-@!+]*)(/\S+)", r"\1/bin/true", "\n".join(parts))
        unit = tmp_path / service
        unit.write_text(text)
        assert not systemd_verify_problems(unit), (name, systemd_verify_problems(unit))
