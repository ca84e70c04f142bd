"""Where a run's time goes: step times and input wait (clock), FLOPs per example (flops), the
machine's peak FLOP/s (peak), the run's `perf` block and its one-line diagnosis (report), a
profiler window with step markers (profiler), and where the run ran (provenance)."""
