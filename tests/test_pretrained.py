"""zoo.train.pretrained: a recipe's init= — from a zoo file or an HF directory, with the overrides
that keep weights meaningful, reporting what was loaded, new, dropped and resized."""

from __future__ import annotations

import pytest
import torch

import zoo
from zoo.components.position import resample_grid_table
from zoo.train import Dist, TrainError
from zoo.train.pretrained import check_overrides, pretrained

SMALL = ["d_model=48", "n_layers=2", "block.attention.n_heads=4", "block.attention.n_kv_heads=2",
         "block.ffn.hidden=80", "vocab_size=97", "max_seq_len=64"]


def _saved(tmp_path, preset, overrides, name="m.safetensors"):
    model = zoo.build(zoo.load_spec(preset, overrides), seed=3)
    path = tmp_path / name
    zoo.save(model, path)
    return model.eval(), path


def test_zoo_file_loads_every_tensor_and_keeps_outputs(tmp_path):
    ref, path = _saved(tmp_path, "llama-tiny", SMALL)
    start = pretrained(path, families=("decoder",), recipe="lm.py", overrides=["dropout.residual=0.1"],
                       work_dir=tmp_path / "init", dist=Dist(), seed=9)
    assert start.new == [] and start.dropped == [] and start.resized == []
    assert start.spec.dropout.residual == 0.1 and start.spec.d_model == 48
    tokens = torch.randint(0, 97, (2, 11))
    torch.testing.assert_close(start.model.eval()(tokens), ref(tokens), rtol=0, atol=0)
    report = start.report()
    assert report["loaded"] == len(start.loaded) == len(ref.state_dict()) and report["new"] == []


@pytest.mark.parametrize("override", ["d_model=64", "block.ffn.kind=gelu", "vocab_size=120", "n_layers=3"])
def test_overrides_that_change_the_architecture_are_refused_by_name(override):
    with pytest.raises(TrainError, match=override.replace(".", r"\.")):
        check_overrides([override])


def test_allowed_overrides_pass():
    check_overrides(["dropout.attention=0.1", "block.attention.window=8", "head.num_classes=5",
                     "classifier.num_labels=3", "max_seq_len=32", "image_size=48"])


def test_family_the_recipe_cannot_train_is_refused_naming_both(tmp_path):
    _, path = _saved(tmp_path, "bert-mini", ["d_model=32", "n_layers=1", "block.attention.n_heads=2",
                                             "block.ffn.hidden=40", "vocab_size=50"])
    with pytest.raises(TrainError, match=r"holds a encoder.*lm\.py trains a decoder"):
        pretrained(path, families=("decoder",), recipe="lm.py", work_dir=tmp_path / "init", dist=Dist())


def test_a_new_classifier_is_new_and_a_removed_head_is_dropped(tmp_path):
    enc = ["d_model=32", "n_layers=1", "block.attention.n_heads=2", "block.ffn.hidden=40", "vocab_size=50"]
    ref, path = _saved(tmp_path, "bert-mini", enc)
    start = pretrained(path, families=("encoder",), recipe="classify.py", overrides=["classifier.num_labels=3",
                       "head=none"], work_dir=tmp_path / "init", dist=Dist())
    assert start.new and all(n.startswith("classifier.") for n in start.new)
    stored = set(ref.state_dict())
    assert set(start.dropped) == {n for n in stored if n.startswith("head.")} - set(start.model.state_dict())
    assert start.dropped and "tok_emb.weight" in start.loaded
    assert "loaded" in start.describe() and "classifier." in start.describe()


def test_shape_changing_override_outside_the_head_is_refused(tmp_path):
    _, path = _saved(tmp_path, "bert-mini", ["d_model=32", "n_layers=1", "block.attention.n_heads=2",
                                             "block.ffn.hidden=40", "vocab_size=50", "max_seq_len=16"])
    with pytest.raises(TrainError, match=r"position\.weight is \[16, 32\]"):
        pretrained(path, families=("encoder",), recipe="mlm.py", overrides=["max_seq_len=32"],
                   work_dir=tmp_path / "init", dist=Dist())


def test_vit_positions_are_resampled_to_a_new_image_size(tmp_path):
    vit = ["image_size=32", "patch_size=8", "d_model=32", "n_layers=1", "block.attention.n_heads=2",
           "block.ffn.hidden=40", "head.num_classes=10"]
    ref, path = _saved(tmp_path, "vit-tiny-16", vit)
    start = pretrained(path, families=("vit",), recipe="imagenet.py", overrides=["image_size=48", "head.num_classes=4"],
                       work_dir=tmp_path / "init", dist=Dist())
    assert start.resized == ["position.weight"]
    want = resample_grid_table(ref.position.weight.detach(), (4, 4), (6, 6), prefix=1)
    torch.testing.assert_close(start.model.position.weight.detach(), want)
    assert set(start.new) == {"head.weight", "head.bias"} or all(n.startswith("head.") for n in start.new)
    torch.testing.assert_close(start.model.patch_embed.state_dict()["proj.weight"], ref.patch_embed.state_dict()["proj.weight"])


