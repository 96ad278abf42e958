"""Training: optimizers and schedules (the loop arrives with the training issue)."""
