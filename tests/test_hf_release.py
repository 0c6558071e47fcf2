"""The checkpoints people download for two families, as their folders are laid out (written here at
odd sizes from HF's classes; nothing is downloaded):

- gpt-oss's release: the experts' matrices in MXFP4 (``*_blocks`` / ``*_scales``,
  ``quantization_config: mxfp4``), read by zoo's dequantizer, which equals transformers'
  ``convert_moe_packed_tensors`` bit for bit; the converted model against HF's own reading of the
  folder (``from_pretrained`` with ``Mxfp4Config(dequantize=True)``); other quantizations refused;
- Llama 4's Scout / Maverick: ``Llama4ForConditionalGeneration`` (text model, vision tower,
  projector), whose text model converts when asked for by name, compared with the multimodal
  model's logits on text alone; refused otherwise.
"""

from __future__ import annotations

import json

import pytest
import torch
from conformance_checks import mask, same_state, tokens
from conformance_table import HF_CONFIGS, build_reference
from conftest import max_diff, randomize

import zoo
from zoo.interop import ConversionError, from_hf, to_hf
from zoo.interop.files import convert
from zoo.interop.hf import ARCHS
from zoo.interop.hf.stream import hf_dir_to_zoo
from zoo.interop.hf.mxfp4 import BLOCK, FP4_VALUES, dequantize, packed_shapes

transformers = pytest.importorskip("transformers")
mxfp4 = pytest.importorskip("transformers.integrations.mxfp4")
pytestmark = [pytest.mark.reference, pytest.mark.usefixtures("aten_linears")]

EXPERTS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")
RELEASE_QUANTIZATION = {"quant_method": "mxfp4", "modules_to_not_convert": [
    "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_dequantize_equals_transformers_bit_for_bit(dtype):
    g = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (3, 5, 2, BLOCK // 2), generator=g, dtype=torch.uint8)
    scales = torch.randint(0, 256, (3, 5, 2), generator=g, dtype=torch.uint8)  # every exponent, 2 ** -127 to 2 ** 128
    ours, theirs = dequantize(blocks, scales, dtype), mxfp4.convert_moe_packed_tensors(blocks, scales, dtype=dtype)
    assert ours.dtype == theirs.dtype == dtype and ours.shape == theirs.shape == (3, 2 * BLOCK, 5)
    bits = {torch.float32: torch.int32}.get(dtype, torch.int16)
    assert torch.equal(ours.view(bits), theirs.view(bits))


def _quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's [E, in, out] as MXFP4 (blocks [E, out, in / 32, 16], scales [E, out, in / 32]), each value
    the nearest e2m1 value times its group's power of two."""
    groups = w.transpose(1, 2).reshape(w.shape[0], w.shape[2], -1, BLOCK)
    top = groups.abs().amax(-1).clamp(min=2.0 ** -100)
    exp = torch.ceil(torch.log2(top / 6.0)).clamp(-127, 127)
    values = torch.tensor(FP4_VALUES)
    codes = (groups / torch.exp2(exp)[..., None]).unsqueeze(-1).sub(values).abs().argmin(-1)  # the nearest value's
    blocks = (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)
    return blocks, (exp + 127).to(torch.uint8)


def _release_folder(ref, path, dtype: torch.dtype):
    """``ref`` written as gpt-oss's release is: the experts in MXFP4, two shards and their index."""
    state = {}
    for name, t in ref.state_dict().items():
        if name.endswith(EXPERTS):
            state[f"{name}_blocks"], state[f"{name}_scales"] = _quantize(t.float())
        else:
            state[name] = t.to(dtype).contiguous()
    from safetensors.torch import save_file

    path.mkdir()
    names = sorted(state)
    files = {f"model-0000{i + 1}-of-00002.safetensors": names[i::2] for i in range(2)}
    for file, keys in files.items():
        save_file({k: state[k] for k in keys}, str(path / file), metadata={"format": "pt"})
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in state.values())},
             "weight_map": {k: file for file, keys in files.items() for k in keys}}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    config = ref.config.to_dict() | {"quantization_config": RELEASE_QUANTIZATION, "dtype": str(dtype).removeprefix("torch."),
                                     "architectures": ["GptOssForCausalLM"]}
    (path / "config.json").write_text(json.dumps(config))
    return state


def _hf_reads(path, dtype):
    """HF's own reading of a release folder: dequantized on load, in ``dtype``."""
    return transformers.GptOssForCausalLM.from_pretrained(
        path, local_files_only=True, dtype=dtype, quantization_config=transformers.Mxfp4Config(dequantize=True)).eval()


@pytest.fixture(scope="module")
def gpt_oss():
    return build_reference("GptOssForCausalLM", hidden_size=64, intermediate_size=64)  # 32-value groups: D, F of 64


