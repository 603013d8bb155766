"""Ledger predicates: each op, OR of whens, features, versions (pre-releases included), load-time errors, and the
derived fields the shipped ledgers rely on."""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance.cases.case import AttentionCase
from conformance.records import CheckResult, Status
from conformance.ledger.entries import LedgerEntry, load_ledger
from conformance.ledger.fields import FIELDS, case_view


def case(**kw) -> AttentionCase:
    kw.setdefault("requests", ((4, 4),))
    kw.setdefault("num_heads", 2)
    kw.setdefault("num_kv_heads", 2)
    kw.setdefault("head_dim", 64)
    return AttentionCase(**kw)


def entry(tmp_path: Path, body: str, head: str = "") -> LedgerEntry:
    (tmp_path / "kern.toml").write_text(f'[[failure]]\nreason = "r"\n{head}{body}')
    (e,) = load_ledger(tmp_path).entries
    return e


PAGED = dict(kv_layout="NHD", block_size=16)


@pytest.mark.parametrize(
    "when, yes, no",
    [
        ("head_dim = 80", case(head_dim=80), case(head_dim=96)),
        ("head_dim = [80, 96]", case(head_dim=96), case(head_dim=112)),
        ("causal = false", case(), case(causal=True)),
        ('kv_layout = "NHD"\nblock_size = 16', case(**PAGED), case(kv_layout="NHD", block_size=32)),
        ("head_dim = { not = 80 }", case(head_dim=96), case(head_dim=80)),
        ("head_dim = { in = [80, 96] }", case(head_dim=80), case(head_dim=64)),
        ("head_dim = { not_in = [80, 96] }", case(head_dim=64), case(head_dim=80)),
        ("head_dim = { lt = 80 }", case(head_dim=64), case(head_dim=80)),
        ("head_dim = { le = 80 }", case(head_dim=80), case(head_dim=96)),
        ("head_dim = { gt = 80 }", case(head_dim=96), case(head_dim=80)),
        ("head_dim = { ge = 80 }", case(head_dim=80), case(head_dim=64)),
        ("head_dim = { ge = 80, lt = 96 }", case(head_dim=80), case(head_dim=96)),
        ("scale = { set = false }", case(), case(scale=0.1)),
        ("scale = { set = true }", case(scale=0.1), case()),
        ("softcap = 30.0", case(softcap=30.0), case(softcap=50.0)),
        # a None value equals nothing and fails every comparison, but is "not" anything
        ("block_size = { lt = 100 }", case(**PAGED), case()),
        ("block_size = { not = 16 }", case(), case(**PAGED)),
        ('features = ["paged", "causal"]', case(causal=True, **PAGED), case(**PAGED)),
        ('no_features = ["causal", "window"]', case(), case(window=(8, 0))),
        ("window_left = 8\nwindow_right = 0", case(window=(8, 0)), case(window=(8, None))),
        ("window_right = 0", case(causal=True), case()),  # causal puts the right side at 0
        ("dv = 512", case(head_dim_v=512), case()),
        ("rows_without_keys = 2", case(requests=((2, 0), (2, 2))), case(requests=((3, 1),))),
    ],
)
def test_each_condition_form_matches_its_case_and_not_the_other(tmp_path: Path, when, yes, no) -> None:
    e = entry(tmp_path, f"[failure.when]\n{when}\n")
    assert e.matches_case(yes) and not e.matches_case(no)


def test_whens_are_ored_and_conditions_within_one_anded(tmp_path: Path) -> None:
    e = entry(tmp_path, "[[failure.when]]\nhead_dim = 80\ncausal = true\n[[failure.when]]\nhead_dim = 160\n")
    assert e.matches_case(case(head_dim=80, causal=True)) and e.matches_case(case(head_dim=160))
    assert not e.matches_case(case(head_dim=80)) and not e.matches_case(case(head_dim=96, causal=True))
    assert " or " in e.pattern and "head_dim = 160" in e.pattern


def test_a_glob_with_its_reason_and_a_predicate_both_match(tmp_path: Path) -> None:
    e = entry(tmp_path, "[failure.when]\nhead_dim = 80\n", 'pattern = "*_fzodd_*"\nglob_reason = "unmodelled"\n')
    assert e.matches_case(case(head_dim=80)) and e.matches_case(case(batch_name="fzodd"))
    assert not e.matches_case(case())


