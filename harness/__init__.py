"""A torchrun-launched distributed reinforcement-learning training harness."""