def test_hf_directory_is_converted_once_and_gives_hf_logits(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=97, max_position_embeddings=64)
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(config).eval()
    hf.save_pretrained(tmp_path / "hf")
    work = tmp_path / "run" / "init"
    start = pretrained(tmp_path / "hf", families=("decoder",), recipe="lm.py", work_dir=work, dist=Dist())
    assert start.path.parent == work and start.new == [] and "LlamaForCausalLM" in start.source
    tokens = torch.randint(0, 97, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(start.model.eval()(tokens), hf(tokens).logits, atol=1e-4, rtol=1e-4)
    stamp = start.path.stat().st_mtime_ns
    again = pretrained(tmp_path / "hf", families=("decoder",), recipe="lm.py", work_dir=work, dist=Dist())
    assert again.path.stat().st_mtime_ns == stamp and "converted earlier" in again.source


@pytest.mark.parametrize("bad, message", [("missing", "no such file"), ("notzoo.safetensors", "not a zoo file"),
                                          ("emptydir", "without config.json")])
def test_bad_init_paths_name_the_fix(tmp_path, bad, message):
    (tmp_path / "emptydir").mkdir()
    from safetensors.torch import save_file
    save_file({"x": torch.zeros(2)}, str(tmp_path / "notzoo.safetensors"))
    with pytest.raises(TrainError, match=message):
        pretrained(tmp_path / bad, families=("decoder",), recipe="lm.py", work_dir=tmp_path / "init", dist=Dist())


VIT = ["image_size=32", "patch_size=8", "d_model=32", "n_layers=1", "block.attention.n_heads=2", "block.ffn.hidden=40",
       "head.num_classes=10"]


@pytest.mark.parametrize("channels", [1, 2, 4, 5])
def test_in_channels_adapt_the_patch_embedding_as_timm_does(tmp_path, channels):
    timm_models = pytest.importorskip("timm.models")
    ref, path = _saved(tmp_path, "vit-tiny-16", VIT)  # RGB
    start = pretrained(path, families=("vit",), recipe="imagenet.py", overrides=[f"in_channels={channels}"],
                       work_dir=tmp_path / "init", dist=Dist())
    assert start.resized == ["patch_embed.proj.weight"] and start.new == [] and "resized 1" in start.describe()
    stored = ref.patch_embed.proj.weight.detach()
    want = timm_models.adapt_input_conv(channels, stored.clone())
    torch.testing.assert_close(start.model.patch_embed.proj.weight.detach(), want, rtol=0, atol=0)
    if channels == 1:  # a gray image gives what the RGB model gives for it in all three channels
        x = torch.randn(2, 1, 32, 32)
        with torch.no_grad():
            torch.testing.assert_close(start.model.eval()(x), ref(x.expand(-1, 3, -1, -1)), atol=1e-5, rtol=1e-5)


def test_conv_stem_adapts_its_first_convolution(tmp_path):
    ref, path = _saved(tmp_path, "vitc-fashion-mnist-7", ["in_channels=3", "d_model=32", "n_layers=1",
                                                          "block.attention.n_heads=2", "block.ffn.hidden=40"])
    start = pretrained(path, families=("vit",), recipe="imagenet.py", overrides=["in_channels=1"],
                       work_dir=tmp_path / "init", dist=Dist())
    first = next(n for n, t in ref.state_dict().items() if t.ndim == 4)
    assert start.resized == [first] and start.new == []
    torch.testing.assert_close(start.model.state_dict()[first], ref.state_dict()[first].sum(1, keepdim=True))


@pytest.mark.parametrize("position", ["sincos2d", "rope2d"])
def test_positions_without_a_table_need_nothing_at_a_new_image_size(tmp_path, position):
    _, path = _saved(tmp_path, "vit-tiny-16", [*VIT, f"position.kind={position}"])
    start = pretrained(path, families=("vit",), recipe="imagenet.py", overrides=["image_size=48"],
                       work_dir=tmp_path / "init", dist=Dist())
    assert start.spec.image_size == 48 and start.new == [] and start.resized == [] and start.dropped == []
    assert start.model(torch.randn(1, 3, 48, 48)).shape == (1, 10)


def test_vit_recipe_refuses_a_decoder_naming_both(tmp_path):
    _, path = _saved(tmp_path, "llama-tiny", SMALL)
    with pytest.raises(TrainError, match=r"holds a decoder.*imagenet\.py trains a vit"):
        pretrained(path, families=("vit",), recipe="imagenet.py", work_dir=tmp_path / "init", dist=Dist())