def test_mxfp4_release_folder_converts_and_writes_back_dequantized(gpt_oss, tmp_path):
    state = _release_folder(gpt_oss, tmp_path / "release", torch.float32)
    hf = _hf_reads(tmp_path / "release", torch.float32)
    for name in (n for n in hf.state_dict() if n.endswith(EXPERTS)):  # HF read the layout as written
        assert torch.equal(hf.state_dict()[name], mxfp4.convert_moe_packed_tensors(
            state[f"{name}_blocks"], state[f"{name}_scales"], dtype=torch.float32))
    done = hf_dir_to_zoo(tmp_path / "release", tmp_path / "m.safetensors", ARCHS["GptOssForCausalLM"])  # streamed
    assert done.reference == "GptOssForCausalLM" and done.ignored == ()
    model = zoo.load(done.path).eval()
    assert same_state(from_hf(hf), model) == []
    x, m = tokens(3, 9, seed=1), mask("left", length=9)
    with torch.no_grad():
        theirs = hf(input_ids=x, attention_mask=m.long()).logits
        assert max_diff(model(x, m), theirs, m) < 1e-4
    back = convert(done.path, tmp_path / "back")  # plain tensors, no quantization_config
    assert "quantization_config" not in json.loads((tmp_path / "back" / "config.json").read_text())
    loaded = transformers.GptOssForCausalLM.from_pretrained(tmp_path / "back", local_files_only=True).eval()
    assert back.reference == "GptOssForCausalLM" and same_state(hf, loaded) == []


def test_mxfp4_in_bfloat16_reads_the_weights_exactly(gpt_oss, tmp_path):
    """In bf16 the dequantized weights are HF's bit for bit; the logits agree to bf16's rounding only,
    as HF weighs the experts in bf16 (its router's softmax and the weighted sum) and zoo in fp32."""
    _release_folder(gpt_oss, tmp_path / "release", torch.bfloat16)
    hf = _hf_reads(tmp_path / "release", torch.bfloat16)
    model = zoo.load(hf_dir_to_zoo(tmp_path / "release", tmp_path / "m.safetensors", ARCHS["GptOssForCausalLM"]).path).eval()
    assert same_state(from_hf(hf), model) == [] and {t.dtype for t in model.state_dict().values()} == {torch.bfloat16}
    x = tokens(2, 9, seed=1)
    with torch.no_grad():
        ours, theirs = model(x).float(), hf(input_ids=x).logits.float()
    assert max_diff(ours, theirs) < 0.03 * theirs.abs().max().item()  # bf16 rounding (eps 2 ** -8) through the layers


