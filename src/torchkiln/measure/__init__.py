"""The instrument: timers, statistics, memory, kernel counts, FLOPs and correctness."""
