"""The one error of a training run that cannot go on: raised by the shared machinery (:func:`fit`,
checkpoints) and by recipes alike, and printed by a recipe's command line as one line."""

from __future__ import annotations

__all__ = ["CheckpointError", "TrainError"]


class TrainError(RuntimeError):
    """A run that cannot go on; the message says why and what to change."""


class CheckpointError(TrainError):
    """A checkpoint that cannot be read or used; the message names the file."""
