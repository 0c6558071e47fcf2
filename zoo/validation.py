"""How a pydantic validation error reads, for every strict model zoo reads (model specs, recipe
configs): one line per problem, each naming the field and the fix. Imports pydantic alone, so the
torch-free spec modules and the training configs can both use it."""

from __future__ import annotations

from pydantic import ValidationError

__all__ = ["problem_lines", "validation_message"]


def problem_lines(err: ValidationError, prefix: str = "") -> list[str]:
    """One ``field: message`` line per problem, each field's path after ``prefix``.

    Unknown keys say to remove them or check their spelling; type and range errors show the value
    given (an infinite or NaN float is refused wherever a float is declared: specs and recipe configs
    say ``allow_inf_nan=False``); the messages of zoo's own validators (value errors) are shown as written."""
    lines = []
    for e in err.errors(include_url=False):
        loc = ".".join([prefix] * bool(prefix) + [str(p) for p in e["loc"]])
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = f"unknown key (got {e['input']!r}); remove it or check its spelling"
        elif e["type"] == "finite_number":  # inf or nan, which YAML reads from .inf and .nan
            msg = f"must be a finite number, got {e['input']!r}; write a number (not .inf or .nan)"
        elif e["type"] not in ("value_error", "assertion_error", "missing"):
            msg = f"{msg} (got {e['input']!r})"
        lines.extend(f"{loc}: {line}" if loc else line for line in msg.split("\n"))
    return lines


def validation_message(err: ValidationError, what: str) -> str:
    """``invalid <what> (<n> problems):`` and one indented line per problem (:func:`problem_lines`)."""
    lines = problem_lines(err)
    n = len(lines)
    return f"invalid {what} ({n} problem{'s' if n > 1 else ''}):\n" + "\n".join(f"  {line}" for line in lines)
