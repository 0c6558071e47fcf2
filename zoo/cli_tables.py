"""What the ``zoo`` command prints: the presets table, a spec's components and resolved layers, a
model summary, a training-memory plan and a file's header, as rich tables or lines."""

from __future__ import annotations

from rich.table import Table

from zoo.build import build, count_parameters
from zoo.embed import stored_settings
from zoo.io import FileHeader, read_spec
from zoo.spec import load_spec, preset_names, to_yaml


def _components(spec) -> str:
    b = spec.block
    att = b.attention
    heads = f"{att.kind} {att.n_heads}h" + (f"/{att.n_kv_heads}kv" if att.n_kv_heads != att.n_heads else "")
    return f"{spec.position.kind}, {heads}, {b.ffn.kind}, {b.norm.kind} {b.kind}" + (" + layer patterns" if spec.layers else "")


def _layer_text(layer, model_position) -> str:
    b, att = layer.block, layer.block.attention
    heads = f"{att.kind} {att.n_heads}h" + (f"/{att.n_kv_heads}kv" if att.n_kv_heads != att.n_heads else "")
    window = f" window {att.window}" if att.window is not None else ""  # every attention spec is an AttentionSpec
    pos = layer.position or model_position
    own = "" if layer.position is None else " (its own)"
    base = f" base {pos.base:g}" if hasattr(pos, "base") else ""
    scaling = getattr(pos, "scaling", None)
    if scaling is not None:
        base += f" {scaling.kind}" + (f" x{scaling.factor:g}" if getattr(scaling, "factor", None) is not None else "")
    hidden = getattr(b.ffn, "hidden", None)
    return f"{b.kind} block, {heads}{window}, {b.ffn.kind}{f' {hidden}' if hidden else ''}, position {pos.kind}{base}{own}"


def layer_lines(spec) -> list[str]:
    """The resolved layers of each stack, consecutive equal layers on one line ("0-4: ...")."""
    lines = []
    for name in spec.stacks():
        layers = spec.stack_layers(name)
        prefix = f"{name} " if len(spec.stacks()) > 1 else ""
        start = 0
        for i in range(1, len(layers) + 1):
            if i == len(layers) or layers[i] != layers[start]:
                span = f"{start}" if i - 1 == start else f"{start}-{i - 1}"
                lines.append(f"{prefix}layer {span}: {_layer_text(layers[start], spec.position)}")
                start = i
    return lines


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    raise AssertionError  # pragma: no cover


def human_flops(n: float) -> str:
    for unit, scale in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if n >= scale:
            return f"{n / scale:,.2f} {unit}"
    return f"{n:,.0f} FLOP"


def _layers(spec) -> str:
    return "+".join(str(n) for n, _ in spec.stacks().values())


def presets_table() -> Table:
    table = Table(title="zoo presets")
    for col, just in (("preset", "left"), ("family", "left"), ("parameters", "right"), ("layers", "right"),
                      ("d_model", "right"), ("components", "left")):
        table.add_column(col, justify=just)
    for name in preset_names():
        spec = load_spec(name)
        model = build(spec, device="meta")
        table.add_row(name, spec.family, f"{count_parameters(model):,}", _layers(spec), str(spec.d_model), _components(spec))
    return table