def record(c: AttentionCase, status: str = "fail", version: str = "1.0.0", backend: str = "kern") -> CheckResult:
    return CheckResult(c.id, backend, "fam", Status(status), c.to_json(), version=version)


@pytest.mark.parametrize(
    "spec, inside, outside",
    [
        (">=4.0.0b36", ["4.0.0b36", "4.0.0", "4.1"], ["4.0.0b30", "3.9"]),
        ("<4.0.0b40", ["4.0.0b36", "3.0"], ["4.0.0b40", "4.0.0"]),
        # PEP 440: "<4.0" excludes 4.0's own pre-releases (other pre-releases count: 3.9.1b2)
        ("<4.0", ["3.9", "3.9.1b2"], ["4.0.0b36", "4.0.0"]),
        (">=2.11,<2.12", ["2.11.0+cu130", "2.11.1"], ["2.12.0", "2.10.0+cu128"]),
        ("==0.24.*", ["0.24.0", "0.24.5"], ["0.25.0", "0.23.9"]),
    ],
)
def test_versions_are_pep440_with_prereleases(tmp_path: Path, spec, inside, outside) -> None:
    e = entry(tmp_path, "[failure.when]\nhead_dim = 80\n", f'versions = "{spec}"\n')
    c = case(head_dim=80)
    for v in inside:
        assert e.explains(record(c, version=v)), v
    for v in outside:
        assert not e.explains(record(c, version=v)), v
    # not a PEP 440 version (older runs wrote 'not installed'): judged on the case alone
    assert e.explains(record(c, version="not installed"))
    assert e.version_side("not installed") == "unknown"


def test_version_side_tells_newer_from_older(tmp_path: Path) -> None:
    e = entry(tmp_path, "[failure.when]\nhead_dim = 80\n", 'versions = ">=2.0,<2.5"\n')
    assert [e.version_side(v) for v in ("2.1", "2.5", "1.9")] == ["in", "after", "before"]
    # pre-releases are versions like any other, on every bound (2.5rc1 is not < 2.5: PEP 440)
    assert [e.version_side(v) for v in ("2.1rc1", "2.5rc1", "2.6rc1", "1.9rc1")] == ["in", "after", "after", "before"]
    e = entry(tmp_path, "[failure.when]\nhead_dim = 80\n", 'versions = ">=2.0,<=2.4"\n')
    assert [e.version_side(v) for v in ("2.4", "2.4.1", "1.0")] == ["in", "after", "before"]
    e = entry(tmp_path, "[failure.when]\nhead_dim = 80\n", 'versions = "==0.24.*"\n')
    assert [e.version_side(v) for v in ("0.24.1", "0.25.0", "0.23.0")] == ["in", "after", "before"]
    # the compatible-release and arbitrary-equality operators bound from above too (mutmut survivors)
    e = entry(tmp_path, "[failure.when]\nhead_dim = 80\n", 'versions = "~=2.8"\n')
    assert [e.version_side(v) for v in ("2.9", "3.0", "2.7")] == ["in", "after", "before"]
    e = entry(tmp_path, "[failure.when]\nhead_dim = 80\n", 'versions = "===2.8.3"\n')
    # 2.8.3.0 equals 2.8.3 as a version but not as the string === asks for: not newer than the bound
    assert [e.version_side(v) for v in ("2.8.3", "2.8.4", "2.8.2", "2.8.3.0")] == ["in", "after", "before", "before"]


