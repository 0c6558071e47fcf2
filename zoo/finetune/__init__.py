"""Fine-tuning with adapters: a built model changed in place so that a few new parameters train
while its own weights stay frozen, the result saved apart from the base or folded into it.

    from zoo.finetune import LoraSpec, apply_lora, merge_lora, save_adapters, load_adapters

    model = zoo.load("base.safetensors")
    apply_lora(model, LoraSpec(rank=8, alpha=16, targets=("q", "k", "v", "o"), trainable=("head",)))
    optimizer = zoo.train.build_optimizer(model, cfg.optim)   # only what requires grad: adapters and head
    ...                                                        # train (zoo.train.fit)
    save_adapters(model, "adapters.safetensors", base="base.safetensors")   # megabytes, not the model
    merge_lora(model)                                          # plain linears: zoo.save, zoo convert, to_hf
    zoo.save(model, "merged.safetensors")

    model = load_adapters(zoo.load("base.safetensors"), "adapters.safetensors")   # later, elsewhere

    zoo.finetune.spec    the adapter specs (LoraSpec) and their registry, ADAPTERS (torch-free)
    zoo.finetune.lora    LoraLinear, apply_lora, merge_lora
    zoo.finetune.files   save_adapters, load_adapters, base_hash, adapt (any registered adapter kind)
"""

from zoo.finetune.spec import ADAPTERS, AdapterSpec, LORA_TARGETS, LoraSpec, adapter_of, adapter_spec
from zoo.finetune.lora import LoraLinear, apply_lora, freeze, has_lora, lora_parameters, merge_lora, trainable_parameters
from zoo.finetune.files import adapt, base_hash, load_adapters, save_adapters

__all__ = [
    "ADAPTERS", "AdapterSpec", "LORA_TARGETS", "LoraLinear", "LoraSpec", "adapt", "adapter_of", "adapter_spec",
    "apply_lora", "base_hash", "freeze", "has_lora", "load_adapters", "lora_parameters", "merge_lora", "save_adapters",
    "trainable_parameters",
]
