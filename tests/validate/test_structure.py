"""Structure (E03xx, W03xx): stacks, bindings, settings and argument lists."""

from lt2dsl.frontend import load
from tests.validate.helpers import at, codes, one


def test_empty_stacks_and_empty_model():
    assert codes("dim = 64\ngdn\nloop T=2 < >\nrepeat 2 < >") == ["E0301", "E0301"]
    assert codes("model m { dim = 64 }") == ["E0302"]
    assert codes("dim = 64") == ["E0302"]


def test_let_before_definition_points_at_both():
    d = one("dim = 64\ngdn; x\nlet x = dsa", "E0303")
    assert at(d) == (2, 6, 7) and d.labels[0].span.line == 3


def test_lets_may_use_earlier_lets_and_override_options():
    text = "dim = 64\nlet a = dsa(topk=64)\nlet b = loop T=2 < a(topk=32); a >\nb"
    assert codes(text) == ["W0302"] or codes(text) == []
    loaded = load(text + "\n")
    assert loaded.model is not None


def test_shadowing_and_duplicates():
    assert codes("dim = 64\nlet swa = gdn\nswa") == ["E0304"]
    assert codes("dim = 64\ndim = 32\ngdn") == ["E0305"]
    assert codes("dim = 64\ngdn(heads=2, heads=4)") == ["E0306"]
    assert codes("dim = 64\nswa(64, window=32)") == ["E0306"]
    assert codes("dim = 64\nlet a = gdn\nlet a = dsa\na") == ["E0311"]


def test_recursion_direct_and_through_a_chain():
    d = one("dim = 64\nlet a = repeat 2 < b >\nlet b = loop T=2 < c >\nlet c = a\na", "E0307")
    assert d.notes == ("the cycle: a → b → c → a",)
    assert one("dim = 64\nlet a = repeat 2 < gdn; a >\na", "E0307").notes == ("the cycle: a → a",)


def test_missing_dim_unless_overridden():
    assert codes("gdn") == ["E0308"]
    assert codes("gdn", dim="256") == []


def test_positional_values():
    assert codes("dim = 64\nswa(128)\ndsa(64)\nlinear(relu)\nmlp = swiglu(256)\ngdn") == []
    assert codes("dim = 64\nswa(128, 64)") == ["E0309"]
    assert codes("dim = 64\ngdn(4)") == ["E0310"]
    assert codes("dim = 64\nloop T=2, exit=gate(0.9) < gdn >") == ["E0310"]


def test_par_members():
    assert codes("dim = 64\nlet fast = gdn(heads=2)\npar(fast, swa(32))") == []
    assert codes("dim = 64\npar(gdn)") == ["E0312"]
    assert codes("dim = 64\nlet p = repeat 2 < gdn >\npar(p, gdn)") == ["E0312"]


def test_options_on_a_let_bound_to_a_stack():
    assert codes("dim = 64\nlet b = repeat 2 < gdn >\nb(heads=2)") == ["E0313"]


def test_unused_let_counts_uses_in_other_lets():
    assert codes("dim = 64\nlet a = gdn\nlet b = repeat 2 < a >\nb") == []
    d = one("dim = 64\nlet a = gdn\ngdn", "W0301")
    assert d.severity == "warning" and at(d) == (2, 5, 6)


def test_nested_loops_written_or_through_a_let():
    assert codes("dim = 64\nloop T=2 < loop T=2 < gdn > >") == ["W0302"]
    assert codes("dim = 64\nlet l = loop T=2 < gdn >\nloop T=3 < l >") == ["W0302"]
    assert codes("dim = 64\nlet l = loop T=2 < gdn >\nrepeat 3 < l >") == []
