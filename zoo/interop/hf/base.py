"""What the HF converters share: the :class:`Architecture` each reference class fills in (with the
spec fields it claims, :mod:`zoo.interop.claims`, or a field table that gives both directions and
the claims, :mod:`zoo.interop.hf.table`), the :class:`Headless` converter of a reference's
backbone without its head (HF's ``*Model``), the tables of activation names, the checks that refuse
what a reference cannot express, and the builders of tensor rules (:mod:`zoo.interop.common`) for
the usual layouts."""

from __future__ import annotations

from functools import cache
from collections.abc import Collection, Mapping
from typing import Any, ClassVar

from torch import Tensor, nn

from zoo.interop.claims import ANY, Claims, check_claims, one_of
from zoo.interop.common import Rule, rule, unsupported
from zoo.interop.hf.table import apply_read, apply_write, table_claims
from zoo.spec import FamilySpec, LMHeadSpec

__all__ = [
    "BUILTIN_ATTENTION",
    "GATED",
    "MOE_CLAIMS",
    "TEXT_CLAIMS",
    "TWO_LAYER",
    "Architecture",
    "Headless",
    "act_name",
    "ffn_of",
    "fused",
    "layernorm",
    "plain_attention",
    "require",
    "same_layers",
    "weights",
]


class Architecture:
    """One HF reference class. ``spec(config, hf_model or None)`` reads a zoo spec (a mapping) from
    its config, ``config(spec, given)`` writes its config fields from a zoo spec, ``rules(spec)``
    maps tensors by name. A class with a ``table`` (:mod:`zoo.interop.hf.table`) has both mappings,
    and its claims, from it: the table's entries applied one way or the other; ``tie`` names the
    head and embedding modules whose sharing a model's tying is read from. Five steps are optional: ``check_from`` names the reference tensors zoo
    keeps no copy of (after checking them), ``extra_to`` makes the reference tensors zoo does not
    hold, ``prepare_from`` and ``prepare_to`` rearrange a reference or zoo state dict (same names,
    same shapes) before it is mapped; ``made`` adjusts a reference model built for a zoo spec.

    Converting files on disk (:mod:`zoo.interop.hf.stream`) runs the same steps one tensor at a
    time, with no copy of the whole model in memory, so each step keeps to this: ``spec`` may read
    the reference model's buffers but not its parameters' values (they are on the meta device);
    ``check_from`` and ``extra_to`` read by name from their mapping the few tensors they need;
    ``prepare_from`` and ``prepare_to`` treat each tensor on its own (they are given one at a time).

    A reference class may take constructor arguments beyond its config (``BertModel``'s
    ``add_pooling_layer``): ``init_kwargs(spec)`` gives them for a zoo spec, ``saved_init_kwargs(names)``
    for a checkpoint holding the tensors ``names`` (what the class must be built with to read them)."""

    name: ClassVar[str]  # the transformers model class
    config_name: ClassVar[str]  # the transformers config class
    model_type: ClassVar[str]  # the config's model_type
    claims: ClassVar[Claims] = {}  # the spec fields it expresses (zoo.interop.claims); any other is refused
    base: ClassVar[str | None] = None  # the class of its backbone without the head (HF's *Model), if that converts
    prefix: ClassVar[str] = ""  # the backbone's attribute in this class (HF's base_model_prefix)
    base_pooler: ClassVar[str | None] = None  # the backbone's optional pooler (BertModel's "pooler"), if it has one
    table: ClassVar[tuple] = ()  # the config <-> spec field table, where the class has one
    tie: ClassVar[tuple[str, str]] = ("lm_head", "model.embed_tokens")  # head, embedding: tied where they share a weight

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "table" in cls.__dict__ and "claims" not in cls.__dict__:
            cls.claims = table_claims(cls.table)

    @classmethod
    def check_claims(cls, s: FamilySpec, where: str) -> None:
        """Refuse every field of ``s`` this class does not claim (before its own finer checks)."""
        if cls.base is not None:
            require(s.head.kind != "none", where, "head.kind", "none",
                    f"{cls.name} has an LM head; {_a(s.family)} without one converts to {cls.base}")
            require(not getattr(s, "pooler", False), where, "pooler", True,
                    f"{cls.name} has no pooler; {_a(s.family)} with one and head: none converts to {cls.base}")
        check_claims(s, cls.claims, where, cls.name)

    @classmethod
    def headless(cls) -> type[Architecture]:
        """The converter of this class's backbone ``base`` (a :class:`Headless`); one class per reference."""
        if cls.base is None:
            raise TypeError(f"{cls.name} names no backbone class (base)")
        return _headless(cls)

    @classmethod
    def express(cls, s: FamilySpec, given: dict) -> dict:
        """The config fields of ``s``: its claims checked, then :meth:`config`."""
        cls.check_claims(s, f"zoo -> {cls.name}")
        return cls.config(s, given)

    @classmethod
    def spec(cls, c: Any, hf: nn.Module | None) -> dict:
        if not cls.table:
            raise NotImplementedError
        s = apply_read(cls.table, c, f"{cls.name} -> zoo")
        if hf is not None:  # HF decides tying from several config fields: the model says what it did
            head, emb = (hf.get_submodule(name) for name in cls.tie)
            s["head"]["tied"] = head.weight is emb.weight
        return s

    @classmethod
    def config(cls, s: FamilySpec, given: dict) -> dict:
        if not cls.table:
            raise NotImplementedError
        return apply_write(cls.table, s, f"zoo -> {cls.name}", given)

    @staticmethod
    def rules(s: FamilySpec) -> list[Rule]:
        raise NotImplementedError

    @classmethod
    def check_from(cls, hf: nn.Module, s: FamilySpec, ref: Mapping[str, Tensor]) -> list[str]:
        return []

    @classmethod
    def extra_to(cls, state: Mapping[str, Tensor], s: FamilySpec, shapes: dict) -> dict[str, Tensor]:
        """Reference tensors zoo does not hold, from the zoo state dict (after ``prepare_to``)."""
        return {}

    @staticmethod
    def prepare_from(ref: dict[str, Tensor], s: FamilySpec) -> dict[str, Tensor]:
        return ref

    @staticmethod
    def prepare_to(state: dict[str, Tensor], s: FamilySpec) -> dict[str, Tensor]:
        return state

    @classmethod
    def stored_in_parts(cls, config: Any) -> dict[str, tuple[str, ...]]:
        """Reference tensors that checkpoint files hold in parts, from the HF ``config``: {model
        tensor name: its parts' names in the files, in order}. The tensor's rows (all its dims but
        the last, flattened) are its parts' rows one after the other, each part a matrix of an
        equal share of them. HF 5.x's mixture-of-experts modules hold each layer's experts fused
        (``mlp.experts.gate_up_proj`` [E, 2F, D]) while checkpoints, downloaded or written by
        ``save_pretrained``, name each expert's projections (``mlp.experts.{e}.gate_proj.weight``
        [F, D], ...): :mod:`zoo.interop.hf.stream` reads and writes those names."""
        return {}

    @classmethod
    def mtp_names(cls, config: Any, names: Collection[str]) -> list[str]:
        """The checkpoint tensors among ``names`` of a multi-token-prediction module (DeepSeek-V3's
        layer past the last, Qwen3-Next's ``mtp.*``) that the reference class does not hold, so
        neither HF's class nor zoo reads them: reading a checkpoint refuses them by name unless the
        caller passes ``skip_mtp`` (:func:`zoo.interop.files.convert`), then lists them as ignored."""
        return []

    @classmethod
    def init_kwargs(cls, s: FamilySpec) -> dict[str, Any]:
        """The class's constructor arguments beyond its config that ``s`` decides."""
        return {}

    @classmethod
    def made(cls, hf_model: nn.Module, s: FamilySpec) -> None:
        """What ``s`` decides that neither the config nor the constructor can say, done to a reference
        model just built for it (before its tensors are written): T5's untied head."""

    @classmethod
    def saved_init_kwargs(cls, names: Collection[str]) -> dict[str, Any]:
        """The constructor arguments beyond its config that a checkpoint holding ``names`` was saved with."""
        return {}


