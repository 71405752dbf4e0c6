"""The code blocks of README.md and docs/*.md, and the means to run them (used by tests/test_doc_blocks.py).

- `collect()` finds every fenced block (``` or ~~~, any info string: python, bash, sh, console, none) of README.md and
  of each docs/*.md present at call time, with its file, its index in that file and its text.
- `Python`, `Shell`, `Existing` and `Exempt` say how one block is covered; `coverage()` pairs each block found with
  the one entry of a table whose (file, snippet) names it, and reports blocks no entry names, entries that name no
  block (stale) and blocks named twice.
- `run_python` executes a document's Python blocks in one namespace, recording the value of every top-level
  expression statement (what a reader would see printed) by its line in the document.
- `run_shell` runs a shell block's command lines: `python X.py ...` lines (consecutive ones batched into one
  interpreter, each run as `python X.py` runs it, via runpy), `accelerate ...` and `make ...` in their own processes.

Run as a script (`python tests/doc_blocks.py JSON`), this file is that batch runner: JSON is a list of argv lists
(`["python", "scripts/train.py", ...]`), run in order in the current directory; it exits with the first failing
command's status.
"""

from __future__ import annotations

import ast
import json
import os
import re
import runpy
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^( {0,3})(`{3,}|~{3,})(.*)$")
ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
MARK = "### doc command"


@dataclass(frozen=True)
class Block:
    file: str  # relative to the repository root: "README.md", "docs/hub.md"
    index: int  # 0-based, in the order of the file
    line: int  # 1-based line of the opening fence
    lang: str  # the info string's first word ("" when none)
    code: str

    def __str__(self):
        first = next((s for s in self.code.splitlines() if s.strip()), "")
        return f"{self.file} block {self.index} (line {self.line}, {self.lang or 'no language'}): {first[:70]}"


def documents(root: Path = ROOT) -> list[Path]:
    """README.md and every docs/*.md, as they are now (a document added later is found by the next call)."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def blocks_of(path: Path, root: Path = ROOT) -> list[Block]:
    """The fenced code blocks of one Markdown file (CommonMark fences; an unclosed fence runs to the end)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening or (opening.group(2)[0] == "`" and "`" in opening.group(3)):
            i += 1
            continue
        indent, fence, info = len(opening.group(1)), opening.group(2), opening.group(3).strip()
        closing = re.compile(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        j = i + 1
        while j < len(lines) and not closing.match(lines[j]):
            j += 1
        body = [line[min(indent, len(line) - len(line.lstrip(" "))):] for line in lines[i + 1:j]]
        found.append(Block(str(path.relative_to(root)), len(found), i + 1, info.split()[0] if info else "",
                           "\n".join(body) + "\n"))
        i = j + 1
    return found


def collect(root: Path = ROOT) -> list[Block]:
    return [block for path in documents(root) for block in blocks_of(path, root)]


# ---- how a block is covered


@dataclass
class Python:
    """Executed as Python, in document order, in the document's one namespace. `subs`: (text, replacement) pairs
    applied to the block first, each of which must occur; a replacement's {name} fields are filled from the
    document's run context (e.g. a commit sha known only at run time)."""
    subs: list = field(default_factory=list)
    why: str = ""


@dataclass
class Shell:
    """Each command line run (exit status 0 asserted), after the substitutions `subs` (each must occur; {name}
    fields filled from the run context); `before`: {snippet of a command: [set-up argv lists]} run just before that
    command, for what the docs take from elsewhere. A line that cannot run here is exempted by the table of exempt
    commands (see `run_shell`'s `skip`)."""
    subs: list = field(default_factory=list)
    before: dict = field(default_factory=dict)
    why: str = ""


@dataclass
class Existing:
    """Executed by another test, named; `runs()` gives the block texts that test executes (checked)."""
    test: str
    runs: object = None


@dataclass
class Exempt:
    """Not run: why not."""
    reason: str


@dataclass
class Coverage:
    pairs: dict  # Block -> (key, how)
    uncovered: list  # blocks no entry names
    stale: list  # entries that name no block
    ambiguous: list  # (block, keys) for blocks several entries name, (key, blocks) for entries naming several


def coverage(blocks: list[Block], table: dict) -> Coverage:
    """Pair blocks with the entries of `table` ({(file, snippet): how}); an entry names the blocks of its file whose
    text contains its snippet."""
    named = {key: [b for b in blocks if b.file == key[0] and key[1] in b.code] for key in table}
    pairs, ambiguous = {}, []
    for key, hits in named.items():
        if len(hits) > 1:
            ambiguous.append((key, [str(b) for b in hits]))
    for block in blocks:
        keys = [key for key, hits in named.items() if block in hits]
        if len(keys) > 1:
            ambiguous.append((str(block), keys))
        elif keys:
            pairs[block] = (keys[0], table[keys[0]])
    return Coverage(pairs, [b for b in blocks if b not in pairs], [k for k, hits in named.items() if not hits],
                    ambiguous)


def substitute(text: str, subs, context: dict, where: str) -> str:
    for old, new in subs:
        assert old in text, f"{where}: substitution {old!r} matches nothing (stale: update the table)"
        text = text.replace(old, new.format_map(context))
    return text


# ---- Python blocks


def line_of(block: Block, snippet: str) -> int:
    """The line, in the document, of the one line of `block` that contains `snippet`."""
    lines = [i for i, text in enumerate(block.code.splitlines(), start=1) if snippet in text]
    assert len(lines) == 1, f"{block}: {snippet!r} is on {len(lines)} lines"
    return block.line + lines[0]


def run_python(block: Block, code: str, namespace: dict, values: dict) -> None:
    """exec `code` (the block after its substitutions) in `namespace`, its line numbers those of the document (for
    tracebacks); the value of each top-level expression statement goes to values[(file, line in the document)]."""
    tree = ast.parse(code, filename=block.file)
    ast.increment_lineno(tree, block.line)  # the fence is line block.line, the block's first line the one after
    for i, node in enumerate(tree.body):
        if isinstance(node, ast.Expr):
            store = ast.parse(f"__doc_values__[({block.file!r}, {node.lineno})] = 0").body[0]
            store.value = node.value
            tree.body[i] = ast.copy_location(store, node)
    namespace["__doc_values__"] = values
    exec(compile(ast.fix_missing_locations(tree), block.file, "exec"), namespace)  # noqa: S102  (the docs' own code)


# ---- shell blocks


def shell_commands(text: str, lang: str = "bash") -> list[tuple[str, list[str]]]:
    """[(command line as written, argv)] of a shell block: continuation lines joined, comments and blank lines
    dropped; in a `console` block only the lines after a `$ ` prompt (the others are what they print)."""
    if lang == "console":
        joined = re.sub(r"\\\n(> )?", " ", text).splitlines()
        text = "\n".join(line[2:] for line in joined if line.startswith("$ "))
    commands = []
    for line in re.sub(r"\\\n", " ", text).splitlines():
        argv = shlex.split(line, comments=True)
        if argv:
            commands.append((" ".join(line.split()), argv))
    return commands


def _batchable(argv: list[str]) -> bool:
    return argv[0] == "python" and len(argv) > 1 and argv[1].endswith(".py")


def named_command(commands, snippet, where) -> str:
    hits = [line for line, _ in commands if snippet in line]
    assert len(hits) == 1, f"{where}: snippet {snippet!r} names {len(hits)} commands, not one: {hits}"
    return hits[0]


def run_shell(block: Block, code: str, how: Shell, cwd: Path, env: dict, skip=(), timeout: float = 600) -> list:
    """Run the block's commands (after substitution) in `cwd`, but those containing a snippet of `skip`; ->
    [(command, stdout)] per process started. Consecutive `python X.py` commands without environment assignments
    share one interpreter (this file's runner, `python X.py` semantics via runpy) to pay the imports once; every other
    command is its own process."""
    commands = shell_commands(code, block.lang)
    for snippet in [*skip, *how.before]:
        named_command(commands, snippet, str(block))
    steps = []  # (line, env assignments, argv)
    for line, argv in commands:
        if any(snippet in line for snippet in skip):
            continue
        for snippet, setups in how.before.items():
            if snippet in line:
                steps += [(f"set-up: {' '.join(s)}", {}, list(s)) for s in setups]
        assigned = {}
        while ENV_ASSIGNMENT.match(argv[0]):
            name, _, value = argv.pop(0).partition("=")
            assigned[name] = value
        steps.append((line, assigned, argv))
    outputs, batch = [], []

    def flush():
        if batch:
            lines = [line for line, _ in batch]
            out = _run([sys.executable, str(Path(__file__).resolve()), json.dumps([a for _, a in batch])],
                       "\n".join(lines), cwd, env, timeout)
            outputs.append(("\n".join(lines), out))
            batch.clear()

    for line, assigned, argv in steps:
        if not assigned and _batchable(argv):
            batch.append((line, argv))
            continue
        flush()
        program = {"python": [sys.executable], "accelerate": [str(Path(sys.executable).parent / "accelerate")],
                   "make": ["make"]}.get(argv[0])
        assert program is not None, f"{block}: no rule to run {argv[0]!r} ({line}); add one to tests/doc_blocks.py"
        outputs.append((line, _run(program + argv[1:], line, cwd, {**env, **assigned}, timeout)))
    flush()
    return outputs


def _run(argv, what, cwd, env, timeout) -> str:
    result = subprocess.run(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, (f"exit status {result.returncode} from\n{what}\n--- stdout\n{result.stdout[-3000:]}"
                                    f"\n--- stderr\n{result.stderr[-6000:]}")
    return result.stdout


def _runner(argvs: list[list[str]]) -> int:
    """Run each `python X.py args` as the interpreter would run that file as its main script."""
    for i, argv in enumerate(argvs):
        print(f"{MARK} {i}: {shlex.join(argv)}", file=sys.stderr, flush=True)
        script = argv[1]
        sys.argv = argv[1:]
        sys.path[0] = str(Path(script).resolve().parent)
        if "accelerate.state" in sys.modules:  # a fresh process's Accelerate state (each run makes an Accelerator)
            from accelerate.state import AcceleratorState

            AcceleratorState._reset_state(reset_partial_state=True)
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as stop:
            if stop.code not in (None, 0):
                print(f"{MARK} {i} exited with {stop.code}", file=sys.stderr, flush=True)
                return stop.code if isinstance(stop.code, int) else 1
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(_runner(json.loads(sys.argv[1])))
