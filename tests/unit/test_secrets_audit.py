"""No secret reaches `--check --diff`, a task's output or a failure message.

A static audit of every task and handler of every role. A task *carries a secret* when
a value it writes, sends or prints can hold a variable named like a secret (see
SECRET_NAME): through its module arguments, its loop and loop label, its name, the
template file it renders, and, transitively, through the role's defaults and vars, task
and block `vars:` and `set_fact`. A reference whose value only feeds a boolean or a
count (`x | length > 0`, `x is defined`, a comparison, `when:`) carries nothing.

The rule, applied to every such task: `no_log: true` (literally). `diff: false` is not
enough: it hides the diff, but a validator's output (`validate:`) or a module's result
still prints the content. Exceptions, each checked here too:
- `assert` shows only the failing condition's text and `fail_msg`; its messages must
  not carry a secret, and it must not use no_log (that would hide the message as well);
- include/import tasks carry nothing themselves (their tasks are audited);
- no_log hides a failure too: a task under no_log with a `validate:` must register its
  result with `failed_when: false`, and the task right after it must fail with an
  explanation, every value of the secret variables masked (the filter
  gpufleet_masked_refusal's arguments are what it masks, never what it prints).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import jinja2
import jinja2.nodes as nodes
import pytest
import yaml
from jinja2.visitor import NodeVisitor
from render_role import ROLES, template_value, trust_as_template

# Variables (or attributes) whose value is, or may hold, a secret.
SECRET_NAME = re.compile(
    r"password|passwd|secret|token|credential|api_?key|private_key|_tls_key$|access_key"
    r"|basic_auth|remote_write|job_settings|datasources_extra"
    r"|^alertmanager_receivers$|^alertmanager_global$|^alertmanager_idle_owner_email$"
)
# Named like a secret, but public: a length, the published defaults preflight refuses.
NOT_SECRET = re.compile(r"_length$|^_\w+_known_default_")
# Attributes that are never secret, whatever holds them (a receiver's name).
PUBLIC_ATTRS = {"name"}
# Filters whose result says nothing about the value's content (gpufleet_ini_problems
# names the settings that grafana.ini cannot hold, never their values).
COUNTING_FILTERS = {"length", "count", "bool", "gpufleet_ini_problems"}
# The explaining tasks' filter: it prints its subject, and masks what its arguments hold.
MASKING_FILTER = "gpufleet_masked_refusal"
CONDITION_KEYS = {"when", "changed_when", "failed_when", "until"}
TASK_KEYWORDS = {
    "name", "when", "loop", "loop_control", "register", "notify", "listen", "tags", "vars",
    "no_log", "diff", "check_mode", "changed_when", "failed_when", "until", "retries", "delay",
    "become", "become_user", "become_method", "delegate_to", "delegate_facts", "run_once",
    "ignore_errors", "ignore_unreachable", "environment", "args", "block", "rescue", "always",
    "any_errors_fatal", "throttle", "timeout", "module_defaults", "collections", "debugger",
    "connection", "remote_user", "async", "poll",
}  # fmt: skip
INCLUDES = {
    "ansible.builtin.include_tasks", "ansible.builtin.import_tasks",
    "ansible.builtin.include_role", "ansible.builtin.import_role", "ansible.builtin.meta",
}  # fmt: skip
ASSERT = "ansible.builtin.assert"
ENV = jinja2.Environment(extensions=["jinja2.ext.do", "jinja2.ext.loopcontrols"])


# --------------------------------------------------------------- Jinja references


class _Refs(NodeVisitor):
    """(name, attribute or None) pairs whose value can reach the output."""

    def __init__(self) -> None:
        self.found: set[tuple[str, str | None]] = set()
        self.local: set[str] = set()

    def visit_Name(self, node: nodes.Name) -> None:
        if node.ctx == "load":
            self.found.add((node.name, None))
        else:
            self.local.add(node.name)

    def visit_Getattr(self, node: nodes.Getattr) -> None:
        self._attribute(node.node, node.attr)

    def visit_Getitem(self, node: nodes.Getitem) -> None:
        if isinstance(node.arg, nodes.Const) and isinstance(node.arg.value, str):
            self._attribute(node.node, node.arg.value)
        else:
            self.generic_visit(node)

    def _attribute(self, base: nodes.Node, attr: str) -> None:
        if isinstance(base, nodes.Name) and base.ctx == "load":
            self.found.add((base.name, attr))
        else:
            self.visit(base)
            if SECRET_NAME.search(attr):
                self.found.add((attr, None))

    def visit_Filter(self, node: nodes.Filter) -> None:
        if node.name in COUNTING_FILTERS:
            return
        if node.name == MASKING_FILTER:
            self.visit(node.node)
            return
        if node.name in ("replace", "regex_replace") and node.args:
            # The pattern never reaches the output; the subject and replacement do.
            self.visit(node.node)
            for arg in node.args[1:]:
                self.visit(arg)
            return
        if node.name == "map":
            attr = [kw.value for kw in node.kwargs if kw.key == "attribute"]
            if attr and isinstance(attr[0], nodes.Const) and attr[0].value in PUBLIC_ATTRS:
                return
        self.generic_visit(node)

    def visit_Test(self, node: nodes.Test) -> None:
        return

    def visit_Compare(self, node: nodes.Compare) -> None:
        return

    def visit_Not(self, node: nodes.Not) -> None:
        return

    def visit_If(self, node: nodes.If) -> None:
        for child in (*node.body, *node.elif_, *node.else_):
            self.visit(child)

    def visit_CondExpr(self, node: nodes.CondExpr) -> None:
        self.visit(node.expr1)
        if node.expr2 is not None:
            self.visit(node.expr2)


def jinja_refs(text: str) -> set[tuple[str, str | None]]:
    """What a template (or a task argument) may output, as (name, attribute) pairs."""
    if "{{" not in text and "{%" not in text:
        return set()
    visitor = _Refs()
    with warnings.catch_warnings():  # '\s' in a regex literal: Jinja warns, Ansible too
        warnings.simplefilter("ignore", DeprecationWarning)
        tree = ENV.parse(text)
    visitor.visit(tree)
    return {(name, attr) for name, attr in visitor.found if name not in visitor.local}


def value_refs(value) -> set[tuple[str, str | None]]:
    """References in every string of a (nested) YAML value."""
    if isinstance(value, str):
        return jinja_refs(value)
    if isinstance(value, dict):
        return set().union(*(value_refs(v) for v in value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*(value_refs(v) for v in value)) if value else set()
    return set()


# --------------------------------------------------------------- roles and tasks


@dataclass
class Task:
    role: str
    file: str
    data: dict
    no_log: bool  # literally true here or on an enclosing block
    scope: dict = field(default_factory=dict)  # the vars of its enclosing blocks

    @property
    def name(self) -> str:
        return self.data.get("name", "?")

    @property
    def module(self) -> str:
        (module,) = [key for key in self.data if key not in TASK_KEYWORDS] or ["?"]
        return module


def _walk(
    role: str, file: str, items: list, no_log: bool, scope: dict | None = None
) -> Iterator[Task]:
    for item in items or []:
        own = item.get("no_log") is True
        if "block" in item:
            inner = {**(scope or {}), **(item.get("vars") or {})}
            for part in ("block", "rescue", "always"):
                yield from _walk(role, file, item.get(part), no_log or own, inner)
        else:
            yield Task(role, file, item, no_log or own, dict(scope or {}))


@dataclass
class Role:
    path: Path
    tasks: list[Task]
    definitions: dict[str, list]  # variable -> every value it may be given

    @property
    def name(self) -> str:
        return self.path.name

    def template_text(self, name: str) -> str:
        return (self.path / "templates" / name).read_text()


def load_role(path: Path) -> Role:
    tasks: list[Task] = []
    for part in ("tasks", "handlers"):
        for file in sorted((path / part).glob("*.yml")):
            data = yaml.safe_load(file.read_text()) or []
            tasks.extend(_walk(path.name, f"{part}/{file.name}", data, False))
    definitions: dict[str, list] = {}
    for part in ("defaults", "vars"):
        file = path / part / "main.yml"
        if file.exists():
            for name, value in (yaml.safe_load(file.read_text()) or {}).items():
                definitions.setdefault(name, []).append(value)

    def blocks(items: list) -> Iterator[dict]:
        for item in items or []:
            yield item
            for part in ("block", "rescue", "always"):
                yield from blocks(item.get(part))

    for part in ("tasks", "handlers"):
        for file in sorted((path / part).glob("*.yml")):
            for item in blocks(yaml.safe_load(file.read_text()) or []):
                sources = [item.get("vars") or {}]
                for module in ("ansible.builtin.set_fact", "ansible.builtin.include_role"):
                    args = item.get(module) or {}
                    sources.append(args.get("vars", {}) if "include_role" in module else args)
                for source in sources:
                    for name, value in source.items():
                        definitions.setdefault(name, []).append(value)
    return Role(path, tasks, definitions)


ROLE_PATHS = sorted(p for p in ROLES.iterdir() if (p / "tasks" / "main.yml").exists())


def all_roles() -> list[Role]:
    return [load_role(path) for path in ROLE_PATHS]


# --------------------------------------------------------------- the audit


def walk_definitions(
    role: Role,
    refs: Iterable[tuple[str, str | None]],
    follow: Callable[[str, str | None], bool],
) -> None:
    """Visit each (variable, attribute) reference reachable from ``refs`` through the role's
    variable definitions, once; a reference's definitions are followed where ``follow``
    (called once per reference) says so."""
    seen: set[tuple[str, str | None]] = set()
    todo = list(refs)
    while todo:
        name, attr = ref = todo.pop()
        if ref in seen:
            continue
        seen.add(ref)
        if not follow(name, attr):
            continue
        for value in role.definitions.get(name, []):
            if attr is not None and isinstance(value, dict):
                value = value.get(attr)
            todo.extend(value_refs(value))


def secrets_reached(role: Role, refs: set[tuple[str, str | None]]) -> set[str]:
    """The secret-named variables these references can carry, through the role's vars."""
    found: set[str] = set()

    def follow(name: str, attr: str | None) -> bool:
        if attr in PUBLIC_ATTRS or NOT_SECRET.search(name):
            return False
        if SECRET_NAME.search(name) or (attr and SECRET_NAME.search(attr)):
            found.add(name if attr is None else f"{name}.{attr}")
            return False
        return True

    walk_definitions(role, refs, follow)
    return found