class Headless(Architecture):
    """A reference's backbone without its head (HF's ``*Model``: ``LlamaModel`` for ``LlamaForCausalLM``),
    whose output is its final norm's (``last_hidden_state``): a zoo model with ``head: none``. It
    converts as the class with the head, ``lm``, but for the head: the same spec and config (less
    ``tie_word_embeddings``, which only a head reads), the same tensors but the head's, named
    without the ``prefix`` (``layers.0.mlp...`` for ``model.layers.0.mlp...``). Made by
    :meth:`Architecture.headless`, which subclasses ``lm`` with this class first.

    A backbone with an optional pooler (``lm.base_pooler``: BertModel's ``pooler``, a dense layer
    and tanh on the first token, built unless ``add_pooling_layer=False``) converts it to and from
    an encoder's ``pooler: true``; ``lm``'s rules map its tensors where the spec has one. Whether
    a reference has it is read from the model (its ``pooler`` attribute is None without), from a
    checkpoint's tensor names, or, from a config alone, as HF's default (it has one)."""

    lm: ClassVar[type[Architecture]]

    @classmethod
    def check_claims(cls, s: FamilySpec, where: str) -> None:
        require(s.head.kind == "none", where, "head.kind", s.head.kind,
                f"{cls.name} is {cls.lm.name}'s backbone without a head; {_a(s.family)} with a head converts to {cls.lm.name}")
        check_claims(s, cls.claims, where, cls.name)

    @classmethod
    def spec(cls, c: Any, hf: nn.Module | None) -> dict:
        s = super().spec(c, None)  # hf decides tying, which is the head's
        s["head"] = {"kind": "none"}
        if cls.base_pooler is not None:
            s["pooler"] = hf is None or getattr(hf, cls.base_pooler) is not None
        return s

    @classmethod
    def init_kwargs(cls, s: FamilySpec) -> dict[str, Any]:
        return {} if cls.base_pooler is None else {"add_pooling_layer": s.pooler}

    @classmethod
    def saved_init_kwargs(cls, names: Collection[str]) -> dict[str, Any]:
        if cls.base_pooler is None:
            return {}
        roots = (f"{cls.base_pooler}.", f"{cls.prefix}.{cls.base_pooler}.")  # saved from the backbone, or a class with a head
        return {"add_pooling_layer": any(name.startswith(roots) for name in names)}

    @classmethod
    def config(cls, s: FamilySpec, given: dict) -> dict:
        c = super().config(s.model_copy(update={"head": LMHeadSpec(tied=False)}), given)  # the head's fields unread
        c.pop("tie_word_embeddings", None)
        return c

    @classmethod
    def rules(cls, s: FamilySpec) -> list[Rule]:
        return [Rule(r.zoo, tuple(_unprefixed(n, cls.prefix) for n in r.ref), r.transpose)
                for r in super().rules(s) if r.zoo.split(".")[0] != "head"]

    @classmethod
    def stored_in_parts(cls, config: Any) -> dict[str, tuple[str, ...]]:
        return {_unprefixed(name, cls.prefix): tuple(_unprefixed(p, cls.prefix) for p in parts)
                for name, parts in super().stored_in_parts(config).items()}

    @classmethod
    def prepare_from(cls, ref: dict[str, Tensor], s: FamilySpec) -> dict[str, Tensor]:
        full = super().prepare_from({f"{cls.prefix}.{name}": t for name, t in ref.items()}, s)
        return {_unprefixed(name, cls.prefix): t for name, t in full.items()}


