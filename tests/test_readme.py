"""README.md's examples run exactly as printed.

Every ```python block of the README is either run or marked, on the line
before it, `<!-- readme-test: not run (why) -->` (signature listings). A block
that imports something starts a program; a block without imports continues
the program before it (it uses its names, as the README's text does). A
program that calls jax_ar.setup runs through the launcher in 2 processes on
CPU devices; any other runs in one process.

The error example (the block that uses jax_ar.checked) also runs with a
peer that skips its call: process 1 sleeps past a 2 s deadline instead, and
process 0 must catch jax_ar.JaxArTimeoutError where the README says. The
Errors section's types are compared with what the failures raise here
(tests/workers/comm_faults.py error_types).
"""
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

from jax_ar.tools.launch import launch

from harness import ON_GPU, format_failure, run_ranks, runs_on

pytestmark = runs_on("cpu", reason="the README's programs run as printed on CPU devices of 2 "
                                 "processes; the same calls run on the GPU in the other files")

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
_BLOCK = re.compile(r"(?:<!-- readme-test: (.*?) -->\n)?```python\n(.*?)```", re.S)


def blocks():
    """[(line number, marker or None, code)] of the README's python blocks."""
    text = README.read_text()
    return [(text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2))
            for m in _BLOCK.finditer(text)]


def programs():
    """[[(line, code), ...]]: the blocks that run, grouped into programs."""
    result = []
    for line, marker, code in blocks():
        if marker is not None:
            assert marker.startswith("not run ("), \
                f"README.md:{line}: unknown marker {marker!r} (known: 'not run (why)')"
            continue
        if re.search(r"^(import|from) ", code, re.M) or not result:
            result.append([])
        result[-1].append((line, code))
    return result


def is_multi_process(program) -> bool:
    return any("jax_ar.setup(" in code for _, code in program)


def source(program, skipping=None) -> str:
    """The program's code; the block holding `skipping` runs on process 0
    only, while process 1 sleeps past the deadline instead (a peer that
    skips the call)."""
    parts = []
    for line, code in program:
        if skipping and skipping in code:
            code = ("import time as _time\n"
                    "if jax.process_index() == 0:\n" + textwrap.indent(code, "    ") +
                    "else:\n    _time.sleep(3.5)  # the call is skipped; the deadline is 2 s\n")
        parts.append(f"# README.md:{line}\n{code}")
    return "\n".join(parts)


def run_program(program, tmp_path, skipping=None, env=None):
    path = tmp_path / "readme_program.py"
    path.write_text(source(program, skipping))
    if is_multi_process(program):
        return launch(str(path), num_processes=2, platform="gpu" if ON_GPU else "cpu",
                      timeout_s=300, stream=False, env=env, log_dir=str(tmp_path / "logs"))
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return None


def test_every_block_runs_or_says_why_not():
    runnable = sum(len(p) for p in programs())
    assert runnable >= 3, f"only {runnable} python blocks of README.md run"
    assert len(blocks()) - runnable <= 3, "more README blocks are marked 'not run' than before"


PROGRAMS = programs()


@pytest.mark.parametrize("index", range(len(PROGRAMS)),
                         ids=[f"README.md:{p[0][0]}" for p in PROGRAMS])
def test_program_runs_as_printed(index, tmp_path):
    program = PROGRAMS[index]
    result = run_program(program, tmp_path)
    if result is not None:
        assert result.ok, format_failure(result)
        if "all_reduce == psum" in source(program):
            for rank in range(2):
                assert f"process {rank}: all_reduce == psum" in result.logs[rank], \
                    format_failure(result)
                assert "served by jax_ar" in result.logs[rank], format_failure(result)
        # A normal run ends quietly: jax.distributed is shut down in order, so
        # neither gRPC nor absl has anything to say, even in the raw output.
        for rank in range(2):
            raw = (tmp_path / "logs" / f"rank{rank}.log").read_text()
            for noise in ("WatchTasksAsync", "Check failure", "Connection refused"):
                assert noise not in raw, raw


