"""The canonical printer: its rules one by one, and golden outputs for whole files."""

from pathlib import Path

import pytest

from lt2dsl.grammar.parse import parse
from lt2dsl.ir import nodes as n
from lt2dsl.ir.printer import WIDTH, floating, print_program, size, value
from lt2dsl.ir.settings import MODEL_SETTINGS
from tests.golden import check_golden

ROOT = Path(__file__).resolve().parents[2]
INPUTS = sorted((ROOT / "tests" / "grammar" / "inputs").glob("*.lt2"))
GOLDEN = Path(__file__).with_name("printer")


def fmt(text: str) -> str:
    prog, diags = parse(text)
    assert diags == []
    return print_program(prog)


@pytest.mark.parametrize("path", INPUTS, ids=[p.name for p in INPUTS])
def test_golden(path):
    check_golden(GOLDEN / path.name, fmt(path.read_text()))


def test_section_order_settings_lets_body():
    assert fmt("gdn\nlet a = dsa\ndim = 3\na") == "dim = 3\n\nlet a = dsa\n\ngdn\na\n"


def test_model_form_indents_and_keeps_header():
    text = "# head\nmodel m { dim = 3; gdn }"
    assert fmt(text) == "# head\nmodel m {\n  dim = 3\n\n  gdn\n}\n"


@pytest.mark.parametrize(
    ("x", "text"),
    [
        (32768, "32k"),
        (2**20, "1M"),
        (3 * 2**20, "3M"),
        (1024, "1k"),
        (5632, "5632"),
        (0, "0"),
        (-2048, "-2k"),
        (1000, "1000"),
    ],
)
def test_sizes(x, text):
    assert size(x) == text


def test_suffix_only_for_size_options():
    max_len = next(o for o in MODEL_SETTINGS if o.name == "max_len")
    vocab = next(o for o in MODEL_SETTINGS if o.name == "vocab")
    assert value(n.Int(value=32768), max_len) == "32k"
    assert value(n.Int(value=32768), vocab) == "32768"
    assert value(n.Int(value=32768)) == "32768"
    assert fmt("dim = 2048\nmax_len = 32768\ndsa(topk=4096, index_dim=1024)") == (
        "dim = 2048\nmax_len = 32k\n\ndsa(topk=4k, index_dim=1024)\n"
    )


@pytest.mark.parametrize(
    ("x", "text"),
    [(1e-6, "1e-6"), (1e16, "1e16"), (0.5, "0.5"), (2.0, "2.0"), (-1.5e-300, "-1.5e-300"), (1e5, "100000.0")],
)
def test_floats_read_back_exactly(x, text):
    assert floating(x) == text
    assert float(text) == x


def test_fractions_and_strings():
    assert fmt('gla(expand_k=8/3, name="a \\"q\\" \\\\ b")') == 'gla(expand_k=8/3, name="a \\"q\\" \\\\ b")\n'


def test_call_values_keep_parentheses_blocks_do_not():
    assert fmt("mlp = swiglu()\ngdn()") == "mlp = swiglu()\n\ngdn\n"
    assert fmt("mlp = swiglu\ngdn") == "mlp = swiglu\n\ngdn\n"


def test_short_loops_stay_on_one_line():
    assert fmt("loop T=4 <\n gdn\n dsa\n>") == "loop T=4 < gdn; dsa >\n"


def test_long_loops_get_one_block_per_line():
    blocks = "; ".join(["gdn(heads=16, expand_v=2)"] * 4)
    out = fmt(f"loop T=4 < {blocks} >")
    assert out.splitlines() == ["loop T=4 <", *["  gdn(heads=16, expand_v=2)"] * 4, ">"]
    assert all(len(line) <= WIDTH for line in out.splitlines())


def test_a_stack_holding_a_stack_is_multiline():
    assert fmt("loop T=2 < repeat 3 < gdn > >") == "loop T=2 <\n  repeat 3 < gdn >\n>\n"


def test_comments_inside_force_multiline():
    assert fmt("loop T=2 < gdn  # why\n dsa >") == "loop T=2 <\n  gdn  # why\n  dsa\n>\n"


def test_times_and_par():
    assert fmt("gdn*2\npar( gdn ,swa(128) )") == "gdn * 2\npar(gdn, swa(128))\n"


def test_empty_program_and_empty_loop():
    assert fmt("") == ""
    assert fmt("loop T=2 <\n>") == "loop T=2 < >\n"