@pytest.mark.parametrize(
    "text, message",
    [
        ("[failure.when]\nhead_dimm = 80\n", "failure\\[0\\].when: unknown field 'head_dimm'"),
        ("[failure.when]\nhead_dim = '80'\n", "head_dim: expected a int value"),
        ("[failure.when]\ncausal = 1\n", "causal: expected a bool value"),
        ("[failure.when]\ndtype = { lt = 'bf16' }\n", "'lt' needs a numeric field"),
        ("[failure.when]\nhead_dim = { about = 80 }\n", "unknown op 'about'"),
        ("[failure.when]\nhead_dim = []\n", "empty list"),
        ("[failure.when]\nhead_dim = { in = 80 }\n", "'in' takes a non-empty list"),
        ("[failure.when]\nscale = { set = 1 }\n", "'set' takes true or false"),
        ("[failure.when]\nfeatures = ['pagd']\n", "unknown features \\['pagd'\\]"),
        ("[failure.when]\nfeatures = ['paged']\nno_features = ['paged']\n", "both required and excluded"),
        ("[failure.when]\n", "empty 'when' table"),
        ("when = []\n", "failure\\[0\\]: 'when' is an empty list"),  # no table to OR: mutmut survivor
        ("[[failure.when]]\nhead_dim = 8\n[[failure.when]]\nhead_dimm = 8\n", "when\\[1\\]: unknown field"),
        ('versions = "~> 2"\n[failure.when]\nhead_dim = 8\n', "not a PEP 440 specifier set"),
        ("versions = 2\n[failure.when]\nhead_dim = 8\n", "'versions' must be a PEP 440 specifier string"),
        ('pattern = "*_x_*"\n', "needs glob_reason"),
        ('glob_reason = "why"\n[failure.when]\nhead_dim = 8\n', "'glob_reason' without 'pattern'"),
        ("statuses = ['fail']\n", "needs 'when'"),
    ],
)
def test_malformed_predicates_name_the_file_entry_and_field(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "kern.toml").write_text(f'[[failure]]\nreason = "r"\n{text}')
    with pytest.raises(ValueError, match=message) as info:
        load_ledger(tmp_path)
    assert "kern.toml" in str(info.value) and "failure[0]" in str(info.value)


def test_every_field_evaluates_on_a_paged_padded_case() -> None:
    c = AttentionCase(
        requests=((5, 0), (40, 20), (3, 9)),
        num_heads=4,
        num_kv_heads=2,
        head_dim=96,
        head_dim_v=8,
        v_padded=True,
        kv_layout="NHD",
        block_size=16,
        window=(8, None),
    )
    view = case_view(c)
    for name, f in FIELDS.items():
        value = view.value(name)
        assert (
            value is None
            and f.nullable
            or isinstance(value, {"int": int, "float": float, "bool": bool, "str": str}[f.kind])
        ), (name, value)