def strings_reached(role: Role, refs: set[tuple[str, str | None]]) -> set[str]:
    """Every plain string the referenced variables' definitions hold (transitively)."""
    found: set[str] = set()
    seen: set[tuple[str, str | None]] = set()
    todo = list(refs)

    def collect(value) -> None:
        if isinstance(value, str):
            todo.extend(jinja_refs(value))
            found.update(re.findall(r"'([^']+)'", value) if "{{" in value else [value])
        elif isinstance(value, dict):
            for item in value.values():
                collect(item)
        elif isinstance(value, list):
            for item in value:
                collect(item)

    while todo:
        name, attr = todo.pop()
        if (name, attr) in seen:
            continue
        seen.add((name, attr))
        for value in role.definitions.get(name, []):
            collect(value)
    return found


def templates_of(role: Role, task: Task) -> list[str]:
    """The template files a template task may render."""
    src = str((task.data.get(task.module) or {}).get("src", ""))
    available = sorted(p.name for p in (role.path / "templates").glob("*"))
    if "{{" not in src:
        return [src] if src in available else []
    constants = set(re.findall(r"'([^']+\.j2)'", src))
    constants |= {s for s in strings_reached(role, jinja_refs(src)) if s.endswith(".j2")}
    if constants & set(available):
        return sorted(constants & set(available))
    pattern = re.escape(src)
    pattern = re.sub(r"\\\{\\\{.*?\\\}\\\}", ".*", pattern)
    return [name for name in available if re.fullmatch(pattern, name)]


