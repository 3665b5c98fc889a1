"""Every external command that scripts/, .ci/ and molecule/testbed/ call comes from a package
that scripts/packages.txt declares (or from the base image).

The commands are extracted from the sources (a small bash tokenizer; ast for Python) and checked
against what the packages really install: `dpkg -L` for Debian packages, the distribution's
console scripts (importlib.metadata, so run this from .venv) for pypi ones. The base image is
Debian 12 (its minbase: every Essential or Priority: required package) with BASE_PACKAGES, and
whatever those depend on.

Both build machines' suites, Debian 12 (bookworm) and 13 (trixie), must have every declared
`debian` name: scripts/bootstrap installs the same names on either, so a name one suite lacks
(python3.11-venv on trixie, whose python3 is 3.13) breaks bootstrap there while this machine's
tests stay green. Those names are checked against the suites' own indexes, downloaded and
verified by apt against their signed Release files (molecule/testbed/debian_suite.py, cached
under .cache/debian/ for a day); without apt access to a Debian mirror that fails rather than
skips, like the other tests that read a Debian suite.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "molecule" / "testbed"))

import debian_suite  # noqa: E402

PACKAGES_TXT = ROOT / "scripts" / "packages.txt"
BUILD_SUITES = ("bookworm", "trixie")  # Debian 12 and 13: the build machines
BASE_PACKAGES = ("coreutils", "bash", "python3", "apt", "dpkg", "git", "curl")
BIN_DIRS = ("/usr/bin", "/usr/sbin")  # /bin and /sbin are the same directories (usrmerge)
# A virtual environment's command: .venv/bin/python, .cache/venv-floor/bin/pip.
VENV = re.compile(r"^(?!/)[^$]*/bin/(?P<name>[^/]+)$")
VENV_CORE = frozenset({"python", "python3", "pip", "pip3"})  # made by `python3 -m venv`

BASH_KEYWORDS = frozenset(
    {"if", "then", "else", "elif", "fi", "while", "until", "do", "done", "in", "time", "!"}
    | {"[[", "]]", "{", "}"}
)
BASH_BUILTINS = frozenset(
    """: . [ alias bg bind break builtin caller cd command compgen complete continue declare dirs
    disown echo enable eval exec exit export false fc fg getopts hash help history jobs kill let
    local logout mapfile popd printf pushd pwd read readarray readonly return set shift shopt
    source suspend test times trap true type typeset ulimit umask unalias unset wait""".split()  # noqa: SIM905
)
# Commands whose (non-option) argument is itself a command: `exec ./x`, `xargs -n1 basename`.
WRAPPERS = frozenset({"exec", "command", "sudo", "env", "nohup", "xargs"})
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\[[^]]*\])?\+?=")
HEREDOC = re.compile(r"(?<!<)<<-?\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1")
SUBPROCESS_FUNCTIONS = frozenset({"run", "Popen", "check_output", "check_call", "call"})


# --- bash ---------------------------------------------------------------------------------------


def drop_heredoc_bodies(text: str) -> str:
    lines, kept, delimiter = text.splitlines(), [], None
    for line in lines:
        if delimiter is not None:
            if line.strip() == delimiter:
                delimiter = None
            continue
        kept.append(line)
        if match := HEREDOC.search(line):
            delimiter = match.group(2)
    return "\n".join(kept) + "\n"


class BashScanner:
    """Splits bash source into simple commands (lists of words), including the commands inside
    $(...), `...`, <(...) and (...). Quoted text stays inside its word; heredocs and comments go."""

    def __init__(self, text: str) -> None:
        self.text = drop_heredoc_bodies(text)
        self.pos = 0
        self.commands: list[list[str]] = []
        self.functions: set[str] = set()  # name() { ...; }: called like commands

    def balanced(self, opener: str, closer: str) -> str:
        """The text from self.pos (at opener) to its matching closer, consumed."""
        start, depth = self.pos, 0
        while self.pos < len(self.text):
            char = self.text[self.pos]
            self.pos += 1
            depth += (char == opener) - (char == closer)
            if depth == 0:
                return self.text[start : self.pos]
        raise ValueError(f"unbalanced {opener}{closer}")

    def substitution(self, closer: str) -> str:
        """Scan the nested commands up to closer; a placeholder for them in the outer word."""
        self.scan(closer)
        return "$(...)"

    def double_quoted(self) -> str:
        self.pos += 1
        out = ""
        while self.pos < len(self.text):
            char, rest = self.text[self.pos], self.text[self.pos :]
            if char == '"':
                self.pos += 1
                return out
            if char == "\\":
                out += rest[1:2]
                self.pos += 2
            elif rest.startswith("$(("):
                self.pos += 1
                out += "$" + self.balanced("(", ")")
            elif rest.startswith("$("):
                self.pos += 2
                out += self.substitution(")")
            elif char == "`":
                self.pos += 1
                out += self.substitution("`")
            else:
                out += char
                self.pos += 1
        raise ValueError("unterminated double quote")

    def scan(self, closer: str = "") -> None:
        words: list[str] = []
        word, in_word, redirect_target = "", False, False

        def end_word() -> None:
            nonlocal word, in_word, redirect_target
            if in_word and not redirect_target:
                words.append(word)
            if in_word:
                redirect_target = False
            word, in_word = "", False

        def end_command() -> None:
            nonlocal words, redirect_target
            end_word()
            if words:
                self.commands.append(words)
            words, redirect_target = [], False

        text = self.text
        while self.pos < len(text):
            char, rest = text[self.pos], text[self.pos :]
            if closer and char == closer:
                end_command()
                self.pos += 1
                return
            if char == "\\":
                if rest[1:2] != "\n":
                    word, in_word = word + rest[1:2], True
                self.pos += 2
            elif char == "'":
                end = text.index("'", self.pos + 1)
                word, in_word = word + text[self.pos + 1 : end], True
                self.pos = end + 1
            elif char == '"':
                word, in_word = word + self.double_quoted(), True
            elif char == "`":
                self.pos += 1
                word, in_word = word + self.substitution("`"), True
            elif rest.startswith("$(("):
                self.pos += 1
                word, in_word = word + "$" + self.balanced("(", ")"), True
            elif rest.startswith(("$(", "<(", ">(")):
                self.pos += 2
                word, in_word = word + self.substitution(")"), True
            elif rest.startswith("${"):
                self.pos += 1
                word, in_word = word + "$" + self.balanced("{", "}"), True
            elif char in "<>" or rest.startswith("&>"):
                if word.isdigit():  # a file descriptor: 2>/dev/null
                    word, in_word = "", False
                end_word()
                self.pos += len(re.match(r"[<>&|]+-?", rest).group())
                redirect_target = True
            elif char == "(":
                if in_word and word.endswith("="):  # an array: missing=("$x")
                    word += self.balanced("(", ")")
                elif rest.startswith("()") and in_word and not words:  # a function: record() {
                    self.functions.add(word)
                    word, in_word = "", False
                    self.pos += 2
                elif rest.startswith("((") and not words and not in_word:  # ((i++))
                    self.balanced("(", ")")
                else:  # a subshell
                    end_command()
                    self.pos += 1
                    self.scan(")")
            elif char in ";|&\n)":
                end_command()
                self.pos += 1
            elif char == "#" and not in_word:
                self.pos = text.find("\n", self.pos)
            elif char in " \t":
                end_word()
                self.pos += 1
            else:
                word, in_word = word + char, True
                self.pos += 1
        if closer:
            raise ValueError(f"unterminated {closer!r}")
        end_command()


def command_name(word: str) -> str | None:
    """The external command a command word names; None for a file of this repository."""
    if VENV.match(word) or "/" not in word or word.startswith("/"):
        return word
    return None  # ./scripts/bootstrap, molecule/testbed/testbed.py


def commands_of(words: list[str]) -> list[str]:
    found: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        if word in ("for", "select", "case", "function"):
            break  # the rest is a variable and a word list, or a function's name
        if word in BASH_KEYWORDS or ASSIGNMENT.match(word) or word.startswith("$"):
            i += 1  # $SUDO apt-get: the next word is the command
            continue
        if word == "command" and words[i + 1 : i + 2] in (["-v"], ["-V"]):
            found += [w for w in words[i + 2 :] if not w.startswith("-")]
            break
        if word not in BASH_BUILTINS and (name := command_name(word)):
            found.append(name)
        if word not in WRAPPERS:
            break
        i += 1
        while i < len(words) and (
            words[i].startswith("-") or words[i].isdigit() or ASSIGNMENT.match(words[i])
        ):
            i += 1
    return found


def bash_commands(text: str) -> set[str]:
    scanner = BashScanner(text)
    scanner.scan()
    functions = scanner.functions | {
        words[1] for words in scanner.commands if words[:1] == ["function"] and len(words) > 1
    }
    return {name for words in scanner.commands for name in commands_of(words)} - functions


# --- python -------------------------------------------------------------------------------------


def is_subprocess_call(func: ast.expr) -> bool:
    return (
        isinstance(func, ast.Attribute)
        and func.attr in SUBPROCESS_FUNCTIONS
        and isinstance(func.value, ast.Name)
        and func.value.id == "subprocess"
    )


def local_wrappers(tree: ast.Module) -> set[str]:
    """Functions that pass their first parameter to subprocess: def run(cmd): subprocess.run(cmd)
    (and names imported from subprocess: from subprocess import run)."""
    wrappers = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "subprocess"
        for alias in node.names
        if alias.name in SUBPROCESS_FUNCTIONS
    }
    for function in ast.walk(tree):
        if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef) and function.args.args:
            first = function.args.args[0].arg
            for call in ast.walk(function):
                if (
                    isinstance(call, ast.Call)
                    and is_subprocess_call(call.func)
                    and call.args
                    and isinstance(call.args[0], ast.Name)
                    and call.args[0].id == first
                ):
                    wrappers.add(function.name)
    return wrappers


def string_values(node: ast.expr, tree: ast.Module) -> set[str]:
    """A string constant's value; for a loop variable, the strings of the literal it loops over:
    `for tool in ("a", "b")`."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if not isinstance(node, ast.Name):
        return set()
    return {
        element.value
        for loop in ast.walk(tree)
        if isinstance(loop, ast.For | ast.comprehension)
        and isinstance(loop.target, ast.Name)
        and loop.target.id == node.id
        and isinstance(loop.iter, ast.List | ast.Tuple)
        for element in loop.iter.elts
        if isinstance(element, ast.Constant) and isinstance(element.value, str)
    }


def python_commands(source: str) -> set[str]:
    tree = ast.parse(source)
    wrappers = local_wrappers(tree)
    found: set[str] = set()
    for call in ast.walk(tree):
        if not isinstance(call, ast.Call) or not call.args:
            continue
        func, argv = call.func, call.args[0]
        if is_subprocess_call(func) or (isinstance(func, ast.Name) and func.id in wrappers):
            if isinstance(argv, ast.List | ast.Tuple) and argv.elts:
                first = argv.elts[0]  # sys.executable and other names: not a command
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    found.add(first.value)
        elif (
            isinstance(func, ast.Attribute)
            and func.attr == "which"
            and isinstance(func.value, ast.Name)
            and func.value.id == "shutil"
        ):
            found |= string_values(argv, tree)
    return found


# --- the repository -----------------------------------------------------------------------------


def source_files() -> list[Path]:
    candidates = [*(ROOT / "scripts").iterdir(), *(ROOT / ".ci").iterdir()]
    candidates += (ROOT / "molecule" / "testbed").rglob("*.py")
    return sorted(path for path in candidates if path.is_file() and language(path))


def language(path: Path) -> str | None:
    if path.suffix == ".py":
        return "python"
    first = path.read_text(errors="replace").partition("\n")[0]
    if not first.startswith("#!"):
        return None
    if "python" in first:
        return "python"
    return "bash" if re.search(r"\b(ba)?sh\b", first) else None


def called_commands(path: Path) -> set[str]:
    text = path.read_text()
    return python_commands(text) if language(path) == "python" else bash_commands(text)


@dataclass(frozen=True)
class Declared:
    source: str  # "debian" or "pypi"
    package: str
    commands: tuple[str, ...]


def declared_packages() -> list[Declared]:
    declared = []
    for number, line in enumerate(PACKAGES_TXT.read_text().splitlines(), 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        if fields[0] not in ("debian", "pypi") or len(fields) < 2:
            raise ValueError(f"scripts/packages.txt:{number}: expected 'debian|pypi PACKAGE ...'")
        declared.append(Declared(fields[0], fields[1], tuple(fields[2:])))
    return declared


DECLARED = declared_packages()


def usr_merged(path: str) -> str:
    return re.sub(r"^/(bin|sbin|lib|lib64)(?=/|$)", r"/usr/\1", path)


def dpkg_query(*args: str) -> str:
    return subprocess.run(["dpkg-query", *args], capture_output=True, text=True, check=False).stdout


@functools.cache  # asked for the same few packages a few hundred times per run
def installed(package: str) -> bool:
    return dpkg_query("-W", "-f=${db:Status-Status}", package) == "installed"


@functools.cache
def dpkg_files(package: str) -> frozenset[str]:
    listing = subprocess.run(["dpkg", "-L", package], capture_output=True, text=True, check=True)
    return frozenset(usr_merged(line) for line in listing.stdout.splitlines() if line[:1] == "/")


def provides(files: frozenset[str], command: str) -> bool:
    """Whether files hold command (a path, or a name in a bin directory), directly or as the
    target of an alternative: /usr/sbin/iptables -> /etc/alternatives/iptables -> xtables-nft."""
    paths = [command] if command.startswith("/") else [f"{d}/{command}" for d in BIN_DIRS]
    return any(
        usr_merged(path) in files
        or (os.path.lexists(path) and usr_merged(os.path.realpath(path)) in files)
        for path in paths
    )


@functools.cache
def package_files(package: str) -> frozenset[str]:
    """The files of package and of the installed packages it depends on, transitively: Debian 13
    moved promtool out of prometheus into a package of its own that prometheus depends on (and
    Debian 12 has no promtool package), so `prometheus` provides promtool on both."""
    fields = "\t".join(["${Package}", "${db:Status-Status}", "${Pre-Depends}"])
    depends: dict[str, list[str]] = {}
    for line in dpkg_query("-W", f"-f={fields},${{Depends}}\n").splitlines():
        name, status, pre_and_depends = line.split("\t")
        if status == "installed":
            depends[name] = re.findall(r"(?:^|[,|])\s*([a-z0-9][a-z0-9+.-]*)", pre_and_depends)
    closure, todo = set(), [package]
    while todo:
        name = todo.pop()
        if name not in closure and name in depends:
            closure.add(name)
            todo += depends[name]
    return frozenset().union(*(dpkg_files(name) for name in closure))


@functools.cache
def base_files() -> frozenset[str]:
    packages: dict[str, list[str]] = {}
    roots = set(BASE_PACKAGES)
    fields = "\t".join(
        ["${Package}", "${db:Status-Status}", "${Essential}", "${Priority}", "${Pre-Depends}"]
    )
    for line in dpkg_query("-W", f"-f={fields},${{Depends}}\n").splitlines():
        name, status, essential, priority, depends = line.split("\t")
        if status == "installed":
            packages[name] = re.findall(r"(?:^|[,|])\s*([a-z0-9][a-z0-9+.-]*)", depends)
            if essential == "yes" or priority == "required":
                roots.add(name)
    closure, todo = set(), [name for name in roots if name in packages]
    while todo:
        name = todo.pop()
        if name not in closure:
            closure.add(name)
            todo += [dep for dep in packages[name] if dep in packages]
    return frozenset().union(*(dpkg_files(name) for name in closure))


@functools.cache
def pypi_scripts(distribution: str) -> frozenset[str] | None:
    """The commands a distribution installs (console scripts, or binaries like ruff's)."""
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    scripts = {ep.name for ep in dist.entry_points if ep.group == "console_scripts"}
    scripts |= {Path(f).name for f in dist.files or () if Path(f).parent.name == "bin"}
    return frozenset(scripts)


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pyproject_distributions() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = project.get("dependencies", [])
    requirements += project.get("optional-dependencies", {}).get("test", [])
    return {normalized(re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", r).group()) for r in requirements}


def problem(command: str) -> str | None:
    """Why command is not provided, or None when the base image or a declared package has it."""
    venv = VENV.match(command)
    name = venv.group("name") if venv else command
    if command in BASH_BUILTINS or (venv and name in VENV_CORE):
        return None
    if not venv and provides(base_files(), command):
        return None
    for declared in DECLARED:
        debian = declared.source == "debian" and not venv and installed(declared.package)
        if debian and provides(package_files(declared.package), command):
            return None
        if declared.source == "pypi" and name in (pypi_scripts(declared.package) or ()):
            return None
    for declared in DECLARED:
        if name in declared.commands and not (
            installed(declared.package)
            if declared.source == "debian"
            else pypi_scripts(declared.package)
        ):
            return (
                f"calls '{command}' from {declared.package}, which is not installed here: "
                "run scripts/bootstrap (and the tests from .venv)"
            )
    return f"calls '{command}' which no package in scripts/packages.txt provides"


# --- tests --------------------------------------------------------------------------------------

BASH_SNIPPET = r"""
set -e  # rm in a comment
SUDO=sudo
[ "$(id -u)" -eq 0 ] || SUDO=""
$SUDO apt-get install -y -qq pkg >/dev/null 2>&1
if podman run --rm x | grep -q ok; then echo "$(dirname "$0")/.."; fi
command -v debootstrap >/dev/null || { echo "no debootstrap" >&2; exit 1; }
cat <<TXT
  curl inside a heredoc
TXT
python3 -c 'import os
os.system("rm -rf /")'
.venv/bin/ruff check . && ./scripts/local arg
for unit in a b; do systemctl stop "$unit" 2>/dev/null || true; done
n=$((n + 1)) arr=(not a command) && missing+=("$n")
mapfile -t found < <(find . -name x \
  -print | xargs -n1 basename | sort)
record() { echo "$1"; }
record done
floor=$(python3 - <<'PY'
import os; os.system("rm")
PY
)
( . .cache/venv-floor/bin/activate; .cache/venv-floor/bin/pip install x ) || rc=$?
"""

PYTHON_SNIPPET = """
import shutil, subprocess, sys
def _run(cmd, **kwargs):
    return subprocess.run(cmd, check=True, **kwargs)
_run(["debootstrap", "--variant=minbase", "bookworm"])
subprocess.Popen(["tar", "-c", "."])
subprocess.run([sys.executable, "-m", "http.server"])
subprocess.check_output(("dpkg-deb", "-f", "x.deb"))
print(["not-a-command"])
missing = [tool for tool in ("podman", "newuidmap") if shutil.which(tool) is None]
shutil.which("gpgconf")
"""


def test_bash_extractor() -> None:
    assert bash_commands("$SUDO apt-get install -y x\npodman run --rm y\n") == {"apt-get", "podman"}
    assert bash_commands(BASH_SNIPPET) == {
        "id",
        "apt-get",
        "podman",
        "grep",
        "dirname",
        "debootstrap",
        "cat",
        "python3",
        ".venv/bin/ruff",
        "systemctl",
        "find",
        "xargs",
        "basename",
        "sort",
        ".cache/venv-floor/bin/pip",
    }


def test_python_extractor() -> None:
    assert python_commands(PYTHON_SNIPPET) == {
        "debootstrap",
        "tar",
        "dpkg-deb",
        "podman",
        "newuidmap",
        "gpgconf",
    }


def test_extraction_finds_what_the_repository_calls() -> None:
    found = set().union(*(called_commands(path) for path in source_files()))
    expected = {"podman", "debootstrap", "ssh-keygen", "ssh", "iptables", "newuidmap", "runc"}
    expected |= {"apt-get", "dpkg-deb", "gpg", "gpgconf", "awk", "dpkg-query", "systemctl"}
    expected |= {"ansible-playbook", "ansible-inventory", "ansible-lint", "molecule", "pytest"}
    expected |= {"ruff", ".venv/bin/python"}
    assert expected <= found, f"extraction missed {sorted(expected - found)}"


def test_every_called_command_is_provided() -> None:
    problems = [
        f"{path.relative_to(ROOT)}: {why}"
        for path in source_files()
        for command in sorted(called_commands(path))
        if (why := problem(command))
    ]
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


@pytest.mark.parametrize(
    "declared",
    [d for d in DECLARED if d.source == "debian"],
    ids=lambda d: d.package,
)
def test_declared_debian_package_provides_its_commands(declared: Declared) -> None:
    if not installed(declared.package):
        pytest.fail(
            f"scripts/packages.txt: {declared.package} is not installed here:"
            " run scripts/bootstrap",
            pytrace=False,
        )
    wrong = [c for c in declared.commands if not provides(package_files(declared.package), c)]
    if wrong:
        pytest.fail(
            f"scripts/packages.txt: {declared.package} does not provide {', '.join(wrong)}"
            f" (dpkg -S finds the package that does)",
            pytrace=False,
        )


@pytest.mark.parametrize(
    "declared",
    [d for d in DECLARED if d.source == "pypi"],
    ids=lambda d: d.package,
)
def test_declared_pypi_distribution_provides_its_commands(declared: Declared) -> None:
    if normalized(declared.package) not in pyproject_distributions():
        pytest.fail(
            f"scripts/packages.txt: {declared.package} is in neither pyproject.toml's dependencies"
            " nor its test extra",
            pytrace=False,
        )
    scripts = pypi_scripts(declared.package)
    if scripts is None:
        pytest.fail(
            f"scripts/packages.txt: {declared.package} is not installed here: run scripts/bootstrap"
            " and the tests from .venv",
            pytrace=False,
        )
    wrong = [c for c in declared.commands if c not in scripts]
    if wrong:
        pytest.fail(
            f"scripts/packages.txt: {declared.package} does not provide {', '.join(wrong)}",
            pytrace=False,
        )


@pytest.mark.parametrize("suite", BUILD_SUITES)
def test_declared_debian_packages_exist_in_both_build_suites(suite: str) -> None:
    names = [d.package for d in DECLARED if d.source == "debian"]
    try:
        missing = debian_suite.missing(names, suite)
    except SystemExit as error:  # debian_suite's one-line errors: apt could not read the index
        pytest.fail(
            f"cannot read Debian {suite}'s index: {error} (needs apt access to a Debian mirror)",
            pytrace=False,
        )
    if missing:
        pytest.fail(
            f"scripts/packages.txt: {', '.join(missing)} not in Debian {suite}'s index"
            " (main, amd64): scripts/bootstrap fails there",
            pytrace=False,
        )


def test_suite_check_finds_a_name_only_one_suite_has() -> None:
    """The check itself: python3.11-venv is bookworm's only; awk is a virtual name only."""
    assert debian_suite.missing(["python3.11-venv", "python3-venv"], "bookworm") == []
    names = ["python3.11-venv", "python3-venv", "awk"]
    assert debian_suite.missing(names, "trixie") == ["python3.11-venv", "awk"]