def test_derived_fields_of_the_kernels() -> None:
    """The values the shipped ledgers test, on cases whose answer is known from the adapters and investigations."""
    v = case_view
    # FA4 sm_90: d80 without a mask has tile 144; page 144 is TMA, page 16 not; causal makes the tile 128
    paged80 = case(head_dim=80, kv_layout="NHD", block_size=16)
    assert v(paged80).value("fa4_sm90_tile_n") == 144 and v(paged80).value("fa4_sm90_paged_loader") == "non_tma"
    assert v(paged80.replace(block_size=144)).value("fa4_sm90_paged_loader") == "tma"
    assert v(paged80.replace(causal=True)).value("fa4_sm90_tile_n") == 128
    assert v(case(head_dim=80)).value("fa4_sm90_paged_loader") == "contiguous"
    # a padded-V case counts with its padded V: d80/dv8 is called as d80/dv80 (tile 144)
    assert v(paged80.replace(head_dim_v=8, v_padded=True)).value("fa4_sm90_tile_n") == 144
    # FA2's window normalisation (issue 895): (32, 32) on (40, 20) is misread, on (20, 40) it is not
    assert v(case(requests=((40, 20),), window=(32, 32))).value("fa2_window_misread")
    assert not v(case(requests=((20, 40),), window=(32, 32))).value("fa2_window_misread")
    assert v(case(requests=((3, 1),), window=(0, None))).value("fa2_varlen_window_misread")  # fz895l
    assert v(case(requests=((3, 1),), window=(None, 1))).value("fa2_varlen_window_misread")  # fz895r
    assert not v(case(requests=((3, 1),))).value("fa2_window_misread")  # no window, nothing to misread
    # FA3's head-dim templates (round_up_headdim), of the padded call
    assert [v(case(head_dim=d)).value("fa3_hdim_template") for d in (64, 80, 128, 136, 200)] == [64, 96, 128, 192, 256]
    # keyless query tiles: a (5, 0) request is one; 13 keyless rows atop a (270, 257) request are not a 64-row tile
    assert v(case(requests=((5, 0), (3, 3)))).value("keyless_query_tile") == 128
    assert v(case(requests=((270, 257),), causal=True)).value("keyless_query_tile") == 8
    assert v(case(requests=((270, 257),), causal=True)).value("rows_without_keys") == 13
    assert v(case(requests=((65, 1),), causal=True)).value("keyless_query_tile") == 64
    # the FA3 fork's query tile (attnfast.decisions.fa3_vllm_fwd_tile) with a packed GQA group of 8: at d128 (128 rows)
    # 16 keyless rows fill one; at d64 the tile is 192 rows (20 x 8 = 160 of request 0, 4 of them with keys)
    gqa = case(requests=((20, 4), (30, 30)), causal=True, num_heads=8, num_kv_heads=1, head_dim=128)  # rows 0..15
    assert v(gqa).value("fa3_keyless_m_block") and not v(gqa.replace(num_heads=1)).value("fa3_keyless_m_block")
    assert not v(gqa.replace(head_dim=64)).value("fa3_keyless_m_block")
    assert not v(case(requests=((20, 40), (270, 257)), causal=True)).value("fa3_keyless_m_block")
    # issue 31: peer-fa3's (384, 256) causal requests leave 128 keyless rows: one tile at d128 (and at d96 in fp8,
    # 128 x 128), none of the 192-row tiles of d64 and d96 (the d64 sink case passed on the H100, 2026-11-27)
    peer = case(requests=((384, 256),) * 2, causal=True, window=(198, 0), num_heads=16, num_kv_heads=16, sinks=True)
    assert not v(peer).value("fa3_keyless_m_block") and v(peer.replace(head_dim=128)).value("fa3_keyless_m_block")
    assert not v(peer.replace(head_dim=96)).value("fa3_keyless_m_block")
    assert v(peer.replace(head_dim=96, quant="fp8_e4m3")).value("fa3_keyless_m_block")
    assert v(case(requests=((257, 0),), qv=True, head_dim_v=512)).value("rows_with_keys") == 0
    # cp: the rank's shard and the causal rule in absolute positions (attnref.mask)
    cp = case(requests=((4, 3),), causal=True, cp_world=2, cp_rank=1)
    assert v(cp).value("rows_without_keys") == 0 and v(cp).value("keys_left_of_window") == 0
    assert v(case(requests=((10, 10),), window=(2, 0))).value("keys_left_of_window") == 7

    # FA3's one-MMA-warpgroup rule (d128, max_seqlen_q x group <= 64) across a batch invariance's calls: a decode
    # beside 200-token prefills switches (graphs' failing case), request 0 the longest or a d64 batch does not
    inv = case(
        requests=((1, 2000), (200, 200), (64, 600)), num_heads=32, num_kv_heads=8, head_dim=128, invariance="batch"
    )
    assert v(inv).value("fa3_one_mma_wg_switch")
    assert not v(inv.replace(requests=((200, 200), (1, 2000), (64, 600)))).value("fa3_one_mma_wg_switch")
    assert not v(inv.replace(head_dim=64)).value("fa3_one_mma_wg_switch")
    assert not v(inv.replace(requests=((1, 300), (8, 8), (16, 40)))).value("fa3_one_mma_wg_switch")  # 16 x 4 <= 64
    assert v(inv.replace(requests=((1, 300), (8, 8), (17, 40)))).value("fa3_one_mma_wg_switch")  # 17 x 4 > 64
    assert not v(inv.replace(invariance="")).value("fa3_one_mma_wg_switch")
    # the same rows rule at any head dim, for a neighbour too: group 7, the neighbour grows from 9 (63 rows) to 10 (70)
    grow = case(requests=((1, 3000), (129, 1100)), num_heads=14, num_kv_heads=2, head_dim=64, invariance="neighbour")
    assert v(grow).value("fa3_group_rows_switch") and v(grow).value("invariance_max_q_len_varies")
    assert not v(grow.replace(requests=((64, 3000), (129, 1100)))).value("fa3_group_rows_switch")  # 64 x 7 > 64 always
    assert v(inv.replace(head_dim=64)).value("fa3_group_rows_switch")
    assert not v(inv.replace(requests=((1, 300), (8, 8), (16, 40)))).value("fa3_group_rows_switch")  # 16 x 4 <= 64
    assert not v(grow.replace(invariance="run")).value("fa3_group_rows_switch")
    # an invariance's calls differ in their longest q_len when request 0 is shorter than the batch's longest query
    assert v(inv).value("invariance_max_q_len_varies") and v(inv.replace(head_dim=256)).value(
        "invariance_max_q_len_varies"
    )
    assert not v(inv.replace(requests=((200, 200), (1, 2000)))).value("invariance_max_q_len_varies")
    assert not v(inv.replace(invariance="")).value("invariance_max_q_len_varies")
    # the fork's window schedule (attnfast.fa3_vllm_window, worked out in tests/attnfast/test_fa3_vllm_window.py):
    # d128, (768, 768), causal window 500, one split: 22 rows get keys right of their window; the d64 bf16 path
    # without overlap none, fp8 d64 (192 x 128 with overlap) 11; each kv head counts its group's rows
    win = case(requests=((768, 768),), num_heads=1, num_kv_heads=1, head_dim=128, causal=True, window=(500, 0),
               num_splits=1)  # fmt: skip
    assert v(win).value("fa3_window_unmasked_rows") == 22
    assert v(win.replace(head_dim=64)).value("fa3_window_unmasked_rows") == 0
    assert v(win.replace(head_dim=64, quant="fp8_e4m3", descale="head")).value("fa3_window_unmasked_rows") == 11
    assert v(win.replace(num_heads=2, num_kv_heads=2)).value("fa3_window_unmasked_rows") == 44
    never = win.replace(requests=((640, 640),), window=(600, 0))  # the last query tile starts at 512 < 600
    assert v(never).value("fa3_window_unmasked_rows") == 0  # the key pointer never moves
    assert v(win.replace(window=(None, None))).value("fa3_window_unmasked_rows") == 0


