"""Training a mixture of experts: the router losses against HF's function and a hand computation (and
their gradients against autograd of those formulas), the loop's weighting of them over micro-batches
with activation checkpointing, capacity dropping and the bias update against hand computations, an
exact resume of the experts' biases, and the summary's active parameters and expert memory by hand.
The recipes under torchrun (DDP, FSDP2, kill and resume) train an MoE layer in
tests/test_torchrun_loss.py and tests/test_scale_torchrun.py."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

import zoo
import zoo.train.loop
from zoo.components import MoE
from zoo.summary import summarize, training_memory
from zoo.train import Dist, ListTask, OptimConfig, RunConfig, ScheduleConfig, fit, read_metrics, router_losses
from zoo.train.router import RouterTraining

D, E, K, F_ = 24, 5, 2, 20  # odd sizes
V, T = 61, 7


def spec(*, dense_first: bool = False, **ffn):
    moe = {"kind": "moe", "n_experts": E, "top_k": K, "expert": {"kind": "swiglu", "hidden": F_}, **ffn}
    data = {"family": "decoder", "vocab_size": V, "max_seq_len": 16, "d_model": D, "n_layers": 2,
            "position": {"kind": "rope"}, "dropout": {"embedding": 0.0, "residual": 0.0, "attention": 0.0, "ffn": 0.0},
            "block": {"attention": {"kind": "gqa", "n_heads": 4, "n_kv_heads": 2, "bias": False},
                      "norm": {"kind": "rmsnorm"}, "ffn": moe}}
    if dense_first:  # layer 0 a dense SwiGLU, layer 1 the mixture
        data["block"]["ffn"] = {"kind": "swiglu", "hidden": 36, "bias": False}
        data["layers"] = [{"at": 1, "block": {"ffn": moe}}]
    return zoo.parse_spec(data)


def moes(model) -> list[MoE]:
    return [m for m in model.modules() if isinstance(m, MoE)]


def tokens(seed: int, batch: int = 3) -> torch.Tensor:
    return torch.randint(0, V, (batch, T), generator=torch.Generator().manual_seed(seed))


def z_by_hand(logits: tuple[torch.Tensor, ...], mask: torch.Tensor | None) -> torch.Tensor:
    rows = torch.cat(logits)
    keep = torch.ones(rows.shape[0]) if mask is None else mask.reshape(-1).float().repeat(len(logits))
    lse = rows.exp().sum(-1).log()
    return (lse ** 2 * keep).sum() / keep.sum()


@pytest.mark.parametrize("padded", [False, True])
def test_router_losses_equal_hf_and_the_z_loss_formula_with_their_gradients(padded):
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    model = zoo.build(spec(router={"aux_loss_coef": 0.02, "z_loss_coef": 0.003}), seed=0).train()
    inputs = []
    for m in moes(model):
        m.register_forward_pre_hook(lambda mod, args: inputs.append(args[0].detach()))
    mask = torch.tensor([[1] * T, [1] * 5 + [0] * 2, [1] * 3 + [0] * 4]).bool() if padded else None
    model(tokens(0), padding_mask=mask)
    logits = tuple(m.router_logits for m in moes(model))
    for x, m, got in zip(inputs, moes(model), logits):  # the logits kept are the router's of this pass
        torch.testing.assert_close(got, x.reshape(-1, D) @ m.router.weight.T)
    ours = router_losses(model)
    hf = load_balancing_loss_func(logits, E, K, mask)
    z = z_by_hand(logits, mask)
    assert abs(float(ours.aux_loss) - float(hf.detach())) < 1e-6 and abs(float(ours.z_loss) - float(z.detach())) < 1e-5
    routers = [m.router.weight for m in moes(model)]
    got = torch.autograd.grad(ours.total, routers, retain_graph=True)
    want = torch.autograd.grad(0.02 * hf + 0.003 * z, routers)
    for g, w in zip(got, want):
        assert g.abs().sum() > 0
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-8)


class Blocks(ListTask):
    """Next-token prediction on fixed random rows, two micro-batches a step (grad_accum 2)."""

    def __init__(self, dist, data):
        super().__init__(dist, 2)
        self.data = data

    def batches(self, epoch):
        return [list(range(i, i + 3)) for i in range(0, len(self.data), 3)]

    def loss(self, model, batch, step):
        rows = self.data[batch]
        logits = model(rows[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1), rows[:, 1:].flatten()), {}

    def evaluate(self, model):
        return {"loss": 0.0}


def train(out, data, steps, monkeypatch, resume=None, plot=False, **ffn):
    monkeypatch.setattr(zoo.train.loop, "build_optimizer", lambda model, cfg: torch.optim.SGD(model.parameters(), lr=0.5))
    run = RunConfig(out_dir=out, precision="fp32", plot=plot, progress=False, log_every=1, checkpoint_every=1,
                    activation_checkpointing=True)
    model = zoo.build(spec(dense_first=True, **ffn), seed=1)
    return fit(model, Blocks(Dist(), data), optim=OptimConfig(clip_grad=None), schedule=ScheduleConfig(kind="constant"),
               run=run, dist=Dist(), total_steps=steps, resume=resume)


ROUTER = {"router": {"aux_loss_coef": 0.5, "z_loss_coef": 0.1}, "capacity_factor": 1.0}


@pytest.mark.slow
def test_a_step_descends_the_mean_of_task_and_router_losses_over_micro_batches(tmp_path, monkeypatch):
    data = torch.randint(0, V, (6, T + 1), generator=torch.Generator().manual_seed(3))
    fitted = train(tmp_path, data, 1, monkeypatch, plot=True, **ROUTER)
    # by hand: SGD on the mean over the two micro-batches of (cross-entropy + 0.5 aux + 0.1 z), each
    # pass capped as training caps it; the same step without the router's terms lands elsewhere
    ref = zoo.build(spec(dense_first=True, **ROUTER), seed=1).train()
    with_router, without, aux, dropped, counts = [], [], [], 0, torch.zeros(E)
    for rows in (data[:3], data[3:]):
        ce = F.cross_entropy(ref(rows[:, :-1]).flatten(0, 1), rows[:, 1:].flatten())
        (moe,) = moes(ref)
        logits = (moe.router_logits,)
        from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func
        lb = load_balancing_loss_func(logits, E, K)
        aux.append(float(lb.detach()))
        dropped += int(moe.dropped)
        counts += torch.bincount(moe.routed.flatten(), minlength=E)
        with_router.append(ce + 0.5 * lb + 0.1 * z_by_hand(logits, None))
        without.append(ce)
    params = list(ref.parameters())
    want = torch.autograd.grad(sum(with_router) / 2, params, retain_graph=True)
    plain = torch.autograd.grad(sum(without) / 2, params)
    got = dict(fitted.model.named_parameters())
    router = "stack.blocks.1.ffn.router.weight"
    for (name, p), g, g0 in zip(ref.named_parameters(), want, plain):
        torch.testing.assert_close(got[name], p.detach() - 0.5 * g, rtol=1e-5, atol=1e-6, msg=name)
        if name == router:
            assert (g - g0).abs().max() > 1e-3  # the router terms change the router's step
    train_row = next(r for r in read_metrics(tmp_path / "metrics.jsonl") if r["split"] == "train")
    assert train_row["loss"] == pytest.approx(float(sum(without).detach()) / 2, rel=1e-5)  # the task's loss alone
    assert train_row["aux_loss"] == pytest.approx(sum(aux) / 2, rel=1e-5)
    assert dropped > 0 and train_row["dropped_tokens"] == dropped
    assert train_row["dropped_fraction"] == pytest.approx(dropped / (2 * 3 * T * K))
    load = next(r for r in read_metrics(tmp_path / "metrics.jsonl") if r["split"] == "experts")
    assert list(load) == ["step", "split", "stack.blocks.1.ffn"]
    assert load["stack.blocks.1.ffn"] == pytest.approx((counts / counts.sum()).tolist())
    assert (tmp_path / "experts.png").stat().st_size > 0


def test_capacity_keeps_each_experts_first_tokens_by_position_in_training_only():
    moe = zoo.registry("ffn").builder("moe")(spec(capacity_factor=0.7).block.ffn, dim=D, dropout=0.0)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in moe.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=g))
    x = torch.randn(2, 6, D, generator=g)
    capacity = math.ceil(0.7 * 12 * K / E)  # 4 of the 24 pairs each

    def by_hand(cap):
        probs = torch.softmax(x.reshape(-1, D) @ moe.router.weight.T, -1)
        top, experts = probs.topk(K, -1)
        top = top / top.sum(-1, keepdim=True)
        out, taken, dropped = torch.zeros(12, D), [0] * E, 0
        for t in range(12):  # token order: the first tokens routed to an expert keep their places
            for j in range(K):
                e = int(experts[t, j])
                taken[e] += 1
                if cap is not None and taken[e] > cap:
                    dropped += 1
                    continue
                gate, up = (moe.w_gate_up[e] @ x.reshape(-1, D)[t]).chunk(2)
                out[t] += top[t, j] * (moe.w_down[e] @ (F.silu(gate) * up))
        return out.reshape(2, 6, D), dropped

    want, dropped = by_hand(capacity)
    with torch.no_grad():
        got = moe.train()(x)
    assert dropped > 0 and int(moe.dropped) == dropped
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        dropless = moe.eval()(x)
    torch.testing.assert_close(dropless, by_hand(None)[0], rtol=1e-5, atol=1e-6)
    assert moe.dropped is None


def test_the_bias_picks_experts_without_weighing_them_and_moves_against_the_load():
    model = zoo.build(spec(router={"bias_update": 0.1}), seed=0).train()
    first = moes(model)[0]
    assert "stack.blocks.0.ffn.expert_bias" in model.state_dict()
    x = torch.randn(9, D, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        first.expert_bias.copy_(torch.tensor([0.0, 0.0, 5.0, 0.0, 0.0]))
        _, weights, experts = first.route(x)
        probs = torch.softmax(x @ first.router.weight.T, -1)
    assert (experts == 2).any(-1).all()  # the bias picks expert 2 for every token
    picked = probs.gather(-1, experts)
    torch.testing.assert_close(weights, picked / picked.sum(-1, keepdim=True))  # weighed without the bias

    for m in moes(model):
        m.expert_bias.zero_()
    helper = RouterTraining.of(model)
    loads = [torch.zeros(E) for _ in moes(model)]
    for seed in (2, 3):  # two micro-batches of one step
        model(tokens(seed))
        helper.micro_batch()
        loads = [c + torch.bincount(m.routed.flatten(), minlength=E) for c, m in zip(loads, moes(model))]
    helper.after_step(Dist())
    for m, load in zip(moes(model), loads):
        want = 0.1 * torch.sign(load.mean() - load)
        torch.testing.assert_close(m.expert_bias, want)
        assert m.expert_bias[load.argmax()] < 0 < m.expert_bias[load.argmin()]


@pytest.mark.slow
def test_the_experts_biases_and_the_log_resume_exactly(tmp_path, monkeypatch):
    data = torch.randint(0, V, (18, T + 1), generator=torch.Generator().manual_seed(4))
    ffn = {"router": {"bias_update": 0.004, "z_loss_coef": 0.01}}
    straight = train(tmp_path / "straight", data, 3, monkeypatch, **ffn)
    train(tmp_path / "cut", data, 1, monkeypatch, **ffn)
    resumed = train(tmp_path / "cut", data, 3, monkeypatch, resume=tmp_path / "cut" / "ckpt-0000001.pt", **ffn)
    bias = straight.model.stack.blocks[1].ffn.expert_bias
    assert bias.abs().sum() > 0  # three steps of +-0.004 cannot cancel
    for name, value in straight.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[name], value), name
    logged = [[r for r in read_metrics(tmp_path / run / "metrics.jsonl") if r["split"] != "valid"]  # the cut run ended
              for run in ("cut", "straight")]                                                   # with an evaluation
    assert logged[0] == logged[1] and len(logged[0]) == 6


def test_summary_counts_active_parameters_flops_and_expert_memory_by_hand(tmp_path, capsys):
    from zoo.cli import main

    s = spec(dense_first=True, shared_hidden=12)
    model = zoo.build(s, device="meta")
    per_expert = 3 * D * F_
    active_moe = D * E + K * per_expert + 3 * D * 12 + D  # router, top_k experts, shared expert and its gate
    total_moe = D * E + E * per_expert + 3 * D * 12 + D
    got = summarize(s, seq=T)
    assert got.parameters == zoo.count_parameters(model)
    assert got.active_parameters == got.parameters - total_moe + active_moe
    assert got.expert_parameters == E * per_expert
    assert got.layers[1]["flops"] == 2 * T * active_moe + got.layers[0]["flops"] - 2 * T * 3 * D * 36
    # the experts' fp32 weights, gradients and AdamW moments (16 bytes each) per process
    assert training_memory(s, seq=T).experts == 16 * E * per_expert
    assert training_memory(s, processes=2, seq=T).experts == 20 * E * per_expert  # + DDP's buckets
    assert training_memory(s, processes=2, strategy="fsdp", seq=T).experts == 16 * 3 * per_expert  # ceil(5 / 2)
    path = tmp_path / "moe.yaml"
    path.write_text(zoo.to_yaml(s))
    assert main(["summary", str(path), "--seq", str(T), "--shard", "3", "--strategy", "fsdp", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["active_parameters"] == got.active_parameters
    assert out["training_memory"]["experts"] == 16 * 2 * per_expert  # ceil(5 / 3) experts on the first process
    assert main(["summary", str(path), "--shard", "3", "--strategy", "fsdp"]) == 0
    text = capsys.readouterr().out
    assert "active per token" in text and "routed experts' share" in text