def output_refs(role: Role, task: Task) -> set[tuple[str, str | None]]:
    """What the task writes, sends or prints."""
    module = task.module
    args = task.data.get(module)
    refs = value_refs(task.data.get("name", ""))
    if module == ASSERT:
        return refs | value_refs(
            {k: v for k, v in (args or {}).items() if k in ("fail_msg", "success_msg", "msg")}
        )
    if module in INCLUDES:
        return set()
    refs |= value_refs(args) | value_refs(task.data.get("args"))
    for key, value in task.data.items():
        if key == "loop" or key.startswith("with_"):
            refs |= value_refs(value)
    refs |= value_refs((task.data.get("loop_control") or {}).get("label", ""))
    if module == "ansible.builtin.template":
        for name in templates_of(role, task):
            refs |= jinja_refs(role.template_text(name))
    return refs


def secret_tasks(role: Role) -> dict[str, set[str]]:
    """'file: task name' -> the secrets it carries, for every task that carries one."""
    out = {}
    for task in role.tasks:
        if task.module == ASSERT:
            continue
        reached = secrets_reached(role, output_refs(role, task))
        if reached:
            out[f"{task.file}: {task.name}"] = reached
    return out


@pytest.fixture(scope="module")
def roles() -> list[Role]:
    return all_roles()


