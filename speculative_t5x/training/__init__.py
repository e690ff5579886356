"""Training: drafters and targets with optax (training.py), DistillSpec (distillation.py)."""