@pytest.mark.parametrize(
    "when, text",
    [
        ("head_dim = 80", "head_dim = 80"),
        ("head_dim = [80, 96]", "head_dim in [80, 96]"),
        ("causal = false", "causal = false"),
        ('kv_layout = "NHD"\nblock_size = 16', "kv_layout = 'NHD' and block_size = 16"),
        ("head_dim = { not = 80 }", "head_dim != 80"),
        ("head_dim = { in = [80, 96] }", "head_dim in [80, 96]"),
        ("head_dim = { not_in = [80, 96] }", "head_dim not in [80, 96]"),
        ("head_dim = { lt = 80 }", "head_dim < 80"),
        ("head_dim = { le = 80 }", "head_dim <= 80"),
        ("head_dim = { gt = 80 }", "head_dim > 80"),
        ("head_dim = { ge = 80, lt = 96 }", "head_dim >= 80 and head_dim < 96"),
        ("scale = { set = false }", "scale set = false"),
        ("scale = { set = true }", "scale set = true"),
        ("softcap = 30.0", "softcap = 30.0"),
        ('kv_layout = ["NHD", "HND"]', "kv_layout in ['NHD', 'HND']"),
        (
            'features = ["paged", "causal"]\nno_features = ["window", "alibi"]',
            "features paged+causal and no window/alibi",
        ),
    ],
)
def test_an_entry_states_its_predicate_in_one_line_the_reports_show(tmp_path: Path, when: str, text: str) -> None:
    """The text the report and the audit show for what an entry matches: each op's symbol, booleans as TOML
    writes them, strings quoted, lists bracketed."""
    assert entry(tmp_path, f"[failure.when]\n{when}\n").pattern == text


def test_several_whens_are_stated_each_in_parentheses(tmp_path: Path) -> None:
    e = entry(tmp_path, "[[failure.when]]\nhead_dim = 80\ncausal = true\n[[failure.when]]\nhead_dim = 160\n")
    assert e.pattern == "(head_dim = 80 and causal = true) or (head_dim = 160)"