def test_every_task_that_carries_a_secret_is_under_no_log(roles):
    missing = []
    for role in roles:
        for task in role.tasks:
            if task.module in (ASSERT, *INCLUDES) or task.no_log:
                continue
            reached = secrets_reached(role, output_refs(role, task))
            if reached:
                missing.append(f"{role.name}/{task.file}: {task.name!r} carries {sorted(reached)}")
    assert not missing, "needs no_log: true:\n" + "\n".join(missing)


# Tasks the audit must see as carrying a secret: if one drops out, SECRET_NAME or the
# reference tracking has gone blind, and the test above proves nothing.
KNOWN = {
    ("prometheus", "tasks/instance.yml: Write the configuration of {{ _instance.name }}"),
    ("alertmanager", "tasks/configure.yml: Write the Alertmanager configuration"),
    ("loki", "tasks/configure.yml: Write the Loki configuration"),
    ("grafana", "tasks/configure.yml: Write grafana.ini"),
    (
        "grafana",
        "tasks/provision_org.yml: Write the datasources provisioning file "
        "({{ __grafana_target.name }})",
    ),
    ("grafana", "tasks/api.yml: Reset the admin password to the one in the inventory"),
    ("grafana", "handlers/main.yml: Reload Grafana datasources"),
    # The exporters', the Slurm exporter's, Prometheus' and Alertmanager's web
    # configuration and TLS key.
    ("_common", "tasks/web_config.yml: Install the TLS key"),
    ("_common", "tasks/web_config.yml: Write the web configuration (TLS and basic auth)"),
}


def test_the_audit_sees_every_known_secret_task(roles):
    seen = {(role.name, task) for role in roles for task in secret_tasks(role)}
    assert sorted(KNOWN - seen) == []


def test_the_audit_leaves_tasks_without_secrets_alone(roles):
    flagged = {(role.name, task) for role in roles for task in secret_tasks(role)}
    for role, task in [
        ("prometheus", "tasks/instance.yml: Write the unit of {{ _instance.name }}"),
        ("prometheus", "tasks/instance.yml: Write the scrape targets of {{ _instance.name }}"),
        ("node_exporter", "tasks/configure.yml: Write the systemd unit"),
        ("_common", "tasks/web_config.yml: Install the TLS certificate"),
        ("_common", "tasks/web_config.yml: Install the TLS client CA"),
        ("_common", "tasks/web_config.yml: Remove TLS files no longer wanted"),
        (
            "grafana",
            "tasks/provision_org.yml: Write the dashboard provider ({{ __grafana_target.name }})",
        ),
        ("alloy", "tasks/configure.yml: Write config.alloy"),
    ]:
        assert (role, task) not in flagged, task


def fake_role(tmp_path: Path, tasks: str, templates: dict[str, str], defaults: str = "") -> Role:
    path = tmp_path / "fake"
    (path / "tasks").mkdir(parents=True)
    (path / "templates").mkdir()
    (path / "defaults").mkdir()
    (path / "tasks" / "main.yml").write_text(tasks)
    (path / "defaults" / "main.yml").write_text(defaults or "---\n")
    for name, text in templates.items():
        (path / "templates" / name).write_text(text)
    return load_role(path)


