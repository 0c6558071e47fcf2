"""Score the LM recipe's packing ablation (recipes/ablations/lm-packing.yaml) crosswise: each row's
exported model on the validation glosses as every packing makes them, so the rows are compared on
the same targets (each row's own valid perplexity uses its own packing's).

    python -m bench.packing_eval runs/ablate/lm-packing docs/ablation/lm-packing-cross.md
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import zoo
from zoo.data import bpe
from zoo.data import text as T

FORMS = ("documents", "concat", "pad")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    root, out = Path(args[0]), Path(args[1])
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "recipes"))
    import lm  # noqa: E402  (recipes/lm.py: its loss)
    from text_data import TextDataConfig, load_text  # noqa: E402

    runs = {form: next(root.glob(f"{form}-*")) for form in FORMS}
    tok = bpe.load_bpe(runs["documents"] / "tokenizer.json", specials=T.SPECIALS)
    if any(bpe.load_bpe(r / "tokenizer.json", specials=T.SPECIALS).get_vocab() != tok.get_vocab() for r in runs.values()):
        raise SystemExit("the rows trained different tokenizers; they cannot be scored on the same targets")
    _, valid, _ = load_text(TextDataConfig())
    docs, eos = bpe.encode(tok, valid.texts), tok.token_to_id(T.EOS)
    rows = {"documents": T.pack_documents(docs, 128, eos_id=eos, max_position=2048),
            "concat": T.Rows(T.pack_blocks(docs, 128, eos_id=eos)),
            "pad": T.pad_documents(docs, 128, eos_id=eos, pad_id=T.SPECIALS.index(T.PAD))}
    lines = ["| trained with \\ scored as | " + " | ".join(FORMS) + " |", "| --- | " + " | ".join("---:" for _ in FORMS) + " |"]
    for name, path in runs.items():
        model = zoo.load(path / "model" / "model.safetensors").eval()
        cells = []
        for form in FORMS:
            total = count = 0.0
            with torch.no_grad():
                for i in range(0, len(rows[form]), 64):
                    loss, n = lm.lm_loss(model, rows[form].take(list(range(i, min(i + 64, len(rows[form]))))))
                    total, count = total + float(loss), count + float(n)
            cells.append(f"{torch.tensor(total / count).exp().item():.1f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
