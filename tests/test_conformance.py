"""One conformance suite over every converted class: each HF class in ``zoo.interop.hf.ARCHS`` (the
classes with heads and their headless backbones) and each timm class ``to_timm`` writes, built once
per test process from its small config in tests/conformance_table.py (random init, every parameter
random, fp32, eval mode), is checked for:

- the weight round trip: reference -> zoo -> reference gives back the same state dict, bit for bit;
- outputs both ways: the converted zoo model, and the reference converted back from it, give the
  reference's logits (or hidden states, or a ViT's classes) within 1e-4 at real tokens, unpadded and
  with right and left padding where the class takes a mask (tests/conformance_checks.py); a sequence
  classifier's logits (``model.classify``) row by row, a row whose first slot is padding refused by
  zoo where the first token is pooled;
- cached greedy decoding: ``zoo.generate`` equals the reference's ``generate(do_sample=False)`` for
  the classes that generate (decoders with a head, encoder-decoders: these untied, as a tied random
  one repeats its last token), unpadded and padded, past the windows; and beam search (4 beams;
  with an eos, finishing as HF does) its beam search and scores;
- the config: the one zoo writes for the class names it and reads back as the converted spec, and
  ``to_hf`` picks the class by itself;
- streaming conversion: ``save_pretrained`` in shards of 20 KB, ``zoo convert`` to a zoo file and
  back (timm: a zoo file in shards to a timm directory and back), every tensor equal;
- save and load: ``zoo.save`` / ``zoo.load`` rebuild the converted model, spec and tensors;
- claims: each spec field a class does not claim (zoo.interop.claims), changed from the converted
  model's spec, is refused with a ConversionError naming it.

The last test fails when a registered class has no entry in the table. Beam search and streaming
are marked slow (``-m "not slow"`` leaves them out).
"""

from __future__ import annotations

import re

import pytest
import torch
from conformance_checks import (
    ATOL, NEW, PROMPT, check_config, check_greedy, check_outputs, check_round_trip, forward, hf_generate, inputs,
    is_timm, mask, rows, same_state, to_zoo, tokens, zoo_generate,
)
from conformance_table import (BACKBONE_OF, CLASSES, HF_CONFIGS, NO_TIMM_DIRECTORY, generation_reference, reference, timm_class,
                               timm_classes)
from conformance_table import hf_config as table_config
from conftest import max_diff

import zoo
from zoo.interop import ConversionError, hf_config, to_timm
from zoo.interop.claims import FREE
from zoo.interop.files import convert
from zoo.interop.hf import ARCHS

transformers = pytest.importorskip("transformers")
pytestmark = [pytest.mark.reference, pytest.mark.usefixtures("aten_linears")]


# to_hf's class where it is not the reference's: the first that computes the spec
DEFAULT_CLASS = {"XLMRobertaForMaskedLM": "RobertaForMaskedLM", "XLMRobertaModel": "RobertaModel",
                 "Siglip2TextModel": "SiglipTextModel", "XLMRobertaForSequenceClassification": "RobertaForSequenceClassification"}
# the classes that generate: decoders with a head, encoder-decoders
GENERATORS = [n for n in HF_CONFIGS if n.endswith(("ForCausalLM", "LMHeadModel"))
              or (table_config(n).is_encoder_decoder and n not in BACKBONE_OF)]


def test_every_registered_class_has_an_entry_in_the_table():
    registered = [*ARCHS, *timm_classes()]
    assert "VisionTransformer" in registered and "LlamaModel" in registered  # both registries were read
    missing = [n for n in registered if n not in CLASSES]
    assert not missing, f"registered classes without a config in tests/conformance_table.py: {missing}"
    assert not [n for n in CLASSES if timm_class(n) not in registered], "the table has classes no converter registers"


@pytest.mark.parametrize("name", CLASSES)
def test_weights_round_trip_exactly(name):
    check_round_trip(reference(name))


@pytest.mark.parametrize("name", CLASSES)
def test_outputs_equal_both_ways_padded_or_not(name):
    check_outputs(reference(name))


@pytest.mark.parametrize("name", HF_CONFIGS)
def test_config_reads_and_writes_the_spec(name):
    check_config(reference(name), DEFAULT_CLASS.get(name))


@pytest.mark.parametrize("name", GENERATORS)
def test_greedy_decoding_equals_hf_generate(name):
    check_greedy(generation_reference(name))


