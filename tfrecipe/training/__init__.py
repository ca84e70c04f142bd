"""How `tfrecipe.train` assembles a run, one concern per module.

plan.py (`RunPlan`: what the run decides, once, without TensorFlow) · process.py (the cluster
task, run dirs, strategy and seeds, the sidecar evaluator) · dataset.py (the splits as every
reader loads them) · inputs.py (steps per epoch, the distributed datasets) · model.py (model,
optimizer and compile under the strategy, two-phase fine-tuning, warm start, steps per call) ·
protection.py (backups, preemption, NaN/Inf recovery) · monitors.py (history, throughput, logger
callbacks, W&B) · loop.py (the loop, test and exports, how training ended) · summary.py
(`RunSummary`: what summary.json says).
"""