def summary_table(s, spec) -> Table:
    from zoo.summary import PARTS

    title = f"{s.name} · {s.family} · {_layers(spec)} layers · d_model {spec.d_model} · {_components(spec)}"
    table = Table(title=title, show_header=False, box=None, padding=(0, 2))
    table.add_column("quantity")
    table.add_column("value", justify="right")
    table.add_column("note")
    table.add_row("parameters", f"{s.parameters:,}", f"{human_bytes(s.weight_bytes)} in {s.dtype}")
    if s.expert_parameters:
        table.add_row("  active per token", f"{s.active_parameters:,}",
                      f"{100 * s.active_parameters / max(s.parameters, 1):.1f}%: router, top_k experts and shared "
                      f"expert of each MoE layer ({s.expert_parameters:,} in routed experts)")
    labels = {"embeddings": "embeddings", "attention": "attention", "ffn": "FFN", "norms": "norms", "head": "head"}
    for part in PARTS:
        note = f"{100 * s.parts[part] / max(s.parameters, 1):.1f}%"
        aliases = [a for a in s.tied if s.tied_parts[a] == part]
        if aliases:
            note += f" (tied: {', '.join(f'{a} = {s.tied[a]}' for a in aliases)})"
        table.add_row(f"  {labels[part]}", f"{s.parts[part]:,}", note)
    per = f"per {s.unit}" + (f", T = {s.seq}" if s.unit == "token" else f" ({s.seq} tokens)")
    if s.flops_forward is not None:
        table.add_row(f"FLOPs {per}", "", "")
        active = " (active experts: top_k per token)" if s.expert_parameters else ""
        table.add_row("  forward", f"{s.flops_forward:,}", human_flops(s.flops_forward) + active)
        table.add_row("  training (3 x forward)", f"{s.flops_training:,}", human_flops(s.flops_training))
    if s.activation_bytes is not None:
        shape = f"{s.batch} x {s.seq} tokens" if s.unit == "token" else f"{s.batch} images"
        table.add_row("activation memory", f"{s.activation_bytes:,} B",
                      f"{human_bytes(s.activation_bytes)}: a training step, batch {shape}, {s.dtype}, fused attention")
    if s.kv_cache_bytes_per_token is not None:
        windowed = [row for row in s.layers if row.get("kv_tokens", s.seq) < s.seq and "state_bytes" not in row]
        note = f" ({len(windowed)} of {len(s.layers)} layers slide a window and keep fewer)" if windowed else ""
        stateful = sum("state_bytes" in row for row in s.layers)
        note += f" ({stateful} of {len(s.layers)} layers hold a fixed-size state instead)" if stateful else ""
        table.add_row("KV cache per token", f"{s.kv_cache_bytes_per_token:,} B",
                      f"{human_bytes(s.kv_cache_bytes)} for batch {s.batch} x {s.seq} tokens{note}")
    else:
        table.add_row("KV cache per token", "-", "not autoregressive")
    if s.linear_state_bytes is not None:
        table.add_row("  linear-attention state", f"{s.linear_state_bytes:,} B",
                      f"{human_bytes(s.linear_state_bytes * s.batch)} for batch {s.batch}, fixed however long")
    if s.cross_kv_bytes_per_source_token is not None:
        table.add_row("  cross-attention, per source token", f"{s.cross_kv_bytes_per_source_token:,} B", "computed once per source")
    if spec.layers:
        table.add_row("layers", "", "")
        for row in s.layers:
            stack = f"{row['stack']} " if len(spec.stacks()) > 1 else ""
            kv = f", KV cache {human_bytes(row['kv_cache_bytes'] * s.batch)} ({row['kv_tokens']} tokens)" if "kv_cache_bytes" in row else ""
            window = f", window {row['window']}" if row["window"] is not None else ""
            window += f", {row['sinks']} sink logits" if "sinks" in row else ""
            window += f", {row['position_parameters']:,} position parameters" if "position_parameters" in row else ""
            kv = f", state {human_bytes(row['state_bytes'] * s.batch)}" if "state_bytes" in row else kv
            table.add_row(f"  {stack}{row['layer']}", f"{row['parameters']:,}",
                          f"{human_flops(row['flops'] // (s.seq if s.unit == 'token' else 1))} per {s.unit}{window}{kv}")
    return table


def inspect_lines(header: FileHeader) -> list[str]:
    meta = header.metadata
    dtypes = ", ".join(f"{name} x {count}" for name, count in sorted(header.dtypes().items()))
    lines = [
        f"file        {header.path}",
        f"size        {header.size:,} bytes ({human_bytes(header.size)})"
        + (f" in {len(header.shards)} shards ({header.shards[0].name} ...)" if header.shards else ""),
        f"written by  zoo {meta['zoo.version']} (file format {meta.get('zoo.format', '?')})" if "zoo.version" in meta
        else "written by  (not zoo: no zoo.version in the metadata)",
        f"tensors     {len(header.tensors)} ({dtypes or 'none'})",
        f"parameters  {header.n_elements:,}",
    ]
    for alias, name in header.tied.items():
        lines.append(f"tied        {alias} = {name} (stored once)")
    embedding = stored_settings(meta, str(header.path))
    if embedding is not None:
        lines.append(f"embeds with {embedding.describe()} (zoo embed's default)")
    if "zoo.shard" in meta:
        lines.append(f"shard       {meta['zoo.shard']} of a sharded zoo file: inspect or load its .index.json")
    elif "zoo.spec" in meta:
        spec = read_spec(header.path)
        lines.append("spec:")
        lines += ["  " + line for line in to_yaml(spec).splitlines()]
    else:
        lines.append("spec        none (load its weights with zoo.load_weights into a model you build)")
    return lines


# -------------------------------------------------------------------------------------- commands

def memory_table(plan) -> Table:
    how = f"{plan.strategy} on {plan.processes} process{'es' if plan.processes > 1 else ''}"
    how += ", activation checkpointing" if plan.checkpointing else ""
    table = Table(title=f"training memory per process: {how}, {plan.precision}, batch {plan.batch} x {plan.seq}",
                  show_header=False, box=None, padding=(0, 2))
    table.add_column("quantity")
    table.add_column("bytes", justify="right")
    table.add_column("")
    rows = [("parameters (fp32 master)", plan.parameters), ("gradients", plan.gradients),
            ("optimizer state (AdamW)", plan.optimizer), ("gathered units / compute copies", plan.gathered),
            ("activations", plan.activations), ("total", plan.total)]
    if plan.experts:
        rows.insert(3, ("  the routed experts' share of these three", plan.experts))
    for label, value in rows:
        table.add_row(label, f"{value:,}", human_bytes(value))
    return table
