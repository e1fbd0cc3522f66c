"""Names (E01xx): unknown kinds, options, choices, settings, loop options, mlp and norm kinds."""

from tests.validate.helpers import at, codes, one


def test_unknown_layer_suggests_kinds_aliases_and_lets():
    d = one("dim = 64\nlet sparse = dsa\nloop T=2 < sparce >", "E0101")
    assert d.message == "unknown layer `sparce`" and at(d) == (3, 12, 18)
    assert d.help == "a layer with a similar name exists: `sparse`"
    d = one("dim = 64\nwindw", "E0101")
    assert "`window`" in d.help


def test_unknown_layer_without_close_names_lists_them_all():
    d = one("dim = 64\nqwertyuiop", "E0101")
    assert d.help.startswith("the valid layers are `full`, `swa`")


def test_channel_mixer_used_as_a_layer_gets_a_note():
    d = one("dim = 64\nswiglu", "E0101")
    assert "mlp=swiglu" in d.notes[0]


def test_unknown_option_candidates_are_that_kinds_options():
    d = one("dim = 64\nfull(gat=sdpa)", "E0102")
    assert d.help == "an option of `full` with a similar name exists: `gate`"
    d = one("dim = 64\nswiglu_user = 1\nmlp = swiglu(hiden=64)\ngdn", "E0102")
    assert "`hidden`" in d.help


def test_unknown_option_on_a_let_use_checks_the_bound_kind():
    d = one("dim = 64\nlet s = dsa\ns(topkk=4)", "E0102")
    assert d.message == "`s` has no option `topkk`" and "`topk`" in d.help


def test_loop_option_on_a_block_says_where_it_goes():
    d = one("dim = 64\nloop T=2 < gdn(final_norm=true) >", "E0102")
    assert "loop option" in d.notes[0]


def test_unknown_enum_value():
    d = one("dim = 64\nlinear(feature_map=elu)", "E0103")
    assert "`elu1`" in d.help and d.message == "unknown value `elu` for `feature_map` of `linear`"
    assert codes("dim = 64\nfull(gate=none)") == []
    assert codes('dim = 64\nfull(gate="sdpa")') == ["E0201"]  # choices are names, not strings
    assert "E0103" in codes("dim = 64\ndtype = none\ngdn")


def test_unknown_setting_including_overrides():
    d = one("dim = 64\nmaxlen = 4k\ngdn", "E0104")
    assert "`max_len`" in d.help
    d = one("dim = 64\ngdn", "E0104", vocb="1000")
    assert d.span.file == "--set vocb"


def test_layer_name_used_as_a_setting():
    d = one("dim = 64\ngdn = 3\ngdn", "E0104")
    assert "parentheses" in d.notes[0]


def test_unknown_loop_option():
    d = one("dim = 64\nloop T=2, inject_=add < gdn >", "E0105")
    assert "`inject`" in d.help
    assert "E0105" in codes("dim = 64\nloop T=2, T=3 < gdn >")


def test_mlp_and_norm_kinds():
    assert one("dim = 64\ngdn(mlp=gleu)", "E0106").help.endswith("`gelu`")
    assert codes("dim = 64\nmlp = none\ngdn(mlp=gelu(hidden=128))") == []
    assert one("dim = 64\nloop T=2, norm=sandwhich < gdn >", "E0107").help.endswith("`sandwich`")
    assert codes("dim = 64\nloop T=2, norm=sandwich < gdn(norm=layernorm(1e-5)) >") == []