def _a(family: str) -> str:
    return f"{'an' if family[0] in 'aeiou' else 'a'} {family}"


def _unprefixed(name: str, prefix: str) -> str:
    if not name.startswith(prefix + "."):
        raise ValueError(f"{name!r} is not in the backbone {prefix!r}")  # a converter bug
    return name[len(prefix) + 1:]


@cache
def _headless(lm: type[Architecture]) -> type[Architecture]:
    claims = {path: claim for path, claim in lm.claims.items() if path.split(".")[0] != "head"}
    claims |= {"head.kind": one_of("none")} | ({"pooler": ANY} if lm.base_pooler else {})
    attrs = {"name": lm.base, "lm": lm, "base": None, "claims": claims,
             "__module__": lm.__module__, "__doc__": f"{lm.base}: {lm.name}'s backbone, without its head (:class:`Headless`)."}
    return type(f"{lm.__name__}Backbone", (Headless, lm), attrs)


# HF activation names -> zoo FFNs. Two-layer FFNs (GPT-2, BERT, Marian) and gated ones (LLaMA's MLP).
_TANH = ("gelu_new", "gelu_pytorch_tanh", "gelu_python_tanh")
TWO_LAYER = {
    "relu": {"kind": "relu"},
    "gelu": {"kind": "gelu", "approximate": "none"},
    "gelu_python": {"kind": "gelu", "approximate": "none"},
    **{name: {"kind": "gelu", "approximate": "tanh"} for name in _TANH},
    "silu": {"kind": "silu"},
    "swish": {"kind": "silu"},
}
GATED = {
    "silu": {"kind": "swiglu"},
    "swish": {"kind": "swiglu"},
    "gelu": {"kind": "geglu", "approximate": "none"},
    "gelu_python": {"kind": "geglu", "approximate": "none"},
    **{name: {"kind": "geglu", "approximate": "tanh"} for name in _TANH},
}


