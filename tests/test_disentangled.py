"""DeBERTa's disentangled attention and its relative-embedding table against HF's
DisentangledSelfAttention and make_log_bucket_position, weights copied."""

import pytest
import torch

from zoo.components.disentangled import DisentangledAttention, RelativeEmbedding, relative_buckets
from zoo.kernels import Mask
from zoo.spec import DisentangledSpec, RelativeEmbeddingSpec

hf = pytest.importorskip("transformers.models.deberta_v2.modeling_deberta_v2")
from transformers import DebertaV2Config  # noqa: E402


def _pair(share: bool, kinds: list[str], buckets: int, max_rel: int):
    torch.manual_seed(0)
    cfg = DebertaV2Config(hidden_size=24, num_attention_heads=3, relative_attention=True, position_buckets=buckets,
                          max_relative_positions=max_rel, share_att_key=share, pos_att_type=kinds,
                          attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0)
    ref = hf.DisentangledSelfAttention(cfg).eval()
    for p in ref.parameters():
        torch.nn.init.normal_(p, std=0.3)
    ours = DisentangledAttention(24, n_heads=3, head_dim=8, c2p="c2p" in kinds, p2c="p2c" in kinds, share_key=share).eval()
    names = {"q": "query_proj", "k": "key_proj", "v": "value_proj", "pos_q": "pos_query_proj", "pos_k": "pos_key_proj"}
    with torch.no_grad():
        for ours_name, ref_name in names.items():
            if getattr(ours, ours_name) is not None:
                getattr(ours, ours_name).weight.copy_(getattr(ref, ref_name).weight)
                getattr(ours, ours_name).bias.copy_(getattr(ref, ref_name).bias)
        torch.nn.init.eye_(ours.out.weight)
        ours.out.bias.zero_()
    pos = RelativeEmbedding(24, buckets=buckets if buckets > 0 else None, max_distance=max_rel).eval()
    return ref, ours, pos


@pytest.mark.parametrize("share,kinds,buckets", [(True, ["p2c", "c2p"], 8), (False, ["p2c", "c2p"], 8),
                                                 (False, ["c2p"], 8), (True, ["p2c"], -1), (True, [], 8)])
def test_attention_matches_hf(share, kinds, buckets):
    ref, ours, pos = _pair(share, kinds, buckets, 12)
    x = torch.randn(2, 15, 24)
    real = torch.ones(2, 15, dtype=torch.bool)
    real[1, 11:] = False  # right padding on the second row
    ext = real[:, None, None, :].long()
    hf_mask = ext * ext.squeeze(-2).unsqueeze(-1)  # HF's get_attention_mask
    want = ref(x, hf_mask, rel_embeddings=pos.table())[0]
    got = ours(x, mask=Mask(15, 15, padding=real), pos=pos, positions=torch.arange(15))
    torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=1e-5)


def test_buckets_match_hf():
    d = torch.arange(-600, 601)
    for buckets, most in ((256, 512), (8, 20), (6, 5)):
        want = hf.make_log_bucket_position(d, buckets, most).long()
        assert torch.equal(relative_buckets(d, buckets, most), want)


def test_left_padding_reads_real_distances():
    """A left-padded row's real tokens score as the same tokens unpadded."""
    ref, ours, pos = _pair(True, ["p2c", "c2p"], 8, 12)
    x = torch.randn(1, 9, 24)
    padded = torch.cat([torch.zeros(1, 3, 24), x], dim=1)
    real = torch.tensor([[False] * 3 + [True] * 9])
    positions = (real.cumsum(-1) - 1).clamp(min=0)
    got = ours(padded, mask=Mask(12, 12, padding=real), pos=pos, positions=positions)[:, 3:]
    torch.testing.assert_close(got, ours(x, pos=pos, positions=torch.arange(9)), atol=1e-5, rtol=1e-5)


def test_specs_refuse_what_they_cannot_hold():
    with pytest.raises(ValueError, match="n_kv_heads"):
        DisentangledSpec(n_heads=4, n_kv_heads=2)
    with pytest.raises(ValueError, match="scale"):
        DisentangledSpec(scale=0.5)
    assert DisentangledSpec(n_heads=4).score_scale(32) == pytest.approx((8 * 3) ** -0.5)
    assert RelativeEmbeddingSpec(buckets=8, max_distance=5).problems(d_model=8, head_dim=2, field="position")


def test_needs_its_position():
    ours = DisentangledAttention(8, n_heads=2, head_dim=4)
    with pytest.raises(ValueError, match="relative_embedding"):
        ours(torch.randn(1, 3, 8))


# ------------------------------------------------------------------------------ DebertaV2 both ways
NAME = "DebertaV2ForMaskedLM"
# v2's options beside the table's v3 config: own position projections, c2p only, no buckets, no table norm, segments
VARIANT = dict(share_att_key=False, pos_att_type=["c2p"], position_buckets=-1, max_relative_positions=-1,
               norm_rel_ebd="none", type_vocab_size=2, hidden_dropout_prob=0.0)


def test_a_v2_variant_converts_both_ways_with_the_same_logits():
    from conformance_checks import check_outputs, check_round_trip
    from conformance_table import build_reference

    ref = build_reference(NAME, seed=3, **VARIANT)
    check_round_trip(ref)
    model = check_outputs(ref)
    att, pos = model.spec.block.attention, model.spec.position
    assert (att.share_key, att.c2p, att.p2c, pos.buckets, pos.max_distance, pos.norm) == (False, True, False, None, 32, False)


@pytest.mark.parametrize("fields,option", [
    ({"relative_attention": False}, "relative_attention"), ({"position_biased_input": True}, "position_biased_input"),
    ({"conv_kernel_size": 3}, "conv_kernel_size"), ({"embedding_size": 16}, "embedding_size"),
    ({"legacy": False}, "legacy"), ({"norm_rel_ebd": "layer_norm|bias"}, "norm_rel_ebd"),
    ({"pos_att_type": ["c2p", "p2p"]}, "pos_att_type"), ({"hidden_act": "relu"}, "hidden_act"),
    ({"attention_head_size": 6}, "attention_head_size"),
])
def test_configs_zoo_cannot_express_are_refused_by_name(fields, option):
    from conformance_table import hf_config

    from zoo.interop import ConversionError, hf_spec

    with pytest.raises(ConversionError, match=option):
        hf_spec(hf_config(NAME, **fields))


def test_specs_the_class_cannot_express_are_refused_by_name():
    from conformance_table import hf_config

    import zoo
    from zoo.interop import ConversionError, hf_spec
    from zoo.spec import apply_overrides, parse_spec

    spec = hf_spec(hf_config(NAME))
    for override, field in (("position.eps=1e-5", "position.eps"), ("position.dropout=0.3", "position.dropout"),
                            ("block.attention.kind=mha", "block.attention.kind"),
                            ("block.attention.head_dim=6", "head_dim"), ("position.kind=learned", "position.kind")):
        with pytest.raises((ConversionError, ValueError), match=field):
            zoo.interop.hf_config(parse_spec(apply_overrides(spec.model_dump(mode="json"), [override])), NAME)
