"""When the timed reps may stop: once the speedup's 95% interval is narrow enough to decide.

A trial's reps run to ``max_reps`` unless the rule says the answer is known: at least
``min_reps`` reps taken, a whole rotation of the arms completed (so every arm has led equally
often and the pairing of time_round_robin is what it always is), and the speedup's interval
half-width, relative to its median, at most ``halfwidth``. Pure: the caller computes the
speedup from its samples, so the rule is tested on synthetic sequences."""

from __future__ import annotations

from dataclasses import dataclass

# Selection needs to tell candidates apart by MIN_EFFECT (1%): an interval of +-0.5% around
# each is narrow enough that two candidates 1% apart do not overlap by their width alone.
DEFAULT_HALFWIDTH = 0.005
# Fewer reps than this make the bootstrap interval of a median itself unreliable (with 5
# ratios it takes only a handful of distinct values), whatever its width reads.
DEFAULT_MIN_REPS = 10

REASONS = ("interval", "max_reps", "time")


def relative_halfwidth(median: float, ci95: tuple[float, float]) -> float:
    """Half the interval's width over the median (inf for a non-positive median)."""
    if median <= 0:
        return float("inf")
    return (ci95[1] - ci95[0]) / 2.0 / median


@dataclass(frozen=True)
class StopRule:
    """``halfwidth`` None: never stop early (the head-to-head keeps its full length)."""

    max_reps: int
    halfwidth: float | None = DEFAULT_HALFWIDTH
    min_reps: int = DEFAULT_MIN_REPS
    arms: int = 2  # reps are checked only at whole rotations of this many arms

    def __post_init__(self) -> None:
        if self.max_reps < 1:
            raise ValueError("max_reps must be >= 1")
        if self.halfwidth is not None and not self.halfwidth > 0:
            raise ValueError("halfwidth must be > 0 (or None to run every rep)")
        if self.min_reps < 1:
            raise ValueError("min_reps must be >= 1")

    def may_check(self, reps_done: int) -> bool:
        """Whether an early stop is allowed after ``reps_done`` reps."""
        return (
            self.halfwidth is not None
            and reps_done >= self.min_reps
            and reps_done < self.max_reps
            and reps_done % max(1, self.arms) == 0
        )

    def decide(
        self,
        reps_done: int,
        median: float | None = None,
        ci95: tuple[float, float] | None = None,
        out_of_time: bool = False,
    ) -> str | None:
        """The reason to stop after ``reps_done`` reps, or None to take another."""
        if reps_done >= self.max_reps:
            return "max_reps"
        if out_of_time and reps_done >= 1:
            return "time"
        if self.may_check(reps_done) and median is not None and ci95 is not None:
            assert self.halfwidth is not None
            if relative_halfwidth(median, ci95) <= self.halfwidth:
                return "interval"
        return None

    def record(self, reps_done: int, reason: str) -> dict:
        """The fields a result carries about its stop."""
        return {
            "stop_halfwidth": self.halfwidth,
            "min_reps": self.min_reps,
            "max_reps": self.max_reps,
            "reps_run": reps_done,
            "stop_reason": reason,
        }
