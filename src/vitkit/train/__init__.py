"""Training: the run's plan (plan.py), the loop (loop.py), optimizers, schedules, fine-tuning
set-up, distributed helpers and the metrics recorder. `train(cfg)` runs a `TrainConfig`."""
