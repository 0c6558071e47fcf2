"""The encoder's sequence classifier (zoo/spec/classifier.py, zoo/components/classifier.py) and the HF
``*ForSequenceClassification`` converters' labels and refusals (zoo/interop/hf/classification.py);
tests/test_conformance.py runs each converted class's logits both ways."""

from __future__ import annotations

import pytest
import torch
from conformance_table import build_reference, hf_config as table_config

import zoo
from zoo.interop import ConversionError, from_hf, hf_config, hf_spec, to_hf
from zoo.spec import ClassifierSpec, SpecError

transformers = pytest.importorskip("transformers")

TINY = ["d_model=24", "n_layers=1", "block.attention.n_heads=3", "block.ffn.hidden=40", "vocab_size=53", "max_seq_len=16",
        "head=none"]


def _encoder(classifier: str):
    return zoo.build(zoo.load_spec("bert-mini", [*TINY, f"classifier={classifier}"]), seed=0).eval()


@pytest.mark.parametrize("fields, field", [
    ({"num_labels": 3, "labels": ["a", "b"]}, "classifier.labels"),
    ({"num_labels": 1, "problem_type": "single_label_classification"}, "classifier.problem_type"),
    ({"pooler": False, "activation": "gelu"}, "classifier.activation"),
    ({"pooler": False, "norm": True}, "classifier.norm"),
])
def test_a_classifier_that_does_not_hold_together_is_refused_naming_the_field(fields, field):
    with pytest.raises(ValueError, match=field):
        ClassifierSpec(**fields)


def test_a_spec_of_the_first_classifier_still_reads_as_bert_pooler():
    """``classifier: {num_labels, pooler, dropout}`` (the fields it had first) is BERT's: linear, tanh."""
    model = _encoder("{num_labels: 3}")
    c = model.classifier
    x = torch.randint(0, 53, (2, 7))
    h = model.encode(x)
    expected = c.out(torch.tanh(c.pooler[0](h[:, 0])))
    torch.testing.assert_close(model.classify(x), expected)
    assert [n for n, _ in c.named_parameters()] == ["pooler.0.weight", "pooler.0.bias", "out.weight", "out.bias"]


def test_mean_pooling_averages_the_real_tokens_through_activation_and_norm():
    model = _encoder("{num_labels: 2, pool: mean, activation: relu, norm: true, pooler_bias: false}")
    c = model.classifier
    x = torch.randint(0, 53, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, 4:] = False
    h = model.encode(x, mask)
    mean = torch.stack([h[0].mean(0), h[1, :4].mean(0)])
    expected = c.out(c.pooler[2](torch.relu(mean @ c.pooler[0].weight.T)))
    torch.testing.assert_close(model.classify(x, mask), expected)
    assert c.pooler[0].bias is None


def test_a_padding_first_token_is_refused_where_the_first_token_is_classified():
    model = _encoder("{num_labels: 2}")
    mask = torch.ones(2, 5, dtype=torch.bool)
    mask[1, :2] = False  # left padding
    with pytest.raises(ValueError, match="padding_mask: the classifier pools the first token, a padding token in row 1"):
        model.classify(torch.randint(0, 53, (2, 5)), mask)


def test_labels_travel_with_the_spec_and_back_to_the_config():
    spec = hf_spec(table_config("BertForSequenceClassification"))
    spec = spec.model_copy(update={"classifier": ClassifierSpec(num_labels=2, labels=["neg", "pos"], dropout=0.2,
                                                                problem_type="single_label_classification")})
    c = hf_config(spec, "BertForSequenceClassification")
    assert c.id2label == {0: "neg", 1: "pos"} and c.label2id == {"neg": 0, "pos": 1}
    assert c.problem_type == "single_label_classification" and c.num_labels == 2
    assert hf_spec(c).classifier == spec.classifier


def test_a_label2id_of_its_own_is_kept_and_none_reads_as_the_inverse():
    odd = table_config("BertForSequenceClassification", label2id={"neg": 2, "neu": 1, "pos": 0})
    assert hf_spec(odd).classifier.label_ids == {"neg": 2, "neu": 1, "pos": 0}
    assert hf_config(hf_spec(odd), "BertForSequenceClassification").label2id == odd.label2id
    missing = table_config("BertForSequenceClassification", label2id=None)
    assert hf_spec(missing).classifier.label_ids is None
    assert hf_config(hf_spec(missing), "BertForSequenceClassification").label2id == {"neg": 0, "neu": 1, "pos": 2}


@pytest.mark.parametrize("name, change, field", [
    ("BertForSequenceClassification", dict(id2label={0: "a", 2: "b"}, label2id=None), "id2label"),
    ("DebertaV2ForSequenceClassification", dict(pooler_hidden_act="mish"), "pooler_hidden_act"),
    ("DebertaV2ForSequenceClassification", dict(pooler_hidden_size=20), "pooler_hidden_size"),
])
def test_a_config_the_classifier_cannot_express_is_refused_by_name(name, change, field):
    with pytest.raises(ConversionError, match=field):
        hf_spec(table_config(name, **change))


def test_a_classifier_spec_picks_its_class_and_refuses_a_head_it_lacks():
    model = from_hf(build_reference("ElectraForSequenceClassification"))
    assert type(to_hf(model)).__name__ == "ElectraForSequenceClassification"
    tanh = model.spec.model_copy(update={"classifier": model.spec.classifier.model_copy(update={"activation": "tanh"})})
    with pytest.raises(ConversionError, match="classifier.activation='tanh'"):
        hf_config(tanh, "ElectraForSequenceClassification")
    plain = model.spec.model_copy(update={"classifier": None})
    with pytest.raises(ConversionError, match="classifier=None"):
        hf_config(plain, "ElectraForSequenceClassification")
    assert hf_config(plain).architectures == ["ElectraModel"]


def test_a_spec_file_with_a_classifier_loads_as_written(tmp_path):
    spec = zoo.load_spec("bert-mini", [*TINY, "classifier={num_labels: 3, activation: gelu, pooler_dropout: 0.1, "
                                       "labels: [a, b, c], label_ids: {a: 2, b: 1, c: 0}}"])
    path = tmp_path / "m.safetensors"
    zoo.save(zoo.build(spec), path)
    assert zoo.load(path).spec == spec
    with pytest.raises(SpecError, match="classifier.labels"):
        zoo.load_spec("bert-mini", [*TINY, "classifier={num_labels: 3, labels: [a]}"])


@pytest.mark.parametrize("preset, name, classifier", [
    ("deberta-v3-base", "DebertaV2ForSequenceClassification", "{num_labels: 3, activation: gelu}"),
    ("electra-base-discriminator", "ElectraForSequenceClassification",
     "{num_labels: 3, activation: gelu, pooler_dropout: 0.1}"),
    ("modernbert-base", "ModernBertForSequenceClassification",
     "{num_labels: 3, activation: gelu, norm: true, pooler_bias: false, dropout: 0.0}"),
    ("albert-base-v2", "AlbertForSequenceClassification", "{num_labels: 3}"),
])
def test_a_real_size_classifier_has_its_hf_class_parameter_count(preset, name, classifier):
    """On the meta device: the preset with a classifier, and the HF class built from the config zoo writes."""
    spec = zoo.load_spec(preset, ["head=none", f"classifier={classifier}"])
    model = zoo.build(spec, device="meta")
    with torch.device("meta"):
        ref = getattr(transformers, name)(hf_config(spec, name))
    assert zoo.count_parameters(model) == sum(p.numel() for p in ref.parameters()) > 10_000_000