def test_the_audit_catches_the_next_such_task(tmp_path):
    role = fake_role(
        tmp_path,
        """
- name: Write the exporter's config
  ansible.builtin.template: {src: exporter.yml.j2, dest: /etc/exporter.yml}
- name: Write it through a variable
  ansible.builtin.copy: {content: "{{ _fake_rendered }}", dest: /etc/other.yml}
- name: Count users
  ansible.builtin.copy: {content: "{{ fake_basic_auth_users | length }}", dest: /etc/n}
- name: Write it under no_log
  ansible.builtin.copy: {content: "{{ fake_remote_write | to_json }}", dest: /etc/rw}
  no_log: true
- name: A block under no_log
  no_log: true
  block:
    - name: Inner
      ansible.builtin.copy: {content: "{{ fake_api_key }}", dest: /etc/key}
- name: Write a unit
  ansible.builtin.template: {src: fake.service.j2, dest: /etc/systemd/system/fake.service}
""",
        {
            "exporter.yml.j2": "{% for u, p in fake_settings.users | dictsort %}{{ p }}{% endfor %}",  # noqa: E501
            "fake.service.j2": "{% if fake_remote_write %}ExecStart=/bin/fake{% endif %}",
        },
        "---\nfake_settings: {users: '{{ fake_job_settings }}'}\n"
        "_fake_rendered: '{{ {\"token\": fake_token} | to_nice_yaml }}'\n",
    )
    flagged = secret_tasks(role)
    assert set(flagged) == {
        "tasks/main.yml: Write the exporter's config",
        "tasks/main.yml: Write it through a variable",
        "tasks/main.yml: Write it under no_log",
        "tasks/main.yml: Inner",
    }
    assert flagged["tasks/main.yml: Write it through a variable"] == {"fake_token"}
    unprotected = [
        t.name for t in role.tasks if not t.no_log and secrets_reached(role, output_refs(role, t))
    ]
    assert unprotected == ["Write the exporter's config", "Write it through a variable"]


def test_asserts_print_no_secret_and_keep_their_message(roles):
    for role in roles:
        for task in role.tasks:
            if task.module != ASSERT:
                continue
            assert not secrets_reached(role, output_refs(role, task)), (role.name, task.name)
            # no_log would hide fail_msg as well: the check would fail without a word.
            assert not task.no_log, (role.name, task.name)


# --------------------------------------------------------------- failures stay readable


def validated_secret_tasks(roles) -> list[tuple[Role, Task]]:
    return [
        (role, task)
        for role in roles
        for task in role.tasks
        if task.no_log and "validate" in (task.data.get(task.module) or {})
    ]


def including_role(roles, role: Role, task: Task) -> str:
    """The role whose variables the task sees: its own, or for a task file of an internal
    role (roles/_common/tasks/web_config.yml) the first role that includes that file."""
    if not role.name.startswith("_"):
        return role.name
    piece = Path(task.file).stem
    for other in roles:
        for candidate in other.tasks:
            include = candidate.data.get("ansible.builtin.include_role") or {}
            if include.get("name") == role.name and include.get("tasks_from") == piece:
                return other.name
    raise AssertionError(f"no role includes {role.name}/{task.file}")


def test_a_refused_secret_file_is_explained_with_its_secrets_masked(roles):
    found = validated_secret_tasks(roles)
    assert {role.name for role, _ in found} >= {"prometheus", "alertmanager", "loki"}
    for role, task in found:
        register = task.data.get("register")
        assert register and task.data.get("failed_when") is False, (role.name, task.name)
        position = role.tasks.index(task)
        explain = role.tasks[position + 1].data
        assert explain.get("when") == f"{register}.msg is defined", (role.name, task.name)
        assert "ansible.builtin.fail" in explain and not explain.get("no_log")
        msg = explain["ansible.builtin.fail"]["msg"]
        masking = re.findall(r"\| " + MASKING_FILTER + r"\(\[([^\]]+)\]\)", msg)
        assert len(masking) == 1, (role.name, task.name)
        # The masked variables, as the explanation lists them: give each a secret.
        listed = masking[0]
        secrets = {}
        for index, name in enumerate(v.strip() for v in listed.split(",")):
            secret = f's3cr3t-{index}-"quoted\\path'
            secrets[name] = {"name": "kept", "inner": [{"password": secret}], "url": f"x{index}"}
        failed = {
            "failed": False,
            "msg": "failed to validate",
            "stderr": " | ".join(
                f"{value['inner'][0]['password']} {yaml.safe_dump(value)}"
                for value in secrets.values()
            ),
        }
        # Where the explanation reads the vars of an enclosing block (a _common piece, which
        # reads its including role's variables), as that role sees them.
        seen_by = including_role(roles, role, task)
        scope = {
            k: trust_as_template(v) if isinstance(v, str) else v for k, v in task.scope.items()
        }
        values = {
            **scope,
            "ansible_parent_role_names": [seen_by],
            **secrets,
            register: failed,
            "_instance": {"name": "shard-0"},
        }
        message = template_value(seen_by, trust_as_template(msg), "mon01", values)
        assert "failed to validate" in message
        assert "s3cr3t" not in message, message
        assert "kept" in message, "a name: is no secret and stays readable"
        assert "********" in message
