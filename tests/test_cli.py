"""The `lt2dsl` command line, in-process: exit codes, output streams, every command."""

import subprocess
import sys
from pathlib import Path

import pytest

from lt2dsl import cli
from lt2dsl.cli import main

CLEAN = "model m {\n  dim = 256\n  loop T=2 < gdn; dsa(topk=64) >\n}\n"
WARN = "dim = 256\nlet unused = gdn\ngdn\n"
BAD = "dim = 256\nloop T=2 < gdn; dsaa >\n"


@pytest.fixture
def files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name, text in {"clean.lt2": CLEAN, "warn.lt2": WARN, "bad.lt2": BAD}.items():
        (tmp_path / name).write_text(text)
    return tmp_path


def run(capsys, *argv):
    status = main(list(argv))
    out = capsys.readouterr()
    return status, out.out, out.err


def test_check_exit_codes(files, capsys):
    assert run(capsys, "check", "clean.lt2") == (0, "", "")
    status, out, err = run(capsys, "check", "warn.lt2")
    assert status == 0 and "warning[W0301]" in err and err.rstrip().endswith("warning: 1 warning emitted")
    status, out, err = run(capsys, "check", "bad.lt2", "clean.lt2")
    assert status == 1 and out == ""
    assert err.startswith("error[E0101]: unknown layer `dsaa`\n --> bad.lt2:2:17\n")
    assert "error: aborting due to 1 previous error" in err


def test_usage_errors_exit_2(files, capsys):
    status, _, err = run(capsys, "check", "missing.lt2")
    assert status == 2 and "error: cannot read `missing.lt2`: no such file" in err
    status, _, err = run(capsys, "check", "missing.lt2", "bad.lt2")
    assert status == 2 and "E0101" in err  # the other files are still checked
    assert run(capsys, "check")[0] == 2
    assert run(capsys, "frobnicate")[0] == 2
    assert run(capsys, "check", "clean.lt2", "--bogus")[0] == 2
    status, _, err = run(capsys, "check", "clean.lt2", "--set", "dim")
    assert status == 2 and "KEY=VALUE" in err
    assert run(capsys, "--help")[0] == 0


def test_check_with_overrides(files, capsys):
    (files / "bare.lt2").write_text("loop T=2 < gdn >\n")
    assert run(capsys, "check", "bare.lt2")[0] == 1
    assert run(capsys, "check", "bare.lt2", "--set", "dim=64", "--set", "loop.T=8") == (0, "", "")


def test_plain_text_when_not_a_terminal(files, capsys):
    _, _, err = run(capsys, "check", "bad.lt2")
    assert "\x1b[" not in err


def test_fmt_rewrites_and_checks(files, capsys):
    messy = files / "messy.lt2"
    messy.write_text("dim=256;loop T=2<gdn;gdn>\n")
    status, _, err = run(capsys, "fmt", "--check", "messy.lt2")
    assert status == 1 and "would reformat messy.lt2" in err
    assert messy.read_text() == "dim=256;loop T=2<gdn;gdn>\n"
    assert run(capsys, "fmt", "messy.lt2")[0] == 0
    assert messy.read_text() == "dim = 256\n\nloop T=2 < gdn; gdn >\n"
    assert run(capsys, "fmt", "--check", "messy.lt2") == (0, "", "")


def test_fmt_stdin_and_syntax_errors(files, capsys, monkeypatch):
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO("gdn;dsa"))
    assert run(capsys, "fmt", "-") == (0, "gdn\ndsa\n", "")
    (files / "broken.lt2").write_text("loop T=2 < gdn\n")
    status, _, err = run(capsys, "fmt", "broken.lt2")
    assert status == 1 and "E0005" in err and (files / "broken.lt2").read_text() == "loop T=2 < gdn\n"


def test_graph(files, capsys):
    status, out, _ = run(capsys, "graph", "clean.lt2")
    assert status == 0 and out.splitlines()[0].startswith("embed") and "↺" in out
    status, out, _ = run(capsys, "graph", "clean.lt2", "--dot")
    assert status == 0 and out.startswith('digraph "m"')
    status, out, err = run(capsys, "graph", "bad.lt2")
    assert status == 1 and out == "" and "E0101" in err


def test_explain(capsys):
    status, out, _ = run(capsys, "explain", "e0101")
    assert status == 0 and out.startswith("E0101 (error, names): Unknown layer kind")
    assert "Use instead:" in out
    status, out, _ = run(capsys, "explain", "E0005")
    assert status == 0 and "syntax" in out
    status, out, _ = run(capsys, "explain", "E1001")
    assert status == 0 and out.startswith("E1001 (error, import): Checkpoint feature `.lt2` cannot express")
    status, out, _ = run(capsys, "explain", "e1002")
    assert status == 0 and out.startswith("E1002 (error, import): Checkpoint folder or weights disagree")
    status, _, err = run(capsys, "explain", "E0102x")
    assert status == 2 and "did you mean `E0102`" in err


def test_compile_summary(files, capsys):
    status, out, err = run(capsys, "compile", "clean.lt2")
    assert status == 0 and err == ""
    assert out == "m: ok — 2 blocks (4 applied), 1 loop, dim 256, heads 2×128, mixers dsa, gdn\n"
    assert run(capsys, "compile", "bad.lt2")[0] == 1


def test_compile_estimate(files, capsys):
    status, out, err = run(capsys, "compile", "clean.lt2", "--estimate", "--seq", "1k", "--json")
    assert status == 0, err
    assert '"parameters' in out or "params" in out


def test_optional_parts_missing_are_usage_errors(files, capsys, monkeypatch):
    def missing(module, flag):
        raise cli.UsageError(f"`{flag}` is not available: `{module}` is not part of this build")

    monkeypatch.setattr(cli, "_optional", missing)
    status, _, err = run(capsys, "compile", "clean.lt2", "--emit", "fx")
    assert status == 2 and "`--emit fx` is not available" in err


def test_internal_error_is_reported_not_raised(files, capsys, monkeypatch):
    import lt2dsl.frontend

    def boom(*a, **k):
        raise RuntimeError("kaboom")

    monkeypatch.setattr(lt2dsl.frontend, "load", boom)
    status, _, err = run(capsys, "check", "clean.lt2")
    assert status == 3
    assert err.startswith("error[E9999]: internal compiler error: RuntimeError: kaboom")
    assert "Traceback" not in err
    monkeypatch.setenv("LT2_DEBUG", "1")
    status, _, err = run(capsys, "check", "clean.lt2")
    assert status == 3 and "Traceback" in err


def test_python_m_and_console_script(files):
    r = subprocess.run([sys.executable, "-m", "lt2dsl", "check", "bad.lt2"], capture_output=True, text=True)
    assert r.returncode == 1 and "E0101" in r.stderr
    script = Path(sys.executable).with_name("lt2dsl")
    if script.exists():
        r = subprocess.run([str(script), "check", "clean.lt2"], capture_output=True, text=True)
        assert r.returncode == 0 and r.stderr == ""


def test_front_end_commands_do_not_import_torch(files):
    commands = [
        ["check", "clean.lt2"],
        ["graph", "clean.lt2"],
        ["fmt", "--check", "clean.lt2"],
        ["explain", "E0101"],
        ["compile", "clean.lt2"],
    ]
    code = (
        "import sys, io, contextlib\nfrom lt2dsl.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
        f"    for argv in {commands!r}:\n"
        "        main(argv)\n"
        "assert 'torch' not in sys.modules and 'triton' not in sys.modules, 'torch imported'\n"
        "assert 'lt2dsl.tasks' not in sys.modules and 'lt2dsl.analysis' not in sys.modules\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
