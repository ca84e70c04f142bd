"""Steps per call the loop cannot run: several steps per `Model.fit` call under a strategy where
Keras' multi-step fit fails (a rule of tfrecipe.config.cross_checks)."""

from __future__ import annotations

from tfrecipe.config.run_sections import RunConfig
from tfrecipe.errors import Problem

# Strategies under which Keras 3.15's multi-step fit fails across replicas (TF 2.21: "You must
# feed a value for placeholder tensor 'while/body/_1/while/cond/...'"); the custom loop runs
# several steps per call there.
FIT_ONE_STEP_STRATEGIES = ("mirrored", "multi_worker_mirrored")


def fit_steps_problems(run: RunConfig) -> list[Problem]:
    """Several steps per fit call under a strategy where Keras' fit fails with them."""
    steps, strategy = run.batching.steps_per_execution, run.strategy.name
    if run.loop.name != "fit" or steps in (1, "auto") or strategy not in FIT_ONE_STEP_STRATEGIES:
        return []
    return [
        Problem(
            "batching.steps_per_execution",
            steps,
            f"Keras' fit fails running several steps per call under strategy={strategy}; use "
            f"loop=custom loop.steps_per_loop={steps} (it runs {steps} steps per call there), "
            "or batching.steps_per_execution=auto",
        )
    ]
