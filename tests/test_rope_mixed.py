"""RoPE-Mixed (zoo's ``rope2d_mixed``, :class:`zoo.components.rope2d.MixedGridRotaryPosition`)
against timm's ``RotaryEmbeddingMixed``: with timm's frequencies copied, each layer turns queries and
keys on an odd, non-square grid as timm's embedding applied by ``apply_rot_embed_cat`` does, the
class token left as it is; its initial frequencies are timm's ``init_random_2d_freqs`` from the same
random draws; the summary counts its weights per layer; bad specs fail naming the field.
"""

from __future__ import annotations

import pytest
import torch

import zoo
from zoo.components.rope2d import MixedGridRotaryPosition, grid_positions, mixed_frequencies
from zoo.spec import SpecError
from zoo.summary import summarize

timm = pytest.importorskip("timm")
sincos = pytest.importorskip("timm.layers.pos_embed_sincos")

pytestmark = pytest.mark.reference
H, K, DEPTH = 3, 12, 2


@pytest.mark.parametrize("indexing", ["xy", "ij"])
def test_each_layer_turns_as_timms_rotary_embedding_mixed(indexing):
    ref = sincos.RotaryEmbeddingMixed(H * K, DEPTH, H, temperature=10.0, grid_indexing=indexing)
    with torch.no_grad():
        ref.freqs.normal_(0, 0.7, generator=torch.Generator().manual_seed(0))
    grid, prefix = (3, 5), 1
    emb = ref.get_embed(shape=list(grid))  # (depth, H, h*w, 2K): sin then cos
    places = grid_positions(grid, prefix)
    g = torch.Generator().manual_seed(1)
    q, k = (torch.randn(2, H, prefix + grid[0] * grid[1], K, generator=g) for _ in range(2))
    for layer in range(DEPTH):
        ours = MixedGridRotaryPosition(K, H, base=10.0, indexing=indexing)
        with torch.no_grad():
            ours.freqs.copy_(ref.freqs[:, layer])
        zq, zk = ours.rotate(q, k, places)
        for x, z in ((q, zq), (k, zk)):
            theirs = sincos.apply_rot_embed_cat(x[:, :, prefix:], emb[layer])
            torch.testing.assert_close(z[:, :, prefix:], theirs, atol=1e-6, rtol=1e-6)
            assert torch.equal(z[:, :, :prefix], x[:, :, :prefix])  # the class token is not turned


def test_initial_frequencies_are_timms_from_the_same_draws():
    torch.manual_seed(3)
    theirs = sincos.init_random_2d_freqs(K, 1, H, temperature=10.0)  # (2, 1, H, K/2)
    torch.manual_seed(3)
    ours = mixed_frequencies(K, H, base=10.0)
    torch.testing.assert_close(ours, theirs[:, 0], atol=0, rtol=0)


def test_summary_counts_each_layers_frequencies():
    spec = zoo.load_spec("vit-base-16-rope-mixed", ["n_layers=2", "position.kind=learned", "prefix_positions=false",
                                                    'layers=[{at: "1:", position: {kind: rope2d_mixed}}]'])
    s = summarize(spec)
    per_layer = 2 * 12 * 64 // 2  # (x, y) x heads x K/2
    assert [row.get("position_parameters") for row in s.layers] == [None, per_layer]
    table = 196 * 768
    assert s.parts["embeddings"] == table + per_layer + 768 + sum(p.numel() for p in zoo.build(spec, device="meta")
                                                                   .patch_embed.parameters())


def test_bad_specs_name_the_field():
    with pytest.raises(SpecError, match=r"position.kind: rope2d_mixed .* divisible by 4, got 10"):
        zoo.load_spec("vit-base-16-rope-mixed", ["d_model=40", "block.attention.n_heads=4"])
    with pytest.raises(SpecError, match="position.indexing"):
        zoo.load_spec("vit-base-16-rope-mixed", ["position.indexing=yx"])
    model = zoo.build("vit-base-16-rope-mixed", ["n_layers=1", "block.attention.kind=gqa", "block.attention.n_kv_heads=4"],
                      seed=0)
    with pytest.raises(ValueError, match="set block.attention.n_kv_heads to n_heads"):
        model(torch.randn(1, 3, 224, 224))
