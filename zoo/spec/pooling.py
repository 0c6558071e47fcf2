"""The pools of a text sequence and the projection of the pooled vector: a text tower's pooled output
(``model.pool``, what :func:`zoo.embed` returns with ``pooling="pooler"``).

- ``pool: eos`` (:class:`EosPoolSpec`): the hidden state at each row's end-of-text token (CLIP's
  text tower); ``pool: last`` (:class:`LastPoolSpec`): the last slot's (SigLIP's). Both register in
  the ``pool`` registry beside a ViT's cls, mean and map.
- ``projection`` (:class:`ProjectionSpec`): a linear map of the pooled vector, with or without a
  bias (CLIP's ``text_projection``, SigLIP's ``head``).

:func:`pool_problems` states the rules an encoder's pool and projection keep."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, NonNegativeInt, PositiveInt

from zoo.registry import registry
from zoo.spec.base import Spec, register_specs
from zoo.spec.parts import PoolSpec

__all__ = ["EosPoolSpec", "LastPoolSpec", "ProjectionSpec", "pool_problems"]


class EosPoolSpec(PoolSpec):
    """The hidden state at each row's end-of-text token (Radford et al. 2021, CLIP's text tower; HF's
    ``CLIPTextModel`` pooler_output): the first slot holding ``token``; with ``token: null``, the
    slot of the row's highest id (OpenAI CLIP's end-of-text token is its vocabulary's last: HF's
    legacy configs with ``eos_token_id: 2``). A row without the token pools its first slot, as HF's
    argmax does. It reads the token ids, so only a text family takes it."""

    kind: Literal["eos"] = "eos"
    takes_tokens: ClassVar[bool] = True
    token: NonNegativeInt | None = Field(
        None, description="the end-of-text token id whose first slot is pooled (CLIP's eos_token_id, 49407); null: "
        "the slot of the row's highest id (HF's legacy eos_token_id 2)"
    )


class LastPoolSpec(PoolSpec):
    """The last slot's hidden state (SigLIP's text tower, trained on rows padded to their full length
    without a mask; HF's ``SiglipTextModel`` pools ``last_hidden_state[:, -1]``). A padding token
    there (a row padded on the right, with a mask) is refused: HF computes its state with the token
    hidden from itself, zoo lets a padding token attend to itself."""

    kind: Literal["last"] = "last"


class ProjectionSpec(Spec):
    """A linear map of the pooled vector, [B, D] -> [B, dim] (CLIP's ``text_projection`` without a
    bias, SigLIP's ``head`` with one)."""

    dim: PositiveInt = Field(description="the output width (CLIP's projection_dim, SigLIP's projection_size)")
    bias: bool = Field(False, description="a bias on the projection (SigLIP's head: true; CLIP's text_projection: false)")


def pool_problems(spec: Any) -> list[str]:
    """What an encoder's ``pool`` and ``projection`` break, each line naming the field and the fix."""
    pool, problems = spec.pool, []
    if pool is not None and spec.pooler:
        problems.append(f"pool: BERT's pooler (pooler: true) and pool: {pool.kind} both make model.pool's output; "
                        f"keep one of them")
    if spec.projection is not None and pool is None:
        problems.append("projection: maps the pooled vector, but the encoder has none; set pool (eos, last, cls or mean) "
                        "or remove projection")
    if pool is None:
        return problems
    if not type(pool).takes_padding:
        names = [n for n in registry("pool").names() if registry("pool").spec(n).takes_padding]
        problems.append(f"pool: {pool.kind} would read padding tokens as real ones; an encoder pools with one of "
                        f"{', '.join(names)}")
    token = getattr(pool, "token", None)
    if token is not None and token >= spec.vocab_size:
        problems.append(f"pool.token: {token} is no id of the vocabulary (vocab_size {spec.vocab_size}); give the "
                        f"end-of-text id, or null for the row's highest id")
    return problems + pool.problems(d_model=spec.d_model, block=spec.block, class_token=True)


register_specs("pool", PoolSpec, {"eos": EosPoolSpec, "last": LastPoolSpec})