def ffn_of(table: dict, name: str, where: str, option: str) -> dict:
    if name not in table:
        raise unsupported(where, option, name, f"zoo's FFNs here have the activations {', '.join(sorted(table))}")
    return dict(table[name])


def act_name(ffn, names: dict[tuple[str, str], str], where: str) -> str:
    """The HF activation name of a zoo FFN spec, from ``names`` {(kind, approximate): name}."""
    key = (ffn.kind, getattr(ffn, "approximate", "none"))
    if key not in names:
        known = ", ".join(f"{k}" + (f" (approximate {a})" if a != "none" else "") for k, a in names)
        raise unsupported(where, "block.ffn.kind", ffn.kind if key[1] == "none" else f"{key[0]} (approximate {key[1]})",
                          f"this architecture's FFN is one of: {known}")
    return names[key]


def require(ok: bool, where: str, option: str, value: object, why: str) -> None:
    if not ok:
        raise unsupported(where, option, value, why)


def weights(z: str, h: str, *, bias: bool = True, transpose: bool = False) -> list[Rule]:
    """Rules for a weight (and its bias) named ``z`` in zoo and ``h`` in the reference."""
    rules = [rule(f"{z}.weight", f"{h}.weight", transpose=transpose)]
    return rules + [rule(f"{z}.bias", f"{h}.bias")] if bias else rules


def fused(z: str, hs: list[str], *, bias: bool) -> list[Rule]:
    rules = [rule(f"{z}.weight", *[f"{h}.weight" for h in hs])]
    return rules + [rule(f"{z}.bias", *[f"{h}.bias" for h in hs])] if bias else rules


BUILTIN_ATTENTION = ("mha", "gqa", "mqa")  # a registered kind may compute anything with the same tensors