def test_other_quantizations_are_refused_by_name(gpt_oss, tmp_path):
    _release_folder(gpt_oss, tmp_path / "fp8", torch.float32)
    config = json.loads((tmp_path / "fp8" / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    (tmp_path / "fp8" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConversionError, match=r"quantization_config.quant_method='fp8' is not supported"):
        convert(tmp_path / "fp8", tmp_path / "m.safetensors")
    ref = build_reference("LlamaForCausalLM")
    ref.save_pretrained(tmp_path / "llama")
    config = json.loads((tmp_path / "llama" / "config.json").read_text()) | {"quantization_config": RELEASE_QUANTIZATION}
    (tmp_path / "llama" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConversionError, match=r"quant_method='mxfp4' is not supported for model_type 'llama'"):
        convert(tmp_path / "llama", tmp_path / "m.safetensors")


# ------------------------------------------------------------------------------------------ Llama 4
VISION = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=24, vision_output_dim=20,
              image_size=16, patch_size=8, projector_input_dim=20, projector_output_dim=20)


@pytest.fixture(scope="module")
def llama4():
    """A Llama4ForConditionalGeneration as Scout's: the conformance table's text model, a tiny vision tower."""
    config = transformers.Llama4Config(text_config=HF_CONFIGS["Llama4ForCausalLM"][1], vision_config=VISION)
    return randomize(transformers.Llama4ForConditionalGeneration(config), seed=3)


def _text_logits(hf, x, m=None):
    """The multimodal model's logits on text alone: its forward, or where that fails building its output
    (transformers 5.24 reads ``image_outputs`` from the text model's), the steps it takes without
    ``pixel_values``: its input embeddings, then its language model on them."""
    kw = {} if m is None else {"attention_mask": m.long()}
    with torch.no_grad():
        try:
            return hf(input_ids=x, **kw).logits
        except AttributeError:
            return hf.language_model(inputs_embeds=hf.get_input_embeddings()(x), **kw).logits


def test_llama4_multimodal_model_converts_its_text_model_when_asked(llama4):
    with pytest.raises(ConversionError, match=r"vision tower and a projector.*architecture='Llama4ForCausalLM'"):
        from_hf(llama4)
    model = from_hf(llama4, architecture="Llama4ForCausalLM").eval()
    assert same_state(from_hf(llama4.language_model), model) == []
    x, m = tokens(3, 9, seed=1), mask("right", length=9)
    with torch.no_grad():
        assert max_diff(model(x), _text_logits(llama4, x)) < 1e-4
        assert max_diff(model(x, m), _text_logits(llama4, x, m), m) < 1e-4
    back = to_hf(model)  # a Llama4ForCausalLM
    assert type(back).__name__ == "Llama4ForCausalLM" and same_state(llama4.language_model, back) == []


def test_llama4_multimodal_folder_converts_its_text_model_when_asked(llama4, tmp_path):
    llama4.save_pretrained(tmp_path / "scout", max_shard_size="20KB")
    with pytest.raises(ConversionError, match=r"--architecture Llama4ForCausalLM"):
        convert(tmp_path / "scout", tmp_path / "m.safetensors")
    done = convert(tmp_path / "scout", tmp_path / "m.safetensors", architecture="Llama4ForCausalLM")
    assert done.reference == "Llama4ForCausalLM"
    assert done.ignored and all(k.startswith(("vision_model.", "multi_modal_projector.")) for k in done.ignored)
    assert {k.split(".")[0] for k in llama4.state_dict() if not k.startswith("language_model.")} == \
        {k.split(".")[0] for k in done.ignored}
    model = zoo.load(done.path).eval()
    x = tokens(2, 9, seed=2)
    with torch.no_grad():
        assert max_diff(model(x), _text_logits(llama4, x)) < 1e-4
    convert(done.path, tmp_path / "back")
    written = json.loads((tmp_path / "back" / "config.json").read_text())
    assert written["architectures"] == ["Llama4ForCausalLM"] and written["model_type"] == "llama4_text"
    loaded = transformers.Llama4ForCausalLM.from_pretrained(tmp_path / "back", local_files_only=True).eval()
    assert same_state(llama4.language_model, loaded) == []


def test_a_model_quantized_in_memory_is_refused():
    hf = build_reference("GptOssForCausalLM")
    hf.is_quantized, hf.config.quantization_config = True, transformers.Mxfp4Config()  # as from_pretrained leaves it
    with pytest.raises(ConversionError, match=r"quantized in memory \(mxfp4\).*Mxfp4Config\(dequantize=True\)"):
        from_hf(hf)


def test_mxfp4_weights_only_in_pytorch_model_bin_read_whole_dequantized(gpt_oss, tmp_path):
    state = _release_folder(gpt_oss, tmp_path / "release", torch.float32)
    for file in (tmp_path / "release").glob("model*.safetensors*"):
        file.unlink()
    torch.save(state, tmp_path / "release" / "pytorch_model.bin")
    model = zoo.load(convert(tmp_path / "release", tmp_path / "m.safetensors").path)
    assert same_state(from_hf(_hf_reads(tmp_path / "release", torch.float32)), model) == []


def test_mxfp4_needs_32_value_groups():
    with pytest.raises(ConversionError, match=r"input size 48 is not a multiple of 32"):
        packed_shapes((3, 48, 64), "model.layers.0.mlp.experts.gate_up_proj", "here")


def test_llama4_multimodal_from_the_command_line_and_its_config(llama4, tmp_path, capsys):
    from zoo.cli import main
    from zoo.interop import hf_spec

    llama4.save_pretrained(tmp_path / "scout")
    capsys.readouterr()
    assert main(["convert", str(tmp_path / "scout"), "-o", str(tmp_path / "m.safetensors")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("zoo: error: ") and "--architecture Llama4ForCausalLM" in err
    assert main(["convert", str(tmp_path / "scout"), "-o", str(tmp_path / "m.safetensors"),
                 "--architecture", "Llama4ForCausalLM"]) == 0
    out, _ = capsys.readouterr()
    assert "Llama4ForCausalLM" in out and "left out" in out and "vision_model." in out
    with pytest.raises(ConversionError, match=r"hf_spec\(config.text_config\)"):
        hf_spec(llama4.config)
    assert zoo.load(tmp_path / "m.safetensors").spec == hf_spec(llama4.config.text_config)


def test_llama4_multimodal_quantized_is_refused_though_its_text_config_says_nothing(llama4, tmp_path):
    llama4.save_pretrained(tmp_path / "maverick-fp8")
    config = json.loads((tmp_path / "maverick-fp8" / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fbgemm_fp8", "modules_to_not_convert": ["vision_model"]}
    (tmp_path / "maverick-fp8" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConversionError, match=r"quant_method='fbgemm_fp8' is not supported"):
        convert(tmp_path / "maverick-fp8", tmp_path / "m.safetensors", architecture="Llama4ForCausalLM")
