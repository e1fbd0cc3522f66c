"""Command-line flags checked against the model: a usage error (exit 2) or a diagnostic at the
flag, never a silent no-op. `--version`, `--vs`, `--exit-profile`, `--set`."""

import json

import pytest

from lt2dsl.cli import version
from tests.test_cli import run

GATED = "dim = 64\nloop T=4, exit=gate < gdn >\n"
LOOPED = "dim = 64\nloop T=4 < gdn >\n"
FLAT = "dim = 64\ngdn\n"


@pytest.fixture
def files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name, text in {"gated.lt2": GATED, "looped.lt2": LOOPED, "flat.lt2": FLAT}.items():
        (tmp_path / name).write_text(text)
    return tmp_path


def test_version(capsys):
    status, out, _ = run(capsys, "--version")
    assert status == 0 and out.strip() == f"lt2dsl {version()}" and version()[0].isdigit()


def test_a_missing_vs_file_is_a_usage_error_like_a_missing_input(files, capsys):
    assert run(capsys, "compile", "missing.lt2", "--estimate")[0] == 2
    status, out, err = run(capsys, "compile", "flat.lt2", "--estimate", "--vs", "missing.lt2")
    assert (status, out) == (2, "") and "error: cannot read --vs `missing.lt2`: no such file" in err
    assert run(capsys, "compile", "flat.lt2", "--estimate", "--vs", "looped.lt2")[0] == 0


@pytest.mark.parametrize(
    ("profile", "message"),
    [
        ("0,0,0,0,0,0,0,0,0,1", "gives 10 probabilities but the gated loop has T=4"),
        ("-0.5,1", r"probabilities in [0, 1]"),
        ("0.5,1.5", r"probabilities in [0, 1]"),
        ("0,0", "at least one positive"),
        ("nan", r"probabilities in [0, 1]"),
        ("a,b", "expects numbers"),
    ],
)
def test_bad_exit_profiles(files, capsys, profile, message):
    status, out, err = run(capsys, "compile", "gated.lt2", "--estimate", f"--exit-profile={profile}")
    assert (status, out) == (2, "") and message in err, err


def test_an_exit_profile_needs_a_gated_loop(files, capsys):
    status, _, err = run(capsys, "compile", "looped.lt2", "--estimate", "--exit-profile", "0.5,0.5")
    assert status == 2 and "needs a loop with an exit gate" in err


def test_a_valid_exit_profile_never_costs_more_than_every_iteration(files, capsys):
    status, out, _ = run(capsys, "compile", "gated.lt2", "--estimate", "--json", "--exit-profile", "0,0,0,1")
    report = json.loads(out)["flops_per_token"]
    assert status == 0 and report["decode_expected"] == pytest.approx(report["decode"])
    _, out, _ = run(capsys, "compile", "gated.lt2", "--estimate", "--json", "--exit-profile", "1")
    report = json.loads(out)["flops_per_token"]
    assert report["decode_expected"] < report["decode"]


def test_loop_override_without_a_loop(files, capsys):
    status, _, err = run(capsys, "check", "flat.lt2", "--set", "loop.T=3")
    assert status == 1 and "error[E0904]: `loop.T` is set but the model has no loop" in err
    assert "1 | loop.T=3\n  | ^^^^^^ no loop to set" in err
    assert run(capsys, "check", "looped.lt2", "--set", "loop.T=3") == (0, "", "")


def test_an_unknown_override_points_at_its_key(files, capsys):
    status, _, err = run(capsys, "check", "flat.lt2", "--set", "foo=1")
    assert status == 1 and " --> --set foo:1:1\n" in err and "1 | foo=1\n  | ^^^ not a model setting" in err


@pytest.mark.parametrize("where", ["file", "--set"])
def test_a_near_miss_setting_of_the_wrong_type_suggests_the_right_one(files, capsys, where):
    if where == "file":
        (files / "head.lt2").write_text("dim = 64\nhead = 4\ngdn\n")
        status, _, err = run(capsys, "check", "head.lt2")
    else:
        status, _, err = run(capsys, "check", "flat.lt2", "--set", "head=4")
    assert status == 1 and "help: did you mean `heads`?" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["check", "a\x1b[2Jb.lt2"],
        ["check", "flat.lt2", "--bogus\x07"],
        ["check", "flat.lt2", "--set", "d\x01m=4"],
        ["compile", "flat.lt2", "--estimate", "--vs", "m\x00.lt2"],
    ],
    ids=["file", "flag", "set-key", "vs"],
)
def test_control_characters_in_arguments_are_not_echoed_raw(files, capsys, argv):
    status, _, err = run(capsys, *argv)
    assert status in (1, 2) and err and not any(c in err for c in "\x00\x01\x07\x1b"), err