def test_use_example_on_one_device_says_jax_ar_did_not_run(tmp_path):
    """`python tp.py` (one process, one device): psum serves the call, and
    the program says so and how to run it instead, rather than only
    "all_reduce == psum"."""
    use = PROGRAMS[0][:1]
    assert "all_reduce == psum" in use[0][1], "README's first program is no longer Use's"
    path = tmp_path / "tp.py"
    path.write_text(source(use))
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path, env=dict(env, JAX_PLATFORMS="cpu"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "process 0: all_reduce == psum, (8, 32), served by psum, not by jax_ar" in proc.stdout
    assert "python -m jax_ar launch -n 2 tp.py" in proc.stdout, proc.stdout


def test_error_example_catches_a_peer_that_skips_its_call(tmp_path):
    program = next(p for p in PROGRAMS if any("jax_ar.checked(" in code for _, code in p))
    env = dict(os.environ, JAX_AR_TIMEOUT_S="2")
    result = run_program(program, tmp_path, skipping="jax_ar.checked(", env=env)
    # Process 0 caught the failure where the README catches it ...
    assert result.returncodes[0] == 0, format_failure(result)
    assert "process 0: a peer is missing: jax_ar:" in result.logs[0], format_failure(result)
    assert "timed out" in result.logs[0], format_failure(result)
    # ... and process 1, which skipped the call, fails at its end, naming it.
    failed = dict(result.failures)
    assert list(failed) == [1] and "skipped" in failed[1], format_failure(result)


def _errors_section() -> str:
    text = README.read_text()
    start = text.index("\n## Errors\n")
    return text[start:text.index("\n## ", start + 1)]


def _types_in(cell: str) -> set:
    """The exception types a README table cell names (backticked)."""
    return set(re.findall(r"`((?:jax\.errors\.|jax_ar\.)?[A-Za-z_]*Error)`", cell))


def _table_row(section: str, first_cell_start: str) -> list:
    rows = [line for line in section.splitlines()
            if line.startswith(f"| {first_cell_start}")]
    assert len(rows) == 1, f"README's Errors section: one row starting {first_cell_start!r}, " \
                           f"found {rows}"
    return [cell.strip() for cell in rows[0].strip("|").split("|")]


def test_errors_section_names_what_failed_calls_raise():
    """Each run-time failure (a peer that disagrees, never comes, closes; a
    call on a failed communicator), called through a jitted function's
    first call and again: the types seen are exactly those README's Errors
    table names for a failed call, and each way of calling raises what
    README's second table says."""
    result = run_ranks("comm_faults.py", "error_types", processes=2, timeout_s=300,
                       env={"FAULT_DEADLINE_S": "2"})
    seen = {}  # path -> {type}
    for log in result.logs:
        for kind, path, status, name in re.findall(r"error-type (\S+) (\S+) (\S+) (\S+)", log):
            seen.setdefault(path, set()).add(
                name[len("builtins."):] if name.startswith("builtins.") else name)
    assert set(seen) == {"first", "again"}, format_failure(result)
    section = _errors_section()
    named = _types_in(_table_row(section, "a call:")[1])
    raised = set().union(*seen.values())
    assert named == raised, (f"README's Errors table says a failed call raises {sorted(named)}; "
                             f"seen {seen}")
    at_trace = {name for log in result.logs
                for name in re.findall(r"error-at-trace failed_earlier (\S+)", log)}
    said = _types_in(_table_row(section, "a call traced on a communicator")[1])
    assert at_trace == {"jax_ar.errors.JaxArError"} and said == {"jax_ar.JaxArError"}, \
        (at_trace, said)
    for path, first_cell in (("first", "a jitted function's first call"),
                             ("again", "a jitted function called again")):
        said = _types_in(_table_row(section, first_cell)[1])
        assert said == seen[path], (f"README says {first_cell!r} raises {sorted(said)}; "
                                    f"seen {sorted(seen[path])}")
