"""Training: `train(cfg)` (loop.py) runs a `TrainConfig`. setup.py builds the run (device,
model, data, optimizer, EMA, plan, resume), step.py takes one optimisation step, budget.py
keeps the time budget, checkpoint.py writes and reads last.pt/best.pt; plan.py, optim.py,
schedule.py, finetune.py, distributed.py, recorder.py and rundir.py each hold one idea."""