@pytest.mark.slow
@pytest.mark.parametrize("name", GENERATORS)
def test_beam_search_equals_hf(name):
    """Without eos every hypothesis runs to the end and HF's length penalty 1 is zoo's "hf" with
    alpha 1; then an eos HF's beams produce, no length penalty, zoo finishing as HF does
    (``finish_from="beams"``): the same sequences and scores (tests/test_beam_hf.py)."""
    ref = generation_reference(name)
    model = to_zoo(ref)
    fam = model.spec.family
    prompt = tokens(3, PROMPT, seed=3)
    m = mask("left" if fam == "decoder" else "right", length=PROMPT)
    theirs, their_scores = hf_generate(ref, fam, prompt, m, beams=4)
    ours = zoo_generate(model, ref, prompt, m, num_beams=4, length_norm="power", alpha=1.0)
    assert theirs.shape == (3, NEW) and torch.equal(ours.tokens, theirs)
    torch.testing.assert_close(ours.scores, their_scores, atol=1e-4, rtol=1e-5)
    eos = int(theirs[0, 2])
    theirs, their_scores = hf_generate(ref, fam, prompt, m, beams=4, eos=eos, penalty=0.0)
    ours = zoo_generate(model, ref, prompt, m, num_beams=4, eos_id=eos, length_norm="none", finish_from="beams")
    assert rows(ours.tokens, eos) == rows(theirs, eos)
    torch.testing.assert_close(ours.scores, their_scores, atol=1e-4, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name", CLASSES)
def test_sharded_folder_streams_to_zoo_and_back(name, tmp_path):
    ref = reference(name)
    expected = to_zoo(ref)
    if is_timm(name):  # a zoo file in shards -> a timm directory -> a zoo file
        zoo.save(expected, tmp_path / "m.safetensors", max_shard_size="20KB")
        assert len(list(tmp_path.glob("m-*-of-*.safetensors"))) >= 2
        if name in NO_TIMM_DIRECTORY:  # refused by name, before anything is written
            with pytest.raises(ConversionError, match=re.escape(NO_TIMM_DIRECTORY[name])):
                convert(tmp_path / "m.safetensors", tmp_path / "timm")
            return
        # NaFlexVit's spec is a VisionTransformer's too, which a zoo file converts to by default: the class named
        assert convert(tmp_path / "m.safetensors", tmp_path / "timm", architecture=timm_class(name)).reference == timm_class(name)
        convert(tmp_path / "timm", tmp_path / "back.safetensors")
        model = zoo.load(tmp_path / "back.safetensors")
        from safetensors.torch import load_file

        written = load_file(str(tmp_path / "timm" / "model.safetensors"))
        assert written.keys() == ref.state_dict().keys()
        assert all(torch.equal(t, written[k]) for k, t in ref.state_dict().items())
    else:
        ref.save_pretrained(tmp_path / "hf", max_shard_size="20KB")
        assert len(list((tmp_path / "hf").glob("model-*-of-*.safetensors"))) >= 2
        done = convert(tmp_path / "hf", tmp_path / "m.safetensors", max_shard_size="20KB")
        assert done.reference == name
        model = zoo.load(done.path)
        back = convert(done.path, tmp_path / "back", architecture=name, max_shard_size="20KB")
        assert (tmp_path / "back" / "model.safetensors.index.json").is_file()
        loaded = getattr(transformers, name).from_pretrained(tmp_path / "back", local_files_only=True).eval()
        assert back.reference == name and same_state(ref, loaded) == []
        loaded.config._attn_implementation = ref.config._attn_implementation  # Gemma 2 soft-caps only in eager
        _, theirs, _ = inputs(ref, expected.spec.family, None)
        assert max_diff(forward(loaded, theirs), forward(ref, theirs)) < ATOL  # config.json says what the config did
    assert model.spec == expected.spec and same_state(expected, model) == []


@pytest.mark.parametrize("name", CLASSES)
def test_zoo_file_rebuilds_the_converted_model(name, tmp_path):
    model = to_zoo(reference(name))
    loaded = zoo.load(zoo.save(model, tmp_path / "m.safetensors")).eval()
    assert loaded.spec == model.spec and same_state(model, loaded) == []
    ours, _, real = inputs(reference(name), model.spec.family, "right" if model.spec.family != "vit" else None)
    out, expected = forward(loaded, ours), forward(model, ours)
    assert torch.equal(out[real] if real is not None else out, expected[real] if real is not None else expected)


def _claimed(path: str, claims) -> bool:
    """A claim on ``path``, on a section above it, or on a field inside it (which the claim check names)."""
    return any(path == k or path.startswith(k + ".") or k.startswith(path + ".") for k in claims)


def _claims(name: str):
    from zoo.interop.timm import ARCHS as TIMM

    return TIMM[timm_class(name)].claims if is_timm(name) else ARCHS[name].claims


def _refusal(name: str, spec) -> ConversionError | None:
    try:
        if is_timm(name):
            to_timm(zoo.build(spec, device="meta"), timm_class(name))
        else:
            hf_config(spec, name)
    except ConversionError as e:
        return e
    return None


@pytest.mark.parametrize("name", CLASSES)
def test_unclaimed_fields_are_refused_by_name(name):
    from test_claims import _names_field, mutations

    claims, tried = _claims(name), 0
    for paths, _, _, spec in mutations(to_zoo(reference(name)).spec, depth=1):
        path = paths[-1]
        if path.split(".")[0] in FREE or _claimed(path, claims):
            continue
        tried += 1
        refused = _refusal(name, spec)
        assert refused is not None, f"{name}: {path} is not claimed but converts"
        assert _names_field(str(refused), path), f"{name}: {path} refused without naming it: {refused}"
    assert tried >= 5
