"""Runs each trial in a fresh process with a timeout and turns every failure into a status."""

from torchkiln.runner.protocol.trial import STATUSES, TrialSpec

__all__ = ["STATUSES", "TrialSpec"]