def plain_attention(spec: FamilySpec, where: str, *, cross_too: bool = False) -> None:
    """Checks for references with one MHA shape, biases on every projection (GPT-2, BERT, Marian)."""
    d, b = spec.d_model, spec.block
    for field, att in [("attention", b.attention)] + ([("cross_attention", b.cross_attention)] if cross_too else []):
        if att is None:
            continue
        require(att.kind in BUILTIN_ATTENTION, where, f"block.{field}.kind", att.kind, "only zoo's built-in attention converts")
        require(att.n_kv_heads == att.n_heads, where, f"block.{field}.n_kv_heads", att.n_kv_heads,
                "this architecture has multi-head attention only (n_kv_heads == n_heads)")
        sizes = (att.qk_size(d), att.v_size(d))
        require(d % att.n_heads == 0 and sizes == (d // att.n_heads,) * 2, where, f"block.{field}.head_dim", sizes,
                "this architecture's head size is d_model / n_heads for queries, keys and values")
        require(att.bias, where, f"block.{field}.bias", att.bias, "this architecture has biases on every projection")
        require(att.has_out_bias, where, f"block.{field}.out_bias", att.out_bias, "this architecture has biases on every projection")
    if cross_too and b.cross_attention is not None:
        require(b.cross_attention == b.attention, where, "block.cross_attention", b.cross_attention.kind,
                "this architecture's cross-attention is shaped as its self-attention; leave cross_attention null")


def layernorm(spec: FamilySpec, where: str, kind: str) -> None:
    n = spec.block.norm
    require(n.kind == "layernorm", where, "block.norm.kind", n.kind, "this architecture uses LayerNorm")
    require(n.bias, where, "block.norm.bias", n.bias, "this architecture's LayerNorms have biases")
    require(spec.block.kind == kind, where, "block.kind", spec.block.kind, f"this architecture's blocks are {kind}")


def same_layers(spec: FamilySpec, where: str, *, but: tuple[str, ...] = (), parts: tuple[str, ...] = ()) -> None:
    """Every layer as the model's block, with its position, but for the attention fields ``but``
    (e.g. ``window``) and the block's ``parts`` (e.g. ``ffn``, which the caller checks layer by
    layer): what per-layer patterns this architecture's config expresses."""
    others = [f"its attention {', '.join(but)}"] * bool(but) + [f"its {p}" for p in parts]
    for name in spec.stacks():
        for i, layer in enumerate(spec.stack_layers(name)):
            b = layer.block
            plain = b.model_copy(update={"attention": b.attention.model_copy(update={f: getattr(spec.block.attention, f) for f in but}),
                                         **{p: getattr(spec.block, p) for p in parts}})
            if plain != spec.block or layer.position is not None:
                what = "position" if layer.position is not None else "block"
                raise unsupported(where, "layers", f"layer {i}'s {what}",
                                  "this architecture repeats one layer" + (f" but for {' and '.join(others)}" if others else ""))


# What every text reference states the same way: sizes, the vocabulary, attention heads and sizes,
# the dense FFN kinds (the activation picks among them; the MoE decoders claim MOE_CLAIMS instead),
# their width and biases, the norm's eps, the LM head's tying, the dropout rates it maps.
TEXT_CLAIMS: Claims = {
    "family": one_of("decoder"), "d_model": ANY, "n_layers": ANY, "vocab_size": ANY, "max_seq_len": ANY,
    "block.attention.kind": one_of("mha", "gqa", "mqa"), "block.attention.n_heads": ANY,
    "block.attention.n_kv_heads": ANY, "block.attention.head_dim": ANY, "block.attention.v_head_dim": ANY,
    "block.attention.bias": ANY, "block.ffn.kind": one_of("relu", "gelu", "silu", "swiglu", "geglu"),
    "block.ffn.hidden": ANY, "block.ffn.bias": ANY, "block.ffn.approximate": ANY, "block.norm.eps": ANY, "head.kind": one_of("lm"), "head.tied": ANY,
}

# What the mixture-of-experts decoders (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE) state the same way: an
# moe FFN, its experts (count, top-k, their gated FFN: the activation and width) and the router's
# softmax before the top k, its load-balancing loss weight (router_aux_loss_coef). Each class adds
# what it has beyond these (norm_topk_prob, Mixtral's jitter, Qwen2-MoE's shared expert); the router's
# z-loss, DeepSeek-V3's bias_update and a capacity factor none of them has, so they stay unclaimed.
MOE_CLAIMS: Claims = {
    "block.ffn.kind": one_of("moe"), "block.ffn.n_experts": ANY, "block.ffn.top_k": ANY, "block.ffn.expert.kind": ANY,
    "block.ffn.expert.hidden": ANY, "block.ffn.expert.approximate": ANY,  # not the experts' biases nor a clamp (gpt-oss)
    "block.ffn.router.softmax_before_topk": one_of(True), "block.ffn.router.aux_loss_coef": ANY,
}
